/* SPDX-License-Identifier: GPL-2.0 */
/*
 * kernel_compat.h - the kernel definitions shim/wic_validate.h, shim/wic_hold.h and
 * shim/include/uvm_wic.h use, for a user-space build.
 *
 * Same meaning as in the kernel, for a 64-bit target with 4 KiB pages (the module's).
 */
#ifndef _WIC_KERNEL_COMPAT_H
#define _WIC_KERNEL_COMPAT_H

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <linux/types.h>

typedef __u8 u8;
typedef __u32 u32;
typedef __u64 u64;

#define U64_MAX (~(u64)0)

#define PAGE_SIZE 4096UL
#define IS_ALIGNED(x, a) (((x) & ((typeof(x))(a) - 1)) == 0)
#define PAGE_ALIGNED(addr) IS_ALIGNED((unsigned long)(addr), PAGE_SIZE)
#define check_add_overflow(a, b, d) __builtin_add_overflow(a, b, d)

#endif /* _WIC_KERNEL_COMPAT_H */
