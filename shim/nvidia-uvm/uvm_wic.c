// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * uvm_wic.c - the nvidia-uvm side of wic (warp-level interrupts).
 *
 * The replayable-fault bottom half shows every coalesced fault of a batch to the callbacks that
 * wic_shim registered (uvm_wic_classify_batch(), called right after preprocess_fault_batch()).
 * Faults the shim holds are marked is_wic_held: the fault path neither services nor cancels
 * them, issues no replay for a batch made only of held faults and defers the final replay of a
 * run made only of them (uvm_wic_run_needs_replay()), so the faulting warps stay stalled.
 * Later the daemon, through wic_shim, completes them (uvm_wic_complete(): the data written, or
 * copied from a GPU producer's managed buffer, the slot's other run unmapped, the pages mapped
 * on the GPU, for many wake-ups at once) and replays (uvm_wic_replay()); the warps resume.
 *
 * Lock order (uvm_lock.h): GLOBAL_PM < GLOBAL < ISR < mmap_lock < va_space < va_block. The
 * classify callback runs under the ISR lock inside an RCU read-side section. Every exported
 * helper is an entry point into nvidia-uvm, like an ioctl: it is called in process context with
 * no UVM lock held, runs inside a UVM thread context and holds the power-management lock for
 * read so that it cannot race with suspend.
 *
 * A space handed to wic_shim is the uvm_va_space_t itself, so that the space in a classified
 * fault compares equal to the one uvm_wic_space_get() returned. The reference behind it (the
 * VA-space file and a grab on the mm) lives in a small registry.
 */

#include <linux/err.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/workqueue.h>

#include "uvm_api.h"
#include "uvm_common.h"
#include "uvm_global.h"
#include "uvm_gpu.h"
#include "uvm_gpu_replayable_faults.h"
#include "uvm_hal_types.h"
#include "uvm_kvmalloc.h"
#include "uvm_linux.h"
#include "uvm_lock.h"
#include "uvm_mem.h"
#include "uvm_processors.h"
#include "uvm_tracker.h"
#include "uvm_va_block.h"
#include "uvm_va_range.h"
#include "uvm_va_space.h"
#include "uvm_va_space_mm.h"
#include "uvm_wic.h"
#include "uvm_wic_hook.h"

/*
 * Driver branches (550 to 595), told apart by what each provides, never by its version: the
 * driver has no numeric version macro, and fields changed within a branch (570). Two facts no
 * preprocessor symbol shows are found by the patch's Kbuild hunk, which greps
 * uvm_gpu_replayable_faults.h and defines UVM_WIC_HAVE_*.
 *
 * 595 dropped Pascal and Volta: every GPU it drives is Turing or later, cancels by VA and has
 * replayable faults, and the parent-GPU flags fault_cancel_va_supported and
 * replayable_faults_supported are gone, with Pascal's host subchannel macro
 * (uvm_push_macros.h).
 */
#ifdef UVM_SUBCHANNEL_C06F
#define WIC_CANCELS_BY_VA(parent)	((parent)->fault_cancel_va_supported)
#define WIC_HAS_REPLAYABLE(parent)	((parent)->replayable_faults_supported)
#else
#define WIC_CANCELS_BY_VA(parent)	true
#define WIC_HAS_REPLAYABLE(parent)	true
#endif

/*
 * Before 560 the replayable-fault bottom half runs per uvm_gpu_t
 * (uvm_gpu_service_replayable_faults(gpu)), which it passes to uvm_wic_classify_batch(), and a
 * fault entry has no gpu field; 560 moved the bottom half to the parent GPU
 * (uvm_parent_gpu_service_replayable_faults()) and added uvm_fault_buffer_entry_t.gpu and
 * UVM_FAULT_TYPE_CC_VIOLATION.
 */
#ifdef UVM_WIC_HAVE_PARENT_FAULT_SERVICE
#define WIC_ENTRY_GPU(entry, gpu)	((entry)->gpu)
#define WIC_SAME_GPU(a, b)		((a)->gpu == (b)->gpu)
#define WIC_FAULTS_ATTRIBUTED(parent)	true
#else
#define WIC_ENTRY_GPU(entry, gpu)	(gpu)
#define WIC_SAME_GPU(a, b)		true	/* one GPU per bottom-half run */
/*
 * Before 560, with MIG (SMC) on, the parent's one bottom half runs for its first valid
 * partition (find_first_valid_gpu(), uvm_gpu_isr.c) and every fault looks like that
 * partition's: held, it would be completed and replayed on the wrong one. Such GPUs are not
 * held (wic_gpu_supported()).
 */
#define WIC_FAULTS_ATTRIBUTED(parent)	(!(parent)->smc.enabled)
#endif

/* 595 renamed uvm_gpu_fault_buffer_flush(). */
#ifdef UVM_WIC_HAVE_REPLAYABLE_BUFFER_FLUSH
#define wic_fault_buffer_flush(gpu)	uvm_gpu_replayable_buffer_flush(gpu)
#else
#define wic_fault_buffer_flush(gpu)	uvm_gpu_fault_buffer_flush(gpu)
#endif

/* A GPU id nvidia-uvm gives must be one wic_shim can hold and replay. */
static_assert(UVM_ID_MAX_GPUS == UVM_WIC_MAX_GPU_ID, "nvidia-uvm's GPU ids are not uvm_wic.h's");

/* Protects wic_ops updates and the space registry. Never taken in the fault path. */
static DEFINE_MUTEX(wic_lock);

static const struct uvm_wic_ops __rcu *wic_ops;

/**
 * struct wic_space_ref - one VA space held by wic_shim: the references behind the
 *	uvm_wic_space pointer, and the space's staging page
 * @node: in wic_spaces
 * @va_space: the space
 * @file: keeps @va_space alive
 * @mm: grabbed: stays valid after the process exits
 * @count: uvm_wic_space_get() references
 * @stage_lock: held by a context that fills (wic_begin() to wic_end()), before mmap_lock;
 *	protects @stage, @stage_gpus and the page's bytes
 * @stage: the one-page staging buffer of the fills, allocated at the first fill and kept
 *	until the last reference goes: the space's fills do not allocate, map and free a page
 *	each (the tools READ/WRITE_PROCESS_MEMORY ioctl's way, once per call)
 * @stage_gpus: the GPUs @stage was mapped on (or a map was tried on), each retained until
 *	@stage is freed, so that its mapping stays valid after the GPU leaves the space
 * @deferred_free: queues the free on nvidia-uvm's deferred release queue while a suspend holds
 *	the pm lock (wic_space_ref_free())
 */
struct wic_space_ref {
	struct list_head node;
	uvm_va_space_t *va_space;
	struct file *file;
	struct mm_struct *mm;
	unsigned int count;
	struct mutex stage_lock;
	uvm_mem_t *stage;
	uvm_processor_mask_t stage_gpus;
	nv_kthread_q_item_t deferred_free;
};

static LIST_HEAD(wic_spaces);

static uvm_va_space_t *wic_va_space(struct uvm_wic_space *space)
{
	return (uvm_va_space_t *)space;
}

/*
 * Fault classification
 */

/* Hardware fault-buffer encodings (clc369.h, dev_fault.h). */
#define WIC_HW_INST_APERTURE_VID	0x0
#define WIC_HW_INST_APERTURE_SYS_COH	0x2
#define WIC_HW_ACCESS_VIRT_READ		0x0
#define WIC_HW_ACCESS_VIRT_WRITE	0x1
#define WIC_HW_ACCESS_VIRT_ATOMIC_STRONG 0x2
#define WIC_HW_ACCESS_VIRT_PREFETCH	0x3
#define WIC_HW_ACCESS_VIRT_ATOMIC_WEAK	0x4
#define WIC_HW_ACCESS_PHYS_READ		0x8
#define WIC_HW_ACCESS_PHYS_WRITE	0x9
#define WIC_HW_ACCESS_PHYS_ATOMIC	0xa
#define WIC_HW_ACCESS_PHYS_PREFETCH	0xb

static const u8 wic_hw_fault_type[UVM_FAULT_TYPE_COUNT] = {
	[UVM_FAULT_TYPE_INVALID_PDE]		= 0x0,
	[UVM_FAULT_TYPE_INVALID_PTE]		= 0x2,
	[UVM_FAULT_TYPE_ATOMIC]			= 0xf,
	[UVM_FAULT_TYPE_WRITE]			= 0x6,	/* RO violation */
	[UVM_FAULT_TYPE_READ]			= 0x7,	/* WO violation */
	[UVM_FAULT_TYPE_PDE_SIZE]		= 0x1,
	[UVM_FAULT_TYPE_VA_LIMIT_VIOLATION]	= 0x3,
	[UVM_FAULT_TYPE_UNBOUND_INST_BLOCK]	= 0x4,
	[UVM_FAULT_TYPE_PRIV_VIOLATION]		= 0x5,
	[UVM_FAULT_TYPE_PITCH_MASK_VIOLATION]	= 0x8,
	[UVM_FAULT_TYPE_WORK_CREATION]		= 0x9,
	[UVM_FAULT_TYPE_UNSUPPORTED_APERTURE]	= 0xa,
	[UVM_FAULT_TYPE_COMPRESSION_FAILURE]	= 0xb,
	[UVM_FAULT_TYPE_UNSUPPORTED_KIND]	= 0xc,
	[UVM_FAULT_TYPE_REGION_VIOLATION]	= 0xd,
	[UVM_FAULT_TYPE_POISONED]		= 0xe,
#ifdef UVM_WIC_HAVE_PARENT_FAULT_SERVICE
	[UVM_FAULT_TYPE_CC_VIOLATION]		= 0xb,	/* Blackwell */
#endif
};

static u32 wic_hw_access_type(const uvm_fault_buffer_entry_t *entry)
{
	bool virt = entry->is_virtual;

	switch (entry->fault_access_type) {
	case UVM_FAULT_ACCESS_TYPE_PREFETCH:
		return virt ? WIC_HW_ACCESS_VIRT_PREFETCH : WIC_HW_ACCESS_PHYS_PREFETCH;
	case UVM_FAULT_ACCESS_TYPE_READ:
		return virt ? WIC_HW_ACCESS_VIRT_READ : WIC_HW_ACCESS_PHYS_READ;
	case UVM_FAULT_ACCESS_TYPE_WRITE:
		return virt ? WIC_HW_ACCESS_VIRT_WRITE : WIC_HW_ACCESS_PHYS_WRITE;
	case UVM_FAULT_ACCESS_TYPE_ATOMIC_WEAK:
		return virt ? WIC_HW_ACCESS_VIRT_ATOMIC_WEAK : WIC_HW_ACCESS_PHYS_ATOMIC;
	case UVM_FAULT_ACCESS_TYPE_ATOMIC_STRONG:
	default:
		return virt ? WIC_HW_ACCESS_VIRT_ATOMIC_STRONG : WIC_HW_ACCESS_PHYS_ATOMIC;
	}
}

/*
 * Re-encode a parsed, coalesced entry as the 32-byte hardware packet (eight little-endian
 * dwords, clc369.h). Lost in parsing and therefore not reproduced: ADDR_PHYS_APERTURE (0),
 * the coherent/non-coherent distinction of a sysmem instance block (written as coherent) and
 * the address bits below PAGE_SHIFT. The access type is the most intrusive of the coalesced
 * instances.
 */
static void wic_encode_entry(const uvm_fault_buffer_entry_t *entry,
			     u8 raw[UVM_WIC_FAULT_ENTRY_SIZE])
{
	u64 inst = entry->instance_ptr.address >> 12;
	u64 addr = entry->fault_address >> 12;
	u32 dw[UVM_WIC_FAULT_ENTRY_SIZE / 4];
	u32 aperture;
	u32 fault_type = 0;
	int i;

	aperture = entry->instance_ptr.aperture == UVM_APERTURE_VID ?
		   WIC_HW_INST_APERTURE_VID : WIC_HW_INST_APERTURE_SYS_COH;
	if (entry->fault_type < UVM_FAULT_TYPE_COUNT)
		fault_type = wic_hw_fault_type[entry->fault_type];

	dw[0] = (aperture << 8) | ((u32)(inst & 0xfffff) << 12);
	dw[1] = (u32)(inst >> 20);
	dw[2] = (u32)(addr & 0xfffff) << 12;
	dw[3] = (u32)(addr >> 20);
	dw[4] = (u32)entry->timestamp;
	dw[5] = (u32)(entry->timestamp >> 32);
	dw[6] = entry->fault_source.mmu_engine_id & 0x1ff;
	dw[7] = (fault_type & 0x1f) |
		((u32)entry->is_replayable << 7) |
		((u32)(entry->fault_source.client_id & 0x7f) << 8) |
		(wic_hw_access_type(entry) << 16) |
		((u32)(entry->fault_source.client_type == UVM_FAULT_CLIENT_TYPE_HUB) << 20) |
		((u32)(entry->fault_source.gpc_id & 0x1f) << 24) |
		((u32)entry->in_protected_mode << 29) |
		(1u << 30) |	/* REPLAYABLE_FAULT_EN */
		(1u << 31);	/* VALID */

	for (i = 0; i < ARRAY_SIZE(dw); i++) {
		raw[4 * i + 0] = dw[i];
		raw[4 * i + 1] = dw[i] >> 8;
		raw[4 * i + 2] = dw[i] >> 16;
		raw[4 * i + 3] = dw[i] >> 24;
	}
}

/*
 * wic holds faults only on GPUs that cancel faults by VA (Volta and later), see uvm_wic.h,
 * and whose faults carry their GPU (not a MIG partition before 560).
 */
static bool wic_gpu_supported(const uvm_gpu_t *gpu)
{
	return WIC_CANCELS_BY_VA(gpu->parent) && WIC_FAULTS_ATTRIBUTED(gpu->parent);
}

static bool wic_same_page(const uvm_fault_buffer_entry_t *a, const uvm_fault_buffer_entry_t *b)
{
	return a->va_space == b->va_space && WIC_SAME_GPU(a, b) &&
	       a->fault_address == b->fault_address;
}

bool uvm_wic_classify_batch(uvm_gpu_t *gpu, uvm_fault_service_batch_context_t *batch_context)
{
	uvm_fault_buffer_entry_t **cache = batch_context->ordered_fault_cache;
	NvU32 count = batch_context->num_coalesced_faults;
	const NvU32 prefetch_only = uvm_fault_access_type_mask_bit(UVM_FAULT_ACCESS_TYPE_PREFETCH);
	const struct uvm_wic_ops *ops;
	struct uvm_wic_fault fault;
	NvU32 num_held = 0;
	NvU32 i, j, k;

	if (!rcu_access_pointer(wic_ops) || count == 0)
		return false;

	rcu_read_lock();
	ops = rcu_dereference(wic_ops);
	if (!ops)
		goto out;

	/*
	 * The batch is sorted by VA space, GPU, address and access type, most intrusive first:
	 * one page's faults are adjacent, its prefetch-only entries last. A prefetch-only entry
	 * is shown with UVM_WIC_FAULT_PREFETCH, which the shim holds without recording: nothing
	 * waits on it and it is never replayed, but serviced it would map the page.
	 *
	 * Faults of a GPU without fault_cancel_va_supported (Pascal), or of a MIG partition
	 * before 560, are never held: Pascal's cancel paths (cancel_fault_batch_tlb(),
	 * cancel_faults_precise_tlb()) do not classify and would cancel the held faults' contexts
	 * or service their pages. They are shown with UVM_WIC_FAULT_UNSUPPORTED, the verdict
	 * ignored, so that the shim can report a wic page faulting on such a GPU (one registered
	 * in the space after it was attached): its warp reads the page without its data.
	 */
	for (i = 0; i < count; i = j) {
		bool held = false;

		for (j = i; j < count && wic_same_page(cache[j], cache[i]); j++) {
			uvm_fault_buffer_entry_t *entry = cache[j];

			bool supported;

			if (entry->is_fatal || !entry->va_space || !WIC_ENTRY_GPU(entry, gpu))
				continue;

			supported = wic_gpu_supported(WIC_ENTRY_GPU(entry, gpu));
			fault.space = (struct uvm_wic_space *)entry->va_space;
			fault.gpu_id = uvm_id_value(WIC_ENTRY_GPU(entry, gpu)->id);
			fault.flags = (entry->access_type_mask == prefetch_only ?
				       UVM_WIC_FAULT_PREFETCH : 0) |
				      (supported ? 0 : UVM_WIC_FAULT_UNSUPPORTED);
			fault.va = entry->fault_address;
			wic_encode_entry(entry, fault.raw);
			if (ops->classify(&fault) == UVM_WIC_HOLD && supported)
				held = true;
		}

		if (!held)
			continue;

		for (k = i; k < j; k++) {
			if (cache[k]->is_fatal)
				continue;
			cache[k]->is_wic_held = true;
			num_held++;
		}
	}

out:
	rcu_read_unlock();
	return num_held == count;
}

bool uvm_wic_active(void)
{
	return rcu_access_pointer(wic_ops) != NULL;
}

/*
 * Deferred final replays (uvm_wic_run_final_replay()). A run of held faults only that cannot
 * know whether the hardware dropped a fault puts its replay off: @wic_deferred has one entry
 * per GPU whose replay is due, keyed by the parent GPU (the fault buffer is the parent's), and
 * wic_deferred_work replays each when it is due. A START replay of the GPU meanwhile
 * (uvm_wic_replayed()) makes it unnecessary. The work runs on @wic_deferred_wq, which lives
 * while callbacks are registered: only then are replays deferred.
 */
#define WIC_DEFERRED_MAX UVM_ID_MAX_GPUS

static int wic_enter(void);
static void wic_exit(void);

static DEFINE_SPINLOCK(wic_deferred_lock);
static struct {
	const uvm_parent_gpu_t *parent;
	unsigned long due;
} wic_deferred[WIC_DEFERRED_MAX];
static struct workqueue_struct *wic_deferred_wq;
static void wic_deferred_replay(struct work_struct *work);
static DECLARE_DELAYED_WORK(wic_deferred_work, wic_deferred_replay);

/* Arms @parent_gpu's deferred replay, unless it is armed already; under the ISR lock. */
static void wic_defer_replay(uvm_parent_gpu_t *parent_gpu)
{
	unsigned long delay = msecs_to_jiffies(UVM_WIC_DEFERRED_REPLAY_MS);
	bool armed = false;
	int i, free = -1;

	spin_lock(&wic_deferred_lock);
	for (i = 0; i < WIC_DEFERRED_MAX && !armed; i++) {
		if (wic_deferred[i].parent == parent_gpu)
			armed = true;
		else if (!wic_deferred[i].parent && free < 0)
			free = i;
	}
	if (!armed && free >= 0) {
		wic_deferred[free].parent = parent_gpu;
		wic_deferred[free].due = jiffies + delay;
	}
	spin_unlock(&wic_deferred_lock);

	/* Callbacks registered: the queue exists until uvm_wic_unregister() waited for us. */
	rcu_read_lock();
	if (rcu_dereference(wic_ops))
		queue_delayed_work(wic_deferred_wq, &wic_deferred_work, delay);
	rcu_read_unlock();
}

void uvm_wic_replayed(uvm_parent_gpu_t *parent_gpu)
{
	int i;

	spin_lock(&wic_deferred_lock);
	for (i = 0; i < WIC_DEFERRED_MAX; i++) {
		if (wic_deferred[i].parent == parent_gpu)
			wic_deferred[i].parent = NULL;
	}
	spin_unlock(&wic_deferred_lock);
}

/*
 * Whether @parent_gpu's deferred replay is due; forgets it then. With @requeue, the delay
 * until the earliest other entry is due (0 for one due already).
 */
static bool wic_deferred_due(const uvm_parent_gpu_t *parent_gpu, unsigned long *requeue)
{
	bool due = false;
	int i;

	spin_lock(&wic_deferred_lock);
	for (i = 0; i < WIC_DEFERRED_MAX; i++) {
		if (!wic_deferred[i].parent)
			continue;
		if (wic_deferred[i].parent == parent_gpu &&
		    time_after_eq(jiffies, wic_deferred[i].due)) {
			wic_deferred[i].parent = NULL;
			due = true;
		} else if (requeue) {
			*requeue = min(*requeue, time_before(jiffies, wic_deferred[i].due) ?
						 wic_deferred[i].due - jiffies : 0);
		}
	}
	spin_unlock(&wic_deferred_lock);

	return due;
}

/*
 * Forgets the entries of GPUs that are gone: one whose parent is no longer among the GPUs
 * cannot be replayed, and its pointer could be reused by another parent.
 */
static void wic_deferred_forget_gone(const uvm_processor_mask_t *present_parents_gpus)
{
	bool present;
	uvm_gpu_t *gpu;
	int i;

	spin_lock(&wic_deferred_lock);
	for (i = 0; i < WIC_DEFERRED_MAX; i++) {
		if (!wic_deferred[i].parent)
			continue;
		present = false;
		for_each_gpu_in_mask(gpu, present_parents_gpus)
			present |= gpu->parent == wic_deferred[i].parent;
		if (!present)
			wic_deferred[i].parent = NULL;
	}
	spin_unlock(&wic_deferred_lock);
}

static void wic_deferred_replay_entry(void)
{
	unsigned long requeue = ULONG_MAX;
	uvm_processor_mask_t *gpus;
	uvm_gpu_t *gpu;

	gpus = uvm_processor_mask_cache_alloc();
	if (!gpus) {
		requeue = msecs_to_jiffies(UVM_WIC_DEFERRED_REPLAY_MS);
		goto out;
	}
	uvm_processor_mask_zero(gpus);

	/* Like an ioctl: not while suspended, nor after a fatal error; tried again later. */
	if (wic_enter()) {
		requeue = msecs_to_jiffies(UVM_WIC_DEFERRED_REPLAY_MS);
		goto out;
	}

	/* One GPU of each parent: the replay is the parent's fault buffer's. */
	uvm_mutex_lock(&g_uvm_global.global_lock);
	for_each_gpu(gpu) {
		uvm_gpu_t *other;
		bool first = true;

		for_each_gpu_in_mask(other, gpus)
			first &= other->parent != gpu->parent;
		if (first && WIC_HAS_REPLAYABLE(gpu->parent))
			uvm_processor_mask_set(gpus, gpu->id);
	}
	uvm_global_gpu_retain(gpus);
	uvm_mutex_unlock(&g_uvm_global.global_lock);

	wic_deferred_forget_gone(gpus);
	for_each_gpu_in_mask(gpu, gpus) {
		/* Takes the ISR lock and pushes a START replay (uvm_wic_replayed()). */
		if (wic_deferred_due(gpu->parent, NULL))
			wic_fault_buffer_flush(gpu);
	}
	wic_deferred_due(NULL, &requeue);

	uvm_global_gpu_release(gpus);
	wic_exit();
out:
	uvm_processor_mask_cache_free(gpus);
	if (requeue != ULONG_MAX) {
		rcu_read_lock();
		if (rcu_dereference(wic_ops))
			queue_delayed_work(wic_deferred_wq, &wic_deferred_work, requeue);
		rcu_read_unlock();
	}
}

static void wic_deferred_replay(struct work_struct *work)
{
	UVM_ENTRY_VOID(wic_deferred_replay_entry());
}

bool uvm_wic_run_needs_replay(uvm_parent_gpu_t *parent_gpu,
			      bool overflow_seen,
			      NV_STATUS status,
			      NvU32 num_batches,
			      NvU32 num_wic_held_batches,
			      NvU32 max_batches)
{
	if (uvm_wic_run_final_replay(status != NV_OK, num_batches, num_wic_held_batches,
				     max_batches, overflow_seen,
				     !g_uvm_global.conf_computing_enabled) == UVM_WIC_REPLAY_NOW)
		return true;

	wic_defer_replay(parent_gpu);
	return false;
}

void uvm_wic_space_shutdown(uvm_va_space_t *va_space)
{
	uvm_parent_processor_mask_t flushed;
	const struct uvm_wic_ops *ops;
	uvm_processor_mask_t *gpus;
	bool held = false;
	uvm_gpu_t *gpu;

	if (!rcu_access_pointer(wic_ops))
		return;
	rcu_read_lock();
	ops = rcu_dereference(wic_ops);
	if (ops && ops->space_shutdown)
		held = ops->space_shutdown((struct uvm_wic_space *)va_space);
	rcu_read_unlock();
	if (!held)
		return;

	gpus = uvm_processor_mask_cache_alloc();
	if (!gpus) {
		/* The shim's own bound (max_hold_ms) ends the holds then. */
		pr_warn("wic: no memory to replay the GPUs of an exiting process\n");
		return;
	}
	uvm_va_space_down_read(va_space);
	uvm_processor_mask_copy(gpus, &va_space->registered_gpus);
	uvm_global_gpu_retain(gpus);
	uvm_va_space_up_read(va_space);

	/* As uvm_va_space_mm_shutdown() flushes after the stop: one flush per fault buffer. */
	uvm_parent_processor_mask_zero(&flushed);
	for_each_gpu_in_mask(gpu, gpus) {
		if (WIC_HAS_REPLAYABLE(gpu->parent) && wic_gpu_supported(gpu) &&
		    !uvm_parent_processor_mask_test_and_set(&flushed, gpu->parent->id))
			wic_fault_buffer_flush(gpu);
	}
	uvm_global_gpu_release(gpus);
	uvm_processor_mask_cache_free(gpus);
}

/**
 * uvm_wic_register() - install the shim's callbacks
 * @ops: the callbacks; must stay valid until uvm_wic_unregister() returns
 *
 * No reference is taken on @ops->owner: wic_shim depends on nvidia-uvm and unregisters in its
 * module exit.
 *
 * Return: 0, -EINVAL when @ops has no classify callback, or -EBUSY when callbacks are
 * installed already.
 */
int uvm_wic_register(const struct uvm_wic_ops *ops)
{
	int ret = 0;

	if (!ops || !ops->classify)
		return -EINVAL;

	mutex_lock(&wic_lock);
	if (rcu_dereference_protected(wic_ops, lockdep_is_held(&wic_lock))) {
		ret = -EBUSY;
	} else {
		/* Before the callbacks: a run can defer its replay as soon as they hold a fault. */
		wic_deferred_wq = alloc_workqueue("uvm_wic", WQ_UNBOUND, 0);
		if (wic_deferred_wq)
			rcu_assign_pointer(wic_ops, ops);
		else
			ret = -ENOMEM;
	}
	mutex_unlock(&wic_lock);

	return ret;
}
EXPORT_SYMBOL_GPL(uvm_wic_register);

/*
 * Replays every GPU with replayable faults. Faults held when the callbacks went away get no
 * other replay of their own: a batch of held faults only issues none, so without this they
 * would wait for a replay issued for unrelated faults on their GPU.
 */
static void wic_replay_all(void)
{
	uvm_processor_mask_t *gpus;
	uvm_gpu_t *gpu;

	gpus = uvm_processor_mask_cache_alloc();
	if (!gpus) {
		pr_warn("wic: no memory to replay the GPUs after unregister\n");
		return;
	}
	uvm_processor_mask_zero(gpus);

	/* Like an ioctl: not while suspended (this waits for resume) nor after a fatal error. */
	uvm_down_read(&g_uvm_global.pm.lock);
	if (uvm_global_get_status() != NV_OK)
		goto out;

	/* A GPU in the retained set stays there while the global lock is held. */
	uvm_mutex_lock(&g_uvm_global.global_lock);
	for_each_gpu(gpu) {
		if (WIC_HAS_REPLAYABLE(gpu->parent))
			uvm_processor_mask_set(gpus, gpu->id);
	}
	uvm_global_gpu_retain(gpus);
	uvm_mutex_unlock(&g_uvm_global.global_lock);

	for_each_gpu_in_mask(gpu, gpus)
		wic_fault_buffer_flush(gpu);

	uvm_global_gpu_release(gpus);
out:
	uvm_up_read(&g_uvm_global.pm.lock);
	uvm_processor_mask_cache_free(gpus);
}

/**
 * uvm_wic_unregister() - remove the shim's callbacks
 * @ops: the callbacks passed to uvm_wic_register()
 *
 * Waits until no bottom half is still inside @ops->classify, then replays every GPU with
 * replayable faults, so that the faults the callbacks held fault again and, with no callback
 * left, are serviced as usual. Process context, no UVM lock held.
 */
void uvm_wic_unregister(const struct uvm_wic_ops *ops)
{
	bool removed = false;

	mutex_lock(&wic_lock);
	if (rcu_dereference_protected(wic_ops, lockdep_is_held(&wic_lock)) == ops) {
		RCU_INIT_POINTER(wic_ops, NULL);
		removed = true;
	}
	mutex_unlock(&wic_lock);

	WARN_ON_ONCE(!removed);
	synchronize_rcu();

	if (!removed)
		return;
	/* No run queues a deferred replay now (wic_defer_replay()): the replay below does it. */
	cancel_delayed_work_sync(&wic_deferred_work);
	destroy_workqueue(wic_deferred_wq);
	wic_deferred_wq = NULL;
	spin_lock(&wic_deferred_lock);
	memset(wic_deferred, 0, sizeof(wic_deferred));
	spin_unlock(&wic_deferred_lock);
	UVM_ENTRY_VOID(wic_replay_all());
}
EXPORT_SYMBOL_GPL(uvm_wic_unregister);

/*
 * VA spaces
 */

static struct wic_space_ref *wic_space_find(uvm_va_space_t *va_space)
{
	struct wic_space_ref *ref;

	lockdep_assert_held(&wic_lock);

	list_for_each_entry(ref, &wic_spaces, node) {
		if (ref->va_space == va_space)
			return ref;
	}

	return NULL;
}

/*
 * Frees @ref, the pm lock held for read: freeing the staging page writes the GPUs' page tables,
 * and dropping the last reference to a GPU removes it, neither while suspended. The file goes
 * last: it may destroy the VA space.
 */
static void wic_space_ref_free_locked(struct wic_space_ref *ref)
{
	uvm_mem_free(ref->stage);
	uvm_global_gpu_release(&ref->stage_gpus);
	fput(ref->file);
	mmdrop(ref->mm);
	uvm_kvfree(ref);
}

static void wic_space_ref_free_deferred(void *data)
{
	/* Blocks until uvm_resume() lets the pm lock go, as uvm_release_deferred() does. */
	uvm_down_read(&g_uvm_global.pm.lock);
	wic_space_ref_free_locked(data);
	uvm_up_read(&g_uvm_global.pm.lock);
}

/*
 * Frees @ref now, or, while a suspend holds the pm lock, on nvidia-uvm's deferred release queue
 * (flushed at resume), as uvm_release() defers a VA space's destruction: the caller (wicd
 * closing its device or detaching a space) must not sleep on the lock, or the freezer could not
 * freeze wicd and the suspend would fail.
 */
static void wic_space_ref_free(struct wic_space_ref *ref)
{
	if (uvm_down_read_trylock(&g_uvm_global.pm.lock)) {
		wic_space_ref_free_locked(ref);
		uvm_up_read(&g_uvm_global.pm.lock);
		return;
	}
	nv_kthread_q_item_init(&ref->deferred_free, wic_space_ref_free_deferred, ref);
	nv_kthread_q_schedule_q_item(&g_uvm_global.deferred_release_q, &ref->deferred_free);
}

static bool wic_space_gpus_supported(uvm_va_space_t *va_space)
{
	bool supported = true;
	uvm_gpu_t *gpu;

	uvm_va_space_down_read(va_space);
	for_each_va_space_gpu(gpu, va_space) {
		if (!wic_gpu_supported(gpu))
			supported = false;
	}
	uvm_va_space_up_read(va_space);

	return supported;
}

static struct uvm_wic_space *wic_space_get(struct file *uvm_file)
{
	uvm_va_space_t *va_space;
	struct wic_space_ref *ref, *new;
	struct mm_struct *mm;

	if (!uvm_file || !uvm_file_is_nvidia_uvm(uvm_file))
		return ERR_PTR(-EBADF);

	/* The caller's reference on uvm_file keeps the VA space alive meanwhile. */
	va_space = uvm_fd_va_space(uvm_file);
	if (!va_space)
		return ERR_PTR(-EBADF);

	/*
	 * Under Confidential Computing a completion cannot work: the staging page of its fills
	 * cannot be mapped on the GPU and CPU memory is not DMA-mapped for the GPU's copy
	 * engines, and the fault buffer's OVERFLOW bit is out of sight. Refused whole, before
	 * any fault could be held.
	 */
	if (g_uvm_global.conf_computing_enabled)
		return ERR_PTR(-EPERM);

	mutex_lock(&wic_lock);
	ref = wic_space_find(va_space);
	if (ref)
		ref->count++;
	mutex_unlock(&wic_lock);
	if (ref)
		return (struct uvm_wic_space *)va_space;

	/* Only a space whose mm was registered (UVM_MM_INITIALIZE) and is still alive. */
	mm = uvm_va_space_mm_retain(va_space);
	if (!mm)
		return ERR_PTR(-ENODEV);

	/*
	 * Not a space using a GPU that wic does not support. A GPU registered later is still
	 * never held (uvm_wic_classify_batch(), which reports its faults on wic pages) and
	 * refused by the helpers.
	 */
	if (!wic_space_gpus_supported(va_space)) {
		uvm_va_space_mm_release(va_space);
		return ERR_PTR(-EOPNOTSUPP);
	}

	new = uvm_kvmalloc_zero(sizeof(*new));
	if (!new) {
		uvm_va_space_mm_release(va_space);
		return ERR_PTR(-ENOMEM);
	}

	mmgrab(mm);
	uvm_va_space_mm_release(va_space);

	new->va_space = va_space;
	mutex_init(&new->stage_lock);
	new->file = get_file(uvm_file);
	new->mm = mm;
	new->count = 1;

	mutex_lock(&wic_lock);
	ref = wic_space_find(va_space);
	if (ref)
		ref->count++;
	else
		list_add(&new->node, &wic_spaces);
	mutex_unlock(&wic_lock);

	if (ref)
		wic_space_ref_free(new);

	return (struct uvm_wic_space *)va_space;
}

/**
 * uvm_wic_space_get() - the VA space behind an open UVM file
 * @uvm_file: a file of the application's, received by the daemon over a Unix socket
 *
 * Takes a reference that keeps the space alive until uvm_wic_space_put(): a reference on
 * @uvm_file (so the VA space is not destroyed) and a grab on its mm (so uvm_wic_space_mm()
 * stays valid). Getting the same space twice returns the same pointer, which is also the
 * &struct uvm_wic_fault.space of its faults. Process context.
 *
 * Return: the space, or an ERR_PTR: -EBADF when @uvm_file is not a UVM VA-space file,
 * -ENODEV when the space has no mm (it was not initialised by a process, or the process
 * is exiting), -EOPNOTSUPP when a GPU registered in the space cannot cancel faults by VA
 * (pre-Volta: Pascal), -EPERM under Confidential Computing, -ENOMEM.
 */
struct uvm_wic_space *uvm_wic_space_get(struct file *uvm_file)
{
	UVM_ENTRY_RET(wic_space_get(uvm_file));
}
EXPORT_SYMBOL_GPL(uvm_wic_space_get);

static void wic_space_put(struct uvm_wic_space *space)
{
	struct wic_space_ref *ref;

	if (IS_ERR_OR_NULL(space))
		return;

	mutex_lock(&wic_lock);
	ref = wic_space_find(wic_va_space(space));
	if (ref && --ref->count == 0)
		list_del(&ref->node);
	else
		ref = NULL;
	mutex_unlock(&wic_lock);

	if (ref)
		wic_space_ref_free(ref);
}

/**
 * uvm_wic_space_put() - drop a reference taken by uvm_wic_space_get()
 * @space: the space
 *
 * Process context. Dropping the last reference releases the VA-space file, which destroys the
 * VA space when the application has closed it too, and the space's staging page; while the
 * driver is suspended that is deferred until it resumes, never waited for.
 */
void uvm_wic_space_put(struct uvm_wic_space *space)
{
	/* An entry point: it takes UVM's tracked locks (pm, global) and writes page tables. */
	UVM_ENTRY_VOID(wic_space_put(space));
}
EXPORT_SYMBOL_GPL(uvm_wic_space_put);

/**
 * uvm_wic_space_mm() - the address space whose memory @space manages
 * @space: a space held by the caller
 *
 * Return: the mm, valid while the caller holds @space (it is grabbed, not necessarily alive:
 * use mmget_not_zero() before touching its pages); no reference is taken. NULL for a space
 * that is not held.
 */
struct mm_struct *uvm_wic_space_mm(struct uvm_wic_space *space)
{
	struct wic_space_ref *ref;
	struct mm_struct *mm = NULL;

	mutex_lock(&wic_lock);
	ref = wic_space_find(wic_va_space(space));
	if (ref)
		mm = ref->mm;
	mutex_unlock(&wic_lock);

	return mm;
}
EXPORT_SYMBOL_GPL(uvm_wic_space_mm);

/*
 * Entry-point helpers
 */

/*
 * A GPU that cannot cancel faults by VA (wic_gpu_supported()), as wic_pte_gpu() reports it:
 * nvidia-uvm returns NV_ERR_NOT_COMPATIBLE only when a GPU is registered in a VA space, never
 * from the block, push and tracker paths the helpers call, so it stays apart from their errors.
 */
#define WIC_ERR_GPU_UNSUPPORTED NV_ERR_NOT_COMPATIBLE

/* The errno of a status, as nvidia-uvm's ioctls return it (NV_ERR_PID_NOT_FOUND: -ESRCH). */
static int wic_errno(NV_STATUS status)
{
	return status == NV_OK ? 0 : -nv_status_to_errno(status);
}

/*
 * The errno of a page-table operation's status (wic_pte()), and of the wait for its PTE writes:
 * the statuses it chooses for what the shim must tell apart get their own errno, the others
 * convert as wic_errno() converts them.
 */
static int wic_pte_errno(NV_STATUS status)
{
	switch (status) {
	case NV_ERR_INVALID_DEVICE:
		return -ENODEV;
	case NV_ERR_INVALID_STATE:
		return -ENODATA;
	case NV_ERR_INVALID_OPERATION:
		return -EXDEV;
	case WIC_ERR_GPU_UNSUPPORTED:
		return -EOPNOTSUPP;
	default:
		return wic_errno(status);
	}
}

/* Like an ioctl: refuse while nvidia-uvm is suspended or after a global fatal error. */
static int wic_enter(void)
{
	NV_STATUS status;

	if (!uvm_down_read_trylock(&g_uvm_global.pm.lock))
		return -EAGAIN;

	status = uvm_global_get_status();
	if (status != NV_OK) {
		uvm_up_read(&g_uvm_global.pm.lock);
		return wic_errno(status);
	}

	return 0;
}

static void wic_exit(void)
{
	uvm_up_read(&g_uvm_global.pm.lock);
}

static bool wic_range_valid(u64 va, u64 len)
{
	return len != 0 && PAGE_ALIGNED(va) && PAGE_ALIGNED(len) && va + len > va;
}

static bool wic_gpu_id_valid(u32 gpu_id)
{
	return gpu_id >= UVM_ID_GPU0_VALUE && gpu_id < UVM_ID_MAX_PROCESSORS;
}

/*
 * Contexts
 *
 * Every fill (wic_fill()) and page-table operation (wic_pte()) runs inside a context: the
 * space's mm retained and its mmap_lock held for read, then the VA space lock for read (the
 * fault path's order), one block context, and, when a fill needs it, the space's staging page
 * (struct wic_space_ref), taken before those locks. The helpers run one operation in a
 * context; uvm_wic_complete() runs many.
 */

/**
 * struct wic_ctx - the locks and resources shared by the operations of one helper call
 * @va_space: the space
 * @mm: its mm, retained, mmap_lock held for read
 * @block_context: scratch for the VA block calls
 * @ref: when the call fills: the space's reference, its stage_lock held and its staging page
 *	mapped on every registered GPU; else NULL
 * @stage: @ref's staging page, or NULL
 * @tracker: the PTE writes and TLB invalidates of every page-table operation, waited for once,
 *	by wic_end()
 */
struct wic_ctx {
	uvm_va_space_t *va_space;
	struct mm_struct *mm;
	uvm_va_block_context_t *block_context;
	struct wic_space_ref *ref;
	uvm_mem_t *stage;
	uvm_tracker_t tracker;
};

/* Frees what wic_begin() allocated and releases what it took; no lock but stage_lock held. */
static void wic_ctx_free(struct wic_ctx *ctx)
{
	uvm_va_block_context_free(ctx->block_context);
	if (ctx->mm)
		uvm_va_space_mm_release(ctx->va_space);
	if (ctx->ref)
		mutex_unlock(&ctx->ref->stage_lock);
	uvm_tracker_deinit(&ctx->tracker);
}

/*
 * Maps the space's staging page on every registered GPU where it is not mapped yet. Called
 * with stage_lock, mmap_lock and the VA space lock held.
 */
static NV_STATUS wic_stage_map(struct wic_space_ref *ref)
{
	NV_STATUS status;
	uvm_gpu_t *gpu;

	/*
	 * The staging page is used by a GPU only when the page written, or the page copied, is
	 * in its memory: that GPU's CE reads or writes it.
	 */
	for_each_gpu_in_mask(gpu, &ref->va_space->registered_gpus) {
		/*
		 * Retained before the map, once: a map that fails halfway can leave the page
		 * mapped in the GPU's physical space, which the free unmaps.
		 */
		if (!uvm_processor_mask_test_and_set(&ref->stage_gpus, gpu->id))
			uvm_gpu_retain(gpu);

		/* Confidential computing: the staging page cannot be mapped on the GPU. */
		if (g_uvm_global.conf_computing_enabled)
			continue;

		/* Done at once where the page is mapped; tried again after a failed map. */
		status = uvm_mem_map_gpu_kernel(ref->stage, gpu);
		if (status != NV_OK)
			return status;
	}

	return NV_OK;
}

/*
 * Sets up @ctx: with @stage, takes the space's stage_lock; retains the mm, allocates the
 * space's staging page (at its first fill) and the block context before taking any other lock,
 * then takes mmap_lock and the VA space lock for read and, with @stage, maps the staging page
 * on the registered GPUs where it is not mapped yet (wic_stage_map()). On success the
 * caller runs its operations and calls wic_end(); on failure nothing is held.
 * NV_ERR_PID_NOT_FOUND when the process is gone.
 */
static NV_STATUS wic_begin(struct wic_ctx *ctx, struct uvm_wic_space *space, bool stage)
{
	uvm_va_space_t *va_space = wic_va_space(space);
	NV_STATUS status = NV_OK;

	*ctx = (struct wic_ctx){ .va_space = va_space };
	uvm_tracker_init(&ctx->tracker);

	if (stage) {
		/* The caller's reference keeps the entry alive until it returns. */
		mutex_lock(&wic_lock);
		ctx->ref = wic_space_find(va_space);
		mutex_unlock(&wic_lock);
		if (!ctx->ref) {
			status = NV_ERR_INVALID_ARGUMENT;
			goto fail;
		}
		mutex_lock(&ctx->ref->stage_lock);
	}

	ctx->mm = uvm_va_space_mm_retain(va_space);
	if (!ctx->mm) {
		status = NV_ERR_PID_NOT_FOUND;
		goto fail;
	}

	/* Charged to the process's memory cgroup, as the tools ioctl charges its page. */
	if (stage && !ctx->ref->stage) {
		status = uvm_mem_alloc_sysmem_and_map_cpu_kernel(PAGE_SIZE, ctx->mm,
								 &ctx->ref->stage);
		if (status != NV_OK)
			goto fail;
	}

	ctx->block_context = uvm_va_block_context_alloc(ctx->mm);
	if (!ctx->block_context) {
		status = NV_ERR_NO_MEMORY;
		goto fail;
	}

	/* mmap_lock before the VA space lock, as in the fault path. */
	uvm_down_read_mmap_lock(ctx->mm);
	uvm_va_space_down_read(va_space);

	if (!stage)
		return NV_OK;

	status = wic_stage_map(ctx->ref);
	if (status == NV_OK) {
		ctx->stage = ctx->ref->stage;
		return NV_OK;
	}

	uvm_va_space_up_read(va_space);
	uvm_up_read_mmap_lock(ctx->mm);
fail:
	wic_ctx_free(ctx);
	return status;
}

/*
 * Ends @ctx: waits once for the PTE writes and TLB invalidates of all its page-table operations,
 * unlocks, checks the GPUs the staging page is mapped on for ECC errors (as the tools
 * READ/WRITE_PROCESS_MEMORY ioctl does, outside the locks: it calls into RM), and frees.
 * Returns the first error of the wait and the check.
 */
static NV_STATUS wic_end(struct wic_ctx *ctx)
{
	NV_STATUS status;

	/* Wait for the PTE writes and TLB invalidates while the GPUs are surely registered. */
	status = uvm_tracker_wait(&ctx->tracker);

	uvm_va_space_up_read(ctx->va_space);
	uvm_up_read_mmap_lock(ctx->mm);

	/* Even on GPUs no longer registered in the VA space; stage_lock keeps the mask still. */
	if (status == NV_OK && ctx->ref)
		status = uvm_global_gpu_check_ecc_error(&ctx->ref->stage_gpus);

	wic_ctx_free(ctx);

	return status;
}

/*
 * Writes and copies
 */

/* Two ranges of @len bytes, at least one, that neither wrap nor overlap. */
static bool wic_copy_valid(u64 va, u64 src_va, u64 len)
{
	return len != 0 && va + len > va && src_va + len > src_va &&
	       (va + len <= src_va || src_va + len <= va);
}

/*
 * Reads [@src_va, @src_va + @size), within one page, into the start of @stage from where the
 * bytes are resident. uvm_va_block_read_to_cpu() allocates nothing (no allocation-retry), so
 * the plain block lock is taken, and dropped before the destination's is: UVM's lock order has
 * a single VA_BLOCK level, two block locks are never held at once.
 */
static NV_STATUS wic_read_to_stage(uvm_va_space_t *va_space,
				   uvm_va_block_context_t *block_context,
				   u64 src_va, u64 size, uvm_mem_t *stage)
{
	uvm_va_block_t *va_block;
	NV_STATUS status;

	status = uvm_va_block_find_create_managed(va_space, src_va, &va_block);
	if (status != NV_OK)
		return status;

	uvm_mutex_lock(&va_block->lock);
	status = uvm_va_block_read_to_cpu(va_block, block_context, stage, src_va, size);
	uvm_mutex_unlock(&va_block->lock);

	return status;
}

/*
 * Writes [@va, @va + @len) from kernel memory at @src or, when @src is NULL, copies it from
 * managed memory at @src_va (the callers checked the ranges), one chunk at a time through the
 * context's staging page: a chunk never crosses a page of either range nor a VA block.
 *
 * uvm_va_block_write_from_cpu() is the path of the UVM tools WRITE_PROCESS_MEMORY ioctl, made
 * for writing another process's managed memory: under the va_block lock it makes the page
 * resident (on the CPU when it is resident nowhere yet, zero-filled first), waits for pending
 * copies and memcpy()s into the CPU page through kmap(), or copies with a CE through the
 * staging buffer when the page lives in GPU memory. access_remote_vm() was not used: it would
 * go through get_user_pages() and the UVM CPU fault handler of the application's VMA from the
 * daemon's context, creating CPU mappings in the application and possibly migrating or
 * unmapping the page on GPUs as a side effect. Its wait for the block's tracker also orders the
 * write after PTE work wic_pte() left on the block (a page unmapped earlier in the context is
 * written only once its TLB invalidate is done).
 *
 * A copy reads the source with uvm_va_block_read_to_cpu(), the path of READ_PROCESS_MEMORY,
 * which changes neither residency nor mappings (a GPU producer keeps its own). It reads the
 * copy closest to the CPU: from CPU memory (a read-duplicated CPU copy included) by memcpy()
 * once the block's tracker is done; from GPU memory by a CE memcopy pushed on that GPU's
 * GPU_TO_CPU channel into the staging page's GPU kernel mapping (under Confidential Computing
 * the CE encrypts into a bounce buffer and the CPU decrypts into the staging page). The push
 * acquires the block's tracker, so it runs after the migrations and PTE updates UVM has
 * pending on the block, and it is waited for before the chunk is written. The tracker holds
 * UVM's own work only, not the producer's kernel: the producer's stores are seen because it
 * fences system-wide (__threadfence_system()) before it signals, and the copy runs after the
 * signal, so the bytes read are those it left before signalling (it must not write them
 * again until the copy has returned). A source page resident nowhere reads as zeros.
 */
static NV_STATUS wic_fill(struct wic_ctx *ctx, u64 va, const void *src, u64 src_va, u64 len)
{
	uvm_va_space_t *va_space = ctx->va_space;
	uvm_mem_t *stage = ctx->stage;
	NV_STATUS status = NV_OK;
	u64 done = 0;

	UVM_ASSERT(stage);

	while (done < len) {
		u64 addr = va + done;
		uvm_va_block_t *va_block;
		u64 size;

		status = uvm_va_block_find_create_managed(va_space, addr, &va_block);
		if (status != NV_OK)
			break;

		size = min_t(u64, len - done, PAGE_SIZE - offset_in_page(addr));
		size = min_t(u64, size, va_block->end - addr + 1);
		if (src) {
			memcpy(uvm_mem_get_cpu_addr_kernel(stage), (const u8 *)src + done, size);
		} else {
			size = min_t(u64, size, PAGE_SIZE - offset_in_page(src_va + done));
			status = wic_read_to_stage(va_space, ctx->block_context, src_va + done,
						   size, stage);
			if (status != NV_OK)
				break;
		}

		/* On allocation-retry the chunk is written again from the unchanged stage. */
		status = UVM_VA_BLOCK_LOCK_RETRY(va_block, NULL,
						 uvm_va_block_write_from_cpu(va_block,
									     ctx->block_context,
									     addr, stage, size));
		if (status != NV_OK)
			break;

		done += size;
	}

	return status;
}

/*
 * Writes an 8-byte word at the start of each of the @pages pages at @va, one chunk each: the
 * first word at @words on every page (a marker), or with @per_page word i of @words on page i
 * (the heads of a run its producer wrote in place; the rest of each page is left as it is).
 */
static NV_STATUS wic_fill_words(struct wic_ctx *ctx, u64 va, u32 pages, const void *words,
				bool per_page)
{
	NV_STATUS status = NV_OK;
	u32 i;

	for (i = 0; status == NV_OK && i < pages; i++)
		status = wic_fill(ctx, va + (u64)i * PAGE_SIZE,
				  (const u8 *)words + (per_page ? (u64)i * sizeof(u64) : 0), 0,
				  sizeof(u64));

	return status;
}

/*
 * Managed memory
 */

/* Whether managed VA ranges of @va_space cover [va, va + len) without a gap. */
static bool wic_managed_covered(uvm_va_space_t *va_space, u64 va, u64 len)
{
#ifdef uvm_for_each_va_range_managed_in_contig	/* 565+: uvm_va_range_managed_t is a range */
	uvm_va_range_managed_t *managed_range;
#else
	uvm_va_range_t *va_range;
#endif
	u64 end = va + len - 1;
	bool covered = false;

	uvm_va_space_down_read(va_space);
#ifdef uvm_for_each_va_range_managed_in_contig
	uvm_for_each_va_range_managed_in_contig(managed_range, va_space, va, end) {
		if (managed_range->va_range.node.end >= end) {
			covered = true;
			break;
		}
	}
#else
	uvm_for_each_va_range_in_contig(va_range, va_space, va, end) {
		if (va_range->type != UVM_VA_RANGE_TYPE_MANAGED)
			break;
		if (va_range->node.end >= end) {
			covered = true;
			break;
		}
	}
#endif
	uvm_va_space_up_read(va_space);

	return covered;
}

static int wic_range_managed_entry(struct uvm_wic_space *space, u64 va, u64 len)
{
	bool covered;
	int ret;

	if (!wic_range_valid(va, len))
		return -EINVAL;

	ret = wic_enter();
	if (ret)
		return ret;

	covered = wic_managed_covered(wic_va_space(space), va, len);
	wic_exit();

	return covered ? 0 : -EMEDIUMTYPE;
}

/**
 * uvm_wic_range_managed() - whether a range is managed memory of a space
 * @space: the space
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Process context only, no UVM lock held. Every other helper works on managed memory only
 * (uvm_va_block_find_create_managed()): a fault on any other page of the process (HMM:
 * malloc, mmap; semaphore pools, external or device allocations) could be held but never
 * completed. The shim asks this before it registers a range.
 *
 * Return: 0 when managed VA ranges (cudaMallocManaged) of @space cover [@va, @va + @len)
 * without a gap; -EMEDIUMTYPE when they do not; -EINVAL for an unaligned, empty or wrapping
 * range; -EAGAIN while the driver is suspended.
 */
int uvm_wic_range_managed(struct uvm_wic_space *space, u64 va, u64 len)
{
	UVM_ENTRY_RET(wic_range_managed_entry(space, va, len));
}
EXPORT_SYMBOL_GPL(uvm_wic_range_managed);

/*
 * GPU page-table operations
 */

enum wic_pte_op {
	WIC_MAP_READ_ONLY,
	WIC_MAP_READ_WRITE,
	WIC_UNMAP,
	WIC_REVOKE_WRITE,
};

/*
 * Makes the pages of @region that are resident nowhere resident on the CPU, zero-filled, as
 * nvidia-uvm populates an untouched page at its first access: the write path
 * (uvm_va_block_write_from_cpu()) populates such a page before it writes, and here it writes
 * the zeros of @stage's first word. A producer's PAT page its kernel never touched is such a
 * page: it could not be mapped, and its hold would never end.
 */
static NV_STATUS wic_populate_locked(uvm_va_block_t *va_block,
				     uvm_va_block_context_t *block_context,
				     uvm_gpu_t *gpu, uvm_va_block_region_t region, uvm_mem_t *stage)
{
	uvm_page_index_t page_index;
	NV_STATUS status;

	for_each_va_block_page_in_region(page_index, region) {
		uvm_processor_id_t id;

		id = uvm_va_block_page_get_closest_resident(va_block, block_context, page_index,
							    gpu->id);
		if (!UVM_ID_IS_INVALID(id))
			continue;
		memset(uvm_mem_get_cpu_addr_kernel(stage), 0, sizeof(u64));
		status = uvm_va_block_write_from_cpu(va_block, block_context,
						     uvm_va_block_cpu_page_address(va_block,
										      page_index),
						     stage, sizeof(u64));
		if (status != NV_OK)
			return status;
	}

	return NV_OK;
}

static NV_STATUS wic_pte_op_locked(uvm_va_block_t *va_block,
				   uvm_va_block_context_t *block_context,
				   uvm_gpu_t *gpu, uvm_va_block_region_t region,
				   enum wic_pte_op op, uvm_mem_t *stage,
				   uvm_tracker_t *out_tracker)
{
	uvm_tracker_t local_tracker = UVM_TRACKER_INIT();
	uvm_page_index_t page_index;
	NV_STATUS tracker_status;
	NV_STATUS status;
	uvm_prot_t prot;

	switch (op) {
	case WIC_MAP_READ_ONLY:
	case WIC_MAP_READ_WRITE:
		/*
		 * A writable mapping of a read-duplicated page would write one copy only, and
		 * uvm_va_block_map() silently skips pages resident nowhere, which would leave the
		 * warp faulting (and held) forever: refuse both (NV_ERR_INVALID_OPERATION is
		 * turned into -EXDEV, NV_ERR_INVALID_STATE into -ENODATA, by wic_pte_errno()),
		 * unless a writable map (a PAT page) can populate them first.
		 */
		if (op == WIC_MAP_READ_WRITE &&
		    !uvm_page_mask_region_empty(&va_block->read_duplicated_pages, region))
			return NV_ERR_INVALID_OPERATION;

		if (op == WIC_MAP_READ_WRITE && stage) {
			status = wic_populate_locked(va_block, block_context, gpu, region, stage);
			if (status != NV_OK)
				return status;
		}

		for_each_va_block_page_in_region(page_index, region) {
			uvm_processor_id_t id;

			id = uvm_va_block_page_get_closest_resident(va_block, block_context,
								    page_index, gpu->id);
			if (UVM_ID_IS_INVALID(id))
				return NV_ERR_INVALID_STATE;
		}

		prot = op == WIC_MAP_READ_WRITE ? UVM_PROT_READ_WRITE : UVM_PROT_READ_ONLY;
		status = uvm_va_block_map(va_block, block_context, gpu->id, region, NULL, prot,
					  UvmEventMapRemoteCausePolicy, &local_tracker);
		if (status != NV_OK)
			break;

		/*
		 * uvm_va_block_map() also returns NV_OK for pages it did not map: resident only
		 * on processors the GPU cannot access (a GPU without peer access), or kept from
		 * a remote mapping by policy (read duplication, preferred location on this GPU,
		 * UVM-Lite). Released, their faults would come back at once, forever. The
		 * block's mapping masks are updated when the PTE writes are pushed, under the
		 * block lock: check each page as the fault path does.
		 */
		for_each_va_block_page_in_region(page_index, region) {
			if (!uvm_va_block_page_is_gpu_authorized(va_block, page_index, gpu->id,
								 prot)) {
				status = NV_ERR_INVALID_OPERATION;
				break;
			}
		}
		break;
	case WIC_UNMAP:
		status = uvm_va_block_unmap(va_block, block_context, gpu->id, region, NULL,
					    &local_tracker);
		break;
	case WIC_REVOKE_WRITE:
	default:
		status = uvm_va_block_revoke_prot(va_block, block_context, gpu->id, region, NULL,
						  UVM_PROT_READ_WRITE, &local_tracker);
		break;
	}

	/*
	 * Later operations on the block must wait for these PTE writes (the map, unmap and
	 * revoke of the block acquire its tracker, and a write waits for it).
	 */
	tracker_status = uvm_tracker_add_tracker_safe(&va_block->tracker, &local_tracker);
	if (status == NV_OK)
		status = tracker_status;

	tracker_status = uvm_tracker_add_tracker_safe(out_tracker, &local_tracker);
	if (status == NV_OK)
		status = tracker_status;

	uvm_tracker_deinit(&local_tracker);

	return status;
}

/*
 * The GPU @gpu_id, when it is registered in the context's space with a GPU VA space and wic
 * supports it. A GPU registered in the VA space stays retained while its lock is held.
 */
static NV_STATUS wic_pte_gpu(struct wic_ctx *ctx, u32 gpu_id, uvm_gpu_t **gpu_out)
{
	uvm_va_space_t *va_space = ctx->va_space;
	uvm_gpu_id_t id;
	uvm_gpu_t *gpu;

	if (!wic_gpu_id_valid(gpu_id))
		return NV_ERR_INVALID_DEVICE;

	id = uvm_gpu_id_from_value(gpu_id);
	if (!uvm_processor_mask_test(&va_space->registered_gpus, id))
		return NV_ERR_INVALID_DEVICE;

	gpu = uvm_gpu_get(id);
	if (!gpu || !uvm_gpu_va_space_get(va_space, gpu))
		return NV_ERR_INVALID_DEVICE;
	if (!wic_gpu_supported(gpu))
		return WIC_ERR_GPU_UNSUPPORTED;

	*gpu_out = gpu;
	return NV_OK;
}

/*
 * Runs @op on the pages [@va, @va + @len) of GPU @gpu_id, VA block by VA block (the range may
 * span blocks), adding the PTE writes and TLB invalidates to the context's tracker without
 * waiting for them: wic_end() waits once for those of every operation of the context.
 */
static NV_STATUS wic_pte(struct wic_ctx *ctx, u32 gpu_id, u64 va, u64 len, enum wic_pte_op op)
{
	u64 end = va + len - 1;
	NV_STATUS status;
	uvm_gpu_t *gpu;
	u64 addr;

	status = wic_pte_gpu(ctx, gpu_id, &gpu);
	if (status != NV_OK)
		return status;

	for (addr = va; addr <= end; ) {
		uvm_va_block_region_t region;
		uvm_va_block_t *va_block;
		u64 last;

		status = uvm_va_block_find_create_managed(ctx->va_space, addr, &va_block);
		if (status != NV_OK)
			break;

		last = min(end, va_block->end);
		region = uvm_va_block_region_from_start_end(va_block, addr, last);
		status = UVM_VA_BLOCK_LOCK_RETRY(va_block, NULL,
						 wic_pte_op_locked(va_block, ctx->block_context,
								   gpu, region, op, ctx->stage,
								   &ctx->tracker));
		if (status != NV_OK || last == end)
			break;

		addr = last + 1;
	}

	return status;
}

static int wic_pte_op_entry(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len,
			    enum wic_pte_op op)
{
	struct wic_ctx ctx;
	NV_STATUS status, end_status;
	int ret;

	if (!wic_range_valid(va, len))
		return -EINVAL;
	if (!wic_gpu_id_valid(gpu_id))
		return -ENODEV;

	ret = wic_enter();
	if (ret)
		return ret;

	/* A writable map (a PAT page) populates what is resident nowhere: it needs the stage. */
	status = wic_begin(&ctx, space, op == WIC_MAP_READ_WRITE);
	if (status == NV_OK) {
		status = wic_pte(&ctx, gpu_id, va, len, op);
		end_status = wic_end(&ctx);
		if (status == NV_OK)
			status = end_status;
	}
	wic_exit();

	return wic_pte_errno(status);
}

/**
 * uvm_wic_map() - map managed pages on a GPU, so that faults on them can be replayed
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 * @writable: map read-write (a producer's PAT page) rather than read-only
 *
 * Process context only, no UVM lock held; returns once the mapping is in place (PTE writes
 * complete). The pages must be resident somewhere (filled first by uvm_wic_complete());
 * they are mapped where they are resident, remotely when that is CPU memory. The range may
 * span VA blocks. Each page is checked once mapped: uvm_va_block_map() skips, without an
 * error, pages that it cannot map on this GPU.
 *
 * Return: 0 or a negative errno: -EINVAL for an unaligned or empty range, -ENODEV for a GPU
 * not registered in the space, -EOPNOTSUPP for a GPU that cannot cancel faults by VA
 * (pre-Volta: Pascal; wic never holds its faults), -ENODATA when a page is resident nowhere
 * (a read-only map: a writable one populates it, wic_populate_locked()), -EXDEV when a page
 * cannot be mapped on this GPU as asked (resident only on a GPU without peer access to it; read duplication, a preferred location on this GPU or UVM-Lite keeping
 * it from a remote mapping; a writable map of a read-duplicated page), -EFAULT for an address
 * outside managed memory, -ESRCH when the process is gone, -EAGAIN while the driver is
 * suspended. On an error, other pages of the range may be mapped.
 */
int uvm_wic_map(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len, bool writable)
{
	UVM_ENTRY_RET(wic_pte_op_entry(space, gpu_id, va, len,
				       writable ? WIC_MAP_READ_WRITE : WIC_MAP_READ_ONLY));
}
EXPORT_SYMBOL_GPL(uvm_wic_map);

/**
 * uvm_wic_revoke_write() - make a GPU's next write to managed pages fault again
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Process context only, no UVM lock held. Write and atomic permissions are revoked and the
 * TLB invalidate is waited for; reads keep working. The next write faults with fault type
 * WRITE (RO violation).
 *
 * Return: 0 or a negative errno, as for uvm_wic_map().
 */
int uvm_wic_revoke_write(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len)
{
	UVM_ENTRY_RET(wic_pte_op_entry(space, gpu_id, va, len, WIC_REVOKE_WRITE));
}
EXPORT_SYMBOL_GPL(uvm_wic_revoke_write);

/*
 * Completions
 */

/*
 * A wake-up's arguments: a page-aligned run and companion of @pages pages, at least one, that
 * neither wrap nor overlap (the companion is unmapped after the run is filled, and the run
 * mapped after that); data of at most the run's size, from kernel memory or from a source
 * range that neither wraps nor overlaps the run; heads, one 8-byte word per page, from kernel
 * memory. The GPU is checked by its operations, as the helpers do.
 */
static bool wic_completion_valid(const struct uvm_wic_completion *c)
{
	u64 len = (u64)c->pages * PAGE_SIZE;

	if (c->flags & ~UVM_WIC_COMPLETE_FLAGS)
		return false;
	if ((c->flags & UVM_WIC_COMPLETE_NO_FILL) && c->length)
		return false;
	if ((c->flags & UVM_WIC_COMPLETE_NO_MAP) && (c->flags & UVM_WIC_COMPLETE_WRITABLE))
		return false;
	if ((c->flags & UVM_WIC_COMPLETE_HEADS) &&
	    (!c->src || (c->flags & UVM_WIC_COMPLETE_NO_FILL) ||
	     c->length != (u64)c->pages * sizeof(u64)))
		return false;
	if (!wic_range_valid(c->va, len))
		return false;
	if (c->companion && (!wic_range_valid(c->companion, len) ||
			     (c->va < c->companion + len && c->companion < c->va + len)))
		return false;
	if (!c->length)
		return true;
	if (c->length > len)
		return false;

	return c->src || wic_copy_valid(c->va, c->src_va, c->length);
}

/* Whether @c, valid, writes into its run: it needs the staging page. */
static bool wic_completion_fills(const struct uvm_wic_completion *c)
{
	return !(c->flags & UVM_WIC_COMPLETE_NO_FILL);
}

/* Runs one wake-up's steps in @ctx, stopping at the first that fails; returns its errno. */
static int wic_complete_one(struct wic_ctx *ctx, struct uvm_wic_completion *c)
{
	u64 len = (u64)c->pages * PAGE_SIZE;
	NV_STATUS status = NV_OK;

	c->companion_unmapped = false;
	if (!wic_completion_valid(c))
		return -EINVAL;

	if (wic_completion_fills(c)) {
		if (c->flags & UVM_WIC_COMPLETE_HEADS)
			status = wic_fill_words(ctx, c->va, c->pages, c->src, true);
		else if (c->length)
			status = wic_fill(ctx, c->va, c->src, c->src_va, c->length);
		else
			status = wic_fill_words(ctx, c->va, c->pages, &c->marker, false);
		if (status != NV_OK)
			return wic_errno(status);
	}

	if (c->companion) {
		status = wic_pte(ctx, c->gpu_id, c->companion, len, WIC_UNMAP);
		if (status != NV_OK)
			return wic_pte_errno(status);
		c->companion_unmapped = true;
	}

	if (!(c->flags & UVM_WIC_COMPLETE_NO_MAP))
		status = wic_pte(ctx, c->gpu_id, c->va, len,
				 (c->flags & UVM_WIC_COMPLETE_WRITABLE) ? WIC_MAP_READ_WRITE :
									  WIC_MAP_READ_ONLY);

	return wic_pte_errno(status);
}

static int wic_complete(struct uvm_wic_space *space, struct uvm_wic_completion *completions,
			u32 count)
{
	bool valid = false, fills = false;
	struct wic_ctx ctx;
	NV_STATUS status;
	int ret;
	u32 i;

	if (!completions || count == 0)
		return -EINVAL;

	/*
	 * Every fill goes through the staging page, so it is needed as soon as one valid wake-up
	 * fills; when none is valid, nothing is taken.
	 */
	for (i = 0; i < count; i++) {
		if (!wic_completion_valid(&completions[i]))
			continue;
		valid = true;
		fills |= wic_completion_fills(&completions[i]) ||
			 (completions[i].flags & UVM_WIC_COMPLETE_WRITABLE);
	}
	if (!valid) {
		for (i = 0; i < count; i++)
			completions[i].result = -EINVAL;
		return 0;
	}

	ret = wic_enter();
	if (ret)
		return ret;

	status = wic_begin(&ctx, space, fills);
	if (status != NV_OK) {
		wic_exit();
		return wic_errno(status);
	}

	for (i = 0; i < count; i++)
		completions[i].result = wic_complete_one(&ctx, &completions[i]);

	/* The PTE writes and TLB invalidates of every wake-up, waited for once. */
	status = wic_end(&ctx);
	wic_exit();

	if (status != NV_OK) {
		ret = wic_pte_errno(status);
		for (i = 0; i < count; i++) {
			if (!completions[i].result)
				completions[i].result = ret;
		}
	}

	return 0;
}

/**
 * uvm_wic_complete() - complete wake-ups: each one's fill, the unmap of its companion and the
 *	map (read-only) of its run
 * @space: the space
 * @completions: the wake-ups, run in order
 * @count: how many, at least 1
 *
 * Why it exists: done step by step, a wake-up is three calls, and each takes the mm and VA
 * space locks, or waits for its own TLB invalidate (the unmap and the map). This runs every
 * wake-up under one acquisition of the locks (mm retained, mmap_lock and the VA space lock for
 * read), with one block context and the space's staging page, and waits once, at the end, for
 * the PTE writes and TLB invalidates of all the unmaps and maps.
 *
 * Each wake-up, in order: its fill (with @length not 0, the bytes at @src written, or with
 * @src NULL those at @src_va copied, into the run; with @length 0, the 8-byte @marker written
 * at the start of each page of the run; with UVM_WIC_COMPLETE_HEADS, word i of @src written at
 * the start of page i of the run, and no other byte: the application's host producer wrote the
 * rest of each page itself, and only completions write the heads, where markers go), the
 * unmap of @companion from @gpu_id, the map of the run on @gpu_id (read-only, or read-write
 * with UVM_WIC_COMPLETE_WRITABLE), each page checked once mapped. UVM_WIC_COMPLETE_NO_FILL
 * leaves out the fill, UVM_WIC_COMPLETE_NO_MAP the map, a @companion of 0 the unmap: the shim's
 * sweeps of held faults (markers on every page, then maps) run as a few calls instead of one
 * per page and step. It stops at its first failing step (a run whose fill failed is never
 * mapped), its @result gets the errno, and the next wake-up goes on. Steps of later wake-ups
 * are ordered after earlier ones' PTE writes on the same VA block (the block's tracker), so a
 * run unmapped as a companion earlier in the call is written only once the GPU can no longer
 * reach it. Process context only, no UVM lock held.
 *
 * @result of a wake-up: -EINVAL for unaligned, empty, wrapping or overlapping runs, data
 * longer than the run, a source range that wraps or overlaps the run, or heads without @src,
 * with UVM_WIC_COMPLETE_NO_FILL or with a @length other than 8 x @pages; otherwise 0 or the
 * errno of the step that failed: the fill's (wic_fill(): -EFAULT outside managed memory,
 * -ENOMEM...), the unmap's and the map's as uvm_wic_map() returns it (-ENODEV, -EOPNOTSUPP,
 * -ENODATA, -EXDEV, -EFAULT...). When the final wait, or the
 * ECC check of the GPUs the staging page was mapped on, fails, each wake-up that had
 * succeeded gets that error. On return every mapping and unmapping of a wake-up whose
 * @result is 0 is in place.
 *
 * Return: 0 (then every @result is set), or a negative errno when nothing could run and no
 * @result was set: -EINVAL for no @completions or a @count of 0, -ESRCH when the process is
 * gone, -EAGAIN while the driver is suspended, -ENOMEM.
 */
int uvm_wic_complete(struct uvm_wic_space *space, struct uvm_wic_completion *completions,
		     u32 count)
{
	UVM_ENTRY_RET(wic_complete(space, completions, count));
}
EXPORT_SYMBOL_GPL(uvm_wic_complete);

/*
 * Replay
 */

static int wic_replay(u32 gpu_id)
{
	uvm_gpu_t *gpu;
	int ret;

	if (!wic_gpu_id_valid(gpu_id))
		return -ENODEV;

	ret = wic_enter();
	if (ret)
		return ret;

	/* A GPU in the global table is retained by someone; the global lock keeps it there. */
	uvm_mutex_lock(&g_uvm_global.global_lock);
	gpu = uvm_gpu_get(uvm_gpu_id_from_value(gpu_id));
	if (gpu)
		uvm_gpu_retain(gpu);
	uvm_mutex_unlock(&g_uvm_global.global_lock);

	if (!gpu) {
		wic_exit();
		return -ENODEV;
	}

	/*
	 * Takes the ISR lock (waits for a running bottom half), discards the entries still in
	 * the hardware buffer (their accesses are replayed too) and pushes a REPLAY_START
	 * without waiting for it: callers wait for their PTE writes first (uvm_wic_map()).
	 */
	if (!WIC_HAS_REPLAYABLE(gpu->parent))
		ret = -ENOSYS;
	else if (!wic_gpu_supported(gpu))
		ret = -EOPNOTSUPP;
	else
		ret = wic_errno(wic_fault_buffer_flush(gpu));

	uvm_gpu_release(gpu);
	wic_exit();

	return ret;
}

/**
 * uvm_wic_replay() - replay a GPU's stalled faults
 * @gpu_id: the GPU
 *
 * Flushes the GPU's fault buffer and issues a replay: every stalled access retries; those
 * whose pages are now mapped resume, the others fault again. Process context only, no UVM
 * lock held.
 *
 * Return: 0 or a negative errno (-ENODEV for an unknown GPU, -ENOSYS for a GPU without
 * replayable faults, -EOPNOTSUPP for a GPU that cannot cancel faults by VA (pre-Volta:
 * Pascal; wic never holds its faults), -EAGAIN while the driver is suspended).
 */
int uvm_wic_replay(u32 gpu_id)
{
	UVM_ENTRY_RET(wic_replay(gpu_id));
}
EXPORT_SYMBOL_GPL(uvm_wic_replay);
