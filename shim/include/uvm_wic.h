/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * uvm_wic.h - the in-kernel interface between nvidia-uvm and wic_shim.
 *
 * nvidia-uvm (with the wic hook patch) implements and exports these symbols; wic_shim calls
 * them. The test module wic_fakegpu exports the same symbols so that wic_shim loads and runs
 * unchanged without a GPU. nvidia-uvm never depends on wic_shim: the shim registers its
 * callbacks and nvidia-uvm calls them through an RCU-protected pointer.
 *
 * Lock order (nvidia-uvm): GLOBAL < ISR < mmap_lock < va_space < va_block. The classify
 * callback runs in the replayable-fault bottom half with the ISR lock held; every other entry
 * point is called from process context with no UVM lock held.
 *
 * GPUs: only those that cancel faults by VA (fault_cancel_va_supported: Volta and later), and
 * before 560 (550) not MIG partitions, whose faults that branch attributes to the parent's
 * first partition.
 * Pre-Volta GPUs (Pascal, which the proprietary 580 nvidia.ko still drives) cancel faults per
 * uTLB, and those paths would kill the contexts of held faults or service their pages: their
 * faults are never held (shown to classify with UVM_WIC_FAULT_UNSUPPORTED, the verdict
 * ignored), and the helpers refuse them with -EOPNOTSUPP.
 */
#ifndef _UVM_WIC_H
#define _UVM_WIC_H

#include <linux/types.h>

/*
 * Bumped whenever an export is added or changes its contract, so that a copy of this header
 * found in an nvidia-uvm tree can be told apart from the shim's. 3: uvm_wic_range_managed(),
 * uvm_wic_map() fails with -EXDEV for pages it cannot map. 4: uvm_wic_copy(). 5:
 * uvm_wic_complete(). 6: struct uvm_wic_completion.flags, a completion without a companion.
 * 7: uvm_wic_run_final_replay() defers a held-only run's replay instead of skipping it;
 * uvm_wic_write(), uvm_wic_copy() and uvm_wic_unmap() go (uvm_wic_complete() does their work).
 * 8: struct uvm_wic_ops.space_shutdown; faults of unsupported GPUs shown with
 * UVM_WIC_FAULT_UNSUPPORTED. 9: UVM_WIC_COMPLETE_HEADS.
 */
#define UVM_WIC_HOOK_VERSION 9

/*
 * The largest id of a GPU in a fault or a helper call: nvidia-uvm's processor ids of GPUs run
 * from 1 to UVM_ID_MAX_GPUS (parent GPU index * 8 + MIG sub-index + 1; 0 is the CPU). The
 * hook's build checks that nvidia-uvm agrees, the shim's that its ABI covers them.
 */
#define UVM_WIC_MAX_GPU_ID 256

/* Size of one hardware replayable fault-buffer entry (clc369.h). */
#define UVM_WIC_FAULT_ENTRY_SIZE 32

struct file;
struct mm_struct;
struct module;

/* A UVM VA space, as nvidia-uvm sees one process's use of the GPUs. Opaque to the shim. */
struct uvm_wic_space;

/*
 * uvm_wic_fault flags. UVM_WIC_FAULT_PREFETCH: every access coalesced into the fault is a
 * prefetch (access_type_mask is the PREFETCH bit alone). No warp waits on a prefetch fault and
 * nvidia-uvm never replays one, but one passed is serviced like a read (the page gets mapped).
 */
#define UVM_WIC_FAULT_PREFETCH (1U << 0)
/*
 * UVM_WIC_FAULT_UNSUPPORTED: the faulting GPU is one wic does not hold faults of (pre-Volta:
 * Pascal; a MIG partition before 560). Shown only so that the shim can report a wic page
 * faulting there (a GPU registered in the space after it was attached): the verdict is
 * ignored and the fault serviced as usual.
 */
#define UVM_WIC_FAULT_UNSUPPORTED (1U << 1)

/**
 * struct uvm_wic_fault - one coalesced replayable fault, shown to the classify callback
 * @space: the VA space the fault's instance pointer translated to
 * @gpu_id: nvidia-uvm's id of the faulting GPU (uvm_id_value(gpu->id))
 * @flags: UVM_WIC_FAULT_* bits
 * @va: the page-aligned faulting virtual address
 * @raw: the fault as the 32-byte hardware fault-buffer entry (clc369.h layout)
 */
struct uvm_wic_fault {
	struct uvm_wic_space *space;
	u32 gpu_id;
	u32 flags;
	u64 va;
	u8 raw[UVM_WIC_FAULT_ENTRY_SIZE];
};

/**
 * enum uvm_wic_verdict - what nvidia-uvm does with a classified fault
 * @UVM_WIC_PASS: not a wic page: service it as usual
 * @UVM_WIC_HOLD: a wic page: neither service it nor replay for it; the warp stays stalled
 *	until wic_shim maps the page and replays
 */
enum uvm_wic_verdict {
	UVM_WIC_PASS = 0,
	UVM_WIC_HOLD = 1,
};

/**
 * struct uvm_wic_ops - the callbacks wic_shim registers with nvidia-uvm
 * @owner: the module implementing the callbacks
 * @classify: called for each coalesced fault of a batch, right after preprocessing, in the
 *	bottom half with the ISR lock held and inside an RCU read-side section: it must not
 *	sleep nor call back into nvidia-uvm. Never called for fatal faults; a fault of a GPU
 *	wic does not hold comes with UVM_WIC_FAULT_UNSUPPORTED, and its verdict is ignored
 * @space_shutdown: optional; called when a space's process goes away, before nvidia-uvm stops
 *	the space's channels (uvm_va_space_mm_shutdown(), which expects the space's faults to be
 *	serviced: a held one would keep its channel from being stopped). The callback stops
 *	holding the space's faults and answers whether it may have held some: then nvidia-uvm
 *	replays the space's GPUs, and the faults come back and are serviced. Called in process
 *	context inside an RCU read-side section: it must not sleep nor call into nvidia-uvm
 */
struct uvm_wic_ops {
	struct module *owner;
	enum uvm_wic_verdict (*classify)(const struct uvm_wic_fault *fault);
	bool (*space_shutdown)(struct uvm_wic_space *space);
};

/*
 * How long a bottom-half run made only of held faults may put off its final replay
 * (uvm_wic_run_final_replay()): a fault the hardware dropped from the buffer waits at most
 * this long, plus the time to run the replay.
 */
#define UVM_WIC_DEFERRED_REPLAY_MS 100

/**
 * enum uvm_wic_final_replay - when a replayable-fault bottom-half run issues its final replay
 * @UVM_WIC_REPLAY_NOW: at the end of the run, as nvidia-uvm does
 * @UVM_WIC_REPLAY_DEFERRED: UVM_WIC_DEFERRED_REPLAY_MS later, unless a START replay of the
 *	GPU happens first
 */
enum uvm_wic_final_replay {
	UVM_WIC_REPLAY_NOW,
	UVM_WIC_REPLAY_DEFERRED,
};

/**
 * uvm_wic_run_final_replay() - when a replayable-fault bottom-half run issues its final replay
 * @failed: the run failed
 * @num_batches: the batches it fetched
 * @num_held_batches: those of them made only of held faults
 * @max_batches: the most batches one run services
 * @overflow_seen: the OVERFLOW bit was seen set since the last START replay (latched where
 *	nvidia-uvm reads PUT and where it clears the bit)
 * @overflow_visible: the OVERFLOW bit can be seen at all: false under Confidential Computing,
 *	where nvidia-uvm reads GSP-RM's shadow of the buffer, not the hardware's registers
 *
 * Asked where nvidia-uvm's run ends with a START replay because no batch of it replayed, "to
 * avoid dropping faults that do not show up in the buffer" (uvm_gpu_replayable_faults.c): a
 * fault the hardware drops raises no interrupt and comes back only with a replay. For a run of
 * held faults only, that replay would make every held fault fault again, and the run that
 * fetches them would replay again: a storm. So such a run puts its replay off instead of
 * leaving it out: a fault lost in a way the latch cannot see (dropped between nvidia-uvm's
 * last read of OVERFLOW and its clear, or any other fault that does not show up in the
 * buffer) waits at most UVM_WIC_DEFERRED_REPLAY_MS, and the held faults fault again at most
 * that often. Wherever a fault may have been dropped for sure (an overflow seen, a run stopped
 * on @max_batches with a backlog, a failure) or the overflow cannot be seen, it replays now.
 * The rule of the patched driver (uvm_wic_run_needs_replay()), here so that the test stand-in
 * for nvidia-uvm and the userspace checker run the same.
 */
static inline enum uvm_wic_final_replay
uvm_wic_run_final_replay(bool failed, u32 num_batches, u32 num_held_batches, u32 max_batches,
			 bool overflow_seen, bool overflow_visible)
{
	/* Some batch was serviced (or none was fetched): the driver's own rule applies. */
	if (num_batches == 0 || num_held_batches != num_batches)
		return UVM_WIC_REPLAY_NOW;
	if (failed || num_batches >= max_batches || overflow_seen || !overflow_visible)
		return UVM_WIC_REPLAY_NOW;
	return UVM_WIC_REPLAY_DEFERRED;
}

/**
 * uvm_wic_register() - install the shim's callbacks
 * @ops: the callbacks; must stay valid until uvm_wic_unregister() returns
 *
 * Return: 0, or -EBUSY when callbacks are installed already.
 */
int uvm_wic_register(const struct uvm_wic_ops *ops);

/**
 * uvm_wic_unregister() - remove the shim's callbacks
 * @ops: the callbacks passed to uvm_wic_register()
 *
 * Waits until no bottom half is still inside @ops->classify, then replays every GPU with
 * replayable faults: the faults @ops->classify held fault again and are serviced as usual.
 * Process context only.
 */
void uvm_wic_unregister(const struct uvm_wic_ops *ops);

/**
 * uvm_wic_space_get() - the VA space behind an open UVM file
 * @uvm_file: a file of the application's, received by the daemon over a Unix socket
 *
 * Takes a reference that keeps the space alive until uvm_wic_space_put().
 *
 * Return: the space, or an ERR_PTR: -EBADF when @uvm_file is not a UVM VA-space file,
 * -ENODEV when the space has no mm (it was not initialised by a process), -EOPNOTSUPP when
 * a pre-Volta GPU is registered in the space, -EPERM under Confidential Computing (a
 * completion cannot write a held page there).
 */
struct uvm_wic_space *uvm_wic_space_get(struct file *uvm_file);

/**
 * uvm_wic_space_put() - drop a reference taken by uvm_wic_space_get()
 * @space: the space
 */
void uvm_wic_space_put(struct uvm_wic_space *space);

/**
 * uvm_wic_space_mm() - the address space whose memory @space manages
 * @space: a space held by the caller
 *
 * Return: the mm, valid while the caller holds @space; no reference is taken.
 */
struct mm_struct *uvm_wic_space_mm(struct uvm_wic_space *space);

/* struct uvm_wic_completion.flags */
#define UVM_WIC_COMPLETE_NO_FILL	(1U << 0)	/* no fill: the run is mapped as it is */
#define UVM_WIC_COMPLETE_NO_MAP		(1U << 1)	/* the fill alone: the run stays unmapped */
#define UVM_WIC_COMPLETE_WRITABLE	(1U << 2)	/* map the run read-write (a PAT page) */
#define UVM_WIC_COMPLETE_HEADS		(1U << 3)	/* fill: word i of @src at page i */
#define UVM_WIC_COMPLETE_FLAGS		(UVM_WIC_COMPLETE_NO_FILL | UVM_WIC_COMPLETE_NO_MAP | \
					 UVM_WIC_COMPLETE_WRITABLE | UVM_WIC_COMPLETE_HEADS)

/**
 * struct uvm_wic_completion - one wake-up of a slot, or a step of one, for uvm_wic_complete()
 * @gpu_id: the consumer GPU
 * @pages: pages of the run, and of its companion
 * @va: the run, page-aligned
 * @companion: the slot's other run, page-aligned, not overlapping the run; 0 for none
 * @src: kernel memory holding @length bytes for the run, or NULL; with
 *	UVM_WIC_COMPLETE_HEADS, @pages 8-byte words, the heads of the run's pages
 * @src_va: with @src NULL and @length not 0: where the @length bytes are copied from (a GPU
 *	producer's managed buffer, read where it is resident: from GPU memory by that GPU's
 *	copy engine, from CPU memory by memcpy(), a page resident nowhere as zeros; ordered
 *	after UVM's own work on it, not after the producer's kernel, which fences system-wide
 *	before it signals and leaves the bytes alone until the completion returned); neither
 *	wrapping nor overlapping the run
 * @length: bytes of data, at most @pages pages; 0 for a marker; with UVM_WIC_COMPLETE_HEADS,
 *	8 x @pages
 * @marker: with @length 0: the word written at the start of each page of the run
 * @flags: UVM_WIC_COMPLETE_* (0: fill, unmap the companion, map read-only); NO_FILL with a
 *	@length, NO_MAP with WRITABLE, and HEADS without @src, with NO_FILL or with a @length
 *	other than 8 x @pages, are refused. HEADS: a run its producer wrote in place, all but the
 *	first 8 bytes of each page (where markers go, which only completions write); the fill
 *	writes word i of @src at the start of page i of the run and nothing else
 * @result: out: 0 or a negative errno, of the step that failed
 * @companion_unmapped: out: the companion's unmap was done, even if the map after it failed
 *	(the faults held on the companion are late duplicates the shim can let go)
 */
struct uvm_wic_completion {
	u32 gpu_id;
	u32 pages;
	u64 va;
	u64 companion;
	const void *src;
	u64 src_va;
	u64 length;
	u64 marker;
	u32 flags;
	int result;
	bool companion_unmapped;
};

/**
 * uvm_wic_complete() - complete wake-ups: each one's fill (the data written, or copied, or
 *	the marker, or with UVM_WIC_COMPLETE_HEADS one head word at the start of each page), the
 *	unmap of its companion from the GPU (waiting for the TLB invalidate) and the map of its
 *	run (the steps its flags and companion leave)
 * @space: the space
 * @completions: the wake-ups, run in order
 * @count: how many
 *
 * One call does up to 3 * @count steps under one acquisition of the locks, the space's
 * staging page and one wait for the PTE writes and TLB invalidates, at the end. Each wake-up
 * stops at its first failing step (a run whose fill failed is never mapped) and the next one
 * goes on. Process context only. On return every mapping and unmapping of a wake-up whose
 * @result is 0 is in place; when that final wait fails, each wake-up that had succeeded gets
 * its error.
 *
 * Return: 0, or a negative errno when nothing could run (-EINVAL for no @completions or a
 * @count of 0, -ESRCH when the process is gone, -EAGAIN while the driver is suspended,
 * -ENOMEM); then no @result was set.
 */
int uvm_wic_complete(struct uvm_wic_space *space, struct uvm_wic_completion *completions,
		     u32 count);

/**
 * uvm_wic_range_managed() - whether a range is managed memory of a space
 * @space: the space
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * The other helpers work on managed memory (cudaMallocManaged) only: a fault on any other
 * page (HMM: malloc, mmap) could be held but never completed. Process context only.
 *
 * Return: 0 when managed allocations of @space cover [@va, @va + @len) without a gap,
 * -EMEDIUMTYPE when they do not, -EINVAL for an unaligned, empty or wrapping range, -EAGAIN
 * while the driver is suspended.
 */
int uvm_wic_range_managed(struct uvm_wic_space *space, u64 va, u64 len);

/**
 * uvm_wic_map() - map managed pages on a GPU, so that faults on them can be replayed
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 * @writable: map read-write (a producer's PAT page) rather than read-only
 *
 * Process context only; returns once the mapping is in place. Every page is checked once
 * mapped: nvidia-uvm's own map skips without an error pages it cannot map on this GPU, and a
 * fault released on such a page would come back at once, forever.
 *
 * A writable map (a producer's PAT page) first makes a page resident nowhere (untouched)
 * resident on the CPU, zeroed, as nvidia-uvm's first touch would.
 *
 * Return: 0 or a negative errno: -EOPNOTSUPP for a pre-Volta GPU, -ENODATA when a page is
 * resident nowhere (a read-only map), -EXDEV when a page cannot be mapped on @gpu_id as asked
 * (resident only on a GPU without peer access to it; read duplication, a preferred location on @gpu_id or
 * UVM-Lite keeping it from a remote mapping; a writable map of a read-duplicated page). On an
 * error other pages of the range may be mapped.
 */
int uvm_wic_map(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len, bool writable);

/**
 * uvm_wic_revoke_write() - make a GPU's next write to managed pages fault again
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Return: 0 or a negative errno (-EOPNOTSUPP for a pre-Volta GPU).
 */
int uvm_wic_revoke_write(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len);

/**
 * uvm_wic_replay() - replay a GPU's stalled faults
 * @gpu_id: the GPU
 *
 * Flushes the GPU's fault buffer and issues a replay: every stalled access retries; those
 * whose pages are now mapped resume, the others fault again.
 *
 * Return: 0 or a negative errno (-ENODEV for an unknown GPU, -EOPNOTSUPP for a pre-Volta
 * GPU).
 */
int uvm_wic_replay(u32 gpu_id);

#endif /* _UVM_WIC_H */
