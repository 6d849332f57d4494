/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * stream.cuh - the host side shared by the streaming applications: a producer thread that
 * publishes G generations into each of a channel's slots, with flow control, and the three
 * ways to run a consumer kernel (push, poll, and the no-wait lower bound).
 */
#ifndef WIC_APPS_STREAM_CUH
#define WIC_APPS_STREAM_CUH

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <wic/wic.cuh>

#define CHECK(call)                                                                                     \
	do {                                                                                            \
		cudaError_t err_ = (call);                                                              \
		if (err_ != cudaSuccess) {                                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
			exit(2);                                                                        \
		}                                                                                       \
	} while (0)

namespace app {

/* How a run gets its data. */
enum class mode { push, poll, nowait };

inline const char *mode_name(mode m)
{
	return m == mode::push ? "push" : m == mode::poll ? "poll" : "nowait";
}

inline bool parse_mode(const char *text, mode *out)
{
	for (mode m : {mode::push, mode::poll, mode::nowait})
		if (!strcmp(text, mode_name(m))) {
			*out = m;
			return true;
		}
	return false;
}

/*
 * Where item (block b, generation g) lives: streaming runs reuse slot b, generation g; the
 * no-wait run gives every item its own slot, all published before the kernel starts.
 */
struct placement {
	uint32_t generations;
	bool nowait;

	__host__ __device__ uint32_t slot(uint32_t b, uint32_t g) const { return nowait ? b * generations + g : b; }
	__host__ __device__ uint32_t generation(uint32_t g) const { return nowait ? 0 : g; }
};

/*
 * consumed[b] counts messages of block b's slot the kernel has finished with, in pinned host
 * memory: the producer reuses a slot only after all warps read its previous generation.
 */
__device__ inline void mark_consumed(unsigned int *consumed, uint32_t b)
{
	if (threadIdx.x % 32 == 0)
		atomicAdd_system(&consumed[b], 1u);
}

/* A run's wall time, from the first publish (no-wait: from the launch) to the kernel's end. */
struct timing {
	double total_ms;
};

/*
 * Runs one streaming execution: @fill(b, g, buf) writes item (b, g)'s batch_bytes into buf;
 * @launch(channel, placement, consumed, stream) starts the consumer kernel.
 */
inline timing run(mode m, uint32_t blocks, uint32_t generations, uint32_t message_bytes, uint32_t warps,
		  const std::function<void(uint32_t, uint32_t, uint8_t *)> &fill,
		  const std::function<void(const wic::channel &, placement, unsigned int *, cudaStream_t)> &launch)
{
	const placement place{generations, m == mode::nowait};
	const uint32_t slots = place.nowait ? blocks * generations : blocks;
	wic::host_channel ch;
	CHECK(ch.create(m == mode::poll ? wic::transport::poll : wic::transport::push, slots, message_bytes, warps));
	const size_t batch = ch.device().batch_bytes;
	unsigned int *consumed;
	CHECK(cudaHostAlloc(&consumed, blocks * sizeof(unsigned), cudaHostAllocMapped));
	memset(consumed, 0, blocks * sizeof(unsigned));
	unsigned int *consumed_dev;
	CHECK(cudaHostGetDevicePointer((void **)&consumed_dev, consumed, 0));
	cudaStream_t kernel_stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	/* One pinned staging buffer per slot, so an async copy's source is not overwritten early. */
	uint8_t *staging;
	CHECK(cudaHostAlloc(&staging, batch * slots, cudaHostAllocDefault));

	auto publish = [&](uint32_t b, uint32_t g) {
		const uint32_t slot = place.slot(b, g);
		uint8_t *buf = staging + (size_t)slot * batch;
		fill(b, g, buf);
		CHECK(ch.publish(slot, buf, batch, copy_stream));
	};
	const auto start = std::chrono::steady_clock::now();
	if (place.nowait) {
		for (uint32_t g = 0; g < generations; g++)
			for (uint32_t b = 0; b < blocks; b++)
				publish(b, g);
		CHECK(cudaStreamSynchronize(copy_stream));
	}
	const auto launched = std::chrono::steady_clock::now();
	launch(ch.device(), place, consumed_dev, kernel_stream);
	CHECK(cudaGetLastError());
	if (!place.nowait) {
		for (uint32_t g = 0; g < generations; g++)
			for (uint32_t b = 0; b < blocks; b++) {
				/* Wait until every warp finished generation g - 1 of this slot. */
				while (__atomic_load_n(&consumed[b], __ATOMIC_ACQUIRE) < g * warps)
					std::this_thread::yield();
				publish(b, g);
			}
	}
	CHECK(cudaStreamSynchronize(kernel_stream));
	CHECK(cudaStreamSynchronize(copy_stream));
	const auto end = std::chrono::steady_clock::now();
	CHECK(cudaFreeHost(staging));
	CHECK(cudaFreeHost(consumed));
	CHECK(cudaStreamDestroy(kernel_stream));
	CHECK(cudaStreamDestroy(copy_stream));
	/* No-wait: the consumer alone, its data all there before it started. */
	return timing{std::chrono::duration<double, std::milli>(end - (place.nowait ? launched : start)).count()};
}

inline double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v.empty() ? 0.0 : v[v.size() / 2];
}

} /* namespace app */

#endif /* WIC_APPS_STREAM_CUH */
