// SPDX-License-Identifier: GPL-2.0
/*
 * wic_shim - holds GPU faults on wic pages and executes wicd's commands.
 *
 * nvidia-uvm (with the wic hook) asks wic_shim about every coalesced replayable fault. A fault
 * on a page of a range that wicd registered is held: nvidia-uvm neither services it nor
 * replays for it, and wic_shim copies it into a ring that wicd maps. wicd answers with command
 * batches (completions: data or an error marker, the companion's unmap, the run's map; PAT
 * services; replays) through ioctl() or io_uring,
 * which wic_shim runs with the helpers nvidia-uvm exports. The interface to wicd is
 * ffi/include/wic_abi.h; the one to nvidia-uvm is shim/include/uvm_wic.h.
 *
 * Locking: @wic_active is RCU-protected; classify runs inside the hook's RCU read-side
 * section. Per session, @sem is held for writing by every call that changes spaces or ranges
 * and by the sweeps of the held table (the expiry, a close, the release), and for reading by
 * command batches, so that batches submitted by several threads run at once, each with a
 * group of its own (@groups); @lock (a spinlock, taken by classify in atomic context) guards
 * spaces, ranges, held faults and the ring's head. No nvidia-uvm helper is called under @lock.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/delay.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/hash.h>
#include <linux/hashtable.h>
#include <linux/io_uring.h>
#include <linux/log2.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/poll.h>
#include <linux/rcupdate.h>
#include <linux/rwsem.h>
#include <linux/sched/mm.h>
#include <linux/semaphore.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/suspend.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <asm/unaligned.h>

#include <uvm_wic.h>
#include <wic_abi.h>

#include "wic_hold.h"
#include "wic_validate.h"

/*
 * wicd's commands count pages of WIC_PAGE_SIZE: on a kernel of larger pages (arm64 with 64 KiB
 * pages) each would cover many more pages than wicd meant.
 */
static_assert(PAGE_SIZE == WIC_PAGE_SIZE, "wic_abi.h's pages are 4 KiB: not this kernel's");
/* Every GPU id nvidia-uvm gives fits the ABI's, so a fault's GPU can always be replayed. */
static_assert(WIC_MAX_GPU_ID >= UVM_WIC_MAX_GPU_ID, "nvidia-uvm's GPU ids exceed wic_abi.h's");

static unsigned int ring_entries = 1024;
module_param(ring_entries, uint, 0444);
MODULE_PARM_DESC(ring_entries, "Fault-ring records, a power of two from 256 to 65536");

/*
 * A held replayable fault blocks preemption of its channel, and so the time-slicing of every
 * other channel on that GPU: the module bounds a hold itself, whatever wicd does.
 */
/*
 * 3 s by default: a fault is completed at the latest a quarter of the bound (the expiry
 * work's period) after it, about 3.85 s after it was held with the timers' rounding, below
 * RM's default runlist context-switch timeout (RmEngineContextSwitchTimeoutUs, 0x3fffff
 * ticks of 1.024 us, about 4.29 s), past which RM resets a channel that a held fault keeps
 * from being preempted. wicd refuses channel timeouts not well below the bound (at most
 * 2.25 s with this one). 0 removes the bound: safe only where no other context time-slices
 * with wic's (docs/operations.md).
 */
#define WIC_DEFAULT_MAX_HOLD_MS 3000
static unsigned int max_hold_ms = WIC_DEFAULT_MAX_HOLD_MS;
static int wic_max_hold_set(const char *val, const struct kernel_param *kp);
static const struct kernel_param_ops wic_max_hold_ops = {
	.set = wic_max_hold_set,
	.get = param_get_uint,
};
module_param_cb(max_hold_ms, &wic_max_hold_ops, &max_hold_ms, 0644);
MODULE_PARM_DESC(max_hold_ms, "Longest hold in ms, then completed timed out; 0: no bound");

/*
 * The GPUs suspend: while the system suspends or hibernates (wic_pm_suspending, set by a PM
 * notifier from the prepare notification to the post one), and while this parameter is set,
 * as deploy/wic-sleep.service sets it around NVIDIA's procfs suspend, which its systemd units
 * drive before the kernel's suspend begins. Either way RM preempts every user channel first:
 * nv_suspend_devices() runs nv_preempt_user_channels() before nv_uvm_suspend(), whose
 * uvm_suspend() says "The RM guarantees that all user channels have been preempted before
 * uvm_suspend() is called", and a held replayable fault keeps its channel from being
 * preempted. So either completes every held fault at once (timeout marker), and while either
 * is set a hold lasts until the expiry's next run, WIC_EXPIRE_MIN_PERIOD_MS later at most
 * (wic_hold_bound()): faults are still held, not passed, so that no warp reads a wic page
 * before its data or a marker.
 */
static bool suspending;
static bool wic_pm_suspending;
static int wic_suspending_set(const char *val, const struct kernel_param *kp);
static const struct kernel_param_ops wic_suspending_ops = {
	.set = wic_suspending_set,
	.get = param_get_bool,
};
module_param_cb(suspending, &wic_suspending_ops, &suspending, 0644);
MODULE_PARM_DESC(suspending, "1 while the GPUs suspend: held faults completed, holds kept short");

/*
 * The expiry work runs on its own queue: it waits on nvidia-uvm (locks, TLB invalidates) for as
 * long as a completion takes, which the shared system queue should not.
 */
static struct workqueue_struct *wic_wq;

/* How often, in ms, held faults are checked against max_hold_ms while any is held. */
#define WIC_EXPIRE_MIN_PERIOD_MS 10
#define WIC_EXPIRE_IDLE_PERIOD_MS 1000

#define WIC_HELD_HASH_BITS 12
/* Pages the expiry can hand back to nvidia-uvm at once (struct wic_session.pass_once). */
#define WIC_PASS_ONCE 64
/* Completions run by one uvm_wic_complete() call at most. */
#define WIC_GROUP_MAX 64
/* Held faults one step of a sweep of the held table handles at once (wic_complete_held()). */
#define WIC_COMPLETE_BATCH 16
/*
 * The most commands a batch io_uring issues inline may have (its first issue, with
 * IO_URING_F_NONBLOCK, from the submitting task): such a batch runs without letting the expiry
 * in between its steps (wic_submit_yield() would wait), so it must be short; a longer one runs
 * on io_uring's worker.
 */
#define WIC_INLINE_COMMANDS 16
/* Runs the expiry completed whose late completions are refused (struct wic_session.expired). */
#define WIC_EXPIRED_RUNS 64
/* Sweeps of the held table a session's release makes before it lets the last faults go. */
#define WIC_RELEASE_SWEEPS 4
/* How long the release lets the bottom halves take the faults its replays brought back. */
#define WIC_RELEASE_SETTLE_MS 10

/**
 * struct wic_space_entry - an attached VA space
 * @uvm: the reference taken with uvm_wic_space_get()
 * @ranges: its registered ranges
 * @held_gpus: the GPUs on which a fault of this space got a HOLD verdict, recorded or not;
 *	each is replayed when the space's held faults are completed at detach or release, so
 *	that faults held without a held-table entry (table full) fault again
 * @gone: nvidia-uvm said the space's process is gone (ESRCH), or going away
 *	(wic_space_shutdown()): its faults are passed
 */
struct wic_space_entry {
	struct uvm_wic_space *uvm;
	struct wic_range_list ranges;
	DECLARE_BITMAP(held_gpus, WIC_GPU_BITS);
	bool gone;
};

/**
 * struct wic_held - a held fault, one per (space, GPU, page)
 * @node: in &wic_session.held_hash, or on &wic_session.held_free
 * @va: the page
 * @space_id: its space
 * @gpu_id: the faulting GPU
 * @kind: the kind of range the page is in
 * @held_ns: when it was held (ktime_get_ns(), as the record's @held_ns), or when it may first
 *	have been held without an entry (wic_hold_age())
 * @recorded: wicd was told of it (a ring record); else the next fault on it that finds the
 *	ring with room records it
 * @marked: the &wic_session.close_gen of the wic_complete_held() call that wrote its page's
 *	marker, 0 when none did; read and written only under
 *	&wic_session.sem held for writing (the sweeps)
 * @failed: the &wic_session.close_gen of the sweep that left it held after nvidia-uvm refused
 *	its write or map (WIC_SKIP_FAILED), or that tried its whole run (wic_expire_runs()); 0
 *	when none did; as @marked
 */
struct wic_held {
	struct hlist_node node;
	u64 va;
	u32 space_id;
	u32 gpu_id;
	u32 kind;
	u32 marked;
	u32 failed;
	bool recorded;
	u64 held_ns;
};

/**
 * struct wic_space_index - the attached spaces, sorted by their nvidia-uvm pointer
 * @rcu: frees a replaced index after the classify calls that may read it
 * @nr: entries
 * @entries: the spaces' nvidia-uvm pointers and ids
 *
 * Replaced whole under &wic_session.sem held for writing at attach and detach, read by
 * classify without a lock: a fault of a process wicd does not serve costs a binary search,
 * never the session's spinlock.
 */
struct wic_space_index {
	struct rcu_head rcu;
	u32 nr;
	struct {
		const struct uvm_wic_space *uvm;
		u32 id;
	} entries[WIC_MAX_SPACES];
};

/**
 * struct wic_group - consecutive completions of a batch, run by one uvm_wic_complete() call;
 *	one batch's own while it runs (wic_batch_begin())
 * @bounce: WIC_MAX_WRITE_BYTES of kernel memory for the data of the completions
 * @space_id: their space
 * @nr: completions gathered
 * @bounce_used: bytes of @bounce their data takes
 * @filled: bytes they fill, data, copies and heads: at most WIC_MAX_WRITE_BYTES, so that one
 *	step of a batch (what the expiry may wait for, wic_submit_yield()) is bounded
 * @index: each one's command index in the batch
 * @cmds: the commands
 * @completions: what nvidia-uvm is asked
 */
struct wic_group {
	void *bounce;
	u32 space_id;
	u32 nr;
	size_t bounce_used;
	size_t filled;
	u32 index[WIC_GROUP_MAX];
	struct wic_command cmds[WIC_GROUP_MAX];
	struct uvm_wic_completion completions[WIC_GROUP_MAX];
};

/**
 * struct wic_session - one open /dev/wic: the daemon's view of the module
 * @sem: held for writing by calls that change state and by the sweeps of the held table, for
 *	reading by command batches (the file's header comment)
 * @lock: guards the fields classify reads; taken with interrupts off
 * @negotiated: WIC_IOC_VERSION succeeded
 * @spaces: attached spaces; id = index + 1
 * @index: the attached spaces by nvidia-uvm pointer, for classify (RCU)
 * @nr_ranges: ranges registered over all spaces
 * @next_range_id: the id the next range gets
 * @held_hash: held faults by page
 * @held_free: unused entries of @held_pool
 * @held_pool: WIC_MAX_HELD preallocated entries, so that classify never allocates
 * @nr_held: entries in @held_hash
 * @ring: the mapped fault ring
 * @ring_bytes: its size
 * @poll_wait: woken when a record is published
 * @groups: WIC_MAX_CONCURRENT_BATCHES groups, one for each batch running (wic_batch_begin()),
 *	each with a bounce buffer of WIC_MAX_WRITE_BYTES
 * @groups_busy: which of @groups a batch has taken
 * @groups_free: counts the groups not taken
 * @sweep: the steps one uvm_wic_complete() call of a sweep of the held table runs
 *	(wic_sweep_step()); under @sem held for writing
 * @closing_space: the space whose pages WIC_IOC_UNREGISTER or WIC_IOC_DETACH is closing, 0 when
 *	none is: faults on [@closing_start, @closing_end) of it are held and entered in
 *	@held_hash but not recorded, and that call completes them with the closed marker
 * @closing_start: first byte of the pages being closed
 * @closing_end: one past their last byte
 * @releasing: the session's file is being released: every wic page is closing
 * @draining: the release is ending: classify passes every fault that has no held-table entry
 * @close_gen: counts the sweeps of the held table (wic_complete_held(), wic_expire_runs()),
 *	which mark the entries they handled with it (never 0); under @sem held for writing
 * @pass_once: held faults the expiry released unmapped because nvidia-uvm cannot map their
 *	page on their GPU (-EXDEV), their marker written: the next fault on each is passed, so
 *	that nvidia-uvm services it (moving the page where the GPU reaches it) and the warp reads
 *	the marker, instead of being held and expired again every period; under @lock
 * @nr_pass_once: entries in @pass_once
 * @expired: runs the expiry completed whose WIC_RECORD_EXPIRED record wicd has not read yet
 *	(@seq, U64_MAX when it could not be posted): a completion of such a run that wicd sent
 *	before it read the record is refused, not written into pages warps already read; under
 *	@lock
 * @nr_expired: entries in @expired
 * @clock: the episode of faults held without a held-table entry (table full); under @lock
 * @untabled_gpus: the GPUs of those faults, replayed by the expiry's relief
 *	(wic_hold_relief_due()); under @lock
 * @expire: completes the faults held longer than max_hold_ms; queued by classify when it
 *	holds a fault, it queues itself again while any is held
 * @expire_waiting: how many expiries (the work's, a suspend's) wait for @sem: every batch
 *	lets them in at its next step (wic_submit_yield()); a count, so that the first one in
 *	does not end the wait of the other
 */
struct wic_session {
	struct rw_semaphore sem;
	spinlock_t lock;
	bool negotiated;
	struct wic_space_entry spaces[WIC_MAX_SPACES];
	struct wic_space_index __rcu *index;
	u32 nr_ranges;
	u32 next_range_id;
	DECLARE_HASHTABLE(held_hash, WIC_HELD_HASH_BITS);
	struct hlist_head held_free;
	struct wic_held *held_pool;
	u32 nr_held;
	struct wic_ring_header *ring;
	size_t ring_bytes;
	wait_queue_head_t poll_wait;
	struct wic_group *groups[WIC_MAX_CONCURRENT_BATCHES];
	unsigned long groups_busy;
	struct semaphore groups_free;
	struct uvm_wic_completion sweep[WIC_COMPLETE_BATCH];
	u32 closing_space;
	u64 closing_start;
	u64 closing_end;
	bool releasing;
	bool draining;
	u32 close_gen;
	struct {
		u64 va;
		u32 space_id;
		u32 gpu_id;
	} pass_once[WIC_PASS_ONCE];
	u32 nr_pass_once;
	struct {
		u64 seq;
		u64 run;
		u32 pages;
		u32 space_id;
		u32 gpu_id;
	} expired[WIC_EXPIRED_RUNS];
	u32 nr_expired;
	struct wic_hold_clock clock;
	DECLARE_BITMAP(untabled_gpus, WIC_GPU_BITS);
	struct delayed_work expire;
	atomic_t expire_waiting;
};

static struct wic_session __rcu *wic_active;

/*
 * A new bound applies at once: the expiry work of the open session, if any, runs now rather
 * than after the period the old bound gave it (up to a quarter of it, or a second with none).
 */
static int wic_max_hold_set(const char *val, const struct kernel_param *kp)
{
	struct wic_session *s;
	int err = param_set_uint(val, kp);

	if (err)
		return err;
	rcu_read_lock();
	s = rcu_dereference(wic_active);
	/* The release waits for this read side before it cancels the work and frees @s. */
	if (s)
		mod_delayed_work(wic_wq, &s->expire, 0);
	rcu_read_unlock();
	return 0;
}

static DEFINE_MUTEX(wic_active_lock);

static struct wic_fault_record *wic_record(struct wic_session *s, u64 seq)
{
	struct wic_fault_record *records = (void *)s->ring + WIC_RING_RECORDS_OFFSET;

	return &records[seq & (ring_entries - 1)];
}

static u32 wic_held_key(u64 va, u32 space_id, u32 gpu_id)
{
	return hash_64(va ^ ((u64)space_id << 52) ^ ((u64)gpu_id << 58), WIC_HELD_HASH_BITS);
}

static struct wic_held *wic_held_find(struct wic_session *s, u64 va, u32 space_id, u32 gpu_id)
{
	struct wic_held *held;

	hash_for_each_possible(s->held_hash, held, node, wic_held_key(va, space_id, gpu_id))
		if (held->va == va && held->space_id == space_id && held->gpu_id == gpu_id)
			return held;
	return NULL;
}

static void wic_held_release(struct wic_session *s, struct wic_held *held)
{
	hash_del(&held->node);
	hlist_add_head(&held->node, &s->held_free);
	s->nr_held--;
}

/* The id of the attached space @uvm in @index, or 0. */
static u32 wic_index_find(const struct wic_space_index *index, const struct uvm_wic_space *uvm)
{
	u32 lo = 0, hi = index ? index->nr : 0;

	while (lo < hi) {
		u32 mid = lo + (hi - lo) / 2;

		if (index->entries[mid].uvm == uvm)
			return index->entries[mid].id;
		if ((unsigned long)index->entries[mid].uvm < (unsigned long)uvm)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* The id of the attached space @uvm, or 0; under @s->sem. */
static u32 wic_space_id(struct wic_session *s, struct uvm_wic_space *uvm)
{
	u32 i;

	for (i = 0; i < WIC_MAX_SPACES; i++)
		if (s->spaces[i].uvm == uvm)
			return i + 1;
	return 0;
}

/*
 * Publishes @index (zeroed, allocated by the caller before it changed anything) as the index
 * of the attached spaces, after an attach or a detach, under @s->sem held for writing. The
 * entries are few: rebuilt by insertion, in order.
 */
static void wic_index_publish(struct wic_session *s, struct wic_space_index *index)
{
	struct wic_space_index *old;
	u32 i, at;

	for (i = 0; i < WIC_MAX_SPACES; i++) {
		const struct uvm_wic_space *uvm = s->spaces[i].uvm;

		if (!uvm)
			continue;
		for (at = index->nr; at && (unsigned long)index->entries[at - 1].uvm >
					   (unsigned long)uvm; at--)
			index->entries[at] = index->entries[at - 1];
		index->entries[at].uvm = uvm;
		index->entries[at].id = i + 1;
		index->nr++;
	}
	old = rcu_replace_pointer(s->index, index, lockdep_is_held(&s->sem));
	if (old)
		kfree_rcu(old, rcu);
}

/*
 * Forgets the pages of [@start, @end) of @space_id on @gpu_id (0: any GPU) that were to be
 * passed once; under @lock.
 */
static void wic_pass_once_forget(struct wic_session *s, u32 space_id, u32 gpu_id, u64 start,
				 u64 end)
{
	u32 i = 0;

	while (i < s->nr_pass_once) {
		if (s->pass_once[i].space_id == space_id &&
		    (!gpu_id || s->pass_once[i].gpu_id == gpu_id) &&
		    s->pass_once[i].va >= start && s->pass_once[i].va < end)
			s->pass_once[i] = s->pass_once[--s->nr_pass_once];
		else
			i++;
	}
}

/* Forgets the expired runs of @space_id in [@start, @end): the pages are closing; under @lock. */
static void wic_expired_forget(struct wic_session *s, u32 space_id, u64 start, u64 end)
{
	u32 i = 0;

	while (i < s->nr_expired) {
		if (s->expired[i].space_id == space_id && s->expired[i].run >= start &&
		    s->expired[i].run < end)
			s->expired[i] = s->expired[--s->nr_expired];
		else
			i++;
	}
}

/* Whether the next fault on page @va of @gpu_id is to be passed, forgetting it; under @lock. */
static bool wic_pass_once_take(struct wic_session *s, u32 space_id, u32 gpu_id, u64 va)
{
	u32 i;

	for (i = 0; i < s->nr_pass_once; i++) {
		if (s->pass_once[i].va == va && s->pass_once[i].space_id == space_id &&
		    s->pass_once[i].gpu_id == gpu_id) {
			s->pass_once[i] = s->pass_once[--s->nr_pass_once];
			return true;
		}
	}
	return false;
}

/*
 * Publishes a record in the ring, which must have room; under @lock. Its sequence number is
 * written last, then head: a reader that sees either sees the record.
 */
static void wic_ring_post(struct wic_session *s, u32 space_id, u32 gpu_id, u32 range_id,
			  u32 flags, u64 held_ns, const u8 raw[UVM_WIC_FAULT_ENTRY_SIZE])
{
	u64 head = s->ring->head;
	struct wic_fault_record *rec = wic_record(s, head);

	rec->space_id = space_id;
	rec->gpu_id = gpu_id;
	rec->range_id = range_id;
	rec->flags = flags;
	rec->held_ns = held_ns;
	memcpy(rec->entry, raw, sizeof(rec->entry));
	smp_store_release(&rec->seq, head);
	/* Pairs with the daemon's acquire of head: the record is complete before head moves. */
	smp_store_release(&s->ring->head, head + 1);
}

/* Whether the ring has room for one more record; under @lock. */
static bool wic_ring_room(struct wic_session *s)
{
	return s->ring->head - READ_ONCE(s->ring->tail) < ring_entries;
}

/* Takes a free entry for a fault held since @held_ns; under @lock, with one free. */
static struct wic_held *wic_held_enter(struct wic_session *s, const struct uvm_wic_fault *fault,
				       u32 space_id, const struct wic_range_entry *range,
				       u64 held_ns)
{
	struct wic_held *held = hlist_entry(s->held_free.first, struct wic_held, node);

	hlist_del(&held->node);
	held->va = fault->va;
	held->space_id = space_id;
	held->gpu_id = fault->gpu_id;
	held->kind = range->kind;
	held->marked = 0;
	held->failed = 0;
	held->recorded = false;
	held->held_ns = held_ns;
	hash_add(s->held_hash, &held->node, wic_held_key(fault->va, space_id, fault->gpu_id));
	s->nr_held++;
	return held;
}

/* Records @held, the entry of @fault, in the ring, which has room; under @lock. */
static void wic_held_record(struct wic_session *s, struct wic_held *held,
			    const struct uvm_wic_fault *fault, const struct wic_range_entry *range)
{
	wic_ring_post(s, held->space_id, held->gpu_id, range->id,
		      range->kind == WIC_RANGE_PAT ? WIC_RECORD_PAT : 0, held->held_ns, fault->raw);
	held->recorded = true;
}

/* Whether the GPUs suspend (the suspending parameter's comment). */
static bool wic_suspending(void)
{
	return READ_ONCE(suspending) || READ_ONCE(wic_pm_suspending);
}

/* The bound in force, in ns: max_hold_ms, or none at all while the GPUs suspend. */
static u64 wic_bound_ns(void)
{
	return wic_hold_bound((u64)READ_ONCE(max_hold_ms) * NSEC_PER_MSEC, wic_suspending());
}

/* Where the bound in force comes from, for the log. */
static const char *wic_bound_name(void)
{
	return wic_suspending() ? " (GPUs suspending)" : " (max_hold_ms)";
}

/* The period of the expiry work: a quarter of the bound in force, at least 10 ms. */
static unsigned long wic_expire_period(void)
{
	u64 bound_ns = wic_bound_ns();

	if (!bound_ns)
		return msecs_to_jiffies(WIC_EXPIRE_IDLE_PERIOD_MS);
	return nsecs_to_jiffies(max_t(u64, bound_ns / 4, WIC_EXPIRE_MIN_PERIOD_MS * NSEC_PER_MSEC));
}

/*
 * A fault on a GPU wic cannot hold (UVM_WIC_FAULT_UNSUPPORTED: registered in the space after
 * it was attached, which refuses such spaces): nvidia-uvm services it, and on a wic page its
 * warp reads the page without its data. wicd is told once per range, with a record
 * (WIC_RECORD_UNSUPPORTED_GPU), and fails the range's channel; with the ring full the record is
 * counted dropped and posted at the range's next such fault. Under @lock; returns whether the
 * fault was on a wic page wicd had not been told of.
 */
static bool wic_tell_unsupported(struct wic_session *s, u32 space_id,
				 const struct wic_range_entry *range, const struct uvm_wic_fault *fault,
				 const struct wic_hold_facts *facts, u64 now)
{
	/* Written under @lock, as wic_mark_gone() writes @gone. */
	struct wic_range_entry *entry = (struct wic_range_entry *)range;

	if (!facts->wic_page || facts->gone || !facts->gpu_valid || entry->unsupported_told)
		return false;
	if (!wic_ring_room(s)) {
		s->ring->dropped++;
		return true;
	}
	entry->unsupported_told = 1;
	wic_ring_post(s, space_id, fault->gpu_id, range->id, WIC_RECORD_UNSUPPORTED_GPU, now,
		      fault->raw);
	return true;
}

/*
 * Faults held without a held-table entry (the table full), by page. No sweep of the held
 * table finds such a fault, so none writes its page's marker; once the page stops being a wic
 * page (its range unregistered, its space detached, the session gone), the fault comes back at
 * the next replay, is passed, and nvidia-uvm services it: the warp would read the page without
 * its data or its marker. So a PCM range remembers these pages until they are completed, and
 * whatever ends the range writes their marker first (wic_mark_untabled()). A PAT page gets no
 * marker, only a writable map, which nvidia-uvm's service of the passed fault gives it too.
 */

/* Pages of @range: bits of each of its two bitmaps. */
static unsigned long wic_untabled_bits(const struct wic_range_entry *range)
{
	return DIV_ROUND_UP(range->end - range->start, PAGE_SIZE);
}

/* The second bitmap: the pages whose marker the close under way wrote. */
static unsigned long *wic_untabled_marked(const struct wic_range_entry *range)
{
	return range->untabled + BITS_TO_LONGS(wic_untabled_bits(range));
}

/* Gives a PCM range its bitmaps, at registration: no close can then fail for want of memory. */
static int wic_untabled_alloc(struct wic_range_entry *range)
{
	if (range->kind != WIC_RANGE_PCM)
		return 0;
	range->untabled = kvcalloc(2 * BITS_TO_LONGS(wic_untabled_bits(range)),
				   sizeof(*range->untabled), GFP_KERNEL);
	return range->untabled ? 0 : -ENOMEM;
}

/* Frees the bitmaps of the ranges of @entries (@nr) that lie in [@start, @end). */
static void wic_untabled_free(struct wic_range_entry *entries, u32 nr, u64 start, u64 end)
{
	u32 i;

	for (i = 0; i < nr; i++) {
		if (entries[i].start >= start && entries[i].end <= end)
			kvfree(entries[i].untabled);
	}
}

/*
 * The range of @space_id holding @va, to change its bitmaps; under @lock, which every reader
 * and writer of them holds (wic_mark_gone() writes @gone the same way).
 */
static struct wic_range_entry *wic_untabled_range(struct wic_session *s, u32 space_id, u64 va)
{
	struct wic_range_entry *range =
		(struct wic_range_entry *)wic_range_find(&s->spaces[space_id - 1].ranges, va);

	return range && range->untabled ? range : NULL;
}

/* Page @page of @range awaits its marker; under @lock. */
static void wic_untabled_set(struct wic_range_entry *range, unsigned long page)
{
	if (!__test_and_set_bit(page, range->untabled))
		range->untabled_pending++;
}

/*
 * A fault on @va of @range held without an entry; under @lock. A page whose marker the close
 * under way wrote needs nothing more.
 */
static void wic_untabled_note(struct wic_range_entry *range, u64 va)
{
	unsigned long page = (va - range->start) >> PAGE_SHIFT;

	if (range->untabled && !test_bit(page, wic_untabled_marked(range)))
		wic_untabled_set(range, page);
}

/* [@va, @va + @pages pages) of @space_id were mapped with their data or a marker; under @lock. */
static void wic_untabled_served(struct wic_session *s, u32 space_id, u64 va, u32 pages)
{
	struct wic_range_entry *range = wic_untabled_range(s, space_id, va);
	unsigned long first, end, page;

	if (!range)
		return;
	first = (va - range->start) >> PAGE_SHIFT;
	end = first + min_t(unsigned long, pages, wic_untabled_bits(range) - first);
	for (page = first; range->untabled_pending &&
	     (page = find_next_bit(range->untabled, end, page)) < end; page++) {
		__clear_bit(page, range->untabled);
		range->untabled_pending--;
	}
	bitmap_clear(wic_untabled_marked(range), first, end - first);
}

/* Whether a page of a range of @space_id inside [@start, @end) awaits its marker; under @lock. */
static bool wic_untabled_any(struct wic_session *s, u32 space_id, u64 start, u64 end)
{
	const struct wic_range_list *ranges = &s->spaces[space_id - 1].ranges;
	u32 i;

	for (i = 0; i < ranges->nr; i++) {
		const struct wic_range_entry *range = &ranges->entries[i];

		if (range->untabled_pending && range->start >= start && range->end <= end)
			return true;
	}
	return false;
}

/*
 * Takes up to WIC_COMPLETE_BATCH pages of the ranges of @space_id inside [@start, @end) that
 * await their marker, notes them written, and fills a marker's write (no map) into @c for
 * each; returns how many. A range with none costs no walk of its bitmap.
 */
static u32 wic_untabled_take(struct wic_session *s, u32 space_id, u64 start, u64 end, u64 marker,
			     struct uvm_wic_completion *c)
{
	struct wic_range_list *ranges = &s->spaces[space_id - 1].ranges;
	unsigned long flags, page;
	u32 i, n = 0;

	spin_lock_irqsave(&s->lock, flags);
	for (i = 0; i < ranges->nr && n < WIC_COMPLETE_BATCH; i++) {
		struct wic_range_entry *range = &ranges->entries[i];
		unsigned long bits = wic_untabled_bits(range);

		if (!range->untabled_pending || range->start < start || range->end > end)
			continue;
		for (page = 0; range->untabled_pending && n < WIC_COMPLETE_BATCH &&
		     (page = find_next_bit(range->untabled, bits, page)) < bits; page++) {
			__clear_bit(page, range->untabled);
			range->untabled_pending--;
			__set_bit(page, wic_untabled_marked(range));
			/* The GPU is not known, nor needed: nothing is mapped. */
			c[n++] = (struct uvm_wic_completion){
				.va = range->start + page * PAGE_SIZE, .pages = 1,
				.marker = marker, .flags = UVM_WIC_COMPLETE_NO_MAP,
			};
		}
	}
	spin_unlock_irqrestore(&s->lock, flags);
	return n;
}

/* The marker's write on @va of @space_id failed: the page awaits it again; under @lock. */
static void wic_untabled_again(struct wic_session *s, u32 space_id, u64 va)
{
	struct wic_range_entry *range = wic_untabled_range(s, space_id, va);
	unsigned long page;

	if (range) {
		page = (va - range->start) >> PAGE_SHIFT;
		__clear_bit(page, wic_untabled_marked(range));
		wic_untabled_set(range, page);
	}
}

/*
 * A close of the ranges of @space_id inside [@start, @end) failed and they stay: the pages whose
 * marker it wrote await theirs again, so that the next close or the release writes it (again)
 * rather than count on a marker a completion may overwrite meanwhile; under @lock.
 */
static void wic_untabled_reopen(struct wic_session *s, u32 space_id, u64 start, u64 end)
{
	struct wic_range_list *ranges = &s->spaces[space_id - 1].ranges;
	unsigned long page;
	u32 i;

	for (i = 0; i < ranges->nr; i++) {
		struct wic_range_entry *range = &ranges->entries[i];
		unsigned long bits = wic_untabled_bits(range);

		if (!range->untabled || range->start < start || range->end > end)
			continue;
		for_each_set_bit(page, wic_untabled_marked(range), bits)
			wic_untabled_set(range, page);
		bitmap_zero(wic_untabled_marked(range), bits);
	}
}

/**
 * wic_classify() - nvidia-uvm's question: hold this fault?
 * @fault: the fault
 *
 * Runs in the fault bottom half inside an RCU read-side section; never sleeps. The rules are
 * wic_hold_classify()'s (wic_hold.h): a fault on a page of a registered PCM or PAT range is
 * held, entered in the held table (whose entries the expiry bounds) and recorded in the ring
 * when it has room; an entry the ring had no room for is recorded when its fault comes back.
 * With the table full the fault is held without an entry, its GPU and age kept for the
 * expiry's relief. A prefetch fault on a wic page is held but neither entered nor recorded. A
 * fault on a page that WIC_IOC_UNREGISTER or WIC_IOC_DETACH is closing is entered but not
 * recorded: wicd is forgetting the range, and that call completes it with the closed marker.
 *
 * Return: UVM_WIC_HOLD for a page of a registered PCM or PAT range, else UVM_WIC_PASS.
 */
static enum uvm_wic_verdict wic_classify(const struct uvm_wic_fault *fault)
{
	struct wic_session *s = rcu_dereference(wic_active);
	struct wic_hold_facts facts = {
		.prefetch = fault->flags & UVM_WIC_FAULT_PREFETCH,
		.gpu_valid = wic_gpu_id_valid(fault->gpu_id),
	};
	enum wic_hold_action action = WIC_HOLD_PASS;
	const struct wic_range_entry *range = NULL;
	bool told = false;
	struct wic_held *held = NULL;
	struct wic_space_entry *space;
	unsigned long flags;
	u32 space_id;
	u64 now;

	if (!s)
		return UVM_WIC_PASS;
	/* Most faults are of processes wicd does not serve: no lock for them. */
	space_id = wic_index_find(rcu_dereference(s->index), fault->space);
	if (!space_id)
		return UVM_WIC_PASS;
	now = ktime_get_ns();
	spin_lock_irqsave(&s->lock, flags);
	space = &s->spaces[space_id - 1];
	/* Detached since the index was read. */
	if (space->uvm != fault->space)
		goto out;
	range = wic_range_find(&space->ranges, fault->va);
	/* A GPU producer's data (a source range): its GPU writes there as usual. */
	facts.wic_page = range && range->kind != WIC_RANGE_SOURCE;
	facts.gone = space->gone || (range && range->gone);
	if (fault->flags & UVM_WIC_FAULT_UNSUPPORTED) {
		told = wic_tell_unsupported(s, space_id, range, fault, &facts, now);
		goto out;
	}
	if (facts.wic_page && !facts.prefetch)
		facts.pass_once = wic_pass_once_take(s, space_id, fault->gpu_id, fault->va);
	if (facts.wic_page && !facts.prefetch && !facts.pass_once && facts.gpu_valid) {
		held = wic_held_find(s, fault->va, space_id, fault->gpu_id);
		facts.entry = !held ? WIC_HOLD_NO_ENTRY :
			      held->recorded ? WIC_HOLD_RECORDED : WIC_HOLD_UNRECORDED;
		facts.draining = s->draining;
		facts.closing = s->releasing || (s->closing_space == space_id &&
						 fault->va >= s->closing_start &&
						 fault->va < s->closing_end);
		facts.ring_room = wic_ring_room(s);
		facts.table_room = !hlist_empty(&s->held_free);
		/* Replayed when the space's faults are completed: held ones come back then. */
		__set_bit(fault->gpu_id, space->held_gpus);
	}
	action = wic_hold_classify(&facts);
	switch (action) {
	case WIC_HOLD_ENTER:
	case WIC_HOLD_ENTER_RECORD:
		held = wic_held_enter(s, fault, space_id, range, wic_hold_age(&s->clock, now));
		if (action == WIC_HOLD_ENTER)
			break;
		fallthrough;
	case WIC_HOLD_RECORD:
		wic_held_record(s, held, fault, range);
		break;
	case WIC_HOLD_UNTABLED:
		wic_hold_untabled(&s->clock, now);
		__set_bit(fault->gpu_id, s->untabled_gpus);
		/* Written under @lock, as wic_mark_gone() writes @gone. */
		wic_untabled_note((struct wic_range_entry *)range, fault->va);
		break;
	default:
		break;
	}
	if (wic_hold_unrecorded(action, &facts))
		s->ring->dropped++;
out:
	spin_unlock_irqrestore(&s->lock, flags);
	/* Already queued (the usual case while faults are held), this does nothing. */
	if (action == WIC_HOLD_ENTER || action == WIC_HOLD_ENTER_RECORD ||
	    action == WIC_HOLD_UNTABLED)
		queue_delayed_work(wic_wq, &s->expire, wic_expire_period());
	if (action == WIC_HOLD_ENTER_RECORD || action == WIC_HOLD_RECORD || told)
		wake_up_interruptible(&s->poll_wait);
	if (told)
		pr_warn_ratelimited("a wic page at %#llx faulted on GPU id %u, which wic cannot hold faults of (pre-Volta, or a MIG partition of this driver): serviced without its data; wicd told (or told at the range's next such fault when its ring is full)\n",
				    fault->va, fault->gpu_id);
	else if (action == WIC_HOLD_INVALID_GPU)
		pr_warn_ratelimited("fault at %#llx of GPU id %u, outside 1 to %u: held, not recorded\n",
				    fault->va, fault->gpu_id, WIC_MAX_GPU_ID);
	return action == WIC_HOLD_PASS ? UVM_WIC_PASS : UVM_WIC_HOLD;
}

/**
 * wic_space_shutdown() - nvidia-uvm's word that a space's process is going away
 * @uvm: the space
 *
 * nvidia-uvm is about to stop the space's channels (uvm_va_space_mm_shutdown(), when the
 * process's UVM mm file is released: an exiting process's files are closed in no fixed order,
 * so wicd may not have heard of it yet), expecting its faults serviced; a held fault would keep its channel from being stopped. The space is
 * marked gone, so that its faults are passed from now, and when it is attached nvidia-uvm
 * replays its GPUs: the held faults come back and are serviced (nothing of the process reads
 * them any more). Their held-table entries stay until a completion or the expiry finds the
 * space gone. Runs inside the hook's RCU read-side section; never sleeps.
 *
 * Return: whether faults of @uvm may be held: the space is attached.
 */
static bool wic_space_shutdown(struct uvm_wic_space *uvm)
{
	struct wic_session *s = rcu_dereference(wic_active);
	struct wic_space_entry *space;
	unsigned long flags;
	bool attached;
	u32 space_id;

	if (!s)
		return false;
	space_id = wic_index_find(rcu_dereference(s->index), uvm);
	if (!space_id)
		return false;
	spin_lock_irqsave(&s->lock, flags);
	space = &s->spaces[space_id - 1];
	attached = space->uvm == uvm;
	if (attached)
		space->gone = true;
	spin_unlock_irqrestore(&s->lock, flags);
	return attached;
}

static const struct uvm_wic_ops wic_ops = {
	.owner = THIS_MODULE,
	.classify = wic_classify,
	.space_shutdown = wic_space_shutdown,
};

/* Whether @held is a fault of @space_id (0: any space) on a page of [@start, @end). */
static bool wic_held_in(const struct wic_held *held, u32 space_id, u64 start, u64 end)
{
	return (!space_id || held->space_id == space_id) && held->va >= start && held->va < end;
}

/*
 * Finds up to WIC_COMPLETE_BATCH held faults of @space_id (0: every space) in [@start, @end),
 * held before @before (ns), whose marker call @gen wrote (@marked) or did not; they stay held.
 * The walk of the held table starts at bucket *@bkt and leaves *@bkt where the next call goes
 * on: a sweep of the table in chunks costs one walk, not one per chunk. The caller changes
 * the entries found (marks or releases them), so a bucket walked again skips them. The entries
 * stay valid while the caller holds @sem for writing: batches, which release held faults too,
 * hold it for reading.
 */
static u32 wic_peek_held(struct wic_session *s, u32 space_id, u64 start, u64 end, u64 before,
			 u32 gen, bool marked, u32 *bkt, struct wic_held **found)
{
	struct wic_held *held;
	unsigned long flags;
	u32 n = 0;

	spin_lock_irqsave(&s->lock, flags);
	for (; *bkt < HASH_SIZE(s->held_hash); (*bkt)++) {
		hlist_for_each_entry(held, &s->held_hash[*bkt], node) {
			if (!wic_held_in(held, space_id, start, end) || held->held_ns >= before ||
			    (held->marked == gen) != marked || held->failed == gen)
				continue;
			found[n] = held;
			/* This bucket may hold more: the next call walks it again. */
			if (++n == WIC_COMPLETE_BATCH)
				goto out;
		}
	}
out:
	spin_unlock_irqrestore(&s->lock, flags);
	return n;
}

/* Whether a fault of @space_id in [@start, @end) is held; under @lock. */
static bool wic_held_any(struct wic_session *s, u32 space_id, u64 start, u64 end)
{
	struct wic_held *held;
	unsigned int bkt;

	if (!s->nr_held)
		return false;
	hash_for_each(s->held_hash, bkt, held, node)
		if (wic_held_in(held, space_id, start, end))
			return true;
	return false;
}

/* Releases a held fault that was completed and adds its GPU to @replay. */
static void wic_held_done(struct wic_session *s, struct wic_held *held, unsigned long *replay,
			  bool served)
{
	unsigned long flags;

	spin_lock_irqsave(&s->lock, flags);
	__set_bit(held->gpu_id, replay);
	if (served)
		wic_untabled_served(s, held->space_id, held->va, 1);
	wic_held_release(s, held);
	spin_unlock_irqrestore(&s->lock, flags);
}

/*
 * Moves the GPUs on which @space_id (0: every space) held faults into @replay; under @lock,
 * so that a fault held before this is in @replay and one held after in the space's bitmap.
 */
static void wic_take_held_gpus(struct wic_session *s, u32 space_id, unsigned long *replay)
{
	u32 i;

	lockdep_assert_held(&s->lock);
	for (i = 0; i < WIC_MAX_SPACES; i++) {
		if (space_id && i != space_id - 1)
			continue;
		bitmap_or(replay, replay, s->spaces[i].held_gpus, WIC_GPU_BITS);
		bitmap_zero(s->spaces[i].held_gpus, WIC_GPU_BITS);
	}
}

/* Whether nvidia-uvm says that the page's process, memory or GPU is gone: no warp reads it. */
static bool wic_page_gone(int err)
{
	return err == -ESRCH || err == -EFAULT || err == -ENODEV;
}

/*
 * After nvidia-uvm said @err completing a fault on page @va of @space_id: a process gone
 * (ESRCH) makes its space gone, memory no longer managed (EFAULT: freed) the page's range, so
 * that their faults are passed from now on instead of held again at every replay; under @lock.
 * EFAULT counts only from a completion of the page alone (a sweep's marker or map): one of
 * wicd's may have it from its copy's source or its companion. A GPU gone from the space
 * (ENODEV) is not remembered: it may come back.
 */
static void wic_mark_gone(struct wic_session *s, u32 space_id, u64 va, int err)
{
	struct wic_space_entry *space = &s->spaces[space_id - 1];
	struct wic_range_entry *range;

	if (err == -ESRCH) {
		space->gone = true;
	} else if (err == -EFAULT) {
		range = (struct wic_range_entry *)wic_range_find(&space->ranges, va);
		if (range)
			range->gone = -err;
	}
}

/* wic_mark_gone() under @lock. */
static void wic_gone(struct wic_session *s, u32 space_id, u64 va, int err)
{
	unsigned long flags;

	spin_lock_irqsave(&s->lock, flags);
	wic_mark_gone(s, space_id, va, err);
	spin_unlock_irqrestore(&s->lock, flags);
}

/**
 * wic_mark_untabled() - write a marker into the pages of faults held without a table entry
 * @s: the session, its @sem held for writing: the ranges stay as they are
 * @space_id: the space, 0 for every space
 * @start: first byte of the ranges concerned
 * @end: one past their last byte
 * @marker: the WIC_MARKER_* word
 * @stop: at a write nvidia-uvm refuses, stop with the page awaiting its marker again (a close,
 *	which fails and is called again), rather than go on without it (the session's release)
 *
 * The pages stay unmapped: which GPU faulted is not known, and the fault, passed once the page
 * is no longer a wic page, has nvidia-uvm map the page where the warp reads the marker. A page
 * whose fault is held with an entry meanwhile is the sweeps' (wic_complete_held()). A page
 * nvidia-uvm says is gone needs no marker: no warp reads it.
 *
 * Return: 0, or with @stop the errno of the first write that failed.
 */
static int wic_mark_untabled(struct wic_session *s, u32 space_id, u64 start, u64 end, u64 marker,
			     bool stop)
{
	struct uvm_wic_completion *c = s->sweep;
	int ret, err, first = 0;
	unsigned long flags;
	u32 id, i, n;

	for (id = 1; id <= WIC_MAX_SPACES; id++) {
		if ((space_id && id != space_id) || !s->spaces[id - 1].uvm)
			continue;
		while (!first && (n = wic_untabled_take(s, id, start, end, marker, c))) {
			ret = uvm_wic_complete(s->spaces[id - 1].uvm, c, n);
			for (i = 0; i < n; i++) {
				err = ret ?: c[i].result;
				if (!err || (!wic_page_gone(err) && !stop))
					continue;
				spin_lock_irqsave(&s->lock, flags);
				if (wic_page_gone(err))
					wic_mark_gone(s, id, c[i].va, err);
				else
					wic_untabled_again(s, id, c[i].va);
				spin_unlock_irqrestore(&s->lock, flags);
				if (!wic_page_gone(err))
					first = first ?: err;
			}
		}
	}
	return first;
}

/**
 * enum wic_on_failure - what wic_complete_held() does when nvidia-uvm refuses a write or a map
 * @WIC_STOP: stop after the step (markers or maps of up to WIC_COMPLETE_BATCH faults) in which
 *	it failed, that fault held and every fault not mapped yet too (unregister, detach: wicd
 *	is told and calls again)
 * @WIC_SKIP_FAILED: leave that fault held and go on with the others (the expiry: one fault
 *	nvidia-uvm keeps refusing must not keep the others from their bound; it is tried again at
 *	the next run)
 * @WIC_RELEASE: release that fault unmapped and go on (the session is released: nobody to
 *	tell; its warp faults again after the replay)
 *
 * Whatever the choice, a fault whose page is gone, or that nvidia-uvm cannot map on its GPU
 * (-EXDEV: its marker is written; once the page is no longer a wic page, or at once for the
 * expiry, whose next fault on that page is passed, the fault comes back and nvidia-uvm
 * services it, migrating the page, as it would any fault), is released unmapped and its GPU
 * replayed.
 */
enum wic_on_failure {
	WIC_STOP,
	WIC_SKIP_FAILED,
	WIC_RELEASE,
};

/*
 * After nvidia-uvm refused a write or a map of the held fault @held with @err, in a sweep
 * (@gen) of wic_complete_held(): releases it unmapped, or leaves it held (keeping the first
 * such errno in *@first), as enum wic_on_failure says. Returns whether the sweep stops there.
 */
static bool wic_complete_failed(struct wic_session *s, struct wic_held *held, int err,
				enum wic_on_failure on_failure, u32 gen, unsigned long *replay,
				int *first)
{
	if (on_failure == WIC_RELEASE || wic_page_gone(err) || err == -EXDEV) {
		unsigned long flags;

		pr_warn_ratelimited("cannot complete held page %#llx: %d\n", held->va, err);
		/* Its page stays a wic page: only passed will the fault reach its marker. */
		spin_lock_irqsave(&s->lock, flags);
		wic_mark_gone(s, held->space_id, held->va, err);
		if (err == -EXDEV && on_failure == WIC_SKIP_FAILED &&
		    s->nr_pass_once < WIC_PASS_ONCE) {
			s->pass_once[s->nr_pass_once].va = held->va;
			s->pass_once[s->nr_pass_once].space_id = held->space_id;
			s->pass_once[s->nr_pass_once].gpu_id = held->gpu_id;
			s->nr_pass_once++;
		}
		spin_unlock_irqrestore(&s->lock, flags);
		/* Released unmapped: only an EXDEV page has its marker (the map failed after it). */
		wic_held_done(s, held, replay, err == -EXDEV);
		return false;
	}
	if (on_failure == WIC_SKIP_FAILED) {
		held->failed = gen;
		*first = *first ?: err;
		return false;
	}
	return true;
}

/*
 * One step of wic_complete_held() for the held faults @found[0..@n): with @map false, @marker
 * written into each PCM page (a PAT page has none to write); with @map true, each page mapped
 * on its fault's GPU (a PAT page writable). Consecutive faults of one space go to nvidia-uvm as
 * one uvm_wic_complete() call. @err[i] gets the errno of @found[i]'s step, 0 when it was done.
 */
static void wic_sweep_step(struct wic_session *s, struct wic_held **found, u32 n, bool map,
			   u64 marker, int *err)
{
	struct uvm_wic_completion *c = s->sweep;
	u32 i, j, k, nr;
	int ret;

	for (i = 0; i < n; i = j) {
		u32 space_id = found[i]->space_id;

		for (j = i, nr = 0; j < n && found[j]->space_id == space_id; j++) {
			bool pat = found[j]->kind == WIC_RANGE_PAT;

			err[j] = 0;
			if (!map && pat)
				continue;
			c[nr++] = (struct uvm_wic_completion){
				.gpu_id = found[j]->gpu_id,
				.pages = 1,
				.va = found[j]->va,
				.marker = marker,
				.flags = !map ? UVM_WIC_COMPLETE_NO_MAP :
					 UVM_WIC_COMPLETE_NO_FILL |
					 (pat ? UVM_WIC_COMPLETE_WRITABLE : 0),
			};
		}
		if (!nr)
			continue;
		ret = uvm_wic_complete(s->spaces[space_id - 1].uvm, c, nr);
		for (k = i, nr = 0; k < j; k++) {
			if (map || found[k]->kind != WIC_RANGE_PAT)
				err[k] = ret ?: c[nr++].result;
		}
	}
}

static void wic_expired_page(struct wic_session *s, const struct wic_held *held);

/**
 * wic_complete_held() - complete held faults without data
 * @s: the session
 * @space_id: the space whose faults to complete, 0 for every space
 * @start: first byte of the pages concerned
 * @end: one past their last byte
 * @before: only faults held before this (ktime_get_ns()), U64_MAX for all
 * @marker: the WIC_MARKER_* word written into each PCM page
 * @replay: the GPUs of the faults completed are added to it, for the caller to replay
 * @on_failure: what a write or map nvidia-uvm refuses does (enum wic_on_failure)
 *
 * Writes @marker into each held PCM page first, then maps each held page (a PAT page
 * writable) and releases its fault, up to WIC_COMPLETE_BATCH faults of a space per
 * uvm_wic_complete() call (wic_sweep_step()); faults held meanwhile are taken along, so that it ends
 * when no fault is held there. A held fault must end this way, never be cancelled: cancelling
 * kills the application's CUDA context. A fault whose page's process, memory or GPU is gone
 * (-ESRCH, -EFAULT or -ENODEV from nvidia-uvm) is released unmapped: no warp can read the page.
 * So is one whose page nvidia-uvm cannot map on that GPU (-EXDEV), its marker written: once
 * the page is no longer a wic page, nvidia-uvm services its fault. Any other failure does what
 * @on_failure says.
 *
 * Return: 0, or the errno of the first write or map that failed and left its fault held: with
 * WIC_STOP every fault not mapped yet stays held too (some with their marker written); those
 * completed stay completed, their GPUs in @replay.
 */
static int wic_complete_held(struct wic_session *s, u32 space_id, u64 start, u64 end,
			     u64 before, u64 marker, unsigned long *replay,
			     enum wic_on_failure on_failure)
{
	struct wic_held *found[WIC_COMPLETE_BATCH];
	int err[WIC_COMPLETE_BATCH], first = 0, stop;
	u32 bkt, gen, i, n;
	bool any, map;

	gen = ++s->close_gen ?: ++s->close_gen;
	/*
	 * Sweeps of the held table, markers then maps, until a sweep finds none: faults held
	 * meanwhile may be in buckets already walked. A page is mapped only once its marker is
	 * in place. Every fault a step found is dealt with, as its own result says, before a
	 * failure that stops the sweep returns.
	 */
	do {
		any = false;
		for (map = false; ; map = true) {
			for (bkt = 0; (n = wic_peek_held(s, space_id, start, end, before, gen, map,
							 &bkt, found)); any = true) {
				wic_sweep_step(s, found, n, map, marker, err);
				for (i = 0, stop = 0; i < n; i++) {
					if (!err[i] && map && on_failure == WIC_SKIP_FAILED &&
					    found[i]->kind == WIC_RANGE_PCM)
						wic_expired_page(s, found[i]);
					if (!err[i] && map)
						wic_held_done(s, found[i], replay, true);
					else if (!err[i])
						found[i]->marked = gen;
					else if (wic_complete_failed(s, found[i], err[i], on_failure,
								     gen, replay, &first))
						stop = stop ?: err[i];
				}
				if (stop)
					return stop;
			}
			if (map)
				break;
		}
	} while (any);
	return first;
}

/**
 * wic_close() - complete the held faults of pages that stop being wic pages, then drop them
 * @s: the session
 * @space_id: the space
 * @start: first byte of the pages that go
 * @end: one past their last byte
 * @ranges: the space's ranges without those pages (NULL when none is left)
 * @nr: entries in @ranges
 * @detach: the space goes: forget the GPUs on which it held faults once they are replayed
 *
 * While it runs the pages are closing: classify still holds faults on them and enters them in
 * the held table without recording them. Every fault held there is completed with
 * WIC_MARKER_CHANNEL_CLOSED (wic_complete_held()), and every page on which a fault was held
 * without a held-table entry (the table full) gets the marker, unmapped (wic_mark_untabled());
 * only once neither is left, under @lock, are the space's ranges replaced by @ranges, so that
 * no fault on those pages is passed before its marker is in place. Then the GPUs of the faults
 * completed are replayed, and every GPU on which the space held a fault, recorded or not: one
 * held without a held-table entry comes back only with a replay.
 *
 * Return: 0, or the errno of the marker's write or map that failed (see wic_complete_held()):
 * then the space's ranges stay registered as they were (no longer closing; a new fault on them
 * is recorded as usual) and so do the faults not completed, so that wicd can call again or
 * the session's release completes them; the GPUs of those completed are replayed.
 */
static int wic_close(struct wic_session *s, u32 space_id, u64 start, u64 end,
		     struct wic_range_entry *ranges, u32 nr, bool detach)
{
	struct wic_space_entry *space = &s->spaces[space_id - 1];
	struct wic_range_entry *old = NULL;
	DECLARE_BITMAP(replay, WIC_GPU_BITS);
	unsigned long flags;
	u32 gpu, old_nr = 0;
	int err;

	bitmap_zero(replay, WIC_GPU_BITS);
	spin_lock_irqsave(&s->lock, flags);
	s->closing_space = space_id;
	s->closing_start = start;
	s->closing_end = end;
	spin_unlock_irqrestore(&s->lock, flags);
	do {
		err = wic_complete_held(s, space_id, start, end, U64_MAX, WIC_MARKER_CHANNEL_CLOSED,
					replay, WIC_STOP);
		if (!err)
			err = wic_mark_untabled(s, space_id, start, end, WIC_MARKER_CHANNEL_CLOSED,
						true);
		spin_lock_irqsave(&s->lock, flags);
		if (!err && !wic_held_any(s, space_id, start, end) &&
		    !wic_untabled_any(s, space_id, start, end)) {
			wic_pass_once_forget(s, space_id, 0, start, end);
			wic_expired_forget(s, space_id, start, end);
			old = space->ranges.entries;
			old_nr = space->ranges.nr;
			s->nr_ranges = s->nr_ranges - space->ranges.nr + nr;
			space->ranges.entries = ranges;
			space->ranges.nr = nr;
			/*
			 * A fault on the pages that go, held without a held-table entry (table
			 * full), comes back only with a replay; which GPU it was on is not known,
			 * so every GPU on which the space held a fault is replayed.
			 */
			if (detach)
				wic_take_held_gpus(s, space_id, replay);
			else
				bitmap_or(replay, replay, space->held_gpus, WIC_GPU_BITS);
			s->closing_space = 0;
		} else if (err) {
			wic_untabled_reopen(s, space_id, start, end);
			s->closing_space = 0;
		}
		spin_unlock_irqrestore(&s->lock, flags);
	} while (s->closing_space);
	wic_untabled_free(old, old_nr, start, end);
	kvfree(old);
	for_each_set_bit(gpu, replay, WIC_GPU_BITS)
		uvm_wic_replay(gpu);
	return err;
}

/*
 * Releases the held faults of [va, va + pages) on @gpu_id; their pages are now mapped, with
 * their data or a marker when @filled (not a companion's late duplicates, nor a page gone).
 * The cheaper of a lookup per page and a walk of the held table is taken, so that the time
 * spent with interrupts off is bounded by WIC_MAX_HELD whatever the command's size.
 */
static void wic_release_held(struct wic_session *s, u32 space_id, u32 gpu_id, u64 va, u32 pages,
			     bool filled)
{
	u64 end = va + (u64)pages * PAGE_SIZE;
	struct wic_held *held;
	struct hlist_node *tmp;
	unsigned long flags;
	unsigned int bkt;
	u32 i;

	spin_lock_irqsave(&s->lock, flags);
	if (pages > s->nr_held) {
		hash_for_each_safe(s->held_hash, bkt, tmp, held, node)
			if (held->space_id == space_id && held->gpu_id == gpu_id &&
			    held->va >= va && held->va < end)
				wic_held_release(s, held);
	} else {
		for (i = 0; i < pages; i++) {
			held = wic_held_find(s, va + (u64)i * PAGE_SIZE, space_id, gpu_id);
			if (held)
				wic_held_release(s, held);
		}
	}
	/* wicd has these pages in hand again: a later fault there waits for its data. */
	wic_pass_once_forget(s, space_id, gpu_id, va, end);
	if (filled)
		wic_untabled_served(s, space_id, va, pages);
	spin_unlock_irqrestore(&s->lock, flags);
}

/**
 * struct wic_run_expiry - a held fault's whole run, as the expiry completes it
 * @space_id: the space
 * @gpu_id: the faulting GPU
 * @range_id: the PCM range, registered with its runs
 * @va: the faulting page
 * @run: the first byte of the page's run
 * @companion: the first byte of the slot's other run
 * @pages: pages of each run
 */
struct wic_run_expiry {
	u32 space_id;
	u32 gpu_id;
	u32 range_id;
	u64 va;
	u64 run;
	u64 companion;
	u32 pages;
};

/*
 * Finds a fault held before @before on a PCM page of a range registered with its runs that
 * this expiry (@gen) has not tried yet, from bucket *@bkt on, marks it tried and fills in its
 * run; under @lock.
 */
static bool wic_find_run_expiry(struct wic_session *s, u64 before, u32 gen, u32 *bkt,
				struct wic_run_expiry *x)
{
	struct wic_held *held;

	for (; *bkt < HASH_SIZE(s->held_hash); (*bkt)++) {
		hlist_for_each_entry(held, &s->held_hash[*bkt], node) {
			const struct wic_range_entry *range;
			u64 run_bytes, index;

			if (held->kind != WIC_RANGE_PCM || held->held_ns >= before ||
			    held->failed == gen)
				continue;
			range = wic_range_find(&s->spaces[held->space_id - 1].ranges, held->va);
			if (!range || !range->run_pages)
				continue;
			run_bytes = (u64)range->run_pages * PAGE_SIZE;
			index = (held->va - range->start) / run_bytes;
			held->failed = gen;
			*x = (struct wic_run_expiry){
				.space_id = held->space_id, .gpu_id = held->gpu_id,
				.range_id = range->id, .va = held->va,
				.run = range->start + index * run_bytes,
				.companion = range->start + (index ^ 1) * run_bytes,
				.pages = range->run_pages,
			};
			return true;
		}
	}
	return false;
}

/* Forgets the expired runs whose record wicd has read; under @lock. */
static void wic_expired_forget_read(struct wic_session *s)
{
	u64 tail = READ_ONCE(s->ring->tail);
	u32 i = 0;

	while (i < s->nr_expired) {
		if (s->expired[i].seq != U64_MAX && s->expired[i].seq < tail)
			s->expired[i] = s->expired[--s->nr_expired];
		else
			i++;
	}
}

/*
 * Remembers @x's run, its record at @seq (U64_MAX: not posted), until wicd read the record;
 * under @lock. With every entry unread, the oldest record's run is forgotten: its late
 * completion, if any, is no longer refused.
 */
static void wic_expired_add(struct wic_session *s, const struct wic_run_expiry *x, u64 seq)
{
	u32 at, i;

	wic_expired_forget_read(s);
	at = s->nr_expired;
	if (at == WIC_EXPIRED_RUNS) {
		/*
		 * Full: the oldest posted run goes, whose record wicd is the likeliest to have read
		 * by now; an entry without a record replaces another without one first, so that
		 * those (which nothing else forgets) never push out a run wicd has yet to read.
		 */
		for (at = 0, i = 1; i < s->nr_expired; i++)
			if (s->expired[i].seq < s->expired[at].seq)
				at = i;
		for (i = 0; seq == U64_MAX && i < s->nr_expired; i++)
			if (s->expired[i].seq == U64_MAX)
				at = i;
	} else {
		s->nr_expired++;
	}
	s->expired[at].seq = seq;
	s->expired[at].run = x->run;
	s->expired[at].pages = x->pages;
	s->expired[at].space_id = x->space_id;
	s->expired[at].gpu_id = x->gpu_id;
}

/*
 * A PCM page of a range registered without runs that the expiry completed, its fault recorded:
 * wicd is not told, so its next completion of the page is the one it meant for the generation
 * whose warp read the timeout marker, and is refused once (ESTALE, an entry with no record:
 * wic_expired_take()), as a run's are until wicd reads the run's record. A fault wicd never
 * heard of (not recorded) gets none: its next completion is for a later generation. In a range
 * with runs a page expires alone only when nvidia-uvm refused its whole run; the run's late
 * completion is then refused the same way, or fails as the expiry's did.
 */
static void wic_expired_page(struct wic_session *s, const struct wic_held *held)
{
	const struct wic_run_expiry x = {
		.space_id = held->space_id, .gpu_id = held->gpu_id, .run = held->va, .pages = 1,
	};
	const struct wic_range_entry *range;
	unsigned long flags;

	if (!held->recorded)
		return;
	spin_lock_irqsave(&s->lock, flags);
	range = wic_range_find(&s->spaces[held->space_id - 1].ranges, held->va);
	if (range && !range->run_pages)
		wic_expired_add(s, &x, U64_MAX);
	spin_unlock_irqrestore(&s->lock, flags);
}

/*
 * Whether @cmd, a completion, is of a run the expiry completed that wicd has not heard of
 * (wic_post_expired()): wicd sent it before it read the expiry's record, for a generation
 * whose warps already read the timeout marker. The run is then forgotten when its record
 * could not be posted: wicd never hears of it, and its next completion is for the next
 * generation. Under @lock.
 */
static bool wic_expired_take(struct wic_session *s, const struct wic_command *cmd)
{
	u64 end = cmd->va + (u64)cmd->pages * PAGE_SIZE;
	u32 i;

	wic_expired_forget_read(s);
	for (i = 0; i < s->nr_expired; i++) {
		if (s->expired[i].space_id != cmd->space_id ||
		    s->expired[i].gpu_id != cmd->gpu_id || s->expired[i].run >= end ||
		    cmd->va >= s->expired[i].run + (u64)s->expired[i].pages * PAGE_SIZE)
			continue;
		if (s->expired[i].seq == U64_MAX)
			s->expired[i] = s->expired[--s->nr_expired];
		return true;
	}
	return false;
}

/*
 * Tells wicd that the expiry completed @x's run (WIC_RECORD_EXPIRED), the entry carrying the
 * faulting page's address; with the ring full wicd is not told, and counted as dropped.
 */
static void wic_post_expired(struct wic_session *s, const struct wic_run_expiry *x)
{
	u8 raw[UVM_WIC_FAULT_ENTRY_SIZE] = {};
	unsigned long flags;
	bool room;

	/* ADDR_LO (DWORD 2, bits 31:12 in place) and ADDR_HI (DWORD 3). */
	put_unaligned_le32(lower_32_bits(x->va) & PAGE_MASK, raw + 8);
	put_unaligned_le32(upper_32_bits(x->va), raw + 12);
	spin_lock_irqsave(&s->lock, flags);
	room = wic_ring_room(s);
	wic_expired_add(s, x, room ? s->ring->head : U64_MAX);
	if (room)
		wic_ring_post(s, x->space_id, x->gpu_id, x->range_id, WIC_RECORD_EXPIRED,
			      ktime_get_ns(), raw);
	else
		s->ring->dropped++;
	spin_unlock_irqrestore(&s->lock, flags);
	wake_up_interruptible(&s->poll_wait);
}

/*
 * The expiry of faults held before @before on PCM pages of ranges registered with their runs:
 * each whole run completed as wicd's timeout would (WIC_MARKER_TIMEOUT at the start of each of
 * its pages, the slot's other run unmapped, the run mapped, by one uvm_wic_complete()), the
 * faults held on both runs released, its GPU added to @replay, and wicd told, so that it moves
 * the slot on instead of taking the next generation's fault for a stale one. A run nvidia-uvm
 * refuses is left to the page-by-page expiry after, which says what fails.
 */
static void wic_expire_runs(struct wic_session *s, u64 before, unsigned long *replay)
{
	u32 gen = ++s->close_gen ?: ++s->close_gen, bkt = 0;
	struct wic_run_expiry x;
	unsigned long flags;
	bool found;
	int err;

	for (;;) {
		struct uvm_wic_completion c;

		spin_lock_irqsave(&s->lock, flags);
		found = wic_find_run_expiry(s, before, gen, &bkt, &x);
		spin_unlock_irqrestore(&s->lock, flags);
		if (!found)
			return;
		c = (struct uvm_wic_completion){
			.gpu_id = x.gpu_id, .pages = x.pages, .va = x.run,
			.companion = x.companion, .marker = WIC_MARKER_TIMEOUT,
		};
		err = uvm_wic_complete(s->spaces[x.space_id - 1].uvm, &c, 1) ?: c.result;
		/*
		 * The record goes first: a fault of the next generation recorded after the held
		 * faults are released must reach wicd after it, or wicd would take it for a
		 * stale one of the generation it still waits for.
		 */
		if (!err)
			wic_post_expired(s, &x);
		if (!err || c.companion_unmapped)
			wic_release_held(s, x.space_id, x.gpu_id, x.companion, x.pages, false);
		if (err)
			continue;
		wic_release_held(s, x.space_id, x.gpu_id, x.run, x.pages, true);
		__set_bit(x.gpu_id, replay);
	}
}

/**
 * wic_expire_held() - complete the faults held longer than the bound
 * @s: the session
 * @all: complete every held fault, whatever its age (the GPUs are about to suspend)
 *
 * A held replayable fault blocks preemption of its channel, so every other context on that
 * GPU (or MIG partition) waits while it is held, and RM may reset the channel when a context
 * switch times out; wicd's channel timeouts bound a hold only while wicd runs its commands.
 * Each fault held longer than max_hold_ms is completed as far as the module knows the slot. In
 * a PCM range registered with its runs, as wicd's timeout would complete it (wic_expire_runs()):
 * WIC_MARKER_TIMEOUT at the start of each page of the run, the slot's other run unmapped, the
 * run mapped, and a WIC_RECORD_EXPIRED record for wicd. Elsewhere (a PAT page, a range without
 * runs) page by page (wic_complete_held()): the marker in its PCM page, the page mapped (a PAT
 * page writable) and the fault released. Then the GPUs are replayed. It runs under @sem held
 * for writing, between the steps of wicd's batches. A write or map that nvidia-uvm refuses
 * leaves its fault held, the others going on, and the next run tries it again. Faults held
 * without an entry (the table full) are bounded too (wic_hold.h): half the bound into such an
 * episode, and at every run after while they keep coming back without an entry, their GPUs
 * are replayed, every entry completed first when none is free, so that they come back, find
 * an entry and carry the episode's age into it; during an episode the work runs every
 * WIC_EXPIRE_MIN_PERIOD_MS.
 * Queued again while any fault is held, and at once when max_hold_ms is written; with
 * max_hold_ms 0 nothing expires. While the GPUs suspend, the bound is the shortest period
 * (wic_hold_bound()).
 */
static void wic_expire_held(struct wic_session *s, bool all)
{
	u64 bound_ns = wic_bound_ns();
	DECLARE_BITMAP(replay, WIC_GPU_BITS);
	u64 now, before, next;
	bool relief, room = true;
	unsigned long flags;
	int err = 0;
	u32 gpu;

	bitmap_zero(replay, WIC_GPU_BITS);
	/* The batches in progress let us in between their steps (wic_submit_yield()). */
	atomic_inc(&s->expire_waiting);
	down_write(&s->sem);
	/*
	 * Fully ordered, as wake_up_var() needs before its look for waiters. Another expiry
	 * still waiting keeps the batches waiting too: it comes next.
	 */
	if (atomic_dec_and_test(&s->expire_waiting))
		wake_up_var(&s->expire_waiting);
	/* After the wait: what is due is what is due now. */
	now = ktime_get_ns();
	spin_lock_irqsave(&s->lock, flags);
	relief = all || wic_hold_relief_due(&s->clock, now, bound_ns);
	if (relief)
		room = !hlist_empty(&s->held_free);
	spin_unlock_irqrestore(&s->lock, flags);
	before = all ? U64_MAX : wic_hold_expire_before(now, bound_ns, !room);
	if (before) {
		wic_expire_runs(s, before, replay);
		err = wic_complete_held(s, 0, 0, U64_MAX, before, WIC_MARKER_TIMEOUT, replay,
					WIC_SKIP_FAILED);
	}
	spin_lock_irqsave(&s->lock, flags);
	/* From now, not from the run's start: the faults come back after the replays below. */
	now = ktime_get_ns();
	if (relief) {
		bitmap_or(replay, replay, s->untabled_gpus, WIC_GPU_BITS);
		bitmap_zero(s->untabled_gpus, WIC_GPU_BITS);
		wic_hold_relieved(&s->clock, now);
	}
	next = wic_hold_next_run(&s->clock, now, bound_ns, s->nr_held,
				 jiffies_to_nsecs(wic_expire_period()),
				 WIC_EXPIRE_MIN_PERIOD_MS * NSEC_PER_MSEC);
	spin_unlock_irqrestore(&s->lock, flags);
	up_write(&s->sem);
	for_each_set_bit(gpu, replay, WIC_GPU_BITS)
		uvm_wic_replay(gpu);
	/* wic_suspend() says what a run for the suspend did. */
	if (!all && relief)
		pr_warn_ratelimited("faults held without a held-table entry (%u entries) for half of the %llu ms bound%s: their GPUs replayed%s\n",
				    WIC_MAX_HELD, bound_ns / NSEC_PER_MSEC, wic_bound_name(),
				    room ? "" : ", every entry completed with the timeout marker");
	else if (!all && !bitmap_empty(replay, WIC_GPU_BITS))
		pr_warn_ratelimited("faults held longer than the %llu ms bound%s completed with the timeout marker\n",
				    bound_ns / NSEC_PER_MSEC, wic_bound_name());
	if (err)
		pr_warn_ratelimited("cannot complete a fault held longer than the %llu ms bound%s: %d; retried\n",
				    bound_ns / NSEC_PER_MSEC, wic_bound_name(), err);
	if (next)
		queue_delayed_work(wic_wq, &s->expire, nsecs_to_jiffies(next));
}

static void wic_expire(struct work_struct *work)
{
	wic_expire_held(container_of(to_delayed_work(work), struct wic_session, expire), false);
}

/*
 * @source (the parameter's flag, or the PM notifier's) says that the GPUs are about to suspend
 * (@on), or have resumed: see the suspending parameter. Every held fault is completed now, and
 * the expiry work runs at once so that its period is the short one. Holding wic_active_lock
 * keeps the session from being released meanwhile.
 */
static void wic_suspend(bool *source, bool on)
{
	struct wic_session *s;

	WRITE_ONCE(*source, on);
	if (!on)
		return;
	mutex_lock(&wic_active_lock);
	s = rcu_dereference_protected(wic_active, lockdep_is_held(&wic_active_lock));
	if (s) {
		wic_expire_held(s, true);
		mod_delayed_work(wic_wq, &s->expire, 0);
		pr_info("GPUs suspending: held faults completed with the timeout marker, holds kept to about %u ms\n",
			WIC_EXPIRE_MIN_PERIOD_MS);
	}
	mutex_unlock(&wic_active_lock);
}

static int wic_suspending_set(const char *val, const struct kernel_param *kp)
{
	bool on;
	int err = kstrtobool(val, &on);

	if (err)
		return err;
	wic_suspend(&suspending, on);
	return 0;
}

static int wic_pm_notify(struct notifier_block *nb, unsigned long event, void *unused)
{
	switch (event) {
	case PM_SUSPEND_PREPARE:
	case PM_HIBERNATION_PREPARE:
	case PM_RESTORE_PREPARE:
		wic_suspend(&wic_pm_suspending, true);
		break;
	case PM_POST_SUSPEND:
	case PM_POST_HIBERNATION:
	case PM_POST_RESTORE:
		wic_suspend(&wic_pm_suspending, false);
		break;
	default:
		break;
	}
	return NOTIFY_DONE;
}

static struct notifier_block wic_pm_notifier = {
	.notifier_call = wic_pm_notify,
};

/* Frees what wic_groups_alloc() allocated, all or part of it. */
static void wic_groups_free(struct wic_session *s)
{
	u32 i;

	for (i = 0; i < WIC_MAX_CONCURRENT_BATCHES; i++) {
		if (s->groups[i])
			kvfree(s->groups[i]->bounce);
		kvfree(s->groups[i]);
	}
}

/* Allocates the groups of the batches that may run at once; -ENOMEM when it cannot. */
static int wic_groups_alloc(struct wic_session *s)
{
	u32 i;

	/* One bit of @groups_busy each. */
	BUILD_BUG_ON(WIC_MAX_CONCURRENT_BATCHES > BITS_PER_LONG);
	for (i = 0; i < WIC_MAX_CONCURRENT_BATCHES; i++) {
		s->groups[i] = kvzalloc(sizeof(*s->groups[i]), GFP_KERNEL);
		if (!s->groups[i])
			return -ENOMEM;
		s->groups[i]->bounce = kvmalloc(WIC_MAX_WRITE_BYTES, GFP_KERNEL);
		if (!s->groups[i]->bounce)
			return -ENOMEM;
	}
	return 0;
}

static int wic_open(struct inode *inode, struct file *file)
{
	struct wic_session *s;
	int err = -ENOMEM;
	u32 i;

	s = kvzalloc(sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	init_rwsem(&s->sem);
	sema_init(&s->groups_free, WIC_MAX_CONCURRENT_BATCHES);
	spin_lock_init(&s->lock);
	hash_init(s->held_hash);
	init_waitqueue_head(&s->poll_wait);
	INIT_DELAYED_WORK(&s->expire, wic_expire);
	s->next_range_id = 1;
	s->held_pool = kvcalloc(WIC_MAX_HELD, sizeof(*s->held_pool), GFP_KERNEL);
	s->ring_bytes = PAGE_ALIGN(WIC_RING_BYTES(ring_entries));
	s->ring = vmalloc_user(s->ring_bytes);
	if (!s->held_pool || !s->ring || wic_groups_alloc(s))
		goto free;
	for (i = 0; i < WIC_MAX_HELD; i++)
		hlist_add_head(&s->held_pool[i].node, &s->held_free);
	s->ring->magic = WIC_RING_MAGIC;
	s->ring->abi_version = WIC_ABI_VERSION;
	s->ring->entries = ring_entries;
	s->ring->record_size = sizeof(struct wic_fault_record);

	mutex_lock(&wic_active_lock);
	if (rcu_access_pointer(wic_active)) {
		mutex_unlock(&wic_active_lock);
		err = -EBUSY;
		goto free;
	}
	rcu_assign_pointer(wic_active, s);
	mutex_unlock(&wic_active_lock);
	file->private_data = s;
	return nonseekable_open(inode, file);

free:
	vfree(s->ring);
	wic_groups_free(s);
	kvfree(s->held_pool);
	kvfree(s);
	return err;
}

static int wic_release(struct inode *inode, struct file *file)
{
	struct wic_session *s = file->private_data;
	DECLARE_BITMAP(replay, WIC_GPU_BITS);
	unsigned long flags;
	u32 gpu, i, sweeps;

	bitmap_zero(replay, WIC_GPU_BITS);
	/*
	 * The session stays published, every wic page closing, until no fault is held: any
	 * replay meanwhile (another process's batch on the GPU suffices) makes the held faults
	 * fault again, and with no session they would be serviced and their warps read the page
	 * before its marker. So classify holds them still (entered, not recorded) and the sweeps
	 * take them along. A fault nvidia-uvm refuses to complete is released unmapped. After a
	 * few sweeps with faults still coming, the release drains: new faults are passed, and
	 * those with an entry get their marker in a last sweep before the session goes.
	 */
	down_write(&s->sem);
	spin_lock_irqsave(&s->lock, flags);
	s->releasing = true;
	spin_unlock_irqrestore(&s->lock, flags);
	for (sweeps = 1; ; sweeps++) {
		wic_complete_held(s, 0, 0, U64_MAX, U64_MAX, WIC_MARKER_DAEMON_GONE, replay,
				  WIC_RELEASE);
		wic_mark_untabled(s, 0, 0, U64_MAX, WIC_MARKER_DAEMON_GONE, false);
		spin_lock_irqsave(&s->lock, flags);
		wic_take_held_gpus(s, 0, replay);
		bitmap_or(replay, replay, s->untabled_gpus, WIC_GPU_BITS);
		bitmap_zero(s->untabled_gpus, WIC_GPU_BITS);
		s->draining = (!s->nr_held && bitmap_empty(replay, WIC_GPU_BITS)) ||
			      sweeps == WIC_RELEASE_SWEEPS;
		spin_unlock_irqrestore(&s->lock, flags);
		if (s->draining)
			break;
		/*
		 * Still published: the completed warps resume, and faults held without an entry
		 * (the table full) come back, are held and entered, and the next sweep completes
		 * them once the bottom halves have had them.
		 */
		for_each_set_bit(gpu, replay, WIC_GPU_BITS)
			uvm_wic_replay(gpu);
		bitmap_zero(replay, WIC_GPU_BITS);
		msleep(WIC_RELEASE_SETTLE_MS);
	}
	/*
	 * Draining: no fault takes an entry any more; the last ones get their marker now, and so
	 * do the pages of faults held without an entry since the last sweep.
	 */
	wic_complete_held(s, 0, 0, U64_MAX, U64_MAX, WIC_MARKER_DAEMON_GONE, replay, WIC_RELEASE);
	wic_mark_untabled(s, 0, 0, U64_MAX, WIC_MARKER_DAEMON_GONE, false);
	up_write(&s->sem);
	mutex_lock(&wic_active_lock);
	RCU_INIT_POINTER(wic_active, NULL);
	mutex_unlock(&wic_active_lock);
	/* No classify sees @s after this. */
	synchronize_rcu();
	/* Nothing queues the expiry work again: only classify and the work itself do. */
	cancel_delayed_work_sync(&s->expire);
	spin_lock_irqsave(&s->lock, flags);
	wic_take_held_gpus(s, 0, replay);
	spin_unlock_irqrestore(&s->lock, flags);
	for_each_set_bit(gpu, replay, WIC_GPU_BITS)
		uvm_wic_replay(gpu);
	for (i = 0; i < WIC_MAX_SPACES; i++) {
		if (s->spaces[i].uvm)
			uvm_wic_space_put(s->spaces[i].uvm);
		wic_untabled_free(s->spaces[i].ranges.entries, s->spaces[i].ranges.nr, 0, U64_MAX);
		kvfree(s->spaces[i].ranges.entries);
	}
	/* synchronize_rcu() above: no classify reads it any more. */
	kfree(rcu_dereference_protected(s->index, true));
	vfree(s->ring);
	wic_groups_free(s);
	kvfree(s->held_pool);
	kvfree(s);
	return 0;
}

static long wic_version(struct wic_session *s, struct wic_version __user *uarg)
{
	struct wic_version v;
	u32 theirs;

	if (copy_from_user(&v, uarg, sizeof(v)))
		return -EFAULT;
	theirs = v.abi_version;
	v.abi_version = WIC_ABI_VERSION;
	v.ring_entries = ring_entries;
	v.max_spaces = WIC_MAX_SPACES;
	v.max_ranges = WIC_MAX_RANGES;
	v.max_held = WIC_MAX_HELD;
	v.max_commands = WIC_MAX_COMMANDS;
	if (copy_to_user(uarg, &v, sizeof(v)))
		return -EFAULT;
	if (theirs != WIC_ABI_VERSION)
		return -EPROTONOSUPPORT;
	s->negotiated = true;
	return 0;
}

static long wic_attach(struct wic_session *s, struct wic_attach __user *uarg)
{
	struct wic_space_index *index;
	struct uvm_wic_space *uvm;
	struct wic_attach a;
	unsigned long flags;
	struct file *file;
	u32 i, id = 0;

	if (copy_from_user(&a, uarg, sizeof(a)))
		return -EFAULT;
	if (a.space_id)
		return -EINVAL;
	file = fget(a.uvm_fd);
	if (!file)
		return -EBADF;
	uvm = uvm_wic_space_get(file);
	fput(file);
	if (IS_ERR(uvm))
		return PTR_ERR(uvm);
	if (wic_space_id(s, uvm)) {
		uvm_wic_space_put(uvm);
		return -EEXIST;
	}
	for (i = 0; i < WIC_MAX_SPACES && !id; i++)
		if (!s->spaces[i].uvm)
			id = i + 1;
	if (!id) {
		uvm_wic_space_put(uvm);
		return -ENOSPC;
	}
	index = kzalloc(sizeof(*index), GFP_KERNEL);
	if (!index) {
		uvm_wic_space_put(uvm);
		return -ENOMEM;
	}
	spin_lock_irqsave(&s->lock, flags);
	s->spaces[id - 1].uvm = uvm;
	s->spaces[id - 1].gone = false;
	spin_unlock_irqrestore(&s->lock, flags);
	wic_index_publish(s, index);
	a.space_id = id;
	return copy_to_user(uarg, &a, sizeof(a)) ? -EFAULT : 0;
}

static struct wic_space_entry *wic_space(struct wic_session *s, u32 space_id)
{
	if (!wic_space_id_valid(space_id) || !s->spaces[space_id - 1].uvm)
		return NULL;
	return &s->spaces[space_id - 1];
}

/* Replaces @space's ranges with @ranges (@nr of them) and frees the old array. */
static void wic_swap_ranges(struct wic_session *s, struct wic_space_entry *space,
			    struct wic_range_entry *ranges, u32 nr)
{
	struct wic_range_entry *old;
	unsigned long flags;

	spin_lock_irqsave(&s->lock, flags);
	old = space->ranges.entries;
	s->nr_ranges = s->nr_ranges - space->ranges.nr + nr;
	space->ranges.entries = ranges;
	space->ranges.nr = nr;
	spin_unlock_irqrestore(&s->lock, flags);
	kvfree(old);
}

/**
 * wic_detach() - WIC_IOC_DETACH: complete a space's held faults, then forget the space
 * @s: the session
 * @uarg: the space's id
 *
 * Return: 0; -EFAULT for a bad @uarg; -ENOENT when no space has the id; or the errno of a
 * closed marker's write or map that nvidia-uvm refused (wic_close()): the space stays attached
 * with its ranges and the held faults not completed yet.
 */
static long wic_detach(struct wic_session *s, u32 __user *uarg)
{
	struct wic_space_index *index;
	struct wic_space_entry *space;
	struct uvm_wic_space *uvm;
	unsigned long flags;
	u32 space_id;
	int err;

	if (get_user(space_id, uarg))
		return -EFAULT;
	space = wic_space(s, space_id);
	if (!space)
		return -ENOENT;
	index = kzalloc(sizeof(*index), GFP_KERNEL);
	if (!index)
		return -ENOMEM;
	err = wic_close(s, space_id, 0, U64_MAX, NULL, 0, true);
	if (err) {
		kfree(index);
		return err;
	}
	spin_lock_irqsave(&s->lock, flags);
	uvm = space->uvm;
	space->uvm = NULL;
	spin_unlock_irqrestore(&s->lock, flags);
	/* A classify still reading the old index only compares @uvm, and finds it detached. */
	wic_index_publish(s, index);
	uvm_wic_space_put(uvm);
	return 0;
}

/* The end of the VMA of @mm holding @addr, or 0; under the mmap lock. */
static u64 wic_vma_end(void *mm, u64 addr)
{
	struct vm_area_struct *vma = vma_lookup(mm, addr);

	return vma ? vma->vm_end : 0;
}

/* Whether [start, end) lies entirely inside mappings of the process @uvm belongs to. */
static bool wic_inside_mm(void *uvm, u64 start, u64 end)
{
	struct mm_struct *mm = uvm_wic_space_mm(uvm);
	bool inside;

	if (!mmget_not_zero(mm))
		return false;
	mmap_read_lock(mm);
	inside = wic_range_covered(start, end, wic_vma_end, mm);
	mmap_read_unlock(mm);
	mmput(mm);
	return inside;
}

static long wic_register(struct wic_session *s, struct wic_range __user *uarg)
{
	struct wic_range_entry *ranges, entry;
	struct wic_space_entry *space;
	struct wic_range r;
	u64 end;
	u32 at;
	int err;

	if (copy_from_user(&r, uarg, sizeof(r)))
		return -EFAULT;
	space = wic_space(s, r.space_id);
	err = wic_check_register(&r, space ? &space->ranges : NULL, s->nr_ranges, wic_inside_mm,
				 space ? space->uvm : NULL, &end, &at);
	if (err)
		return err;
	/*
	 * nvidia-uvm completes faults on managed memory only: one held on any other page (HMM:
	 * malloc, mmap) could never be completed.
	 */
	err = uvm_wic_range_managed(space->uvm, r.start, r.length);
	if (err)
		return err;
	ranges = kvmalloc_array(space->ranges.nr + 1, sizeof(*ranges), GFP_KERNEL);
	if (!ranges)
		return -ENOMEM;
	r.range_id = s->next_range_id++;
	if (!s->next_range_id)
		s->next_range_id = 1;
	entry = (struct wic_range_entry){
		.start = r.start, .end = end, .id = r.range_id, .kind = r.kind,
		.run_pages = r.run_pages,
	};
	err = wic_untabled_alloc(&entry);
	if (err) {
		kvfree(ranges);
		return err;
	}
	wic_ranges_insert(ranges, &space->ranges, at, &entry);
	wic_swap_ranges(s, space, ranges, space->ranges.nr + 1);
	return copy_to_user(uarg, &r, sizeof(r)) ? -EFAULT : 0;
}

/**
 * wic_unregister() - WIC_IOC_UNREGISTER: complete a range's held faults, then forget the range
 * @s: the session
 * @uarg: the range's id
 *
 * Return: 0; -EFAULT for a bad @uarg; -ENOENT when no range has the id; -ENOMEM; or the errno
 * of a closed marker's write or map that nvidia-uvm refused (wic_close()): the range stays
 * registered with the held faults not completed yet.
 */
static long wic_unregister(struct wic_session *s, u32 __user *uarg)
{
	struct wic_range_entry *ranges, gone;
	struct wic_space_entry *space;
	u32 range_id, i, nr;
	int at, err;

	if (get_user(range_id, uarg))
		return -EFAULT;
	for (i = 0; i < WIC_MAX_SPACES; i++) {
		space = &s->spaces[i];
		at = wic_range_index(&space->ranges, range_id);
		if (at >= 0)
			goto found;
	}
	return -ENOENT;
found:
	nr = space->ranges.nr - 1;
	gone = space->ranges.entries[at];
	ranges = NULL;
	if (nr) {
		ranges = kvmalloc_array(nr, sizeof(*ranges), GFP_KERNEL);
		if (!ranges)
			return -ENOMEM;
		wic_ranges_remove(ranges, &space->ranges, at);
	}
	err = wic_close(s, i + 1, gone.start, gone.end, ranges, nr, false);
	if (err)
		kvfree(ranges);
	return err;
}

/* Maps @cmd's PAT page writable and, once it is mapped, releases the fault held on it. */
static int wic_service_pat(struct wic_session *s, struct uvm_wic_space *uvm,
			   const struct wic_command *cmd)
{
	int err = uvm_wic_map(uvm, cmd->gpu_id, cmd->va, (u64)cmd->pages * PAGE_SIZE, true);

	if (!err)
		wic_release_held(s, cmd->space_id, cmd->gpu_id, cmd->va, cmd->pages, true);
	return err;
}

/* Runs a command other than a completion that wic_check_command() accepted. */
static int wic_run_command(struct wic_session *s, struct wic_space_entry *space,
			   const struct wic_command *cmd)
{
	u64 bytes = (u64)cmd->pages * PAGE_SIZE;

	switch (cmd->opcode) {
	case WIC_CMD_REPLAY:
		return uvm_wic_replay(cmd->gpu_id);
	case WIC_CMD_REARM_PAT:
		return uvm_wic_revoke_write(space->uvm, cmd->gpu_id, cmd->va, bytes);
	default: /* WIC_CMD_SERVICE_PAT; completions go through wic_group_add() */
		return wic_service_pat(s, space->uvm, cmd);
	}
}

/*
 * Runs the gathered completions with one uvm_wic_complete() call, releases the held faults of
 * what each one did (its companion unmapped, its run mapped) and stores every result. Returns
 * how many succeeded; *@unstored is set when a result could not be stored.
 */
static long wic_group_run(struct wic_session *s, struct wic_group *g,
			  struct wic_command __user *ucmds, bool *unstored)
{
	struct wic_space_entry *space = wic_space(s, g->space_id);
	long done = 0;
	int ret;
	u32 i;

	if (!g->nr)
		return 0;
	ret = uvm_wic_complete(space->uvm, g->completions, g->nr);
	for (i = 0; i < g->nr; i++) {
		const struct uvm_wic_completion *c = &g->completions[i];
		const struct wic_command *cmd = &g->cmds[i];
		int result = ret ? ret : c->result;

		/*
		 * The companion's held faults are late duplicates of a generation already
		 * completed: once it is unmapped they go, even when the map after failed, or one
		 * would hide the next real fault on its page.
		 */
		if (!ret && c->companion_unmapped)
			wic_release_held(s, g->space_id, cmd->gpu_id, cmd->companion, cmd->pages,
					 false);
		if (!result) {
			wic_release_held(s, g->space_id, cmd->gpu_id, cmd->va, cmd->pages, true);
			done++;
		} else if (result == -ESRCH) {
			/* The process is gone: its faults go, passed when they return. */
			wic_gone(s, g->space_id, cmd->va, result);
			wic_release_held(s, g->space_id, cmd->gpu_id, cmd->va, cmd->pages, false);
		}
		if (put_user(result, &ucmds[g->index[i]].result))
			*unstored = true;
	}
	g->nr = 0;
	g->bounce_used = 0;
	g->filled = 0;
	return done;
}

/*
 * Adds a checked completion to the group, which must have room for it and be of its space:
 * a WIC_CMD_COMPLETE's data, or a WIC_CMD_COMPLETE_HEADS' head words, are copied into the
 * bounce buffer now.
 */
static int wic_group_add(struct wic_group *g, const struct wic_command *cmd, u32 index)
{
	struct uvm_wic_completion *c = &g->completions[g->nr];
	bool copy = cmd->opcode == WIC_CMD_COMPLETE_COPY;

	*c = (struct uvm_wic_completion){
		.gpu_id = cmd->gpu_id,
		.pages = cmd->pages,
		.va = cmd->va,
		.companion = cmd->companion,
		.length = cmd->length,
		/* Only the heads: the application wrote the rest of each page itself. */
		.flags = cmd->opcode == WIC_CMD_COMPLETE_HEADS ? UVM_WIC_COMPLETE_HEADS : 0,
	};
	if (copy) {
		c->src_va = cmd->arg;
	} else if (cmd->length) {
		c->src = g->bounce + g->bounce_used;
		if (copy_from_user(g->bounce + g->bounce_used, u64_to_user_ptr(cmd->arg),
				   cmd->length))
			return -EFAULT;
		g->bounce_used += cmd->length;
	} else {
		c->marker = cmd->arg;
	}
	g->filled += cmd->length;
	g->space_id = cmd->space_id;
	g->index[g->nr] = index;
	g->cmds[g->nr++] = *cmd;
	return 0;
}

/* Whether @cmd, a checked completion, can join the group without running it first. */
static bool wic_group_fits(const struct wic_group *g, const struct wic_command *cmd)
{
	/* The data it copies into the bounce buffer is part of what it fills. */
	return !g->nr || (g->space_id == cmd->space_id && g->nr < WIC_GROUP_MAX &&
			  g->filled + cmd->length <= WIC_MAX_WRITE_BYTES);
}

/* wic_expired_take() under @lock. */
static bool wic_expired_late(struct wic_session *s, const struct wic_command *cmd)
{
	unsigned long flags;
	bool late;

	spin_lock_irqsave(&s->lock, flags);
	late = s->nr_expired && wic_expired_take(s, cmd);
	spin_unlock_irqrestore(&s->lock, flags);
	return late;
}

/*
 * Between two steps of a batch (no completion gathered), lets the expiry in when it waits for
 * @sem: a batch may hold @sem for long (up to WIC_MAX_COMMANDS commands, each up to a megabyte
 * to fill or copy), and a held fault must not wait past max_hold_ms for it, nor its GPU's
 * other contexts past RM's context-switch timeout. With several batches running, the expiry
 * gets @sem once each of them is between two steps, as each one then waits here: it waits for
 * at most one step of each (one after another when they fill one space). A batch goes
 * on once no expiry waits any more; other calls may run meanwhile too, and each later command
 * is checked against the ranges as they are then.
 */
static void wic_submit_yield(struct wic_session *s)
{
	if (!atomic_read(&s->expire_waiting))
		return;
	up_read(&s->sem);
	wait_var_event(&s->expire_waiting, !atomic_read(&s->expire_waiting));
	down_read(&s->sem);
}

/*
 * Begins a batch, one of those that may run at once: takes a free group for it, then @sem for
 * reading. The group comes first, and goes last (wic_batch_end()): a batch waiting for a group
 * holds nothing an expiry waits for, while the batches that hold the groups let the expiry in
 * (wic_submit_yield()) and end. @nonblock (io_uring's inline issue) waits for neither.
 *
 * Return: the batch's group; ERR_PTR(-EAGAIN) when @nonblock would have waited,
 * ERR_PTR(-EINTR) when the caller was killed while it waited for a group.
 */
static struct wic_group *wic_batch_begin(struct wic_session *s, bool nonblock)
{
	u32 i;

	if (nonblock ? down_trylock(&s->groups_free) : down_killable(&s->groups_free))
		return ERR_PTR(nonblock ? -EAGAIN : -EINTR);
	/* The count says one is free: a bit is clear, and stays so for this caller alone. */
	for (i = 0; test_and_set_bit_lock(i, &s->groups_busy); i++)
		;
	if (!nonblock) {
		down_read(&s->sem);
	} else if (!down_read_trylock(&s->sem)) {
		clear_bit_unlock(i, &s->groups_busy);
		up(&s->groups_free);
		return ERR_PTR(-EAGAIN);
	}
	return s->groups[i];
}

/* Ends a batch that wic_batch_begin() began with @g. */
static void wic_batch_end(struct wic_session *s, struct wic_group *g)
{
	u32 i;

	up_read(&s->sem);
	for (i = 0; s->groups[i] != g; i++)
		;
	clear_bit_unlock(i, &s->groups_busy);
	up(&s->groups_free);
}

/*
 * Runs a batch; the one path behind WIC_IOC_SUBMIT and io_uring. Returns how many commands
 * succeeded, or a negative errno when the batch was refused before any ran. Consecutive
 * completions of one space run together, by one uvm_wic_complete() call (one acquisition of
 * nvidia-uvm's locks and one wait for the TLB invalidates instead of three per completion),
 * before any other command that follows them, so the order of effects is the batch's. A
 * command that cannot be read, or a result that cannot be stored, ends the batch once what
 * was gathered before runs; what succeeded is counted whether or not its result was stored,
 * unless that was the first command (EFAULT, as wic_abi.h says).
 */
static long wic_submit(struct wic_session *s, struct wic_group *g, const struct wic_submit *sub,
		       bool may_yield)
{
	struct wic_command __user *ucmds = u64_to_user_ptr(sub->commands);
	struct wic_command cmd;
	bool unstored = false;
	long done = 0;
	int err;
	u32 i;

	err = wic_check_submit(sub);
	if (err)
		return err;
	for (i = 0; i < sub->count && !unstored; i++) {
		struct wic_space_entry *space;
		bool completion;

		if (copy_from_user(&cmd, &ucmds[i], sizeof(cmd)))
			break;
		completion = cmd.opcode == WIC_CMD_COMPLETE ||
			     cmd.opcode == WIC_CMD_COMPLETE_COPY ||
			     cmd.opcode == WIC_CMD_COMPLETE_HEADS;
		/* The end of a step: the completions gathered run before this command. */
		if (!completion || !wic_group_fits(g, &cmd)) {
			done += wic_group_run(s, g, ucmds, &unstored);
			if (unstored)
				break;
		}
		/* Between two steps; this command is checked after, against the ranges then. */
		if (!g->nr && may_yield)
			wic_submit_yield(s);
		space = wic_space(s, cmd.space_id);
		cmd.result = wic_check_command(&cmd, space ? &space->ranges : NULL);
		if (!cmd.result && completion && wic_expired_late(s, &cmd))
			cmd.result = -ESTALE;
		if (!cmd.result && completion) {
			cmd.result = wic_group_add(g, &cmd, i);
			if (!cmd.result)
				continue;
		} else if (!cmd.result) {
			cmd.result = wic_run_command(s, space, &cmd);
		}
		if (!cmd.result)
			done++;
		if (put_user(cmd.result, &ucmds[i].result))
			unstored = true;
	}
	done += wic_group_run(s, g, ucmds, &unstored);
	/* The first command could not be read, or answered: wic_abi.h's EFAULT. */
	if (i == 0 || (i == 1 && unstored))
		return -EFAULT;
	return done;
}

static long wic_ioctl(struct file *file, unsigned int op, unsigned long arg)
{
	struct wic_session *s = file->private_data;
	void __user *uarg = (void __user *)arg;
	struct wic_submit sub;
	struct wic_group *g;
	long ret;

	if (op == WIC_IOC_SUBMIT) {
		g = wic_batch_begin(s, false);
		if (IS_ERR(g))
			return PTR_ERR(g);
		if (!s->negotiated)
			ret = -EPROTO;
		else
			ret = copy_from_user(&sub, uarg, sizeof(sub)) ? -EFAULT :
			      wic_submit(s, g, &sub, true);
		wic_batch_end(s, g);
		return ret;
	}
	down_write(&s->sem);
	if (op == WIC_IOC_VERSION) {
		ret = wic_version(s, uarg);
		goto out;
	}
	ret = -EPROTO;
	if (!s->negotiated)
		goto out;
	switch (op) {
	case WIC_IOC_ATTACH:
		ret = wic_attach(s, uarg);
		break;
	case WIC_IOC_DETACH:
		ret = wic_detach(s, uarg);
		break;
	case WIC_IOC_REGISTER:
		ret = wic_register(s, uarg);
		break;
	case WIC_IOC_UNREGISTER:
		ret = wic_unregister(s, uarg);
		break;
	default:
		ret = -ENOTTY;
	}
out:
	up_write(&s->sem);
	return ret;
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
#define wic_uring_payload(ioucmd) io_uring_sqe_cmd((ioucmd)->sqe)
#else
#define wic_uring_payload(ioucmd) ((ioucmd)->cmd)
#endif

/* IORING_OP_URING_CMD: cmd_op WIC_IOC_SUBMIT, a struct wic_submit in the command area. */
static int wic_uring_cmd(struct io_uring_cmd *ioucmd, unsigned int issue_flags)
{
	struct wic_session *s = ioucmd->file->private_data;
	struct wic_submit sub;
	struct wic_group *g;
	bool nonblock;
	long ret;

	if (ioucmd->cmd_op != WIC_IOC_SUBMIT)
		return -ENOTTY;
	/* The command area is shared with user space: read it once. */
	memcpy(&sub, wic_uring_payload(ioucmd), sizeof(sub));
	/*
	 * io_uring first issues a command from the submitting task, with IO_URING_F_NONBLOCK,
	 * and runs one that answers -EAGAIN on a worker of its own. A short batch waits on
	 * nvidia-uvm as an ioctl does (its locks, the TLB invalidates), and running it there is
	 * what io_uring is used for; but a free group and the session's @sem, which a call or
	 * the expiry may hold for writing for a whole step, and the expiry's turn between two
	 * steps of a long batch are not waited for there: the submitter (with SQPOLL, every
	 * request of the ring) would wait with them.
	 */
	nonblock = issue_flags & IO_URING_F_NONBLOCK;
	if (nonblock && sub.count > WIC_INLINE_COMMANDS)
		return -EAGAIN;
	g = wic_batch_begin(s, nonblock);
	if (IS_ERR(g))
		return PTR_ERR(g);
	ret = s->negotiated ? wic_submit(s, g, &sub, !nonblock) : -EPROTO;
	wic_batch_end(s, g);
	if (ret < 0)
		return ret;
	/* A count is a success: completed here, so that io_uring does not mark it failed. */
	io_uring_cmd_done(ioucmd, ret, 0, issue_flags);
	return -EIOCBQUEUED;
}

static __poll_t wic_poll(struct file *file, struct poll_table_struct *wait)
{
	struct wic_session *s = file->private_data;

	poll_wait(file, &s->poll_wait, wait);
	/* Pairs with the release in wic_ring_post(). */
	return smp_load_acquire(&s->ring->head) != READ_ONCE(s->ring->tail) ? EPOLLIN | EPOLLRDNORM : 0;
}

static int wic_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct wic_session *s = file->private_data;

	if (!s->negotiated)
		return -EPROTO;
	if (vma->vm_pgoff || vma->vm_end - vma->vm_start != s->ring_bytes)
		return -EINVAL;
	return remap_vmalloc_range(vma, s->ring, 0);
}

static const struct file_operations wic_fops = {
	.owner = THIS_MODULE,
	.open = wic_open,
	.release = wic_release,
	.unlocked_ioctl = wic_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.uring_cmd = wic_uring_cmd,
	.poll = wic_poll,
	.mmap = wic_mmap,
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 12, 0)
	.llseek = no_llseek,
#endif
};

static struct miscdevice wic_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "wic",
	.fops = &wic_fops,
	.mode = 0600,
};

static int __init wic_init(void)
{
	int err;

	if (!is_power_of_2(ring_entries) || ring_entries < 256 || ring_entries > 65536) {
		pr_err("ring_entries=%u is not a power of two from 256 to 65536\n", ring_entries);
		return -EINVAL;
	}
	/*
	 * The hook first: once /dev/wic exists it can be opened, and a failure after that would
	 * free the module under the open file.
	 */
	wic_wq = alloc_workqueue("wic_shim", WQ_UNBOUND, 0);
	if (!wic_wq)
		return -ENOMEM;
	err = uvm_wic_register(&wic_ops);
	if (err) {
		pr_err("cannot register with nvidia-uvm: %d\n", err);
		destroy_workqueue(wic_wq);
		return err;
	}
	err = register_pm_notifier(&wic_pm_notifier);
	if (err) {
		uvm_wic_unregister(&wic_ops);
		destroy_workqueue(wic_wq);
		return err;
	}
	err = misc_register(&wic_misc);
	if (err) {
		unregister_pm_notifier(&wic_pm_notifier);
		uvm_wic_unregister(&wic_ops);
		destroy_workqueue(wic_wq);
		return err;
	}
	pr_info("ready: abi %u, %u ring entries, %u held faults at most\n",
		WIC_ABI_VERSION, ring_entries, WIC_MAX_HELD);
	return 0;
}

static void __exit wic_exit(void)
{
	misc_deregister(&wic_misc);
	unregister_pm_notifier(&wic_pm_notifier);
	uvm_wic_unregister(&wic_ops);
	destroy_workqueue(wic_wq);
}

module_init(wic_init);
module_exit(wic_exit);

MODULE_DESCRIPTION("Warp-level interrupts: holds GPU faults on wic pages for wicd");
MODULE_LICENSE("GPL");
