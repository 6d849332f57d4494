/* SPDX-License-Identifier: GPL-2.0 */
/*
 * wic_hold.h - what wic_shim does with a fault, and how long it may hold one: the rules alone,
 * with no kernel call, no lock and no clock (time is an argument).
 *
 * wic_shim.c applies them to its held table, ring and expiry work; the userspace checker
 * (tests/hold/) applies the same functions to a model of the fault buffer, the held table, the
 * ring and a daemon, explores interleavings and asserts that every held fault is completed
 * within the bound and that no fault on a wic page is serviced without its data or a marker.
 *
 * Why holds must be bounded: a held replayable fault blocks preemption of its channel, and so
 * the time-slicing of every other context on that GPU. The expiry work bounds the faults it can
 * find in the held table; a fault held without an entry (the table full) it cannot find, so
 * the rules below never let one wait past the same bound: the GPUs of such faults are replayed
 * early enough (wic_hold_relief_due()) that the fault comes back, finds an entry, and carries
 * its first hold's age (at the latest) into it (wic_hold_age()).
 *
 * u64 and bool come from the includer (the kernel, or the checker's compatibility header).
 */
#ifndef _WIC_HOLD_H
#define _WIC_HOLD_H

/**
 * enum wic_hold_entry - what the held table has for a fault's (space, GPU, page)
 * @WIC_HOLD_NO_ENTRY: nothing: the fault is new, or its last hold was completed
 * @WIC_HOLD_RECORDED: an entry whose fault wicd was told of (a ring record)
 * @WIC_HOLD_UNRECORDED: an entry whose fault was held while the ring was full, or while its
 *	page was closing: wicd was not told
 */
enum wic_hold_entry {
	WIC_HOLD_NO_ENTRY,
	WIC_HOLD_RECORDED,
	WIC_HOLD_UNRECORDED,
};

/**
 * struct wic_hold_facts - what classify knows of a fault
 * @wic_page: it is on a page of a registered PCM or PAT range (a source range's is not)
 * @gone: nvidia-uvm said, completing an earlier fault, that its space's process is gone
 *	(ESRCH) or that its range is no longer managed memory (EFAULT, the memory freed): no
 *	warp of the application reads the page any more, and its faults, held, would be held
 *	again at every replay (nvidia-uvm's teardown flushes and replays expecting them
 *	serviced)
 * @prefetch: every access coalesced into it is a prefetch
 * @pass_once: the expiry released its (space, GPU, page) unmapped, its marker written, because
 *	nvidia-uvm cannot map the page on that GPU: this fault is the warp's, to be serviced once
 * @gpu_valid: its GPU id is one the shim can replay (1 to WIC_MAX_GPU_ID)
 * @closing: its page is in the range WIC_IOC_UNREGISTER or WIC_IOC_DETACH is closing, or the
 *	session is being released
 * @draining: the session's release is ending: a fault with an entry stays held until its
 *	marker is written, a fault without one is passed (the session cannot wait for ever)
 * @entry: what the held table has for it
 * @ring_room: the ring has room for a record
 * @table_room: the held table has a free entry
 */
struct wic_hold_facts {
	bool wic_page;
	bool gone;
	bool prefetch;
	bool pass_once;
	bool gpu_valid;
	bool closing;
	bool draining;
	enum wic_hold_entry entry;
	bool ring_room;
	bool table_room;
};

/**
 * enum wic_hold_action - classify's answer, and what it changes
 * @WIC_HOLD_PASS: not held: nvidia-uvm services the fault
 * @WIC_HOLD_QUIET: held, nothing entered: a prefetch (no warp waits on it and the GPU never
 *	replays it, but serviced it would map the page before its data), or a fault whose entry
 *	has it covered
 * @WIC_HOLD_ENTER: held and entered in the table, not recorded (a closing page, which the
 *	closing call completes, or a full ring: the entry is recorded when the fault comes back
 *	to a ring with room, and the expiry bounds it meanwhile)
 * @WIC_HOLD_ENTER_RECORD: held, entered and recorded
 * @WIC_HOLD_RECORD: held; its unrecorded entry is recorded now
 * @WIC_HOLD_UNTABLED: held without an entry: the table is full. Serviced, the warp would read
 *	the page without its data; held, it comes back at its GPU's next replay, which
 *	wic_hold_relief_due() brings soon enough
 * @WIC_HOLD_INVALID_GPU: held without an entry and logged: a GPU id the shim cannot replay
 *	(the hook's and the shim's builds check that nvidia-uvm gives none: never in practice)
 */
enum wic_hold_action {
	WIC_HOLD_PASS,
	WIC_HOLD_QUIET,
	WIC_HOLD_ENTER,
	WIC_HOLD_ENTER_RECORD,
	WIC_HOLD_RECORD,
	WIC_HOLD_UNTABLED,
	WIC_HOLD_INVALID_GPU,
};

/* What to do with a fault. */
static inline enum wic_hold_action wic_hold_classify(const struct wic_hold_facts *f)
{
	if (!f->wic_page || f->gone)
		return WIC_HOLD_PASS;
	if (f->prefetch)
		return WIC_HOLD_QUIET;
	if (f->pass_once)
		return WIC_HOLD_PASS;
	if (!f->gpu_valid)
		return WIC_HOLD_INVALID_GPU;
	switch (f->entry) {
	case WIC_HOLD_RECORDED:
		return WIC_HOLD_QUIET;
	case WIC_HOLD_UNRECORDED:
		return f->ring_room && !f->closing ? WIC_HOLD_RECORD : WIC_HOLD_QUIET;
	case WIC_HOLD_NO_ENTRY:
	default:
		break;
	}
	if (f->draining)
		return WIC_HOLD_PASS;
	if (!f->table_room)
		return WIC_HOLD_UNTABLED;
	return f->ring_room && !f->closing ? WIC_HOLD_ENTER_RECORD : WIC_HOLD_ENTER;
}

/* Whether the ring header's dropped count counts the action: held, and wicd not told. */
static inline bool wic_hold_unrecorded(enum wic_hold_action action, const struct wic_hold_facts *f)
{
	return action == WIC_HOLD_UNTABLED || action == WIC_HOLD_INVALID_GPU ||
	       (action == WIC_HOLD_ENTER && !f->closing) ||
	       (action == WIC_HOLD_QUIET && f->entry == WIC_HOLD_UNRECORDED && !f->closing);
}

/**
 * struct wic_hold_clock - the ages the rules carry for faults held without an entry
 * @since: when the oldest hold without an entry of the current episode was made, 0 outside
 *	one. An episode lasts until the expiry finds a whole period without such a hold.
 * @last: when the latest hold without an entry, or the latest relief, was made
 * @pending: a hold without an entry was made since the last relief
 *
 * The pages of faults held without an entry are not known: any fault that takes an entry
 * during an episode may be one of them.
 */
struct wic_hold_clock {
	u64 since;
	u64 last;
	bool pending;
};

/*
 * The age to give a fault held at @now: a new entry's held_ns. During an episode of holds
 * without an entry, a new entry may be one of them, so its bound counts from the oldest of
 * them. A fault that is really new then is completed early, at worst; that happens only while
 * the table is full or was within a period.
 */
static inline u64 wic_hold_age(const struct wic_hold_clock *c, u64 now)
{
	return c->since && c->since < now ? c->since : now;
}

/* A fault held at @now without an entry. */
static inline void wic_hold_untabled(struct wic_hold_clock *c, u64 now)
{
	if (!c->since)
		c->since = now;
	c->last = now;
	c->pending = true;
}

/*
 * The bound in force, in ns: @max_hold_ns (max_hold_ms; 0 for none), or 1 while the GPUs
 * suspend. RM then preempts every channel and waits for each, which a held fault keeps from
 * being preempted: every hold is due at the expiry's next run, whose period is then its
 * shortest.
 */
static inline u64 wic_hold_bound(u64 max_hold_ns, bool suspending)
{
	return suspending ? 1 : max_hold_ns;
}

/*
 * The expiry run at @now completes the entries held before the time returned: held longer
 * than the bound @bound_ns (0: none), or every entry for a relief that finds the table full
 * (wic_hold_relief_due()).
 */
static inline u64 wic_hold_expire_before(u64 now, u64 bound_ns, bool relief_without_room)
{
	if (relief_without_room)
		return U64_MAX;
	if (!bound_ns || now <= bound_ns)
		return 0;
	return now - bound_ns;
}

/*
 * Whether the expiry run at @now replays the GPUs of the faults held without an entry: half
 * the bound into an episode, and at every run after while they keep coming back without one.
 * Each time, the faults come back, a table's worth of them take an entry with the episode's
 * age (wic_hold_age()) and are completed with the entries at the first run past the bound, at
 * most one relief period late. When the table has no room, the relief first completes every
 * entry in it (with the timeout marker): it cannot tell which of the faults coming back are
 * the old ones, and a table full for half the bound means wicd is not keeping up.
 */
static inline bool wic_hold_relief_due(const struct wic_hold_clock *c, u64 now, u64 bound_ns)
{
	return bound_ns && c->pending && now >= c->since && now - c->since >= bound_ns / 2;
}

/* The relief at @now, whose replays follow: the episode lasts at least a period more. */
static inline void wic_hold_relieved(struct wic_hold_clock *c, u64 now)
{
	c->pending = false;
	c->last = now;
}

/*
 * The delay until the expiry's next run after the one at @now, 0 for none: @relief_period_ns
 * during an episode of holds without an entry (each round of them coming back takes one run),
 * else @period_ns while any fault is held (@held: with an entry). An episode ends at the first
 * run a whole @period_ns after its last hold without an entry and its last relief; with no
 * bound (@bound_ns 0) it waits, untouched, for one to be set.
 */
static inline u64 wic_hold_next_run(struct wic_hold_clock *c, u64 now, u64 bound_ns, bool held,
				    u64 period_ns, u64 relief_period_ns)
{
	/* With no bound there is no relief, until a bound is set: the episode waits for it. */
	if (!bound_ns)
		return held ? period_ns : 0;
	if (c->since && !c->pending && now >= c->last && now - c->last >= period_ns)
		c->since = 0;
	if (c->since)
		return relief_period_ns;
	return held ? period_ns : 0;
}

#endif /* _WIC_HOLD_H */
