/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/channel.cuh - a channel's layout as kernels see it (wic::channel), the transports, and
 * what their waits and producers share: the memory operations at system scope, the backoff of
 * a waiter, the tagged transport's lines; on the host, the helpers of both kinds of producer.
 */
#ifndef WIC_CHANNEL_CUH
#define WIC_CHANNEL_CUH

#include <chrono>
#include <cstdint>
#include <functional>
#include <cuda_runtime.h>

#include <wic/status.cuh>

namespace wic {

/*
 * How a channel's consumers wait. launch: they do not; the consumer kernel of a delivery is
 * launched in stream order after its data has landed (host_channel::launch_consumer()).
 */
enum class transport : uint32_t { fault = 0, push = 1, poll = 2, alg1 = 3, mapped = 4, tagged = 5, launch = 6 };

/* The transport's name, as the benchmarks and applications print it. */
inline const char *transport_name(transport kind)
{
	switch (kind) {
	case transport::fault:
		return "fault";
	case transport::push:
		return "push";
	case transport::poll:
		return "poll";
	case transport::alg1:
		return "alg1";
	case transport::mapped:
		return "mapped";
	case transport::tagged:
		return "tagged";
	case transport::launch:
		return "launch";
	}
	return "unknown";
}

/*
 * sharing - what else runs on the consumers' GPU while they wait, for pick_host_transport()
 * and pick_peer_transport(): nothing (alone), kernels bound by arithmetic, or kernels bound by
 * memory (loads that hit in L2 or stream from device memory).
 */
enum class sharing { alone, arithmetic, memory };

/*
 * push_max_sleep_ns - the longest __nanosleep of push's backoff, in nanoseconds, unless a
 * channel's backoff_ns says otherwise; also the backoff of wait_consumed() and result_flow. A
 * shorter cap wakes a waiter sooner and takes more issue slots from the warps beside it;
 * device/bench/README.md ("Push's backoff") has the measurements this value comes from.
 */
constexpr unsigned push_max_sleep_ns = 256;

/*
 * channel - what a kernel needs of a channel; passed by value.
 * @kind: the transport
 * @slots: slots of the channel
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: warps served by one generation of a slot
 * @batch_bytes: warps_per_batch * message_bytes
 * @runs: fault: device array of 2 * slots run addresses, runs[2 * s + g % 2]
 * @data: push, poll, tagged, launch: the consumer GPU's memory (tagged: where consumers unpack
 *	the lines); alg1: managed memory; mapped: pinned host memory; slot s at
 *	data + s * batch_bytes
 * @ready: generations published per slot: push and launch (the consumer GPU's memory), poll
 *	(pinned host memory for a host producer, the producer GPU's memory for a GPU producer),
 *	alg1 (managed memory), mapped (pinned host memory)
 * @consumed: per slot, generations its consumers are done with (wic::consumed()): in the
 *	producer GPU's memory (peer_channel) or pinned host memory (host_channel); null for fault
 *	channels
 * @lines: tagged: 2 * batch_bytes per slot in the consumer GPU's memory, 16-byte line i of
 *	slot s (data bytes 8i to 8i + 7) at lines + 2 * (s * batch_bytes / 8 + i)
 * @staging: tagged with a GPU producer: batch_bytes per slot in the producer GPU's memory, where
 *	it writes a batch (slot_buffer()) before publish_block() sends it as lines; null with a
 *	host producer, whose lines are formatted in pinned host memory by host_channel
 * @backoff_ns: the longest __nanosleep between two looks at a ready word (tagged: a line); 0
 *	spins. push, tagged: push_max_sleep_ns as created; the others spin. A waiter that sleeps longer wakes up
 *	later (about half the cap, on average) but takes fewer issue slots from the warps beside
 *	it; device/bench/transport.cu measures both.
 */
struct channel {
	transport kind;
	uint32_t slots;
	uint32_t message_bytes;
	uint32_t warps_per_batch;
	uint64_t batch_bytes;
	const uint64_t *runs;
	const uint8_t *data;
	const unsigned int *ready;
	unsigned int *consumed;
	uint64_t *lines;
	uint8_t *staging;
	uint32_t backoff_ns;
};

/*
 * delivery - what a launch channel's consumer is launched for: the generations just landed in
 * slots first_slot to first_slot + slots - 1 (a host producer's: one slot for publish(), more
 * for publish_many() and coalesce()'s runs; a producer kernel's: the slots given to
 * peer_channel::launch_when_published()). Its kernel learns each slot's generation with
 * wic::launched_generation() and receives it as any consumer does (recv(), recv_block()),
 * which finds it there at the first look.
 */
struct delivery {
	uint32_t first_slot;
	uint32_t slots;
};

/*
 * launcher - queues a launch channel's consumer of @d on @stream: a kernel launch or a CUDA
 * graph's (cudaGraphLaunch()), and nothing that waits for the host. Returns the launch's
 * error (cudaGetLastError() after a <<<>>> launch).
 */
using launcher = std::function<cudaError_t(const delivery &d, cudaStream_t stream)>;

#ifdef __CUDACC__

namespace detail {

__device__ inline unsigned load_acquire(const unsigned int *word)
{
	unsigned value;

	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(word) : "memory");
	return value;
}

__device__ inline void store_release(unsigned int *word, unsigned value)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
}

__device__ inline uint64_t load_volatile(const void *address)
{
	return *static_cast<const volatile uint64_t *>(address);
}

__device__ inline uint64_t globaltimer()
{
	uint64_t ns;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
	return ns;
}

/*
 * backoff - the pauses of a waiter that looks at a word again and again: sleeps from 32 ns
 * doubling up to @cap_ns (0: spinning), gives up once @timeout_ns (0: after the first look;
 * forever: never) have passed.
 */
class backoff {
public:
	__device__ backoff(uint32_t cap_ns, uint64_t timeout_ns)
		: start_(timeout_ns != forever ? globaltimer() : 0), timeout_ns_(timeout_ns), cap_ns_(cap_ns),
		  sleep_ns_(cap_ns < 32 ? cap_ns : 32)
	{
	}

	/* After a look that found nothing: false once the time is up, else true after a pause. */
	__device__ bool pause()
	{
		if (timeout_ns_ != forever && globaltimer() - start_ >= timeout_ns_)
			return false;
		if (sleep_ns_) {
			__nanosleep(sleep_ns_);
			sleep_ns_ = 2 * sleep_ns_ < cap_ns_ ? 2 * sleep_ns_ : cap_ns_;
		}
		return true;
	}

private:
	uint64_t start_;
	uint64_t timeout_ns_;
	uint32_t cap_ns_;
	uint32_t sleep_ns_;
};

/*
 * Waits until @word, which counts generations, passed @generation; WIC_ETIMED_OUT if not.
 * *@seen, if given: the word's value that ended the wait.
 */
__device__ inline int wait_past(const unsigned int *word, uint32_t generation, uint32_t backoff_ns,
				uint64_t timeout_ns, unsigned *seen = nullptr)
{
	backoff pause(backoff_ns, timeout_ns);
	unsigned value;

	/* Wrapping difference: generations count modulo 2^32. */
	while ((int)((value = load_acquire(word)) - generation) <= 0)
		if (!pause.pause())
			return WIC_ETIMED_OUT;
	if (seen)
		*seen = value;
	return WIC_OK;
}

/*
 * The tagged transport's lines. Generation g's tag is g + 1, so the zeroed lines of a new slot
 * carry none; a slot's line holds the tag of its last generation until the next one's
 * arrives; the producer writes generation g + 1 after generation g was consumed (unless a host
 * producer's channel leaves reuse to the caller, wic::reuse::caller).
 */
__device__ inline uint64_t *line_at(const channel &ch, uint32_t slot, uint64_t line)
{
	return ch.lines + 2 * ((uint64_t)slot * (ch.batch_bytes / 8) + line);
}

/*
 * A thread sends or receives its lines this many at a time: the loads of a round are
 * independent, so their latencies overlap instead of adding up line after line.
 */
constexpr uint32_t lines_per_round = 8;

__device__ inline void store_line(uint64_t *at, uint64_t data, uint32_t tag)
{
	const uint64_t tagged = (uint64_t)tag << 32;

	asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(tagged | (data & 0xffffffffULL)),
		     "l"(tagged | data >> 32)
		     : "memory");
}

__device__ inline void load_line(const uint64_t *at, uint64_t *lo, uint64_t *hi)
{
	asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(*lo), "=l"(*hi) : "l"(at) : "memory");
}

/* This thread's index in its block, and the block's threads. */
__device__ inline uint32_t thread_in_block()
{
	return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

__device__ inline uint32_t block_threads()
{
	return blockDim.x * blockDim.y * blockDim.z;
}

} /* namespace detail */

#endif /* __CUDACC__ */

namespace detail {

/* A channel of these sizes with no memory yet, and the transport's default backoff. */
inline channel empty_channel(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch)
{
	return channel{kind, slots, message_bytes, warps_per_batch, (uint64_t)warps_per_batch * message_bytes,
		       nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
		       kind == transport::push || kind == transport::tagged ? push_max_sleep_ns : 0};
}

/*
 * Runs @queue(stream) on a stream of its own and waits for it. Not the legacy default stream,
 * which would wait for every blocking stream's kernels, a running persistent consumer's among
 * them; and the wait makes the operation done when this returns (cudaMemset() may return early).
 */
template <typename F>
inline cudaError_t on_own_stream(F queue)
{
	cudaStream_t stream;
	cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
	if (err != cudaSuccess)
		return err;
	err = queue(stream);
	const cudaError_t synced = cudaStreamSynchronize(stream);
	const cudaError_t destroyed = cudaStreamDestroy(stream);
	return err != cudaSuccess ? err : synced != cudaSuccess ? synced : destroyed;
}

/*
 * Whether @stream is the legacy default stream, which waits for the kernels of every blocking
 * stream: a publish queued there never runs while a persistent consumer kernel does.
 */
inline bool legacy_default(cudaStream_t stream)
{
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
	return stream == cudaStreamLegacy;
#else
	return stream == cudaStreamLegacy || stream == nullptr;
#endif
}

/* Zeroes @bytes of device memory at @ptr, done when this returns. */
inline cudaError_t zero_device(void *ptr, size_t bytes)
{
	return on_own_stream([&](cudaStream_t stream) { return cudaMemsetAsync(ptr, 0, bytes, stream); });
}

/* Whether @timeout_ns (forever: never) has passed since @start. */
inline bool past(std::chrono::steady_clock::time_point start, uint64_t timeout_ns)
{
	/* Beyond 2^63 ns (292 years) is never too. */
	return timeout_ns <= (uint64_t)INT64_MAX &&
	       std::chrono::steady_clock::now() - start >= std::chrono::nanoseconds((int64_t)timeout_ns);
}

/* The refusals of a bad argument and of a wait that ran out, as the cudaError_t they were. */
constexpr outcome invalid()
{
	return outcome{WIC_EINVALID, cudaErrorInvalidValue};
}

constexpr outcome timed_out()
{
	return outcome{WIC_ETIMED_OUT, cudaErrorTimeout};
}

} /* namespace detail */

} /* namespace wic */

#endif /* WIC_CHANNEL_CUH */
