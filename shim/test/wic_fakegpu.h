/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR MIT */
/*
 * wic_fakegpu.h - the interface of /dev/wic_fakegpu, the test stand-in for nvidia-uvm.
 *
 * wic_fakegpu.ko exports the symbols of uvm_wic.h, so that wic_shim.ko loads and runs without
 * a GPU, and offers this device to test drivers. Each open file of /dev/wic_fakegpu is one fake
 * UVM VA space, bound to the address space of the process that opened it: it plays that
 * process's /dev/nvidia-uvm file (the one the application passes to wicd). Through the file a
 * test driver injects raw hardware faults, which the fake shows to wic_shim's classify callback
 * exactly as the patched nvidia-uvm would, reads the log of what wic_shim then asked the fake
 * GPU to do, and inspects the fake GPU's page tables.
 *
 * The event log is global (one for all files) and bounded: when it is full, new events are
 * dropped and counted; WIC_FAKEGPU_IOC_EVENTS reports the count. Page state is per file and per
 * GPU. All structures have the same layout for 32-bit and 64-bit callers.
 *
 * The fake checks one rule of uvm_wic.h: a completion's fill (its write or copy) of a page that is
 * mapped on any fake GPU fails with EBUSY, unless the module parameter strict_write is 0.
 *
 * The fake is as strict as nvidia-uvm about memory: only ranges a test driver declared managed
 * (WIC_FAKEGPU_IOC_MANAGE, as cudaMallocManaged would make them) are managed memory, which
 * uvm_wic_range_managed() accepts; the rest of the process's memory plays HMM memory (malloc,
 * mmap) and is refused with EMEDIUMTYPE. A page can be made resident on a GPU without peer
 * access to a fake GPU (WIC_FAKEGPU_IOC_RESIDE): uvm_wic_map() of it on that GPU fails with
 * EXDEV, as the hook's does for a page nvidia-uvm cannot map there.
 *
 * GPU memory is modelled for GPU producers: WIC_FAKEGPU_IOC_GPU_STORE is a kernel of a fake GPU
 * storing bytes into managed memory, which makes the pages resident in that GPU's memory, out
 * of the CPU's sight (the process's own copy of the page is stale), as nvidia-uvm migrates a
 * managed page to the GPU that writes it. A completion's copy reads such a page from the GPU's
 * memory (as that GPU's copy engine would, logging the GPU) and any other from the process.
 *
 * The replayable-fault hardware is modelled too, for what wic_shim cannot see through
 * WIC_FAKEGPU_IOC_INJECT: warps (WIC_FAKEGPU_IOC_WARPS) stall on their pages and write their
 * faults into their GPU's bounded fault buffer, which drops faults once full and sets its
 * OVERFLOW bit, after which it drops every fault until software clears the bit (dropped faults
 * come back only with a replay); a bottom half (WIC_FAKEGPU_IOC_BOTTOM_HALF) fetches,
 * classifies and services them in batches as nvidia-uvm does, seeing the OVERFLOW bit only
 * where the patched driver reads it (the PUT read of a fetch, the GET write just before the
 * bit's clear; never with the module parameter conf_computing, as under Confidential
 * Computing), with the patched driver's final-replay rule (uvm_wic_run_final_replay() of
 * uvm_wic.h: now, or UVM_WIC_DEFERRED_REPLAY_MS later unless a replay comes first); and every
 * replay resumes the stalled warps whose pages are mapped and makes every other one fault
 * again. So is the rule that a held replayable fault
 * blocks preemption of its channel (WIC_FAKEGPU_IOC_PREEMPT): a context switch on a GPU waits
 * while a warp is stalled there, and RM resets the channel when it waits past its timeout. At a
 * system suspend the fake's device switches every GPU that had warps out, as RM preempts every
 * user channel before the GPUs suspend, waiting up to the module parameter suspend_switch_ms for
 * each; a channel it has to reset fails the suspend with EIO, as nv_pmops_suspend() does.
 *
 * A pre-Volta GPU (Pascal: faults are cancelled per uTLB, not per VA) can be registered in a
 * space (WIC_FAKEGPU_IOC_PRE_VOLTA): as nvidia-uvm with the hook, uvm_wic_space_get() then
 * refuses the space with EOPNOTSUPP, the helpers refuse that GPU with EOPNOTSUPP, and its
 * faults are shown to classify with UVM_WIC_FAULT_UNSUPPORTED, the verdict ignored (serviced
 * as usual).
 *
 * A test driver can make the next fills (writes and copies) and uvm_wic_map() calls on its
 * space fail with an errno of its choice, or stall until it lets them go on
 * (WIC_FAKEGPU_IOC_FAIL), to see what wic_shim does when nvidia-uvm refuses, or what happens
 * while a helper runs.
 *
 * The fake counts the bytes completions' fills wrote into each space (WIC_FAKEGPU_IOC_FILLED),
 * so that a test can tell a completion that wrote only its runs' head words
 * (UVM_WIC_COMPLETE_HEADS) from one that wrote its whole data.
 */
#ifndef _WIC_FAKEGPU_H
#define _WIC_FAKEGPU_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define WIC_FAKEGPU_DEVICE "/dev/wic_fakegpu"

/*
 * Fake GPU ids are nvidia-uvm's ids of GPUs, 1 .. WIC_FAKEGPU_NR_GPUS: parent GPU index * 8 +
 * MIG sub-index + 1 (65 is the 9th parent GPU, 64 sub-index 7 of the 8th). Other ids fail with
 * ENODEV, 0 (the CPU's id in nvidia-uvm) included.
 */
#define WIC_FAKEGPU_NR_GPUS 256
/* The gpu_id of events that concern no GPU (WIC_FAKEGPU_EVENT_WRITE). */
#define WIC_FAKEGPU_GPU_NONE 0xffffffffU

/* The fake GPU's page size; page state and mappings have this granularity. */
#define WIC_FAKEGPU_PAGE_SHIFT 12
#define WIC_FAKEGPU_PAGE_SIZE (1U << WIC_FAKEGPU_PAGE_SHIFT)

/* One raw replayable fault-buffer entry (the 32-byte clc369.h layout). */
#define WIC_FAKEGPU_FAULT_ENTRY_SIZE 32
/* Faulting VAs are sign-extended from this width (GH100). */
#define WIC_FAKEGPU_VA_BITS 57

/* Limits. */
#define WIC_FAKEGPU_MAX_INJECT 4096		/* entries in one WIC_FAKEGPU_IOC_INJECT */
#define WIC_FAKEGPU_LOG_EVENTS 65536		/* events the log holds */
#define WIC_FAKEGPU_MAX_PAGES (1U << 22)	/* mapped (page, GPU) pairs per file */
#define WIC_FAKEGPU_MAX_MANAGED 64		/* managed ranges per file */
#define WIC_FAKEGPU_MAX_REMOTE 64		/* (page, GPU) pairs out of reach per file */
#define WIC_FAKEGPU_MAX_STORE (1U << 20)	/* bytes of one WIC_FAKEGPU_IOC_GPU_STORE */
#define WIC_FAKEGPU_MAX_GPU_PAGES 4096		/* pages resident in fake GPU memory per file */
#define WIC_FAKEGPU_HW_BUFFER 16		/* entries of a GPU's fault buffer */
#define WIC_FAKEGPU_HW_BATCH 4			/* faults one batch of the bottom half fetches */
#define WIC_FAKEGPU_HW_MAX_BATCHES 8		/* batches one run of the bottom half services */
#define WIC_FAKEGPU_HW_MAX_RUNS 64		/* runs one WIC_FAKEGPU_IOC_BOTTOM_HALF makes */
#define WIC_FAKEGPU_MAX_WARPS 4096		/* warps stalled on all fake GPUs */

/* Event kinds (struct wic_fakegpu_event.kind). */
#define WIC_FAKEGPU_EVENT_WRITE 1		/* a completion's fill: bytes or a marker */
#define WIC_FAKEGPU_EVENT_MAP 2			/* uvm_wic_map(), read-only */
#define WIC_FAKEGPU_EVENT_MAP_WRITABLE 3	/* uvm_wic_map(), read-write */
#define WIC_FAKEGPU_EVENT_UNMAP 4		/* a completion's unmap of its companion */
#define WIC_FAKEGPU_EVENT_REVOKE_WRITE 5	/* uvm_wic_revoke_write() */
#define WIC_FAKEGPU_EVENT_REPLAY 6		/* uvm_wic_replay(), or uvm_wic_unregister() */
#define WIC_FAKEGPU_EVENT_SERVICED 7		/* an injected fault passed and serviced */
#define WIC_FAKEGPU_EVENT_STALLED 8		/* a call stalled by WIC_FAKEGPU_FAIL_STALL */
#define WIC_FAKEGPU_EVENT_COPY 9		/* a completion's fill copied from a source */
#define WIC_FAKEGPU_EVENT_RESUMED 10		/* a stalled warp resumed at a replay */
#define WIC_FAKEGPU_EVENT_DROPPED 11		/* a fault dropped by a full fault buffer */
#define WIC_FAKEGPU_EVENT_COMPLETE 12		/* uvm_wic_complete(), before its steps' events */
#define WIC_FAKEGPU_EVENT_SWITCHED 13		/* a context switch done (WIC_FAKEGPU_IOC_PREEMPT) */
#define WIC_FAKEGPU_EVENT_CHANNEL_RESET 14	/* a stalled warp killed by a channel reset */

/* Verdicts (WIC_FAKEGPU_IOC_INJECT), the values of enum uvm_wic_verdict. */
#define WIC_FAKEGPU_VERDICT_PASS 0
#define WIC_FAKEGPU_VERDICT_HOLD 1

/* Page flags (struct wic_fakegpu_page_state.flags). */
#define WIC_FAKEGPU_PAGE_MAPPED (1U << 0)
#define WIC_FAKEGPU_PAGE_WRITABLE (1U << 1)
/* Resident only on a GPU without peer access to this one: uvm_wic_map() fails with EXDEV. */
#define WIC_FAKEGPU_PAGE_UNREACHABLE (1U << 2)
/* A warp of this space is stalled on the page (WIC_FAKEGPU_IOC_WARPS); read-only. */
#define WIC_FAKEGPU_PAGE_STALLED (1U << 3)
/*
 * Resident nowhere: never touched (WIC_FAKEGPU_IOC_RESIDE). A read-only uvm_wic_map() of it
 * fails with ENODATA; a writable one, and a completion's fill, first make it resident, zeroed,
 * as the hook populates it (nvidia-uvm's first touch zero-fills a page).
 */
#define WIC_FAKEGPU_PAGE_NOWHERE (1U << 4)

/**
 * struct wic_fakegpu_event - one call wic_shim made into the fake, or one serviced fault
 * @kind: a WIC_FAKEGPU_EVENT_* value
 * @gpu_id: the GPU; WIC_FAKEGPU_GPU_NONE for WIC_FAKEGPU_EVENT_WRITE; for
 *	WIC_FAKEGPU_EVENT_COPY, the GPU whose memory held the first source byte (its copy engine
 *	read it), WIC_FAKEGPU_GPU_NONE when the CPU's memory did
 * @va: the first byte (page-aligned except for writes and copies); 0 for
 *	WIC_FAKEGPU_EVENT_REPLAY and WIC_FAKEGPU_EVENT_SWITCHED
 * @length: bytes; WIC_FAKEGPU_PAGE_SIZE for WIC_FAKEGPU_EVENT_SERVICED, 0 for
 *	WIC_FAKEGPU_EVENT_REPLAY; for WIC_FAKEGPU_EVENT_COMPLETE, the number of completions (each
 *	logs the events of its steps, as the helpers do, right after); for
 *	WIC_FAKEGPU_EVENT_SWITCHED, the nanoseconds the switch waited
 * @data0: WIC_FAKEGPU_EVENT_WRITE and WIC_FAKEGPU_EVENT_COPY: the first 8 bytes written, as a
 *	little-endian number (bytes beyond @length are 0); 0 for the other kinds
 * @ns: when the call completed, CLOCK_MONOTONIC nanoseconds
 *
 * Only calls that succeeded are logged, and calls that start to stall
 * (WIC_FAKEGPU_EVENT_STALLED, with the call's @gpu_id, WIC_FAKEGPU_GPU_NONE for a write, @va
 * and @length, logged before the stall). Events appear in the order they were logged, which is
 * the order of @ns.
 */
struct wic_fakegpu_event {
	__u32 kind;
	__u32 gpu_id;
	__u64 va;
	__u64 length;
	__u64 data0;
	__u64 ns;
};

/**
 * struct wic_fakegpu_inject - show raw hardware faults of this file's space to wic_shim
 * @gpu_id: in: the faulting GPU
 * @count: in: entries, 1 .. WIC_FAKEGPU_MAX_INJECT
 * @entries: in: user pointer to @count raw fault-buffer entries of
 *	WIC_FAKEGPU_FAULT_ENTRY_SIZE bytes each (the VA comes from ADDR_LO/ADDR_HI, DWORDs 2
 *	and 3, sign-extended from WIC_FAKEGPU_VA_BITS)
 * @verdicts: in: user pointer to @count bytes; out: each entry's WIC_FAKEGPU_VERDICT_*
 * @injected_ns: out: CLOCK_MONOTONIC nanoseconds just before the first entry was classified
 *
 * The entries form one batch: each is passed, in order and without coalescing, to the
 * registered classify callback, with a spinlock held, bottom halves disabled and inside an RCU
 * read-side section, as in nvidia-uvm's fault bottom half; an entry whose ACCESS_TYPE (DWORD 7,
 * bits [19:16]) is VIRT_PREFETCH or PHYS_PREFETCH is shown with UVM_WIC_FAULT_PREFETCH, as
 * nvidia-uvm shows a prefetch-only fault. With no callback registered every
 * verdict is WIC_FAKEGPU_VERDICT_PASS. A passed fault is serviced as nvidia-uvm would service
 * it: its page becomes WIC_FAKEGPU_PAGE_MAPPED on @gpu_id and a WIC_FAKEGPU_EVENT_SERVICED
 * event is logged. A held fault changes nothing; wic_shim later maps the page and replays.
 *
 * Errors: ENODEV for a bad @gpu_id, EINVAL for a bad @count, EFAULT for bad pointers (then
 * nothing was classified when @entries is bad; when @verdicts is bad, the batch was classified).
 */
struct wic_fakegpu_inject {
	__u32 gpu_id;
	__u32 count;
	__u64 entries;
	__u64 verdicts;
	__u64 injected_ns;
};

/**
 * struct wic_fakegpu_events - take the oldest events out of the log
 * @buffer: in: user pointer to an array of @capacity struct wic_fakegpu_event
 * @capacity: in: room in @buffer, at least 1
 * @count: out: events stored in @buffer (and removed from the log); in: ignored
 * @overflow: out: events dropped because the log was full since the last successful call;
 *	in: ignored
 * @timeout_ms: in: when the log is empty, wait up to this long for an event (0: do not wait)
 * @reserved: in: must be 0
 *
 * A wait ends early with EINTR (or a restart) on a signal. When the log stays empty the call
 * succeeds with @count 0. Errors: EINVAL for a bad @capacity or @reserved, EFAULT when not even
 * the first event could be stored in @buffer (then the log is unchanged).
 */
struct wic_fakegpu_events {
	__u64 buffer;
	__u32 capacity;
	__u32 count;
	__u64 overflow;
	__u32 timeout_ms;
	__u32 reserved;
};

/**
 * struct wic_fakegpu_page_state - how a page is mapped on a fake GPU, in this file's space
 * @gpu_id: in: the GPU
 * @flags: WIC_FAKEGPU_IOC_PAGE_STATE: out: WIC_FAKEGPU_PAGE_* bits, in: ignored;
 *	WIC_FAKEGPU_IOC_RESIDE: in: WIC_FAKEGPU_PAGE_UNREACHABLE, WIC_FAKEGPU_PAGE_NOWHERE or 0
 * @va: in: the page, WIC_FAKEGPU_PAGE_SIZE-aligned
 *
 * WIC_FAKEGPU_IOC_RESIDE with WIC_FAKEGPU_PAGE_UNREACHABLE makes the page resident only on a
 * GPU without peer access to @gpu_id (nvidia-uvm would skip it when mapping it there): until
 * the flag is cleared (@flags 0) or WIC_FAKEGPU_IOC_RESET, uvm_wic_map() of a range with the
 * page on @gpu_id fails with EXDEV and maps nothing. Other GPUs map it as usual. With
 * WIC_FAKEGPU_PAGE_NOWHERE the page is resident nowhere, on every GPU (see the flag), until it
 * is populated, @flags 0 or WIC_FAKEGPU_IOC_RESET.
 *
 * Errors: ENODEV for a bad @gpu_id, EINVAL for an unaligned @va (or other @flags for
 * WIC_FAKEGPU_IOC_RESIDE), ENOSPC past WIC_FAKEGPU_MAX_REMOTE unreachable pages.
 */
struct wic_fakegpu_page_state {
	__u32 gpu_id;
	__u32 flags;
	__u64 va;
};

/* struct wic_fakegpu_fail flags. */
#define WIC_FAKEGPU_FAIL_STALL (1U << 0)	/* stall each such call first (see below) */
/* The largest errno struct wic_fakegpu_fail takes. */
#define WIC_FAKEGPU_MAX_ERRNO 4095

/**
 * struct wic_fakegpu_fail - make this space's next helper calls fail, or stall
 * @writes: in: how many of the next fills (writes and copies) of completions on this file's
 *	space are affected
 * @maps: in: how many of the next uvm_wic_map() calls on this file's space are affected
 * @error: in: 0, or the (positive) errno an affected call fails with, at most
 *	WIC_FAKEGPU_MAX_ERRNO; it then fails once its arguments are checked, before it changes
 *	anything, and logs nothing
 * @flags: in: WIC_FAKEGPU_FAIL_* bits. With WIC_FAKEGPU_FAIL_STALL an affected call first logs
 *	WIC_FAKEGPU_EVENT_STALLED and waits until the next WIC_FAKEGPU_IOC_FAIL or
 *	WIC_FAKEGPU_IOC_RESET on this file (or 10 s, or a fatal signal), then fails with @error,
 *	or with @error 0 goes on as usual
 *
 * Each call replaces the counts of the one before (0 and 0 affect nothing) and lets every stalled
 * call of this space go on. WIC_FAKEGPU_IOC_RESET sets both counts to 0. Errors: EINVAL for an
 * unknown flag, an @error above WIC_FAKEGPU_MAX_ERRNO, or neither @error nor
 * WIC_FAKEGPU_FAIL_STALL with a count above 0.
 */
struct wic_fakegpu_fail {
	__u32 writes;
	__u32 maps;
	__u32 error;
	__u32 flags;
};

/**
 * struct wic_fakegpu_managed - declare a range of this file's space managed memory
 * @start: in: WIC_FAKEGPU_PAGE_SIZE-aligned start
 * @length: in: WIC_FAKEGPU_PAGE_SIZE-aligned length, at least one page
 *
 * What cudaMallocManaged does for nvidia-uvm: uvm_wic_range_managed() accepts a range only when
 * the declared ranges cover it without a gap. Declarations add up (overlaps are allowed), are
 * kept across WIC_FAKEGPU_IOC_RESET and end with the file. Errors: EINVAL for a bad range,
 * ENOSPC past WIC_FAKEGPU_MAX_MANAGED declarations.
 */
struct wic_fakegpu_managed {
	__u64 start;
	__u64 length;
};

/**
 * struct wic_fakegpu_gpu_store - a kernel of a fake GPU stores bytes into this file's space
 * @gpu_id: in: the GPU
 * @reserved: in: must be 0
 * @va: in: the first byte
 * @buffer: in: user pointer to the @length bytes
 * @length: in: bytes, 1 .. WIC_FAKEGPU_MAX_STORE
 *
 * Every page touched becomes resident in @gpu_id's memory (its bytes start as the process's
 * copy when it was not resident there, as a migration copies them) and takes the bytes; the
 * process's own copy of the page is left as it was, stale. A page stays resident on the GPU
 * until another GPU stores to it, WIC_FAKEGPU_IOC_RESET or the file's end. Errors: ENODEV for a
 * bad @gpu_id, EINVAL for a bad @length, @reserved or a range that wraps, EFAULT when the range
 * is not managed memory (WIC_FAKEGPU_IOC_MANAGE) or @buffer or the process's memory cannot be
 * read, ENOSPC past WIC_FAKEGPU_MAX_GPU_PAGES resident pages, ENOMEM.
 */
struct wic_fakegpu_gpu_store {
	__u32 gpu_id;
	__u32 reserved;
	__u64 va;
	__u64 buffer;
	__u64 length;
};

/**
 * struct wic_fakegpu_warps - warps of this file's space stall on faults (WIC_FAKEGPU_IOC_WARPS),
 *	or a GPU's bottom half runs (WIC_FAKEGPU_IOC_BOTTOM_HALF)
 * @gpu_id: in: the GPU
 * @count: WIC_FAKEGPU_IOC_WARPS: in: warps, 1 .. WIC_FAKEGPU_MAX_INJECT;
 *	WIC_FAKEGPU_IOC_BOTTOM_HALF: in: warps that stall in the race of the first fetch, 0 ..
 *	WIC_FAKEGPU_MAX_INJECT
 * @entries: in: user pointer to @count raw fault entries, one per warp (as struct
 *	wic_fakegpu_inject's); 0 when @count is
 * @stalled: out: warps of any space stalled on @gpu_id once the call is done
 * @dropped: out: faults the buffer dropped during the call
 * @replays: out: replays of @gpu_id during the call
 * @reserved: in: must be 0
 *
 * WIC_FAKEGPU_IOC_WARPS: each warp stalls on its entry's page and writes the entry into the
 * GPU's fault buffer of WIC_FAKEGPU_HW_BUFFER entries; into a full buffer, or while the
 * OVERFLOW bit is set, it is dropped (WIC_FAKEGPU_EVENT_DROPPED; the bit set), and the warp
 * stays stalled until a replay. Nothing is classified yet: the interrupt is pending.
 *
 * WIC_FAKEGPU_IOC_BOTTOM_HALF: runs until the buffer is empty, at most WIC_FAKEGPU_HW_MAX_RUNS
 * runs. A run fetches batches of up to WIC_FAKEGPU_HW_BATCH faults, at most
 * WIC_FAKEGPU_HW_MAX_BATCHES of them, and classifies each batch as nvidia-uvm does. A fetch
 * reads PUT (the latch sees a set OVERFLOW bit), takes its entries and writes GET: the pointer
 * first, then the latch reads the bit once more, then the bit is cleared. The @count warps of
 * this file's space stall between that read and the clear of the first fetch (at once when the
 * buffer is empty): a fault they drop sets the bit only for the clear to erase it unseen, the
 * race nvidia-uvm's latch cannot win. A batch made only of held faults is left alone; any other
 * has its passed faults serviced (page mapped on the GPU, WIC_FAKEGPU_EVENT_SERVICED) and ends
 * with a replay, as under nvidia-uvm's default policy (BATCH_FLUSH). A run in which no batch
 * replayed ends with a replay when uvm_wic_run_final_replay() says now, the latch being what it
 * is then; when it says deferred, the fake replays the GPU UVM_WIC_DEFERRED_REPLAY_MS later from
 * a work of its own (counted in the @replays of the call that runs then, if any), unless a
 * replay comes first.
 *
 * A replay (the bottom half's, a deferred one, uvm_wic_replay(), uvm_wic_unregister()) logs
 * WIC_FAKEGPU_EVENT_REPLAY, flushes the buffer (a GET write past every entry: latched and
 * cleared as above), clears the latch and any deferred replay, resumes every warp
 * stalled on the GPU whose page is mapped there (WIC_FAKEGPU_EVENT_RESUMED) and makes every
 * other one fault again into the buffer, in stall order rotated by one more warp at each
 * replay (the hardware's order is not specified; a fixed one could drop the same warp every
 * time). Warps of a space end with its file. Errors: ENODEV for a bad @gpu_id, EINVAL for a bad
 * @count or @entries, ENOSPC past WIC_FAKEGPU_MAX_WARPS stalled warps (the ones before stay),
 * EFAULT, ENOMEM; EINVAL too for a prefetch entry, which stalls no warp (nvidia-uvm never
 * replays one).
 */
struct wic_fakegpu_warps {
	__u32 gpu_id;
	__u32 count;
	__u64 entries;
	__u32 stalled;
	__u32 dropped;
	__u32 replays;
	__u32 reserved;
};

/**
 * struct wic_fakegpu_preempt - another context's time slice on a GPU (WIC_FAKEGPU_IOC_PREEMPT)
 * @gpu_id: in: the GPU
 * @timeout_ms: in: the context-switch timeout, 1 .. WIC_FAKEGPU_MAX_SWITCH_MS (RM's default
 *	is 4295 ms: RmEngineContextSwitchTimeoutUs 0x3fffff, 1.024-us ticks)
 * @waited_ns: out: how long the switch waited
 * @killed: out: warps the channel reset killed; 0 when the switch was done
 * @reserved: in: must be 0
 *
 * A replayable fault blocks preemption of its channel until it is serviced (nvidia-uvm,
 * uvm_gpu_non_replayable_faults.c), so a context switch away from the contexts running on
 * @gpu_id waits while any warp is stalled there, held by wic or not yet serviced. The call
 * waits, as RM's scheduler would, until no warp is stalled on @gpu_id (the switch is done:
 * WIC_FAKEGPU_EVENT_SWITCHED, with @waited_ns as its length) or until @timeout_ms passed: then
 * RM resets the channel, and every warp still stalled on @gpu_id is killed (one
 * WIC_FAKEGPU_EVENT_CHANNEL_RESET each, its fault gone from the buffer) as the context of a
 * reset channel is. Stalled warps resume only at a replay (struct wic_fakegpu_warps). Errors:
 * ENODEV for a bad @gpu_id, EINVAL for a bad @timeout_ms or @reserved, EINTR on a fatal signal
 * (the warps stay stalled), EFAULT.
 */
struct wic_fakegpu_preempt {
	__u32 gpu_id;
	__u32 timeout_ms;
	__u64 waited_ns;
	__u32 killed;
	__u32 reserved;
};

#define WIC_FAKEGPU_MAX_SWITCH_MS 60000		/* longest WIC_FAKEGPU_IOC_PREEMPT timeout */

#define WIC_FAKEGPU_IOC_MAGIC 'F'

#define WIC_FAKEGPU_IOC_INJECT _IOWR(WIC_FAKEGPU_IOC_MAGIC, 1, struct wic_fakegpu_inject)
#define WIC_FAKEGPU_IOC_EVENTS _IOWR(WIC_FAKEGPU_IOC_MAGIC, 2, struct wic_fakegpu_events)
#define WIC_FAKEGPU_IOC_PAGE_STATE _IOWR(WIC_FAKEGPU_IOC_MAGIC, 3, struct wic_fakegpu_page_state)
/*
 * Empty the event log (and its overflow count), unmap every page of this file's space, make
 * its pages reachable again, forget what fake GPUs stored (struct wic_fakegpu_gpu_store) and
 * cancel its armed failures (struct wic_fakegpu_fail).
 */
#define WIC_FAKEGPU_IOC_RESET _IO(WIC_FAKEGPU_IOC_MAGIC, 4)
#define WIC_FAKEGPU_IOC_FAIL _IOW(WIC_FAKEGPU_IOC_MAGIC, 5, struct wic_fakegpu_fail)
#define WIC_FAKEGPU_IOC_MANAGE _IOW(WIC_FAKEGPU_IOC_MAGIC, 6, struct wic_fakegpu_managed)
#define WIC_FAKEGPU_IOC_RESIDE _IOW(WIC_FAKEGPU_IOC_MAGIC, 7, struct wic_fakegpu_page_state)
#define WIC_FAKEGPU_IOC_GPU_STORE _IOW(WIC_FAKEGPU_IOC_MAGIC, 8, struct wic_fakegpu_gpu_store)
#define WIC_FAKEGPU_IOC_WARPS _IOWR(WIC_FAKEGPU_IOC_MAGIC, 9, struct wic_fakegpu_warps)
#define WIC_FAKEGPU_IOC_BOTTOM_HALF _IOWR(WIC_FAKEGPU_IOC_MAGIC, 10, struct wic_fakegpu_warps)
/* A pre-Volta GPU, whose id the __u32 argument gives, is registered in this file's space. */
#define WIC_FAKEGPU_IOC_PRE_VOLTA _IOW(WIC_FAKEGPU_IOC_MAGIC, 11, __u32)
#define WIC_FAKEGPU_IOC_PREEMPT _IOWR(WIC_FAKEGPU_IOC_MAGIC, 12, struct wic_fakegpu_preempt)
/*
 * This file's process goes away, as nvidia-uvm's uvm_va_space_mm_shutdown() handles it: the
 * hook's uvm_wic_space_shutdown() runs (wic_shim's space_shutdown callback, then, when it may
 * have held faults of the space, a replay of every GPU that had warps and their bottom halves,
 * as the faults coming back raise them), then the space's channels stop: @gpu_id's are
 * switched out as by WIC_FAKEGPU_IOC_PREEMPT, with the same results and errors. The space's
 * helper calls fail with ESRCH from then on.
 */
#define WIC_FAKEGPU_IOC_EXIT _IOWR(WIC_FAKEGPU_IOC_MAGIC, 13, struct wic_fakegpu_preempt)
/*
 * The bytes completions' fills wrote into this file's space since it was opened, into the
 * __u64 argument: the data written or copied, 8 per page of a marker, 8 per page of a
 * UVM_WIC_COMPLETE_HEADS completion (its head words alone). Counted once written, never reset
 * (not by WIC_FAKEGPU_IOC_RESET either): a test reads it before and after. Errors: EFAULT.
 */
#define WIC_FAKEGPU_IOC_FILLED _IOR(WIC_FAKEGPU_IOC_MAGIC, 14, __u64)

#endif /* _WIC_FAKEGPU_H */
