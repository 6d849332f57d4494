// SPDX-License-Identifier: GPL-2.0
/*
 * wic_fakegpu.c - a stand-in for nvidia-uvm with the wic hook, for tests without a GPU.
 *
 * The module exports every symbol of uvm_wic.h, so that wic_shim.ko loads and runs unchanged,
 * and creates /dev/wic_fakegpu (see wic_fakegpu.h). Each open file of the device is one fake
 * UVM VA space bound to the opener's mm; uvm_wic_space_get() accepts exactly these files. The
 * fake GPUs keep, per space and per GPU, the state of each 4 KiB page (mapped, writable) in an
 * xarray; wic_fill_write() writes into the application's real memory. Every call and every
 * fault serviced without wic_shim is appended to a global event log that test drivers read.
 *
 * Contexts: the uvm_wic_* entry points other than the classify callback are process context
 * only, as in nvidia-uvm; they say so with might_sleep(). The classify callback is called with
 * a per-GPU spinlock held (bottom halves disabled) and inside an RCU read-side section, like
 * the fault bottom half of nvidia-uvm with its ISR lock, so that a callback that sleeps is
 * reported by the scheduler.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/build_bug.h>
#include <linux/delay.h>
#include <linux/err.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/highmem.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/platform_device.h>
#include <linux/pm.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/xarray.h>
#include <asm/unaligned.h>

#include "uvm_wic.h"
#include "wic_fakegpu.h"

#define WIC_LOG_MASK (WIC_FAKEGPU_LOG_EVENTS - 1)
/* Events copied to user space per step of WIC_FAKEGPU_IOC_EVENTS. */
#define WIC_LOG_CHUNK 256
/* ACCESS_TYPE values of a prefetch (dev_fault.h NV_PFAULT_ACCESS_TYPE_{VIRT,PHYS}_PREFETCH). */
#define WIC_HW_ACCESS_VIRT_PREFETCH 0x3
#define WIC_HW_ACCESS_PHYS_PREFETCH 0xb
/* The other ACCESS_TYPE values that need a writable page (NV_PFAULT_ACCESS_TYPE_*). */
#define WIC_HW_ACCESS_VIRT_WRITE 0x1
#define WIC_HW_ACCESS_VIRT_ATOMIC_STRONG 0x2
#define WIC_HW_ACCESS_VIRT_ATOMIC_WEAK 0x4
#define WIC_HW_ACCESS_PHYS_WRITE 0x9
#define WIC_HW_ACCESS_PHYS_ATOMIC_STRONG 0xa
#define WIC_HW_ACCESS_PHYS_ATOMIC_WEAK 0xc
/* Bits [31:12] of DWORD 2 of a fault entry: ADDR_LO, in place. */
#define WIC_FAULT_ADDR_LO_MASK 0xfffff000U

static bool strict_write = true;
module_param(strict_write, bool, 0644);
/*
 * Confidential Computing: nvidia-uvm sees GSP-RM's shadow of the fault buffer, not the
 * hardware's registers, so its latch never sees the OVERFLOW bit.
 */
static bool conf_computing;
module_param(conf_computing, bool, 0644);
MODULE_PARM_DESC(conf_computing, "Model Confidential Computing: the OVERFLOW bit is never seen");
MODULE_PARM_DESC(strict_write,
		 "a completion's fill of pages mapped on a fake GPU fails with -EBUSY (default: on)");

/**
 * struct uvm_wic_space - one fake UVM VA space: the state of one open /dev/wic_fakegpu file
 * @file: the file; the references that uvm_wic_space_get() hands out are references to it
 * @mm: the opener's address space (mmgrab()bed), or NULL when a kernel thread opened the file
 * @lock: serialises changes to @pages and @nr_pages (process context only)
 * @stage_lock: as the hook's (uvm_wic.c), held for the whole of a call that fills
 *	(uvm_wic_complete() with a fill or a writable map) or maps writable: such calls of one
 *	space run one after another, whoever makes them, those of different spaces at once
 * @pages: per fake GPU (GPU id - 1), page index (va >> 12) to xa_mk_value(WIC_FAKEGPU_PAGE_*
 *	flags); only mapped pages have an entry
 * @nr_pages: entries in all of @pages
 * @fail_writes: wic_fill_write() calls still to fail or stall (WIC_FAKEGPU_IOC_FAIL)
 * @fail_maps: uvm_wic_map() calls still to fail or stall
 * @fail_error: the errno they fail with, 0 for none
 * @fail_flags: WIC_FAKEGPU_FAIL_* bits
 * @fail_gen: counts WIC_FAKEGPU_IOC_FAIL and WIC_FAKEGPU_IOC_RESET calls; a stalled call goes on
 *	once it changed
 * @fail_wait: stalled calls wait here
 * @managed: the ranges declared managed (WIC_FAKEGPU_IOC_MANAGE), [start, end)
 * @nr_managed: entries in @managed
 * @remote: the pages resident out of a GPU's reach, or nowhere (@gpu_id WIC_FAKEGPU_GPU_NONE)
 *	(WIC_FAKEGPU_IOC_RESIDE)
 * @nr_remote: entries in @remote
 * @gpu_pages: page index (va >> 12) to the struct wic_gpu_page of a page resident in a fake
 *	GPU's memory (WIC_FAKEGPU_IOC_GPU_STORE)
 * @nr_gpu_pages: entries in @gpu_pages
 * @pre_volta: the pre-Volta GPUs registered in the space, by GPU id (WIC_FAKEGPU_IOC_PRE_VOLTA)
 * @exited: the space's process went away (WIC_FAKEGPU_IOC_EXIT): the helpers fail with ESRCH,
 *	as the hook's do once nvidia-uvm released the space's mm
 * @filled: bytes the fills of completions wrote into the space's runs, data, copies, markers
 *	and heads (WIC_FAKEGPU_IOC_FILLED); only grows
 *
 * @lock also protects the fail_* fields, @managed, @remote, @gpu_pages and their counts.
 */
struct uvm_wic_space {
	struct file *file;
	struct mm_struct *mm;
	struct mutex lock;	/* protects pages' contents, nr_pages and the fail_* fields */
	struct mutex stage_lock;
	struct xarray pages[WIC_FAKEGPU_NR_GPUS];
	unsigned long nr_pages;
	u32 fail_writes;
	u32 fail_maps;
	u32 fail_error;
	u32 fail_flags;
	u64 fail_gen;
	wait_queue_head_t fail_wait;
	struct {
		u64 start;
		u64 end;
	} managed[WIC_FAKEGPU_MAX_MANAGED];
	u32 nr_managed;
	struct {
		u64 page;
		u32 gpu_id;
	} remote[WIC_FAKEGPU_MAX_REMOTE];
	u32 nr_remote;
	struct xarray gpu_pages;
	u32 nr_gpu_pages;
	DECLARE_BITMAP(pre_volta, WIC_FAKEGPU_NR_GPUS + 1);
	bool exited;
	atomic64_t filled;
};

/* A page resident in a fake GPU's memory: the GPU and the page's bytes there. */
struct wic_gpu_page {
	u32 gpu_id;
	u8 bytes[WIC_FAKEGPU_PAGE_SIZE];
};

/* The callbacks wic_shim registered, if any. */
static const struct uvm_wic_ops __rcu *wic_ops;
static DEFINE_MUTEX(wic_ops_lock);

/* The fake ISR locks, one per GPU (GPU id - 1), held around classify. */
static spinlock_t wic_isr_lock[WIC_FAKEGPU_NR_GPUS];

/*
 * The GPUs on which classify held a fault since the callbacks were registered: the ones
 * uvm_wic_unregister() replays (nvidia-uvm replays every GPU; logging the others would only
 * add noise).
 */
static DECLARE_BITMAP(wic_held_gpus, WIC_FAKEGPU_NR_GPUS + 1);

/* Whether @gpu_id names a fake GPU: nvidia-uvm's ids, 1 to WIC_FAKEGPU_NR_GPUS (0 is the CPU). */
static bool wic_gpu_valid(u32 gpu_id)
{
	return gpu_id >= 1 && gpu_id <= WIC_FAKEGPU_NR_GPUS;
}

/*
 * The event log: a ring of WIC_FAKEGPU_LOG_EVENTS events. wic_log_head and wic_log_tail count
 * events logged and taken out; both only grow (until a reset). wic_log_lock protects them, the
 * ring and wic_log_overflow. wic_log_read_lock serialises readers (and resets) so that a reader
 * can copy events out before it removes them.
 */
static struct wic_fakegpu_event *wic_log;
static u64 wic_log_head;
static u64 wic_log_tail;
static u64 wic_log_overflow;
static DEFINE_SPINLOCK(wic_log_lock);
static DEFINE_MUTEX(wic_log_read_lock);
static DECLARE_WAIT_QUEUE_HEAD(wic_log_wait);

static void wic_log_event(u32 kind, u32 gpu_id, u64 va, u64 length, u64 data0)
{
	struct wic_fakegpu_event *ev;
	unsigned long flags;

	spin_lock_irqsave(&wic_log_lock, flags);
	if (wic_log_head - wic_log_tail >= WIC_FAKEGPU_LOG_EVENTS) {
		wic_log_overflow++;
	} else {
		ev = &wic_log[wic_log_head & WIC_LOG_MASK];
		ev->kind = kind;
		ev->gpu_id = gpu_id;
		ev->va = va;
		ev->length = length;
		ev->data0 = data0;
		ev->ns = ktime_get_ns();
		wic_log_head++;
	}
	spin_unlock_irqrestore(&wic_log_lock, flags);
	wake_up_interruptible(&wic_log_wait);
}

static bool wic_log_pending(void)
{
	bool pending;

	spin_lock_irq(&wic_log_lock);
	pending = wic_log_head != wic_log_tail;
	spin_unlock_irq(&wic_log_lock);
	return pending;
}

static void wic_log_reset(void)
{
	mutex_lock(&wic_log_read_lock);
	spin_lock_irq(&wic_log_lock);
	wic_log_head = 0;
	wic_log_tail = 0;
	wic_log_overflow = 0;
	spin_unlock_irq(&wic_log_lock);
	mutex_unlock(&wic_log_read_lock);
}

/* Check a range of whole pages on a GPU. */
static int wic_check_range(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len)
{
	if (!wic_gpu_valid(gpu_id))
		return -ENODEV;
	if (test_bit(gpu_id, space->pre_volta))
		return -EOPNOTSUPP;
	if (READ_ONCE(space->exited))
		return -ESRCH;
	if (!len || ((va | len) & (WIC_FAKEGPU_PAGE_SIZE - 1)))
		return -EINVAL;
	if (va + (len - 1) < va)
		return -EINVAL;
	return 0;
}

/*
 * Set the flags of pages first..last (page indices, inclusive) on a GPU: they become
 * (old & ~clear) | set, where a page with no entry has old 0. @set must include
 * WIC_FAKEGPU_PAGE_MAPPED. On an error the pages before the failing one keep their new flags.
 */
static int wic_pages_set(struct uvm_wic_space *space, u32 gpu_id, unsigned long first,
			 unsigned long last, unsigned long set, unsigned long clear)
{
	struct xarray *xa = &space->pages[gpu_id - 1];
	unsigned long index = first;
	int ret = 0;
	void *old;

	mutex_lock(&space->lock);
	for (;;) {
		unsigned long flags = set;

		old = xa_load(xa, index);
		if (old)
			flags |= xa_to_value(old) & ~clear;
		else if (space->nr_pages >= WIC_FAKEGPU_MAX_PAGES)
			ret = -ENOSPC;
		if (ret)
			break;
		old = xa_store(xa, index, xa_mk_value(flags), GFP_KERNEL);
		if (xa_is_err(old)) {
			ret = xa_err(old);
			break;
		}
		if (!old)
			space->nr_pages++;
		if (index == last)
			break;
		index++;
		cond_resched();
	}
	mutex_unlock(&space->lock);
	return ret;
}

/*
 * Clear flags of the mapped pages among first..last (inclusive) on a GPU; a page that is left
 * without WIC_FAKEGPU_PAGE_MAPPED loses its entry.
 */
static void wic_pages_clear(struct uvm_wic_space *space, u32 gpu_id, unsigned long first,
			    unsigned long last, unsigned long clear)
{
	struct xarray *xa = &space->pages[gpu_id - 1];
	unsigned long index;
	void *entry;

	mutex_lock(&space->lock);
	xa_for_each_range(xa, index, entry, first, last) {
		unsigned long flags = xa_to_value(entry) & ~clear;

		if (flags & WIC_FAKEGPU_PAGE_MAPPED) {
			/* Replacing an entry in place allocates nothing. */
			xa_store(xa, index, xa_mk_value(flags), GFP_KERNEL);
		} else {
			xa_erase(xa, index);
			space->nr_pages--;
		}
		cond_resched();
	}
	mutex_unlock(&space->lock);
}

/* Whether any page among first..last (inclusive) is mapped on any GPU. */
static bool wic_pages_mapped(struct uvm_wic_space *space, unsigned long first,
			     unsigned long last)
{
	u32 i;

	for (i = 0; i < WIC_FAKEGPU_NR_GPUS; i++) {
		unsigned long index = first;

		if (xa_find(&space->pages[i], &index, last, XA_PRESENT))
			return true;
	}
	return false;
}

/* How long a call stalled by WIC_FAKEGPU_FAIL_STALL waits at most. */
#define WIC_STALL_MAX (10 * HZ)

/*
 * Whether this call of a helper is one WIC_FAKEGPU_IOC_FAIL armed (@left is the space's count
 * for the helper): stalls it first when asked to, then returns the errno to fail with, or 0 to
 * go on as usual.
 */
static int wic_fail_take(struct uvm_wic_space *space, u32 *left, u32 gpu_id, u64 va, u64 len)
{
	u32 error = 0, flags = 0;
	u64 gen;

	mutex_lock(&space->lock);
	if (*left) {
		(*left)--;
		error = space->fail_error;
		flags = space->fail_flags;
	}
	gen = space->fail_gen;
	mutex_unlock(&space->lock);
	if (flags & WIC_FAKEGPU_FAIL_STALL) {
		wic_log_event(WIC_FAKEGPU_EVENT_STALLED, gpu_id, va, len, 0);
		wait_event_killable_timeout(space->fail_wait, READ_ONCE(space->fail_gen) != gen,
					    WIC_STALL_MAX);
	}
	return -(int)error;
}

/* Arms failures of this space's next helper calls and lets the stalled ones go on. */
static void wic_fail_arm(struct uvm_wic_space *space, const struct wic_fakegpu_fail *fail)
{
	mutex_lock(&space->lock);
	space->fail_writes = fail->writes;
	space->fail_maps = fail->maps;
	space->fail_error = fail->error;
	space->fail_flags = fail->flags;
	WRITE_ONCE(space->fail_gen, space->fail_gen + 1);
	mutex_unlock(&space->lock);
	wake_up_all(&space->fail_wait);
}

static long wic_ioctl_fail(struct uvm_wic_space *space, struct wic_fakegpu_fail __user *uarg)
{
	struct wic_fakegpu_fail args;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if ((args.flags & ~WIC_FAKEGPU_FAIL_STALL) || args.error > WIC_FAKEGPU_MAX_ERRNO)
		return -EINVAL;
	if (!args.error && !args.flags && (args.writes || args.maps))
		return -EINVAL;
	wic_fail_arm(space, &args);
	return 0;
}

/* The index in @space->remote of page @page out of @gpu_id's reach, or -1. */
static int wic_remote_find(struct uvm_wic_space *space, u64 page, u32 gpu_id)
{
	u32 i;

	lockdep_assert_held(&space->lock);
	for (i = 0; i < space->nr_remote; i++) {
		if (space->remote[i].page == page && space->remote[i].gpu_id == gpu_id)
			return i;
	}
	return -1;
}

/* Whether a page among first..last (page indices, inclusive) is out of @gpu_id's reach. */
static bool wic_remote_any(struct uvm_wic_space *space, u32 gpu_id, u64 first, u64 last)
{
	bool found = false;
	u32 i;

	mutex_lock(&space->lock);
	for (i = 0; i < space->nr_remote && !found; i++)
		found = space->remote[i].gpu_id == gpu_id && space->remote[i].page >= first &&
			space->remote[i].page <= last;
	mutex_unlock(&space->lock);
	return found;
}

static long wic_ioctl_reside(struct uvm_wic_space *space,
			     struct wic_fakegpu_page_state __user *uarg)
{
	struct wic_fakegpu_page_state args;
	long ret = 0;
	u64 page;
	int at;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!wic_gpu_valid(args.gpu_id))
		return -ENODEV;
	if ((args.va & (WIC_FAKEGPU_PAGE_SIZE - 1)) ||
	    (args.flags & ~(WIC_FAKEGPU_PAGE_UNREACHABLE | WIC_FAKEGPU_PAGE_NOWHERE)) ||
	    args.flags == (WIC_FAKEGPU_PAGE_UNREACHABLE | WIC_FAKEGPU_PAGE_NOWHERE))
		return -EINVAL;
	/* Resident nowhere is no GPU's. */
	if (args.flags & WIC_FAKEGPU_PAGE_NOWHERE)
		args.gpu_id = WIC_FAKEGPU_GPU_NONE;
	page = args.va >> WIC_FAKEGPU_PAGE_SHIFT;
	mutex_lock(&space->lock);
	at = wic_remote_find(space, page, args.gpu_id);
	if (!args.flags && at >= 0)
		space->remote[at] = space->remote[--space->nr_remote];
	else if (args.flags && at < 0 && space->nr_remote >= WIC_FAKEGPU_MAX_REMOTE)
		ret = -ENOSPC;
	else if (args.flags && at < 0)
		space->remote[space->nr_remote++] = (typeof(space->remote[0])){ page, args.gpu_id };
	mutex_unlock(&space->lock);
	return ret;
}

static long wic_ioctl_manage(struct uvm_wic_space *space, struct wic_fakegpu_managed __user *uarg)
{
	struct wic_fakegpu_managed args;
	long ret = 0;
	u64 end;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!args.length || ((args.start | args.length) & (WIC_FAKEGPU_PAGE_SIZE - 1)) ||
	    check_add_overflow(args.start, args.length, &end))
		return -EINVAL;
	mutex_lock(&space->lock);
	if (space->nr_managed >= WIC_FAKEGPU_MAX_MANAGED) {
		ret = -ENOSPC;
	} else {
		space->managed[space->nr_managed].start = args.start;
		space->managed[space->nr_managed].end = end;
		space->nr_managed++;
	}
	mutex_unlock(&space->lock);
	return ret;
}

/* Whether the declared managed ranges cover [start, end) without a gap. */
static bool wic_managed_covered(struct uvm_wic_space *space, u64 start, u64 end)
{
	u64 at = start;
	bool grew = true;
	u32 i;

	mutex_lock(&space->lock);
	while (at < end && grew) {
		grew = false;
		for (i = 0; i < space->nr_managed; i++) {
			if (space->managed[i].start <= at && space->managed[i].end > at) {
				at = space->managed[i].end;
				grew = true;
			}
		}
	}
	mutex_unlock(&space->lock);
	return at >= end;
}

/* Forgets every page resident in fake GPU memory. */
static void wic_gpu_pages_free(struct uvm_wic_space *space)
{
	struct wic_gpu_page *page;
	unsigned long index;

	xa_for_each(&space->gpu_pages, index, page)
		kfree(page);
	xa_destroy(&space->gpu_pages);
	space->nr_gpu_pages = 0;
}

static void wic_pages_reset(struct uvm_wic_space *space)
{
	static const struct wic_fakegpu_fail none;
	u32 gpu_id;

	mutex_lock(&space->lock);
	for (gpu_id = 0; gpu_id < WIC_FAKEGPU_NR_GPUS; gpu_id++)
		xa_destroy(&space->pages[gpu_id]);
	space->nr_pages = 0;
	space->nr_remote = 0;
	wic_gpu_pages_free(space);
	mutex_unlock(&space->lock);
	wic_fail_arm(space, &none);
}

/*
 * Writes @len bytes from @buf at @va of @mm (@write), or reads them into @buf, page by page, as
 * access_remote_vm() would (which 6.1 does not export); like a debugger, it breaks
 * copy-on-write and ignores protections.
 */
static int wic_access_remote(struct mm_struct *mm, u64 va, u8 *buf, size_t len, bool write)
{
	unsigned int gup_flags = FOLL_FORCE | (write ? FOLL_WRITE : 0);
	int ret = 0;

	if (mmap_read_lock_killable(mm))
		return -EINTR;
	while (len) {
		unsigned long addr = va;
		size_t offset = offset_in_page(addr);
		size_t bytes = min_t(size_t, len, PAGE_SIZE - offset);
		struct vm_area_struct *vma;
		struct page *page;
		void *kaddr;

		if (get_user_pages_remote(mm, addr, 1, gup_flags, &page, &vma, NULL) <= 0) {
			ret = -EFAULT;
			break;
		}
		kaddr = kmap_local_page(page);
		if (write) {
			copy_to_user_page(vma, page, addr, kaddr + offset, buf, bytes);
			set_page_dirty_lock(page);
		} else {
			copy_from_user_page(vma, page, addr, buf, kaddr + offset, bytes);
		}
		kunmap_local(kaddr);
		put_page(page);

		va += bytes;
		buf += bytes;
		len -= bytes;
		if (len && fatal_signal_pending(current)) {
			ret = -EINTR;
			break;
		}
		cond_resched();
	}
	mmap_read_unlock(mm);
	return ret;
}

/* wic_access_remote() on the space's process, which may have exited. */
static int wic_access_space(struct uvm_wic_space *space, u64 va, u8 *buf, size_t len, bool write)
{
	int ret;

	if (!space->mm)
		return -ENODEV;
	if (!mmget_not_zero(space->mm))
		return -ESRCH;
	ret = wic_access_remote(space->mm, va, buf, len, write);
	mmput(space->mm);
	return ret;
}

/*
 * Makes the pages among first..last (page indices, inclusive) that are resident nowhere
 * resident, zeroed in the process, as the hook populates them (nvidia-uvm's first touch).
 */
static int wic_populate(struct uvm_wic_space *space, u64 first, u64 last)
{
	static const u8 zeros[WIC_FAKEGPU_PAGE_SIZE];
	int at, ret = 0;
	u64 page;

	for (page = first; page <= last && !ret; page++) {
		mutex_lock(&space->lock);
		at = wic_remote_find(space, page, WIC_FAKEGPU_GPU_NONE);
		if (at >= 0)
			space->remote[at] = space->remote[--space->nr_remote];
		mutex_unlock(&space->lock);
		if (at >= 0)
			ret = wic_access_space(space, page << WIC_FAKEGPU_PAGE_SHIFT, (u8 *)zeros,
					       sizeof(zeros), true);
	}
	return ret;
}

/*
 * Stores @len bytes of @src (at most one page, not crossing it) at @va in @gpu_id's memory; the
 * page moves there from where it was resident, its bytes with it.
 */
static int wic_gpu_store_page(struct uvm_wic_space *space, u32 gpu_id, u64 va, const u8 *src,
			      size_t len)
{
	unsigned long index = va >> WIC_FAKEGPU_PAGE_SHIFT;
	struct wic_gpu_page *page, *fresh;
	int ret = 0;

	fresh = kmalloc(sizeof(*fresh), GFP_KERNEL);
	if (!fresh)
		return -ENOMEM;
	ret = wic_access_space(space, va & ~(u64)(WIC_FAKEGPU_PAGE_SIZE - 1), fresh->bytes,
			       WIC_FAKEGPU_PAGE_SIZE, false);
	if (ret) {
		kfree(fresh);
		return ret;
	}
	mutex_lock(&space->lock);
	page = xa_load(&space->gpu_pages, index);
	if (!page && space->nr_gpu_pages >= WIC_FAKEGPU_MAX_GPU_PAGES) {
		ret = -ENOSPC;
	} else if (!page) {
		fresh->gpu_id = gpu_id;
		ret = xa_err(xa_store(&space->gpu_pages, index, fresh, GFP_KERNEL));
		if (!ret) {
			page = fresh;
			fresh = NULL;
			space->nr_gpu_pages++;
		}
	}
	if (page) {
		/* Another GPU's copy moves here as it is (the process's copy is older). */
		page->gpu_id = gpu_id;
		memcpy(page->bytes + offset_in_page(va), src, len);
	}
	mutex_unlock(&space->lock);
	kfree(fresh);
	return ret;
}

static long wic_ioctl_gpu_store(struct uvm_wic_space *space,
				struct wic_fakegpu_gpu_store __user *uarg)
{
	struct wic_fakegpu_gpu_store args;
	u64 end, va;
	u8 *bytes;
	long ret = 0;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!wic_gpu_valid(args.gpu_id))
		return -ENODEV;
	if (args.reserved || !args.length || args.length > WIC_FAKEGPU_MAX_STORE ||
	    check_add_overflow(args.va, args.length, &end))
		return -EINVAL;
	if (!wic_managed_covered(space, args.va & ~(u64)(WIC_FAKEGPU_PAGE_SIZE - 1), end))
		return -EFAULT;
	bytes = kvmalloc(args.length, GFP_KERNEL);
	if (!bytes)
		return -ENOMEM;
	if (copy_from_user(bytes, u64_to_user_ptr(args.buffer), args.length))
		ret = -EFAULT;
	for (va = args.va; !ret && va < end;) {
		size_t chunk = min_t(u64, end - va, WIC_FAKEGPU_PAGE_SIZE - offset_in_page(va));

		ret = wic_gpu_store_page(space, args.gpu_id, va, bytes + (va - args.va), chunk);
		va += chunk;
	}
	kvfree(bytes);
	return ret;
}

/* The VA of a raw fault entry: ADDR_HI:ADDR_LO, sign-extended from WIC_FAKEGPU_VA_BITS. */
static u64 wic_fault_va(const u8 *raw)
{
	u64 lo = get_unaligned_le32(raw + 8) & WIC_FAULT_ADDR_LO_MASK;
	u64 hi = get_unaligned_le32(raw + 12);

	return (u64)sign_extend64((hi << 32) | lo, WIC_FAKEGPU_VA_BITS - 1);
}

/*
 * Whether a raw entry is a prefetch: ACCESS_TYPE (DWORD 7, bits [19:16]) is VIRT_PREFETCH or
 * PHYS_PREFETCH. An injected entry is one uncoalesced access, so this is nvidia-uvm's
 * "access_type_mask is the PREFETCH bit alone".
 */
/* ACCESS_TYPE of a raw fault entry (DWORD 7, bits [19:16]): dev_fault.h's values. */
static u32 wic_fault_access(const u8 *raw)
{
	return (get_unaligned_le32(raw + 28) >> 16) & 0xf;
}

static bool wic_fault_prefetch(const u8 *raw)
{
	u32 access = wic_fault_access(raw);

	return access == WIC_HW_ACCESS_VIRT_PREFETCH || access == WIC_HW_ACCESS_PHYS_PREFETCH;
}

/* A write or an atomic, VIRT or PHYS: its page must be mapped writable. */
static bool wic_fault_writes(const u8 *raw)
{
	switch (wic_fault_access(raw)) {
	case WIC_HW_ACCESS_VIRT_WRITE:
	case WIC_HW_ACCESS_VIRT_ATOMIC_STRONG:
	case WIC_HW_ACCESS_VIRT_ATOMIC_WEAK:
	case WIC_HW_ACCESS_PHYS_WRITE:
	case WIC_HW_ACCESS_PHYS_ATOMIC_STRONG:
	case WIC_HW_ACCESS_PHYS_ATOMIC_WEAK:
		return true;
	default:
		return false;
	}
}

/*
 * Shows @n faults of one batch of @gpu_id to the classify callback as nvidia-uvm's bottom half
 * does: under the GPU's ISR lock, bottom halves off, inside an RCU read-side section. Sets
 * @held[i] for each fault held; with no callback registered every fault passes.
 */
static void wic_classify_batch(u32 gpu_id, const struct uvm_wic_fault *faults, u32 n, u8 *held)
{
	const struct uvm_wic_ops *ops;
	unsigned int invalid = 0;
	bool any = false;
	u32 i;

	spin_lock_bh(&wic_isr_lock[gpu_id - 1]);
	rcu_read_lock();
	ops = rcu_dereference(wic_ops);
	for (i = 0; i < n; i++) {
		/* As the hook: a pre-Volta GPU's faults are shown as such, and never held. */
		bool unsupported = test_bit(gpu_id, faults[i].space->pre_volta);
		struct uvm_wic_fault fault = faults[i];
		enum uvm_wic_verdict verdict;

		if (unsupported)
			fault.flags |= UVM_WIC_FAULT_UNSUPPORTED;
		verdict = ops ? ops->classify(&fault) : UVM_WIC_PASS;
		held[i] = verdict == UVM_WIC_HOLD && !unsupported;
		any |= held[i];
		invalid += verdict != UVM_WIC_HOLD && verdict != UVM_WIC_PASS;
	}
	rcu_read_unlock();
	spin_unlock_bh(&wic_isr_lock[gpu_id - 1]);
	if (any)
		set_bit(gpu_id, wic_held_gpus);
	if (invalid)
		pr_warn_ratelimited("classify returned %u invalid verdicts, taken as pass\n",
				    invalid);
}

/* Services a passed fault as nvidia-uvm would: its page is mapped on @gpu_id. */
static void wic_service(struct uvm_wic_space *space, u32 gpu_id, u64 va, bool writable)
{
	unsigned long index = va >> WIC_FAKEGPU_PAGE_SHIFT;
	unsigned long set = WIC_FAKEGPU_PAGE_MAPPED;

	if (writable)
		set |= WIC_FAKEGPU_PAGE_WRITABLE;
	/* Running out of page-state room changes no verdict. */
	wic_pages_set(space, gpu_id, index, index, set, 0);
	wic_log_event(WIC_FAKEGPU_EVENT_SERVICED, gpu_id, va, WIC_FAKEGPU_PAGE_SIZE, 0);
}

static long wic_ioctl_inject(struct uvm_wic_space *space, struct wic_fakegpu_inject __user *uarg)
{
	struct wic_fakegpu_inject args;
	struct uvm_wic_fault *faults = NULL;
	u8 *verdicts = NULL;
	u8 *raw;
	long ret = 0;
	u32 i;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!wic_gpu_valid(args.gpu_id))
		return -ENODEV;
	if (!args.count || args.count > WIC_FAKEGPU_MAX_INJECT)
		return -EINVAL;

	/* Everything is copied in first: no user access in the atomic section. */
	raw = vmemdup_user(u64_to_user_ptr(args.entries),
			   (size_t)args.count * WIC_FAKEGPU_FAULT_ENTRY_SIZE);
	if (IS_ERR(raw))
		return PTR_ERR(raw);
	faults = kvcalloc(args.count, sizeof(*faults), GFP_KERNEL);
	verdicts = kzalloc(args.count, GFP_KERNEL);
	if (!faults || !verdicts) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < args.count; i++) {
		const u8 *entry = raw + (size_t)i * WIC_FAKEGPU_FAULT_ENTRY_SIZE;

		faults[i].space = space;
		faults[i].gpu_id = args.gpu_id;
		faults[i].va = wic_fault_va(entry);
		faults[i].flags = wic_fault_prefetch(entry) ? UVM_WIC_FAULT_PREFETCH : 0;
		memcpy(faults[i].raw, entry, UVM_WIC_FAULT_ENTRY_SIZE);
	}

	args.injected_ns = ktime_get_ns();
	wic_classify_batch(args.gpu_id, faults, args.count, verdicts);
	for (i = 0; i < args.count; i++) {
		if (!verdicts[i])
			wic_service(space, args.gpu_id, faults[i].va, false);
	}

	if (copy_to_user(u64_to_user_ptr(args.verdicts), verdicts, args.count) ||
	    put_user(args.injected_ns, &uarg->injected_ns))
		ret = -EFAULT;
out:
	kfree(verdicts);
	kvfree(faults);
	kvfree(raw);
	return ret;
}

/*
 * The replayable-fault hardware (WIC_FAKEGPU_IOC_WARPS, WIC_FAKEGPU_IOC_BOTTOM_HALF): per GPU,
 * the warps stalled on a fault and the bounded fault buffer they write their faults into.
 * wic_hw_lock protects all of it and serialises the bottom halves; it is taken before a
 * space's lock, and classify runs under it with the GPU's ISR lock held.
 */

/* A warp stalled on a fault. */
struct wic_warp {
	struct list_head node;
	struct uvm_wic_space *space;
	u64 va;
	u8 raw[WIC_FAKEGPU_FAULT_ENTRY_SIZE];
};

/**
 * struct wic_hw_gpu - a fake GPU's replayable-fault hardware, and nvidia-uvm's view of it
 * @stalled: its stalled warps, in stall order (rotated at each replay)
 * @nr_stalled: entries in @stalled
 * @buffer: the fault buffer, a ring of @count warps' faults from @get
 * @get: the oldest entry of @buffer
 * @count: entries in @buffer
 * @overflow: the hardware's OVERFLOW bit (GET and PUT registers): set when a fault is dropped;
 *	while it is set every new fault is dropped, until software clears it with a GET write
 * @overflow_seen: nvidia-uvm's latch of @overflow (the patch's overflow_seen), set only where
 *	the patched driver reads the bit (the PUT read of a fetch, and the GET write before its
 *	clear), cleared by a START replay
 * @deferred_due: when the deferred final replay is due (ktime_get_ns()), 0 when none is armed
 * @dropped: faults dropped, since the current ioctl began
 * @replays: replays, since the current ioctl began
 */
struct wic_hw_gpu {
	struct list_head stalled;
	u32 nr_stalled;
	struct wic_warp *buffer[WIC_FAKEGPU_HW_BUFFER];
	u32 get;
	u32 count;
	bool overflow;
	bool overflow_seen;
	u64 deferred_due;
	u32 dropped;
	u32 replays;
};

static DEFINE_MUTEX(wic_hw_lock);
static struct wic_hw_gpu *wic_hw[WIC_FAKEGPU_NR_GPUS];
static u32 wic_nr_warps;
static void wic_hw_deferred(struct work_struct *work);
static DECLARE_DELAYED_WORK(wic_hw_deferred_work, wic_hw_deferred);

/* The hardware of @gpu_id; allocated at its first warp with @create, else NULL until then. */
static struct wic_hw_gpu *wic_hw_gpu(u32 gpu_id, bool create)
{
	struct wic_hw_gpu *hw = wic_hw[gpu_id - 1];

	lockdep_assert_held(&wic_hw_lock);
	if (hw || !create)
		return hw;
	hw = kzalloc(sizeof(*hw), GFP_KERNEL);
	if (hw) {
		INIT_LIST_HEAD(&hw->stalled);
		wic_hw[gpu_id - 1] = hw;
	}
	return hw;
}

/*
 * A warp's fault goes into the buffer, or is dropped when the buffer is full or its OVERFLOW bit
 * is still set: "it will not deliver any more faults into the buffer until the overflow
 * condition has been cleared" (uvm_hal_volta_fault_buffer_write_get()).
 */
static void wic_hw_raise(u32 gpu_id, struct wic_hw_gpu *hw, struct wic_warp *warp)
{
	if (hw->overflow || hw->count == WIC_FAKEGPU_HW_BUFFER) {
		hw->overflow = true;
		hw->dropped++;
		wic_log_event(WIC_FAKEGPU_EVENT_DROPPED, gpu_id, warp->va, WIC_FAKEGPU_PAGE_SIZE, 0);
		return;
	}
	hw->buffer[(hw->get + hw->count) % WIC_FAKEGPU_HW_BUFFER] = warp;
	hw->count++;
}

/* Whether @warp's access would now go through on @gpu_id. */
static bool wic_warp_can_resume(const struct wic_warp *warp, u32 gpu_id)
{
	void *entry = xa_load(&warp->space->pages[gpu_id - 1], warp->va >> WIC_FAKEGPU_PAGE_SHIFT);
	unsigned long flags = entry ? xa_to_value(entry) : 0;

	if (!(flags & WIC_FAKEGPU_PAGE_MAPPED))
		return false;
	return !wic_fault_writes(warp->raw) || (flags & WIC_FAKEGPU_PAGE_WRITABLE);
}

static void wic_warp_free(struct wic_hw_gpu *hw, struct wic_warp *warp)
{
	list_del(&warp->node);
	hw->nr_stalled--;
	wic_nr_warps--;
	kfree(warp);
}

/*
 * nvidia-uvm reads the OVERFLOW bit, with the hook's latch: not under Confidential Computing,
 * where it sees GSP-RM's shadow of the buffer.
 */
static void wic_hw_latch(struct wic_hw_gpu *hw)
{
	if (hw->overflow && !conf_computing && rcu_access_pointer(wic_ops))
		hw->overflow_seen = true;
}

/*
 * nvidia-uvm's GET write (write_get()): the pointer moves past @n fetched entries, the hook's
 * latch reads the bit, then the bit is cleared (by GSP-RM under Confidential Computing).
 * @late (@nr_late of them) stall between that read and the clear: the race the latch loses.
 */
static void wic_hw_write_get(u32 gpu_id, struct wic_hw_gpu *hw, u32 n, struct wic_warp **late,
			     u32 nr_late)
{
	u32 i;

	hw->get = (hw->get + n) % WIC_FAKEGPU_HW_BUFFER;
	hw->count -= n;
	wic_hw_latch(hw);
	for (i = 0; i < nr_late; i++)
		wic_hw_raise(gpu_id, hw, late[i]);
	hw->overflow = false;
}

/*
 * A replay: the buffer is flushed (a GET write past every entry), a START replay is pushed
 * (the latch and any deferred replay cleared), the warps whose pages are mapped resume and
 * every other one faults again, from one warp further along the stall order than the last
 * replay.
 */
static void wic_hw_replay(u32 gpu_id, struct wic_hw_gpu *hw)
{
	struct wic_warp *warp, *next;

	wic_log_event(WIC_FAKEGPU_EVENT_REPLAY, gpu_id, 0, 0, 0);
	hw->replays++;
	wic_hw_write_get(gpu_id, hw, hw->count, NULL, 0);
	hw->overflow_seen = false;
	hw->deferred_due = 0;
	if (list_empty(&hw->stalled))
		return;
	list_rotate_left(&hw->stalled);
	list_for_each_entry_safe(warp, next, &hw->stalled, node) {
		if (wic_warp_can_resume(warp, gpu_id)) {
			wic_log_event(WIC_FAKEGPU_EVENT_RESUMED, gpu_id, warp->va,
				      WIC_FAKEGPU_PAGE_SIZE, 0);
			wic_warp_free(hw, warp);
		} else {
			wic_hw_raise(gpu_id, hw, warp);
		}
	}
}

/* A replay of @gpu_id, with its hardware when it has any. */
static void wic_replay_gpu(u32 gpu_id)
{
	struct wic_hw_gpu *hw;

	mutex_lock(&wic_hw_lock);
	hw = wic_hw_gpu(gpu_id, false);
	if (hw)
		wic_hw_replay(gpu_id, hw);
	else
		wic_log_event(WIC_FAKEGPU_EVENT_REPLAY, gpu_id, 0, 0, 0);
	mutex_unlock(&wic_hw_lock);
}

/*
 * One batch of the bottom half: fetched (PUT read and latched, entries taken, GET written,
 * @late stalling in its race), classified under the ISR lock; unless every fault of it is held,
 * its passed faults are serviced and it ends with a replay (BATCH_FLUSH). Returns whether every
 * fault was held.
 */
static bool wic_hw_batch(u32 gpu_id, struct wic_hw_gpu *hw, struct wic_warp **late, u32 nr_late)
{
	struct uvm_wic_fault faults[WIC_FAKEGPU_HW_BATCH];
	struct wic_warp *batch[WIC_FAKEGPU_HW_BATCH];
	u8 held[WIC_FAKEGPU_HW_BATCH];
	u32 n = min_t(u32, hw->count, WIC_FAKEGPU_HW_BATCH), i, nr_held = 0;

	wic_hw_latch(hw);
	for (i = 0; i < n; i++)
		batch[i] = hw->buffer[(hw->get + i) % WIC_FAKEGPU_HW_BUFFER];
	wic_hw_write_get(gpu_id, hw, n, late, nr_late);

	for (i = 0; i < n; i++) {
		faults[i] = (struct uvm_wic_fault){
			.space = batch[i]->space,
			.gpu_id = gpu_id,
			.va = batch[i]->va,
		};
		memcpy(faults[i].raw, batch[i]->raw, sizeof(faults[i].raw));
	}
	wic_classify_batch(gpu_id, faults, n, held);
	for (i = 0; i < n; i++)
		nr_held += held[i];
	if (nr_held == n)
		return true;

	for (i = 0; i < n; i++) {
		if (!held[i])
			wic_service(batch[i]->space, gpu_id, batch[i]->va,
				    wic_fault_writes(batch[i]->raw));
	}
	wic_hw_replay(gpu_id, hw);
	return false;
}

/*
 * nvidia-uvm's bottom half, run after run while the buffer has faults; @late (@nr_late warps)
 * stall in the race of the first fetch's GET write. A run's final replay, when no batch of it
 * replayed, is issued now or deferred as uvm_wic_run_final_replay() says; a deferred one is
 * run by wic_hw_deferred_work, unless a replay comes first.
 */
static void wic_hw_bottom_half(u32 gpu_id, struct wic_hw_gpu *hw, struct wic_warp **late,
			       u32 nr_late)
{
	u32 runs;

	/* No fetch to race: they stall at once. */
	for (; !hw->count && nr_late; nr_late--)
		wic_hw_raise(gpu_id, hw, *late++);
	for (runs = 0; hw->count && runs < WIC_FAKEGPU_HW_MAX_RUNS; runs++) {
		u32 batches = 0, held_batches = 0, replays = hw->replays;

		while (hw->count && batches < WIC_FAKEGPU_HW_MAX_BATCHES) {
			batches++;
			held_batches += wic_hw_batch(gpu_id, hw, late, nr_late);
			nr_late = 0;
		}
		if (hw->replays != replays)
			continue;
		if (uvm_wic_run_final_replay(false, batches, held_batches,
					     WIC_FAKEGPU_HW_MAX_BATCHES, hw->overflow_seen,
					     !conf_computing) == UVM_WIC_REPLAY_NOW) {
			wic_hw_replay(gpu_id, hw);
		} else if (!hw->deferred_due) {
			hw->deferred_due = ktime_get_ns() +
					   (u64)UVM_WIC_DEFERRED_REPLAY_MS * NSEC_PER_MSEC;
			queue_delayed_work(system_wq, &wic_hw_deferred_work,
					   msecs_to_jiffies(UVM_WIC_DEFERRED_REPLAY_MS));
		}
	}
}

/* Runs the deferred replays that are due, and comes back for those that are not yet. */
static void wic_hw_deferred(struct work_struct *work)
{
	u64 now = ktime_get_ns(), next = 0;
	u32 gpu_id;

	mutex_lock(&wic_hw_lock);
	for (gpu_id = 1; gpu_id <= WIC_FAKEGPU_NR_GPUS; gpu_id++) {
		struct wic_hw_gpu *hw = wic_hw_gpu(gpu_id, false);

		if (!hw || !hw->deferred_due)
			continue;
		if (hw->deferred_due <= now)
			wic_hw_replay(gpu_id, hw);
		else if (!next || hw->deferred_due < next)
			next = hw->deferred_due;
	}
	mutex_unlock(&wic_hw_lock);
	if (next)
		queue_delayed_work(system_wq, &wic_hw_deferred_work,
				   nsecs_to_jiffies(next - now) + 1);
}

/*
 * The space's file is going away: as nvidia-uvm's teardown (uvm_va_space_mm_shutdown()) stops
 * its channels, its warps are gone, and every GPU where it had one has its fault buffer flushed
 * and replayed (uvm_gpu_fault_buffer_flush(): the GET write clears OVERFLOW, and the warps of
 * other spaces fault again).
 */
static void wic_hw_forget(struct uvm_wic_space *space)
{
	struct wic_warp *warp, *next;
	bool had;
	u32 gpu_id;

	mutex_lock(&wic_hw_lock);
	for (gpu_id = 1; gpu_id <= WIC_FAKEGPU_NR_GPUS; gpu_id++) {
		struct wic_hw_gpu *hw = wic_hw_gpu(gpu_id, false);

		if (!hw)
			continue;
		had = false;
		list_for_each_entry_safe(warp, next, &hw->stalled, node) {
			if (warp->space == space) {
				wic_warp_free(hw, warp);
				had = true;
			}
		}
		if (had)
			wic_hw_replay(gpu_id, hw);
	}
	mutex_unlock(&wic_hw_lock);
}

/* Whether a warp of @space is stalled on page @va of @gpu_id. */
static bool wic_hw_stalled_on(struct uvm_wic_space *space, u32 gpu_id, u64 va)
{
	struct wic_hw_gpu *hw;
	struct wic_warp *warp;
	bool found = false;

	mutex_lock(&wic_hw_lock);
	hw = wic_hw_gpu(gpu_id, false);
	if (hw) {
		list_for_each_entry(warp, &hw->stalled, node)
			found |= warp->space == space && warp->va == va;
	}
	mutex_unlock(&wic_hw_lock);
	return found;
}

/* Warps stalled on @gpu_id; 0 for a GPU that never had one. */
static u32 wic_hw_nr_stalled(u32 gpu_id)
{
	struct wic_hw_gpu *hw;
	u32 n;

	mutex_lock(&wic_hw_lock);
	hw = wic_hw_gpu(gpu_id, false);
	n = hw ? hw->nr_stalled : 0;
	mutex_unlock(&wic_hw_lock);
	return n;
}

/* RM resets @gpu_id's channel: every warp stalled there is killed, its fault gone. */
static u32 wic_hw_reset_channel(u32 gpu_id)
{
	struct wic_warp *warp, *next;
	struct wic_hw_gpu *hw;
	u32 killed = 0;

	mutex_lock(&wic_hw_lock);
	hw = wic_hw_gpu(gpu_id, false);
	/* The last warp may have resumed since the switch looked: then the switch is done. */
	if (hw && hw->nr_stalled) {
		hw->count = 0;
		hw->overflow = false;
		hw->overflow_seen = false;
		list_for_each_entry_safe(warp, next, &hw->stalled, node) {
			wic_log_event(WIC_FAKEGPU_EVENT_CHANNEL_RESET, gpu_id, warp->va,
				      WIC_FAKEGPU_PAGE_SIZE, 0);
			wic_warp_free(hw, warp);
			killed++;
		}
	}
	mutex_unlock(&wic_hw_lock);
	return killed;
}

/*
 * A context switch on a GPU: it waits while any warp is stalled there (a replayable fault
 * blocks preemption), looking every millisecond, and past @timeout_ms the channel is reset.
 * Returns the warps the reset killed (0 when the switch was done) and sets @waited_ns, or
 * -EINTR.
 */
static long wic_hw_switch(u32 gpu_id, u32 timeout_ms, u64 *waited_ns)
{
	u64 start = ktime_get_ns(), deadline = start + (u64)timeout_ms * NSEC_PER_MSEC;
	u32 killed = 0;

	while (wic_hw_nr_stalled(gpu_id)) {
		if (ktime_get_ns() >= deadline) {
			killed = wic_hw_reset_channel(gpu_id);
			break;
		}
		if (fatal_signal_pending(current))
			return -EINTR;
		usleep_range(1000, 1100);
	}
	*waited_ns = ktime_get_ns() - start;
	if (!killed)
		wic_log_event(WIC_FAKEGPU_EVENT_SWITCHED, gpu_id, 0, *waited_ns, 0);
	return killed;
}

/* Reads and checks a struct wic_fakegpu_preempt (WIC_FAKEGPU_IOC_PREEMPT, _EXIT). */
static long wic_preempt_args(struct wic_fakegpu_preempt __user *uarg,
			     struct wic_fakegpu_preempt *args)
{
	if (copy_from_user(args, uarg, sizeof(*args)))
		return -EFAULT;
	if (!wic_gpu_valid(args->gpu_id))
		return -ENODEV;
	if (args->reserved || !args->timeout_ms || args->timeout_ms > WIC_FAKEGPU_MAX_SWITCH_MS)
		return -EINVAL;
	return 0;
}

/* The switch of @args's GPU (wic_hw_switch()), its outcome written back to @uarg. */
static long wic_preempt_switch(struct wic_fakegpu_preempt __user *uarg,
			       struct wic_fakegpu_preempt *args)
{
	long killed = wic_hw_switch(args->gpu_id, args->timeout_ms, &args->waited_ns);

	if (killed < 0)
		return killed;
	args->killed = killed;
	return copy_to_user(uarg, args, sizeof(*args)) ? -EFAULT : 0;
}

static long wic_ioctl_preempt(struct wic_fakegpu_preempt __user *uarg)
{
	struct wic_fakegpu_preempt args;
	long ret = wic_preempt_args(uarg, &args);

	return ret ?: wic_preempt_switch(uarg, &args);
}

/*
 * The space's process goes away, as uvm_va_space_mm_shutdown() handles it: the hook's
 * uvm_wic_space_shutdown() (the shim's space_shutdown callback, then a replay of every GPU
 * when it may have held faults of the space, and the bottom half of the faults coming back),
 * then the space's channels stop, which waits as a context switch does (wic_hw_switch()) on
 * @gpu_id; from then on the helpers refuse the space (ESRCH).
 */
static long wic_ioctl_exit(struct uvm_wic_space *space, struct wic_fakegpu_preempt __user *uarg)
{
	const struct uvm_wic_ops *ops;
	struct wic_fakegpu_preempt args;
	long ret = wic_preempt_args(uarg, &args);
	bool held = false;
	u32 gpu_id;

	if (ret)
		return ret;
	rcu_read_lock();
	ops = rcu_dereference(wic_ops);
	if (ops && ops->space_shutdown)
		held = ops->space_shutdown(space);
	rcu_read_unlock();
	/* The space's GPUs: those that ever had a warp (the fake registers no GPU in a space). */
	for (gpu_id = 1; held && gpu_id <= WIC_FAKEGPU_NR_GPUS; gpu_id++) {
		struct wic_hw_gpu *hw;

		mutex_lock(&wic_hw_lock);
		hw = wic_hw_gpu(gpu_id, false);
		if (hw) {
			wic_hw_replay(gpu_id, hw);
			/* The interrupt of the faults coming back. */
			wic_hw_bottom_half(gpu_id, hw, NULL, 0);
		}
		mutex_unlock(&wic_hw_lock);
	}
	ret = wic_preempt_switch(uarg, &args);
	/* Stopped, unless interrupted: the channel's reset or switch happened. */
	if (ret != -EINTR)
		WRITE_ONCE(space->exited, true);
	return ret;
}

/*
 * The system suspends: as RM does before it suspends the GPUs (nv_suspend_devices():
 * nv_preempt_user_channels(), then nv_uvm_suspend(); with the kernel's own PM callbacks,
 * nvidia_suspend()), every GPU that ever had a warp is switched out, waiting up to
 * suspend_switch_ms for its stalled warps; a GPU whose channel had to be reset fails the
 * suspend, as nv_pmops_suspend() fails it with -EIO.
 */
static unsigned int suspend_switch_ms = 1000;
module_param(suspend_switch_ms, uint, 0644);
MODULE_PARM_DESC(suspend_switch_ms,
		 "How long a suspend waits for each GPU's stalled warps before it resets its channel");

static int wic_fakegpu_suspend(struct device *dev)
{
	u32 gpu_id, timeout_ms = clamp(suspend_switch_ms, 1U, WIC_FAKEGPU_MAX_SWITCH_MS);
	bool reset = false;
	u64 waited_ns;
	bool had_warps;

	for (gpu_id = 1; gpu_id <= WIC_FAKEGPU_NR_GPUS; gpu_id++) {
		mutex_lock(&wic_hw_lock);
		had_warps = wic_hw_gpu(gpu_id, false);
		mutex_unlock(&wic_hw_lock);
		if (had_warps && wic_hw_switch(gpu_id, timeout_ms, &waited_ns) > 0)
			reset = true;
	}
	if (reset)
		dev_warn(dev, "a channel could not be preempted for the suspend: reset, suspend failed\n");
	return reset ? -EIO : 0;
}

static int wic_fakegpu_resume(struct device *dev)
{
	return 0;
}

static DEFINE_SIMPLE_DEV_PM_OPS(wic_fakegpu_pm, wic_fakegpu_suspend, wic_fakegpu_resume);

static struct platform_driver wic_fakegpu_driver = {
	.driver = {
		.name = "wic_fakegpu",
		.pm = pm_sleep_ptr(&wic_fakegpu_pm),
	},
};

static struct platform_device *wic_fakegpu_pdev;

static long wic_ioctl_warps(struct uvm_wic_space *space, struct wic_fakegpu_warps __user *uarg,
			    bool bottom_half)
{
	struct wic_fakegpu_warps args;
	struct wic_warp **late = NULL;
	struct wic_hw_gpu *hw;
	u32 i, nr_late = 0;
	u8 *raw = NULL;
	long ret = 0;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!wic_gpu_valid(args.gpu_id))
		return -ENODEV;
	if (args.reserved || (!bottom_half && !args.count) ||
	    args.count > WIC_FAKEGPU_MAX_INJECT || (!args.count && args.entries))
		return -EINVAL;
	if (args.count) {
		late = kcalloc(args.count, sizeof(*late), GFP_KERNEL);
		if (!late)
			return -ENOMEM;
		raw = vmemdup_user(u64_to_user_ptr(args.entries),
				   (size_t)args.count * WIC_FAKEGPU_FAULT_ENTRY_SIZE);
		if (IS_ERR(raw)) {
			kfree(late);
			return PTR_ERR(raw);
		}
		/* A prefetch stalls no warp: nvidia-uvm never replays one. */
		for (i = 0; i < args.count; i++)
			if (wic_fault_prefetch(raw + (size_t)i * WIC_FAKEGPU_FAULT_ENTRY_SIZE))
				ret = -EINVAL;
	}

	mutex_lock(&wic_hw_lock);
	hw = wic_hw_gpu(args.gpu_id, args.count);
	if (!hw && args.count && !ret)
		ret = -ENOMEM;
	if (hw) {
		hw->dropped = 0;
		hw->replays = 0;
	}
	for (i = 0; !ret && i < args.count; i++) {
		struct wic_warp *warp;

		if (wic_nr_warps >= WIC_FAKEGPU_MAX_WARPS) {
			ret = -ENOSPC;
			break;
		}
		warp = kzalloc(sizeof(*warp), GFP_KERNEL);
		if (!warp) {
			ret = -ENOMEM;
			break;
		}
		memcpy(warp->raw, raw + (size_t)i * WIC_FAKEGPU_FAULT_ENTRY_SIZE, sizeof(warp->raw));
		warp->space = space;
		warp->va = wic_fault_va(warp->raw) & ~(u64)(WIC_FAKEGPU_PAGE_SIZE - 1);
		list_add_tail(&warp->node, &hw->stalled);
		hw->nr_stalled++;
		wic_nr_warps++;
		if (bottom_half)
			late[nr_late++] = warp;
		else
			wic_hw_raise(args.gpu_id, hw, warp);
	}
	if (hw && bottom_half && !ret)
		wic_hw_bottom_half(args.gpu_id, hw, late, nr_late);
	args.stalled = hw ? hw->nr_stalled : 0;
	args.dropped = hw ? hw->dropped : 0;
	args.replays = hw ? hw->replays : 0;
	mutex_unlock(&wic_hw_lock);
	kvfree(raw);
	kfree(late);
	if (!ret && copy_to_user(uarg, &args, sizeof(args)))
		ret = -EFAULT;
	return ret;
}

static long wic_ioctl_events(struct wic_fakegpu_events __user *uarg)
{
	struct wic_fakegpu_event __user *ubuf;
	struct wic_fakegpu_events args;
	struct wic_fakegpu_event *kbuf;
	u32 done = 0;
	long ret = 0;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.reserved || !args.capacity)
		return -EINVAL;
	ubuf = u64_to_user_ptr(args.buffer);

	if (args.timeout_ms) {
		long left;

		left = wait_event_interruptible_timeout(wic_log_wait, wic_log_pending(),
							msecs_to_jiffies(args.timeout_ms));
		if (left < 0)
			return left;
	}

	kbuf = kmalloc_array(WIC_LOG_CHUNK, sizeof(*kbuf), GFP_KERNEL);
	if (!kbuf)
		return -ENOMEM;
	if (mutex_lock_interruptible(&wic_log_read_lock)) {
		kfree(kbuf);
		return -ERESTARTSYS;
	}
	while (done < args.capacity) {
		u32 n, i;

		spin_lock_irq(&wic_log_lock);
		n = min_t(u64, wic_log_head - wic_log_tail,
			  min_t(u32, args.capacity - done, WIC_LOG_CHUNK));
		for (i = 0; i < n; i++)
			kbuf[i] = wic_log[(wic_log_tail + i) & WIC_LOG_MASK];
		spin_unlock_irq(&wic_log_lock);
		if (!n)
			break;
		/* Only readers remove events, and they hold wic_log_read_lock. */
		if (copy_to_user(ubuf + done, kbuf, n * sizeof(*kbuf))) {
			if (!done)
				ret = -EFAULT;
			break;
		}
		spin_lock_irq(&wic_log_lock);
		wic_log_tail += n;
		spin_unlock_irq(&wic_log_lock);
		done += n;
	}
	if (!ret) {
		spin_lock_irq(&wic_log_lock);
		args.overflow = wic_log_overflow;
		wic_log_overflow = 0;
		spin_unlock_irq(&wic_log_lock);
	}
	mutex_unlock(&wic_log_read_lock);
	kfree(kbuf);
	if (ret)
		return ret;

	args.count = done;
	if (copy_to_user(uarg, &args, sizeof(args)))
		return -EFAULT;
	return 0;
}

static long wic_ioctl_page_state(struct uvm_wic_space *space,
				 struct wic_fakegpu_page_state __user *uarg)
{
	struct wic_fakegpu_page_state args;
	void *entry;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (!wic_gpu_valid(args.gpu_id))
		return -ENODEV;
	if (args.va & (WIC_FAKEGPU_PAGE_SIZE - 1))
		return -EINVAL;
	entry = xa_load(&space->pages[args.gpu_id - 1], args.va >> WIC_FAKEGPU_PAGE_SHIFT);
	args.flags = entry ? xa_to_value(entry) : 0;
	mutex_lock(&space->lock);
	if (wic_remote_find(space, args.va >> WIC_FAKEGPU_PAGE_SHIFT, args.gpu_id) >= 0)
		args.flags |= WIC_FAKEGPU_PAGE_UNREACHABLE;
	mutex_unlock(&space->lock);
	if (wic_hw_stalled_on(space, args.gpu_id, args.va))
		args.flags |= WIC_FAKEGPU_PAGE_STALLED;
	if (copy_to_user(uarg, &args, sizeof(args)))
		return -EFAULT;
	return 0;
}

static long wic_fakegpu_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct uvm_wic_space *space = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case WIC_FAKEGPU_IOC_INJECT:
		return wic_ioctl_inject(space, uarg);
	case WIC_FAKEGPU_IOC_EVENTS:
		return wic_ioctl_events(uarg);
	case WIC_FAKEGPU_IOC_PAGE_STATE:
		return wic_ioctl_page_state(space, uarg);
	case WIC_FAKEGPU_IOC_RESET:
		if (arg)
			return -EINVAL;
		wic_log_reset();
		wic_pages_reset(space);
		return 0;
	case WIC_FAKEGPU_IOC_FAIL:
		return wic_ioctl_fail(space, uarg);
	case WIC_FAKEGPU_IOC_MANAGE:
		return wic_ioctl_manage(space, uarg);
	case WIC_FAKEGPU_IOC_RESIDE:
		return wic_ioctl_reside(space, uarg);
	case WIC_FAKEGPU_IOC_GPU_STORE:
		return wic_ioctl_gpu_store(space, uarg);
	case WIC_FAKEGPU_IOC_WARPS:
		return wic_ioctl_warps(space, uarg, false);
	case WIC_FAKEGPU_IOC_BOTTOM_HALF:
		return wic_ioctl_warps(space, uarg, true);
	case WIC_FAKEGPU_IOC_PREEMPT:
		return wic_ioctl_preempt(uarg);
	case WIC_FAKEGPU_IOC_EXIT:
		return wic_ioctl_exit(space, uarg);
	case WIC_FAKEGPU_IOC_FILLED:
		return put_user((u64)atomic64_read(&space->filled), (u64 __user *)uarg);
	case WIC_FAKEGPU_IOC_PRE_VOLTA: {
		u32 gpu_id;

		if (get_user(gpu_id, (u32 __user *)uarg))
			return -EFAULT;
		if (!wic_gpu_valid(gpu_id))
			return -ENODEV;
		set_bit(gpu_id, space->pre_volta);
		return 0;
	}
	default:
		return -ENOTTY;
	}
}

static int wic_fakegpu_open(struct inode *inode, struct file *file)
{
	struct uvm_wic_space *space;
	u32 gpu_id;

	space = kzalloc(sizeof(*space), GFP_KERNEL);
	if (!space)
		return -ENOMEM;
	space->file = file;
	space->mm = current->mm;
	if (space->mm)
		mmgrab(space->mm);
	mutex_init(&space->lock);
	mutex_init(&space->stage_lock);
	atomic64_set(&space->filled, 0);
	init_waitqueue_head(&space->fail_wait);
	for (gpu_id = 0; gpu_id < WIC_FAKEGPU_NR_GPUS; gpu_id++)
		xa_init(&space->pages[gpu_id]);
	xa_init(&space->gpu_pages);
	file->private_data = space;
	return nonseekable_open(inode, file);
}

/* Called once the last reference is gone, including those of uvm_wic_space_get(). */
static int wic_fakegpu_release(struct inode *inode, struct file *file)
{
	struct uvm_wic_space *space = file->private_data;
	u32 gpu_id;

	/* First, so that no bottom half or replay services a warp of the space any more. */
	wic_hw_forget(space);
	for (gpu_id = 0; gpu_id < WIC_FAKEGPU_NR_GPUS; gpu_id++)
		xa_destroy(&space->pages[gpu_id]);
	wic_gpu_pages_free(space);
	if (space->mm)
		mmdrop(space->mm);
	mutex_destroy(&space->lock);
	kfree(space);
	return 0;
}

static const struct file_operations wic_fakegpu_fops = {
	.owner = THIS_MODULE,
	.open = wic_fakegpu_open,
	.release = wic_fakegpu_release,
	.unlocked_ioctl = wic_fakegpu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = no_llseek,
};

static struct miscdevice wic_fakegpu_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "wic_fakegpu",
	.fops = &wic_fakegpu_fops,
	.mode = 0600,
};

/**
 * uvm_wic_register() - install the shim's callbacks
 * @ops: the callbacks; must stay valid until uvm_wic_unregister() returns
 *
 * Return: 0, -EBUSY when callbacks are installed already, -EINVAL without a classify callback.
 */
int uvm_wic_register(const struct uvm_wic_ops *ops)
{
	int ret = 0;

	might_sleep();
	if (!ops || !ops->classify)
		return -EINVAL;
	mutex_lock(&wic_ops_lock);
	if (rcu_access_pointer(wic_ops))
		ret = -EBUSY;
	else
		rcu_assign_pointer(wic_ops, ops);
	mutex_unlock(&wic_ops_lock);
	return ret;
}
EXPORT_SYMBOL_GPL(uvm_wic_register);

/**
 * uvm_wic_unregister() - remove the shim's callbacks
 * @ops: the callbacks passed to uvm_wic_register()
 *
 * Waits until no injection is still inside @ops->classify, then replays, as nvidia-uvm does,
 * so that no held fault waits for an unrelated replay: logs %WIC_FAKEGPU_EVENT_REPLAY for each
 * GPU on which a fault was held since the callbacks were registered. Other @ops than the
 * installed ones are left alone (with a warning in the kernel log).
 */
void uvm_wic_unregister(const struct uvm_wic_ops *ops)
{
	bool removed = false;
	unsigned int gpu_id;

	might_sleep();
	mutex_lock(&wic_ops_lock);
	if (ops && rcu_access_pointer(wic_ops) == ops) {
		RCU_INIT_POINTER(wic_ops, NULL);
		removed = true;
	}
	mutex_unlock(&wic_ops_lock);
	if (!removed) {
		pr_warn("%s() of callbacks that are not installed\n", __func__);
		return;
	}
	synchronize_rcu();
	for_each_set_bit(gpu_id, wic_held_gpus, WIC_FAKEGPU_NR_GPUS + 1) {
		clear_bit(gpu_id, wic_held_gpus);
		wic_replay_gpu(gpu_id);
	}
}
EXPORT_SYMBOL_GPL(uvm_wic_unregister);

/**
 * uvm_wic_space_get() - the VA space behind an open /dev/wic_fakegpu file
 * @uvm_file: a file, received by the daemon over a Unix socket
 *
 * Takes a reference to @uvm_file, which keeps the space (and this module) alive until
 * uvm_wic_space_put().
 *
 * Return: the space, or an ERR_PTR: -EBADF when @uvm_file is not a /dev/wic_fakegpu file,
 * -ENODEV when it was opened by a kernel thread (no mm), -EOPNOTSUPP with a pre-Volta GPU
 * registered, -EPERM under the conf_computing parameter, as the hook refuses.
 */
struct uvm_wic_space *uvm_wic_space_get(struct file *uvm_file)
{
	struct uvm_wic_space *space;

	might_sleep();
	if (IS_ERR_OR_NULL(uvm_file) || uvm_file->f_op != &wic_fakegpu_fops)
		return ERR_PTR(-EBADF);
	space = uvm_file->private_data;
	if (!space->mm)
		return ERR_PTR(-ENODEV);
	if (!bitmap_empty(space->pre_volta, WIC_FAKEGPU_NR_GPUS + 1))
		return ERR_PTR(-EOPNOTSUPP);
	if (conf_computing)
		return ERR_PTR(-EPERM);
	get_file(uvm_file);
	return space;
}
EXPORT_SYMBOL_GPL(uvm_wic_space_get);

/**
 * uvm_wic_space_put() - drop a reference taken by uvm_wic_space_get()
 * @space: the space; NULL and error pointers are ignored
 */
void uvm_wic_space_put(struct uvm_wic_space *space)
{
	if (IS_ERR_OR_NULL(space))
		return;
	fput(space->file);
}
EXPORT_SYMBOL_GPL(uvm_wic_space_put);

/**
 * uvm_wic_space_mm() - the address space of the process that opened the space's file
 * @space: a space held by the caller
 *
 * Return: the mm, valid while the caller holds @space; no reference is taken.
 */
struct mm_struct *uvm_wic_space_mm(struct uvm_wic_space *space)
{
	if (IS_ERR_OR_NULL(space))
		return NULL;
	return space->mm;
}
EXPORT_SYMBOL_GPL(uvm_wic_space_mm);

/*
 * What wic_fill_write() and wic_fill_copy() check before they write [va, va + len): an armed
 * failure, a space with a process, and (strict_write) no page of the range mapped on a GPU.
 */
static int wic_write_allowed(struct uvm_wic_space *space, u64 va, size_t len)
{
	int ret = wic_fail_take(space, &space->fail_writes, WIC_FAKEGPU_GPU_NONE, va, len);

	if (ret)
		return ret;
	if (!space->mm)
		return -ENODEV;
	if (strict_write && wic_pages_mapped(space, va >> WIC_FAKEGPU_PAGE_SHIFT,
					     (va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT)) {
		pr_warn_ratelimited("write of %#llx+%zu, mapped on a GPU\n", va, len);
		return -EBUSY;
	}
	return 0;
}

/**
 * wic_fill_write() - write bytes into the application's memory
 * @space: the space
 * @va: the first byte
 * @src: kernel memory holding the bytes
 * @len: how many bytes, at least 1
 *
 * Process context only. Writes through the page tables of the space's mm, like a debugger,
 * and logs %WIC_FAKEGPU_EVENT_WRITE with the first 8 bytes.
 *
 * Return: 0; -EINVAL for bad arguments; -ENODEV for a space without mm; -EBUSY when a page
 * of the range is mapped on a fake GPU (unless the module parameter strict_write is off);
 * -ESRCH when the mm has exited; -EFAULT when part of the range could not be written (the
 * part before may have been); -EINTR on a fatal signal; the errno WIC_FAKEGPU_IOC_FAIL armed.
 */
static int wic_fill_write(struct uvm_wic_space *space, u64 va, const void *src, size_t len)
{
	u8 first[8] = {};
	int ret;

	might_sleep();
	if (IS_ERR_OR_NULL(space) || !src || !len || va + (len - 1) < va)
		return -EINVAL;
	ret = wic_write_allowed(space, va, len);
	if (ret)
		return ret;
	/* Written, a page resident nowhere is populated first. */
	ret = wic_populate(space, va >> WIC_FAKEGPU_PAGE_SHIFT,
			   (va + len - 1) >> WIC_FAKEGPU_PAGE_SHIFT);
	if (ret)
		return ret;
	/* The process's memory is written from @src only. */
	ret = wic_access_space(space, va, (u8 *)src, len, true);
	if (ret)
		return ret;

	memcpy(first, src, min_t(size_t, len, sizeof(first)));
	wic_log_event(WIC_FAKEGPU_EVENT_WRITE, WIC_FAKEGPU_GPU_NONE, va, len,
		      get_unaligned_le64(first));
	return 0;
}

/*
 * Reads @len bytes at @va (not crossing a page) where they are resident: from a fake GPU's
 * memory, whose id goes to @gpu_id, or from the process (@gpu_id WIC_FAKEGPU_GPU_NONE).
 */
static int wic_read_resident(struct uvm_wic_space *space, u64 va, u8 *buf, size_t len,
			     u32 *gpu_id)
{
	struct wic_gpu_page *page;

	mutex_lock(&space->lock);
	page = xa_load(&space->gpu_pages, va >> WIC_FAKEGPU_PAGE_SHIFT);
	*gpu_id = page ? page->gpu_id : WIC_FAKEGPU_GPU_NONE;
	if (page)
		memcpy(buf, page->bytes + offset_in_page(va), len);
	mutex_unlock(&space->lock);
	return page ? 0 : wic_access_space(space, va, buf, len, false);
}

/**
 * wic_fill_copy() - copy bytes of the application's managed memory into its memory
 * @space: the space
 * @va: the first byte written
 * @src_va: the first byte read
 * @len: how many bytes, at least 1
 *
 * Process context only. Reads each source page where it is resident (a fake GPU's memory,
 * WIC_FAKEGPU_IOC_GPU_STORE, as that GPU's copy engine would; else the process's memory), writes
 * as wic_fill_write() and logs %WIC_FAKEGPU_EVENT_COPY with the GPU that held the first source
 * byte and the first 8 bytes. Armed write failures (WIC_FAKEGPU_IOC_FAIL) apply to copies too.
 *
 * Return: 0; -EINVAL for bad arguments or overlapping ranges; -EFAULT when the source is not
 * managed memory (WIC_FAKEGPU_IOC_MANAGE) or part of the range could not be read or written
 * (the part before may have been written); the other errors of wic_fill_write().
 */
static int wic_fill_copy(struct uvm_wic_space *space, u64 va, u64 src_va, size_t len)
{
	u32 first_gpu = WIC_FAKEGPU_GPU_NONE, gpu_id;
	u8 first[8] = {};
	size_t done, chunk;
	u8 *bounce;
	int ret;

	might_sleep();
	if (IS_ERR_OR_NULL(space) || !len || va + (len - 1) < va || src_va + (len - 1) < src_va ||
	    (src_va <= va + (len - 1) && va <= src_va + (len - 1)))
		return -EINVAL;
	ret = wic_write_allowed(space, va, len);
	if (ret)
		return ret;
	/* As nvidia-uvm, which reads the source through its managed VA blocks. */
	if (!wic_managed_covered(space, src_va & ~(u64)(WIC_FAKEGPU_PAGE_SIZE - 1), src_va + len))
		return -EFAULT;
	bounce = kmalloc(WIC_FAKEGPU_PAGE_SIZE, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;
	for (done = 0; !ret && done < len; done += chunk) {
		chunk = min3(len - done, WIC_FAKEGPU_PAGE_SIZE - offset_in_page(src_va + done),
			     WIC_FAKEGPU_PAGE_SIZE - offset_in_page(va + done));
		ret = wic_read_resident(space, src_va + done, bounce, chunk, &gpu_id);
		if (!ret)
			ret = wic_access_space(space, va + done, bounce, chunk, true);
		if (!done)
			first_gpu = gpu_id;
		if (done < sizeof(first))
			memcpy(first + done, bounce, min(chunk, sizeof(first) - done));
	}
	kfree(bounce);
	if (ret)
		return ret;
	wic_log_event(WIC_FAKEGPU_EVENT_COPY, first_gpu, va, len, get_unaligned_le64(first));
	return 0;
}

/* One completion of uvm_wic_complete(): its steps as the helpers take them. */
static int wic_unmap_pages(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len);
static int wic_map(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len, bool writable);

static int wic_complete_one(struct uvm_wic_space *space, struct uvm_wic_completion *c)
{
	u64 bytes = (u64)c->pages * WIC_FAKEGPU_PAGE_SIZE;
	bool fill = !(c->flags & UVM_WIC_COMPLETE_NO_FILL);
	bool heads = c->flags & UVM_WIC_COMPLETE_HEADS;
	int ret = 0;
	u32 i;

	c->companion_unmapped = false;
	if (!c->pages || (c->length && c->length > bytes) || (c->flags & ~UVM_WIC_COMPLETE_FLAGS) ||
	    (!fill && c->length) ||
	    ((c->flags & UVM_WIC_COMPLETE_NO_MAP) && (c->flags & UVM_WIC_COMPLETE_WRITABLE)) ||
	    (heads && (!c->src || !fill || c->length != (u64)c->pages * sizeof(u64))))
		return -EINVAL;
	if (fill && heads) {
		/* Word i at the start of page i; the rest of each page is the application's. */
		for (i = 0; !ret && i < c->pages; i++) {
			const u8 *word = (const u8 *)c->src + (u64)i * sizeof(u64);

			ret = wic_fill_write(space, c->va + (u64)i * WIC_FAKEGPU_PAGE_SIZE, word,
					     sizeof(u64));
			if (!ret)
				atomic64_add(sizeof(u64), &space->filled);
		}
	} else if (fill && c->length) {
		ret = c->src ? wic_fill_write(space, c->va, c->src, c->length) :
			       wic_fill_copy(space, c->va, c->src_va, c->length);
		if (!ret)
			atomic64_add(c->length, &space->filled);
	}
	for (i = 0; fill && !c->length && !ret && i < c->pages; i++) {
		ret = wic_fill_write(space, c->va + (u64)i * WIC_FAKEGPU_PAGE_SIZE, &c->marker,
				    sizeof(c->marker));
		if (!ret)
			atomic64_add(sizeof(c->marker), &space->filled);
	}
	if (!ret && c->companion) {
		ret = wic_unmap_pages(space, c->gpu_id, c->companion, bytes);
		c->companion_unmapped = !ret;
	}
	if (!ret && !(c->flags & UVM_WIC_COMPLETE_NO_MAP))
		ret = wic_map(space, c->gpu_id, c->va, bytes, c->flags & UVM_WIC_COMPLETE_WRITABLE);
	return ret;
}

/**
 * uvm_wic_complete() - complete wake-ups
 * @space: the space
 * @completions: the wake-ups, run in order
 * @count: how many
 *
 * Process context only. Logs %WIC_FAKEGPU_EVENT_COMPLETE with @count, then runs each wake-up
 * as wic_fill_write() or wic_fill_copy() of its fill (a marker: at the start of each page;
 * with UVM_WIC_COMPLETE_HEADS, word i of @src at the start of page i, a write of 8 bytes each,
 * the rest of the page left alone), counting the bytes written in the space's fill counter
 * (WIC_FAKEGPU_IOC_FILLED), wic_unmap_pages() of its companion and uvm_wic_map() of its run,
 * which log their own events, leaving out the steps its flags and a companion of 0 leave out;
 * a wake-up stops at its first failing step and its @result gets the errno.
 *
 * Return: 0, or -EINVAL for no space or no completion (then no @result is set).
 */
int uvm_wic_complete(struct uvm_wic_space *space, struct uvm_wic_completion *completions,
		     u32 count)
{
	bool stage = false;
	u32 i;

	might_sleep();
	if (IS_ERR_OR_NULL(space) || !completions || !count)
		return -EINVAL;
	/* As the hook: every fill goes through the space's staging page, under its lock. */
	for (i = 0; i < count; i++)
		stage |= !(completions[i].flags & UVM_WIC_COMPLETE_NO_FILL) ||
			 (completions[i].flags & UVM_WIC_COMPLETE_WRITABLE);
	if (stage)
		mutex_lock(&space->stage_lock);
	wic_log_event(WIC_FAKEGPU_EVENT_COMPLETE, WIC_FAKEGPU_GPU_NONE, 0, count, 0);
	for (i = 0; i < count; i++)
		completions[i].result = wic_complete_one(space, &completions[i]);
	if (stage)
		mutex_unlock(&space->stage_lock);
	return 0;
}
EXPORT_SYMBOL_GPL(uvm_wic_complete);

/**
 * uvm_wic_map() - map pages on a fake GPU
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 * @writable: map read-write rather than read-only
 *
 * Process context only. Sets the pages' flags to mapped (and writable when @writable), whatever
 * they were, and logs %WIC_FAKEGPU_EVENT_MAP or %WIC_FAKEGPU_EVENT_MAP_WRITABLE.
 *
 * Return: 0; -ENODEV for a bad @gpu_id; -EOPNOTSUPP for a pre-Volta one; -EINVAL for a bad
 * range; -E2BIG for a range of more
 * than %WIC_FAKEGPU_MAX_PAGES pages; -EXDEV when a page of the range is resident out of
 * @gpu_id's reach (WIC_FAKEGPU_IOC_RESIDE; nothing is mapped or logged); -ENOSPC when the
 * space would have more mapped pages than that, or -ENOMEM (then part of the range may be
 * mapped); the errno WIC_FAKEGPU_IOC_FAIL armed. A writable map holds the space's stage_lock, as
 * the hook's does.
 */
int uvm_wic_map(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len, bool writable)
{
	int ret;

	might_sleep();
	if (IS_ERR_OR_NULL(space))
		return -EINVAL;
	if (writable)
		mutex_lock(&space->stage_lock);
	ret = wic_map(space, gpu_id, va, len, writable);
	if (writable)
		mutex_unlock(&space->stage_lock);
	return ret;
}
EXPORT_SYMBOL_GPL(uvm_wic_map);

/* uvm_wic_map() without the stage_lock: its callers take it where the hook does. */
static int wic_map(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len, bool writable)
{
	unsigned long set = WIC_FAKEGPU_PAGE_MAPPED;
	int ret;

	ret = wic_check_range(space, gpu_id, va, len);
	if (ret)
		return ret;
	if (len >> WIC_FAKEGPU_PAGE_SHIFT > WIC_FAKEGPU_MAX_PAGES)
		return -E2BIG;
	ret = wic_fail_take(space, &space->fail_maps, gpu_id, va, len);
	if (ret)
		return ret;
	if (wic_remote_any(space, gpu_id, va >> WIC_FAKEGPU_PAGE_SHIFT,
			   (va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT))
		return -EXDEV;
	/* As the hook: a writable map (a PAT page) populates, a read-only one refuses. */
	if (wic_remote_any(space, WIC_FAKEGPU_GPU_NONE, va >> WIC_FAKEGPU_PAGE_SHIFT,
			   (va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT)) {
		if (!writable)
			return -ENODATA;
		ret = wic_populate(space, va >> WIC_FAKEGPU_PAGE_SHIFT,
				   (va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT);
		if (ret)
			return ret;
	}
	if (writable)
		set |= WIC_FAKEGPU_PAGE_WRITABLE;
	ret = wic_pages_set(space, gpu_id, va >> WIC_FAKEGPU_PAGE_SHIFT,
			    (va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT, set, ~0UL);
	if (ret)
		return ret;
	wic_log_event(writable ? WIC_FAKEGPU_EVENT_MAP_WRITABLE : WIC_FAKEGPU_EVENT_MAP,
		      gpu_id, va, len, 0);
	return 0;
}

/**
 * uvm_wic_range_managed() - whether a range is managed memory of the space
 * @space: the space
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Process context only. Managed memory is what WIC_FAKEGPU_IOC_MANAGE declared; the rest plays
 * HMM memory (malloc, mmap), which nvidia-uvm's helpers cannot complete faults on.
 *
 * Return: 0 when the declared ranges cover [@va, @va + @len) without a gap, -EMEDIUMTYPE when
 * they do not, -EINVAL for an unaligned, empty or wrapping range.
 */
int uvm_wic_range_managed(struct uvm_wic_space *space, u64 va, u64 len)
{
	might_sleep();
	/* As the hook: a range must end below 2^64. */
	if (IS_ERR_OR_NULL(space) || !len || ((va | len) & (WIC_FAKEGPU_PAGE_SIZE - 1)) ||
	    va + len <= va)
		return -EINVAL;
	return wic_managed_covered(space, va, va + len) ? 0 : -EMEDIUMTYPE;
}
EXPORT_SYMBOL_GPL(uvm_wic_range_managed);

/* Clears @flags of the pages of [va, va + len) on @gpu_id and logs @event. */
static int wic_clear_range(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len,
			   unsigned long flags, u32 event)
{
	int ret;

	might_sleep();
	if (IS_ERR_OR_NULL(space))
		return -EINVAL;
	ret = wic_check_range(space, gpu_id, va, len);
	if (ret)
		return ret;
	wic_pages_clear(space, gpu_id, va >> WIC_FAKEGPU_PAGE_SHIFT,
			(va + (len - 1)) >> WIC_FAKEGPU_PAGE_SHIFT, flags);
	wic_log_event(event, gpu_id, va, len, 0);
	return 0;
}

/**
 * wic_unmap_pages() - unmap pages from a fake GPU
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Process context only. Pages that are not mapped are skipped. Logs %WIC_FAKEGPU_EVENT_UNMAP.
 *
 * Return: 0, -ENODEV for a bad @gpu_id, -EOPNOTSUPP for a pre-Volta one or -EINVAL for a
 * bad range.
 */
static int wic_unmap_pages(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len)
{
	return wic_clear_range(space, gpu_id, va, len, ~0UL, WIC_FAKEGPU_EVENT_UNMAP);
}

/**
 * uvm_wic_revoke_write() - make pages read-only on a fake GPU
 * @space: the space
 * @gpu_id: the GPU
 * @va: page-aligned start
 * @len: page-aligned length
 *
 * Process context only. Mapped pages stay mapped. Logs %WIC_FAKEGPU_EVENT_REVOKE_WRITE.
 *
 * Return: 0, -ENODEV for a bad @gpu_id, -EOPNOTSUPP for a pre-Volta one or -EINVAL for a
 * bad range.
 */
int uvm_wic_revoke_write(struct uvm_wic_space *space, u32 gpu_id, u64 va, u64 len)
{
	return wic_clear_range(space, gpu_id, va, len, WIC_FAKEGPU_PAGE_WRITABLE,
			       WIC_FAKEGPU_EVENT_REVOKE_WRITE);
}
EXPORT_SYMBOL_GPL(uvm_wic_revoke_write);

/**
 * uvm_wic_replay() - replay a fake GPU's stalled faults
 * @gpu_id: the GPU
 *
 * Process context only. Logs %WIC_FAKEGPU_EVENT_REPLAY and replays the GPU's hardware
 * (WIC_FAKEGPU_IOC_WARPS): stalled warps resume or fault again; injected faults are not
 * re-injected.
 *
 * Return: 0 or -ENODEV for a bad @gpu_id.
 */
int uvm_wic_replay(u32 gpu_id)
{
	might_sleep();
	if (!wic_gpu_valid(gpu_id))
		return -ENODEV;
	wic_replay_gpu(gpu_id);
	return 0;
}
EXPORT_SYMBOL_GPL(uvm_wic_replay);

static int __init wic_fakegpu_init(void)
{
	u32 gpu_id;
	int ret;

	BUILD_BUG_ON(sizeof(struct wic_fakegpu_event) != 40);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_inject) != 32);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_events) != 32);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_page_state) != 16);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_gpu_store) != 32);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_warps) != 32);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_preempt) != 24);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_fail) != 16);
	BUILD_BUG_ON(sizeof(struct wic_fakegpu_managed) != 16);
	BUILD_BUG_ON(WIC_FAKEGPU_FAULT_ENTRY_SIZE != UVM_WIC_FAULT_ENTRY_SIZE);
	BUILD_BUG_ON(WIC_FAKEGPU_VERDICT_PASS != UVM_WIC_PASS);
	BUILD_BUG_ON(WIC_FAKEGPU_VERDICT_HOLD != UVM_WIC_HOLD);
	BUILD_BUG_ON(!is_power_of_2(WIC_FAKEGPU_LOG_EVENTS));
	/* Page indices of 64-bit VAs are xarray indices. */
	BUILD_BUG_ON(sizeof(unsigned long) < sizeof(u64));

	for (gpu_id = 0; gpu_id < WIC_FAKEGPU_NR_GPUS; gpu_id++)
		spin_lock_init(&wic_isr_lock[gpu_id]);
	wic_log = vzalloc(array_size(WIC_FAKEGPU_LOG_EVENTS, sizeof(*wic_log)));
	if (!wic_log)
		return -ENOMEM;
	ret = platform_driver_register(&wic_fakegpu_driver);
	if (ret)
		goto free_log;
	wic_fakegpu_pdev = platform_device_register_simple("wic_fakegpu", -1, NULL, 0);
	if (IS_ERR(wic_fakegpu_pdev)) {
		ret = PTR_ERR(wic_fakegpu_pdev);
		goto unregister_driver;
	}
	ret = misc_register(&wic_fakegpu_dev);
	if (ret)
		goto unregister_device;
	return 0;

unregister_device:
	platform_device_unregister(wic_fakegpu_pdev);
unregister_driver:
	platform_driver_unregister(&wic_fakegpu_driver);
free_log:
	vfree(wic_log);
	return ret;
}

static void __exit wic_fakegpu_exit(void)
{
	u32 gpu_id;

	misc_deregister(&wic_fakegpu_dev);
	platform_device_unregister(wic_fakegpu_pdev);
	platform_driver_unregister(&wic_fakegpu_driver);
	cancel_delayed_work_sync(&wic_hw_deferred_work);
	for (gpu_id = 0; gpu_id < WIC_FAKEGPU_NR_GPUS; gpu_id++)
		kfree(wic_hw[gpu_id]);
	if (rcu_access_pointer(wic_ops))
		pr_warn("unloaded with callbacks still installed\n");
	vfree(wic_log);
}

module_init(wic_fakegpu_init);
module_exit(wic_fakegpu_exit);

MODULE_DESCRIPTION("Fake GPU exporting the nvidia-uvm wic hook interface, for tests");
MODULE_LICENSE("GPL");
