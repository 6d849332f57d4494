/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * work.cuh - the loops of work that the benchmarks run beside waiting or stalled warps
 * (stall_cost.cu, corun.cu): eight warps per block, one block per SM, each kind of work
 * sized in rounds.
 */
#ifndef WIC_BENCH_WORK_CUH
#define WIC_BENCH_WORK_CUH

#include <cstdint>

#include <cuda_runtime.h>

namespace bench {

enum class work : int { fma_chain, fma_ilp, fma_params, shared_loads, l1_loads, l2_loads, dram_loads, tlb_misses };

inline const char *work_name(work w)
{
	switch (w) {
	case work::fma_chain:
		return "fma_chain";
	case work::fma_ilp:
		return "fma_ilp";
	case work::fma_params:
		return "fma_params";
	case work::shared_loads:
		return "shared_loads";
	case work::l1_loads:
		return "l1_loads";
	case work::l2_loads:
		return "l2_loads";
	case work::dram_loads:
		return "dram_loads";
	case work::tlb_misses:
		return "tlb_misses";
	}
	return "unknown";
}

constexpr uint32_t work_warps = 8;
constexpr uint32_t work_threads = work_warps * 32;
constexpr uint64_t large_page = 2ull << 20;
/* Per block: the working sets of l1_loads and shared_loads, l2_loads, and dram_loads' stream. */
constexpr uint64_t l1_bytes = 16 << 10, l2_bytes = 256 << 10, dram_bytes = 8 << 20;

__device__ inline uint4 add4(uint4 a, uint4 b)
{
	return make_uint4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

/*
 * The work warps' @rounds rounds of @kind (thread @t of work_threads in block @b); fma_params
 * multiplies by @m and adds @c, which the kernel takes as parameters.
 */
__device__ inline uint32_t do_work(work kind, uint32_t rounds, const uint4 *data, uint64_t data_bytes, uint32_t t,
				   uint32_t b, uint4 *smem, float m, float c)
{
	uint4 acc = make_uint4(0, 0, 0, 0);
	float x[8];
	for (int k = 0; k < 8; k++)
		x[k] = t + k;
	switch (kind) {
	case work::fma_chain:
		for (uint32_t r = 0; r < rounds; r++)
#pragma unroll
			for (int u = 0; u < 64; u++)
				x[0] = fmaf(x[0], 0.999f, 0.5f);
		break;
	case work::fma_ilp:
		for (uint32_t r = 0; r < rounds; r++)
#pragma unroll
			for (int u = 0; u < 8; u++)
#pragma unroll
				for (int k = 0; k < 8; k++)
					x[k] = fmaf(x[k], 0.999f, 0.5f);
		break;
	case work::fma_params:
		for (uint32_t r = 0; r < rounds; r++)
#pragma unroll
			for (int u = 0; u < 8; u++)
#pragma unroll
				for (int k = 0; k < 8; k++)
					x[k] = fmaf(x[k], m, c);
		break;
	case work::shared_loads: {
		const uint32_t mask = l1_bytes / 16 - 1;
		for (uint32_t r = 0; r < rounds; r++)
			for (uint32_t k = t; k <= mask; k += work_threads)
				acc = add4(acc, smem[(k + r) & mask]);
		break;
	}
	case work::l1_loads: {
		const uint4 *mine = data + b * (l1_bytes / 16);
		const uint32_t mask = l1_bytes / 16 - 1;
		for (uint32_t r = 0; r < rounds; r++)
			for (uint32_t k = t; k <= mask; k += work_threads)
				acc = add4(acc, __ldca(mine + ((k + r) & mask)));
		break;
	}
	case work::l2_loads: {
		const uint4 *mine = data + b * (l2_bytes / 16);
		const uint32_t mask = l2_bytes / 16 - 1;
		for (uint32_t r = 0; r < rounds; r++)
			for (uint32_t k = t; k <= mask; k += work_threads)
				acc = add4(acc, __ldcg(mine + ((k + r * 64) & mask)));
		break;
	}
	case work::dram_loads: {
		const uint4 *mine = data + b * (dram_bytes / 16);
		for (uint32_t r = 0; r < rounds; r++)
			for (uint64_t k = t; k < dram_bytes / 16; k += work_threads)
				acc = add4(acc, __ldcs(mine + k));
		break;
	}
	case work::tlb_misses: {
		/* Each warp's 512 bytes of a large page, the page a stride of primes away each time. */
		const uint64_t pages = data_bytes / large_page, lane = t % 32, warp = t / 32;
		for (uint32_t r = 0; r < rounds; r++)
#pragma unroll 4
			for (uint32_t k = 0; k < 16; k++) {
				const uint64_t p = (b * 7919ull + warp * 104729ull + (r * 16ull + k) * 15485863ull) % pages;
				acc = add4(acc, __ldcg(data + (p * large_page + lane * 16) / 16));
			}
		break;
	}
	}
	for (int k = 0; k < 8; k++)
		acc.x += __float_as_uint(x[k]);
	return acc.x ^ acc.y ^ acc.z ^ acc.w;
}

} /* namespace bench */

#endif /* WIC_BENCH_WORK_CUH */
