/* SPDX-License-Identifier: GPL-2.0 */
/*
 * wic_validate.h - wic_shim's checks of wicd's arguments, free of session state.
 *
 * Pure functions over the ioctl arguments and a space's registered ranges. wic_shim.c runs
 * them before it changes anything; the fuzzer (fuzz/, built for user space) runs the same code
 * and compares every verdict with a model of the rules in ffi/include/wic_abi.h. A user-space
 * includer defines first what this file takes from the kernel: u32, u64, bool, memcpy(),
 * check_add_overflow(), PAGE_SIZE, PAGE_ALIGNED() and the errno values.
 */
#ifndef _WIC_VALIDATE_H
#define _WIC_VALIDATE_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/string.h>
#include <linux/types.h>
#endif

#include <wic_abi.h>

/* Bits of a bitmap indexed by GPU id: ids run from 1 to WIC_MAX_GPU_ID. */
#define WIC_GPU_BITS (WIC_MAX_GPU_ID + 1)

/**
 * struct wic_range_entry - a registered range
 * @start: first byte
 * @end: one past the last byte
 * @id: the id given to wicd
 * @kind: WIC_RANGE_PCM, WIC_RANGE_PAT or WIC_RANGE_SOURCE
 * @run_pages: the pages of each run of a PCM range registered with them, else 0
 * @gone: 0, or the errno with which nvidia-uvm said its pages are gone for good (see
 *	wic_hold.h): its faults are no longer held
 * @unsupported_told: wicd was told that a page of it faulted on a GPU whose faults cannot be
 *	held (WIC_RECORD_UNSUPPORTED_GPU)
 * @untabled_pending: pages set in the first of @untabled's bitmaps
 * @untabled: a PCM range's two bitmaps of one bit per page, NULL for other kinds: the pages on
 *	which a fault was held without a held-table entry since the page was last completed,
 *	then the pages whose marker the close under way wrote (wic_shim.c, wic_untabled_note())
 */
struct wic_range_entry {
	u64 start;
	u64 end;
	u32 id;
	u32 kind;
	u32 run_pages;
	u32 gone;
	u32 unsupported_told;
	u32 untabled_pending;
	unsigned long *untabled;
};

/**
 * struct wic_range_list - the registered ranges of one space
 * @entries: sorted by start, never overlapping; NULL when @nr is 0
 * @nr: entries in @entries
 */
struct wic_range_list {
	struct wic_range_entry *entries;
	u32 nr;
};

/**
 * wic_space_id_valid() - whether an id can name a space
 * @space_id: the id, as wicd sent it
 *
 * Return: true for 1 to WIC_MAX_SPACES: space @space_id lives at index @space_id - 1.
 */
static inline bool wic_space_id_valid(u32 space_id)
{
	return space_id && space_id <= WIC_MAX_SPACES;
}

/**
 * wic_gpu_id_valid() - whether an id can name a GPU
 * @gpu_id: nvidia-uvm's processor id, as a fault or wicd gives it
 *
 * Return: true for 1 to WIC_MAX_GPU_ID; 0 is the CPU.
 */
static inline bool wic_gpu_id_valid(u32 gpu_id)
{
	return gpu_id && gpu_id <= WIC_MAX_GPU_ID;
}

/**
 * wic_range_find() - the range holding an address
 * @list: the ranges to search
 * @va: the address
 *
 * Return: the range whose [start, end) holds @va, or NULL.
 */
static inline const struct wic_range_entry *wic_range_find(const struct wic_range_list *list,
							   u64 va)
{
	u32 lo = 0, hi = list->nr;

	while (lo < hi) {
		u32 mid = lo + (hi - lo) / 2;
		const struct wic_range_entry *range = &list->entries[mid];

		if (va < range->start)
			hi = mid;
		else if (va >= range->end)
			lo = mid + 1;
		else
			return range;
	}
	return NULL;
}

/**
 * wic_range_covered() - whether consecutive mappings cover an address range
 * @start: first byte
 * @end: one past the last byte
 * @mapping_end: the end of the mapping holding an address, or 0 when none does
 * @mm: passed to @mapping_end
 *
 * Return: true when every byte of [@start, @end) lies in a mapping.
 */
static inline bool wic_range_covered(u64 start, u64 end, u64 (*mapping_end)(void *mm, u64 addr),
				     void *mm)
{
	u64 at = start;

	while (at < end) {
		at = mapping_end(mm, at);
		if (!at)
			return false;
	}
	return true;
}

/**
 * wic_check_register() - validate a WIC_IOC_REGISTER request
 * @r: the request, copied from user space
 * @space: the ranges of @r->space_id, NULL when no such space is attached
 * @nr_ranges: ranges the session holds over all its spaces
 * @mapped: whether [start, end) lies inside mappings of the space's process
 * @ctx: passed to @mapped: what names that process
 * @end: out: one past the range's last byte
 * @at: out: the index in @space where the range goes
 *
 * Checks in the order wic_abi.h lists the errors; @mapped is asked last but one.
 *
 * Return: 0, -EINVAL, -ENOENT, -ENOSPC, -EFAULT or -EEXIST.
 */
static inline int wic_check_register(const struct wic_range *r,
				     const struct wic_range_list *space, u32 nr_ranges,
				     bool (*mapped)(void *ctx, u64 start, u64 end), void *ctx,
				     u64 *end, u32 *at)
{
	u32 i;

	if (r->range_id ||
	    (r->kind != WIC_RANGE_PCM && r->kind != WIC_RANGE_PAT && r->kind != WIC_RANGE_SOURCE))
		return -EINVAL;
	if (!PAGE_ALIGNED(r->start) || !PAGE_ALIGNED(r->length) || !r->length ||
	    r->length > WIC_MAX_RANGE_BYTES || check_add_overflow(r->start, r->length, end))
		return -EINVAL;
	/* Runs come in pairs, the slot's two, and only a PCM range has them. */
	if (r->run_pages && (r->kind != WIC_RANGE_PCM || r->run_pages > WIC_MAX_RANGE_BYTES / PAGE_SIZE ||
			     r->length % (2 * (u64)r->run_pages * PAGE_SIZE)))
		return -EINVAL;
	if (!space)
		return -ENOENT;
	if (nr_ranges >= WIC_MAX_RANGES)
		return -ENOSPC;
	if (!mapped(ctx, r->start, *end))
		return -EFAULT;
	for (i = 0; i < space->nr && space->entries[i].start < r->start; i++)
		;
	if ((i > 0 && space->entries[i - 1].end > r->start) ||
	    (i < space->nr && space->entries[i].start < *end))
		return -EEXIST;
	*at = i;
	return 0;
}

/**
 * wic_ranges_insert() - copy a range list with one range added
 * @dst: room for @src->nr + 1 ranges
 * @src: the list
 * @at: where @entry goes, from wic_check_register()
 * @entry: the new range
 */
static inline void wic_ranges_insert(struct wic_range_entry *dst,
				     const struct wic_range_list *src, u32 at,
				     const struct wic_range_entry *entry)
{
	memcpy(dst, src->entries, at * sizeof(*dst));
	dst[at] = *entry;
	memcpy(dst + at + 1, src->entries + at, (src->nr - at) * sizeof(*dst));
}

/**
 * wic_range_index() - where a range is in a list
 * @list: the list
 * @range_id: the range's id
 *
 * Return: the index of range @range_id in @list, or -ENOENT.
 */
static inline int wic_range_index(const struct wic_range_list *list, u32 range_id)
{
	u32 i;

	for (i = 0; i < list->nr; i++)
		if (list->entries[i].id == range_id)
			return i;
	return -ENOENT;
}

/**
 * wic_ranges_remove() - copy a range list without one range
 * @dst: room for @src->nr - 1 ranges
 * @src: the list
 * @at: the index of the range to leave out, from wic_range_index()
 */
static inline void wic_ranges_remove(struct wic_range_entry *dst,
				     const struct wic_range_list *src, u32 at)
{
	memcpy(dst, src->entries, at * sizeof(*dst));
	memcpy(dst + at, src->entries + at + 1, (src->nr - at - 1) * sizeof(*dst));
}

/**
 * wic_check_submit() - validate a batch before any of its commands is read
 * @sub: the batch, copied from user space (or from the io_uring command area)
 *
 * Return: 0, or -EINVAL for a count of 0 or above WIC_MAX_COMMANDS, or flags.
 */
static inline int wic_check_submit(const struct wic_submit *sub)
{
	if (!sub->count || sub->count > WIC_MAX_COMMANDS || sub->flags)
		return -EINVAL;
	return 0;
}

/**
 * wic_marker_valid() - whether a word is one of the WIC_MARKER_* error markers
 * @marker: the word
 *
 * The device library reads any other word at the start of a page as data.
 *
 * Return: true for the four markers wic_abi.h defines.
 */
static inline bool wic_marker_valid(u64 marker)
{
	switch (marker) {
	case WIC_MARKER_TIMEOUT:
	case WIC_MARKER_CHANNEL_CLOSED:
	case WIC_MARKER_DAEMON_STOPPING:
	case WIC_MARKER_DAEMON_GONE:
		return true;
	default:
		return false;
	}
}

/**
 * wic_check_command() - validate one command before it runs
 * @cmd: the command, copied from user space
 * @space: the ranges of @cmd->space_id, NULL when no such space is attached
 *
 * Checks in the order wic_abi.h lists the errors. A WIC_CMD_REPLAY that passes has no pages to
 * check; any other command that passes lies inside one range of @space, of the kind its opcode
 * needs, and so does a completion's companion run and a copy's source bytes. A
 * WIC_CMD_COMPLETE_HEADS that passes has one 8-byte head word per page, within
 * WIC_MAX_WRITE_BYTES.
 *
 * Return: 0, -EINVAL, -ENODEV, -ENOENT or -ERANGE.
 */
static inline int wic_check_command(const struct wic_command *cmd,
				    const struct wic_range_list *space)
{
	bool pat = cmd->opcode == WIC_CMD_SERVICE_PAT || cmd->opcode == WIC_CMD_REARM_PAT;
	bool copy = cmd->opcode == WIC_CMD_COMPLETE_COPY;
	bool heads = cmd->opcode == WIC_CMD_COMPLETE_HEADS;
	bool complete = cmd->opcode == WIC_CMD_COMPLETE || copy || heads;
	bool data = copy || heads || (cmd->opcode == WIC_CMD_COMPLETE && cmd->length);
	bool marker = cmd->opcode == WIC_CMD_COMPLETE && !cmd->length;
	const struct wic_range_entry *range;
	u64 bytes, end, companion_end = 0, source_end;

	if (cmd->reserved || cmd->result)
		return -EINVAL;
	if (cmd->opcode < WIC_CMD_SERVICE_PAT || cmd->opcode > WIC_CMD_COMPLETE_HEADS)
		return -EINVAL;
	if (!wic_gpu_id_valid(cmd->gpu_id))
		return -ENODEV;
	/* Fields an opcode does not use must be 0, so that they can be given a meaning later. */
	if ((!data && cmd->length) || (!data && !marker && cmd->arg) ||
	    (!complete && cmd->companion))
		return -EINVAL;
	if (cmd->opcode == WIC_CMD_REPLAY)
		return 0;
	if (!cmd->pages || cmd->pages > WIC_MAX_RANGE_BYTES / PAGE_SIZE || !PAGE_ALIGNED(cmd->va))
		return -EINVAL;
	if (pat && cmd->pages != 1)
		return -EINVAL;
	bytes = (u64)cmd->pages * PAGE_SIZE;
	if (check_add_overflow(cmd->va, bytes, &end))
		return -EINVAL;
	if (complete && (!PAGE_ALIGNED(cmd->companion) ||
			 check_add_overflow(cmd->companion, bytes, &companion_end) ||
			 (cmd->companion < end && cmd->va < companion_end)))
		return -EINVAL;
	if (!space)
		return -ENOENT;
	range = wic_range_find(space, cmd->va);
	if (!range || end > range->end || range->kind != (pat ? WIC_RANGE_PAT : WIC_RANGE_PCM))
		return -ERANGE;
	if (complete) {
		range = wic_range_find(space, cmd->companion);
		if (!range || companion_end > range->end || range->kind != WIC_RANGE_PCM)
			return -ERANGE;
	}
	if (data && (!cmd->length || cmd->length > bytes || cmd->length > WIC_MAX_WRITE_BYTES))
		return -EINVAL;
	/* One 8-byte head word per page: only as many pages as WIC_MAX_WRITE_BYTES has words. */
	if (heads && cmd->length != (u64)cmd->pages * sizeof(u64))
		return -EINVAL;
	if (marker && !wic_marker_valid(cmd->arg))
		return -EINVAL;
	/* The source range is never a PCM range, so it cannot overlap the pages written. */
	if (copy) {
		range = wic_range_find(space, cmd->arg);
		if (!range || range->kind != WIC_RANGE_SOURCE ||
		    check_add_overflow(cmd->arg, cmd->length, &source_end) ||
		    source_end > range->end)
			return -ERANGE;
	}
	return 0;
}

#endif /* _WIC_VALIDATE_H */
