/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * transport - what each of wic.cuh's stock-driver transports costs, next to the physical
 * references measured in the same run.
 *
 * References:
 *   bulk_copy        one cudaMemcpyAsync of the streaming total, pinned host -> device (GB/s)
 *   mapped_one_way   a host store to pinned mapped memory seen by a spinning GPU thread: half
 *                    the round trip of a host <-> GPU ping-pong through two such words
 *   peer_one_way     (two GPUs) a store by a thread on GPU 1 into GPU 0's memory seen by a
 *                    thread spinning there: half the round trip of a GPU 1 <-> GPU 0 ping-pong
 *   peer_copy        (two GPUs) one cudaMemcpyPeerAsync of the streaming total, GPU 1 -> GPU 0
 *   ready_words      the GPU's time in stream order to write WORDS ready words (push's), by one
 *                    stream write-value operation each (cuStreamBatchMemOp()) and by one copy
 *                    of them from pinned memory; and a generation of 132 batches of 64 KiB,
 *                    its copy alone and followed by each way of writing its 132 words
 *
 * Measurements, for push, poll, alg1, mapped, tagged and launch (push_many, tagged_many: publishing a
 * whole generation with one publish_many(); launch: no kernel waits, each message's consumer is
 * launched by the channel after its copies, so its latency includes the launch):
 *   latency          host publishes a message of BYTES into slot 0; the consumer block receives
 *                    it and reads all of it, checking its first and last 8 bytes (the
 *                    message's stamp) in those loads, and thread 0 stores an acknowledgement
 *                    into pinned mapped memory, on which the host spins. round trip =
 *                    publish() to acknowledgement; one_way = round trip - mapped_one_way
 *                    (the acknowledgement's own trip). Against BYTES (one warp
 *                    waiting) and against WAITERS, the warps waiting at once (each other block
 *                    waits on its own slot, published when the measurement ends), with each
 *                    warp waiting for itself ("warp") or thread 0 for its block ("block", as the
 *                    paper's Algorithm 1; alg1 always waits so). For push also against the
 *                    longest sleep of its backoff (channel::backoff_ns).
 *   peer_fence       (two GPUs) what __threadfence_system() costs a thread on GPU 1 after
 *                    its stores of BYTES into GPU 0's memory: the wait for them to be
 *                    performed, which push, poll and alg1 publishing pays before its flag.
 *   peer_latency     (two GPUs) a producer kernel on GPU 1 writes a message of BYTES into a
 *                    peer_channel to GPU 0 and publishes it (publish_block()); the consumer
 *                    block receives it, checks the stamp and reports it consumed into GPU 1's
 *                    memory, which the producer waits for before the next message; one_way =
 *                    round trip - peer_one_way (the report's own trip). launch: no consumer
 *                    resident; the host queued every message's stream wait and consumer
 *                    launch on GPU 0 (launch_when_published()) once the producer started.
 *   streaming        one host thread streams TOTAL bytes (poll and alg1: TOTAL / 8; at least
 *                    two generations of every block, so more with large batches) as batches
 *                    of BYTES to one consumer block per SM (two slots per block, thread 0
 *                    waits, every thread reads the batch and one reports it consumed()); the
 *                    host calls wait_free() before it publishes a slot again: per slot
 *                    publish() (push, tagged, ...), the same after coalesce() (push_coalesced,
 *                    tagged_coalesced), or one publish_many() per generation (push_many,
 *                    tagged_many). GB/s from the first publish to the kernel's end, its ratio
 *                    to bulk_copy, and the host's time per call of publish() or
 *                    publish_many().
 *   ce_order_probe   whether a host copy could carry one flag per 128 bytes (NCCL's LL128):
 *                    a pinned buffer, every word g, copied into device memory for g = 1, 2,
 *                    ... while a kernel watches each 128-byte line, spinning on its last word
 *                    (odd g) or its first (even g) and then reading the other 15: lines torn
 *                    (flag new, another word old) of those whose arrival it watched.
 *   peer_streaming   (two GPUs) a producer kernel on GPU 1 (one block per SM) streams TOTAL
 *                    bytes (alg1: TOTAL / 8; at least two generations of every block) in
 *                    batches of BYTES through a peer_channel to one
 *                    consumer block per SM on GPU 0, two slots per block with flow control;
 *                    GB/s from the launches to both kernels' end, and its ratio to peer_copy.
 *                    launch: per generation the host queues the waits for its slots' ready
 *                    words and the launch of a block per slot, as it goes (its time counts).
 *   spin_pace        a steady stream of small stores, one every 100 us, from one warp of a
 *                    kernel whose other warps (0 to 2112) spin on pinned host words to the
 *                    host, then from the host to that warp: how much later than the quickest
 *                    each store is seen (p50, p99, max), each way, and how many are seen at all
 *                    while the others spin (a consumer's report to its host producer, and a
 *                    ready word, beside poll's waiters); then the round trip of a host value
 *                    to that warp and its echo back (p50, p99 of up to 2000 in half a second).
 *   spin_copy        what warps spinning on pinned host memory (poll's waiters with a host
 *                    producer: each its own word, no backoff) do to the rest of the PCIe
 *                    traffic: a copy of BYTES host -> device and a kernel's stores of BYTES into
 *                    pinned host memory (one block of 256 threads per SM), each timed (GB/s,
 *                    median of 5) beside 0 to 2112 spinning warps.
 *   waiting_cost     one block per SM: 8 warps of work (an issue-bound FMA loop, or 16-byte
 *                    loads streaming from device memory) beside 8 warps waiting on a channel
 *                    of each transport (push also with other backoffs), or stalled on
 *                    faults (each touching host-resident managed pages one after another, as
 *                    the fault transport's waiters stall on the stock driver): the work's time
 *                    beside them over its time beside none (median of 3 each).
 *
 * Every wait gives up after 2 s; a measurement whose wait gave up is reported failed and the
 * program exits 1. Prints a table; with OUT, also one JSON object per line into OUT.
 *
 * Usage: transport [--quick] [--spin | --streaming | --launch | --peer] [OUT.jsonl]   (--quick:
 *        64 MiB streams, fewer repetitions; --spin: only what spinning warps do: spin_pace,
 *        spin_copy and poll's latency beside them; --streaming: only bulk_copy and streaming;
 *        --launch: launch beside push, latency with one and 16 warps and streaming in every way
 *        of publishing; --peer: only the two-GPU measurements)
 */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "../apps/peer.cuh"
#include "host.cuh"
#include "report.cuh"

namespace {

using bench::clock_type;
using bench::finish;
using bench::host_wait;
using bench::seconds_since;
using bench::stuck;
using bench::timeout_ns;
using bench::timeout_s;
using bench::us_between;

struct settings {
	bool quick = false;
	uint32_t sms = 0;
	uint64_t stream_total = 512ull << 20;
	uint32_t latency_iterations = 2000;
	double point_budget_s = 0.3;
};

settings cfg;


using bench::quantile;
using bench::record;




/* A word of pinned host memory mapped into the current device: host and device addresses. */
struct mapped_word {
	unsigned int *host = nullptr;
	unsigned int *dev = nullptr;

	mapped_word()
	{
		CHECK(cudaHostAlloc(&host, sizeof(unsigned int), cudaHostAllocMapped));
		*host = 0;
		CHECK(cudaHostGetDevicePointer((void **)&dev, host, 0));
	}
	mapped_word(const mapped_word &) = delete;
	mapped_word &operator=(const mapped_word &) = delete;
	~mapped_word() { CHECK(cudaFreeHost(host)); }
};

/* One word per spinning warp (poll's waiters), pinned host memory mapped into the device. */
struct spin_words {
	unsigned int *host = nullptr;
	unsigned int *dev = nullptr;
	uint32_t count;

	explicit spin_words(uint32_t n) : count(n)
	{
		CHECK(cudaHostAlloc(&host, std::max(n, 1u) * sizeof(unsigned int), cudaHostAllocMapped));
		memset(host, 0, std::max(n, 1u) * sizeof(unsigned int));
		CHECK(cudaHostGetDevicePointer((void **)&dev, host, 0));
	}
	spin_words(const spin_words &) = delete;
	spin_words &operator=(const spin_words &) = delete;
	~spin_words() { CHECK(cudaFreeHost(host)); }

	/* Lets every spinner go. */
	void release()
	{
		for (uint32_t w = 0; w < count; w++)
			__atomic_store_n(&host[w], 1u, __ATOMIC_RELEASE);
	}
};

/* ---- device side ---- */

__device__ inline uint64_t load64(const uint8_t *at)
{
	return *reinterpret_cast<const volatile uint64_t *>(at);
}

/* Thread 0 of the block waits (@block) or every warp for itself, with a 2 s timeout. */
__device__ inline int wait_message(const wic::channel &ch, uint32_t slot, uint32_t generation, bool block,
				   const uint8_t **m)
{
	return block ? wic::recv_block(ch, slot, generation, m, timeout_ns)
		     : wic::recv(ch, slot, generation, 0, m, timeout_ns);
}

/* Echoes every value 1..@n of *@in into *@out; ~0 into *@out if one does not come within 2 s. */
__global__ void echo(const unsigned int *in, unsigned int *out, uint32_t n)
{
	for (uint32_t i = 1; i <= n; i++) {
		if (wic::detail::wait_past(in, i - 1, 0, timeout_ns) != WIC_OK) {
			wic::detail::store_release(out, ~0u);
			return;
		}
		wic::detail::store_release(out, i);
	}
}

/*
 * Peer ping: stores 1..@n into *@there (the other GPU's memory), each after the echo of the one
 * before arrived in *@here (this GPU's memory); rt_ns[i] = store to echo, by %globaltimer.
 */
__global__ void ping(unsigned int *there, const unsigned int *here, uint32_t n, uint64_t *rt_ns)
{
	for (uint32_t i = 1; i <= n; i++) {
		const uint64_t t0 = wic::detail::globaltimer();
		wic::detail::store_release(there, i);
		if (wic::detail::wait_past(here, i - 1, 0, timeout_ns) != WIC_OK)
			return;
		rt_ns[i - 1] = wic::detail::globaltimer() - t0;
	}
}

/*
 * The block reads all of the message of @bytes at @m, 16 bytes a thread at a time, into @acc;
 * returns whether this thread read a first or last 8 bytes other than @stamp. The stamp is
 * checked in the loads that read the data, so checking adds no access of its own (which, for a
 * message in host memory, would be another trip across the link).
 */
__device__ inline bool read_stamped(const uint8_t *m, uint64_t bytes, uint64_t stamp, uint4 *acc)
{
	const uint64_t last = bytes / 16 - 1;
	bool wrong = false;

	for (uint64_t k = threadIdx.x; k <= last; k += blockDim.x) {
		const uint4 v = reinterpret_cast<const uint4 *>(m)[k];
		if (k == 0)
			wrong |= ((uint64_t)v.y << 32 | v.x) != stamp;
		if (k == last)
			wrong |= ((uint64_t)v.w << 32 | v.z) != stamp;
		acc->x ^= v.x;
		acc->y ^= v.y;
		acc->z ^= v.z;
		acc->w ^= v.w;
	}
	return wrong;
}

/*
 * Block 0 receives generation 0, 1, ... of slot 0 until a message stamped 0: the whole block
 * reads each message, checking its stamp (generation + 1), and thread 0 acknowledges it in
 * *@ack. Every other block waits once on its own slot. A failed wait or a wrong stamp of block
 * 0 stores ~0 into *@ack; another block's failed wait stores 1 into *@failed.
 */
__global__ void latency_consumer(wic::channel ch, bool block, unsigned int *ack, unsigned int *failed, uint4 *sink)
{
	const uint8_t *m;
	uint4 acc = make_uint4(0, 0, 0, 0);

	if (blockIdx.x != 0) {
		/* A waiter that gave up would leave the measurement without telling: it fails it. */
		if (wait_message(ch, blockIdx.x, 0, block, &m) != WIC_OK && threadIdx.x % 32 == 0)
			wic::detail::store_release(failed, 1);
		return;
	}
	for (uint32_t i = 0;; i++) {
		const int rc = wait_message(ch, 0, i, block, &m);
		const bool wrong = rc != WIC_OK || read_stamped(m, ch.message_bytes, i + 1, &acc);
		if (__syncthreads_or(wrong)) {
			/* The stop message, or a failure. */
			if (threadIdx.x == 0 && (rc != WIC_OK || load64(m) != 0))
				wic::detail::store_release(ack, ~0u);
			break;
		}
		if (threadIdx.x == 0)
			wic::detail::store_release(ack, i + 1);
	}
	sink[threadIdx.x] = acc;
}

/*
 * launch: the consumer of one latency message, launched by the channel after its copies: the
 * block receives slot 0 at the generation it was launched for (there at the first look),
 * checks its stamp (generation + 1) and acknowledges it in *@ack; ~0 on a failure.
 */
__global__ void launched_latency_consumer(wic::channel ch, unsigned int *ack, uint4 *sink)
{
	const uint32_t g = wic::launched_generation(ch, 0);
	const uint8_t *m;
	uint4 acc = make_uint4(0, 0, 0, 0);
	const int rc = wic::recv_block<wic::transport::launch>(ch, 0, g, &m, 0);

	if (__syncthreads_or(rc != WIC_OK || read_stamped(m, ch.message_bytes, g + 1, &acc))) {
		if (threadIdx.x == 0)
			wic::detail::store_release(ack, ~0u);
		return;
	}
	if (threadIdx.x == 0)
		wic::detail::store_release(ack, g + 1);
	sink[threadIdx.x] = acc;
}

/*
 * GPU producer: writes message i (@bytes, stamped i + 1) with the whole block, publishes it,
 * and waits until the consumer reported it consumed (a word in this GPU's memory), as every
 * producer must before it writes the slot again; rt_ns[i] = first write to that report (left
 * 0 once a wait gave up).
 */
__global__ void peer_producer(wic::channel ch, uint32_t iterations, uint64_t *rt_ns)
{
	__shared__ int gave_up;
	uint8_t *buf = wic::slot_buffer(ch, 0);
	const uint64_t words = ch.message_bytes / 8;

	for (uint32_t i = 0; i < iterations; i++) {
		const uint64_t t0 = wic::detail::globaltimer();
		for (uint64_t k = threadIdx.x; k < words; k += blockDim.x)
			reinterpret_cast<uint64_t *>(buf)[k] = i + 1;
		wic::publish_block(ch, 0, i);
		if (threadIdx.x == 0) {
			/* Spinning: wait_consumed()'s backoff would add its sleeps to the round trip. */
			gave_up = wic::detail::wait_past(&ch.consumed[0], i, 0, timeout_ns) != WIC_OK;
			if (!gave_up)
				rt_ns[i] = wic::detail::globaltimer() - t0;
		}
		__syncthreads();
		if (gave_up)
			return;
	}
}

/* GPU 0's side of peer_producer: receive, read and check, report consumed. */
__global__ void peer_consumer(wic::channel ch, uint32_t iterations, uint4 *sink)
{
	uint4 acc = make_uint4(0, 0, 0, 0);

	for (uint32_t i = 0; i < iterations; i++) {
		const uint8_t *m;
		const int rc = wic::recv_block(ch, 0, i, &m, timeout_ns);
		if (__syncthreads_or(rc != WIC_OK || read_stamped(m, ch.message_bytes, i + 1, &acc)))
			return;
		if (threadIdx.x == 0)
			wic::consumed(ch, 0, i);
	}
	sink[threadIdx.x] = acc;
}

/*
 * launch: peer_consumer's side of one message, launched once it was published: read and
 * check it, there at the first look, and report it consumed (a failure leaves the producer's
 * wait to give up).
 */
__global__ void peer_launched_consumer(wic::channel ch, wic::delivery, uint4 *sink)
{
	const uint32_t i = wic::launched_generation(ch, 0);
	const uint8_t *m;
	uint4 acc = make_uint4(0, 0, 0, 0);
	const int rc = wic::recv_block<wic::transport::launch>(ch, 0, i, &m, 0);

	if (__syncthreads_or(rc != WIC_OK || read_stamped(m, ch.message_bytes, i + 1, &acc)))
		return;
	if (threadIdx.x == 0)
		wic::consumed(ch, 0, i);
	sink[threadIdx.x] = acc;
}

/*
 * What a producer's fence costs once its stores crossed the link: thread 0 stores @bytes into
 * @there (the other GPU's memory), then times __threadfence_system(), which returns once the
 * stores are performed system-wide; ns[i] for round i.
 */
__global__ void fence_after_stores(uint64_t *there, uint32_t bytes, uint32_t rounds, uint64_t *ns)
{
	for (uint32_t i = 0; i < rounds; i++) {
		for (uint32_t k = 0; k < bytes / 8; k++)
			there[k] = i;
		const uint64_t t0 = wic::detail::globaltimer();
		__threadfence_system();
		ns[i] = wic::detail::globaltimer() - t0;
	}
}

/*
 * Block b receives generation g of its stream in slot (g % 2) * gridDim.x + b, every thread
 * reads the batch (16 bytes at a time, into @sink) checking its stamp (b << 32 | g + 1, in the
 * first and last 8 bytes), and thread 0 acknowledges in acked[b]; a failure stores ~0 there.
 */
__device__ inline uint64_t load_acquire64(const uint64_t *at)
{
	uint64_t v;

	asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
	return v;
}

__device__ inline uint64_t load_relaxed64(const uint64_t *at)
{
	uint64_t v;

	asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
	return v;
}

/*
 * Thread t watches 128-byte line t of @lines (device memory) while a copy engine writes
 * generation g = 1, 2, ... into it (every 8-byte word g): it spins with acquire loads on one
 * word of the line, the last for odd g and the first for even g, and then reads the line's
 * other 15 words; the line is torn if one still holds an older generation. counts[0] and [2]
 * (last, first): lines whose flag word was still old at the first look, so that the write
 * was watched; counts[1] and [3]: torn lines. After each generation thread 0 of each block
 * adds 1 to *@ack (pinned host memory); a spin that gave up after 2 s sets *@failed.
 */
__global__ void watch_lines(const uint64_t *lines, uint32_t n_lines, uint32_t generations,
			    unsigned long long *counts, unsigned int *ack, unsigned int *failed)
{
	const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
	unsigned long long watched[2] = {0, 0}, torn[2] = {0, 0};

	for (uint32_t g = 1; g <= generations; g++) {
		const int last = g % 2;
		if (t < n_lines) {
			const uint64_t *line = lines + 16 * (uint64_t)t;
			const uint32_t flag = last ? 15 : 0;
			if (load_acquire64(line + flag) != g) {
				watched[last]++;
				const uint64_t t0 = wic::detail::globaltimer();
				while (load_acquire64(line + flag) != g)
					if (wic::detail::globaltimer() - t0 > timeout_ns) {
						wic::detail::store_release(failed, 1);
						break;
					}
			}
			bool old = false;
			for (uint32_t k = 0; k < 16; k++)
				if (k != flag)
					old |= load_relaxed64(line + k) != g;
			torn[last] += old;
		}
		__syncthreads();
		if (threadIdx.x == 0)
			atomicAdd_system(ack, 1u);
	}
	if (t < n_lines) {
		atomicAdd(&counts[0], watched[1]);
		atomicAdd(&counts[1], torn[1]);
		atomicAdd(&counts[2], watched[0]);
		atomicAdd(&counts[3], torn[0]);
	}
}

/* What the warps beside the waiting ones do, and how those wait. */
enum class work_kind : int { arith, memory };
enum class wait_kind : int { none, channel, fault };

constexpr uint32_t work_warps = 8, waiting_warps = 8;
/* Dynamic shared memory of a coresident block: more than half an SM's, so one block per SM. */
constexpr uint32_t one_block_per_sm_smem = 120 * 1024;

/*
 * coresident - one block per SM. Warps [0, work_warps) run @rounds rounds of @work: eight
 * independent FMA chains (issue-bound), or 16-byte loads streaming through the block's @region
 * bytes of @src (device memory, together far larger than L2). The others wait, as @how says:
 * not at all; on the block's slot of @ch (lane 0, as wic::recv() does); or touching, one after
 * another, the host-resident managed pages of @pages (@pages_per_warp each) until the block's
 * work is done, as a warp of the fault transport stalls on the stock driver. work_ns[b] is the
 * block's work span (first start to last end, %globaltimer), touched[b * waiting_warps + i] the
 * pages waiting warp i touched. When its work is done the block adds 1 to *@done (pinned host
 * memory), which tells the host to publish the slots.
 */
__global__ void coresident(wic::channel ch, wait_kind how, work_kind work, uint32_t rounds, const float4 *src,
			   uint64_t region, const uint8_t *pages, uint32_t pages_per_warp, unsigned int *done,
			   uint64_t *work_ns, uint32_t *touched, float *sink)
{
	__shared__ unsigned long long first_start, last_end;
	__shared__ volatile int work_over;
	__shared__ unsigned int finished;
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, b = blockIdx.x;

	if (threadIdx.x == 0) {
		first_start = ~0ull;
		last_end = 0;
		work_over = 0;
		finished = 0;
	}
	__syncthreads();
	if (warp >= work_warps) {
		const uint32_t i = warp - work_warps;
		if (how == wait_kind::channel) {
			const uint8_t *m;
			/* A waiter that gave up is marked, and fails the measurement. */
			if (wic::recv(ch, b, 0, 0, &m, timeout_ns) != WIC_OK && lane == 0)
				touched[b * waiting_warps + i] = ~0u;
		} else if (how == wait_kind::fault && lane == 0) {
			const uint8_t *mine = pages + ((uint64_t)b * waiting_warps + i) * pages_per_warp * 4096;
			uint32_t k = 0;
			uint64_t sum = 0;
			for (; k < pages_per_warp && !work_over; k++)
				sum += load64(mine + (uint64_t)k * 4096);
			touched[b * waiting_warps + i] = k;
			if (sum == 42) /* never: keeps the loads */
				sink[0] = 1.0f;
		}
		return;
	}
	const uint64_t start = wic::detail::globaltimer();
	float acc = 0.0f;
	if (work == work_kind::arith) {
		float x[8];
		for (int c = 0; c < 8; c++)
			x[c] = threadIdx.x + c;
		for (uint32_t r = 0; r < rounds; r++)
#pragma unroll
			for (int u = 0; u < 16; u++)
#pragma unroll
				for (int c = 0; c < 8; c++)
					x[c] = fmaf(x[c], 0.999f, 0.5f);
		for (int c = 0; c < 8; c++)
			acc += x[c];
	} else {
		const float4 *mine = src + b * (region / 16);
		for (uint32_t r = 0; r < rounds; r++)
			for (uint64_t k = threadIdx.x; k < region / 16; k += work_warps * 32) {
				const float4 v = mine[k];
				acc += v.x + v.y + v.z + v.w;
			}
	}
	const uint64_t end = wic::detail::globaltimer();
	if (lane == 0) {
		atomicMin(&first_start, (unsigned long long)start);
		atomicMax(&last_end, (unsigned long long)end);
		/* The last warp to arrive reads both: every warp's updates come before its arrival. */
		__threadfence_block();
		if (atomicAdd(&finished, 1u) == work_warps - 1) {
			__threadfence_block();
			work_over = 1;
			work_ns[b] = last_end - first_start;
			__threadfence_system();
			atomicAdd_system(done, 1u);
		}
	}
	if (acc == 42.0f) /* never: keeps the work */
		sink[1] = acc;
}

/*
 * GPU producer of a stream: block b writes generation g of its stream (@bytes per batch, every
 * 8-byte word the stamp b << 32 | g + 1) into slot (g % 2) * gridDim.x + b, once the consumers
 * are done with what the slot held, and publishes it.
 */
__global__ void peer_stream_producer(wic::channel ch, uint32_t generations)
{
	__shared__ int gave_up;
	const uint32_t b = blockIdx.x;

	for (uint32_t g = 0; g < generations; g++) {
		const uint32_t slot = (g % 2) * gridDim.x + b;
		if (threadIdx.x == 0)
			gave_up = g >= 2 && wic::wait_consumed(ch, slot, g / 2 - 1, timeout_ns) != WIC_OK;
		__syncthreads();
		if (gave_up)
			return;
		/* 16-byte stores, as wide as the consumers' loads. */
		uint4 *buf = reinterpret_cast<uint4 *>(wic::slot_buffer(ch, slot));
		const uint4 stamp = make_uint4(g + 1, b, g + 1, b);
		for (uint64_t k = threadIdx.x; k < ch.batch_bytes / 16; k += blockDim.x)
			buf[k] = stamp;
		wic::publish_block(ch, slot, g / 2);
	}
}

/*
 * GPU 0's side of peer_stream_producer: block b receives its stream, reads every batch checking
 * its stamp, and reports each generation consumed; a failure stores 1 into *@failed.
 */
__global__ void stream_consumer(wic::channel ch, uint32_t generations, unsigned int *failed, uint4 *sink)
{
	const uint32_t b = blockIdx.x;
	uint4 acc = make_uint4(0, 0, 0, 0);

	for (uint32_t g = 0; g < generations; g++) {
		const uint32_t slot = (g % 2) * gridDim.x + b;
		const uint8_t *batch;
		const int rc = wic::recv_block(ch, slot, g / 2, &batch, timeout_ns);
		const bool bad = rc != WIC_OK || read_stamped(batch, ch.batch_bytes, (uint64_t)b << 32 | (g + 1), &acc);
		if (__syncthreads_or(bad)) {
			if (threadIdx.x == 0)
				wic::detail::store_release(failed, 1);
			return;
		}
		if (threadIdx.x == 0)
			wic::consumed(ch, slot, g / 2);
	}
	sink[(size_t)b * blockDim.x + threadIdx.x] = acc;
}

/*
 * launch: the consumer of one delivery of the streaming measurement: block i takes slot
 * d.first_slot + i as stream_consumer() takes it (slot s holds block s % @blocks's batches of
 * every other generation), checks the stamp and reports the generation consumed.
 */
__global__ void launched_stream_consumer(wic::channel ch, wic::delivery d, uint32_t blocks, unsigned int *failed,
					 uint4 *sink)
{
	const uint32_t slot = d.first_slot + blockIdx.x, b = slot % blocks;
	const uint32_t g = wic::launched_generation(ch, slot);
	const uint64_t stamp = (uint64_t)b << 32 | (2 * g + slot / blocks + 1);
	const uint8_t *batch;
	uint4 acc = make_uint4(0, 0, 0, 0);
	const int rc = wic::recv_block<wic::transport::launch>(ch, slot, g, &batch, 0);

	if (__syncthreads_or(rc != WIC_OK || read_stamped(batch, ch.batch_bytes, stamp, &acc))) {
		if (threadIdx.x == 0)
			wic::detail::store_release(failed, 1);
		return;
	}
	if (threadIdx.x == 0)
		wic::consumed(ch, slot, g);
	sink[(size_t)b * blockDim.x + threadIdx.x] = acc;
}

/* ---- references ---- */

/*
 * The GPU's time, in ms, of @queue(stream) between two events on a stream of its own, @reps
 * times after a warm-up.
 */
template <typename Queue>
std::vector<double> event_ms(int reps, Queue queue)
{
	cudaEvent_t start, end;
	cudaStream_t stream;
	CHECK(cudaEventCreate(&start));
	CHECK(cudaEventCreate(&end));
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	std::vector<double> times;
	for (int rep = 0; rep <= reps; rep++) {
		CHECK(cudaEventRecord(start, stream));
		queue(stream);
		CHECK(cudaEventRecord(end, stream));
		CHECK(cudaEventSynchronize(end));
		float ms;
		CHECK(cudaEventElapsedTime(&ms, start, end));
		if (rep) /* rep 0 warms up */
			times.push_back(ms);
	}
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaEventDestroy(start));
	CHECK(cudaEventDestroy(end));
	return times;
}

/* The median GB/s of 5 runs, after a warm-up, of @queue(stream), which queues a copy of @bytes. */
template <typename Queue>
double copy_gbps(uint64_t bytes, Queue queue)
{
	std::vector<double> gbps;
	for (double ms : event_ms(5, queue))
		gbps.push_back(bytes / (ms * 1e6));
	return quantile(gbps, 0.5);
}

/* GB/s of one pinned -> device copy of @bytes (median of 5). */
double bulk_copy_gbps(uint64_t bytes)
{
	void *host, *dev;
	CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
	memset(host, 1, bytes);
	CHECK(cudaMalloc(&dev, bytes));
	const double median = copy_gbps(bytes, [&](cudaStream_t stream) {
		CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
	});
	CHECK(cudaFree(dev));
	CHECK(cudaFreeHost(host));
	printf("%-16s %-10s %10.1f GB/s  (%llu MiB, median of 5)\n", "bulk_copy", "reference", median,
	       (unsigned long long)(bytes >> 20));
	record("bulk_copy").add("bytes", (double)bytes).add("gbps", median).emit();
	return median;
}

/*
 * copy_pipeline() - what the copy engine does with copies of @size bytes queued back to back,
 * each followed (@words) by a copy of a 4-byte word from pinned memory as push's ready word,
 * spread round-robin over @streams streams: @total bytes from pinned memory into device memory.
 * Everything is queued behind a gate (a stream wait on a pinned word) and timed from the gate's
 * opening to the last stream's end, so the host's time per call does not count; GB/s and the
 * time over one copy of @total measured the same way. A watchdog opens the gate after 5 s should
 * the queue fill while it is closed, and the run is then reported as such.
 */
void copy_pipeline(uint64_t total, uint32_t size, uint32_t streams, bool words)
{
	const uint32_t copies = (uint32_t)(total / size);
	uint8_t *host, *dev;
	unsigned int *host_words, *dev_words, *gate, *gate_dev;
	CHECK(cudaHostAlloc(&host, total, cudaHostAllocDefault));
	memset(host, 1, total);
	CHECK(cudaMalloc(&dev, total));
	CHECK(cudaHostAlloc(&host_words, copies * sizeof(unsigned int), cudaHostAllocDefault));
	CHECK(cudaMalloc(&dev_words, copies * sizeof(unsigned int)));
	CHECK(cudaHostAlloc(&gate, sizeof(unsigned int), cudaHostAllocMapped));
	CHECK(cudaHostGetDevicePointer((void **)&gate_dev, gate, 0));
	std::vector<cudaStream_t> s(streams);
	for (auto &stream : s)
		CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	/* Once with one copy of everything, then as asked; each the median of 3. */
	auto timed = [&](bool whole) {
		std::vector<double> ms;
		for (int rep = 0; rep < 3; rep++) {
			*(volatile unsigned int *)gate = 0;
			for (auto stream : s)
				if (cuStreamWaitValue32(stream, (CUdeviceptr)gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ) !=
				    CUDA_SUCCESS)
					stuck("copy_pipeline: cuStreamWaitValue32");
			std::atomic<bool> opened{false};
			std::thread watchdog([&] {
				for (int i = 0; i < 5000 && !opened.load(); i++)
					std::this_thread::sleep_for(std::chrono::milliseconds(1));
				__atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
			});
			for (uint32_t i = 0; i < (whole ? 1 : copies); i++) {
				cudaStream_t stream = s[i % streams];
				CHECK(cudaMemcpyAsync(dev + (uint64_t)i * size, host + (uint64_t)i * size, whole ? total : size,
						      cudaMemcpyHostToDevice, stream));
				if (words && !whole)
					CHECK(cudaMemcpyAsync(&dev_words[i], &host_words[i], sizeof(unsigned int),
							      cudaMemcpyHostToDevice, stream));
			}
			const bool late = __atomic_load_n(gate, __ATOMIC_ACQUIRE) != 0;
			const auto t0 = clock_type::now();
			__atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
			opened = true;
			for (auto stream : s)
				CHECK(cudaStreamSynchronize(stream));
			watchdog.join();
			if (late)
				stuck("copy_pipeline: the queue filled while the gate was closed");
			ms.push_back(seconds_since(t0) * 1e3);
		}
		return quantile(ms, 0.5);
	};
	const double one = timed(true), many = timed(false);
	printf("%-16s %-10s %8u B x %-5u %s %u stream(s): %7.1f GB/s  %5.2fx one copy (%.1f GB/s)\n", "copy_pipeline",
	       "reference", size, copies, words ? "+ word" : "alone ", streams, total / (many * 1e6), many / one,
	       total / (one * 1e6));
	record("copy_pipeline")
		.add("bytes", (double)size)
		.add("copies", (double)copies)
		.add("words", words ? 1.0 : 0.0)
		.add("streams", (double)streams)
		.add("gbps", total / (many * 1e6))
		.add("time_over_one_copy", many / one)
		.emit();
	for (auto stream : s)
		CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFreeHost(gate));
	CHECK(cudaFree(dev_words));
	CHECK(cudaFreeHost(host_words));
	CHECK(cudaFree(dev));
	CHECK(cudaFreeHost(host));
}

/*
 * The GPU's time, in us, of @queue(stream) queued 10 times between two events (median of 20):
 * what it keeps the stream busy, whatever the host's API time.
 */
template <typename Queue>
double stream_us(Queue queue)
{
	auto ten = [&](cudaStream_t stream) {
		for (int i = 0; i < 10; i++)
			queue(stream);
	};
	std::vector<double> us;
	for (double ms : event_ms(20, ten))
		us.push_back(ms * 100.0); /* the ms of ten, the us of one */
	return quantile(us, 0.5);
}

/*
 * ready_words() - why push's host publish copies its ready words instead of writing each with a
 * stream write-value operation: the GPU's time for @words words each way, and for a generation
 * of @batches batches of @batch_bytes (a streaming application's publish_many()) with each.
 */
void ready_words(const uint32_t (&counts)[5], uint32_t batches, uint64_t batch_bytes)
{
	const uint32_t most = *std::max_element(std::begin(counts), std::end(counts));
	unsigned int *dev_words, *host_words;
	uint8_t *dev_data, *host_data;
	CHECK(cudaMalloc(&dev_words, most * sizeof(unsigned int)));
	CHECK(cudaHostAlloc(&host_words, most * sizeof(unsigned int), cudaHostAllocDefault));
	CHECK(cudaMalloc(&dev_data, batches * batch_bytes));
	CHECK(cudaHostAlloc(&host_data, batches * batch_bytes, cudaHostAllocDefault));
	memset(host_data, 1, batches * batch_bytes);
	std::vector<CUstreamBatchMemOpParams> writes(most);
	for (uint32_t i = 0; i < most; i++) {
		host_words[i] = i + 1;
		writes[i] = CUstreamBatchMemOpParams{};
		writes[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
		writes[i].writeValue.address = (CUdeviceptr)&dev_words[i];
		writes[i].writeValue.value = i + 1;
	}
	auto write_values = [&](cudaStream_t stream, uint32_t n) {
		const CUresult res = cuStreamBatchMemOp(stream, n, writes.data(), 0);
		if (res != CUDA_SUCCESS) {
			fprintf(stderr, "cuStreamBatchMemOp of %u writes: CUresult %d\n", n, (int)res);
			exit(2);
		}
	};
	auto copy_words = [&](cudaStream_t stream, uint32_t n) {
		CHECK(cudaMemcpyAsync(dev_words, host_words, n * sizeof(unsigned int), cudaMemcpyHostToDevice, stream));
	};
	for (uint32_t n : counts) {
		const double by_writes = stream_us([&](cudaStream_t s) { write_values(s, n); });
		const double by_copy = stream_us([&](cudaStream_t s) { copy_words(s, n); });
		printf("%-16s %-10s words %-6u write-value ops %7.2f us, one copy %6.2f us (GPU time)\n", "ready_words",
		       "reference", n, by_writes, by_copy);
		record("ready_words").add("words", (double)n).add("write_values_us", by_writes).add("copy_us", by_copy).emit();
	}
	auto data = [&](cudaStream_t s) {
		CHECK(cudaMemcpyAsync(dev_data, host_data, batches * batch_bytes, cudaMemcpyHostToDevice, s));
	};
	const double alone = stream_us(data);
	const double with_writes = stream_us([&](cudaStream_t s) {
		data(s);
		write_values(s, batches);
	});
	const double with_copy = stream_us([&](cudaStream_t s) {
		data(s);
		copy_words(s, batches);
	});
	printf("%-16s %-10s generation of %u x %llu KiB: copy %6.1f us, + write-value ops %6.1f us, + words' copy "
	       "%6.1f us\n",
	       "ready_words", "reference", batches, (unsigned long long)(batch_bytes >> 10), alone, with_writes, with_copy);
	record("ready_words_generation")
		.add("batches", (double)batches)
		.add("batch_bytes", (double)batch_bytes)
		.add("copy_us", alone)
		.add("with_write_values_us", with_writes)
		.add("with_words_copy_us", with_copy)
		.emit();
	CHECK(cudaFreeHost(host_data));
	CHECK(cudaFree(dev_data));
	CHECK(cudaFreeHost(host_words));
	CHECK(cudaFree(dev_words));
}

/* Half the median host <-> GPU round trip through two pinned mapped words, in us. */
double mapped_one_way_us()
{
	const uint32_t n = cfg.quick ? 2000 : 20000;
	mapped_word in, out;
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	echo<<<1, 1, 0, stream>>>(in.dev, out.dev, n);
	CHECK(cudaGetLastError());
	std::vector<double> rt;
	for (uint32_t i = 1; i <= n; i++) {
		const auto t0 = clock_type::now();
		__atomic_store_n(in.host, i, __ATOMIC_RELEASE);
		if (!host_wait(out.host, i))
			stuck("mapped_one_way");
		rt.push_back(us_between(t0, clock_type::now()));
	}
	finish(stream, "mapped_one_way");
	CHECK(cudaStreamDestroy(stream));
	rt.erase(rt.begin(), rt.begin() + n / 10); /* warm-up */
	const double one_way = quantile(rt, 0.5) / 2;
	printf("%-16s %-10s %10.2f us one way  (round trip p10 %.2f, p90 %.2f us; %u trips)\n", "mapped_one_way",
	       "reference", one_way, quantile(rt, 0.1), quantile(rt, 0.9), n);
	record("mapped_one_way").add("one_way_us", one_way).add("rt_p10_us", quantile(rt, 0.1))
		.add("rt_p50_us", quantile(rt, 0.5)).add("rt_p90_us", quantile(rt, 0.9)).emit();
	return one_way;
}

/* GB/s of one GPU 1 -> GPU 0 copy of @bytes over the peer link (median of 5). */
double peer_copy_gbps(uint64_t bytes)
{
	void *from = app::alloc_on<uint8_t>(1, bytes), *to = app::alloc_on<uint8_t>(0, bytes);
	double median;
	{
		app::on_gpu g(0);
		median = copy_gbps(bytes, [&](cudaStream_t stream) {
			CHECK(cudaMemcpyPeerAsync(to, 0, from, 1, bytes, stream));
		});
	}
	app::free_on(0, to);
	app::free_on(1, from);
	printf("%-16s %-10s %10.1f GB/s  (%llu MiB, GPU 1 -> GPU 0, median of 5)\n", "peer_copy", "reference", median,
	       (unsigned long long)(bytes >> 20));
	record("peer_copy").add("bytes", (double)bytes).add("gbps", median).emit();
	return median;
}

/* Half the median GPU 1 <-> GPU 0 round trip through a word in each GPU's memory, in us. */
double peer_one_way_us()
{
	const uint32_t n = cfg.quick ? 2000 : 20000;
	unsigned int *word[2];
	uint64_t *rt_ns;
	cudaStream_t stream[2];
	for (int d = 0; d < 2; d++) {
		app::on_gpu g(d);
		CHECK(cudaMalloc(&word[d], sizeof(unsigned int)));
		CHECK(cudaMemset(word[d], 0, sizeof(unsigned int)));
		CHECK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
		CHECK(cudaDeviceSynchronize());
	}
	{
		app::on_gpu g(1);
		CHECK(cudaMalloc(&rt_ns, n * sizeof(uint64_t)));
		app::load(ping);
	}
	{
		app::on_gpu g(0);
		app::load(echo);
		echo<<<1, 1, 0, stream[0]>>>(word[0], word[1], n);
		CHECK(cudaGetLastError());
	}
	{
		app::on_gpu g(1);
		ping<<<1, 1, 0, stream[1]>>>(word[0], word[1], n, rt_ns);
		CHECK(cudaGetLastError());
	}
	for (int d = 0; d < 2; d++)
		finish(stream[d], "peer_one_way");
	std::vector<uint64_t> ns(n);
	CHECK(cudaMemcpy(ns.data(), rt_ns, n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
	std::vector<double> rt;
	for (uint32_t i = n / 10; i < n; i++)
		rt.push_back(ns[i] / 1000.0);
	for (int d = 0; d < 2; d++) {
		app::on_gpu g(d);
		CHECK(cudaFree(word[d]));
		CHECK(cudaStreamDestroy(stream[d]));
	}
	app::free_on(1, rt_ns);
	const double one_way = quantile(rt, 0.5) / 2;
	printf("%-16s %-10s %10.2f us one way  (round trip p10 %.2f, p90 %.2f us)\n", "peer_one_way", "reference",
	       one_way, quantile(rt, 0.1), quantile(rt, 0.9));
	record("peer_one_way").add("one_way_us", one_way).add("rt_p10_us", quantile(rt, 0.1))
		.add("rt_p50_us", quantile(rt, 0.5)).add("rt_p90_us", quantile(rt, 0.9)).emit();
	return one_way;
}

/* ---- measurements ---- */

/*
 * latency() - host -> warp: @blocks blocks of @warps warps wait on a channel of @kind whose
 * waiters sleep at most @backoff_ns (-1: the transport's default); block 0's messages of @bytes
 * are timed, at most cfg.latency_iterations or as many as fit in cfg.point_budget_s (at least
 * 50). launch: no kernel waits; each message's consumer (one block of @warps warps) is launched
 * by the channel after its copies (@blocks must be 1).
 */
void latency(wic::transport kind, uint32_t bytes, uint32_t blocks, uint32_t warps, bool block,
	     double mapped_one_way, int64_t backoff_ns = -1)
{
	wic::host_channel ch;
	/* The acknowledgement, not wic::consumed(), tells the host that slot 0 may be written again. */
	CHECK(ch.create(kind, blocks, bytes, 1, wic::reuse::caller));
	wic::channel dev = ch.device();
	if (backoff_ns >= 0)
		dev.backoff_ns = (uint32_t)backoff_ns;
	uint8_t *staging;
	CHECK(cudaHostAlloc(&staging, bytes, cudaHostAllocDefault));
	memset(staging, 0x5a, bytes);
	uint4 *sink;
	CHECK(cudaMalloc(&sink, warps * 32 * sizeof(uint4)));
	mapped_word ack, failed;
	cudaStream_t kernel_stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
	const bool launched = kind == wic::transport::launch;
	if (launched)
		CHECK(ch.launch_consumer([&](const wic::delivery &, cudaStream_t stream) {
			launched_latency_consumer<<<1, warps * 32, 0, stream>>>(dev, ack.dev, sink);
			return cudaGetLastError();
		}));
	else
		latency_consumer<<<blocks, warps * 32, 0, kernel_stream>>>(dev, block, ack.dev, failed.dev, sink);
	CHECK(cudaGetLastError());
	char what[96];
	snprintf(what, sizeof(what), "latency %s %u B %u waiters", wic::transport_name(kind), bytes, blocks * warps);
	/* Message i carries the stamp i + 1 in its first and last 8 bytes; 0 tells the block to end. */
	auto send = [&](uint64_t stamp) {
		memcpy(staging, &stamp, 8);
		memcpy(staging + bytes - 8, &stamp, 8);
		CHECK(ch.publish(0, staging, bytes, copy_stream));
	};
	std::vector<double> rt, api;
	const auto start = clock_type::now();
	for (uint32_t i = 0; i < cfg.latency_iterations; i++) {
		if (i >= 50 && seconds_since(start) > cfg.point_budget_s)
			break;
		const auto t0 = clock_type::now();
		send(i + 1);
		const auto t1 = clock_type::now();
		if (!host_wait(ack.host, i + 1))
			stuck(what);
		rt.push_back(us_between(t0, clock_type::now()));
		api.push_back(us_between(t0, t1));
	}
	if (!launched) {
		send(0);
		/* The other blocks' slots, each once: they end. */
		for (uint32_t b = 1; b < blocks; b++)
			CHECK(ch.publish(b, staging, 16, copy_stream));
	}
	finish(kernel_stream, what);
	finish(copy_stream, what);
	if (__atomic_load_n(failed.host, __ATOMIC_ACQUIRE))
		stuck(what);
	CHECK(cudaStreamDestroy(kernel_stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(sink));
	CHECK(cudaFreeHost(staging));
	rt.erase(rt.begin(), rt.begin() + rt.size() / 10); /* warm-up */
	const double median = quantile(rt, 0.5), one_way = median - mapped_one_way;
	const char *style = block ? "block" : "warp";
	printf("%-16s %-10s %8u B %5u waiters (%-5s, backoff %4u ns) rt %8.2f us (p10 %.2f p90 %.2f) one_way "
	       "%8.2f us publish %6.2f us\n",
	       "latency", wic::transport_name(kind), bytes, blocks * warps, style, dev.backoff_ns, median,
	       quantile(rt, 0.1), quantile(rt, 0.9), one_way, quantile(api, 0.5));
	record("latency")
		.add("transport", wic::transport_name(kind))
		.add("bytes", (double)bytes)
		.add("waiters", (double)(blocks * warps))
		.add("wait", style)
		.add("spinning", (double)(block ? blocks : blocks * warps))
		.add("backoff_ns", (double)dev.backoff_ns)
		.add("rt_p10_us", quantile(rt, 0.1))
		.add("rt_p50_us", median)
		.add("rt_p90_us", quantile(rt, 0.9))
		.add("one_way_us", one_way)
		.add("one_way_over_mapped", one_way / mapped_one_way)
		.add("publish_us", quantile(api, 0.5))
		.add("messages", (double)rt.size())
		.emit();
}

/*
 * Spins on @word (pinned host memory, mapped) until it is nonzero, as poll's waiters do, after
 * counting itself into *@started; gives up after 2 s.
 */
__device__ void spin_on_word(const unsigned int *word, unsigned int *started)
{
	atomicAdd_system(started, 1);
	const uint64_t t0 = wic::detail::globaltimer();
	while (*reinterpret_cast<const volatile unsigned int *>(word) == 0)
		if (wic::detail::globaltimer() - t0 > timeout_ns)
			return;
}

/* Lane 0 of every warp spins on its own word of @words (spin_on_word()). */
__global__ void spin_on_host(const unsigned int *words, unsigned int *started)
{
	if (threadIdx.x % 32 == 0)
		spin_on_word(words + (blockIdx.x * blockDim.x + threadIdx.x) / 32, started);
}

/* Stores @bytes of 16-byte words into @to (pinned host memory, mapped), grid-strided. */
__global__ void store_to_host(uint4 *to, uint64_t bytes)
{
	const uint4 v = make_uint4(threadIdx.x, blockIdx.x, 0, 0);
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes / 16; i += (uint64_t)gridDim.x * blockDim.x)
		to[i] = v;
}

/* Stores 1..@n into *@to (pinned host memory, mapped), value i at @period_ns x i by %globaltimer. */
__device__ void pace_to_host(unsigned int *to, uint32_t n, uint64_t period_ns)
{
	const uint64_t t0 = wic::detail::globaltimer();
	for (uint32_t i = 1; i <= n; i++) {
		while (wic::detail::globaltimer() - t0 < i * period_ns)
			;
		wic::detail::store_release(to, i);
	}
}

/*
 * Records in @seen_ns[i - 1] the %globaltimer at which value i of *@from (pinned host memory,
 * mapped) is first seen, for 1..@n; gives up 2 s after the last change.
 */
__device__ void watch_host(const unsigned int *from, uint32_t n, uint64_t *seen_ns)
{
	uint32_t last = 0;
	uint64_t changed = wic::detail::globaltimer();
	while (last < n) {
		const uint32_t v = *reinterpret_cast<const volatile unsigned int *>(from);
		const uint64_t now = wic::detail::globaltimer();
		if (v != last) {
			for (uint32_t i = last + 1; i <= v && i <= n; i++)
				seen_ns[i - 1] = now;
			last = v;
			changed = now;
		} else if (now - changed > timeout_ns) {
			return;
		}
	}
}

/*
 * spin_on_host()'s warps with one warp more in each block: lane 0 of block 0's last warp paces
 * stores to the host (@to_host: pace_to_host()), then watches the host's (@from_host:
 * watch_host()), then echoes the host's values n + 1 .. 2n from @from_host into @to_host, as a
 * consumer's warp beside poll's waiters reports to its host producer and waits for it; the last
 * warps of the other blocks return at once.
 */
__global__ void spin_beside(const unsigned int *words, unsigned int *started, uint32_t warps, unsigned int *to_host,
			    const unsigned int *from_host, uint32_t n, uint64_t period_ns, uint64_t *seen_ns)
{
	const uint32_t warp = threadIdx.x / 32;
	if (warp < warps) {
		if (threadIdx.x % 32 == 0)
			spin_on_word(words + blockIdx.x * warps + warp, started);
		return;
	}
	if (blockIdx.x || threadIdx.x % 32)
		return;
	/* Once every spinner spins: it is counted in before its first load. */
	while (*reinterpret_cast<volatile unsigned int *>(started) < gridDim.x * warps)
		;
	pace_to_host(to_host, n, period_ns);
	watch_host(from_host, n, seen_ns);
	for (uint32_t i = n + 1; i <= 2 * n; i++) {
		if (wic::detail::wait_past(from_host, i - 1, 0, timeout_ns) != WIC_OK)
			return;
		wic::detail::store_release(to_host, i);
	}
}

/*
 * The lateness of each of @at (arrival times, ns, value i + 1 at index i, 0 where it never came)
 * beyond its pace (@period_ns x (i + 1)) and beyond the least of them: how much longer than the
 * quickest one each message of a steady stream took, whatever the clocks' offset. Returns the
 * lateness of those that came, in microseconds.
 */
std::vector<double> lateness_us(const std::vector<uint64_t> &at, uint64_t period_ns)
{
	std::vector<double> late;
	for (size_t i = 0; i < at.size(); i++)
		if (at[i])
			late.push_back((double)at[i] - (double)period_ns * (double)(i + 1));
	const double least = late.empty() ? 0 : *std::min_element(late.begin(), late.end());
	for (double &l : late)
		l = (l - least) / 1000;
	return late;
}

/*
 * spin_pace() - a steady stream of small stores each way between the host and one GPU thread,
 * one every @period_ns, beside @blocks x @warps warps spinning on pinned host words: how much
 * later than the quickest each store is seen (p50, p99, max), GPU -> host (a consumer's report
 * to its host producer) and host -> GPU (a ready word), and how many of @n were seen at all
 * before the spinners gave up; then up to @n round trips of a host value to that thread and
 * its echo back (p50, p99), which, unlike the lateness, include the constant delay.
 */
void spin_pace(uint32_t blocks, uint32_t warps, uint32_t n, uint64_t period_ns)
{
	const uint32_t spinning = blocks * warps;
	spin_words words(spinning);
	mapped_word started, to_host, from_host;
	uint64_t *seen_dev;
	CHECK(cudaMalloc(&seen_dev, n * sizeof(uint64_t)));
	CHECK(cudaMemset(seen_dev, 0, n * sizeof(uint64_t)));
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
	char what[64];
	snprintf(what, sizeof(what), "spin_pace %u spinning", spinning);
	/* The pacing warp is one of the spinning kernel's, as a consumer's reporting warp is. */
	spin_beside<<<std::max(blocks, 1u), (warps + 1) * 32, 0, stream>>>(words.dev, started.dev, warps, to_host.dev,
									   from_host.dev, n, period_ns, seen_dev);
	CHECK(cudaGetLastError());
	if (!host_wait(started.host, spinning))
		stuck(what);
	/* GPU -> host: the host notes when each value arrives. */
	std::vector<uint64_t> to_host_at(n, 0);
	const auto origin = clock_type::now();
	const auto ns_since = [&] {
		return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - origin).count();
	};
	for (uint32_t last = 0; last < n && seconds_since(origin) < timeout_s / 4;) {
		const uint32_t v = std::min(__atomic_load_n(to_host.host, __ATOMIC_ACQUIRE), n);
		for (const uint64_t now = ns_since(); last < v; last++)
			to_host_at[last] = now;
	}
	/* Host -> GPU: the GPU thread notes when each value arrives. */
	const auto paced = clock_type::now();
	uint32_t written = 0;
	for (uint32_t i = 1; i <= n && seconds_since(paced) < timeout_s / 4; i++) {
		while (std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - paced).count() <
		       (int64_t)(i * period_ns))
			;
		__atomic_store_n(from_host.host, i, __ATOMIC_RELEASE);
		written = i;
	}
	/* Round trips: the host's value to the warp and the warp's echo back, n of them at most. */
	__atomic_store_n(from_host.host, n, __ATOMIC_RELEASE);
	std::vector<double> rt;
	const auto echoed = clock_type::now();
	for (uint32_t i = n + 1; i <= 2 * n && seconds_since(echoed) < timeout_s / 4; i++) {
		const auto t0 = clock_type::now();
		__atomic_store_n(from_host.host, i, __ATOMIC_RELEASE);
		if (!host_wait(to_host.host, i))
			stuck(what);
		rt.push_back(us_between(t0, clock_type::now()));
	}
	words.release();
	/* Ends the echo if the time ran out first. */
	__atomic_store_n(from_host.host, 2 * n, __ATOMIC_RELEASE);
	finish(stream, what);
	std::vector<uint64_t> from_host_at(n);
	CHECK(cudaMemcpy(from_host_at.data(), seen_dev, n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
	/* The value written after the spinners let go (to end the watch) was not beside them. */
	from_host_at.resize(written);
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(seen_dev));
	const double rt50 = quantile(rt, 0.5), rt99 = quantile(rt, 0.99);
	printf("%-16s %-11s %5u spinning  host -> warp -> host p50 %9.2f us  p99 %9.2f us  (%zu)\n", "spin_pace",
	       "round_trip", spinning, rt50, rt99, rt.size());
	record("spin_pace")
		.add("way", "round_trip")
		.add("spinning", (double)spinning)
		.add("rt_p50_us", rt50)
		.add("rt_p99_us", rt99)
		.add("round_trips", (double)rt.size())
		.emit();
	for (int way = 0; way < 2; way++) {
		const std::vector<double> late = lateness_us(way ? from_host_at : to_host_at, period_ns);
		const char *name = way ? "host_to_gpu" : "gpu_to_host";
		const double p50 = late.empty() ? 0 : quantile(late, 0.5), p99 = late.empty() ? 0 : quantile(late, 0.99);
		const double most = late.empty() ? 0 : *std::max_element(late.begin(), late.end());
		printf("%-16s %-11s %5u spinning  late p50 %9.2f us  p99 %9.2f us  max %9.2f us  seen %zu of %u\n",
		       "spin_pace", name, spinning, p50, p99, most, late.size(), n);
		record("spin_pace")
			.add("way", name)
			.add("spinning", (double)spinning)
			.add("period_us", (double)period_ns / 1000)
			.add("late_p50_us", p50)
			.add("late_p99_us", p99)
			.add("late_max_us", most)
			.add("seen", (double)late.size())
			.add("sent", (double)n)
			.emit();
	}
}

/*
 * spin_copy() - a copy of @bytes host -> device and a kernel's stores of @bytes into pinned
 * host memory, each beside @blocks x @warps warps spinning on pinned host words.
 */
void spin_copy(uint32_t blocks, uint32_t warps, uint64_t bytes)
{
	const uint32_t spinning = blocks * warps;
	spin_words words(spinning);
	mapped_word started;
	uint8_t *src, *dst, *host_dst, *host_dst_dev;
	CHECK(cudaHostAlloc(&src, bytes, cudaHostAllocDefault));
	memset(src, 0x5a, bytes);
	CHECK(cudaMalloc(&dst, bytes));
	CHECK(cudaHostAlloc(&host_dst, bytes, cudaHostAllocMapped));
	CHECK(cudaHostGetDevicePointer((void **)&host_dst_dev, host_dst, 0));
	cudaStream_t spin_stream;
	CHECK(cudaStreamCreateWithFlags(&spin_stream, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
	char what[64];
	snprintf(what, sizeof(what), "spin_copy %u spinning", spinning);
	if (spinning) {
		spin_on_host<<<blocks, warps * 32, 0, spin_stream>>>(words.dev, started.dev);
		CHECK(cudaGetLastError());
		if (!host_wait(started.host, spinning))
			stuck(what);
	}
	const auto spun = clock_type::now();
	const double copy = copy_gbps(bytes, [&](cudaStream_t stream) {
		CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
	});
	const double store = copy_gbps(bytes, [&](cudaStream_t stream) {
		store_to_host<<<cfg.sms, 256, 0, stream>>>(reinterpret_cast<uint4 *>(host_dst_dev), bytes);
		CHECK(cudaGetLastError());
	});
	/* The spinners give up after timeout_s: every measurement must have had all of them. */
	if (seconds_since(spun) > timeout_s / 2)
		stuck(what);
	words.release();
	finish(spin_stream, what);
	CHECK(cudaStreamDestroy(spin_stream));
	CHECK(cudaFreeHost(host_dst));
	CHECK(cudaFree(dst));
	CHECK(cudaFreeHost(src));
	printf("%-16s %-10s %8llu B %5u spinning  copy %7.2f GB/s  kernel stores %7.2f GB/s\n", "spin_copy",
	       "poll", (unsigned long long)bytes, spinning, copy, store);
	record("spin_copy")
		.add("bytes", (double)bytes)
		.add("spinning", (double)spinning)
		.add("copy_gbps", copy)
		.add("store_gbps", store)
		.emit();
}

/* peer_fence() - the median time of a fence after @bytes of stores across the link, GPU 1 -> GPU 0. */
void peer_fence(uint32_t bytes)
{
	const uint32_t rounds = cfg.quick ? 200 : 2000;
	uint64_t *there = app::alloc_on<uint64_t>(0, bytes / 8);
	uint64_t *ns = app::alloc_on<uint64_t>(1, rounds);
	std::vector<uint64_t> got(rounds);
	{
		app::on_gpu g(1);
		fence_after_stores<<<1, 1>>>(there, bytes, rounds, ns);
		CHECK(cudaGetLastError());
		CHECK(cudaMemcpy(got.data(), ns, rounds * sizeof(uint64_t), cudaMemcpyDeviceToHost));
	}
	app::free_on(0, there);
	app::free_on(1, ns);
	std::vector<double> us;
	for (uint32_t i = rounds / 10; i < rounds; i++)
		us.push_back(got[i] / 1000.0);
	printf("%-16s %-10s %8u B %8.2f us  (p10 %.2f p90 %.2f)\n", "peer_fence", "reference", bytes, quantile(us, 0.5),
	       quantile(us, 0.1), quantile(us, 0.9));
	record("peer_fence")
		.add("bytes", (double)bytes)
		.add("fence_p10_us", quantile(us, 0.1))
		.add("fence_p50_us", quantile(us, 0.5))
		.add("fence_p90_us", quantile(us, 0.9))
		.emit();
}

/* peer_latency() - GPU 1 -> GPU 0 through a peer_channel of @kind, messages of @bytes. */
void peer_latency(wic::transport kind, uint32_t bytes, double peer_one_way)
{
	const uint32_t iterations = cfg.quick ? 200 : 2000;
	wic::peer_channel ch;
	CHECK(ch.create(kind, 0, 1, 1, bytes, 1));
	uint64_t *rt_ns = app::alloc_on<uint64_t>(1, iterations);
	uint4 *sink = app::alloc_on<uint4>(0, 256);
	{
		app::on_gpu g(1);
		CHECK(cudaMemset(rt_ns, 0, iterations * sizeof(uint64_t)));
		app::load(peer_producer);
	}
	app::sync_both();
	app::stream_pair streams;
	const bool launched = kind == wic::transport::launch;
	{
		app::on_gpu g(0);
		if (launched) {
			app::load(peer_launched_consumer);
		} else {
			app::load(peer_consumer);
			peer_consumer<<<1, 256, 0, streams[0]>>>(ch.device(), iterations, sink);
			CHECK(cudaGetLastError());
		}
	}
	{
		app::on_gpu g(1);
		peer_producer<<<1, 256, 0, streams[1]>>>(ch.device(), iterations, rt_ns);
		CHECK(cudaGetLastError());
	}
	char what[64];
	snprintf(what, sizeof(what), "peer_latency %s %u B", wic::transport_name(kind), bytes);
	if (launched) {
		/* Queued once the producer runs: a full queue blocks the host until the GPU drains it. */
		app::on_gpu g(0);
		const wic::channel dev = ch.device();
		const wic::launcher consume = [dev, sink](const wic::delivery &d, cudaStream_t s) {
			peer_launched_consumer<<<1, 256, 0, s>>>(dev, d, sink);
			return cudaGetLastError();
		};
		for (uint32_t i = 0; i < iterations; i++) {
			const bench::blocking_call_guard guard(what);
			CHECK(ch.launch_when_published(0, 1, i, consume, streams[0]));
		}
	}
	for (int d = 0; d < 2; d++)
		finish(streams[d], what);
	std::vector<uint64_t> ns(iterations);
	CHECK(cudaMemcpy(ns.data(), rt_ns, iterations * sizeof(uint64_t), cudaMemcpyDeviceToHost));
	app::free_on(1, rt_ns);
	app::free_on(0, sink);
	if (!ns.back())
		stuck(what);
	std::vector<double> rt;
	for (uint32_t i = iterations / 10; i < iterations; i++)
		rt.push_back(ns[i] / 1000.0);
	const double median = quantile(rt, 0.5), one_way = median - peer_one_way;
	printf("%-16s %-10s %8u B rt %8.2f us (p10 %.2f p90 %.2f) one_way %8.2f us\n", "peer_latency",
	       wic::transport_name(kind), bytes, median, quantile(rt, 0.1), quantile(rt, 0.9), one_way);
	record("peer_latency")
		.add("transport", wic::transport_name(kind))
		.add("bytes", (double)bytes)
		.add("rt_p10_us", quantile(rt, 0.1))
		.add("rt_p50_us", median)
		.add("rt_p90_us", quantile(rt, 0.9))
		.add("one_way_us", one_way)
		.add("one_way_over_peer", one_way / peer_one_way)
		.emit();
}

/* How streaming() publishes: one publish() per slot, the same coalesced, or publish_many(). */
enum class publishing { per_slot, coalesced, many };

/*
 * streaming() - one host thread streams @stream_total bytes in batches of @bytes through a
 * channel of @kind to one block per SM, as a newcomer would write it: per slot wait_free(),
 * then publish() (@how: per_slot; coalesced, after coalesce(wic::coalesce_bytes)), or per
 * generation wait_free() for every slot and one publish_many() (many). launch: no kernel runs
 * meanwhile; each delivery's consumer is launched by the channel after its copies, and
 * per_slot publishes alternate between two streams, so that a consumer runs beside the next
 * slot's copy (coalesced: one stream, or no run would continue; the channel's own two streams
 * overlap the runs).
 */
void streaming(wic::transport kind, publishing how, uint32_t bytes, uint64_t stream_total, double bulk_gbps)
{
	const uint32_t blocks = cfg.sms, slots = 2 * blocks;
	const uint32_t generations = (uint32_t)std::max<uint64_t>(2, stream_total / ((uint64_t)bytes * blocks));
	const uint64_t total = (uint64_t)generations * blocks * bytes;
	wic::host_channel ch;
	CHECK(ch.create(kind, slots, bytes, 1));
	if (how == publishing::coalesced)
		CHECK(ch.coalesce(wic::coalesce_bytes));
	uint8_t *staging;
	CHECK(cudaHostAlloc(&staging, (size_t)slots * bytes, cudaHostAllocDefault));
	memset(staging, 0x5a, (size_t)slots * bytes);
	mapped_word failed;
	uint4 *sink;
	CHECK(cudaMalloc(&sink, (size_t)blocks * 256 * sizeof(uint4)));
	cudaStream_t kernel_stream, copy_streams[2];
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	for (cudaStream_t &stream : copy_streams)
		CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	const cudaStream_t copy_stream = copy_streams[0];
	CHECK(cudaDeviceSynchronize());
	const bool launched = kind == wic::transport::launch;
	const wic::channel dev = ch.device();
	if (launched)
		CHECK(ch.launch_consumer([&](const wic::delivery &d, cudaStream_t stream) {
			launched_stream_consumer<<<d.slots, 256, 0, stream>>>(dev, d, blocks, failed.dev, sink);
			return cudaGetLastError();
		}));
	else
		stream_consumer<<<blocks, 256, 0, kernel_stream>>>(dev, generations, failed.dev, sink);
	CHECK(cudaGetLastError());
	const char *suffix[] = {"", "_coalesced", "_many"};
	const std::string named = std::string(wic::transport_name(kind)) + suffix[(int)how];
	const char *name = named.c_str();
	char what[64];
	snprintf(what, sizeof(what), "streaming %s %u B", name, bytes);
	double in_publish_us = 0;
	const auto start = clock_type::now();
	for (uint32_t g = 0; g < generations; g++) {
		const uint32_t first = (g % 2) * blocks;
		for (uint32_t b = 0; b < blocks; b++) {
			/* The slot's generation before (g - 2) is consumed, so its copy is done. */
			if (!ch.wait_free(first + b, timeout_ns).ok())
				stuck(what);
			const uint64_t stamp = (uint64_t)b << 32 | (g + 1);
			uint8_t *src = staging + (size_t)(first + b) * bytes;
			memcpy(src, &stamp, 8);
			memcpy(src + bytes - 8, &stamp, 8);
			if (how != publishing::many) {
				const auto t0 = clock_type::now();
				const bool two = launched && how == publishing::per_slot;
				CHECK(ch.publish(first + b, src, bytes, copy_streams[two ? b % 2 : 0]));
				in_publish_us += us_between(t0, clock_type::now());
			}
		}
		if (how == publishing::many) {
			const auto t0 = clock_type::now();
			CHECK(ch.publish_many(first, blocks, staging + (size_t)first * bytes, copy_stream));
			in_publish_us += us_between(t0, clock_type::now());
		}
	}
	CHECK(ch.flush());
	if (launched)
		for (uint32_t s = 0; s < slots; s++)
			if (!ch.wait_free(s, timeout_ns).ok())
				stuck(what);
	finish(kernel_stream, what);
	const double ms = seconds_since(start) * 1e3;
	for (cudaStream_t stream : copy_streams)
		finish(stream, what);
	bool ok = !__atomic_load_n(failed.host, __ATOMIC_ACQUIRE);
	for (uint32_t s = 0; s < slots; s++)
		ok &= ch.wait_free(s, 0).ok();
	if (!ok)
		stuck(what);
	CHECK(cudaStreamDestroy(kernel_stream));
	for (cudaStream_t stream : copy_streams)
		CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(sink));
	CHECK(cudaFreeHost(staging));
	const double gbps = total / (ms * 1e6);
	const double publishes = how == publishing::many ? generations : (double)generations * blocks;
	printf("%-16s %-16s %8u B %8.1f GB/s  %5.2fx bulk  publish %6.2f us per call (%.0f calls, %llu MiB)\n",
	       "streaming", name, bytes, gbps, bulk_gbps / gbps, in_publish_us / publishes, publishes,
	       (unsigned long long)(total >> 20));
	record("streaming")
		.add("transport", name)
		.add("bytes", (double)bytes)
		.add("total_bytes", (double)total)
		.add("ms", ms)
		.add("gbps", gbps)
		.add("time_over_bulk", bulk_gbps / gbps)
		.add("publish_us_per_call", in_publish_us / publishes)
		.add("calls", publishes)
		.emit();
}

/*
 * ce_order_probe() - may a host producer's copy carry one flag per 128 bytes (NCCL's LL128)?
 * That needs every 128-byte line a cudaMemcpyAsync() writes into device memory to appear at
 * once, or at least its flag word last. A pinned buffer of @bytes, every word g, is copied
 * into device memory for g = 1, 2, ... while a kernel watches each 128-byte line (watch_lines())
 * with the flag in its last word (odd g) or its first (even g), and counts the lines in which
 * a reader that saw the flag saw older words beside it.
 */
void ce_order_probe(uint32_t bytes)
{
	const uint32_t generations = cfg.quick ? 200 : 2000, threads = 256;
	const uint32_t n_lines = bytes / 128, blocks = (n_lines + threads - 1) / threads;
	uint64_t *src, *dst;
	unsigned long long *counts;
	CHECK(cudaHostAlloc(&src, bytes, cudaHostAllocDefault));
	CHECK(cudaMalloc(&dst, bytes));
	CHECK(cudaMemset(dst, 0, bytes));
	CHECK(cudaMalloc(&counts, 4 * sizeof(unsigned long long)));
	CHECK(cudaMemset(counts, 0, 4 * sizeof(unsigned long long)));
	mapped_word ack, failed;
	cudaStream_t kernel_stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
	watch_lines<<<blocks, threads, 0, kernel_stream>>>(dst, n_lines, generations, counts, ack.dev, failed.dev);
	CHECK(cudaGetLastError());
	char what[64];
	snprintf(what, sizeof(what), "ce_order_probe %u B", bytes);
	for (uint32_t g = 1; g <= generations; g++) {
		std::fill(src, src + bytes / 8, (uint64_t)g);
		CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream));
		if (!host_wait(ack.host, g * blocks) || __atomic_load_n(failed.host, __ATOMIC_ACQUIRE))
			stuck(what);
		/* The copy is done with src before it is filled again. */
		finish(copy_stream, what);
	}
	finish(kernel_stream, what);
	unsigned long long got[4];
	CHECK(cudaMemcpy(got, counts, sizeof(got), cudaMemcpyDeviceToHost));
	CHECK(cudaStreamDestroy(kernel_stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(counts));
	CHECK(cudaFree(dst));
	CHECK(cudaFreeHost(src));
	const double lines = (double)n_lines * (generations / 2);
	printf("%-16s %-10s %8u B flag last: %llu of %.0f lines watched arriving, %llu torn; flag first: %llu "
	       "watched, %llu torn\n",
	       "ce_order_probe", "copy", bytes, got[0], lines, got[1], got[2], got[3]);
	record("ce_order_probe")
		.add("bytes", (double)bytes)
		.add("generations", (double)generations)
		.add("lines_per_flag_position", lines)
		.add("watched_flag_last", (double)got[0])
		.add("torn_flag_last", (double)got[1])
		.add("watched_flag_first", (double)got[2])
		.add("torn_flag_first", (double)got[3])
		.emit();
}

/*
 * peer_streaming() - a producer kernel on GPU 1 streams @stream_total bytes in batches of
 * @bytes through a peer_channel of @kind to one consumer block per SM on GPU 0 (two slots per
 * block), against the peer copy's bandwidth.
 */
void peer_streaming(wic::transport kind, uint32_t bytes, uint64_t stream_total, double copy_gbps)
{
	const uint32_t blocks = app::common_sms();
	const uint32_t generations = (uint32_t)std::max<uint64_t>(2, stream_total / ((uint64_t)bytes * blocks));
	const uint64_t total = (uint64_t)generations * blocks * bytes;
	wic::peer_channel ch;
	CHECK(ch.create(kind, 0, 1, 2 * blocks, bytes, 1));
	uint4 *sink = app::alloc_on<uint4>(0, (size_t)blocks * 256);
	mapped_word failed;
	const bool launched = kind == wic::transport::launch;
	{
		app::on_gpu g(1);
		app::load(peer_stream_producer);
	}
	if (launched)
		app::load(launched_stream_consumer);
	else
		app::load(stream_consumer);
	app::sync_both();
	app::stream_pair streams;
	char what[64];
	snprintf(what, sizeof(what), "peer_streaming %s %u B", wic::transport_name(kind), bytes);
	const auto start = clock_type::now();
	if (!launched) {
		app::on_gpu g(0);
		stream_consumer<<<blocks, 256, 0, streams[0]>>>(ch.device(), generations, failed.dev, sink);
		CHECK(cudaGetLastError());
	}
	{
		app::on_gpu g(1);
		peer_stream_producer<<<blocks, 256, 0, streams[1]>>>(ch.device(), generations);
		CHECK(cudaGetLastError());
	}
	if (launched) {
		/* Generation g: slot (g % 2) * blocks + b of every block b, each at its generation g / 2. */
		app::on_gpu g(0);
		const wic::channel dev = ch.device();
		unsigned int *failed_dev = failed.dev;
		const wic::launcher consume = [dev, blocks, failed_dev, sink](const wic::delivery &d, cudaStream_t s) {
			launched_stream_consumer<<<d.slots, 256, 0, s>>>(dev, d, blocks, failed_dev, sink);
			return cudaGetLastError();
		};
		for (uint32_t gen = 0; gen < generations; gen++) {
			const bench::blocking_call_guard guard(what);
			CHECK(ch.launch_when_published((gen % 2) * blocks, blocks, gen / 2, consume, streams[0]));
		}
	}
	for (int d = 0; d < 2; d++)
		finish(streams[d], what);
	const double ms = seconds_since(start) * 1e3;
	app::free_on(0, sink);
	if (__atomic_load_n(failed.host, __ATOMIC_ACQUIRE))
		stuck(what);
	const double gbps = total / (ms * 1e6);
	printf("%-16s %-10s %8u B %8.1f GB/s  %5.2fx the peer copy  (%llu MiB)\n", "peer_streaming",
	       wic::transport_name(kind), bytes, gbps, copy_gbps / gbps, (unsigned long long)(total >> 20));
	record("peer_streaming")
		.add("transport", wic::transport_name(kind))
		.add("bytes", (double)bytes)
		.add("total_bytes", (double)total)
		.add("ms", ms)
		.add("gbps", gbps)
		.add("time_over_peer_copy", copy_gbps / gbps)
		.emit();
}

/* The cost of waiting: the work beside @how's waiters against the same work beside none. */
class waiting_cost {
public:
	waiting_cost()
	{
		CHECK(cudaFuncSetAttribute(coresident, cudaFuncAttributeMaxDynamicSharedMemorySize,
					   one_block_per_sm_smem));
		CHECK(cudaMalloc(&src_, region_ * cfg.sms));
		CHECK(cudaMemset(src_, 0, region_ * cfg.sms));
		pages_bytes_ = (size_t)cfg.sms * waiting_warps * pages_per_warp_ * 4096;
		CHECK(cudaMallocManaged(&pages_, pages_bytes_));
		CHECK(cudaMalloc(&work_ns_, cfg.sms * sizeof(uint64_t)));
		CHECK(cudaMalloc(&touched_, cfg.sms * waiting_warps * sizeof(uint32_t)));
		CHECK(cudaMalloc(&sink_, 2 * sizeof(float)));
	}
	waiting_cost(const waiting_cost &) = delete;
	waiting_cost &operator=(const waiting_cost &) = delete;
	~waiting_cost()
	{
		CHECK(cudaFree(src_));
		CHECK(cudaFree(pages_));
		CHECK(cudaFree(work_ns_));
		CHECK(cudaFree(touched_));
		CHECK(cudaFree(sink_));
	}

	/*
	 * measure() - @work beside waiters of @label (@how; a channel of @kind whose waiters sleep
	 * at most @backoff_ns, -1: its default), against the same work alone, median of 3 each.
	 */
	void measure(work_kind work, const char *label, wait_kind how, wic::transport kind = wic::transport::push,
		     int64_t backoff_ns = -1)
	{
		std::vector<double> alone, beside, pages;
		for (int rep = 0; rep < 3; rep++) {
			alone.push_back(run(work, wait_kind::none, kind, backoff_ns, nullptr));
			beside.push_back(run(work, how, kind, backoff_ns, &pages));
		}
		const double ratio = quantile(beside, 0.5) / quantile(alone, 0.5);
		const char *what = work == work_kind::arith ? "arith" : "memory";
		printf("%-16s %-10s %-8s work %8.1f us alone, %8.1f us beside %u waiting warps per SM: %.3fx",
		       "waiting_cost", label, what, quantile(alone, 0.5), quantile(beside, 0.5), waiting_warps, ratio);
		if (how == wait_kind::fault)
			printf(" (pages touched per waiting warp: median %.0f of %u)", quantile(pages, 0.5),
			       pages_per_warp_);
		printf("\n");
		record r("waiting_cost");
		r.add("waiters", label)
			.add("work", what)
			.add("work_warps_per_sm", (double)work_warps)
			.add("waiting_warps_per_sm", (double)waiting_warps)
			.add("alone_us", quantile(alone, 0.5))
			.add("beside_us", quantile(beside, 0.5))
			.add("slowdown", ratio);
		if (how == wait_kind::fault)
			r.add("pages_touched_median", quantile(pages, 0.5))
				.add("pages_per_warp", (double)pages_per_warp_);
		r.emit();
	}

private:
	/* One run; the median block's work time in us. @pages gets each fault waiter's pages. */
	double run(work_kind work, wait_kind how, wic::transport kind, int64_t backoff_ns, std::vector<double> *pages)
	{
		wic::host_channel ch;
		CHECK(ch.create(kind, cfg.sms, 64, 1));
		wic::channel dev = ch.device();
		if (backoff_ns >= 0)
			dev.backoff_ns = (uint32_t)backoff_ns;
		if (how == wait_kind::fault)
			memset(pages_, 1, pages_bytes_); /* resident in host memory: every touch faults */
		CHECK(cudaMemset(touched_, 0, cfg.sms * waiting_warps * sizeof(uint32_t)));
		mapped_word done;
		cudaStream_t stream, copy_stream;
		CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
		CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
		CHECK(cudaDeviceSynchronize());
		const uint32_t rounds = work == work_kind::arith ? 40000 : 16;
		coresident<<<cfg.sms, (work_warps + waiting_warps) * 32, one_block_per_sm_smem, stream>>>(
			dev, how, work, rounds, src_, region_, pages_, pages_per_warp_, done.dev, work_ns_, touched_,
			sink_);
		CHECK(cudaGetLastError());
		if (!host_wait(done.host, cfg.sms))
			stuck("waiting_cost");
		if (how == wait_kind::channel)
			for (uint32_t b = 0; b < cfg.sms; b++)
				CHECK(ch.publish(b, &dev, 16, copy_stream));
		finish(stream, "waiting_cost");
		finish(copy_stream, "waiting_cost");
		CHECK(cudaStreamDestroy(stream));
		CHECK(cudaStreamDestroy(copy_stream));
		std::vector<uint64_t> ns(cfg.sms);
		CHECK(cudaMemcpy(ns.data(), work_ns_, cfg.sms * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		std::vector<uint32_t> t(cfg.sms * waiting_warps);
		CHECK(cudaMemcpy(t.data(), touched_, t.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
		for (uint32_t v : t) {
			if (v == ~0u)
				stuck("waiting_cost");
			if (pages)
				pages->push_back(v);
		}
		std::vector<double> us;
		for (uint64_t v : ns)
			us.push_back(v / 1000.0);
		return quantile(us, 0.5);
	}

	const uint64_t region_ = 2ull << 20; /* per block: 264 MiB on 132 SMs, beyond any L2 */
	const uint32_t pages_per_warp_ = 256;
	float4 *src_ = nullptr;
	uint8_t *pages_ = nullptr;
	size_t pages_bytes_ = 0;
	uint64_t *work_ns_ = nullptr;
	uint32_t *touched_ = nullptr;
	float *sink_ = nullptr;
};

void describe_device()
{
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	int driver = 0, runtime = 0, gpus = 0;
	CHECK(cudaDriverGetVersion(&driver));
	CHECK(cudaRuntimeGetVersion(&runtime));
	CHECK(cudaGetDeviceCount(&gpus));
	char date[32];
	const time_t now = time(nullptr);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	printf("transport: %s (%d SMs), %d GPU(s), CUDA driver API %d, runtime %d, %s%s\n", prop.name,
	       prop.multiProcessorCount, gpus, driver, runtime, date, cfg.quick ? ", quick" : "");
	record("device")
		.add("name", prop.name)
		.add("sms", (double)prop.multiProcessorCount)
		.add("gpus", (double)gpus)
		.add("cuda_driver_api", (double)driver)
		.add("cuda_runtime", (double)runtime)
		.add("date", date)
		.add("quick", cfg.quick)
		.emit();
}

/*
 * Producer kernels on GPU 1, consumers on GPU 0: peer_fence, then peer_latency and
 * peer_streaming for every transport a peer_channel has, against peer_one_way and peer_copy.
 * Says so and records it where there are not two GPUs with peer access.
 */
void peer_measurements()
{
	int gpus = 0;
	CHECK(cudaGetDeviceCount(&gpus));
	const cudaError_t peer = gpus >= 2 ? wic::enable_peer_access(0, 1) : cudaErrorInvalidDevice;
	if (peer != cudaSuccess) {
		printf("peer measurements skipped: %d GPU(s)%s%s\n", gpus, gpus >= 2 ? ", " : "",
		       gpus >= 2 ? cudaGetErrorString(peer) : "");
		record("peer_skipped").add("gpus", (double)gpus).emit();
		return;
	}
	const wic::transport kinds[] = {wic::transport::push, wic::transport::tagged, wic::transport::poll,
					wic::transport::alg1, wic::transport::launch};
	const double peer_ref = peer_one_way_us();
	for (uint32_t bytes : {64u, 4096u})
		peer_fence(bytes);
	for (wic::transport kind : kinds)
		for (uint32_t bytes = 64; bytes <= (1u << 20); bytes *= 4)
			peer_latency(kind, bytes, peer_ref);
	const double peer_copy = peer_copy_gbps(cfg.stream_total);
	/* 16 KiB: G_BS's, G_C2D's and G_GEM's messages. alg1 streams an eighth as much (slow). */
	for (uint32_t bytes : {4096u, 16384u, 65536u, 1u << 20})
		for (wic::transport kind : kinds)
			peer_streaming(kind, bytes, kind == wic::transport::alg1 ? cfg.stream_total / 8 : cfg.stream_total,
				       peer_copy);
}

} /* namespace */

int main(int argc, char **argv)
{
	const char *out = nullptr;
	bool spin_only = false, streaming_only = false, launch_only = false, peer_only = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			cfg.quick = true;
		else if (!strcmp(argv[i], "--spin"))
			spin_only = true;
		else if (!strcmp(argv[i], "--streaming"))
			streaming_only = true;
		else if (!strcmp(argv[i], "--launch"))
			launch_only = true;
		else if (!strcmp(argv[i], "--peer"))
			peer_only = true;
		else if (argv[i][0] == '-' || out) {
			fprintf(stderr, "usage: %s [--quick] [--spin | --streaming | --launch | --peer] [OUT.jsonl]\n",
				argv[0]);
			return 2;
		} else
			out = argv[i];
	}
	if (out && !(bench::json = fopen(out, "w"))) {
		perror(out);
		return 2;
	}
	if (cfg.quick) {
		cfg.stream_total = 64ull << 20;
		cfg.latency_iterations = 300;
		cfg.point_budget_s = 0.1;
	}
	cfg.sms = app::sm_count();
	describe_device();
	if (peer_only) {
		peer_measurements();
		if (bench::json)
			fclose(bench::json);
		return 0;
	}

	/* The poll applications' spinning: none, one warp, a block's 16, one and 4 and 16 per SM. */
	const uint32_t spin_shapes[][2] = {{0, 0}, {1, 1}, {1, 16}, {cfg.sms, 1}, {cfg.sms, 4}, {cfg.sms, 16}};
	/* What poll's waiters do to the rest of PCIe. */
	auto spinning = [&] {
		for (const auto &shape : spin_shapes)
			spin_pace(shape[0], shape[1], 2000, 100000);
		for (uint64_t bytes : {1ull << 20, 8ull << 20})
			for (const auto &shape : spin_shapes)
				spin_copy(shape[0], shape[1], bytes);
	};
	if (spin_only) {
		/* Those alone, and poll's latency beside the spinners. */
		spinning();
		const double mapped = mapped_one_way_us();
		for (const auto &shape : spin_shapes)
			if (shape[0])
				latency(wic::transport::poll, 64, shape[0], shape[1], false, mapped);
		if (bench::json)
			fclose(bench::json);
		return 0;
	}

	const double bulk = bulk_copy_gbps(cfg.stream_total);
	/* poll and alg1 stream an eighth as much: at tens to thousands of times the bulk copy's time. */
	auto streams = [&] {
		for (uint32_t bytes : {4096u, 65536u, 1u << 20}) {
			streaming(wic::transport::push, publishing::per_slot, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::push, publishing::coalesced, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::push, publishing::many, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::poll, publishing::per_slot, bytes, cfg.stream_total / 8, bulk);
			streaming(wic::transport::alg1, publishing::per_slot, bytes, cfg.stream_total / 8, bulk);
			streaming(wic::transport::mapped, publishing::per_slot, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::tagged, publishing::per_slot, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::tagged, publishing::coalesced, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::tagged, publishing::many, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::launch, publishing::per_slot, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::launch, publishing::coalesced, bytes, cfg.stream_total, bulk);
			streaming(wic::transport::launch, publishing::many, bytes, cfg.stream_total, bulk);
		}
	};
	if (launch_only) {
		/* launch beside push, the transport it builds on: latency, then streaming. */
		const double mapped = mapped_one_way_us();
		for (wic::transport kind : {wic::transport::push, wic::transport::launch})
			for (uint32_t bytes = 64; bytes <= (1u << 20); bytes *= 4)
				for (uint32_t warps : {1u, 16u})
					latency(kind, bytes, 1, warps, true, mapped);
		for (uint32_t bytes : {4096u, 65536u, 1u << 20})
			for (wic::transport kind : {wic::transport::push, wic::transport::launch})
				for (publishing how : {publishing::per_slot, publishing::coalesced, publishing::many})
					streaming(kind, how, bytes, cfg.stream_total, bulk);
		if (bench::json)
			fclose(bench::json);
		return 0;
	}
	if (streaming_only) {
		for (uint32_t size : {65536u, 1u << 20, 4u << 20})
			for (uint32_t k : {1u, 2u, 4u})
				for (bool words : {false, true})
					copy_pipeline(size == 65536u ? 32ull << 20 : 256ull << 20, size, k, words);
		streams();
		if (bench::json)
			fclose(bench::json);
		return 0;
	}
	const double mapped = mapped_one_way_us();
	/* cuStreamBatchMemOp() takes at most 255 operations a call. */
	ready_words({1, 8, 32, std::min(cfg.sms, 255u), 255}, std::min(cfg.sms, 255u), 64 << 10);

	const wic::transport host_kinds[] = {wic::transport::push, wic::transport::poll, wic::transport::alg1,
					     wic::transport::mapped, wic::transport::tagged};
	/* One warp waiting: against the message size (launch: one warp launched per message). */
	for (wic::transport kind : host_kinds)
		for (uint32_t bytes = 64; bytes <= (1u << 20); bytes *= 4)
			latency(kind, bytes, 1, 1, kind == wic::transport::alg1, mapped);
	for (uint32_t bytes = 64; bytes <= (1u << 20); bytes *= 4)
		latency(wic::transport::launch, bytes, 1, 1, true, mapped);
	/* 64-byte messages: against the warps waiting at once. */
	const uint32_t shapes[][2] = {{1, 16}, {cfg.sms, 1}, {cfg.sms, 16}};
	for (wic::transport kind : host_kinds)
		for (const auto &shape : shapes)
			for (bool block : {false, true})
				if (block || kind != wic::transport::alg1)
					latency(kind, 64, shape[0], shape[1], block, mapped);

	/* Where tagged stops beating push (64 B to 1 KiB above): more sizes, one and 2112 warps waiting. */
	for (wic::transport kind : {wic::transport::push, wic::transport::tagged}) {
		for (uint32_t bytes : {128u, 512u, 2048u})
			latency(kind, bytes, 1, 1, false, mapped);
		for (uint32_t bytes : {256u, 1024u, 2048u, 4096u})
			latency(kind, bytes, cfg.sms, 16, false, mapped);
	}

	/* push's backoff: what a shorter longest sleep gains in latency (its cost: waiting_cost). */
	const uint32_t backoff_shapes[][2] = {{1, 1}, {cfg.sms, 16}};
	for (int64_t backoff : {0, 512, 1024, 2048})
		for (const auto &shape : backoff_shapes)
			latency(wic::transport::push, 64, shape[0], shape[1], false, mapped, backoff);

	streams();

	/* Whether the copy engine's writes could carry a flag per 128 bytes (NCCL's LL128). */
	for (uint32_t bytes : {4096u, 65536u, 1u << 20})
		ce_order_probe(bytes);

	spinning();

	{
		waiting_cost cost;
		for (work_kind work : {work_kind::arith, work_kind::memory}) {
			cost.measure(work, "push", wait_kind::channel, wic::transport::push);
			cost.measure(work, "push_bo2048", wait_kind::channel, wic::transport::push, 2048);
			cost.measure(work, "push_spin", wait_kind::channel, wic::transport::push, 0);
			cost.measure(work, "poll", wait_kind::channel, wic::transport::poll);
			cost.measure(work, "alg1", wait_kind::channel, wic::transport::alg1);
			cost.measure(work, "mapped", wait_kind::channel, wic::transport::mapped);
			cost.measure(work, "tagged", wait_kind::channel, wic::transport::tagged);
			cost.measure(work, "fault", wait_kind::fault);
		}
	}

	peer_measurements();
	if (bench::json)
		fclose(bench::json);
	return 0;
}
