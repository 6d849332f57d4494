/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * register_budget - the consumer kernels a newcomer writes, one per transport and shape, for
 * tests/tests/device_compile.rs to hold to its register and stack budgets (-Xptxas -v): a
 * 16-warp consumer (512 threads, no launch bounds) that sums its messages, and a one-warp
 * latency consumer that stamps each generation's arrival. Compiled, never run.
 */
#include <wic/wic.cuh>

namespace {

/* Each warp receives its message of every slot and generation and sums it. */
template <typename Recv>
__device__ void consume(const wic::channel &ch, uint32_t generations, unsigned long long *sum, Recv recv)
{
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	unsigned long long acc = 0;
	for (uint32_t g = 0; g < generations; g++) {
		for (uint32_t s = 0; s < ch.slots; s++) {
			const uint8_t *message;
			if (recv(ch, s, g, warp, &message) != WIC_OK)
				return;
			for (uint32_t i = lane; i < ch.message_bytes; i += 32)
				acc += message[i];
			if (threadIdx.x == 0)
				wic::consumed(ch, s, g);
		}
	}
	atomicAdd(sum, acc);
}

/* One warp: when each generation of slot 0 arrived, by the GPU's clock. */
template <typename Recv>
__device__ void latency(const wic::channel &ch, uint32_t generations, unsigned long long *arrived, Recv recv)
{
	for (uint32_t g = 0; g < generations; g++) {
		const uint8_t *message;
		if (recv(ch, 0, g, 0, &message, 1000000000ULL) != WIC_OK)
			return;
		if (threadIdx.x == 0) {
			arrived[g] = wic::detail::globaltimer();
			wic::consumed(ch, 0, g);
		}
	}
}

} /* namespace */

#define RECV(K)                                                                                                \
	[](const wic::channel &c, uint32_t s, uint32_t g, uint32_t w, const uint8_t **m, uint64_t t = wic::forever) {       \
		return wic::recv<wic::transport::K>(c, s, g, w, m, t);                                                \
	}
#define BUDGET_KERNELS(K)                                                                                      \
	extern "C" __global__ void consume16_##K(wic::channel ch, uint32_t n, unsigned long long *out)              \
	{                                                                                                      \
		consume(ch, n, out, RECV(K));                                                                     \
	}                                                                                                      \
	extern "C" __global__ void latency1_##K(wic::channel ch, uint32_t n, unsigned long long *out)               \
	{                                                                                                      \
		latency(ch, n, out, RECV(K));                                                                     \
	}

BUDGET_KERNELS(fault)
BUDGET_KERNELS(push)
BUDGET_KERNELS(poll)
BUDGET_KERNELS(alg1)
BUDGET_KERNELS(mapped)
BUDGET_KERNELS(tagged)

/* The run-time form, which carries every transport's wait. */
#define RECV_ANY                                                                                               \
	[](const wic::channel &c, uint32_t s, uint32_t g, uint32_t w, const uint8_t **m, uint64_t t = wic::forever) {       \
		return wic::recv(c, s, g, w, m, t);                                                                   \
	}
extern "C" __global__ void consume16_any(wic::channel ch, uint32_t n, unsigned long long *out)
{
	consume(ch, n, out, RECV_ANY);
}
extern "C" __global__ void latency1_any(wic::channel ch, uint32_t n, unsigned long long *out)
{
	latency(ch, n, out, RECV_ANY);
}
