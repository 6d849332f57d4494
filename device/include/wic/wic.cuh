/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic.cuh - the device side of wic: how consumer warps wait for a channel's data.
 *
 * A channel carries, per slot and generation, one batch of warps_per_batch messages of
 * message_bytes each; warp w of the batch reads bytes [w * message_bytes, (w + 1) *
 * message_bytes). Generation g of slot s is published once; its consumers call wic::recv().
 *
 * Six transports, chosen per channel:
 *  - fault: the batch's run is an unmapped managed page; reading it stalls the warp in hardware
 *    until wicd (shim backend, patched nvidia-uvm) writes the data, maps the run and replays.
 *    Needs the patched driver. The channel comes from libwic (wic_channel_create_at). A GPU
 *    producer of such a channel (WIC_PRODUCER_GPU) publishes by writing the slot's PAT page
 *    (wic_slot_info::pat_va[generation % 2]), which wicd also sees as a fault: the patched
 *    driver again. wic::publish() is not for fault channels.
 *  - push: the producer's data goes into the consumer GPU's memory, then a ready word there
 *    tells the slot's generation; warps wait on that word with __nanosleep backoff, never
 *    across a link. A host producer copies and sets the word in stream order (host_channel); a
 *    kernel on another GPU writes both over the peer link (peer_channel, wic::publish()). Runs
 *    on the stock driver.
 *  - poll: the naive baseline: the data is in the consumer GPU's memory, the ready word in the
 *    producer's (pinned host memory, or the producer GPU's memory), and warps spin on it without
 *    backoff across PCIe or the peer link.
 *  - alg1: the WIC paper's Algorithm 1 made correct on a GPU without host-native atomics: data
 *    and ready words in managed memory, where nvidia-uvm moves the pages on demand. A host
 *    producer (host_channel) writes both with plain stores; a producer kernel on another GPU
 *    (peer_channel, wic::publish()) writes the data and stores the word with release semantics
 *    at system scope where the paper's producer has atomicAdd(&flag, 1). The waiter spins on
 *    its slot's word without backoff, with an acquire load at system scope where the paper has
 *    a device-scope atomicAdd(&flag, 0), which on an H100 stops seeing the host once
 *    nvidia-uvm pins the page in host memory (device/bench/README.md, "Algorithm 1 on an
 *    H100"). recv_block() waits as the paper's consumer does: thread 0 alone, then the block's
 *    barrier.
 *  - mapped: for small messages from a host producer (host_channel): data and ready words in
 *    pinned host memory mapped into the GPU. The host writes both with plain stores, no copy
 *    engine and no driver call; the waiter spins on the word across the link and the consumer
 *    then reads the message there, once per access.
 *  - tagged: for small messages: no ready word; every 4 bytes of data cross the link next to
 *    the generation's tag, in 16-byte lines of two 64-bit words (NCCL's LL protocol). From a
 *    kernel on another GPU (peer_channel): a 64-bit store is single-copy atomic, so a consumer
 *    that reads a word carrying the tag reads the data beside it, and the producer needs no
 *    fence before a flag: push's __threadfence_system() waits for its data's stores to be
 *    acknowledged across the link before the ready word may follow. From a host producer
 *    (host_channel): the host formats the lines in pinned memory and queues one copy of them
 *    into the consumer GPU's memory, half of push's calls, with no ready word written
 *    after the copy; this relies on the copy engine writing each aligned 64-bit word whole,
 *    which the transport test checks byte by byte but NVIDIA does not document. The price:
 *    twice the bytes on the link, the consumers unpack the lines into the consumer GPU's
 *    memory, and a host producer formats every byte on its own thread.
 *
 * A producer learns that the consumers are done with a generation, so that it may write the
 * slot again, through a word per slot that one consumer thread sets (wic::consumed()): in the
 * producer GPU's memory for a GPU producer (wic::wait_consumed()), in pinned host memory for a
 * host producer (host_channel::wait_free()).
 *
 * Device code includes this header; host code uses wic::host_channel to create push, poll,
 * alg1, mapped and tagged channels with a host producer and to publish, wic::peer_channel for ones
 * whose producer is a kernel on another GPU, and wic::fault_channel() to wrap a libwic channel.
 */
#ifndef WIC_WIC_CUH
#define WIC_WIC_CUH

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <cuda_runtime.h>
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include <wic.h>

namespace wic {

/* How a channel's consumers wait. */
enum class transport : uint32_t { fault = 0, push = 1, poll = 2, alg1 = 3, mapped = 4, tagged = 5 };

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
	}
	return "unknown";
}

/*
 * error_name() - the name of a WIC_* status, "WIC_ETIMED_OUT" for WIC_ETIMED_OUT, in host and
 * device code alike and with no library linked (libwic's wic_strerror() describes a status on
 * the host): a kernel can print what recv() returned. "WIC_E?" for a value wic.h does not define.
 */
__host__ __device__ constexpr const char *error_name(int status)
{
	switch (status) {
	case WIC_OK:
		return "WIC_OK";
	case WIC_EINVALID:
		return "WIC_EINVALID";
	case WIC_EPERMISSION:
		return "WIC_EPERMISSION";
	case WIC_ENOT_FOUND:
		return "WIC_ENOT_FOUND";
	case WIC_EEXHAUSTED:
		return "WIC_EEXHAUSTED";
	case WIC_EBUSY:
		return "WIC_EBUSY";
	case WIC_ETIMED_OUT:
		return "WIC_ETIMED_OUT";
	case WIC_ECLOSED:
		return "WIC_ECLOSED";
	case WIC_ESTOPPING:
		return "WIC_ESTOPPING";
	case WIC_EPROTOCOL:
		return "WIC_EPROTOCOL";
	case WIC_ECONNECT:
		return "WIC_ECONNECT";
	case WIC_EUNSUPPORTED:
		return "WIC_EUNSUPPORTED";
	case WIC_EIO:
		return "WIC_EIO";
	default:
		return "WIC_E?";
	}
}

/*
 * The longest __nanosleep of push's backoff, in nanoseconds, unless a channel's backoff_ns says
 * otherwise; also the producer's backoff in wait_consumed(). Measured by device/bench/transport
 * (H100, stock driver 580.159.04, 2026-11-26): a 64-byte message's round trip is 9.1 us at
 * 256 ns, with one warp or 2112 waiting, against 12.2 us at 2048 ns and 8.9 us spinning; 8
 * waiting warps per SM slow an issue-bound neighbour by 1.7% at 256 ns, 0.6% at 2048 ns and
 * 1.9% spinning, a memory-bound one by 0.2% or less.
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
 * @data: push, poll, tagged: the consumer GPU's memory (tagged: where consumers unpack the
 *	lines); alg1: managed memory; mapped: pinned host memory; slot s at data + s * batch_bytes
 * @ready: generations published per slot: push (the consumer GPU's memory), poll (pinned host
 *	memory for a host producer, the producer GPU's memory for a GPU producer), alg1 (managed
 *	memory), mapped (pinned host memory)
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
 * result_view - the results direction (GPU to host) as kernels see it; passed by value.
 * @data: @slots slots of @slot_bytes in pinned host memory mapped into the GPU
 * @ready: per slot, @parts ready words
 * @slot_bytes: bytes of a slot
 * @slots: slots; result generation g lives in slot g % slots
 * @parts: parts of a slot, each marked written on its own (post_result())
 *
 * A part's word holds g + 1 once the part of generation g is written. With fewer slots than
 * generations the kernel may write generation g only after the host is done with generation
 * g - slots, which the application's own protocol must tell it (the host's next message).
 */
struct result_view {
	uint8_t *data;
	unsigned int *ready;
	uint64_t slot_bytes;
	uint32_t slots;
	uint32_t parts;

	__host__ __device__ uint8_t *slot(uint32_t g) const { return data + (uint64_t)(g % slots) * slot_bytes; }
	__host__ __device__ unsigned int *word(uint32_t g, uint32_t part) const
	{
		return ready + (uint64_t)(g % slots) * parts + part;
	}
};

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

/* The error a marker word stands for, or WIC_OK for data. */
__device__ inline int marker_status(uint64_t word)
{
	if ((word & 0xffffffff00000000ULL) != WIC_ERROR_MARKER_MAGIC)
		return WIC_OK;
	switch (word & 0xffffffffULL) {
	case 1:
		return WIC_ETIMED_OUT;
	case 2:
		return WIC_ECLOSED;
	case 3:
		return WIC_ESTOPPING;
	case 4:
		return WIC_ECONNECT;
	default:
		return WIC_OK;
	}
}

/*
 * backoff - the pauses of a waiter that looks at a word again and again: sleeps from 32 ns
 * doubling up to @cap_ns (0: spinning), gives up once @timeout_ns (0: never) have passed.
 */
class backoff {
public:
	__device__ backoff(uint32_t cap_ns, uint64_t timeout_ns)
		: start_(timeout_ns ? globaltimer() : 0), timeout_ns_(timeout_ns), cap_ns_(cap_ns),
		  sleep_ns_(cap_ns < 32 ? cap_ns : 32)
	{
	}

	/* After a look that found nothing: false once the time is up, else true after a pause. */
	__device__ bool pause()
	{
		if (timeout_ns_ && globaltimer() - start_ > timeout_ns_)
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

/* Waits until @word, which counts generations, passed @generation; WIC_ETIMED_OUT if not. */
__device__ inline int wait_past(const unsigned int *word, uint32_t generation, uint32_t backoff_ns,
				uint64_t timeout_ns)
{
	backoff pause(backoff_ns, timeout_ns);

	/* Wrapping difference: generations count modulo 2^32. */
	while ((int)(load_acquire(word) - generation) <= 0)
		if (!pause.pause())
			return WIC_ETIMED_OUT;
	return WIC_OK;
}

/*
 * The tagged transport's lines. Generation g's tag is g + 1, so the zeroed lines of a new slot
 * carry none; a slot's line holds the tag of its last generation until the next one's
 * arrives, and the producer writes generation g + 1 only after generation g was consumed.
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

/*
 * Sends lines [@first, @end) of @slot's staged batch, every @stride-th from @first, as
 * generation @generation: line i carries data bytes 8i to 8i + 7.
 */
__device__ inline void send_lines(const channel &ch, uint32_t slot, uint32_t generation, uint64_t first, uint64_t end,
				  uint32_t stride)
{
	const uint64_t *staged = reinterpret_cast<const uint64_t *>(ch.staging + (uint64_t)slot * ch.batch_bytes);

	for (uint64_t line = first; line < end; line += lines_per_round * stride) {
		uint64_t data[lines_per_round];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				data[j] = staged[line + j * stride];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				store_line(line_at(ch, slot, line + j * stride), data[j], generation + 1);
	}
}

/*
 * Lines [@first, @end) of @slot, every @stride-th from @first: each waited for until it
 * carries generation @generation's tag, its 8 data bytes then unpacked into the slot's place
 * in ch.data. WIC_OK once all are; WIC_ETIMED_OUT once @timeout_ns (0: never) passed before.
 */
__device__ inline int receive_lines(const channel &ch, uint32_t slot, uint32_t generation, uint64_t first,
				    uint64_t end, uint32_t stride, uint64_t timeout_ns)
{
	uint64_t *to = reinterpret_cast<uint64_t *>(const_cast<uint8_t *>(ch.data) + (uint64_t)slot * ch.batch_bytes);
	const uint32_t tag = generation + 1;
	backoff pause(ch.backoff_ns, timeout_ns);

	for (uint64_t line = first; line < end; line += lines_per_round * stride) {
		uint64_t lo[lines_per_round], hi[lines_per_round];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				load_line(line_at(ch, slot, line + j * stride), &lo[j], &hi[j]);
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++) {
			const uint64_t at = line + j * stride;
			if (at >= end)
				break;
			/* Not there yet: this one line is waited for, the round's later ones were loaded early. */
			while ((uint32_t)(lo[j] >> 32) != tag || (uint32_t)(hi[j] >> 32) != tag) {
				if (!pause.pause())
					return WIC_ETIMED_OUT;
				load_line(line_at(ch, slot, at), &lo[j], &hi[j]);
			}
			to[at] = (lo[j] & 0xffffffffULL) | hi[j] << 32;
		}
	}
	return WIC_OK;
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

/* Lane 0 waits until @slot has published @generation; WIC_ETIMED_OUT after @timeout_ns. */
__device__ inline int wait_ready(const channel &ch, uint32_t slot, uint32_t generation, uint64_t timeout_ns)
{
	return wait_past(&ch.ready[slot], generation, ch.backoff_ns, timeout_ns);
}

} /* namespace detail */

namespace detail {

/* How a transport's consumers wait: three kinds, which the typed receives pick at compile time. */
enum class wait_kind { fault, lines, word };

__host__ __device__ constexpr wait_kind wait_of(transport kind)
{
	return kind == transport::fault ? wait_kind::fault : kind == transport::tagged ? wait_kind::lines : wait_kind::word;
}

template <wait_kind W>
__device__ inline int recv_as(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			      const uint8_t **message, uint64_t timeout_ns)
{
	const unsigned lane = threadIdx.x % 32;
	const uint64_t offset = (uint64_t)warp_in_batch * ch.message_bytes;
	const uint8_t *at;
	int status = WIC_OK;

	if constexpr (W == wait_kind::fault) {
		at = reinterpret_cast<const uint8_t *>(ch.runs[2 * slot + generation % 2]) + offset;
		if (lane == 0) {
			/* The load that stalls until wicd maps the run; markers sit at page starts. */
			const uint64_t page = reinterpret_cast<uint64_t>(at) & ~4095ULL;

			status = marker_status(load_volatile(reinterpret_cast<const void *>(page)));
		}
	} else if constexpr (W == wait_kind::lines) {
		/* Every lane unpacks every 32nd line of the message. */
		at = ch.data + (uint64_t)slot * ch.batch_bytes + offset;
		const int rc = receive_lines(ch, slot, generation, offset / 8 + lane, (offset + ch.message_bytes) / 8, 32,
					     timeout_ns);
		status = __any_sync(0xffffffff, rc != WIC_OK) ? WIC_ETIMED_OUT : WIC_OK;
	} else {
		at = ch.data + (uint64_t)slot * ch.batch_bytes + offset;
		if (lane == 0)
			status = wait_ready(ch, slot, generation, timeout_ns);
	}
	status = __shfl_sync(0xffffffff, status, 0);
	__syncwarp();
	*message = at;
	return status;
}

/* recv_block()'s body for one kind of wait; @status is the block's shared word. */
template <wait_kind W>
__device__ inline int recv_block_as(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				    uint64_t timeout_ns, int *status)
{
	const uint8_t *at;

	if constexpr (W == wait_kind::fault)
		at = reinterpret_cast<const uint8_t *>(ch.runs[2 * slot + generation % 2]);
	else
		at = ch.data + (uint64_t)slot * ch.batch_bytes;
	__syncthreads();
	if constexpr (W == wait_kind::lines) {
		/* No word to wait on: the block unpacks the batch's lines, each thread every n-th. */
		const int rc =
			receive_lines(ch, slot, generation, thread_in_block(), ch.batch_bytes / 8, block_threads(), timeout_ns);
		*batch = at;
		return __syncthreads_or(rc != WIC_OK) ? WIC_ETIMED_OUT : WIC_OK;
	} else {
		if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
			if constexpr (W == wait_kind::fault)
				*status = marker_status(load_volatile(at));
			else
				*status = wait_ready(ch, slot, generation, timeout_ns);
		}
		__syncthreads();
		const int result = *status;
		__syncthreads();
		*batch = at;
		return result;
	}
}

} /* namespace detail */

/*
 * recv() - wait for this warp's message of generation @generation of @slot
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot
 * @warp_in_batch: this warp's index among the batch's warps_per_batch
 * @message: receives the address of this warp's message_bytes
 * @timeout_ns: give up after this long (0: wait forever); fault: the channel's timeout, set
 *	at creation, applies instead
 *
 * Called by every lane of the warp (the warp must be converged). Return: WIC_OK, or for the
 * fault transport the error wicd or the module completed the request with: WIC_ETIMED_OUT,
 * WIC_ECLOSED, WIC_ESTOPPING or WIC_ECONNECT (wicd died); the others: WIC_ETIMED_OUT.
 *
 * This form decides at run time how to wait, so a kernel carries the code, and the registers,
 * of every transport's wait (tagged's the most); recv<K>() below carries only K's.
 */
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = 0)
{
	switch (detail::wait_of(ch.kind)) {
	case detail::wait_kind::fault:
		return detail::recv_as<detail::wait_kind::fault>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	case detail::wait_kind::lines:
		return detail::recv_as<detail::wait_kind::lines>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	default:
		return detail::recv_as<detail::wait_kind::word>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	}
}

/*
 * recv<K>() - recv() for a channel of transport @K, known when the kernel is compiled: the kernel
 *	carries @K's wait alone (a push consumer of 16 warps: 25 registers against the run-time
 *	form's 64, device_compile's budgets)
 *
 * Return: as recv(); WIC_EINVALID, and *@message untouched, for a channel of another transport.
 */
template <transport K>
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = 0)
{
	if (ch.kind != K)
		return WIC_EINVALID;
	return detail::recv_as<detail::wait_of(K)>(ch, slot, generation, warp_in_batch, message, timeout_ns);
}

/*
 * recv_block() - the whole block waits for generation @generation of @slot, as the WIC paper's
 *	Algorithm 1 consumer does
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot
 * @batch: receives the address of the batch (warp w's message at w * message_bytes)
 * @timeout_ns: as recv()
 *
 * Called by every thread of the block, none of them inside a divergent branch. Algorithm 1,
 * line by line: (3) __syncthreads(); (4-7) thread 0 alone waits, spinning without backoff
 * (alg1, poll, mapped) or with push's backoff, on the slot's ready word with an acquire load
 * at system scope, or for a fault channel stalls on the batch's first page; (8) the batch is
 * then read through the returned address; (10) __syncthreads(), after which every thread has
 * the status. A trailing barrier lets the next call's thread 0 overwrite the shared status
 * safely. tagged has no word to wait on: every thread unpacks its share of the batch's lines,
 * then the barrier. recv_block<K>() carries @K's wait alone, as recv<K>() does.
 *
 * Return: as recv(), the same in every thread.
 */
__device__ inline int recv_block(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				 uint64_t timeout_ns = 0)
{
	__shared__ int status;

	switch (detail::wait_of(ch.kind)) {
	case detail::wait_kind::fault:
		return detail::recv_block_as<detail::wait_kind::fault>(ch, slot, generation, batch, timeout_ns, &status);
	case detail::wait_kind::lines:
		return detail::recv_block_as<detail::wait_kind::lines>(ch, slot, generation, batch, timeout_ns, &status);
	default:
		return detail::recv_block_as<detail::wait_kind::word>(ch, slot, generation, batch, timeout_ns, &status);
	}
}

template <transport K>
__device__ inline int recv_block(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				 uint64_t timeout_ns = 0)
{
	__shared__ int status;

	if (ch.kind != K)
		return WIC_EINVALID;
	return detail::recv_block_as<detail::wait_of(K)>(ch, slot, generation, batch, timeout_ns, &status);
}

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
	if (threadIdx.x == 0)
		detail::store_release(results.word(g, part), g + 1);
}

/*
 * slot_buffer() - where a GPU producer writes the batch of @slot (push, poll, alg1, tagged)
 * @ch: the channel
 * @slot: the slot
 *
 * The slot's batch_bytes in the consumer GPU's memory (alg1: managed memory), which a producer
 * on another GPU reaches over the peer link; tagged: in the producer GPU's own memory, from
 * where publish() or publish_block() sends the batch. Warp w's message is at offset
 * w * message_bytes.
 */
__device__ inline uint8_t *slot_buffer(const channel &ch, uint32_t slot)
{
	if (ch.kind == transport::tagged)
		return ch.staging + (uint64_t)slot * ch.batch_bytes;
	return const_cast<uint8_t *>(ch.data) + (uint64_t)slot * ch.batch_bytes;
}

/*
 * publish() - a GPU producer marks generation @generation of @slot ready
 * @ch: the channel (push, poll, alg1 or tagged)
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot; the one after the slot's last
 *
 * One thread calls it once the whole batch is written; publish_block() does the same with
 * every thread of the block. Before it, every thread that wrote part of the batch executes
 * __threadfence_system(), so its stores across the link are performed system-wide, and then
 * meets the calling thread at a barrier (__syncthreads(), or __syncwarp() when one warp wrote
 * the batch). publish() fences again and stores @generation + 1 to the slot's ready word with
 * release semantics at system scope: a consumer whose acquire load sees it reads the batch.
 * tagged needs no fence, only the barrier: the calling thread sends the whole batch as lines,
 * which for more than a few lines publish_block() does faster. Before writing generation
 * g > 0 of a slot, the producer waits for wait_consumed(ch, slot, g - 1).
 *
 * Return: WIC_OK; WIC_EUNSUPPORTED for a fault channel, whose GPU producer publishes by writing
 * the slot's PAT page (needs the patched driver).
 */
__device__ inline int publish(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (ch.kind == transport::fault)
		return WIC_EUNSUPPORTED;
	if (ch.kind == transport::tagged) {
		detail::send_lines(ch, slot, generation, 0, ch.batch_bytes / 8, 1);
		return WIC_OK;
	}
	__threadfence_system();
	detail::store_release(const_cast<unsigned int *>(&ch.ready[slot]), generation + 1);
	return WIC_OK;
}

/*
 * publish_block() - the block that wrote generation @generation of @slot publishes it
 * @ch: the channel (push, poll, alg1 or tagged)
 * @slot: the slot
 * @generation: as publish()
 *
 * Every thread of the block calls it after its own writes to slot_buffer(), none of them
 * inside a divergent branch. push, poll, alg1: each thread makes its writes visible
 * system-wide (they crossed the link), the barrier gathers the block, and thread 0
 * publish()es. tagged: after the barrier, each thread sends every n-th line of the batch;
 * no fence, so the block is on its way once its stores are issued.
 *
 * Return: as publish(), in every thread.
 */
__device__ inline int publish_block(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (ch.kind == transport::fault)
		return WIC_EUNSUPPORTED;
	if (ch.kind == transport::tagged) {
		__syncthreads();
		detail::send_lines(ch, slot, generation, detail::thread_in_block(), ch.batch_bytes / 8,
				   detail::block_threads());
		return WIC_OK;
	}
	__threadfence_system();
	__syncthreads();
	if (detail::thread_in_block() == 0)
		publish(ch, slot, generation);
	return WIC_OK;
}

/*
 * consumed() - the consumers are done with generation @generation of @slot
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation they read
 *
 * One thread calls it after every warp of the batch read its message for the last time (a
 * __syncthreads() between those reads and this call when they are one block's warps, a grid
 * barrier when they are several blocks). A release store at system scope of @generation + 1
 * to the slot's word, in the producer GPU's memory (peer_channel) or pinned host memory
 * (host_channel): the producer that sees it (wait_consumed() on the GPU, host_channel::
 * wait_free() on the host) overwrites the slot only after those reads. A store, not an
 * atomic: posted across the link, the consumer waits for no reply (the release orders its
 * earlier reads first). Nothing to do for a fault channel (consumed is null).
 */
__device__ inline void consumed(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (ch.consumed)
		detail::store_release(&ch.consumed[slot], generation + 1);
}

/*
 * wait_consumed() - a GPU producer waits until generation @generation of @slot is consumed
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation the producer is about to overwrite
 * @timeout_ns: give up after this long (0: wait forever)
 *
 * One thread calls it; the others of its block write the slot after a __syncthreads() that
 * follows it. The word is in this GPU's memory: the thread waits with push's backoff, an
 * acquire load at system scope each time, so the block's stores come after the consumers' reads.
 *
 * Return: WIC_OK (at once for channels without consumed words); WIC_ETIMED_OUT.
 */
__device__ inline int wait_consumed(const channel &ch, uint32_t slot, uint32_t generation, uint64_t timeout_ns = 0)
{
	if (!ch.consumed)
		return WIC_OK;
	return detail::wait_past(&ch.consumed[slot], generation, push_max_sleep_ns, timeout_ns);
}

#endif /* __CUDACC__ */

/*
 * pick_host_transport() - the transport for a host producer's channel, from what
 * device/bench/transport measured (H100, stock driver 580.159.04, 2026-11-26;
 * device/bench/results/transport-h100-2026-11-26-hosttagged.jsonl)
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: messages in one generation of a slot
 * @spinning_waiters: threads that wait on the channel at once: one per warp with recv(), one
 *	per block with recv_block()
 *
 * mapped for batches of up to 1 KiB with a single waiter: its one way was 2.8 us (64 bytes) to
 * 4.1 us (1 KiB), 1.8x to 2.6x a host store seen by a GPU thread (1.5 us), push's 6.1 to 6.6
 * us. But its waiters spin across the link: with 16 warps each waiting its one way was 16.4 us,
 * with 132 34 to 37 us, with 2112 684 us, and 8 spinning waiters per SM slowed the memory-bound
 * warps beside them 30x; the consumer's reads of a large message cross the link too.
 * tagged for batches of up to 512 bytes made of whole 8-byte words with more waiters: one copy
 * and no ready word, 4.0 to 4.5 us one way from 1 to 2112 waiting warps (64 and 256 bytes)
 * and 5.0 us at 512 bytes (one waiter; with more not measured), against push's 5.6 to 6.4
 * us; its waiters look at lines in device memory and cost their neighbours 2% at most. From
 * 1 KiB on push is as fast or faster with many waiters (1 KiB: 6.5 us against 6.6 with 2112;
 * 4 KiB: 6.6 against 10.6): tagged copies twice the bytes and one warp unpacks them. push
 * otherwise: its waiters never leave the GPU, and publish_many() streams 1 MiB generations
 * within 1.06x of a bulk copy, where tagged, which formats every byte on the host's thread,
 * streamed 64 KiB and 1 MiB generations at 6.9x to 9.5x of it (4 KiB ones, one publish each,
 * at 33.5x).
 */
inline transport pick_host_transport(uint32_t message_bytes, uint32_t warps_per_batch, uint32_t spinning_waiters)
{
	const uint64_t batch_bytes = (uint64_t)message_bytes * warps_per_batch;
	if (batch_bytes <= 1024 && spinning_waiters <= 1)
		return transport::mapped;
	return batch_bytes <= 512 && message_bytes % 8 == 0 ? transport::tagged : transport::push;
}

/*
 * pick_peer_transport() - the transport for a channel whose producer is a kernel on another GPU,
 * from what device/bench/transport measured (2 x H200 over NVLink, stock driver 580.159.04,
 * 2026-11-26; device/bench/results/transport-h200x2-2026-11-26-spin.jsonl)
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: messages in one generation of a slot
 *
 * tagged for batches of up to 4 KiB made of whole 8-byte words (what tagged carries; push
 * otherwise): its lines need no fence, so a message of 64 bytes to 1 KiB arrived 1.4 to 1.8 us
 * after the producer began and one of 4 KiB 2.2 us (a store's own trip: 1.2 us), push's 3.8 to
 * 3.9 us, of which 0.9 us is the fence that waits for the data's stores before the ready word;
 * and one block per SM streaming 4 KiB batches moved 164 GB/s tagged, 91 GB/s push. push
 * beyond: tagged carries each byte twice over the link and unpacks it again, so a 16 KiB
 * message arrived later (5.9 us against 4.5) and 64 KiB batches streamed half as fast (182 GB/s
 * against 340). Between 4 and 16 KiB it was not measured. On 2 x H100 (the same day,
 * results/transport-h100x2-2026-11-26-validation.jsonl) the fence is slower (1.5 us), push's one
 * way 6.0 to 6.4 us up to 4 KiB, tagged's 1.5 to 2.4 us: the same choice.
 */
inline transport pick_peer_transport(uint32_t message_bytes, uint32_t warps_per_batch)
{
	const uint64_t batch_bytes = (uint64_t)message_bytes * warps_per_batch;
	return batch_bytes <= 4096 && message_bytes % 8 == 0 ? transport::tagged : transport::push;
}

namespace detail {

/* A channel of these sizes with no memory yet, and the transport's default backoff. */
inline channel empty_channel(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch)
{
	return channel{kind, slots, message_bytes, warps_per_batch, (uint64_t)warps_per_batch * message_bytes,
		       nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
		       kind == transport::push || kind == transport::tagged ? push_max_sleep_ns : 0};
}

/*
 * Zeroes @bytes of device memory at @ptr, done when this returns. On a stream of its own that
 * does not wait for others: the legacy default stream would wait for every blocking stream's
 * kernels, a running persistent consumer's among them, and cudaMemset() may return early.
 */
inline cudaError_t zero_device(void *ptr, size_t bytes)
{
	cudaStream_t stream;
	cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
	if (err != cudaSuccess)
		return err;
	err = cudaMemsetAsync(ptr, 0, bytes, stream);
	const cudaError_t synced = cudaStreamSynchronize(stream);
	const cudaError_t destroyed = cudaStreamDestroy(stream);
	return err != cudaSuccess ? err : synced != cudaSuccess ? synced : destroyed;
}

/* Whether @timeout_ns (0: never) has passed since @start. */
inline bool past(std::chrono::steady_clock::time_point start, uint64_t timeout_ns)
{
	return timeout_ns && std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(timeout_ns);
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

/*
 * Lines of this many bytes or more are formatted with non-temporal stores: the copy engine,
 * not this CPU, reads them next, and they would only push other data out of its caches.
 */
constexpr uint64_t streamed_lines_bytes = 64 * 1024;

/*
 * format_lines() - a host producer's batch as the tagged transport's lines (host code)
 * @to: 2 * @words 64-bit words of pinned host memory, 16-byte aligned
 * @from: @bytes of data, at most 8 * @words; the words past them carry zeros
 * @bytes: data bytes
 * @words: 8-byte data words of the batch (its lines)
 * @tag: the generation's tag (generation + 1)
 *
 * Line i holds data bytes 8i to 8i + 3 in the low half of its first word and 8i + 4 to 8i + 7
 * in the low half of its second, @tag in the high half of both, as send_lines() stores them on
 * a GPU. With SSE2, 16 data bytes become two lines by two unpacks with the tag.
 */
inline void format_lines(uint64_t *to, const uint8_t *from, size_t bytes, uint64_t words, uint32_t tag)
{
	const uint64_t high = (uint64_t)tag << 32;
	uint64_t w = 0;

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
	const __m128i t = _mm_set1_epi32((int)tag);
	const bool stream = 16 * words >= streamed_lines_bytes;
	for (; 8 * (w + 2) <= bytes; w += 2) {
		const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i *>(from + 8 * w));
		__m128i *at = reinterpret_cast<__m128i *>(to + 2 * w);
		if (stream) {
			_mm_stream_si128(at, _mm_unpacklo_epi32(d, t));
			_mm_stream_si128(at + 1, _mm_unpackhi_epi32(d, t));
		} else {
			_mm_store_si128(at, _mm_unpacklo_epi32(d, t));
			_mm_store_si128(at + 1, _mm_unpackhi_epi32(d, t));
		}
	}
	/* The non-temporal stores are weakly ordered: done before the copy is queued. */
	_mm_sfence();
#endif
	for (; w < words; w++) {
		uint64_t d = 0;
		if (8 * w < bytes)
			memcpy(&d, from + 8 * w, bytes - 8 * w < 8 ? bytes - 8 * w : 8);
		to[2 * w] = high | (d & 0xffffffffULL);
		to[2 * w + 1] = high | d >> 32;
	}
}

} /* namespace detail */

/*
 * host_channel - a push, poll, alg1, mapped or tagged channel with a host producer: its memory
 * and its producer side (host code).
 *
 * create() allocates the slots' data and the ready words: push, both in the current device's
 * memory, and pinned host memory its ready words are copied from; poll, the data there and the
 * words in pinned host memory; alg1, both in managed memory, as the paper's Algorithm 1 keeps
 * them; mapped, both in pinned host memory mapped into the device, which the consumers read across
 * the link; tagged, no ready words but the lines (zeroed) and the data the consumers unpack them
 * into in the device's memory, and a pinned copy of the lines where the host formats them.
 * publish() copies a batch into a slot and marks its next generation ready (push and poll in
 * stream order; alg1 and mapped by the calling thread's stores; tagged by the tags in the lines it
 * copies), so a kernel that sees the ready word sees the data. Every transport also gets a
 * consumed word per slot in pinned host memory: consumers report a generation done with
 * wic::consumed(), and wait_free() holds the producer back until the slot it is about to overwrite
 * is free.
 */
class host_channel {
public:
	host_channel() = default;
	host_channel(const host_channel &) = delete;
	host_channel &operator=(const host_channel &) = delete;
	~host_channel() { destroy(); }

	/*
	 * Return: cudaSuccess; cudaErrorInvalidValue for fault, a zero size, or tagged messages of
	 * a size that is not a multiple of 8 bytes; else the failed call's error.
	 */
	cudaError_t create(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch)
	{
		if (kind == transport::fault || kind > transport::tagged || !slots || !message_bytes ||
		    !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return cudaErrorInvalidValue;
		destroy();
		ch_ = detail::empty_channel(kind, slots, message_bytes, warps_per_batch);
		published_ = new unsigned int[slots]();
		const size_t data_bytes = ch_.batch_bytes * slots, ready_bytes = slots * sizeof(unsigned int);
		cudaError_t err;
		switch (kind) {
		case transport::push:
			err = cudaMalloc(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMalloc(&ready_, ready_bytes);
			if (err == cudaSuccess)
				err = detail::zero_device(ready_, ready_bytes);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&host_ready_, ready_bytes, cudaHostAllocDefault);
			break;
		case transport::alg1:
			err = cudaMallocManaged(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMallocManaged(&ready_, ready_bytes);
			break;
		case transport::tagged:
			err = cudaMalloc(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMalloc(&lines_, 2 * data_bytes);
			if (err == cudaSuccess)
				err = detail::zero_device(lines_, 2 * data_bytes);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&host_lines_, 2 * data_bytes, cudaHostAllocDefault);
			ch_.lines = lines_;
			break;
		default: /* poll, mapped */
			err = kind == transport::poll ? cudaMalloc(&data_, data_bytes)
						      : cudaHostAlloc(&data_, data_bytes, cudaHostAllocMapped);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&ready_, ready_bytes, cudaHostAllocMapped);
			break;
		}
		if (err == cudaSuccess)
			err = cudaHostAlloc(&consumed_, ready_bytes, cudaHostAllocMapped);
		if (err == cudaSuccess)
			memset(consumed_, 0, ready_bytes);
		if (err == cudaSuccess)
			err = cudaHostGetDevicePointer((void **)&ch_.consumed, consumed_, 0);
		/* Host-visible words (all but push's; tagged has none) start at generation 0 by the host's stores. */
		if (err == cudaSuccess && kind != transport::push && kind != transport::tagged)
			memset(ready_, 0, ready_bytes);
		if (err == cudaSuccess && kind == transport::mapped)
			err = cudaHostGetDevicePointer((void **)&ch_.data, data_, 0);
		else
			ch_.data = static_cast<const uint8_t *>(data_);
		if (err == cudaSuccess && (kind == transport::poll || kind == transport::mapped))
			err = cudaHostGetDevicePointer((void **)&ch_.ready, ready_, 0);
		else
			ch_.ready = ready_;
		if (err != cudaSuccess)
			destroy();
		return err;
	}

	/* What kernels take. */
	channel device() const { return ch_; }

	/* The generation publish() gives @slot next (generations published so far); 0 for a bad slot. */
	unsigned int next_generation(uint32_t slot) const { return slot < ch_.slots ? published_[slot] : 0; }

	/*
	 * wait_free() - flow control: waits until the consumers reported every generation of @slot
	 * published so far done (wic::consumed()), so that the next publish() may overwrite it
	 * @slot: the slot
	 * @timeout_ns: give up after this long (0: wait forever)
	 *
	 * Spins on the slot's word in pinned host memory, yielding the CPU between looks.
	 * Return: cudaSuccess; cudaErrorInvalidValue for a bad slot; cudaErrorTimeout.
	 */
	cudaError_t wait_free(uint32_t slot, uint64_t timeout_ns = 0) const
	{
		if (slot >= ch_.slots)
			return cudaErrorInvalidValue;
		const auto start = std::chrono::steady_clock::now();
		/* Wrapping difference, as the generations on the device. */
		while ((int)(__atomic_load_n(&consumed_[slot], __ATOMIC_ACQUIRE) - published_[slot]) < 0) {
			if (detail::past(start, timeout_ns))
				return cudaErrorTimeout;
			std::this_thread::yield();
		}
		return cudaSuccess;
	}

	/*
	 * reset() - back to no generation published or consumed, for another run; no kernel may
	 * use the channel now, and no publish() may be in flight (its stream synchronized): push's
	 * words are cleared on a stream of their own, which waits for no other.
	 */
	cudaError_t reset()
	{
		if (!published_)
			return cudaErrorInvalidValue;
		const size_t words = ch_.slots * sizeof(unsigned int);
		cudaError_t err = cudaSuccess;
		if (ch_.kind == transport::push) {
			err = detail::zero_device(ready_, words);
		} else if (ch_.kind == transport::tagged) {
			err = detail::zero_device(lines_, 2 * ch_.batch_bytes * ch_.slots);
		} else {
			memset(ready_, 0, words);
		}
		memset(consumed_, 0, words);
		memset(published_, 0, words);
		return err;
	}

	/*
	 * Publishes the next generation of @slot: @bytes (at most batch_bytes) from @src, which
	 * must stay valid until @stream reaches this point. push: the copy and a copy of the
	 * ready word from pinned memory are queued on @stream (the consumer kernel runs on
	 * another). poll: the copy completes, then the ready word is stored by this thread, as a
	 * naive producer would. alg1 and mapped: this thread writes the data, then the ready word
	 * with a release store (@stream is not used); alg1's pages go where nvidia-uvm moves them,
	 * mapped's stay in host memory. tagged: this thread formats the whole batch as lines with
	 * the generation's tag (bytes past @bytes are zeros, since the consumers wait for every
	 * line) and queues one copy of them on @stream; @src is read before publish() returns.
	 * push's pinned word and tagged's formatted lines are reused for the slot's next
	 * generation, so, as with every transport, the producer publishes it only after
	 * wait_free() (or its own protocol) says the consumers are done with this one: after they
	 * saw it, not merely after they stopped waiting for it.
	 *
	 * The stream rule (push, poll and tagged): @stream must not wait for the consumer kernel,
	 * which runs until its last message arrives. Use a stream created with cudaStreamNonBlocking other than
	 * the kernel's; the legacy default stream (0 unless built with per-thread default streams)
	 * is refused, since it waits for every blocking stream's kernels.
	 *
	 * Return: cudaSuccess; cudaErrorInvalidValue for a bad slot or size, or the legacy default
	 * stream (push, poll, tagged); else the error of the runtime call that failed.
	 */
	cudaError_t publish(uint32_t slot, const void *src, size_t bytes, cudaStream_t stream)
	{
		if (slot >= ch_.slots || bytes > ch_.batch_bytes)
			return cudaErrorInvalidValue;
		return publish_range(slot, 1, src, bytes, stream);
	}

	/*
	 * publish_many() - publishes the next generation of @count consecutive slots from @first
	 * @first: the first slot
	 * @count: slots; first + count at most slots
	 * @src: their batches back to back, batch_bytes each, valid until @stream reaches this
	 * @stream: as publish()
	 *
	 * push: one copy of the data and one of the ready words for all of them, instead of two
	 * per slot; poll: one copy, then the words; alg1 and mapped: one memcpy(), then the words;
	 * tagged: all slots formatted, then one copy.
	 *
	 * Return: as publish().
	 */
	cudaError_t publish_many(uint32_t first, uint32_t count, const void *src, cudaStream_t stream)
	{
		if (first >= ch_.slots || !count || count > ch_.slots - first)
			return cudaErrorInvalidValue;
		return publish_range(first, count, src, ch_.batch_bytes, stream);
	}

	void destroy()
	{
		const bool host_data = ch_.kind == transport::mapped;
		const bool host_ready = ch_.kind == transport::poll || ch_.kind == transport::mapped;
		if (data_)
			host_data ? cudaFreeHost(data_) : cudaFree(data_);
		if (ready_)
			host_ready ? cudaFreeHost(ready_) : cudaFree(ready_);
		if (consumed_)
			cudaFreeHost(consumed_);
		if (lines_)
			cudaFree(lines_);
		if (host_lines_)
			cudaFreeHost(host_lines_);
		if (host_ready_)
			cudaFreeHost(host_ready_);
		delete[] published_;
		data_ = nullptr;
		ready_ = nullptr;
		consumed_ = nullptr;
		lines_ = nullptr;
		host_lines_ = nullptr;
		host_ready_ = nullptr;
		published_ = nullptr;
		ch_ = channel{};
	}

private:
	/* Slots first..first + count - 1, @bytes of each (count > 1: batch_bytes) from @src. */
	cudaError_t publish_range(uint32_t first, uint32_t count, const void *src, size_t bytes, cudaStream_t stream)
	{
		const bool host_stores = ch_.kind == transport::alg1 || ch_.kind == transport::mapped;
		if (!host_stores && detail::legacy_default(stream))
			return cudaErrorInvalidValue;
		uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)first * ch_.batch_bytes;
		const size_t span = (size_t)(count - 1) * ch_.batch_bytes + bytes;
		if (host_stores) {
			memcpy(dst, src, span);
			for (uint32_t s = first; s < first + count; s++)
				__atomic_store_n(&ready_[s], ++published_[s], __ATOMIC_RELEASE);
			return cudaSuccess;
		}
		if (ch_.kind == transport::tagged)
			return publish_lines(first, count, static_cast<const uint8_t *>(src), bytes, stream);
		cudaError_t err = cudaMemcpyAsync(dst, src, span, cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return err;
		if (ch_.kind == transport::poll) {
			err = cudaStreamSynchronize(stream);
			for (uint32_t s = first; s < first + count && err == cudaSuccess; s++)
				__atomic_store_n(&ready_[s], ++published_[s], __ATOMIC_RELEASE);
			return err;
		}
		return publish_ready(first, count, stream);
	}

	/*
	 * push: the ready words of slots first..first + count - 1, one copy of their next values
	 * from pinned memory, queued on @stream after the data's copy, which in stream order is
	 * complete before this copy starts. That a kernel already running on another stream which
	 * sees a word then also sees the data is what push relies on and NVIDIA does not document
	 * for copies; the transport test checks it byte by byte (a write-value operation's default
	 * fence did guarantee it). Not a
	 * stream write-value operation per word: on an H100 each took 0.7 us of the GPU's time in
	 * stream order, so a generation of 132 slots waited 90 us for its words after the 160 us
	 * copy of its 8.25 MiB, and one copy of the 132 words takes 3 us (device/bench/README.md,
	 * "Ready words"). The word's value is read when the copy runs: a slot's pinned word is
	 * written again only for its next generation, after its consumers saw this one (the rule
	 * publish() states), so after the copy engine read it.
	 */
	cudaError_t publish_ready(uint32_t first, uint32_t count, cudaStream_t stream)
	{
		for (uint32_t s = first; s < first + count; s++)
			host_ready_[s] = published_[s] + 1;
		const cudaError_t err = cudaMemcpyAsync(&ready_[first], &host_ready_[first], count * sizeof(unsigned int),
							cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return err;
		for (uint32_t s = first; s < first + count; s++)
			published_[s]++;
		return cudaSuccess;
	}

	/*
	 * tagged: slots first..first + count - 1 as lines, each slot's whole batch (past @bytes of
	 * the last, zeros) formatted into its pinned copy of the lines with its next generation's
	 * tag, then one copy of them all into the device's lines; no ready word. A slot's pinned
	 * lines are formatted again only for its next generation, after its consumers saw every
	 * line of this one, so after the copy engine read them.
	 */
	cudaError_t publish_lines(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		const uint64_t words = ch_.batch_bytes / 8;
		for (uint32_t i = 0; i < count; i++)
			detail::format_lines(host_lines_ + 2 * (first + i) * words, src + (uint64_t)i * ch_.batch_bytes,
					     i + 1 < count ? ch_.batch_bytes : bytes, words, published_[first + i] + 1);
		const cudaError_t err = cudaMemcpyAsync(lines_ + 2 * first * words, host_lines_ + 2 * first * words,
							(size_t)count * 2 * ch_.batch_bytes, cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return err;
		for (uint32_t s = first; s < first + count; s++)
			published_[s]++;
		return cudaSuccess;
	}

	channel ch_{};
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	unsigned int *consumed_ = nullptr;
	uint64_t *lines_ = nullptr;
	uint64_t *host_lines_ = nullptr;
	unsigned int *host_ready_ = nullptr; /* push: the ready words' next values, copied from here */
	unsigned int *published_ = nullptr;
};

/*
 * result_channel - the host end of the results direction (host code): the slots and ready
 * words of a result_view in pinned host memory mapped into the current device. Kernels take
 * device() and call post_result(); the host reads a part once ready() says it is written, or
 * waits for it (wait()).
 */
class result_channel {
public:
	result_channel() = default;
	result_channel(const result_channel &) = delete;
	result_channel &operator=(const result_channel &) = delete;
	~result_channel() { destroy(); }

	/* @slots slots of @slot_bytes, @parts parts each; the data is left as allocated. */
	cudaError_t create(uint32_t slots, uint64_t slot_bytes, uint32_t parts)
	{
		if (!slots || !slot_bytes || !parts)
			return cudaErrorInvalidValue;
		destroy();
		const size_t words = (size_t)slots * parts * sizeof(unsigned int);
		host_ = result_view{nullptr, nullptr, slot_bytes, slots, parts};
		cudaError_t err = cudaHostAlloc(&host_.data, slots * slot_bytes, cudaHostAllocMapped);
		if (err == cudaSuccess)
			err = cudaHostAlloc(&host_.ready, words, cudaHostAllocMapped);
		if (err == cudaSuccess) {
			memset(host_.ready, 0, words);
			dev_ = host_;
			err = cudaHostGetDevicePointer((void **)&dev_.data, host_.data, 0);
		}
		if (err == cudaSuccess)
			err = cudaHostGetDevicePointer((void **)&dev_.ready, host_.ready, 0);
		if (err != cudaSuccess)
			destroy();
		return err;
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
	 * Return: cudaSuccess; cudaErrorInvalidValue for a bad part; cudaErrorTimeout after
	 * @timeout_ns (0: never).
	 */
	cudaError_t wait(uint32_t g, uint32_t part, uint64_t timeout_ns = 0) const
	{
		if (!host_.ready || part >= host_.parts)
			return cudaErrorInvalidValue;
		const auto start = std::chrono::steady_clock::now();
		while (!ready(g, part)) {
			if (detail::past(start, timeout_ns))
				return cudaErrorTimeout;
			std::this_thread::yield();
		}
		return cudaSuccess;
	}

	void destroy()
	{
		if (host_.data)
			cudaFreeHost(host_.data);
		if (host_.ready)
			cudaFreeHost(host_.ready);
		host_ = result_view{};
		dev_ = result_view{};
	}

private:
	result_view host_{}, dev_{};
};

namespace detail {

/* Runs @call with @device current; the caller's current device is kept. */
template <typename F>
inline cudaError_t on_device(int device, F call)
{
	int current;
	cudaError_t err = cudaGetDevice(&current);
	if (err != cudaSuccess)
		return err;
	err = cudaSetDevice(device);
	if (err == cudaSuccess)
		err = call();
	const cudaError_t restored = cudaSetDevice(current);
	return err != cudaSuccess ? err : restored;
}

/* Zeroes @bytes at @ptr in @device's memory, done when this returns. */
inline cudaError_t zero_on(int device, void *ptr, size_t bytes)
{
	return on_device(device, [&] { return zero_device(ptr, bytes); });
}

/* @bytes of @device's memory at *@out, zeroed when @zero. */
inline cudaError_t alloc_on(int device, size_t bytes, bool zero, void **out)
{
	cudaError_t err = on_device(device, [&] { return cudaMalloc(out, bytes); });
	return err != cudaSuccess || !zero ? err : zero_on(device, *out, bytes);
}

inline void free_on(int device, void *ptr)
{
	if (ptr)
		on_device(device, [&] { return cudaFree(ptr); });
}

} /* namespace detail */

/*
 * enable_peer_access() - lets kernels on GPU @a reach GPU @b's memory, and the other way round
 * @a: a device
 * @b: a device; nothing to do when it is @a
 *
 * The current device is kept. Return: cudaSuccess, also where access was already enabled;
 * cudaErrorPeerAccessUnsupported where either direction is impossible; else the failed call's
 * error.
 */
inline cudaError_t enable_peer_access(int a, int b)
{
	cudaError_t err = cudaSuccess;

	for (int i = 0; i < 2 && a != b && err == cudaSuccess; i++) {
		const int from = i ? b : a, to = i ? a : b;
		int can = 0;
		err = cudaDeviceCanAccessPeer(&can, from, to);
		if (err == cudaSuccess && !can)
			err = cudaErrorPeerAccessUnsupported;
		if (err == cudaSuccess)
			err = detail::on_device(from, [&] {
				cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
				if (e == cudaErrorPeerAccessAlreadyEnabled) {
					(void)cudaGetLastError(); /* not an error here: clear it for later checks */
					e = cudaSuccess;
				}
				return e;
			});
	}
	return err;
}

/*
 * peer_channel - a push, poll, alg1 or tagged channel whose producer is a kernel on GPU
 * @producer and whose consumers run on GPU @consumer (host code; the GPUs may be the same one).
 *
 * create() enables peer access both ways and allocates the slots' data and (push) the ready
 * words in the consumer's memory, (poll) the ready words in the producer's memory, where the
 * consumers spin on them across the link, (alg1) data and ready words in managed memory,
 * (tagged) the lines and the unpacked data in the consumer's memory and the staging in the
 * producer's, and the consumed words in the producer's memory. Algorithm 1 runs once and has
 * no way back; the consumed words are the flow control every repeated exchange needs, the same
 * for all four. The producer kernel writes a batch into slot_buffer(), publish()es it, and
 * waits for wait_consumed() before it writes the slot again; consumers recv() and report
 * consumed(). No generation is published or consumed after create() or reset().
 */
class peer_channel {
public:
	peer_channel() = default;
	peer_channel(const peer_channel &) = delete;
	peer_channel &operator=(const peer_channel &) = delete;
	~peer_channel() { destroy(); }

	/*
	 * Return: cudaSuccess; cudaErrorInvalidValue for fault and mapped (host_channel), a zero
	 * size, or tagged messages of a size that is not a multiple of 8 bytes; else the failed
	 * call's error.
	 */
	cudaError_t create(transport kind, int consumer, int producer, uint32_t slots, uint32_t message_bytes,
			   uint32_t warps_per_batch)
	{
		if (kind == transport::fault || kind == transport::mapped || kind > transport::tagged || !slots ||
		    !message_bytes || !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return cudaErrorInvalidValue;
		destroy();
		cudaError_t err = enable_peer_access(consumer, producer);
		if (err != cudaSuccess)
			return err;
		ch_ = detail::empty_channel(kind, slots, message_bytes, warps_per_batch);
		consumer_ = consumer;
		producer_ = producer;
		const size_t data_bytes = ch_.batch_bytes * slots, word_bytes = slots * sizeof(unsigned int);
		switch (kind) {
		case transport::alg1:
			err = cudaMallocManaged(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMallocManaged((void **)&ready_, word_bytes);
			if (err == cudaSuccess)
				memset(ready_, 0, word_bytes);
			break;
		case transport::tagged:
			err = detail::alloc_on(consumer, data_bytes, false, &data_);
			if (err == cudaSuccess)
				err = detail::alloc_on(consumer, 2 * data_bytes, true, (void **)&lines_);
			if (err == cudaSuccess)
				err = detail::alloc_on(producer, data_bytes, false, (void **)&staging_);
			break;
		default: /* push, poll */
			err = detail::alloc_on(consumer, data_bytes, false, &data_);
			if (err == cudaSuccess)
				err = detail::alloc_on(ready_device(), word_bytes, true, (void **)&ready_);
			break;
		}
		if (err == cudaSuccess)
			err = detail::alloc_on(producer, word_bytes, true, (void **)&consumed_);
		if (err != cudaSuccess) {
			destroy();
			return err;
		}
		ch_.data = static_cast<const uint8_t *>(data_);
		ch_.ready = ready_;
		ch_.consumed = consumed_;
		ch_.lines = lines_;
		ch_.staging = staging_;
		return cudaSuccess;
	}

	/* What the producer and the consumer kernels take. */
	channel device() const { return ch_; }

	/* Back to no generation published or consumed, for another run; no kernel may use it now. */
	cudaError_t reset()
	{
		if (!consumed_)
			return cudaErrorInvalidValue;
		const size_t bytes = ch_.slots * sizeof(unsigned int);
		const cudaError_t err = lines_ ? detail::zero_on(consumer_, lines_, 2 * ch_.batch_bytes * ch_.slots)
					       : detail::zero_on(ready_device(), ready_, bytes);
		return err != cudaSuccess ? err : detail::zero_on(producer_, consumed_, bytes);
	}

	void destroy()
	{
		detail::free_on(consumer_, data_);
		detail::free_on(ready_device(), ready_);
		detail::free_on(consumer_, lines_);
		detail::free_on(producer_, staging_);
		detail::free_on(producer_, consumed_);
		data_ = nullptr;
		ready_ = nullptr;
		lines_ = nullptr;
		staging_ = nullptr;
		consumed_ = nullptr;
		ch_ = channel{};
	}

private:
	int ready_device() const { return ch_.kind == transport::poll ? producer_ : consumer_; }

	channel ch_{};
	int consumer_ = 0;
	int producer_ = 0;
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	uint64_t *lines_ = nullptr;
	uint8_t *staging_ = nullptr;
	unsigned int *consumed_ = nullptr;
};

/*
 * fault_channel() - the device view of a libwic channel placed in managed memory
 * @info: wic_channel_info() of the channel
 * @slots: wic_channel_slot() of each of its slots
 * @runs: device memory for 2 * info->slots addresses, filled here
 *
 * Return: the channel kernels take, or one with slots = 0 if copying @runs failed.
 */
inline channel fault_channel(const struct wic_channel_info *info, const struct wic_slot_info *slots, uint64_t *runs)
{
	channel ch{transport::fault, info->slots, info->message_bytes, info->warps_per_batch, info->batch_bytes,
		   runs, nullptr, nullptr, nullptr, nullptr, nullptr, 0};
	for (uint32_t s = 0; s < info->slots; s++)
		if (cudaMemcpy(runs + 2 * s, slots[s].run_va, sizeof(slots[s].run_va), cudaMemcpyHostToDevice) !=
		    cudaSuccess)
			ch.slots = 0;
	return ch;
}

/*
 * uvm_gpu_id() - nvidia-uvm's id of a CUDA device, what a fault channel's GPU fields take
 * @device: the CUDA device (as CUDA_VISIBLE_DEVICES numbers them)
 * @id: receives the id
 *
 * The shim backend names GPUs as nvidia-uvm does, by ids that depend on which GPUs the
 * processes of the machine use (wic_uvm_gpu_id() in wic.h): translate, never assume 1 and 9.
 * Initializes CUDA if it is not yet, which registers every visible GPU with nvidia-uvm (seen
 * with the stock 580.159.04 driver), and creates no context.
 *
 * Return: WIC_OK, WIC_EIO if CUDA cannot say the device's UUID, or wic_uvm_gpu_id()'s error.
 */
inline int uvm_gpu_id(int device, uint32_t *id)
{
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
		return WIC_EIO;
	return wic_uvm_gpu_id(reinterpret_cast<const uint8_t *>(prop.uuid.bytes), id);
}

} /* namespace wic */

#endif /* WIC_WIC_CUH */
