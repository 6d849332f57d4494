/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * uvm_wic_hook.h - what the replayable-fault path of nvidia-uvm calls into uvm_wic.c.
 *
 * Private to nvidia-uvm: the interface shared with wic_shim is uvm_wic.h.
 */
#ifndef _UVM_WIC_HOOK_H
#define _UVM_WIC_HOOK_H

#include <linux/types.h>

#include "nvtypes.h"
#include "nvstatus.h"
#include "uvm_forward_decl.h"

/**
 * uvm_wic_active() - whether callbacks are registered
 *
 * Only a hint (the callbacks may come or go right after): the fault path uses it to skip work
 * that only wic needs. Any context.
 */
bool uvm_wic_active(void);

/**
 * uvm_wic_classify_batch() - let the registered callbacks mark the faults of a batch as held
 * @gpu: before 560, where a bottom half serves one uvm_gpu_t, that GPU; NULL from 560, where
 *	every entry has its own (uvm_fault_buffer_entry_t.gpu)
 * @batch_context: a batch just preprocessed: ordered_fault_cache[0, num_coalesced_faults) is
 *	sorted and every entry has its va_space (and, from 560, its gpu)
 *
 * Sets is_wic_held on the held entries. Every fault on one page of one VA space and GPU gets the
 * same verdict: held when the callback held any of them. Fatal entries are never held. Called
 * in the replayable-fault bottom half with the ISR lock held; does not sleep.
 *
 * Return: true when the batch has at least one fault and every fault in it is held.
 */
bool uvm_wic_classify_batch(uvm_gpu_t *gpu, uvm_fault_service_batch_context_t *batch_context);

/**
 * uvm_wic_run_needs_replay() - whether a bottom-half run issues its final replay now
 * @parent_gpu: the GPU whose fault buffer the run serviced
 * @overflow_seen: the GPU's &uvm_replayable_fault_buffer_struct.overflow_seen (the field that
 *	holds the buffer changed its name within the 570 branch, so the call site reads it)
 * @status: the run's status
 * @num_batches: the batches the run counted
 * @num_wic_held_batches: those of them made only of held faults (uvm_wic_classify_batch())
 * @max_batches: the most batches a run services (uvm_perf_fault_max_batches_per_service)
 *
 * Called, with the ISR lock held, where the run would issue the replay that makes sure faults
 * dropped from the buffer fault again. uvm_wic_run_final_replay() (uvm_wic.h) decides; a run
 * whose replay it defers gets one UVM_WIC_DEFERRED_REPLAY_MS later, unless a START replay of
 * @parent_gpu comes first (uvm_wic_replayed()).
 *
 * Return: true when the run replays now, false when its replay was deferred.
 */
bool uvm_wic_run_needs_replay(uvm_parent_gpu_t *parent_gpu,
			      bool overflow_seen,
			      NV_STATUS status,
			      NvU32 num_batches,
			      NvU32 num_wic_held_batches,
			      NvU32 max_batches);

/**
 * uvm_wic_replayed() - a START replay was pushed on @parent_gpu
 * @parent_gpu: the GPU
 *
 * Every stalled access of the GPU retries: a deferred replay of it is no longer needed.
 * Called from push_replay_on_gpu() with the ISR lock held.
 */
void uvm_wic_replayed(uvm_parent_gpu_t *parent_gpu);

/**
 * uvm_wic_space_shutdown() - @va_space's process is going away
 * @va_space: the space
 *
 * Called first in uvm_va_space_mm_shutdown(), which then stops the space's channels: "All
 * pending faults in this VA space are stale since channel stop preempted the context". A held
 * replayable fault keeps its channel from being preempted, so the space's faults are not held
 * any more (&uvm_wic_ops.space_shutdown) and, when some may have been, the space's GPUs are
 * replayed: the held faults come back and are serviced before the stop. Process context, no
 * UVM lock held.
 */
void uvm_wic_space_shutdown(uvm_va_space_t *va_space);

#endif /* _UVM_WIC_HOOK_H */
