/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/results.cuh - the results direction, GPU to host: result_view and result_channel, with
 * post_result(), post_result_warp() and the flow control of result_flow and release().
 */
#ifndef WIC_RESULTS_CUH
#define WIC_RESULTS_CUH

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <cuda_runtime.h>

#include <wic/channel.cuh>

namespace wic {

/*
 * result_view - the results direction (GPU to host) as kernels see it; passed by value.
 * @data: @slots slots of @slot_bytes in pinned host memory mapped into the GPU
 * @ready: per slot, @parts ready words
 * @slot_bytes: bytes of a slot
 * @slots: slots; result generation g lives in slot g % slots
 * @parts: parts of a slot, each marked written on its own (post_result(), post_result_warp())
 * @released: generations the host is done with, counted in order (result_channel::release())
 *
 * A part's word holds g + 1 once the part of generation g is written. With fewer slots than
 * generations the kernel writes generation g only after the host released generation
 * g - slots: result_flow waits for that.
 */
struct result_view {
	uint8_t *data;
	unsigned int *ready;
	uint64_t slot_bytes;
	uint32_t slots;
	uint32_t parts;
	unsigned int *released;

	__host__ __device__ uint8_t *slot(uint32_t g) const { return data + (uint64_t)(g % slots) * slot_bytes; }
	__host__ __device__ unsigned int *word(uint32_t g, uint32_t part) const
	{
		return ready + (uint64_t)(g % slots) * parts + part;
	}
};

#ifdef __CUDACC__

/*
 * post_result() - marks @part of result generation @g written
 * @results: the results direction
 * @g: the generation
 * @part: the part
 *
 * Every thread of the block calls it after its own writes to the part: each makes them
 * visible system-wide first (__threadfence_system()), the barrier gathers the block, and one
 * thread then stores the ready word with release semantics at system scope, so the host that
 * reads the word (result_channel::ready(), wait()) reads the part.
 */
__device__ inline void post_result(const result_view &results, uint32_t g, uint32_t part)
{
	__threadfence_system();
	__syncthreads();
	if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
		detail::store_release(results.word(g, part), g + 1);
}

/*
 * post_result_warp() - post_result() for a part one warp wrote: every lane of a whole warp
 * (32 threads of the block, counted in x, then y, then z) calls it after its own writes, and the
 * warp's first lane marks the part; the rest of the block goes on.
 */
__device__ inline void post_result_warp(const result_view &results, uint32_t g, uint32_t part)
{
	__threadfence_system();
	__syncwarp();
	if (detail::thread_in_block() % 32 == 0)
		detail::store_release(results.word(g, part), g + 1);
}

/*
 * result_flow - flow control of the results direction, kept by the one thread of a block (or
 * of the grid) that writes result generations in order; a local variable of that thread.
 *
 * wait() returns once result generation @g's slot may be written: at once while g is within
 * @slots of the generations the host released as last seen, else after reading the host's
 * count again, with push's backoff while the host has not released g - slots. It reads the
 * count (in host memory) only then, because a GPU thread's read of host memory waits behind
 * the copies streaming into the GPU, and a read per generation slows the whole stream
 * (device/bench/README.md, "Results back"). Give the result_channel enough slots that the
 * host's releases run ahead: each read then frees several generations. The threads that write the slot follow wait() through a barrier
 * (__syncthreads(), __syncwarp()).
 *
 * Return: WIC_OK; WIC_ETIMED_OUT after @timeout_ns (0: look once; forever, the default: never).
 */
struct result_flow {
	uint32_t released = 0; /* the host's count as last read */

	__device__ int wait(const result_view &results, uint32_t g, uint64_t timeout_ns = forever)
	{
		unsigned seen;

		if ((int)(g - released) < (int)results.slots)
			return WIC_OK;
		const int status =
			detail::wait_past(results.released, g - results.slots, push_max_sleep_ns, timeout_ns, &seen);
		if (status == WIC_OK)
			released = seen;
		return status;
	}
};

#endif /* __CUDACC__ */

/*
 * result_channel - the host end of the results direction (host code): the slots, ready words and
 * released words of a result_view in pinned host memory mapped into the current device. Kernels
 * take device(), write a generation's parts, and call post_result() or post_result_warp(); the
 * host reads a part once ready() says it is written, or waits for it (wait()), and release()s
 * the generation when done with its slot, which result_flow on the device waits for before it
 * lets the slot be written again.
 */
class result_channel {
public:
	result_channel() = default;
	result_channel(const result_channel &) = delete;
	result_channel &operator=(const result_channel &) = delete;
	~result_channel() { destroy(); }

	/*
	 * @slots slots of @slot_bytes, @parts parts each; the data is left as allocated.
	 * Return: WIC_OK; WIC_EINVALID for a zero size; WIC_EIO with the failed call's error.
	 */
	outcome create(uint32_t slots, uint64_t slot_bytes, uint32_t parts)
	{
		if (!slots || !slot_bytes || !parts)
			return detail::invalid();
		destroy();
		const size_t words = (size_t)slots * parts * sizeof(unsigned int);
		host_ = result_view{nullptr, nullptr, slot_bytes, slots, parts, nullptr};
		cudaError_t err = cudaHostAlloc(&host_.data, slots * slot_bytes, cudaHostAllocMapped);
		if (err == cudaSuccess)
			err = cudaHostAlloc(&host_.ready, words, cudaHostAllocMapped);
		if (err == cudaSuccess)
			err = cudaHostAlloc(&host_.released, sizeof(unsigned int), cudaHostAllocMapped);
		if (err == cudaSuccess) {
			memset(host_.ready, 0, words);
			*host_.released = 0;
			dev_ = host_;
			err = cudaHostGetDevicePointer((void **)&dev_.data, host_.data, 0);
		}
		if (err == cudaSuccess)
			err = cudaHostGetDevicePointer((void **)&dev_.ready, host_.ready, 0);
		if (err == cudaSuccess)
			err = cudaHostGetDevicePointer((void **)&dev_.released, host_.released, 0);
		if (err != cudaSuccess)
			destroy();
		return outcome{err};
	}

	/* What kernels take. */
	result_view device() const { return dev_; }
	/* The same with host addresses: host().slot(g) is where the host reads generation g. */
	result_view host() const { return host_; }

	/* Whether @part of generation @g is written (wrapping difference, as the generations). */
	bool ready(uint32_t g, uint32_t part) const
	{
		return (int)(__atomic_load_n(host_.word(g, part), __ATOMIC_ACQUIRE) - g) > 0;
	}

	/*
	 * Waits until @part of generation @g is written, yielding the CPU between looks.
	 * Return: WIC_OK; WIC_EINVALID for a bad part; WIC_ETIMED_OUT (cudaErrorTimeout) after
	 * @timeout_ns (0: look once; forever, the default: never).
	 */
	outcome wait(uint32_t g, uint32_t part, uint64_t timeout_ns = forever) const
	{
		if (!host_.ready || part >= host_.parts)
			return detail::invalid();
		const auto start = std::chrono::steady_clock::now();
		while (!ready(g, part)) {
			if (detail::past(start, timeout_ns))
				return detail::timed_out();
			std::this_thread::yield();
		}
		return outcome{};
	}

	/*
	 * release() - the host is done with generation @g and every one before it: their slots
	 * may take the generations @slots later (result_flow). Releasing a generation older than
	 * one already released changes nothing. Return: WIC_OK; WIC_EINVALID before create().
	 */
	outcome release(uint32_t g)
	{
		if (!host_.released)
			return detail::invalid();
		/* Wrapping difference, as the generations: never back. */
		if ((int)(g + 1 - *host_.released) > 0)
			__atomic_store_n(host_.released, g + 1, __ATOMIC_RELEASE);
		return outcome{};
	}

	void destroy()
	{
		if (host_.data)
			cudaFreeHost(host_.data);
		if (host_.ready)
			cudaFreeHost(host_.ready);
		if (host_.released)
			cudaFreeHost(host_.released);
		host_ = result_view{};
		dev_ = result_view{};
	}

private:
	result_view host_{}, dev_{};
};

} /* namespace wic */

#endif /* WIC_RESULTS_CUH */
