// SPDX-License-Identifier: GPL-2.0
/*
 * hold_check.c - the held-fault rules of wic_shim and of the patched nvidia-uvm, checked
 * against a model of the mechanism they act on.
 *
 * The rules are the module's own code: wic_hold_classify() and the hold clock of
 * shim/wic_hold.h, uvm_wic_run_final_replay() of shim/include/uvm_wic.h. The model is of what
 * they act on, not of what they mean:
 *
 * - a GPU's replayable fault buffer of a few entries, with an OVERFLOW bit that the hardware
 *   sets when it drops a fault into a full buffer and that keeps it dropping every fault
 *   until software clears it with a GET write; nvidia-uvm sees the bit only where it reads it
 *   (the PUT read of a fetch, the GET write just before the clear), never under Confidential
 *   Computing; a fault may arrive between that last read and the clear;
 * - warps of a wic application (on wic pages, several per page) and of another application,
 *   which stall on their faults and resume only at a replay that finds their page mapped;
 * - nvidia-uvm's bottom half: batches fetched, classified (the shim's rules), serviced and
 *   replayed (BATCH_FLUSH) unless made of held faults only; a run's final replay now or
 *   deferred by the rule;
 * - the shim's held table and ring (a few entries each), its expiry work (period a quarter of
 *   the bound) with the relief for faults held without an entry;
 * - wicd: reading the ring and completing the pages whose data its producer published
 *   (quick, slow, or gone);
 * - in some runs a system suspend: the shim completes every held fault when it begins
 *   (wic_suspend()) and holds with the bound of wic_hold_bound() until the resume, while RM
 *   preempts every channel, which waits on every stalled warp.
 *
 * Each seed draws the sizes, the timings and every choice of the run, and the run asserts:
 * - no warp of the wic application resumes on a page without its data or a marker (nothing is
 *   serviced without its data);
 * - no warp of it stays stalled longer than the bound and a period past the deferred replay
 *   (every held fault is completed in time, recorded or not, with an entry or not);
 * - no warp of the other application stays stalled past the deferred replay (a fault the
 *   hardware dropped does not wait for ever);
 * - while the system suspends, no warp stays stalled past the deferred replay and the
 *   expiry's next run (RM's preemption of its channel is not held up);
 * - every warp is done at the end.
 *
 * Usage: hold_check [--seeds N] [--first SEED] [--verbose]. Exits 1 at the first violation,
 * naming the seed; -DHOLD_CHECK_OLD_RULES builds it with the rules before the deferred replay
 * and the relief, and -DHOLD_CHECK_NO_SUSPEND without the suspend's, which it must find wrong.
 */
#include "kernel_compat.h"

#include <stdio.h>
#include <stdlib.h>

#include "uvm_wic.h"
#include "wic_hold.h"

#define MS 1000000ULL
#define BOUND (3000 * MS)
#define PERIOD (BOUND / 4)
/* The expiry's period while a relief is under way (WIC_EXPIRE_MIN_PERIOD_MS). */
#define RELIEF_PERIOD (10 * MS)
#define DEFER ((u64)UVM_WIC_DEFERRED_REPLAY_MS * MS)
/* From a fault in the buffer to the bottom half's run. */
#define BH_DELAY MS
/* What rounds of replays and refetches may add when more warps stall than the buffer holds. */
#define ROUNDS (20 * MS)
#define LIMIT_WIC (DEFER + BOUND + PERIOD + ROUNDS)
#define LIMIT_OTHER (DEFER + ROUNDS)
/* A stall while the system suspends: a dropped fault's deferred replay, then the next expiry run. */
#define LIMIT_SUSPEND (DEFER + RELIEF_PERIOD + ROUNDS)
#define END (40000 * MS)

#define MAX_WARPS 12
#define MAX_PAGES 6
#define MAX_BUFFER 6
#define MAX_TABLE 6
#define MAX_RING 4

enum warp_state { W_IDLE, W_STALLED, W_DONE };
enum fill { NOT_FILLED, DATA, MARKER };
enum wicd_mode { QUICK, SLOW, GONE };

struct warp {
	bool wic;
	int page;
	enum warp_state state;
	u64 start;
	u64 stalled_since;
};

struct page {
	bool wic;
	bool mapped;
	enum fill filled;
	u64 published;
	bool known;
};

struct entry {
	bool used;
	int page;
	bool recorded;
	u64 held_ns;
};

struct sim {
	u64 rng;
	bool verbose;
	/* drawn per seed */
	int nbuf, batch, max_batches, ntable, nring, nwarps, npages;
	bool cc;
	enum wicd_mode wicd;
	int race_percent;
	/* time */
	u64 now;
	struct warp warps[MAX_WARPS];
	struct page pages[MAX_PAGES + MAX_WARPS];
	/* the GPU's fault buffer */
	int buffer[MAX_BUFFER];
	int count;
	bool overflow;
	/* nvidia-uvm */
	bool overflow_seen;
	u64 deferred_due;
	u64 bh_at;
	u32 replays;
	/* wic_shim */
	struct entry table[MAX_TABLE];
	int ring[MAX_RING];
	int ring_count;
	struct wic_hold_clock clock;
	bool untabled_gpu;
	u64 expire_at;
	/* the system's suspend: from @suspend_at (0: none) to @resume_at */
	u64 suspend_at;
	u64 resume_at;
	bool suspending;
	/* what the run checks: whether the system is suspending, since when */
	bool in_suspend;
	u64 suspended_since;
	/* wicd */
	u64 wicd_at;
	/* what went wrong */
	const char *violation;
	u64 violated_at;
};

#define TRACE(s, ...)							\
	do {								\
		if ((s)->verbose) {					\
			printf("%8.3f ms ", (double)(s)->now / MS);	\
			printf(__VA_ARGS__);				\
			printf("\n");					\
		}							\
	} while (0)

static u64 next_random(struct sim *s)
{
	/* xorshift64* */
	s->rng ^= s->rng >> 12;
	s->rng ^= s->rng << 25;
	s->rng ^= s->rng >> 27;
	return s->rng * 2685821657736338717ULL;
}

/* A number in [lo, hi]. */
static u64 pick(struct sim *s, u64 lo, u64 hi)
{
	return lo + next_random(s) % (hi - lo + 1);
}

static void fail(struct sim *s, const char *why)
{
	if (!s->violation) {
		s->violation = why;
		s->violated_at = s->now;
	}
}

static int entry_of(struct sim *s, int page)
{
	int i;

	for (i = 0; i < s->ntable; i++)
		if (s->table[i].used && s->table[i].page == page)
			return i;
	return -1;
}

static int free_entry(struct sim *s)
{
	int i;

	for (i = 0; i < s->ntable; i++)
		if (!s->table[i].used)
			return i;
	return -1;
}

/* The hardware writes a stalled warp's fault into the buffer, or drops it. */
static void raise_fault(struct sim *s, int w)
{
	if (s->overflow || s->count == s->nbuf) {
		s->overflow = true;
	} else {
		s->buffer[s->count++] = w;
	}
	/* The buffer is not empty: the interrupt is pending. */
	if (s->count && !s->bh_at)
		s->bh_at = s->now + pick(s, 1, BH_DELAY);
}

/* A warp resumes: its access goes through. */
static void resume(struct sim *s, struct warp *warp)
{
	struct page *page = &s->pages[warp->page];

	if (warp->wic && page->filled == NOT_FILLED)
		fail(s, "a warp of the wic application read its page without data or marker");
	warp->state = W_DONE;
}

/* A warp's access at its start. */
static void arrive(struct sim *s, int w)
{
	struct warp *warp = &s->warps[w];

	warp->start = s->now;
	if (s->pages[warp->page].mapped) {
		resume(s, warp);
		return;
	}
	warp->state = W_STALLED;
	warp->stalled_since = s->now;
	raise_fault(s, w);
}

/* nvidia-uvm reads the OVERFLOW bit (the hook's latch). */
static void latch(struct sim *s)
{
	if (s->overflow && !s->cc)
		s->overflow_seen = true;
}

/* Warps that start between the latch's last read and the clear: the race it cannot win. */
static void race(struct sim *s)
{
	int w;

	if ((int)pick(s, 0, 99) >= s->race_percent)
		return;
	for (w = 0; w < s->nwarps; w++)
		if (s->warps[w].state == W_IDLE && s->warps[w].start > s->now && pick(s, 0, 1))
			arrive(s, w);
}

/* The GET write past @n entries: the pointer, the latch's read, the clear. */
static void write_get(struct sim *s, int n, bool racing)
{
	int i;

	for (i = n; i < s->count; i++)
		s->buffer[i - n] = s->buffer[i];
	s->count -= n;
	latch(s);
	if (racing)
		race(s);
	s->overflow = false;
}

/* A flush and START replay: every stalled warp retries. */
static void replay(struct sim *s)
{
	int order[MAX_WARPS], n = 0, i, w;

	TRACE(s, "replay");
	write_get(s, s->count, false);
	s->overflow_seen = false;
	s->deferred_due = 0;
	s->replays++;
	for (w = 0; w < s->nwarps; w++)
		if (s->warps[w].state == W_STALLED)
			order[n++] = w;
	/* The hardware's order is not specified. */
	for (i = n - 1; i > 0; i--) {
		int j = pick(s, 0, i), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	for (i = 0; i < n; i++) {
		struct warp *warp = &s->warps[order[i]];

		if (s->pages[warp->page].mapped)
			resume(s, warp);
		else
			raise_fault(s, order[i]);
	}
}

/* The shim's classify for a fault of warp @w; whether it is held. */
/* The bound in force (wic_bound_ns()) and the expiry's period (wic_expire_period()). */
static u64 bound(struct sim *s)
{
	return wic_hold_bound(BOUND, s->suspending);
}

static u64 period(struct sim *s)
{
	return bound(s) / 4 > RELIEF_PERIOD ? bound(s) / 4 : RELIEF_PERIOD;
}

static bool classify(struct sim *s, int w)
{
	struct warp *warp = &s->warps[w];
	int at = entry_of(s, warp->page);
	struct wic_hold_facts facts = {
		.wic_page = warp->wic,
		.gpu_valid = true,
		.entry = at < 0 ? WIC_HOLD_NO_ENTRY :
			 s->table[at].recorded ? WIC_HOLD_RECORDED : WIC_HOLD_UNRECORDED,
		.ring_room = s->ring_count < s->nring,
		.table_room = free_entry(s) >= 0,
	};
	enum wic_hold_action action;

#ifdef HOLD_CHECK_OLD_RULES
	/* Before: a fault the ring had no room for got no entry either. */
	if (facts.entry == WIC_HOLD_NO_ENTRY && !facts.ring_room)
		facts.table_room = false;
#endif
	action = wic_hold_classify(&facts);
	switch (action) {
	case WIC_HOLD_ENTER:
	case WIC_HOLD_ENTER_RECORD:
		at = free_entry(s);
		s->table[at] = (struct entry){ .used = true, .page = warp->page,
					       .held_ns = wic_hold_age(&s->clock, s->now) };
		if (action == WIC_HOLD_ENTER)
			break;
		/* fallthrough */
	case WIC_HOLD_RECORD:
		s->table[at].recorded = true;
		s->ring[s->ring_count++] = warp->page;
		break;
	case WIC_HOLD_UNTABLED:
#ifndef HOLD_CHECK_OLD_RULES
		wic_hold_untabled(&s->clock, s->now);
		s->untabled_gpu = true;
#endif
		break;
	default:
		break;
	}
	if ((action == WIC_HOLD_ENTER || action == WIC_HOLD_ENTER_RECORD ||
	     action == WIC_HOLD_UNTABLED) && !s->expire_at)
		s->expire_at = s->now + period(s);
	TRACE(s, "classify warp %d page %d: action %d (entry %d ring %d table %d) untabled %.3f", w,
	      warp->page, action, facts.entry, facts.ring_room, facts.table_room,
	      (double)s->clock.since / MS);
	return action != WIC_HOLD_PASS;
}

/* One batch: fetched, classified, and unless all held, serviced and replayed. */
static bool batch(struct sim *s, bool first)
{
	int fetched[MAX_BUFFER], n, i, nr_held = 0;
	bool held[MAX_BUFFER];

	latch(s);
	n = s->count < s->batch ? s->count : s->batch;
	for (i = 0; i < n; i++)
		fetched[i] = s->buffer[i];
	write_get(s, n, first);
	for (i = 0; i < n; i++)
		nr_held += held[i] = classify(s, fetched[i]);
	if (nr_held == n)
		return true;
	/* Serviced: the page mapped (a wic page without its data: resume() objects). */
	for (i = 0; i < n; i++)
		if (!held[i])
			s->pages[s->warps[fetched[i]].page].mapped = true;
	replay(s);
	return false;
}

static void bottom_half(struct sim *s)
{
	u32 replays = s->replays;
	int batches = 0, held_batches = 0;

	s->bh_at = 0;
	while (s->count && batches < s->max_batches) {
		held_batches += batch(s, batches == 0);
		batches++;
	}
	if (s->replays == replays) {
		enum uvm_wic_final_replay when =
			uvm_wic_run_final_replay(false, batches, held_batches, s->max_batches,
						 s->overflow_seen, !s->cc);

		if (when == UVM_WIC_REPLAY_NOW)
			replay(s);
#ifndef HOLD_CHECK_OLD_RULES
		else if (!s->deferred_due)
			s->deferred_due = s->now + DEFER;
#endif
	}
	if (s->count && !s->bh_at)
		s->bh_at = s->now + pick(s, 1, BH_DELAY);
}

/* Completes the page of entry @at (data from wicd, or a marker) and releases its entry. */
static void complete(struct sim *s, int at, enum fill fill)
{
	struct page *page = &s->pages[s->table[at].page];

	if (page->filled == NOT_FILLED)
		page->filled = fill;
	page->mapped = true;
	s->table[at].used = false;
}

static bool table_empty(struct sim *s)
{
	int i;

	for (i = 0; i < s->ntable; i++)
		if (s->table[i].used)
			return false;
	return true;
}

/* The expiry work; @all: every held fault, whatever its age (wic_expire_held()). */
static void expire_held(struct sim *s, bool all)
{
	bool relief = all, room = true, any = false;
	u64 before, next;
	int i;

#ifndef HOLD_CHECK_OLD_RULES
	relief = relief || wic_hold_relief_due(&s->clock, s->now, bound(s));
#endif
	if (relief)
		room = free_entry(s) >= 0;
	before = all ? U64_MAX : wic_hold_expire_before(s->now, bound(s), !room);
	TRACE(s, "expire: all %d relief %d room %d", all, relief, room);
	for (i = 0; i < s->ntable; i++) {
		if (s->table[i].used && s->table[i].held_ns < before) {
			complete(s, i, MARKER);
			any = true;
		}
	}
	if (relief) {
		s->untabled_gpu = false;
		wic_hold_relieved(&s->clock, s->now);
	}
	if (any || relief)
		replay(s);
	next = wic_hold_next_run(&s->clock, s->now, bound(s), !table_empty(s), period(s),
				 RELIEF_PERIOD);
	s->expire_at = next ? s->now + next : 0;
}

/* The system begins to suspend (wic_suspend()), or resumes. */
static void suspend(struct sim *s, bool on)
{
	TRACE(s, "suspend %d", on);
	if (on)
		s->suspend_at = 0;
	else
		s->resume_at = 0;
	s->in_suspend = on;
	s->suspended_since = s->now;
#ifndef HOLD_CHECK_NO_SUSPEND
	s->suspending = on;
	if (on)
		expire_held(s, true);
#endif
}

/* wicd reads the ring and completes every recorded page whose data was published. */
static void wicd(struct sim *s)
{
	bool any = false;
	int i, at;

	for (i = 0; i < s->ring_count; i++)
		s->pages[s->ring[i]].known = true;
	s->ring_count = 0;
	for (i = 0; i < MAX_PAGES; i++) {
		struct page *page = &s->pages[i];

		if (!page->wic || !page->known || page->mapped || page->published > s->now)
			continue;
		at = entry_of(s, i);
		page->filled = DATA;
		page->mapped = true;
		if (at >= 0)
			s->table[at].used = false;
		any = true;
	}
	if (any)
		replay(s);
	s->wicd_at = s->now + (s->wicd == QUICK ? pick(s, MS / 10, 5 * MS) :
						  pick(s, 100 * MS, 5000 * MS));
}

static u64 max_u64(u64 a, u64 b)
{
	return a > b ? a : b;
}

static void check_stalls(struct sim *s)
{
	int w;

	for (w = 0; w < s->nwarps; w++) {
		struct warp *warp = &s->warps[w];

		if (warp->state != W_STALLED)
			continue;
		if (warp->wic && s->now - warp->stalled_since > LIMIT_WIC)
			fail(s, "a warp of the wic application stayed stalled past the bound");
		if (!warp->wic && s->now - warp->stalled_since > LIMIT_OTHER)
			fail(s, "a warp of another application stayed stalled past the deferred replay");
		if (s->in_suspend && s->now - max_u64(warp->stalled_since, s->suspended_since) >
				     LIMIT_SUSPEND)
			fail(s, "a warp stayed stalled while the system suspends: its channel cannot be preempted");
	}
}

static void setup(struct sim *s, u64 seed)
{
	int i, other;

	*s = (struct sim){ .rng = seed * 0x9E3779B97F4A7C15ULL + 1 };
	next_random(s);
	s->nbuf = pick(s, 2, MAX_BUFFER);
	s->batch = pick(s, 1, 3);
	s->max_batches = pick(s, 1, 4);
	s->ntable = pick(s, 1, MAX_TABLE);
	s->nring = pick(s, 1, MAX_RING);
	s->npages = pick(s, 1, MAX_PAGES);
	s->nwarps = pick(s, 1, MAX_WARPS);
	s->cc = pick(s, 0, 7) == 0;
	s->wicd = pick(s, 0, 2);
	s->race_percent = pick(s, 0, 50);
	for (i = 0; i < s->npages; i++)
		s->pages[i] = (struct page){ .wic = true, .published = pick(s, 0, 6000 * MS) };
	other = 0;
	for (i = 0; i < s->nwarps; i++) {
		bool wic = pick(s, 0, 3) != 0;

		s->warps[i] = (struct warp){
			.wic = wic,
			/* Another application's warps each have a page of their own. */
			.page = wic ? (int)pick(s, 0, s->npages - 1) : MAX_PAGES + other++,
			.start = pick(s, 0, 8000 * MS),
		};
	}
	s->wicd_at = s->wicd == GONE ? 0 : pick(s, 0, 10 * MS);
	if (pick(s, 0, 2) == 0) {
		s->suspend_at = pick(s, 1, 8000 * MS);
		s->resume_at = s->suspend_at + pick(s, 100 * MS, 3000 * MS);
	}
}

/* The earliest of the times that are set (not 0), or 0. */
static u64 earliest(u64 a, u64 b)
{
	return !a ? b : !b ? a : a < b ? a : b;
}

static const char *run(struct sim *s, u64 seed, bool verbose)
{
	int w;

	setup(s, seed);
	s->verbose = verbose;
	while (!s->violation && s->now < END) {
		u64 next = 0;

		for (w = 0; w < s->nwarps; w++)
			if (s->warps[w].state == W_IDLE)
				next = earliest(next, s->warps[w].start ? s->warps[w].start : 1);
		next = earliest(next, s->bh_at);
		next = earliest(next, s->expire_at);
		next = earliest(next, s->deferred_due);
		next = earliest(next, s->wicd_at);
		next = earliest(next, s->suspend_at);
		next = earliest(next, s->resume_at);
		if (!next)
			break;
		if (next > s->now)
			s->now = next;
		check_stalls(s);
		for (w = 0; w < s->nwarps; w++) {
			if (s->warps[w].state == W_IDLE && s->warps[w].start <= s->now) {
				arrive(s, w);
				goto next;
			}
		}
		if (s->suspend_at && s->suspend_at <= s->now)
			suspend(s, true);
		else if (s->resume_at && s->resume_at <= s->now)
			suspend(s, false);
		else if (s->bh_at && s->bh_at <= s->now)
			bottom_half(s);
		else if (s->deferred_due && s->deferred_due <= s->now)
			replay(s);
		else if (s->expire_at && s->expire_at <= s->now)
			expire_held(s, false);
		else if (s->wicd_at && s->wicd_at <= s->now)
			wicd(s);
next:
		;
	}
	s->now = END;
	check_stalls(s);
	for (w = 0; w < s->nwarps && !s->violation; w++)
		if (s->warps[w].state != W_DONE)
			fail(s, "a warp never resumed");
	return s->violation;
}

int main(int argc, char **argv)
{
	u64 seeds = 20000, first = 1, seed;
	bool verbose = false;
	struct sim s;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
			seeds = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--first") && i + 1 < argc)
			first = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--verbose"))
			verbose = true;
		else {
			fprintf(stderr, "usage: hold_check [--seeds N] [--first SEED] [--verbose]\n");
			return 2;
		}
	}
	for (seed = first; seed < first + seeds; seed++) {
		const char *why = run(&s, seed, verbose);

		if (why) {
			printf("VIOLATION seed %llu at %llu ms: %s (buffer %d, batch %d, batches %d, table %d, ring %d, warps %d, pages %d, cc %d, wicd %d, race %d%%)\n",
			       (unsigned long long)seed, (unsigned long long)(s.violated_at / MS), why, s.nbuf, s.batch, s.max_batches, s.ntable,
			       s.nring, s.nwarps, s.npages, s.cc, s.wicd, s.race_percent);
			return 1;
		}
	}
	printf("checked %llu runs\n", (unsigned long long)seeds);
	return 0;
}
