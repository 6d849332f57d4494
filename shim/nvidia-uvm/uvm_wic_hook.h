/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * uvm_wic_hook.h - what the replayable-fault path of nvidia-uvm calls into uvm_wic.c.
 *
 * Private to nvidia-uvm: the interface shared with wic_shim is uvm_wic.h.
 */
#ifndef _UVM_WIC_HOOK_H
#define _UVM_WIC_HOOK_H

#include <linux/types.h>

#include "uvm_forward_decl.h"

/**
 * uvm_wic_classify_batch() - let the registered callbacks mark the faults of a batch as held
 * @batch_context: a batch just preprocessed: ordered_fault_cache[0, num_coalesced_faults) is
 *	sorted and every entry has its va_space and gpu
 *
 * Sets is_wic_held on the held entries. Every fault on one page of one VA space and GPU gets the
 * same verdict: held when the callback held any of them. Fatal entries are never held. Called
 * in the replayable-fault bottom half with the ISR lock held; does not sleep.
 *
 * Return: true when the batch has at least one fault and every fault in it is held.
 */
bool uvm_wic_classify_batch(uvm_fault_service_batch_context_t *batch_context);

#endif /* _UVM_WIC_HOOK_H */
