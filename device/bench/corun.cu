/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * corun - what consumers waiting for a host producer cost a kernel that shares the GPU with
 * them, per transport: the answer a user needs who runs a producer-consumer pipeline beside
 * other work on one GPU.
 *
 * Every SM holds one block of the consumers and one of the neighbour.
 *
 * The consumers: one block per SM of 4 warps, as the applications have them. Warp w of block b
 * waits for its 256-byte message of generation g in slot b (alg1: thread 0 waits for the block,
 * as the paper's Algorithm 1 does; the others: each warp for its own message, with the run-time
 * wic::recv(), as C_SRS does), then uses it: each lane loads one 8-byte word, the first and the
 * last checked against the generation's stamp. After the block's barrier thread 0
 * acknowledges g in pinned host memory.
 *
 * The neighbour: a kernel on a stream of its own, one block per SM (its 120 KiB of shared
 * memory leave no room for a second), 8 warps doing a fixed amount of one kind of work, sized
 * to take about 50 ms alone:
 *   fma_chain   one dependent FMA chain per thread (low ILP: leaves issue slots free)
 *   fma_ilp     eight independent FMA chains per thread (high ILP: issue-bound)
 *   l2_loads    16-byte ld.global.cg loads over the block's 256 KiB, again and again (L2 hits)
 *   dram_loads  16-byte streaming loads through the block's 8 MiB (1 GiB in all, far past L2)
 *   consumer    a second consumer, kept simple: C_SRS's work (each warp the energy and peak of
 *               messages of 1024 floats) on data already in device memory, streaming through
 *               the same 1 GiB; a reduction over device memory, no second pipeline
 * The first four are stall_cost.cu's loops (work.cuh), 8 warps as there, so that fma_chain
 * leaves issue slots free that fma_ilp takes. Every kernel that shares an SM asks for its largest
 * shared memory carveout, so that an SM has room for the neighbour's block whichever of the
 * two kernels arrived on it first.
 *
 * The host thread publishes a generation (one 1 KiB batch for every block), spins until every
 * block acknowledged it, waits the gap (0, 10, 100 or 1000 us), publishes the next, and so on
 * until the neighbour has ended; then the message that stops the consumers. Rows, for each
 * kind of neighbour and each gap:
 *   push, poll, alg1, mapped, tagged   a wic::host_channel of that transport, one slot per
 *               block, a generation published by one publish_many() (reuse::caller: the
 *               acknowledgements are the flow control)
 *   launch      a wic::host_channel of transport::launch, one slot per block: nothing resident
 *               while waiting; the channel launches the consumers of a generation (one block
 *               per slot) on the copy stream after its publish_many()'s copies
 *   launch_raw  the same by hand, as a reference: per generation a cudaMemcpyAsync of the
 *               batches into device memory, then a launch of the consumer kernel on the same
 *               stream, which uses them and acknowledges as above
 * and, once for each kind of neighbour:
 *   none        no consumers: the neighbour against its own runs alone (the A/A run: how far
 *               two runs of the same thing differ)
 *   fault       a reference: lane 0 of every consumer warp reads never-touched pages of
 *               managed memory allocated afresh for the run (its own, every other page of the
 *               range, under nvidia-uvm's prefetch threshold) one after another: each read is a
 *               replayable fault that stalls the warp until nvidia-uvm populated the page, as
 *               stall_cost.cu's "fresh" stalled warps are, so the warps are stalled nearly all
 *               the time, as the fault transport's waiters are while their faults are held.
 *               What that costs the neighbour. They stop when the neighbour has ended, after 2 s
 *               (a memory-bound neighbour beside them may barely move: stall_cost.cu) or out of
 *               pages: besides throughput, progress_while_held, the neighbour's speed while
 *               they ran against alone, assuming alone's speed after; stalled_share, the share
 *               of their time that they were stalled (reads over 10 us).
 * A further transport is a class with start(), publish() and stop() (consumers, below) and a
 * line in the table of transports.
 *
 * --peer: the producer is a kernel on GPU 1 (peer_publish(), a block per slot), the consumers
 * and the neighbour stay on GPU 0. Rows none, push, poll, alg1, tagged (a wic::peer_channel;
 * wait_and_use() also reports each generation consumed, the producer's flow control) and
 * launch (the host queues, 16 generations ahead of the slowest block, each generation's stream
 * waits for its ready words and use_delivery()'s launch; the producer publishes only the
 * generations queued). Each producer block publishes generation g once g - 1 was reported
 * consumed and the gap passed: the blocks go at their own pace, not a generation at a time. For
 * the stop, resident consumers get a stop message; launched ones are queued for exactly the
 * generations published.
 *
 * What each row reports (--peer: throughput, shared, and in place of one way and publish the
 * round trip, from before a producer block's publish to its sight of the consumed report
 * (recorded for a block's first 1024 generations; median and p90), and for launch the host's
 * time queueing a generation, which includes waiting for room in the stream):
 *   throughput  the neighbour's work per second beside the consumers over alone: its time
 *               alone over its time beside them, for the same fixed work (a kernel's time: its
 *               first warp's start to its last warp's end, %globaltimer); median of 3 runs (one,
 *               once a run took over 0.5 s). Alone: the median of 3 runs before the kind's rows
 *               and 3 after, each set's median reported too (their ratio: the drift).
 *   one way     host -> consumer latency as transport.cu measures it: from the start of the
 *               publish call to the host's first sight of a block's acknowledgement
 *               (steady_clock), less mapped_one_way (half the round trip of a host <-> GPU
 *               ping-pong through pinned mapped words, measured at the start with nothing
 *               beside it): the acknowledgement's own trip. first: the first block's; all: the
 *               last block's, when every block has used its message. Median and p90 over the
 *               generations of the row's runs.
 *   publish     the host's time in the publish call (publish_many(); launch_raw: the copy and
 *               the launch), steady_clock; median and p90.
 *   shared      every SM ran one block of the neighbour and, for each launch of the consumers,
 *               one of theirs (%smid); a row where not is flagged.
 *
 * Usage: corun [--quick] [--peer] [OUT.jsonl]   (--quick: fma_ilp and dram_loads, gaps 0 and
 *        1000 us, one run each, alone 2 + 2; --peer: exit status 77 without two GPUs with peer
 *        access)
 * Prints one line per row, a neighbour kind's once all its rows ran (progress, a line a run, on
 * stderr); writes one JSON object per row to OUT.jsonl, the first naming the GPU, its driver,
 * the date and the producer. Every wait gives up after 2 s (a neighbour's run after 20 s)
 * and stops the program with exit status 1. Managed memory: the fault row's 2.1 GiB of address
 * space (132 SMs; half of it populated, then freed, at each of its runs) and alg1's channel
 * (1 KiB per SM). Reads the GPU's state; changes none of its settings.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <wic/wic.cuh>

#include "../apps/check.cuh"
#include "../apps/description.h"
#include "../apps/srs.cuh"
#include "host.cuh"
#include "report.cuh"
#include "work.cuh"

namespace {

using bench::clock_type;
using bench::finish;
using bench::host_wait;
using bench::quantile;
using bench::record;
using bench::seconds_since;
using bench::stuck;
using bench::timeout_ns;
using bench::timeout_s;
using bench::us_between;
/* A neighbour's run is fixed work, which the consumers beside it may slow many times over. */
constexpr double neighbour_limit_s = 20.0;
constexpr double neighbour_target_ms = 50.0;
/* A row stops repeating once a run took this long. */
constexpr double long_run_ms = 500.0;
constexpr uint32_t consumer_warps = 4;
constexpr uint32_t consumer_threads = consumer_warps * 32;
/* One 8-byte word per lane. */
constexpr uint32_t message_bytes = 32 * 8;
constexpr uint32_t batch_bytes = consumer_warps * message_bytes;
/* A producer kernel's block writes its batch a word per thread. */
static_assert(batch_bytes / 8 == consumer_threads, "one 8-byte word of a batch per thread");
/* The peer rows' producer records the round trips of a block's first generations, this many. */
constexpr uint32_t recorded_generations = 1024;
/* The neighbour's dynamic shared memory: more than half an SM's, so one block per SM. */
constexpr uint32_t neighbour_smem = 120 * 1024;
/* Block counts per %smid, which may number SMs beyond the SM count. */
constexpr uint32_t max_smid = 1024;
constexpr uint64_t page_bytes = 4096;
/*
 * The fault row's pages per warp: never touched, each read of one a fault that populates it
 * (some 100 to 250 us each beside a neighbour), enough for a neighbour's run several times
 * longer than alone. Every other page of the range is read: 528 warps (132 SMs) take 2.1 GiB
 * of managed address space and populate half of it.
 */
constexpr uint32_t fault_pages_per_warp = 512;
/* A page read that took this long was a fault. */
constexpr uint64_t fault_stall_ns = 10000;
/* The fault row's warps stop by themselves after this long: beside them a memory-bound neighbour may barely move. */
constexpr uint64_t fault_hold_ns = 2000000000;

const double every_gap_us[] = {0, 10, 100, 1000};

/* ---- device side ---- */

__device__ inline uint32_t sm_id()
{
	uint32_t id;

	asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
	return id;
}

/* The first and last 8 bytes of block b's messages of generation g; 0 in both: stop. */
__host__ __device__ inline uint64_t stamp(uint32_t b, uint32_t g)
{
	return (uint64_t)(b + 1) << 32 | (g + 1);
}

/* What a warp made of its message. */
enum message_use : int { use_ok, use_stop, use_wrong };

/*
 * Where the consumers report: acks[b] (pinned host memory, mapped), the last generation + 1
 * block b used, ~0 after a failed wait or a wrong message; on_sm[s], the consumer blocks that
 * ran on the SM of %smid s.
 */
struct consumer_record {
	unsigned int *acks;
	unsigned int *on_sm;
	uint32_t *sink;
};

/*
 * Where the neighbour reports: span[0] and span[1], its warps' earliest start and latest end
 * (%globaltimer); on_sm[s], its blocks on the SM of %smid s; *done (pinned host memory, mapped)
 * set by the last block to end, counted in *finished.
 */
struct neighbour_record {
	unsigned long long *span;
	unsigned int *on_sm;
	unsigned int *finished;
	unsigned int *done;
	uint32_t *sink;
};

/*
 * Where the peer rows' producer kernel reports, in its GPU's memory: block b's round trip
 * (ns) of generation g < recorded_generations at round_trip_ns[b * recorded_generations + g],
 * and the generations of data it published, ~0 after a wait that gave up.
 */
struct producer_record {
	uint64_t *round_trip_ns;
	unsigned int *published;
};

/* The fault row's warps, each: time stalled, time from its start to the stop, faults. */
struct fault_record {
	uint64_t *stalled_ns;
	uint64_t *active_ns;
	uint32_t *faults;
};

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
 * C_SRS's consumer work on data in device memory: warp w of block b takes every work_warps-th
 * message of C_SRS_SAMPLES floats of the block's dram_bytes and computes its energy and peak
 * as c_srs.cu's consume() does; @rounds passes.
 */
__device__ inline uint32_t srs_work(uint32_t rounds, const float *data, uint32_t t, uint32_t b)
{
	constexpr uint32_t messages = bench::dram_bytes / (C_SRS_SAMPLES * sizeof(float));
	const float *mine = data + b * (bench::dram_bytes / sizeof(float));
	const uint32_t w = t / 32;
	float energy_sum = 0.0f, peak_max = 0.0f;

	for (uint32_t r = 0; r < rounds; r++)
		for (uint32_t m = w; m < messages; m += bench::work_warps) {
			const float2 e = app::energy_and_peak(mine + (uint64_t)m * C_SRS_SAMPLES, C_SRS_SAMPLES);
			energy_sum += e.x;
			peak_max = fmaxf(peak_max, e.y);
		}
	return __float_as_uint(energy_sum) ^ __float_as_uint(peak_max);
}

/*
 * neighbour() - one block per SM, work_threads threads doing @rounds rounds of @kind
 * (work.cuh), or with @srs C_SRS's work (srs_work()); its span and placement into @rec.
 */
__global__ void __launch_bounds__(bench::work_threads)
	neighbour(bench::work kind, bool srs, uint32_t rounds, const uint4 *data, uint64_t data_bytes,
		  neighbour_record rec)
{
	extern __shared__ uint4 smem[];
	const uint32_t t = threadIdx.x, b = blockIdx.x;

	if (t == 0)
		atomicAdd(&rec.on_sm[sm_id()], 1u);
	const uint64_t start = wic::detail::globaltimer();
	const uint32_t result = srs ? srs_work(rounds, reinterpret_cast<const float *>(data), t, b)
				    : bench::do_work(kind, rounds, data, data_bytes, t, b, smem, 0.999f, 0.5f);
	const uint64_t end = wic::detail::globaltimer();
	if (t % 32 == 0) {
		atomicMin(&rec.span[0], (unsigned long long)start);
		atomicMax(&rec.span[1], (unsigned long long)end);
	}
	if (result == 42) /* never: keeps the work */
		rec.sink[0] = result;
	__syncthreads();
	if (t == 0 && atomicAdd(rec.finished, 1u) == gridDim.x - 1)
		wic::detail::store_release(rec.done, 1);
}

/*
 * The warp's first use of its message at @m: each lane loads one 8-byte word (into @acc); the
 * message is right when its first and last words carry @want, the stop message when both are 0.
 */
__device__ inline int use_message(const uint8_t *m, uint64_t want, uint64_t *acc)
{
	const uint64_t v = reinterpret_cast<const uint64_t *>(m)[threadIdx.x % 32];
	const uint64_t first = __shfl_sync(0xffffffff, v, 0), last = __shfl_sync(0xffffffff, v, 31);

	*acc ^= v;
	if (first == 0 && last == 0)
		return use_stop;
	return first == want && last == want ? use_ok : use_wrong;
}

/*
 * Once every warp of block @b is done with generation @g (@used: this warp's outcome), thread 0
 * acknowledges it, or a failure (~0); with @consumed_to (a producer kernel's channel, whose flow
 * control it is) it first reports a message it used consumed(). Called by every thread;
 * whether the block goes on.
 */
__device__ inline bool acknowledge(int used, const consumer_record &rec, uint32_t b, uint32_t g,
				   const wic::channel *consumed_to = nullptr)
{
	const bool failed = __syncthreads_or(used == use_wrong);
	const bool stopped = __syncthreads_or(used == use_stop);

	if (threadIdx.x == 0 && consumed_to && !failed && !stopped)
		wic::consumed(*consumed_to, b, g);
	if (threadIdx.x == 0 && (failed || !stopped))
		wic::detail::store_release(&rec.acks[b], failed ? ~0u : g + 1);
	return !failed && !stopped;
}

/*
 * wait_and_use() - a channel's consumers: block b's warps wait for generation 0, 1, ... of
 * slot b (alg1: thread 0 for the block, recv_block(); the others: each warp for its own
 * message, recv()), use it and acknowledge it (@report_consumed: reporting it consumed too),
 * until the stop message.
 */
__global__ void __launch_bounds__(consumer_threads)
	wait_and_use(wic::channel ch, consumer_record rec, bool report_consumed)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32;
	uint64_t acc = 0;

	if (threadIdx.x == 0)
		atomicAdd(&rec.on_sm[sm_id()], 1u);
	for (uint32_t g = 0;; g++) {
		const uint8_t *m = nullptr;
		int rc;
		if (ch.kind == wic::transport::alg1) {
			rc = wic::recv_block(ch, b, g, &m, timeout_ns);
			if (rc == WIC_OK)
				m += (uint64_t)w * ch.message_bytes;
		} else {
			rc = wic::recv(ch, b, g, w, &m, timeout_ns);
		}
		if (!acknowledge(rc == WIC_OK ? use_message(m, stamp(b, g), &acc) : use_wrong, rec, b, g,
				 report_consumed ? &ch : nullptr))
			break;
	}
	if (acc == 42) /* never: keeps the loads */
		rec.sink[1] = 1;
}

/*
 * use_batch() - launch_raw's consumers, launched after generation @g's copy into @batches
 * (device memory) on the same stream: block b's warps use their messages and acknowledge @g.
 */
__global__ void __launch_bounds__(consumer_threads) use_batch(const uint8_t *batches, uint32_t g, consumer_record rec)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32;
	uint64_t acc = 0;

	if (threadIdx.x == 0)
		atomicAdd(&rec.on_sm[sm_id()], 1u);
	const uint8_t *m = batches + (uint64_t)b * batch_bytes + (uint64_t)w * message_bytes;
	acknowledge(use_message(m, stamp(b, g), &acc), rec, b, g);
	if (acc == 42) /* never: keeps the loads */
		rec.sink[2] = 1;
}

/*
 * use_delivery() - the launch transport's consumers, which the channel launches after a
 * delivery's copies, or after a wait for its ready words where a kernel produces (one block
 * per slot of the delivery): each warp receives its message of the generation it was launched
 * for, there at the first look (a timeout of 0), uses it and the block acknowledges it
 * (@report_consumed: reporting it consumed too).
 */
__global__ void __launch_bounds__(consumer_threads)
	use_delivery(wic::channel ch, wic::delivery d, consumer_record rec, bool report_consumed)
{
	const uint32_t b = d.first_slot + blockIdx.x, w = threadIdx.x / 32;
	const uint32_t g = wic::launched_generation(ch, b);
	const uint8_t *m = nullptr;
	uint64_t acc = 0;

	if (threadIdx.x == 0)
		atomicAdd(&rec.on_sm[sm_id()], 1u);
	const int rc = wic::recv<wic::transport::launch>(ch, b, g, w, &m, 0);
	acknowledge(rc == WIC_OK ? use_message(m, stamp(b, g), &acc) : use_wrong, rec, b, g,
		    report_consumed ? &ch : nullptr);
	if (acc == 42) /* never: keeps the loads */
		rec.sink[2] = 1;
}

/*
 * stall() - the fault row's consumers: lane 0 of warp i of the grid (of grid_warps) reads the
 * first word of page 2 (k grid_warps + i) of @pages (never touched) for k = 0 .. @per_warp - 1,
 * until *@stop (device memory) is set, or for fault_hold_ns at most.
 */
__global__ void __launch_bounds__(consumer_threads)
	stall(const uint8_t *pages, uint32_t per_warp, const unsigned int *stop, consumer_record rec, fault_record f)
{
	const uint32_t grid_warps = gridDim.x * consumer_warps, i = blockIdx.x * consumer_warps + threadIdx.x / 32;

	if (threadIdx.x == 0)
		atomicAdd(&rec.on_sm[sm_id()], 1u);
	if (threadIdx.x % 32 != 0)
		return;
	const uint64_t start = wic::detail::globaltimer();
	uint64_t stalled = 0, sum = 0, now = start;
	uint32_t faults = 0;
	for (uint32_t k = 0;
	     k < per_warp && !*static_cast<const volatile unsigned int *>(stop) && now - start < fault_hold_ns; k++) {
		const uint8_t *at = pages + 2 * ((uint64_t)k * grid_warps + i) * page_bytes;
		const uint64_t t0 = wic::detail::globaltimer();
		sum += wic::detail::load_volatile(at);
		now = wic::detail::globaltimer();
		if (now - t0 >= fault_stall_ns) {
			stalled += now - t0;
			faults++;
		}
	}
	f.stalled_ns[i] = stalled;
	f.active_ns[i] = wic::detail::globaltimer() - start;
	f.faults[i] = faults;
	if (sum == 42) /* never: keeps the loads */
		rec.sink[3] = 1;
}

/*
 * peer_publish() - the peer rows' producer, a kernel on the other GPU: block b writes
 * generation g of slot b (every 8-byte word stamp(b, g)) and publishes it (publish_block()),
 * for g = 0, 1, ..., each once the consumers reported g - 1 consumed and @gap_ns more passed,
 * and only while g < *@until (pinned host memory: the generations whose consumers the host
 * queued, where they are launched). Once g reached *@until and *@stop is set, it ends, after a
 * stop message (every word 0) with @stop_message (resident consumers wait for one). The round
 * trip of a generation: from before its publish to the sight of its consumed report, which it
 * waits for as wait_consumed() does (push's backoff), as a user's producer would.
 */
__global__ void __launch_bounds__(consumer_threads)
	peer_publish(wic::channel ch, uint64_t gap_ns, const unsigned int *stop, const unsigned int *until,
		     bool stop_message, producer_record rec)
{
	enum { publishing, stopping, failed };
	__shared__ int next;
	const uint32_t b = blockIdx.x, t = threadIdx.x;
	uint64_t published_at = 0;
	uint32_t g = 0;

	for (;; g++) {
		if (t == 0) {
			next = publishing;
			if (g > 0 && wic::wait_consumed(ch, b, g - 1, timeout_ns) != WIC_OK)
				next = failed;
			const uint64_t seen = wic::detail::globaltimer();
			if (next == publishing && g - 1 < recorded_generations)
				rec.round_trip_ns[b * recorded_generations + g - 1] = seen - published_at;
			while (next == publishing && g > 0 && wic::detail::globaltimer() - seen < gap_ns) {
			}
			while (next == publishing && g >= wic::detail::load_acquire(until)) {
				if (wic::detail::load_acquire(stop))
					next = stopping;
				else if (wic::detail::globaltimer() - seen > timeout_ns)
					next = failed;
			}
			published_at = wic::detail::globaltimer();
		}
		__syncthreads();
		const int now = next;
		if (now == failed || (now == stopping && !stop_message))
			break;
		reinterpret_cast<uint64_t *>(wic::slot_buffer(ch, b))[t] = now == stopping ? 0 : stamp(b, g);
		wic::publish_block(ch, b, g);
		if (now == stopping)
			break;
		/* next is thread 0's to write again. */
		__syncthreads();
	}
	if (t == 0)
		rec.published[b] = next == failed ? ~0u : g;
}

/* ---- host side ---- */

/*
 * @n words of pinned host memory mapped into every device (the peer rows' producer GPU reads
 * them too), zeroed: host and device addresses.
 */
struct mapped_words {
	unsigned int *host = nullptr;
	unsigned int *dev = nullptr;

	explicit mapped_words(uint32_t n)
	{
		CHECK(cudaHostAlloc(&host, n * sizeof(unsigned int), cudaHostAllocMapped | cudaHostAllocPortable));
		memset(host, 0, n * sizeof(unsigned int));
		CHECK(cudaHostGetDevicePointer((void **)&dev, host, 0));
	}
	mapped_words(const mapped_words &) = delete;
	mapped_words &operator=(const mapped_words &) = delete;
	~mapped_words() { CHECK(cudaFreeHost(host)); }
};

/* The peer rows' producer GPU; the consumers and the neighbour run on GPU 0. */
constexpr int producer_gpu = 1;

/*
 * The peer rows' producer side: a stream on the producer GPU, peer_publish() loaded there (with
 * lazy loading, its first launch could wait for a running kernel), its record in that GPU's
 * memory, and the words (pinned) through which the host steers it: stop, until.
 */
struct producer_side {
	const uint32_t blocks;
	cudaStream_t stream = nullptr;
	mapped_words steer{2};
	producer_record rec{};

	explicit producer_side(uint32_t blocks_) : blocks(blocks_)
	{
		CHECK(wic::detail::on_device(producer_gpu, [&] {
			cudaFuncAttributes loaded;
			cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
			if (err == cudaSuccess)
				err = cudaMalloc(&rec.round_trip_ns, blocks * recorded_generations * sizeof(uint64_t));
			if (err == cudaSuccess)
				err = cudaMalloc(&rec.published, blocks * sizeof(unsigned int));
			return err == cudaSuccess ? cudaFuncGetAttributes(&loaded, (const void *)peer_publish) : err;
		}));
	}
	producer_side(const producer_side &) = delete;
	producer_side &operator=(const producer_side &) = delete;
	~producer_side()
	{
		CHECK(wic::detail::on_device(producer_gpu, [&] {
			cudaError_t err = cudaStreamDestroy(stream);
			if (err == cudaSuccess)
				err = cudaFree(rec.round_trip_ns);
			return err == cudaSuccess ? cudaFree(rec.published) : err;
		}));
	}

	unsigned int *stop() const { return steer.dev; }
	unsigned int *until() const { return steer.dev + 1; }
	/* Lets the producer publish the generations below @n. */
	void allow(uint32_t n) { __atomic_store_n(&steer.host[1], n, __ATOMIC_RELEASE); }

	/* Starts peer_publish() for a run, allowed the generations below @allowed. */
	void start(const wic::channel &ch, double gap_us, uint32_t allowed, bool stop_message)
	{
		__atomic_store_n(&steer.host[0], 0u, __ATOMIC_RELEASE);
		allow(allowed);
		CHECK(wic::detail::on_device(producer_gpu, [&] {
			peer_publish<<<blocks, consumer_threads, 0, stream>>>(ch, (uint64_t)(gap_us * 1000), stop(), until(),
									      stop_message, rec);
			return cudaGetLastError();
		}));
	}

	/*
	 * Ends the run: @at_once, each block at its next generation (resident consumers: after
	 * their stop message); else once it published every generation allowed (consumers were
	 * queued for them). Waits for it; *@round_trip_us: every recorded generation's round trip;
	 * returns the fewest generations of data a block published. Stops the program at a
	 * producer's wait that gave up.
	 */
	uint32_t stop_and_collect(bool at_once, std::vector<double> *round_trip_us, const char *what)
	{
		if (at_once)
			allow(0);
		__atomic_store_n(&steer.host[0], 1u, __ATOMIC_RELEASE);
		finish(stream, what);
		std::vector<unsigned int> published(blocks);
		std::vector<uint64_t> ns(blocks * recorded_generations);
		CHECK(cudaMemcpy(published.data(), rec.published, blocks * sizeof(unsigned int), cudaMemcpyDefault));
		CHECK(cudaMemcpy(ns.data(), rec.round_trip_ns, ns.size() * sizeof(uint64_t), cudaMemcpyDefault));
		uint32_t fewest = ~0u;
		for (uint32_t b = 0; b < blocks; b++) {
			if (published[b] == ~0u)
				stuck(what);
			fewest = std::min(fewest, published[b]);
			for (uint32_t g = 0; g < std::min(published[b], recorded_generations); g++)
				round_trip_us->push_back(ns[b * recorded_generations + g] / 1000.0);
		}
		return fewest;
	}
};

int sm_count()
{
	int sms = 0;
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	return sms;
}

/* What every run uses: the device's streams, the kernels' memory and where they report. */
struct rig {
	const uint32_t sms = (uint32_t)sm_count();
	mapped_words acks{sms};
	mapped_words done{1};
	cudaStream_t neighbour_stream = nullptr, consumer_stream = nullptr, copy_stream = nullptr;
	uint64_t data_bytes = (uint64_t)sms * bench::dram_bytes;
	uint4 *data = nullptr; /* the neighbour's, dram_bytes per block */
	/* Consumer blocks per %smid, then neighbour blocks per %smid, then neighbour blocks finished. */
	unsigned int *counters = nullptr;
	unsigned long long *span = nullptr;
	uint32_t *sink = nullptr;
	uint8_t *staging = nullptr; /* pinned: a generation, one batch per block */
	uint8_t *batches = nullptr; /* launch_raw's copy of a generation */
	uint8_t *pages = nullptr;   /* managed: the fault row's, allocated afresh for each run */
	const uint64_t fault_bytes = 2ull * sms * consumer_warps * fault_pages_per_warp * page_bytes;
	unsigned int *stop = nullptr;
	uint64_t *fault_ns = nullptr; /* per fault warp: stalled, then active */
	uint32_t *faults = nullptr;
	double mapped_one_way_us = 0;
	std::unique_ptr<producer_side> producer; /* the peer rows' (--peer) */

	rig()
	{
		CHECK(cudaStreamCreateWithFlags(&neighbour_stream, cudaStreamNonBlocking));
		CHECK(cudaStreamCreateWithFlags(&consumer_stream, cudaStreamNonBlocking));
		CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
		CHECK(cudaMalloc(&data, data_bytes));
		/* 0x3c3c3c3c: about 0.0115 as a float, for C_SRS's arithmetic. */
		CHECK(cudaMemset(data, 0x3c, data_bytes));
		CHECK(cudaMalloc(&counters, (2 * max_smid + 1) * sizeof(unsigned int)));
		CHECK(cudaMalloc(&span, 2 * sizeof(unsigned long long)));
		CHECK(cudaMalloc(&sink, 4 * sizeof(uint32_t)));
		CHECK(cudaHostAlloc(&staging, sms * batch_bytes, cudaHostAllocDefault));
		memset(staging, 0, sms * batch_bytes);
		CHECK(cudaMalloc(&batches, sms * batch_bytes));
		CHECK(cudaMalloc(&stop, sizeof(unsigned int)));
		CHECK(cudaMalloc(&fault_ns, 2 * sms * consumer_warps * sizeof(uint64_t)));
		CHECK(cudaMalloc(&faults, sms * consumer_warps * sizeof(uint32_t)));
		CHECK(cudaDeviceSynchronize());
	}
	rig(const rig &) = delete;
	rig &operator=(const rig &) = delete;
	~rig()
	{
		CHECK(cudaStreamDestroy(neighbour_stream));
		CHECK(cudaStreamDestroy(consumer_stream));
		CHECK(cudaStreamDestroy(copy_stream));
		CHECK(cudaFree(data));
		CHECK(cudaFree(counters));
		CHECK(cudaFree(span));
		CHECK(cudaFree(sink));
		CHECK(cudaFreeHost(staging));
		CHECK(cudaFree(batches));
		CHECK(cudaFree(pages));
		CHECK(cudaFree(stop));
		CHECK(cudaFree(fault_ns));
		CHECK(cudaFree(faults));
	}

	consumer_record consumer_rec() const { return {acks.dev, counters, sink}; }
	neighbour_record neighbour_rec() const
	{
		return {span, counters + max_smid, counters + 2 * max_smid, done.dev, sink};
	}
	fault_record fault_rec() const
	{
		return {fault_ns, fault_ns + sms * consumer_warps, faults};
	}

	/* Before a run, with nothing running: no acknowledgement, no block counted, no span. */
	void reset()
	{
		memset(acks.host, 0, sms * sizeof(unsigned int));
		*done.host = 0;
		const unsigned long long none[2] = {~0ull, 0};
		CHECK(cudaMemcpy(span, none, sizeof(none), cudaMemcpyHostToDevice));
		CHECK(cudaMemset(counters, 0, (2 * max_smid + 1) * sizeof(unsigned int)));
		CHECK(cudaMemset(stop, 0, sizeof(unsigned int)));
		/* The runs' streams are non-blocking: they do not wait for the memsets by themselves. */
		CHECK(cudaDeviceSynchronize());
	}

	/* Stamps generation @g's messages into the staging batches; @stop: the stop message. */
	void stage(uint32_t g, bool stop_message = false)
	{
		for (uint32_t b = 0; b < sms; b++)
			for (uint32_t w = 0; w < consumer_warps; w++) {
				const uint64_t s = stop_message ? 0 : stamp(b, g);
				uint8_t *m = staging + (uint64_t)b * batch_bytes + (uint64_t)w * message_bytes;
				memcpy(m, &s, 8);
				memcpy(m + message_bytes - 8, &s, 8);
			}
	}
};

/*
 * Spins until every consumer block acknowledged generation @g; *@first_us and *@all_us: when
 * the first and the last acknowledgement were seen, after @t0, and *@end the latter. false
 * after 2 s or at a failure (~0).
 */
bool wait_acks(const rig &r, uint32_t g, clock_type::time_point t0, double *first_us, double *all_us,
	       clock_type::time_point *end)
{
	*first_us = -1;
	for (;;) {
		uint32_t seen = 0;
		for (uint32_t b = 0; b < r.sms; b++) {
			const unsigned int v = __atomic_load_n(&r.acks.host[b], __ATOMIC_ACQUIRE);
			if (v == ~0u)
				return false;
			seen += (int)(v - (g + 1)) >= 0;
		}
		const auto now = clock_type::now();
		if (seen && *first_us < 0)
			*first_us = us_between(t0, now);
		if (seen == r.sms) {
			*all_us = us_between(t0, now);
			*end = now;
			return true;
		}
		if (us_between(t0, now) > timeout_s * 1e6)
			return false;
	}
}

/*
 * The fault row's warps: their median time from start to stop, median share of it stalled,
 * mean stall of a fault, median faults.
 */
struct stall_stats {
	double held_ms;
	double share;
	double stall_us;
	double faults;
};

/* What one run measured. */
struct run_result {
	double span_ms = 0; /* the neighbour's */
	bool shared = true;
	uint32_t published = 0;
	/* Per generation; a producer kernel's: round trips, and the host's time queueing consumers. */
	std::vector<double> first_us, all_us, publish_us, round_trip_us;
	bool stalled = false; /* the fault row: stalls holds its warps' figures */
	stall_stats stalls{0, 0, 0, 0};
};

/*
 * consumers - one way of bringing generations to consumers, what runs beside the neighbour. A
 * run calls start() before it launches the neighbour; while the neighbour runs, publish() for
 * generation 0, 1, ... (staged in the rig's staging batches), each once the one before was
 * acknowledged and the gap passed, when publishes(), else idle() again and again (a producer
 * kernel keeps the gap itself); stop() once it has ended, then results().
 */
class consumers {
public:
	virtual ~consumers() = default;
	virtual bool publishes() const { return true; }
	/* Launches the consumers on the rig's consumer stream, or nothing; @gap_us: the row's. */
	virtual void start(double gap_us) = 0;
	/* Makes generation @g visible to the consumers (where publishes()). */
	virtual void publish(uint32_t /* g */) {}
	virtual void idle() {}
	/* Ends the consumers (the stop message, where they wait for one) and waits for them. */
	virtual void stop() = 0;
	/*
	 * The consumer blocks each SM ran after @published publishes; for consumers launched per
	 * generation, the mean (the scheduler places each launch's blocks anew).
	 */
	virtual uint32_t blocks_per_sm(uint32_t /* published */) const { return 1; }
	/* Whether the consumers are launched per generation. */
	virtual bool launched() const { return false; }
	/* What the consumers (fault row) or a producer kernel measured, into @out. */
	virtual void results(run_result * /* out */) const {}
};

/* none: the neighbour alone. */
class no_consumers : public consumers {
public:
	bool publishes() const override { return false; }
	void start(double) override {}
	void stop() override {}
	uint32_t blocks_per_sm(uint32_t) const override { return 0; }
};

/* push, poll, alg1, mapped, tagged: a host_channel of one slot per block, wait_and_use(). */
class channel_consumers : public consumers {
public:
	channel_consumers(rig &r, wic::transport kind) : r_(r)
	{
		CHECK(ch_.create(kind, r.sms, message_bytes, consumer_warps, wic::reuse::caller));
	}
	void start(double) override
	{
		wait_and_use<<<r_.sms, consumer_threads, 0, r_.consumer_stream>>>(ch_.device(), r_.consumer_rec(), false);
		CHECK(cudaGetLastError());
	}
	void publish(uint32_t) override { CHECK(ch_.publish_many(0, r_.sms, r_.staging, r_.copy_stream)); }
	void stop() override
	{
		r_.stage(0, true);
		CHECK(ch_.publish_many(0, r_.sms, r_.staging, r_.copy_stream));
		finish(r_.consumer_stream, wic::transport_name(ch_.device().kind));
		finish(r_.copy_stream, wic::transport_name(ch_.device().kind));
	}

private:
	rig &r_;
	wic::host_channel ch_;
};

/* launch_raw: per generation its copy, then use_batch() on the same stream. */
class launched_consumers : public consumers {
public:
	explicit launched_consumers(rig &r) : r_(r) {}
	void start(double) override {}
	void publish(uint32_t g) override
	{
		CHECK(cudaMemcpyAsync(r_.batches, r_.staging, r_.sms * batch_bytes, cudaMemcpyHostToDevice,
				      r_.copy_stream));
		use_batch<<<r_.sms, consumer_threads, 0, r_.copy_stream>>>(r_.batches, g, r_.consumer_rec());
		CHECK(cudaGetLastError());
	}
	void stop() override { finish(r_.copy_stream, "launch_raw"); }
	uint32_t blocks_per_sm(uint32_t published) const override { return published; }
	bool launched() const override { return true; }

private:
	rig &r_;
};

/*
 * launch: a wic::host_channel of transport::launch, one slot per block; the channel launches
 * use_delivery() after each publish_many()'s copies, on the copy stream.
 */
class delivery_consumers : public consumers {
public:
	explicit delivery_consumers(rig &r) : r_(r)
	{
		CHECK(ch_.create(wic::transport::launch, r.sms, message_bytes, consumer_warps, wic::reuse::caller));
		const wic::channel dev = ch_.device();
		const consumer_record rec = r.consumer_rec();
		CHECK(ch_.launch_consumer([dev, rec](const wic::delivery &d, cudaStream_t stream) {
			use_delivery<<<d.slots, consumer_threads, 0, stream>>>(dev, d, rec, false);
			return cudaGetLastError();
		}));
	}
	void start(double) override {}
	void publish(uint32_t) override { CHECK(ch_.publish_many(0, r_.sms, r_.staging, r_.copy_stream)); }
	void stop() override { finish(r_.copy_stream, "launch"); }
	uint32_t blocks_per_sm(uint32_t published) const override { return published; }
	bool launched() const override { return true; }

private:
	rig &r_;
	wic::host_channel ch_;
};

/* fault: stall()'s warps on pages never touched, allocated afresh for each run. */
class fault_consumers : public consumers {
public:
	explicit fault_consumers(rig &r) : r_(r), warps_(r.sms * consumer_warps) {}
	bool publishes() const override { return false; }
	void start(double) override
	{
		/* Fresh pages: every read a fault. Freed with nothing running (cudaFree() waits). */
		CHECK(cudaFree(r_.pages));
		CHECK(cudaMallocManaged(&r_.pages, r_.fault_bytes));
		stall<<<r_.sms, consumer_threads, 0, r_.consumer_stream>>>(r_.pages, fault_pages_per_warp, r_.stop,
									   r_.consumer_rec(), r_.fault_rec());
		CHECK(cudaGetLastError());
	}
	void stop() override
	{
		CHECK(cudaMemsetAsync(r_.stop, 0xff, sizeof(unsigned int), r_.copy_stream));
		finish(r_.consumer_stream, "fault");
		finish(r_.copy_stream, "fault");
		std::vector<uint64_t> ns(2 * warps_);
		std::vector<uint32_t> faults(warps_);
		CHECK(cudaMemcpy(ns.data(), r_.fault_ns, ns.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(faults.data(), r_.faults, faults.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
		std::vector<double> held, share, count;
		double stalled = 0, all = 0;
		for (uint32_t i = 0; i < warps_; i++) {
			held.push_back(ns[warps_ + i] / 1e6);
			share.push_back(ns[i] / std::max(1.0, (double)ns[warps_ + i]));
			count.push_back(faults[i]);
			stalled += ns[i];
			all += faults[i];
		}
		stats_ = {quantile(held, 0.5), quantile(share, 0.5), all ? stalled / all / 1000 : 0,
			  quantile(count, 0.5)};
	}
	void results(run_result *out) const override
	{
		out->stalled = true;
		out->stalls = stats_;
	}

private:
	rig &r_;
	uint32_t warps_;
	stall_stats stats_{0, 0, 0, 0};
};

/*
 * The peer rows' push, poll, alg1, tagged: a peer_channel from the producer GPU, one slot per
 * block; wait_and_use() reports each generation consumed, peer_publish() waits for that.
 */
class peer_waiting_consumers : public consumers {
public:
	peer_waiting_consumers(rig &r, wic::transport kind) : r_(r)
	{
		CHECK(ch_.create(kind, 0, producer_gpu, r.sms, message_bytes, consumer_warps));
	}
	bool publishes() const override { return false; }
	void start(double gap_us) override
	{
		wait_and_use<<<r_.sms, consumer_threads, 0, r_.consumer_stream>>>(ch_.device(), r_.consumer_rec(), true);
		CHECK(cudaGetLastError());
		r_.producer->start(ch_.device(), gap_us, ~0u, true);
	}
	void stop() override
	{
		const char *what = wic::transport_name(ch_.device().kind);
		/*
		 * Before the producer's stop: a consumer that failed (~0) never reported its
		 * generation consumed, so the producer's wait gave up too, which is all that
		 * stop_and_collect() would say.
		 */
		for (uint32_t b = 0; b < r_.sms; b++) {
			if (__atomic_load_n(&r_.acks.host[b], __ATOMIC_ACQUIRE) == ~0u) {
				char why[96];
				snprintf(why, sizeof(why), "%s: a consumer found a wrong message or its wait gave up", what);
				stuck(why);
			}
		}
		generations_ = r_.producer->stop_and_collect(true, &round_trip_us_, what);
		finish(r_.consumer_stream, what);
	}
	void results(run_result *out) const override
	{
		out->published = generations_;
		out->round_trip_us = round_trip_us_;
	}

private:
	rig &r_;
	wic::peer_channel ch_;
	uint32_t generations_ = 0;
	std::vector<double> round_trip_us_;
};

/*
 * The peer rows' launch: a peer_channel of transport::launch, one slot per block. The host
 * queues, window generations ahead of the slowest block's acknowledgement, each generation's
 * stream waits for its ready words and use_delivery()'s launch (launch_when_published(), on
 * the copy stream), and allows peer_publish() only the generations queued.
 */
class peer_launched_consumers : public consumers {
public:
	explicit peer_launched_consumers(rig &r) : r_(r)
	{
		CHECK(ch_.create(wic::transport::launch, 0, producer_gpu, r.sms, message_bytes, consumer_warps));
		const wic::channel dev = ch_.device();
		const consumer_record rec = r.consumer_rec();
		consume_ = [dev, rec](const wic::delivery &d, cudaStream_t stream) {
			use_delivery<<<d.slots, consumer_threads, 0, stream>>>(dev, d, rec, true);
			return cudaGetLastError();
		};
	}
	bool publishes() const override { return false; }
	void start(double gap_us) override
	{
		/*
		 * The producer first: a stream takes only so many queued operations before the host's
		 * next call blocks until the GPU ran some, which here needs the producer.
		 */
		r_.producer->start(ch_.device(), gap_us, 0, false);
		while (queued_ < window) {
			queue();
			r_.producer->allow(queued_);
		}
	}
	void idle() override
	{
		unsigned int slowest = ~0u;
		for (uint32_t b = 0; b < r_.sms; b++) {
			const unsigned int acked = __atomic_load_n(&r_.acks.host[b], __ATOMIC_ACQUIRE);
			if (acked == ~0u)
				stuck("launch: a consumer found a wrong message");
			slowest = std::min(slowest, acked);
		}
		if (queued_ < slowest + window) {
			queue();
			r_.producer->allow(queued_);
		}
	}
	void stop() override
	{
		const uint32_t published = r_.producer->stop_and_collect(false, &round_trip_us_, "launch");
		finish(r_.copy_stream, "launch");
		if (published != queued_)
			stuck("launch: the producer published other generations than the host queued");
	}
	uint32_t blocks_per_sm(uint32_t published) const override { return published; }
	bool launched() const override { return true; }
	void results(run_result *out) const override
	{
		out->published = queued_;
		out->round_trip_us = round_trip_us_;
		out->publish_us = queue_us_;
	}

private:
	/*
	 * Generations the host may queue ahead of the slowest block. The copy stream's room limits
	 * it first: a generation is a wait per block and a launch, and once the stream is full each
	 * queueing call waits for the GPU to run some (measured: 350 us a generation, longer than
	 * the 285 us round trip), so the producer does wait for the host's queueing; 16 only keeps
	 * the window from adding a limit of its own.
	 */
	static constexpr uint32_t window = 16;

	void queue()
	{
		const bench::blocking_call_guard guard("launch: queueing a generation's consumers");
		const auto t0 = clock_type::now();
		CHECK(ch_.launch_when_published(0, r_.sms, queued_, consume_, r_.copy_stream));
		queue_us_.push_back(us_between(t0, clock_type::now()));
		queued_++;
	}

	rig &r_;
	wic::peer_channel ch_;
	wic::launcher consume_;
	uint32_t queued_ = 0;
	std::vector<double> round_trip_us_, queue_us_;
};

/* A row's transport: its name, its consumers, and whether its rows go by gap (it publishes). */
struct transport_entry {
	const char *name;
	std::unique_ptr<consumers> (*make)(rig &);
	bool by_gap;
};

template <wic::transport K>
std::unique_ptr<consumers> make_channel(rig &r)
{
	return std::make_unique<channel_consumers>(r, K);
}

std::unique_ptr<consumers> make_none(rig &)
{
	return std::make_unique<no_consumers>();
}

std::unique_ptr<consumers> make_launched(rig &r)
{
	return std::make_unique<launched_consumers>(r);
}

std::unique_ptr<consumers> make_delivered(rig &r)
{
	return std::make_unique<delivery_consumers>(r);
}

std::unique_ptr<consumers> make_fault(rig &r)
{
	return std::make_unique<fault_consumers>(r);
}

template <wic::transport K>
std::unique_ptr<consumers> make_peer_waiting(rig &r)
{
	return std::make_unique<peer_waiting_consumers>(r, K);
}

std::unique_ptr<consumers> make_peer_launched(rig &r)
{
	return std::make_unique<peer_launched_consumers>(r);
}

const transport_entry alone_entry = {"none", make_none, false};

const transport_entry every_transport[] = {
	alone_entry,
	{"push", make_channel<wic::transport::push>, true},
	{"poll", make_channel<wic::transport::poll>, true},
	{"alg1", make_channel<wic::transport::alg1>, true},
	{"mapped", make_channel<wic::transport::mapped>, true},
	{"tagged", make_channel<wic::transport::tagged>, true},
	{"launch", make_delivered, true},
	{"launch_raw", make_launched, true},
	{"fault", make_fault, false},
};

/* --peer: the producer is a kernel on GPU 1. */
const transport_entry every_peer_transport[] = {
	alone_entry,
	{"push", make_peer_waiting<wic::transport::push>, true},
	{"poll", make_peer_waiting<wic::transport::poll>, true},
	{"alg1", make_peer_waiting<wic::transport::alg1>, true},
	{"tagged", make_peer_waiting<wic::transport::tagged>, true},
	{"launch", make_peer_launched, true},
};

/* A kind of neighbour: work.cuh's @work, or C_SRS's work with @srs. */
struct neighbour_kind {
	const char *name;
	bench::work work;
	bool srs;
};

const neighbour_kind every_neighbour[] = {
	{"fma_chain", bench::work::fma_chain, false}, {"fma_ilp", bench::work::fma_ilp, false},
	{"l2_loads", bench::work::l2_loads, false},   {"dram_loads", bench::work::dram_loads, false},
	{"consumer", bench::work::dram_loads, true},
};

/* One run of @n's neighbour, @rounds rounds, beside @t's consumers, @gap_us between generations. */
run_result run(rig &r, const transport_entry &t, const neighbour_kind &n, uint32_t rounds, double gap_us)
{
	char what[96];
	snprintf(what, sizeof(what), "%s beside %s", n.name, t.name);
	r.reset();
	std::unique_ptr<consumers> c = t.make(r);
	c->start(gap_us);
	neighbour<<<r.sms, bench::work_threads, neighbour_smem, r.neighbour_stream>>>(n.work, n.srs, rounds, r.data,
										       r.data_bytes, r.neighbour_rec());
	CHECK(cudaGetLastError());
	run_result out;
	const auto start = clock_type::now();
	auto running = [&] {
		if (__atomic_load_n(r.done.host, __ATOMIC_ACQUIRE))
			return false;
		if (seconds_since(start) > neighbour_limit_s)
			stuck(what);
		return true;
	};
	if (c->publishes()) {
		for (uint32_t g = 0; running(); g++) {
			r.stage(g);
			const auto t0 = clock_type::now();
			c->publish(g);
			out.publish_us.push_back(us_between(t0, clock_type::now()));
			double first, all;
			clock_type::time_point end;
			if (!wait_acks(r, g, t0, &first, &all, &end))
				stuck(what);
			out.first_us.push_back(first);
			out.all_us.push_back(all);
			out.published++;
			while (us_between(end, clock_type::now()) < gap_us) {
			}
		}
	} else {
		while (running())
			c->idle();
	}
	finish(r.neighbour_stream, what);
	c->stop();
	c->results(&out);

	unsigned long long span[2];
	std::vector<unsigned int> counts(2 * max_smid);
	CHECK(cudaMemcpy(span, r.span, sizeof(span), cudaMemcpyDeviceToHost));
	CHECK(cudaMemcpy(counts.data(), r.counters, counts.size() * sizeof(unsigned int), cudaMemcpyDeviceToHost));
	out.span_ms = (span[1] - span[0]) / 1e6;
	const uint32_t want = c->blocks_per_sm(out.published);
	uint32_t with_neighbour = 0;
	uint64_t consumer_total = 0;
	for (uint32_t s = 0; s < max_smid; s++) {
		const unsigned int consumer_blocks = counts[s], neighbour_blocks = counts[max_smid + s];
		with_neighbour += neighbour_blocks == 1;
		consumer_total += consumer_blocks;
		/* Launched consumers: every SM ran some, all of them ran. */
		const bool consumers_there = c->launched() && want ? consumer_blocks >= 1 : consumer_blocks == want;
		out.shared &= neighbour_blocks <= 1 && (neighbour_blocks ? consumers_there : consumer_blocks == 0);
	}
	out.shared &= with_neighbour == r.sms && consumer_total == (uint64_t)want * r.sms;
	return out;
}

/* Rounds of @n that take about neighbour_target_ms alone. */
uint32_t rounds_for(rig &r, const neighbour_kind &n)
{
	uint32_t rounds = 1;
	double ms = run(r, alone_entry, n, rounds, 0).span_ms;
	while (ms < 5 && rounds < (1u << 24)) {
		rounds *= 4;
		ms = run(r, alone_entry, n, rounds, 0).span_ms;
	}
	return std::max<uint32_t>(1, (uint32_t)(rounds * neighbour_target_ms / std::max(ms, 1e-3)));
}

/* Half the median host <-> GPU round trip through two pinned mapped words, in us, of @n trips. */
double mapped_one_way_us(const rig &r, uint32_t n)
{
	mapped_words in(1), out(1);
	echo<<<1, 1, 0, r.consumer_stream>>>(in.dev, out.dev, n);
	CHECK(cudaGetLastError());
	std::vector<double> rt;
	for (uint32_t i = 1; i <= n; i++) {
		const auto t0 = clock_type::now();
		__atomic_store_n(in.host, i, __ATOMIC_RELEASE);
		if (!host_wait(out.host, i))
			stuck("mapped_one_way");
		rt.push_back(us_between(t0, clock_type::now()));
	}
	finish(r.consumer_stream, "mapped_one_way");
	rt.erase(rt.begin(), rt.begin() + n / 10); /* warm-up */
	return quantile(rt, 0.5) / 2;
}

/*
 * Every kernel that shares an SM asks for its largest shared memory carveout (see the top); stops the
 * program unless the neighbour runs one block per SM and a block of each consumer kernel fits
 * on an SM beside it (threads, registers, shared memory).
 */
void prepare_kernels(const cudaDeviceProp &prop)
{
	const void *consumer_kernels[] = {(const void *)wait_and_use, (const void *)use_batch, (const void *)use_delivery,
					  (const void *)stall};
	const void *n = (const void *)neighbour;
	CHECK(cudaFuncSetAttribute(n, cudaFuncAttributeMaxDynamicSharedMemorySize, neighbour_smem));
	CHECK(cudaFuncSetAttribute(n, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
	int per_sm = 0;
	CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, neighbour, bench::work_threads, neighbour_smem));
	cudaFuncAttributes na;
	CHECK(cudaFuncGetAttributes(&na, n));
	/* Registers are given out per warp, in steps of 8 per thread. */
	auto registers = [](const cudaFuncAttributes &a, uint32_t threads) {
		return (a.numRegs + 7) / 8 * 8 * threads;
	};
	bool fits = per_sm == 1;
	for (const void *k : consumer_kernels) {
		CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
					   cudaSharedmemCarveoutMaxShared));
		cudaFuncAttributes ca;
		CHECK(cudaFuncGetAttributes(&ca, k));
		fits &= bench::work_threads + consumer_threads <= (uint32_t)prop.maxThreadsPerMultiProcessor &&
			registers(na, bench::work_threads) + registers(ca, consumer_threads) <=
				(uint32_t)prop.regsPerMultiprocessor &&
			neighbour_smem + na.sharedSizeBytes + ca.sharedSizeBytes + 2 * prop.reservedSharedMemPerBlock <=
				prop.sharedMemPerMultiprocessor;
	}
	if (!fits) {
		fprintf(stderr, "corun: the neighbour does not run one block per SM (%d), or a consumer block does not fit "
				"beside it\n",
			per_sm);
		exit(2);
	}
}

/* The kernel driver's version, from /proc/driver/nvidia/version; "unknown" if not there. */
std::string driver_version()
{
	FILE *f = fopen("/proc/driver/nvidia/version", "r");
	char line[512] = "";
	if (!f)
		return "unknown";
	const bool read = fgets(line, sizeof(line), f) != nullptr;
	fclose(f);
	/* "NVRM version: NVIDIA UNIX ... Module ...  580.159.04  Release Build ...": its version. */
	for (char *word = read ? strtok(line, " \t\n") : nullptr; word; word = strtok(nullptr, " \t\n"))
		if (strchr(word, '.') && strspn(word, "0123456789.") == strlen(word))
			return word;
	return "unknown";
}

/* A row: the runs of one transport beside one kind of neighbour at one gap (-1: none). */
struct row {
	const transport_entry *t;
	double gap_us;
	std::vector<run_result> runs;
};

row measure(rig &r, const transport_entry &t, const neighbour_kind &n, uint32_t rounds, double gap_us, int reps)
{
	row out{&t, gap_us, {}};
	for (int i = 0; i < reps; i++) {
		/* Progress: a kind's table comes once all its rows ran. */
		fprintf(stderr, "corun: %s beside %s, gap %.0f us, run %d\n", n.name, t.name, gap_us, i + 1);
		out.runs.push_back(run(r, t, n, rounds, std::max(gap_us, 0.0)));
		if (out.runs.back().span_ms > long_run_ms)
			break;
	}
	return out;
}

/* Prints @w and writes its JSON object, against the neighbour's time alone, @alone_ms. */
void report(const rig &r, const row &w, const neighbour_kind &n, double alone_ms)
{
	std::vector<double> span, first, all, api, round_trip, held_ms, progress, share, stall_us, faults;
	uint32_t generations = 0;
	bool shared = true;
	for (const run_result &x : w.runs) {
		span.push_back(x.span_ms);
		first.insert(first.end(), x.first_us.begin(), x.first_us.end());
		all.insert(all.end(), x.all_us.begin(), x.all_us.end());
		api.insert(api.end(), x.publish_us.begin(), x.publish_us.end());
		round_trip.insert(round_trip.end(), x.round_trip_us.begin(), x.round_trip_us.end());
		generations += x.published;
		shared &= x.shared;
		if (x.stalled) {
			/*
			 * At alone's speed outside the hold (the neighbour may outlast it): the work left
			 * for the hold, over the hold.
			 */
			const double held = std::min(x.stalls.held_ms, x.span_ms);
			held_ms.push_back(x.stalls.held_ms);
			progress.push_back((alone_ms - (x.span_ms - held)) / held);
			share.push_back(x.stalls.share);
			stall_us.push_back(x.stalls.stall_us);
			faults.push_back(x.stalls.faults);
		}
	}
	const double beside = quantile(span, 0.5), m = r.mapped_one_way_us;
	const double slowest = *std::max_element(span.begin(), span.end());
	const double fastest = *std::min_element(span.begin(), span.end());
	char gap[32] = "";
	if (w.gap_us >= 0)
		snprintf(gap, sizeof(gap), "gap %4.0f us", w.gap_us);
	printf("corun  %-10s %-10s %-11s  throughput %6.3f (alone %7.2f ms, beside %7.2f ms, %zu run%s)", w.t->name,
	       n.name, gap, alone_ms / beside, alone_ms, beside, span.size(), span.size() == 1 ? "" : "s");
	record rec("corun");
	rec.add("transport", w.t->name).add("producer", r.producer ? "gpu" : "host").add("neighbour", n.name);
	if (w.gap_us >= 0)
		rec.add("gap_us", w.gap_us);
	rec.add("alone_ms", alone_ms)
		.add("beside_ms", beside)
		.add("throughput", alone_ms / beside)
		.add("throughput_min", alone_ms / slowest)
		.add("throughput_max", alone_ms / fastest)
		.add("runs", (double)span.size())
		.add("every_sm_shared", shared);
	if (!first.empty()) {
		printf("  one way first %7.2f / all %7.2f us (p90 %7.2f)  publish %6.2f us (p90 %6.2f)  %u generations",
		       quantile(first, 0.5) - m, quantile(all, 0.5) - m, quantile(all, 0.9) - m, quantile(api, 0.5),
		       quantile(api, 0.9), generations);
		rec.add("one_way_first_p50_us", quantile(first, 0.5) - m)
			.add("one_way_first_p90_us", quantile(first, 0.9) - m)
			.add("one_way_all_p50_us", quantile(all, 0.5) - m)
			.add("one_way_all_p90_us", quantile(all, 0.9) - m)
			.add("round_trip_all_p50_us", quantile(all, 0.5))
			.add("publish_p50_us", quantile(api, 0.5))
			.add("publish_p90_us", quantile(api, 0.9))
			.add("generations", (double)generations);
	}
	if (!round_trip.empty()) {
		printf("  round trip %7.2f us (p90 %7.2f)  %u generations", quantile(round_trip, 0.5),
		       quantile(round_trip, 0.9), generations);
		rec.add("round_trip_p50_us", quantile(round_trip, 0.5))
			.add("round_trip_p90_us", quantile(round_trip, 0.9))
			.add("generations", (double)generations);
	}
	if (!round_trip.empty() && !api.empty()) {
		printf("  queueing %6.2f us (p90 %6.2f)", quantile(api, 0.5), quantile(api, 0.9));
		rec.add("queue_p50_us", quantile(api, 0.5)).add("queue_p90_us", quantile(api, 0.9));
	}
	if (!share.empty()) {
		printf("  held %.1f ms, progress while held %.3f, stalled %.3f of it, %.0f us a fault, %.0f faults a warp",
		       quantile(held_ms, 0.5), quantile(progress, 0.5), quantile(share, 0.5), quantile(stall_us, 0.5),
		       quantile(faults, 0.5));
		rec.add("held_ms", quantile(held_ms, 0.5))
			.add("progress_while_held", quantile(progress, 0.5))
			.add("stalled_share", quantile(share, 0.5))
			.add("stall_us_per_fault", quantile(stall_us, 0.5))
			.add("faults_per_warp", quantile(faults, 0.5));
	}
	if (!shared)
		printf("  NOT EVERY SM SHARED");
	printf("\n");
	rec.emit();
}

} /* namespace */

int main(int argc, char **argv)
{
	bool peer = false;
	const bool quick = bench::quick_and_output(argc, argv, "--peer", &peer);
	int gpus = 0;
	CHECK(cudaGetDeviceCount(&gpus));
	/* Only for --peer: peer access makes a context on GPU 1 and maps between the GPUs. */
	const cudaError_t peer_access =
		peer && gpus >= 2 ? wic::enable_peer_access(0, producer_gpu) : cudaErrorInvalidDevice;
	if (peer && peer_access != cudaSuccess) {
		printf("corun: --peer skipped: needs GPUs 0 and 1 with peer access (%d GPU(s)%s%s)\n", gpus,
		       gpus >= 2 ? ", " : "", gpus >= 2 ? cudaGetErrorString(peer_access) : "");
		return 77;
	}
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	int driver_api = 0, runtime = 0, managed = 0;
	CHECK(cudaDriverGetVersion(&driver_api));
	CHECK(cudaRuntimeGetVersion(&runtime));
	CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrConcurrentManagedAccess, 0));
	char date[32];
	const time_t now = time(nullptr);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	const std::string driver = driver_version();
	prepare_kernels(prop);
	rig r;
	r.mapped_one_way_us = mapped_one_way_us(r, quick ? 1000 : 4000);
	std::string producer = "the host";
	if (peer) {
		cudaDeviceProp other;
		CHECK(cudaGetDeviceProperties(&other, producer_gpu));
		producer = std::string("a kernel on GPU 1 (") + other.name + ")";
		r.producer = std::make_unique<producer_side>(r.sms);
	}
	/* The fault row's pages fault on the GPU only with concurrent managed access (Linux, Pascal on). */
	const bool fault_row = managed && !peer;
	printf("corun: %s (%u SMs), driver %s, CUDA driver API %d, runtime %d, %s\n", prop.name, r.sms,
	       driver.c_str(), driver_api, runtime, date);
	printf("corun: producer %s\n", producer.c_str());
	printf("corun: per SM %u consumer warps (%u-byte messages) beside %u neighbour warps; mapped one way %.2f us%s\n",
	       consumer_warps, message_bytes, bench::work_warps, r.mapped_one_way_us,
	       fault_row || peer ? "" : "; no fault row (needs concurrentManagedAccess)");
	record("device")
		.add("name", prop.name)
		.add("sms", (double)r.sms)
		.add("driver", driver)
		.add("driver_api", (double)driver_api)
		.add("runtime", (double)runtime)
		.add("date", date)
		.add("concurrent_managed_access", managed != 0)
		.add("consumer_warps_per_sm", (double)consumer_warps)
		.add("message_bytes", (double)message_bytes)
		.add("neighbour_warps_per_sm", (double)bench::work_warps)
		.add("neighbour_target_ms", neighbour_target_ms)
		.add("mapped_one_way_us", r.mapped_one_way_us)
		.add("quick", quick)
		.add("producer", producer)
		.emit();

	std::vector<const neighbour_kind *> kinds;
	for (const neighbour_kind &n : every_neighbour)
		if (!quick || !strcmp(n.name, "fma_ilp") || !strcmp(n.name, "dram_loads"))
			kinds.push_back(&n);
	const std::vector<double> gaps = quick ? std::vector<double>{0, 1000}
					       : std::vector<double>(std::begin(every_gap_us), std::end(every_gap_us));
	const int reps = quick ? 1 : 3, alone_reps = quick ? 2 : 3;
	const transport_entry *const transports = peer ? every_peer_transport : every_transport;
	const size_t transport_count = peer ? std::size(every_peer_transport) : std::size(every_transport);
	for (const neighbour_kind *n : kinds) {
		const uint32_t rounds = rounds_for(r, *n);
		std::vector<double> before, after;
		for (int i = 0; i < alone_reps; i++)
			before.push_back(run(r, alone_entry, *n, rounds, 0).span_ms);
		std::vector<row> rows;
		for (size_t i = 0; i < transport_count; i++) {
			const transport_entry &t = transports[i];
			if (!strcmp(t.name, "fault") && !fault_row)
				continue;
			if (!t.by_gap) {
				rows.push_back(measure(r, t, *n, rounds, -1, reps));
				continue;
			}
			for (double gap : gaps)
				rows.push_back(measure(r, t, *n, rounds, gap, reps));
		}
		for (int i = 0; i < alone_reps; i++)
			after.push_back(run(r, alone_entry, *n, rounds, 0).span_ms);
		std::vector<double> both = before;
		both.insert(both.end(), after.begin(), after.end());
		const double alone = quantile(both, 0.5), b = quantile(before, 0.5), a = quantile(after, 0.5);
		printf("alone  %-10s %u rounds  %7.2f ms (before %.2f, after %.2f: drift %.3f)\n", n->name, rounds, alone,
		       b, a, a / b);
		record("alone")
			.add("neighbour", n->name)
			.add("rounds", (double)rounds)
			.add("alone_ms", alone)
			.add("before_ms", b)
			.add("after_ms", a)
			.add("drift", a / b)
			.add("rounds_per_s", rounds * (double)r.sms / (alone / 1000))
			.emit();
		for (const row &w : rows)
			report(r, w, *n, alone);
	}
	if (bench::json)
		fclose(bench::json);
	return 0;
}
