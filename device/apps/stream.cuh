/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * stream.cuh - the host side shared by the applications: a producer that publishes generations
 * into a channel's slots, with flow control; the three ways to run a consumer kernel (push,
 * poll, and the no-wait lower bound); the results direction (the kernel writes pinned host
 * memory and sets a ready word); and the driver of applications whose host side must see the
 * kernel's results before it can send its next messages.
 */
#ifndef WIC_APPS_STREAM_CUH
#define WIC_APPS_STREAM_CUH

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <wic/wic.cuh>

#include "check.cuh"

namespace app {

/*
 * How a run gets its data: through a channel of that transport (push, poll, alg1: the WIC
 * paper's Algorithm 1 made correct on this hardware; tagged, and picked: the transport
 * wic::pick_peer_transport() picks for the run's messages, where the producer is a kernel on
 * another GPU), or (nowait) all of it in device memory before the kernel starts, the lower
 * bound on the consumer's time; launch (applications with a host producer): no kernel waits,
 * the channel launches the consumer's kernels for each delivery once it landed.
 */
enum class mode { push, poll, alg1, tagged, picked, nowait, launch };

/* The transport a mode names: push, poll, alg1, tagged, launch; nowait publishes through push. */
inline wic::transport named_transport(mode m)
{
	switch (m) {
	case mode::launch:
		return wic::transport::launch;
	case mode::poll:
		return wic::transport::poll;
	case mode::alg1:
		return wic::transport::alg1;
	case mode::tagged:
		return wic::transport::tagged;
	default:
		return wic::transport::push;
	}
}

/*
 * The transport of a run's channels, whose batches are @warps messages of @message_bytes: the
 * one picked for them (picked), or the one the mode names. tagged carries whole 8-byte words
 * only: a run that asks for it with other messages ends here, saying so (exit status 2).
 */
inline wic::transport transport_of(mode m, uint32_t message_bytes, uint32_t warps = 1)
{
	if (m == mode::picked)
		return wic::pick_peer_transport(message_bytes, warps);
	if (m == mode::tagged && message_bytes % 8) {
		fprintf(stderr, "tagged carries messages of whole 8-byte words, not %u bytes\n", message_bytes);
		exit(2);
	}
	return named_transport(m);
}

inline const char *mode_name(mode m)
{
	switch (m) {
	case mode::nowait:
		return "nowait";
	case mode::picked:
		return "picked";
	default:
		return wic::transport_name(named_transport(m));
	}
}

/*
 * @text as a mode; tagged and picked only for an application whose producer is a GPU
 * (@gpu_producer), launch only for one whose consumer kernel can be launched per generation
 * (@launched).
 */
inline bool parse_mode(const char *text, bool gpu_producer, bool launched, mode *out)
{
	for (mode m : {mode::push, mode::poll, mode::alg1, mode::tagged, mode::picked, mode::nowait, mode::launch})
		if (!strcmp(text, mode_name(m)) && (gpu_producer || (m != mode::tagged && m != mode::picked)) &&
		    (launched || m != mode::launch)) {
			*out = m;
			return true;
		}
	return false;
}

/*
 * command_line - what every application's command line starts with: MODE, then REPS (default
 * 7), then the application's own sizes, read with size().
 */
struct command_line {
	mode m;
	int reps;
	int argc;
	char **argv;

	/* Size argument @i (0 for the first after REPS), or @fallback when it is absent. */
	uint32_t size(int i, uint32_t fallback) const
	{
		return argc > 3 + i ? (uint32_t)atoi(argv[3 + i]) : fallback;
	}
};

/*
 * Parses MODE and REPS; prints the usage, naming @sizes, and returns false on a bad MODE.
 * @gpu_producer: the application's producers are kernels on another GPU, which tagged and
 *	picked need.
 * @launched: the application has a launch mode: a streaming one's consumer kernel runs for
 *	the generations its placement gives (from first, count of them), an alternating one
 *	gives launch_step.
 */
inline bool parse_command_line(int argc, char **argv, const char *sizes, command_line *out, bool gpu_producer = false,
			       bool launched = false)
{
	if (argc < 2 || !parse_mode(argv[1], gpu_producer, launched, &out->m)) {
		fprintf(stderr, "usage: %s push|poll|alg1|%s%snowait [REPS] %s\n", argv[0],
			gpu_producer ? "tagged|picked|" : "", launched ? "launch|" : "", sizes);
		return false;
	}
	out->reps = argc > 2 ? atoi(argv[2]) : 7;
	out->argc = argc;
	out->argv = argv;
	return true;
}

/* Multiprocessors of the current device: what grids are sized by. */
inline uint32_t sm_count()
{
	int sms;
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	return sms;
}

/*
 * Where item (block b, generation g) of @blocks streams lives. Streaming runs give stream b
 * two slots, b and blocks + b, used in turn (generation g / 2), so the producer writes item
 * g + 1 while the consumer reads item g, and a generation's slots are consecutive (one
 * publish_many() publishes it). The no-wait run gives every item its own slot, b * generations
 * + g (as peer.cuh's ring does), all published before the kernel starts. A kernel takes the
 * generations from @first to end(): all of them, or (launch mode) the one it was launched for.
 */
struct placement {
	uint32_t blocks;
	uint32_t generations;
	bool nowait;
	uint32_t first = 0;
	uint32_t count = 0; /* 0: to the last generation */

	static constexpr uint32_t depth = 2;

	__host__ __device__ uint32_t end() const { return count ? first + count : generations; }

	__host__ __device__ uint32_t slot(uint32_t b, uint32_t g) const
	{
		return nowait ? b * generations + g : (g % depth) * blocks + b;
	}
	__host__ __device__ uint32_t generation(uint32_t g) const { return nowait ? 0 : g / depth; }
	uint32_t slots() const { return (nowait ? generations : depth) * blocks; }
};

/*
 * worker_pool - host threads that run a function over the indices 0..n-1 together with the
 * calling thread (run()); they stay between calls, so a call costs no thread creation.
 */
class worker_pool {
public:
	explicit worker_pool(uint32_t threads)
	{
		for (uint32_t i = 1; i < threads; i++)
			workers_.emplace_back([this] { serve(); });
	}
	worker_pool(const worker_pool &) = delete;
	worker_pool &operator=(const worker_pool &) = delete;
	~worker_pool()
	{
		{
			std::lock_guard<std::mutex> hold(lock_);
			stopping_ = true;
			round_++;
		}
		wake_.notify_all();
		for (std::thread &t : workers_)
			t.join();
	}

	/* Runs @body(i) for every i < @n, spread over the pool; returns when all are done. */
	void run(uint32_t n, const std::function<void(uint32_t)> &body)
	{
		{
			std::lock_guard<std::mutex> hold(lock_);
			body_ = &body;
			n_ = n;
			next_ = 0;
			busy_ = (uint32_t)workers_.size();
			round_++;
		}
		wake_.notify_all();
		take_turns();
		std::unique_lock<std::mutex> hold(lock_);
		idle_.wait(hold, [this] { return busy_ == 0; });
	}

private:
	void take_turns()
	{
		for (uint32_t i; (i = next_.fetch_add(1)) < n_;)
			(*body_)(i);
	}

	void serve()
	{
		uint64_t seen = 0;
		for (;;) {
			{
				std::unique_lock<std::mutex> hold(lock_);
				wake_.wait(hold, [&] { return round_ != seen; });
				seen = round_;
				if (stopping_)
					return;
			}
			take_turns();
			std::lock_guard<std::mutex> hold(lock_);
			if (--busy_ == 0)
				idle_.notify_one();
		}
	}

	std::vector<std::thread> workers_;
	std::mutex lock_;
	std::condition_variable wake_, idle_;
	const std::function<void(uint32_t)> *body_ = nullptr;
	uint32_t n_ = 0;
	std::atomic<uint32_t> next_{0};
	uint32_t busy_ = 0;
	uint64_t round_ = 0;
	bool stopping_ = false;
};

/*
 * receive() - warp @w's message of generation @generation of @slot, whose batch the whole block
 * reads. Called by every thread of the block, all with the same arguments but @w. alg1 waits
 * as Algorithm 1's consumer does, thread 0 alone and then the block's barrier
 * (wic::recv_block()); the other transports let each warp wait for its own message
 * (wic::recv()), so a warp starts as soon as its data is there.
 */
__device__ inline int receive(const wic::channel &ch, uint32_t slot, uint32_t generation, uint32_t w,
			      const uint8_t **message)
{
	if (ch.kind != wic::transport::alg1)
		return wic::recv(ch, slot, generation, w, message);
	const uint8_t *batch;
	const int status = wic::recv_block(ch, slot, generation, &batch);
	*message = batch + (uint64_t)w * ch.message_bytes;
	return status;
}

/*
 * block_consumed() - the block read its messages of generation @generation of @slot for the
 * last time: after the block's barrier one thread reports it (wic::consumed(), one store
 * across the link instead of one per warp), and the producer may write the slot again.
 * Called by every thread of the block.
 */
__device__ inline void block_consumed(const wic::channel &ch, uint32_t slot, uint32_t generation)
{
	__syncthreads();
	if (threadIdx.x == 0)
		wic::consumed(ch, slot, generation);
}

/*
 * What a run's host producer did: the time spent producing its messages (inside the fill
 * callbacks: the producer alone, no transport), the bytes it published, and where the rest of
 * its thread's time went: waiting for free slots (the consumers' reports), in the channel's
 * publish calls and (alternating applications) waiting for the kernel's results.
 */
struct host_work {
	double producer_ms;
	uint64_t bytes;
	double waiting_ms;
	double publishing_ms;
	double results_ms;

	host_work &operator+=(const host_work &o)
	{
		producer_ms += o.producer_ms;
		bytes += o.bytes;
		waiting_ms += o.waiting_ms;
		publishing_ms += o.publishing_ms;
		results_ms += o.results_ms;
		return *this;
	}
};

/*
 * A run's wall time, from the first publish (no-wait: from the launch) to the kernel's end,
 * its host producer's work and (streaming no-wait runs) the host pipeline's time
 * (host_pipeline()).
 */
struct timing {
	double total_ms;
	host_work host;
	double pipeline_ms;
};

inline double ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to)
{
	return std::chrono::duration<double, std::milli>(to - from).count();
}

/* A forward channel as kernels take it. */
struct forward {
	wic::channel ch;
	placement place;
};

/*
 * producer - the host end of one run's channel: @blocks streams of @generations items, each
 * item a batch of @warps messages of @message_bytes, in the slots placement gives them. Owns
 * the channel, a pinned staging batch per slot and the copy stream. The consumers report each
 * item done with block_consumed() (or wic::consumed()); the producer writes a slot again only
 * after that (host_channel::wait_free()).
 */
class producer {
public:
	producer(mode m, uint32_t blocks, uint32_t generations, uint32_t message_bytes, uint32_t warps)
		: place_{blocks, generations, m == mode::nowait}
	{
		const uint32_t slots = place_.slots();
		CHECK(ch_.create(transport_of(m, message_bytes, warps), slots, message_bytes, warps));
		batch_ = ch_.device().batch_bytes;
		CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
		/* One pinned staging buffer per slot, so an async copy's source is not overwritten early. */
		CHECK(cudaHostAlloc(&staging_, batch_ * slots, cudaHostAllocDefault));
	}
	producer(const producer &) = delete;
	producer &operator=(const producer &) = delete;
	~producer()
	{
		CHECK(cudaFreeHost(staging_));
		CHECK(cudaStreamDestroy(stream_));
	}

	wic::channel channel() const { return ch_.device(); }
	placement place() const { return place_; }
	forward view() const { return forward{channel(), place_}; }

	/* launch mode: what the channel launches for each delivery. */
	void launch_consumer(wic::launcher consume) { CHECK(ch_.launch_consumer(std::move(consume))); }

	/*
	 * The item the last publish() (stream b, generation g) or publish_generation() (every
	 * stream from 0, generation g) published: in launch mode, what the consumer the channel
	 * launches inside it is for (nothing is coalesced).
	 */
	uint32_t publishing() const { return publishing_; }
	uint32_t publishing_stream() const { return publishing_stream_; }

	/*
	 * publish() - publishes item (b, g); @fill writes its batch into pinned staging, and the
	 * time it takes counts as the producer's (work()). First waits until every warp finished
	 * the item the slot held (and so its copy is done).
	 */
	void publish(uint32_t b, uint32_t g, const std::function<void(uint8_t *)> &fill)
	{
		const uint32_t slot = place_.slot(b, g);
		const auto waited = std::chrono::steady_clock::now();
		wait_free(b, g);
		uint8_t *buf = staging_ + (size_t)slot * batch_;
		const auto start = std::chrono::steady_clock::now();
		fill(buf);
		const auto filled = std::chrono::steady_clock::now();
		publishing_ = g;
		publishing_stream_ = b;
		CHECK(ch_.publish(slot, buf, batch_, stream_));
		account(waited, start, filled, batch_);
	}

	/*
	 * publish_generation() - publishes item g of every stream at once: once their slots are
	 * free, @pool runs @fill(b, buf) for the streams in parallel (a producer that makes its
	 * data on every core; the wall time counts as the producer's), then one publish_many()
	 * hands them all to the channel (no-wait, whose slots for g are not consecutive: one
	 * publish() each).
	 */
	void publish_generation(uint32_t g, worker_pool &pool, const std::function<void(uint32_t, uint8_t *)> &fill)
	{
		const uint32_t blocks = place_.blocks;
		const auto waited = std::chrono::steady_clock::now();
		for (uint32_t b = 0; b < blocks; b++)
			wait_free(b, g);
		auto buffer = [&](uint32_t b) { return staging_ + (size_t)place_.slot(b, g) * batch_; };
		const auto start = std::chrono::steady_clock::now();
		pool.run(blocks, [&](uint32_t b) { fill(b, buffer(b)); });
		const auto filled = std::chrono::steady_clock::now();
		publishing_ = g;
		publishing_stream_ = 0;
		if (!place_.nowait) {
			CHECK(ch_.publish_many(place_.slot(0, g), blocks, buffer(0), stream_));
		} else {
			for (uint32_t b = 0; b < blocks; b++)
				CHECK(ch_.publish(place_.slot(b, g), buffer(b), batch_, stream_));
		}
		account(waited, start, filled, batch_ * blocks);
	}

	/* The producer's work so far. */
	host_work work() const { return work_; }

	/* The bytes of one item's batch. */
	size_t batch_bytes() const { return batch_; }

	/* Waits for every copy queued so far. */
	void flush() { CHECK(cudaStreamSynchronize(stream_)); }

private:
	/*
	 * Adds a publish that began waiting for free slots at @waited, filled from @start to
	 * @filled and then published @bytes until now.
	 */
	void account(std::chrono::steady_clock::time_point waited, std::chrono::steady_clock::time_point start,
		     std::chrono::steady_clock::time_point filled, uint64_t bytes)
	{
		work_ += host_work{ms_between(start, filled), bytes, ms_between(waited, start),
				   ms_between(filled, std::chrono::steady_clock::now()), 0.0};
	}

	/* Until the consumers are done with what item (b, g)'s slot holds (and so its copy is done). */
	void wait_free(uint32_t b, uint32_t g) { CHECK(ch_.wait_free(place_.slot(b, g))); }

	wic::host_channel ch_;
	placement place_;
	size_t batch_ = 0;
	cudaStream_t stream_ = nullptr;
	uint8_t *staging_ = nullptr;
	host_work work_{};
	uint32_t publishing_ = 0;
	uint32_t publishing_stream_ = 0;
};

/*
 * host_pipeline() - the host side of a streaming run and its copies, with no consumer and no
 * transport: @generations times, @pool fills the @blocks batches of @batch bytes of a
 * generation into pinned staging (@fill(b, g, buf), on every core) and one copy takes them to
 * device memory, with as many generations of staging as a run's slots (placement::depth), each
 * refilled once its copy is done. What the producer and the copy engine reach together, each
 * on the host memory the other uses: no transport that makes and copies the generations this
 * way (the applications' producer) can deliver them faster. Returns its milliseconds.
 */
inline double host_pipeline(uint32_t blocks, uint32_t generations, size_t batch, worker_pool &pool,
			    const std::function<void(uint32_t, uint32_t, uint8_t *)> &fill)
{
	constexpr uint32_t depth = placement::depth;
	const size_t generation_bytes = batch * blocks;
	uint8_t *staging, *device;
	cudaStream_t stream;
	cudaEvent_t copied[depth];
	CHECK(cudaHostAlloc(&staging, generation_bytes * depth, cudaHostAllocDefault));
	CHECK(cudaMalloc(&device, generation_bytes * depth));
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	for (cudaEvent_t &e : copied)
		CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
	const auto start = std::chrono::steady_clock::now();
	for (uint32_t g = 0; g < generations; g++) {
		const uint32_t d = g % depth;
		uint8_t *buf = staging + d * generation_bytes;
		CHECK(cudaEventSynchronize(copied[d])); /* a fresh event is complete */
		pool.run(blocks, [&](uint32_t b) { fill(b, g, buf + b * batch); });
		CHECK(cudaMemcpyAsync(device + d * generation_bytes, buf, generation_bytes, cudaMemcpyHostToDevice,
				      stream));
		CHECK(cudaEventRecord(copied[d], stream));
	}
	CHECK(cudaStreamSynchronize(stream));
	const double ms = ms_between(start, std::chrono::steady_clock::now());
	for (cudaEvent_t e : copied)
		CHECK(cudaEventDestroy(e));
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(device));
	CHECK(cudaFreeHost(staging));
	return ms;
}

/*
 * Runs one streaming execution: @fill(b, g, buf) writes item (b, g)'s batch_bytes into buf, and
 * may be called from several threads at once; @launch(channel, placement, stream)
 * starts the consumer kernel. The producer makes a generation of all streams at a time on
 * every core and publishes it with one call. nowait also times host_pipeline(). launch: no
 * kernel waits; the channel launches the consumer of each generation, placed at that
 * generation alone, on the producer's stream once its copies are done.
 */
inline timing run(mode m, uint32_t blocks, uint32_t generations, uint32_t message_bytes, uint32_t warps,
		  const std::function<void(uint32_t, uint32_t, uint8_t *)> &fill,
		  const std::function<void(const wic::channel &, placement, cudaStream_t)> &launch)
{
	producer prod(m, blocks, generations, message_bytes, warps);
	worker_pool pool(std::max(1u, std::thread::hardware_concurrency()));
	cudaStream_t kernel_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	auto publish_all = [&] {
		for (uint32_t g = 0; g < generations; g++)
			prod.publish_generation(g, pool, [&](uint32_t b, uint8_t *buf) { fill(b, g, buf); });
	};
	/* The delivery is the generation of every stream that publish_generation() publishes. */
	if (m == mode::launch)
		prod.launch_consumer([&](const wic::delivery &, cudaStream_t stream) {
			placement one = prod.place();
			one.first = prod.publishing();
			one.count = 1;
			launch(prod.channel(), one, stream);
			return cudaGetLastError();
		});
	const auto start = std::chrono::steady_clock::now();
	if (m == mode::nowait) {
		publish_all();
		prod.flush();
	}
	const auto launched = std::chrono::steady_clock::now();
	if (m != mode::launch)
		launch(prod.channel(), prod.place(), kernel_stream);
	CHECK(cudaGetLastError());
	if (m != mode::nowait)
		publish_all();
	CHECK(cudaStreamSynchronize(kernel_stream));
	prod.flush();
	const auto end = std::chrono::steady_clock::now();
	CHECK(cudaStreamDestroy(kernel_stream));
	const double pipeline_ms =
		m == mode::nowait ? host_pipeline(blocks, generations, prod.batch_bytes(), pool, fill) : 0.0;
	/* No-wait: the consumer alone, its data all there before it started. */
	return timing{ms_between(m == mode::nowait ? launched : start, end), prod.work(), pipeline_ms};
}

/*
 * back_channel - a run's results direction (wic::result_channel), its slots poisoned (NaN) so
 * that a part never written cannot pass for a result. Streaming runs keep few slots: the kernel
 * writes generation g only after the host's next messages, which the host sends after reading
 * what generation g overwrites. No-wait runs keep one slot per generation.
 */
class back_channel {
public:
	back_channel(uint32_t slots, uint64_t slot_bytes, uint32_t parts)
	{
		CHECK(ch_.create(slots, slot_bytes, parts));
		memset(ch_.host().data, 0xff, slots * slot_bytes);
	}

	wic::result_view view() const { return ch_.device(); }
	const uint8_t *slot(uint32_t g) const { return ch_.host().slot(g); }
	bool ready(uint32_t g, uint32_t part) const { return ch_.ready(g, part); }

	/* Waits until @part of generation @g is written; returns its slot. */
	const uint8_t *wait(uint32_t g, uint32_t part) const
	{
		CHECK(ch_.wait(g, part));
		return slot(g);
	}

private:
	wic::result_channel ch_;
};

template <typename T>
struct same {
	using type = T;
};

/*
 * launch_cooperative() - launches @kernel with all its blocks resident at once, which grid-wide
 * synchronization needs: the launch fails rather than leave a block unscheduled while the
 * others wait for it. @args are converted to the kernel's parameter types.
 */
template <typename... Params>
void launch_cooperative(void (*kernel)(Params...), uint32_t blocks, uint32_t threads, cudaStream_t stream,
			typename same<Params>::type... args)
{
	void *list[] = {(void *)&args...};
	CHECK(cudaLaunchCooperativeKernel((const void *)kernel, dim3(blocks), dim3(threads), list, 0, stream));
}

/*
 * grid_barrier - waits until every block of a cooperative launch arrived. @count is a device
 * word zeroed before the launch (grid_counter); @passed counts the barriers this block passed,
 * the same in every block, so round k completes when the count reaches k * gridDim.x. Each
 * block fences before it arrives and after it leaves, so what any block wrote before the
 * barrier is seen by every block after it.
 */
struct grid_barrier {
	unsigned int *count;
	uint32_t passed;

	__device__ void sync()
	{
		passed++;
		__syncthreads();
		if (threadIdx.x == 0) {
			const unsigned int target = passed * gridDim.x;
			unsigned sleep_ns = 32;
			__threadfence();
			atomicAdd(count, 1u);
			/* Short backoff: waiting blocks leave L2 to the blocks still working. */
			while ((int)(*(volatile unsigned int *)count - target) < 0) {
				__nanosleep(sleep_ns);
				sleep_ns = sleep_ns < 256 ? 2 * sleep_ns : 256;
			}
			__threadfence();
		}
		__syncthreads();
	}
};

/* The device word of a kernel's grid_barrier. */
class grid_counter {
public:
	grid_counter() { CHECK(cudaMalloc(&count_, sizeof(unsigned int))); }
	grid_counter(const grid_counter &) = delete;
	grid_counter &operator=(const grid_counter &) = delete;
	~grid_counter() { CHECK(cudaFree(count_)); }

	/* Before each launch. */
	void reset() { CHECK(cudaMemset(count_, 0, sizeof(unsigned int))); }
	grid_barrier barrier() const { return grid_barrier{count_, 0}; }

private:
	unsigned int *count_ = nullptr;
};

/* sqrt(sum (got - want)^2 / sum want^2) in double; NaN in @got never compares as small. */
template <typename G, typename W>
double relative_error(const G *got, const W *want, size_t n)
{
	double err = 0, ref = 0;
	for (size_t i = 0; i < n; i++) {
		const double d = (double)got[i] - (double)want[i];
		err += d * d;
		ref += (double)want[i] * (double)want[i];
	}
	return ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
}

/* One forward channel of an alternating application: @streams streams, as producer's blocks. */
struct forward_spec {
	uint32_t streams;
	uint32_t generations;
	uint32_t message_bytes;
	uint32_t warps;
};

/* Its results: @generations of @slot_bytes in @parts; streaming runs keep @ring slots. */
struct back_spec {
	uint32_t generations;
	uint64_t slot_bytes;
	uint32_t parts;
	uint32_t ring;
};

/* Every batch a run sent: channel c's item (b, g) at items[c][b * generations + g]. */
struct recording {
	std::vector<forward_spec> specs;
	std::vector<std::vector<std::vector<uint8_t>>> items;

	explicit recording(const std::vector<forward_spec> &s) : specs(s), items(s.size())
	{
		for (size_t c = 0; c < s.size(); c++)
			items[c].resize((size_t)s[c].streams * s[c].generations);
	}
	size_t batch_bytes(uint32_t c) const { return (size_t)specs[c].warps * specs[c].message_bytes; }
	std::vector<uint8_t> &item(uint32_t c, uint32_t b, uint32_t g)
	{
		return items[c][(size_t)b * specs[c].generations + g];
	}
};

/*
 * host_io - what an application's host side sends and receives through. In a run it publishes
 * (keeping a copy of every batch when recording) and waits for results; in the replays after a
 * no-wait run it reads the results the kernel left and makes each batch, and when verifying
 * compares it with what the kernel was given. @pool makes a generation's batches in parallel
 * (send_generation()), in runs and replays alike.
 */
class host_io {
public:
	host_io(std::vector<std::unique_ptr<producer>> *fwd, const back_channel *back, recording *rec,
		worker_pool *pool)
		: fwd_(fwd), back_(back), rec_(rec), pool_(pool), replay_(false)
	{
	}
	/*
	 * A replay; with @verify every batch is compared with its recording, else only made. Its
	 * scratch space is sized here, before a timed replay starts, for a generation of the
	 * largest channel.
	 */
	host_io(recording *rec, const back_channel *back, bool verify, worker_pool *pool)
		: back_(back), rec_(rec), pool_(pool), replay_(true), verify_(verify)
	{
		for (uint32_t c = 0; c < rec->specs.size(); c++)
			scratch_.resize(std::max(scratch_.size(), rec->batch_bytes(c) * rec->specs[c].streams));
	}

	/* Sends item (b, g) of forward channel @c; @fill writes its batch. */
	void send(uint32_t c, uint32_t b, uint32_t g, const std::function<void(uint8_t *)> &fill)
	{
		if (replay_ && verify_) {
			compare(c, b, g, fill);
			return;
		}
		if (replay_) {
			fill(scratch_.data());
			return;
		}
		(*fwd_)[c]->publish(b, g, [&](uint8_t *buf) {
			fill(buf);
			if (rec_)
				rec_->item(c, b, g).assign(buf, buf + rec_->batch_bytes(c));
		});
	}

	/*
	 * Sends item @g of every stream of forward channel @c; @fill(b, buf) writes stream b's batch
	 * and runs on the pool's threads at once. A run publishes the generation with one
	 * publish_many() (producer::publish_generation()).
	 */
	void send_generation(uint32_t c, uint32_t g, const std::function<void(uint32_t, uint8_t *)> &fill)
	{
		const uint32_t streams = rec_ ? rec_->specs[c].streams : (*fwd_)[c]->place().blocks;
		if (replay_ && verify_) {
			for (uint32_t b = 0; b < streams; b++)
				compare(c, b, g, [&](uint8_t *buf) { fill(b, buf); });
			return;
		}
		if (replay_) {
			const size_t bytes = rec_->batch_bytes(c);
			pool_->run(streams, [&](uint32_t b) { fill(b, scratch_.data() + b * bytes); });
			return;
		}
		(*fwd_)[c]->publish_generation(g, *pool_, [&](uint32_t b, uint8_t *buf) {
			fill(b, buf);
			if (rec_)
				rec_->item(c, b, g).assign(buf, buf + rec_->batch_bytes(c));
		});
	}

	/* Part @part of result generation @g, once the kernel wrote it: the generation's slot. */
	const uint8_t *result(uint32_t g, uint32_t part)
	{
		if (!replay_) {
			const auto start = std::chrono::steady_clock::now();
			const uint8_t *slot = back_->wait(g, part);
			results_ms_ += ms_between(start, std::chrono::steady_clock::now());
			return slot;
		}
		missing_ |= !back_->ready(g, part);
		return back_->slot(g);
	}

	/* A run: the time spent waiting in result(). */
	double results_ms() const { return results_ms_; }

	/* Replay: the largest relative difference of a batch from its recording; NaN if a result was missing. */
	double replay_error() const { return missing_ ? NAN : worst_; }

private:
	void compare(uint32_t c, uint32_t b, uint32_t g, const std::function<void(uint8_t *)> &fill)
	{
		const std::vector<uint8_t> &want = rec_->item(c, b, g);
		scratch_.assign(rec_->batch_bytes(c), 0);
		fill(scratch_.data());
		const float *got = reinterpret_cast<const float *>(scratch_.data());
		double d = NAN;
		if (want.size() == scratch_.size() && !memcmp(want.data(), scratch_.data(), want.size()))
			d = 0.0;
		else if (want.size() == scratch_.size())
			d = relative_error(got, reinterpret_cast<const float *>(want.data()), want.size() / sizeof(float));
		if (!std::isnan(worst_) && !(d <= worst_))
			worst_ = d;
	}

	std::vector<std::unique_ptr<producer>> *fwd_ = nullptr;
	const back_channel *back_;
	recording *rec_;
	worker_pool *pool_;
	double results_ms_ = 0.0;
	bool replay_;
	bool verify_ = false;
	bool missing_ = false;
	double worst_ = 0;
	std::vector<uint8_t> scratch_;
};

/*
 * alternating - an application whose host side needs the kernel's results before it can send
 * its next messages (the WIC paper's alternating and multiple communication models).
 */
struct alternating {
	std::vector<forward_spec> forward;
	back_spec back;
	/*
	 * Before each run, untimed: the kernel's device state as at the start. The kernel's stream
	 * does not wait for the default stream, so exchange() waits for the device after it.
	 */
	std::function<void()> reset;
	/* Starts the kernel on @stream; @fwd holds one channel per forward spec. */
	std::function<void(const std::vector<app::forward> &fwd, const wic::result_view &back, cudaStream_t stream)>
		launch;
	/*
	 * launch mode (applications that accept it): queues on @stream the kernels that consume
	 * item (@first_stream, @generation) of forward channel @channel (a send_generation()'s: of
	 * every stream from 0), which the channel launches once that item landed; nothing of the
	 * application's kernel waits on the GPU meanwhile. The kernels of one channel run in the
	 * order of its items.
	 */
	std::function<void(const std::vector<app::forward> &fwd, const wic::result_view &back, uint32_t channel,
			   uint32_t first_stream, uint32_t generation, cudaStream_t stream)>
		launch_step;
	/* The host's side of a run, from its first message to its last result. */
	std::function<void(host_io &io)> host;
};

struct exchange_timing {
	double total_ms;
	/* no-wait: host_io::replay_error() of the replay; 0 otherwise */
	double replay_error;
	/*
	 * The producers' work: no-wait, the bytes the recording run published and, as
	 * producer_ms, the whole host side replayed alone (its own computation included, no
	 * comparison with the recording)
	 */
	host_work host;
};

namespace detail {

inline void reset(const alternating &a)
{
	a.reset();
	CHECK(cudaDeviceSynchronize());
}

/*
 * One run of @a through channels (push, poll, alg1, launch), timed from the launch (launch: the
 * first publish) to the end of the host side and kernels; *@work gets its producers' work.
 */
inline double exchange_run(mode m, const alternating &a, recording *rec, host_work *work)
{
	reset(a);
	std::vector<std::unique_ptr<producer>> fwd;
	std::vector<forward> views;
	for (const forward_spec &f : a.forward) {
		fwd.emplace_back(new producer(m, f.streams, f.generations, f.message_bytes, f.warps));
		views.push_back(fwd.back()->view());
	}
	back_channel back(a.back.ring, a.back.slot_bytes, a.back.parts);
	worker_pool pool(std::max(1u, std::thread::hardware_concurrency()));
	host_io io(&fwd, &back, rec, &pool);
	cudaStream_t kernel_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	const auto start = std::chrono::steady_clock::now();
	if (m == mode::launch) {
		for (uint32_t c = 0; c < fwd.size(); c++)
			fwd[c]->launch_consumer([&, c](const wic::delivery &, cudaStream_t stream) {
				a.launch_step(views, back.view(), c, fwd[c]->publishing_stream(), fwd[c]->publishing(),
					      stream);
				return cudaGetLastError();
			});
	} else {
		a.launch(views, back.view(), kernel_stream);
	}
	CHECK(cudaGetLastError());
	a.host(io);
	CHECK(cudaStreamSynchronize(kernel_stream));
	*work = host_work{};
	for (auto &p : fwd) {
		p->flush();
		*work += p->work();
	}
	work->results_ms = io.results_ms();
	const auto end = std::chrono::steady_clock::now();
	CHECK(cudaStreamDestroy(kernel_stream));
	return ms_between(start, end);
}

} /* namespace detail */

/*
 * exchange() - runs @a once in mode @m.
 * push, poll, alg1: the kernel starts and the host side runs against it.
 * nowait: the host's messages depend on the kernel's earlier results, so a first, untimed push
 * run records them; then all of them are published before the kernel starts and the kernel
 * alone is timed (a lower bound: no waiting, no host work). The host side is then replayed
 * against the results the kernel left, once timed (the host side alone, host.producer_ms) and
 * once checked: it must send what was recorded.
 */
inline exchange_timing exchange(mode m, const alternating &a)
{
	host_work work;
	if (m != mode::nowait) {
		const double ms = detail::exchange_run(m, a, nullptr, &work);
		return exchange_timing{ms, 0.0, work};
	}
	recording rec(a.forward);
	detail::exchange_run(mode::push, a, &rec, &work);
	detail::reset(a);
	std::vector<std::unique_ptr<producer>> fwd;
	std::vector<forward> views;
	for (uint32_t c = 0; c < a.forward.size(); c++) {
		const forward_spec &f = a.forward[c];
		fwd.emplace_back(new producer(mode::nowait, f.streams, f.generations, f.message_bytes, f.warps));
		views.push_back(fwd.back()->view());
		for (uint32_t g = 0; g < f.generations; g++)
			for (uint32_t b = 0; b < f.streams; b++)
				fwd.back()->publish(b, g, [&](uint8_t *buf) {
					const std::vector<uint8_t> &item = rec.item(c, b, g);
					if (item.empty()) /* never sent, so never needed */
						memset(buf, 0, rec.batch_bytes(c));
					else
						memcpy(buf, item.data(), item.size());
				});
		fwd.back()->flush();
	}
	back_channel back(a.back.generations, a.back.slot_bytes, a.back.parts);
	cudaStream_t kernel_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	const auto launched = std::chrono::steady_clock::now();
	a.launch(views, back.view(), kernel_stream);
	CHECK(cudaGetLastError());
	CHECK(cudaStreamSynchronize(kernel_stream));
	const auto end = std::chrono::steady_clock::now();
	CHECK(cudaStreamDestroy(kernel_stream));
	/* The host side alone, nothing to wait for; then again, every message compared with its recording. */
	worker_pool pool(std::max(1u, std::thread::hardware_concurrency()));
	host_io alone(&rec, &back, false, &pool);
	const auto replay_start = std::chrono::steady_clock::now();
	a.host(alone);
	/* The recording run's bytes; the rest is the replay's, which waits for nothing. */
	work = host_work{ms_between(replay_start, std::chrono::steady_clock::now()), work.bytes, 0.0, 0.0, 0.0};
	host_io io(&rec, &back, true, &pool);
	a.host(io);
	return exchange_timing{ms_between(launched, end), io.replay_error(), work};
}

inline double median(std::vector<double> v)
{
	std::sort(v.begin(), v.end());
	return v.empty() ? 0.0 : v[v.size() / 2];
}

/*
 * Prints an application's line: NAME MODE PARAMS median_ms=... min_ms=... max_ms=... correct=...;
 * with @host (a CPU-GPU application's runs), also producer_ms= (the median of its producer's
 * time alone) and bytes= (what it published per run), two of the terms of its bound, and where
 * the producer's thread spent the rest (waiting_ms=, publishing_ms=, where it waited or
 * published; results_ms=, where it waited for the kernel's results); with @pipeline (a
 * streaming no-wait run's host_pipeline() times), pipeline_ms=, another term.
 */
inline void report(const char *name, mode m, const std::string &params, const std::vector<double> &times,
		   bool correct, const std::vector<host_work> *host = nullptr,
		   const std::vector<double> *pipeline = nullptr)
{
	printf("%s %s %s median_ms=%.3f min_ms=%.3f max_ms=%.3f", name, mode_name(m), params.c_str(), median(times),
	       *std::min_element(times.begin(), times.end()), *std::max_element(times.begin(), times.end()));
	if (host && !host->empty()) {
		std::vector<double> producer, waiting, publishing, results;
		for (const host_work &w : *host) {
			producer.push_back(w.producer_ms);
			waiting.push_back(w.waiting_ms);
			publishing.push_back(w.publishing_ms);
			results.push_back(w.results_ms);
		}
		printf(" producer_ms=%.3f bytes=%llu", median(producer), (unsigned long long)host->front().bytes);
		const double waited = median(waiting), published = median(publishing), awaited = median(results);
		if (waited > 0.0 || published > 0.0)
			printf(" waiting_ms=%.3f publishing_ms=%.3f", waited, published);
		if (awaited > 0.0)
			printf(" results_ms=%.3f", awaited);
	}
	if (pipeline && !pipeline->empty())
		printf(" pipeline_ms=%.3f", median(*pipeline));
	printf(" correct=%s\n", correct ? "yes" : "no");
}

} /* namespace app */

#endif /* WIC_APPS_STREAM_CUH */
