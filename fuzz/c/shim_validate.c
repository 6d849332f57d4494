// SPDX-License-Identifier: GPL-2.0
/*
 * shim_validate.c - shim/wic_validate.h built for user space, for the fuzz targets.
 *
 * Its static inline functions get entry points Rust can call, and a fake process address space
 * stands in for the mm that wic_shim.c walks with vma_lookup().
 */
#include "kernel_compat.h"
#include "wic_validate.h"

/**
 * struct wic_fuzz_mm - a fake process address space
 * @maps: its mappings, [start, end) each, sorted and not overlapping
 * @nr: mappings in @maps
 */
struct wic_fuzz_mm {
	const u64 (*maps)[2];
	u32 nr;
};

/* vma_lookup() on the fake mappings: the end of the one holding @addr, or 0. */
static u64 wic_fuzz_mapping_end(void *mm, u64 addr)
{
	const struct wic_fuzz_mm *fake = mm;
	u32 i;

	for (i = 0; i < fake->nr; i++)
		if (fake->maps[i][0] <= addr && addr < fake->maps[i][1])
			return fake->maps[i][1];
	return 0;
}

/* wic_inside_mm() on the fake mappings. */
static bool wic_fuzz_mapped(void *mm, u64 start, u64 end)
{
	return wic_range_covered(start, end, wic_fuzz_mapping_end, mm);
}

int wic_fuzz_check_submit(const struct wic_submit *sub)
{
	return wic_check_submit(sub);
}

int wic_fuzz_check_command(const struct wic_command *cmd, const struct wic_range_list *space)
{
	return wic_check_command(cmd, space);
}

int wic_fuzz_check_register(const struct wic_range *r, const struct wic_range_list *space,
			    u32 nr_ranges, const struct wic_fuzz_mm *mm, u64 *end, u32 *at)
{
	return wic_check_register(r, space, nr_ranges, wic_fuzz_mapped, (void *)mm, end, at);
}

void wic_fuzz_ranges_insert(struct wic_range_entry *dst, const struct wic_range_list *src, u32 at,
			    const struct wic_range_entry *entry)
{
	wic_ranges_insert(dst, src, at, entry);
}

int wic_fuzz_range_index(const struct wic_range_list *list, u32 range_id)
{
	return wic_range_index(list, range_id);
}

void wic_fuzz_ranges_remove(struct wic_range_entry *dst, const struct wic_range_list *src, u32 at)
{
	wic_ranges_remove(dst, src, at);
}

/* sizeof(struct wic_range_entry), which fuzz/src/shim.rs mirrors. */
unsigned long wic_fuzz_range_entry_size(void)
{
	return sizeof(struct wic_range_entry);
}
