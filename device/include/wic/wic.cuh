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
	case WIC_ESTALE:
		return "WIC_ESTALE";
	case WIC_ESTREAM:
		return "WIC_ESTREAM";
	default:
		return "WIC_E?";
	}
}

/*
 * outcome - what a host call of wic.cuh returns: a WIC_* status, which error_name() names, and
 * the cudaError_t it converts to, so code written for the cudaError_t that earlier versions
 * returned keeps compiling and comparing. A failed CUDA runtime call is WIC_EIO with the
 * runtime's error; the library's own refusals convert to the cudaError_t each call documents.
 */
class outcome {
public:
	constexpr outcome(cudaError_t err = cudaSuccess) : status_(err == cudaSuccess ? WIC_OK : WIC_EIO), cuda_(err) {}
	constexpr outcome(int status, cudaError_t err) : status_(status), cuda_(err) {}

	constexpr int status() const { return status_; }
	constexpr cudaError_t cuda() const { return cuda_; }
	constexpr bool ok() const { return status_ == WIC_OK; }
	constexpr operator cudaError_t() const { return cuda_; }

	/* "WIC_EBUSY", or for a failed runtime call the runtime's name, "cudaErrorMemoryAllocation". */
	const char *name() const { return status_ == WIC_EIO ? cudaGetErrorName(cuda_) : error_name(status_); }

private:
	int status_;
	cudaError_t cuda_;
};

/*
 * forever - the timeout of a wait that never gives up. Every wait of wic.cuh, on the device and
 * on the host, takes a timeout in nanoseconds with the meaning libwic gives it: 0 looks once,
 * forever waits until the data (or the consumers' report) is there, anything else at most that
 * long. forever is the default wherever a timeout may be left out.
 */
constexpr uint64_t forever = ~0ULL;

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
 * in ch.data. WIC_OK once all are; WIC_ESTALE when the first of a round's lines carries a
 * later generation's tag; WIC_ETIMED_OUT once @timeout_ns passed before.
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
				/*
				 * A later tag: the generation was overwritten. Looked for in the first
				 * half of a round's first line alone (the other half and lines follow
				 * soon): a look at every line cost the run-time recv() 14 registers.
				 */
				if (j == 0 && (int)((uint32_t)(lo[j] >> 32) - tag) > 0)
					return WIC_ESTALE;
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

/*
 * Lane 0 waits until @slot has published @generation: WIC_OK; WIC_ESTALE if the slot holds a
 * later generation; WIC_ETIMED_OUT after @timeout_ns.
 */
__device__ inline int wait_ready(const channel &ch, uint32_t slot, uint32_t generation, uint64_t timeout_ns)
{
	unsigned seen;
	const int status = wait_past(&ch.ready[slot], generation, ch.backoff_ns, timeout_ns, &seen);

	return status == WIC_OK && seen != generation + 1 ? WIC_ESTALE : status;
}

/*
 * The warp's status from each lane's: the lowest, so WIC_ESTALE (-13) before WIC_ETIMED_OUT (-6)
 * before WIC_OK; one instruction (redux.sync).
 */
__device__ inline int warp_status(int own)
{
	return __reduce_min_sync(0xffffffff, own);
}

/* The block's status from each thread's: stale data before a timeout. */

__device__ inline int block_status(int own)
{
	if (__syncthreads_or(own == WIC_ESTALE))
		return WIC_ESTALE;
	return __syncthreads_or(own != WIC_OK) ? WIC_ETIMED_OUT : WIC_OK;
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

	if (slot >= ch.slots || warp_in_batch >= ch.warps_per_batch)
		return WIC_EINVALID;

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
		status = warp_status(rc);
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

	if (slot >= ch.slots)
		return WIC_EINVALID;
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
		return block_status(rc);
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
 * @timeout_ns: give up after this long (0: look once; forever, the default: never); fault: the
 *	channel's timeout, set at creation, applies instead
 *
 * Called by every lane of the warp, converged, with the same arguments. Return:
 *  - WIC_OK: *@message holds generation @generation;
 *  - WIC_EINVALID: @slot or @warp_in_batch is out of range (nothing read);
 *  - WIC_ESTALE: the slot already holds a later generation, so this one's data is gone (the
 *    producer overwrote it: it did not wait for wic::consumed(), or this warp came too late);
 *  - WIC_ETIMED_OUT: not published within @timeout_ns;
 *  - fault only: the error wicd or the module completed the request with (WIC_ETIMED_OUT,
 *    WIC_ECLOSED, WIC_ESTOPPING, or WIC_ECONNECT when wicd died); a fault channel cannot tell
 *    a stale generation.
 * A generation counts modulo 2^32: "later" means less than 2^31 generations ahead.
 *
 * This form decides at run time how to wait, so a kernel carries the code, and the registers,
 * of every transport's wait (tagged's the most); recv<K>() below carries only K's.
 */
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = forever)
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
			   const uint8_t **message, uint64_t timeout_ns = forever)
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
 * Return: as recv() (WIC_EINVALID for a bad @slot), the same in every thread.
 */
__device__ inline int recv_block(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				 uint64_t timeout_ns = forever)
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
				 uint64_t timeout_ns = forever)
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
	if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
		detail::store_release(results.word(g, part), g + 1);
}

/*
 * post_result_warp() - post_result() for a part one warp wrote: every lane of the warp calls
 * it after its own writes, and lane 0 marks the part; the rest of the block goes on.
 */
__device__ inline void post_result_warp(const result_view &results, uint32_t g, uint32_t part)
{
	__threadfence_system();
	__syncwarp();
	if (threadIdx.x % 32 == 0)
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
 * the copies streaming into the GPU: with one read per generation, a streaming loop ran at
 * 1.65x of the copy's time instead of 1.2x (device/bench/README.md, "Results back"). Give the
 * result_channel enough slots that the host's releases run ahead: each read then frees
 * several generations. The threads that write the slot follow wait() through a barrier
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
 * Return: WIC_OK; WIC_EINVALID for a bad @slot; WIC_EUNSUPPORTED for a fault channel, whose GPU
 * producer publishes by writing the slot's PAT page (needs the patched driver).
 */
__device__ inline int publish(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (slot >= ch.slots)
		return WIC_EINVALID;
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
	if (slot >= ch.slots)
		return WIC_EINVALID;
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
 * @timeout_ns: give up after this long (0: look once; forever, the default: never)
 *
 * One thread calls it; the others of its block write the slot after a __syncthreads() that
 * follows it. The word is in this GPU's memory: the thread waits with push's backoff, an
 * acquire load at system scope each time, so the block's stores come after the consumers' reads.
 *
 * Return: WIC_OK (at once for channels without consumed words); WIC_EINVALID for a bad @slot;
 * WIC_ETIMED_OUT.
 */
__device__ inline int wait_consumed(const channel &ch, uint32_t slot, uint32_t generation,
				    uint64_t timeout_ns = forever)
{
	if (slot >= ch.slots)
		return WIC_EINVALID;
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

/* Zeroes @bytes of device memory at @ptr, done when this returns. */
inline cudaError_t zero_device(void *ptr, size_t bytes)
{
	return on_own_stream([&](cudaStream_t stream) { return cudaMemsetAsync(ptr, 0, bytes, stream); });
}

/* Copies @bytes of device memory at @from to host memory at @to, done when this returns. */
inline cudaError_t read_device(void *to, const void *from, size_t bytes)
{
	return on_own_stream(
		[&](cudaStream_t stream) { return cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream); });
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
 * reuse - who keeps a host_channel's producer from overwriting a generation its consumers have
 * not read yet.
 *  - checked (the default): the channel. publish() refuses a slot whose last generation the
 *    consumers have not reported done (wic::consumed()) with WIC_EBUSY; wait_free() waits for
 *    that report.
 *  - caller: the application's own protocol (its consumers acknowledge through words of its
 *    own, say); publish() overwrites without looking, and a consumer that asks for an older
 *    generation than the slot holds gets WIC_ESTALE.
 */
enum class reuse { checked, caller };

/*
 * coalesce_bytes - a good limit for host_channel::coalesce(): a run of publishes is queued as
 * one copy once it holds this many bytes. The first slot of a run waits for the run to fill and
 * be copied (4 MiB: about 80 us on PCIe 5); in exchange the per-copy costs of the copy engine
 * and the runtime are paid once per 4 MiB. device/bench/README.md ("Per-slot publishing") has
 * the measurements.
 */
constexpr size_t coalesce_bytes = 4 << 20;

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
 *
 * Every call returns an outcome: a WIC_* status (WIC_EIO when a CUDA runtime call failed, with
 * its cudaError_t in outcome::cuda()), which converts to the cudaError_t earlier versions
 * returned. After a runtime call failed the channel's state is unknown: destroy() it.
 */
class host_channel {
public:
	host_channel() = default;
	host_channel(const host_channel &) = delete;
	host_channel &operator=(const host_channel &) = delete;
	~host_channel() { destroy(); }

	/*
	 * create() - allocates the channel on the current device
	 * @kind: push, poll, alg1, mapped or tagged
	 * @slots: slots
	 * @message_bytes: bytes of one warp's message (tagged: a multiple of 8)
	 * @warps_per_batch: messages of one generation of a slot
	 * @who: who keeps the producer from overwriting unread data (reuse::checked: the channel)
	 *
	 * Return: WIC_OK; WIC_EINVALID for fault, a zero size, or tagged messages of a size that
	 * is not a multiple of 8 bytes; else WIC_EIO with the failed call's error.
	 */
	outcome create(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch,
		       reuse who = reuse::checked)
	{
		if (kind == transport::fault || kind > transport::tagged || !slots || !message_bytes ||
		    !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return detail::invalid();
		destroy();
		ch_ = detail::empty_channel(kind, slots, message_bytes, warps_per_batch);
		reuse_ = who;
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

	/*
	 * The generation publish() gives @slot next (generations published so far); 0 for a bad
	 * slot, which the form below tells apart from a slot not yet published.
	 */
	unsigned int next_generation(uint32_t slot) const { return slot < ch_.slots ? published_[slot] : 0; }

	/* The same into *@generation: WIC_OK, or WIC_EINVALID for a bad slot (nothing written). */
	outcome next_generation(uint32_t slot, unsigned int *generation) const
	{
		if (slot >= ch_.slots || !generation)
			return detail::invalid();
		*generation = published_[slot];
		return outcome{};
	}

	/*
	 * wait_free() - flow control: waits until the consumers reported every generation of @slot
	 * published so far done (wic::consumed()), so that the next publish() may overwrite it
	 * @slot: the slot
	 * @timeout_ns: give up after this long (0: look once; forever, the default: never)
	 *
	 * Spins on the slot's word in pinned host memory, yielding the CPU between looks. When it
	 * has to wait at all, it first queues what coalesce() holds back, which the consumers may
	 * be waiting for.
	 *
	 * Return: WIC_OK; WIC_EINVALID for a bad slot; WIC_ETIMED_OUT (cudaErrorTimeout);
	 * WIC_ESTREAM (also cudaErrorTimeout) when, at the timeout, the copy of the slot's last
	 * generation has not reached the device (push, tagged): its stream has not run it, as
	 * when the stream waits for the consumer kernel (the stream rule at publish()).
	 */
	outcome wait_free(uint32_t slot, uint64_t timeout_ns = forever)
	{
		if (slot >= ch_.slots)
			return detail::invalid();
		if (free_now(slot))
			return outcome{};
		outcome queued = flush();
		if (!queued.ok())
			return queued;
		const auto start = std::chrono::steady_clock::now();
		while (!free_now(slot)) {
			if (detail::past(start, timeout_ns))
				return not_arrived(slot) ? outcome{WIC_ESTREAM, cudaErrorTimeout} : detail::timed_out();
			std::this_thread::yield();
		}
		return outcome{};
	}

	/*
	 * reset() - back to no generation published or consumed, for another run; no kernel may
	 * use the channel now, and no publish() may be in flight (its stream synchronized): push's
	 * words are cleared on a stream of their own, which waits for no other. A run coalesce()
	 * still holds back is dropped.
	 */
	outcome reset()
	{
		if (!published_)
			return detail::invalid();
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
		run_ = pending{};
		return err;
	}

	/*
	 * publish() - publishes the next generation of @slot
	 * @slot: the slot
	 * @src: the batch; push and poll copy from it on @stream, so it must stay valid until
	 *	@stream gets there, and only pinned memory (cudaHostAlloc) lets the copy overlap;
	 *	alg1, mapped and tagged read it before publish() returns
	 * @bytes: bytes of the batch, at most batch_bytes. Past them the slot keeps what it held
	 *	(push, poll, alg1, mapped) or holds zeros (tagged).
	 * @stream: push, poll, tagged: where the copies are queued (see the stream rule below)
	 *
	 * push: the copy and a copy of the ready word from pinned memory are queued on @stream.
	 * poll: the copy completes, then this thread stores the ready word, as a naive producer
	 * would. alg1 and mapped: this thread writes the data, then the ready word with a release
	 * store; alg1's pages go where nvidia-uvm moves them, mapped's stay in host memory.
	 * tagged: this thread formats the whole batch as lines with the generation's tag and
	 * queues one copy of them on @stream. With coalesce() on, push, poll and tagged may hold
	 * the copies back to queue them with the next publishes' (see there).
	 *
	 * Reuse: with reuse::checked (the default) a slot whose last generation its consumers
	 * have not reported done is refused with WIC_EBUSY, and nothing is written: call
	 * wait_free() first. With reuse::caller the slot is overwritten.
	 *
	 * The stream rule: @stream must never wait for the consumer kernel, which runs until its
	 * last message arrives. Use a stream created with cudaStreamNonBlocking, not the kernel's.
	 * The legacy default stream (0 unless built with per-thread default streams), which waits
	 * for every blocking stream's kernels, is refused for every transport with WIC_ESTREAM;
	 * the kernel's own stream cannot be told at publish() and shows at wait_free() as
	 * WIC_ESTREAM.
	 *
	 * Return: WIC_OK; WIC_EINVALID (cudaErrorInvalidValue) for a bad slot or size;
	 * WIC_ESTREAM (cudaErrorInvalidValue) for the legacy default stream; WIC_EBUSY
	 * (cudaErrorNotReady) for a slot not free; WIC_EIO with the failed runtime call's error.
	 */
	outcome publish(uint32_t slot, const void *src, size_t bytes, cudaStream_t stream)
	{
		if (slot >= ch_.slots || bytes > ch_.batch_bytes)
			return detail::invalid();
		outcome checked = may_publish(slot, 1, stream);
		if (!checked.ok())
			return checked;
		if (!coalesce_bytes_ || !queued_on_stream())
			return publish_now(slot, 1, static_cast<const uint8_t *>(src), bytes, stream);
		return publish_later(slot, static_cast<const uint8_t *>(src), bytes, stream);
	}

	/*
	 * publish_many() - publishes the next generation of @count consecutive slots from @first
	 * @first: the first slot
	 * @count: slots; first + count at most slots
	 * @src: their batches back to back, batch_bytes each, as publish() reads it
	 * @stream: as publish()
	 *
	 * push: one copy of the data and one of the ready words for all of them, instead of two
	 * per slot; poll: one copy, then the words; alg1 and mapped: one memcpy(), then the words;
	 * tagged: all slots formatted, then one copy. A run coalesce() holds back is queued
	 * first. All slots must be free (reuse::checked) or none is published.
	 *
	 * Return: as publish().
	 */
	outcome publish_many(uint32_t first, uint32_t count, const void *src, cudaStream_t stream)
	{
		if (first >= ch_.slots || !count || count > ch_.slots - first)
			return detail::invalid();
		outcome checked = may_publish(first, count, stream);
		if (checked.ok())
			checked = flush();
		if (!checked.ok())
			return checked;
		return publish_now(first, count, static_cast<const uint8_t *>(src), ch_.batch_bytes, stream);
	}

	/*
	 * coalesce() - lets publish() gather consecutive publishes into one copy (push, poll,
	 * tagged; alg1 and mapped have no copy to gather)
	 * @max_bytes: queue a run once it holds this many bytes (coalesce_bytes is a good value);
	 *	0 turns coalescing off, after queueing what is held back
	 *
	 * A publish() joins the run when it continues it: the next slot, the same stream, and for
	 * push and poll a source right after the previous batch, which was whole (tagged formats
	 * each batch into the slot's own place, so any source joins). The run is queued as one
	 * copy of the data and one of the ready words (tagged: of the lines) when it holds
	 * @max_bytes, when it reaches the channel's last slot, when a publish() does not continue
	 * it, when wait_free() has to wait or publish_many() is called, and on flush(). Until then
	 * its generations are published (next_generation() counts them) but not queued: nothing
	 * the consumers can see. Call flush() when the producer stops publishing for a while: the
	 * last run of a pause otherwise waits for the producer's next call.
	 *
	 * Runs are queued alternately on their publishes' stream and on a stream of the channel's
	 * own, which coalesce() creates (non-blocking, so the stream rule holds): a run's ready
	 * words wait for its data to land, and meanwhile the next run's data moves on the other
	 * stream. So a cudaStreamSynchronize() of the publishes' stream does not wait for every
	 * run; wait_free() is how a producer learns that a slot's copy is done with its source.
	 *
	 * Return: WIC_OK; WIC_EIO if the stream cannot be created; or flush()'s error when turned off.
	 */
	outcome coalesce(size_t max_bytes)
	{
		if (max_bytes && !lane_ && queued_on_stream()) {
			const cudaError_t err = cudaStreamCreateWithFlags(&lane_, cudaStreamNonBlocking);
			if (err != cudaSuccess)
				return err;
		}
		coalesce_bytes_ = max_bytes;
		return max_bytes ? outcome{} : flush();
	}

	/* flush() - queues the run coalesce() holds back, if any. Return: WIC_OK; WIC_EIO. */
	outcome flush()
	{
		if (!run_.count)
			return outcome{};
		const pending run = run_;
		run_ = pending{};
		on_lane_ = !on_lane_ && lane_;
		return queue(run.first, run.count, run.src, run.last_bytes, on_lane_ ? lane_ : run.stream);
	}

	void destroy()
	{
		if (lane_) {
			/* Its copies read the pinned words and lines freed below. */
			cudaStreamSynchronize(lane_);
			cudaStreamDestroy(lane_);
			lane_ = nullptr;
		}
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
		run_ = pending{};
		coalesce_bytes_ = 0;
		on_lane_ = false;
		ch_ = channel{};
	}

private:
	/* A run of publishes held back by coalesce(): slots first..first + count - 1. */
	struct pending {
		uint32_t first = 0, count = 0;
		const uint8_t *src = nullptr; /* push, poll: the first slot's batch */
		size_t last_bytes = 0;	      /* bytes of the last slot's batch */
		cudaStream_t stream = nullptr;
	};

	/* Whether publishing copies on a stream: push, poll, tagged. */
	bool queued_on_stream() const { return ch_.kind != transport::alg1 && ch_.kind != transport::mapped; }

	/* Whether the consumers reported every generation of @slot published so far done. */
	bool free_now(uint32_t slot) const
	{
		/* Wrapping difference, as the generations on the device. */
		return (int)(__atomic_load_n(&consumed_[slot], __ATOMIC_ACQUIRE) - published_[slot]) >= 0;
	}

	/*
	 * Whether the copy of @slot's last generation has not reached the device: push's ready
	 * word, tagged's first line (whose tag is the generation + 1) still shows an earlier one.
	 * Read on a stream of its own, which waits for none of the application's.
	 */
	bool not_arrived(uint32_t slot) const
	{
		unsigned int seen = published_[slot];
		if (ch_.kind == transport::push)
			detail::read_device(&seen, &ready_[slot], sizeof(seen));
		else if (ch_.kind == transport::tagged)
			detail::read_device(&seen, reinterpret_cast<const uint8_t *>(lines_ + 2 * slot * (ch_.batch_bytes / 8)) + 4,
					    sizeof(seen));
		return seen != published_[slot];
	}

	/* The stream rule and the reuse rule for slots first..first + count - 1. */
	outcome may_publish(uint32_t first, uint32_t count, cudaStream_t stream) const
	{
		if (detail::legacy_default(stream))
			return outcome{WIC_ESTREAM, cudaErrorInvalidValue};
		for (uint32_t s = first; reuse_ == reuse::checked && s < first + count; s++)
			if (!free_now(s))
				return outcome{WIC_EBUSY, cudaErrorNotReady};
		return outcome{};
	}

	/* publish() under coalesce(): joins the run, or queues it and begins another. */
	outcome publish_later(uint32_t slot, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		const bool tagged = ch_.kind == transport::tagged;
		const bool joins = run_.count && stream == run_.stream && slot == run_.first + run_.count &&
				   (tagged || (run_.last_bytes == ch_.batch_bytes &&
					       src == run_.src + (uint64_t)run_.count * ch_.batch_bytes));
		if (!joins) {
			outcome queued = flush();
			if (!queued.ok())
				return queued;
			run_ = pending{slot, 0, src, 0, stream};
		}
		if (tagged)
			format(slot, 1, src, bytes);
		published_[slot]++;
		run_.count++;
		run_.last_bytes = bytes;
		if ((uint64_t)run_.count * ch_.batch_bytes >= coalesce_bytes_ || slot == ch_.slots - 1)
			return flush();
		return outcome{};
	}

	/* Slots first..first + count - 1, @bytes of the last (of the others batch_bytes), now. */
	outcome publish_now(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		if (!queued_on_stream()) {
			uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)first * ch_.batch_bytes;
			memcpy(dst, src, (size_t)(count - 1) * ch_.batch_bytes + bytes);
			for (uint32_t s = first; s < first + count; s++)
				__atomic_store_n(&ready_[s], ++published_[s], __ATOMIC_RELEASE);
			return outcome{};
		}
		if (ch_.kind == transport::tagged)
			format(first, count, src, bytes);
		for (uint32_t s = first; s < first + count; s++)
			published_[s]++;
		return queue(first, count, src, bytes, stream);
	}

	/*
	 * The copies that make slots first..first + count - 1 visible at the generations
	 * published_ counts: push, the data's copy and then one copy of the ready words from
	 * pinned memory, in stream order; poll, the data's copy, waited for, then the words by
	 * this thread; tagged, one copy of the slots' formatted lines.
	 *
	 * push's ready words: that a kernel already running on another stream which sees a word
	 * then also sees the data is what push relies on and NVIDIA does not document for copies;
	 * the transport test checks it byte by byte (a write-value operation's default fence did
	 * guarantee it). Not a stream write-value operation per word: each costs the GPU's stream
	 * about as much as a small copy, so a generation of many slots would wait for its words
	 * after its data (device/bench/README.md, "Ready words"). A slot's pinned word is read
	 * when the copy runs and written again only for its next generation, after its consumers
	 * saw this one, so after the copy engine read it (tagged's pinned lines likewise).
	 */
	outcome queue(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		if (ch_.kind == transport::tagged) {
			const uint64_t words = ch_.batch_bytes / 8;
			return cudaMemcpyAsync(lines_ + 2 * first * words, host_lines_ + 2 * first * words,
					       (size_t)count * 2 * ch_.batch_bytes, cudaMemcpyHostToDevice, stream);
		}
		uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)first * ch_.batch_bytes;
		cudaError_t err = cudaMemcpyAsync(dst, src, (size_t)(count - 1) * ch_.batch_bytes + bytes,
						  cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return err;
		if (ch_.kind == transport::poll) {
			err = cudaStreamSynchronize(stream);
			for (uint32_t s = first; s < first + count && err == cudaSuccess; s++)
				__atomic_store_n(&ready_[s], published_[s], __ATOMIC_RELEASE);
			return err;
		}
		for (uint32_t s = first; s < first + count; s++)
			host_ready_[s] = published_[s];
		return cudaMemcpyAsync(&ready_[first], &host_ready_[first], count * sizeof(unsigned int),
				       cudaMemcpyHostToDevice, stream);
	}

	/*
	 * tagged: slots first..first + count - 1 formatted as lines into their pinned copy with
	 * their next generation's tag, each slot's whole batch (past @bytes of the last, zeros,
	 * since the consumers wait for every line).
	 */
	void format(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes)
	{
		const uint64_t words = ch_.batch_bytes / 8;
		for (uint32_t i = 0; i < count; i++)
			detail::format_lines(host_lines_ + 2 * (first + i) * words, src + (uint64_t)i * ch_.batch_bytes,
					     i + 1 < count ? ch_.batch_bytes : bytes, words, published_[first + i] + 1);
	}

	channel ch_{};
	reuse reuse_ = reuse::checked;
	size_t coalesce_bytes_ = 0;
	pending run_{};
	cudaStream_t lane_ = nullptr; /* coalesce(): every other run is queued here */
	bool on_lane_ = false;	      /* whether the last run was */
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	unsigned int *consumed_ = nullptr;
	uint64_t *lines_ = nullptr;
	uint64_t *host_lines_ = nullptr;
	unsigned int *host_ready_ = nullptr; /* push: the ready words' next values, copied from here */
	unsigned int *published_ = nullptr;
};

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
 * co_resident() - whether every block of a launch of @kernel would run at once on the current
 * device, as a kernel whose blocks wait for each other's messages (or a grid barrier) needs:
 * blocks that have not started cannot publish or consume, so the ones running wait forever
 * @kernel: the kernel
 * @grid: the grid it will be launched with
 * @block: its blocks
 * @shared_bytes: dynamic shared memory per block
 *
 * From the occupancy the runtime computes for the kernel's registers, shared memory and block
 * size on an idle device; kernels running beside it take SMs of their own, which this does not
 * see.
 *
 * Return: WIC_OK; WIC_EEXHAUSTED (cudaErrorCooperativeLaunchTooLarge) when the blocks would not
 * all be resident, also when not even one fits (too many registers per thread for the block);
 * WIC_EIO with a failed runtime call's error.
 */
template <typename Kernel>
inline outcome co_resident(Kernel *kernel, dim3 grid, dim3 block, size_t shared_bytes = 0)
{
	int device, sms, per_sm;
	cudaError_t err = cudaGetDevice(&device);
	if (err == cudaSuccess)
		err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
	if (err == cudaSuccess)
		err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)(block.x * block.y * block.z),
								    shared_bytes);
	if (err != cudaSuccess)
		return err;
	if ((uint64_t)grid.x * grid.y * grid.z > (uint64_t)per_sm * sms)
		return outcome{WIC_EEXHAUSTED, cudaErrorCooperativeLaunchTooLarge};
	return outcome{};
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
	 * Return: WIC_OK; WIC_EINVALID for fault and mapped (host_channel), a zero size, or tagged
	 * messages of a size that is not a multiple of 8 bytes; else WIC_EIO with the failed call's
	 * error.
	 */
	outcome create(transport kind, int consumer, int producer, uint32_t slots, uint32_t message_bytes,
			   uint32_t warps_per_batch)
	{
		if (kind == transport::fault || kind == transport::mapped || kind > transport::tagged || !slots ||
		    !message_bytes || !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return detail::invalid();
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
	outcome reset()
	{
		if (!consumed_)
			return detail::invalid();
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
