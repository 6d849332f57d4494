/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * peer.cuh - what the inter-GPU applications share: the two GPUs (peer access, or exit 77);
 * where item g of stream b lives in a channel a kernel produces (ring); the block-level steps
 * of a GPU producer (claim a slot; wic::publish_block() publishes it) and of a consumer
 * (receive, report consumed); the watchdog that ends both kernels when a wait times out instead
 * of leaving them waiting for each other; cooperative launches on a given GPU; the recorded
 * messages a no-wait run publishes; a parallel loop and random inputs for CPU references; and
 * the harness: one timed run of both GPUs' kernels (one_way_pair for GPU 1 streaming to GPU 0,
 * exchange_pair for GPUs that wait for each other, halo_exchange for a grid split by rows) and
 * the repetitions with their report (repeat_runs()).
 */
#ifndef WIC_APPS_PEER_CUH
#define WIC_APPS_PEER_CUH

#include "stream.cuh"

namespace app {

/* A well-mixed 64-bit hash (splitmix64's finaliser): fast, reproducible inputs from a seed. */
inline uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

/* Exit status of an application that cannot run here (fewer than two GPUs, no peer access). */
constexpr int skipped = 77;

/* How long a wait of the inter-GPU applications may take before the run counts as failed. */
constexpr uint64_t peer_timeout_ns = 10ULL * 1000 * 1000 * 1000;

/* Makes @device current for the object's lifetime, then the previous device again. */
class on_gpu {
public:
	explicit on_gpu(int device)
	{
		CHECK(cudaGetDevice(&previous_));
		CHECK(cudaSetDevice(device));
	}
	on_gpu(const on_gpu &) = delete;
	on_gpu &operator=(const on_gpu &) = delete;
	~on_gpu() { CHECK(cudaSetDevice(previous_)); }

private:
	int previous_ = 0;
};

/* @count Ts of @device's memory. */
template <typename T>
T *alloc_on(int device, size_t count)
{
	on_gpu g(device);
	T *p;
	CHECK(cudaMalloc(&p, count * sizeof(T)));
	return p;
}

inline void free_on(int device, void *p)
{
	on_gpu g(device);
	CHECK(cudaFree(p));
}

/*
 * two_gpus() - GPUs 0 and 1 with peer access enabled both ways, or the exit status `skipped`
 * after saying why. Prints the devices: "@name: GPU 0 (NAME, BUS) and GPU 1 (NAME, BUS), peer
 * access both ways".
 */
inline void two_gpus(const char *name)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess) {
		(void)cudaGetLastError();
		count = 0;
	}
	if (count < 2) {
		printf("%s: skipped: needs 2 GPUs with peer access, found %d\n", name, count);
		exit(skipped);
	}
	const cudaError_t err = wic::enable_peer_access(0, 1);
	if (err != cudaSuccess) {
		printf("%s: skipped: no peer access between GPUs 0 and 1 (%s)\n", name, cudaGetErrorString(err));
		exit(skipped);
	}
	char what[2][320];
	for (int d = 0; d < 2; d++) {
		cudaDeviceProp prop;
		char bus[32];
		CHECK(cudaGetDeviceProperties(&prop, d));
		CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), d));
		snprintf(what[d], sizeof(what[d]), "GPU %d (%s, %s)", d, prop.name, bus);
	}
	printf("%s: %s and %s, peer access both ways\n", name, what[0], what[1]);
}

/* The smaller SM count of GPUs 0 and 1: one block per SM on either. */
inline uint32_t common_sms()
{
	int sms[2];
	for (int d = 0; d < 2; d++)
		CHECK(cudaDeviceGetAttribute(&sms[d], cudaDevAttrMultiProcessorCount, d));
	return (uint32_t)std::min(sms[0], sms[1]);
}

/*
 * ring - where item g of stream b lives in a channel that a kernel produces. Streaming runs
 * give each stream @depth slots: item g goes to slot b * depth + g % depth as generation
 * g / depth, so the producer runs at most @depth items ahead of the consumer. No-wait runs
 * give each of a stream's @items items its own slot, generation 0 (as placement does), all
 * written before the consumer starts.
 */
struct ring {
	uint32_t depth;
	uint32_t items;
	bool nowait;

	__host__ __device__ uint32_t slot(uint32_t b, uint32_t g) const
	{
		return nowait ? b * items + g : b * depth + g % depth;
	}
	__host__ __device__ uint32_t generation(uint32_t g) const { return nowait ? 0 : g / depth; }
	/* Slots of a channel with @streams streams. */
	uint32_t slots(uint32_t streams) const { return streams * (nowait ? items : depth); }
};

/* One end of a channel as a kernel takes it. */
struct endpoint {
	wic::channel ch;
	ring place;
};

/*
 * watchdog - a run's failure flags: one word in each GPU's memory, zeroed before the run. A
 * wait that times out raises both; after that no wait blocks, so both kernels end (their
 * results wrong, which the check reports) rather than each waiting for the other forever.
 */
struct watchdog {
	int *mine;
	int *theirs;
	uint64_t timeout_ns;

	__device__ bool raised() const { return *(volatile int *)mine != 0; }
	__device__ void raise() const
	{
		*(volatile int *)mine = 1;
		*(volatile int *)theirs = 1;
	}
};

/* The watchdog words of GPUs 0 and 1. */
class watch_words {
public:
	watch_words()
	{
		for (int d = 0; d < 2; d++)
			word_[d] = alloc_on<int>(d, 1);
	}
	watch_words(const watch_words &) = delete;
	watch_words &operator=(const watch_words &) = delete;
	~watch_words()
	{
		for (int d = 0; d < 2; d++)
			free_on(d, word_[d]);
	}

	/* Before each run. */
	void reset()
	{
		const int zero = 0;
		for (int d = 0; d < 2; d++)
			CHECK(cudaMemcpy(word_[d], &zero, sizeof(int), cudaMemcpyHostToDevice));
	}
	/* What the kernel on @gpu takes. */
	watchdog on(int gpu) const { return watchdog{word_[gpu], word_[1 - gpu], peer_timeout_ns}; }
	/* After the run: whether a wait timed out. */
	bool raised() const
	{
		int flag[2];
		for (int d = 0; d < 2; d++)
			CHECK(cudaMemcpy(&flag[d], word_[d], sizeof(int), cudaMemcpyDeviceToHost));
		return flag[0] || flag[1];
	}

private:
	int *word_[2] = {nullptr, nullptr};
};

/*
 * block_recv() - the block's message of generation @generation of @slot (one message per
 * batch), through wic::recv_block(): thread 0 waits for it (tagged: every thread unpacks its
 * share), every thread gets its address.
 */
__device__ inline const uint8_t *block_recv(const wic::channel &ch, uint32_t slot, uint32_t generation,
					    const watchdog &wd)
{
	/*
	 * After a failure nothing waits: the run is wrong already and only has to end. One decision
	 * for the whole block, since with tagged every thread waits.
	 */
	const bool gave_up = __syncthreads_or(threadIdx.x == 0 && wd.raised());
	const uint8_t *message;
	const int rc = wic::recv_block(ch, slot, generation, &message, gave_up ? 1 : wd.timeout_ns);
	if (threadIdx.x == 0 && rc != WIC_OK && !gave_up)
		wd.raise();
	return message;
}

/*
 * block_claim() - the buffer the block writes generation @generation of @slot into, once the
 * consumers are done with the generation before it (thread 0 waits, then the barrier).
 */
__device__ inline uint8_t *block_claim(const wic::channel &ch, uint32_t slot, uint32_t generation,
				       const watchdog &wd)
{
	if (threadIdx.x == 0 && generation > 0 && !wd.raised() &&
	    wic::wait_consumed(ch, slot, generation - 1, wd.timeout_ns) != WIC_OK)
		wd.raise();
	__syncthreads();
	return wic::slot_buffer(ch, slot);
}

/*
 * load() - loads @kernel on the current device now. With lazy loading the first launch loads
 * it, and the load may wait for the device's running kernels, one of which may be waiting
 * for this one.
 */
template <typename... Params>
void load(void (*kernel)(Params...))
{
	cudaFuncAttributes attr;
	CHECK(cudaFuncGetAttributes(&attr, (const void *)kernel));
}

/* launch_cooperative() on @device: every block resident on it at once, or the launch fails. */
template <typename... Params>
void launch_on(int device, void (*kernel)(Params...), uint32_t blocks, uint32_t threads, cudaStream_t stream,
	       typename same<Params>::type... args)
{
	on_gpu g(device);
	launch_cooperative(kernel, blocks, threads, stream, args...);
}

/* A non-blocking stream on each of GPUs 0 and 1. */
class stream_pair {
public:
	stream_pair()
	{
		for (int d = 0; d < 2; d++) {
			on_gpu g(d);
			CHECK(cudaStreamCreateWithFlags(&s_[d], cudaStreamNonBlocking));
		}
	}
	stream_pair(const stream_pair &) = delete;
	stream_pair &operator=(const stream_pair &) = delete;
	~stream_pair()
	{
		for (int d = 0; d < 2; d++) {
			on_gpu g(d);
			CHECK(cudaStreamDestroy(s_[d]));
		}
	}

	cudaStream_t operator[](int d) const { return s_[d]; }
	void sync() const
	{
		for (int d = 0; d < 2; d++)
			CHECK(cudaStreamSynchronize(s_[d]));
	}

private:
	cudaStream_t s_[2] = {nullptr, nullptr};
};

/* Waits for everything queued on GPUs 0 and 1 (kernel streams do not wait for set-up copies). */
inline void sync_both()
{
	for (int d = 0; d < 2; d++) {
		on_gpu g(d);
		CHECK(cudaDeviceSynchronize());
	}
}

/* The chunks parallel_for() splits work into: one per CPU core. */
inline uint32_t cpu_chunks()
{
	return std::max(1u, std::thread::hardware_concurrency());
}

/* Runs @body(chunk, begin, end) on every CPU core, chunk c covering [c n / chunks, (c + 1) n / chunks). */
template <typename F>
void parallel_for(size_t n, F body)
{
	const uint32_t chunks = cpu_chunks();
	std::vector<std::thread> pool;
	for (uint32_t c = 1; c < chunks; c++)
		pool.emplace_back([&, c] { body(c, c * n / chunks, (c + 1) * n / chunks); });
	body(0, 0, n / chunks);
	for (std::thread &t : pool)
		t.join();
}

/* @v uniform in [0, 1), multiples of 2^-24 (exact floats), from @seed; on every core. */
inline void random_unit(uint64_t seed, std::vector<float> &v)
{
	parallel_for(v.size(), [&](uint32_t, size_t begin, size_t end) {
		for (size_t i = begin; i < end; i++)
			v[i] = (float)(mix(seed ^ i) >> 40) * 0x1p-24f;
	});
}

/*
 * publish_recorded() - for a no-wait run, the messages GPU @d took in a recorded run: item i of
 * stream s < @streams at ((@first_stream + s) * @items + i) * @words of @recorded, each in its
 * own slot of a push channel in GPU @d's memory (placement's no-wait layout, the ring's too),
 * all published when this returns.
 */
template <typename T>
std::unique_ptr<producer> publish_recorded(int d, const std::vector<T> &recorded, uint32_t streams, uint32_t items,
					   uint32_t words, uint32_t first_stream = 0)
{
	on_gpu g(d);
	const uint32_t bytes = words * sizeof(T);
	std::unique_ptr<producer> p(new producer(mode::nowait, streams, items, bytes, 1));
	for (uint32_t s = 0; s < streams; s++)
		for (uint32_t i = 0; i < items; i++)
			p->publish(s, i, [&](uint8_t *buf) {
				memcpy(buf, &recorded[((size_t)(first_stream + s) * items + i) * words], bytes);
			});
	p->flush();
	return p;
}

/*
 * one_way_run() - times a consumer kernel on GPU 0 fed by a producer kernel on GPU 1, the
 * launches given as callables: both at once (push, poll), or for nowait the producer run to its
 * end first and the consumer timed alone. Returns the milliseconds until both streams ended.
 */
template <typename Consumer, typename Producer>
double one_way_run(mode m, const stream_pair &streams, Consumer launch_consumer, Producer launch_producer)
{
	std::chrono::steady_clock::time_point start;
	if (m != mode::nowait) {
		start = std::chrono::steady_clock::now();
		launch_consumer();
		launch_producer();
	} else {
		/* Every message in GPU 0's memory before its kernel starts. */
		launch_producer();
		CHECK(cudaStreamSynchronize(streams[1]));
		start = std::chrono::steady_clock::now();
		launch_consumer();
	}
	streams.sync();
	return ms_between(start, std::chrono::steady_clock::now());
}

/*
 * one_way_pair - what a run of the applications whose GPU 1 streams to GPU 0 (G_GEM, G_KMN)
 * needs besides their data: the channel from a producer kernel on GPU 1 to a consumer kernel on
 * GPU 0 in mode @m (@streams streams of @items items of @message_bytes, placed by a ring of
 * @depth slots each, or a slot per item for nowait), a stream and a watchdog word on each GPU.
 */
class one_way_pair {
public:
	one_way_pair(mode m, uint32_t streams, uint32_t items, uint32_t depth, uint32_t message_bytes)
		: m_(m), place_{depth, items, m == mode::nowait}
	{
		CHECK(ch_.create(transport_of(m, message_bytes), 0, 1, place_.slots(streams), message_bytes, 1));
	}

	/* What both kernels take of the channel. */
	endpoint link() const { return endpoint{ch_.device(), place_}; }

	/*
	 * run() - one run: the channel and the watchdog reset and every GPU's set-up waited for,
	 * then one_way_run() of @consumer(stream, watchdog) on GPU 0 and @producer(stream, watchdog)
	 * on GPU 1, which launch the kernels. Returns its milliseconds.
	 */
	template <typename Consumer, typename Producer>
	double run(Consumer consumer, Producer producer)
	{
		CHECK(ch_.reset());
		watch_.reset();
		sync_both();
		return one_way_run(
			m_, streams_, [&] { consumer(streams_[0], watch_.on(0)); },
			[&] { producer(streams_[1], watch_.on(1)); });
	}

	/* Whether a wait of the last run timed out. */
	bool timed_out() const { return watch_.raised(); }

private:
	mode m_;
	watch_words watch_;
	stream_pair streams_;
	ring place_;
	wic::peer_channel ch_;
};

/*
 * exchange_pair - what a run of the applications whose GPUs both wait for each other (G_STN,
 * G_C2D, G_BS, G_BFS) needs besides their data: a stream, a grid barrier and a watchdog word on
 * each of GPUs 0 and 1.
 */
class exchange_pair {
public:
	exchange_pair()
	{
		for (int d = 0; d < 2; d++) {
			on_gpu g(d);
			barrier_[d].reset(new grid_counter());
		}
	}
	exchange_pair(const exchange_pair &) = delete;
	exchange_pair &operator=(const exchange_pair &) = delete;
	~exchange_pair()
	{
		for (int d = 0; d < 2; d++) {
			on_gpu g(d);
			barrier_[d].reset();
		}
	}

	/*
	 * run() - one run of both kernels: @prepare(d) readies GPU d (inputs, poison, channel resets;
	 * GPU d is current), the barriers and the watchdog are reset and all of it waited for (the
	 * kernels' streams do not wait for it), then @launch(d, stream, barrier, watchdog) starts GPU
	 * d's kernel. Returns the milliseconds from the first launch until both kernels ended.
	 */
	template <typename Prepare, typename Launch>
	double run(Prepare prepare, Launch launch)
	{
		for (int d = 0; d < 2; d++) {
			on_gpu g(d);
			prepare(d);
			barrier_[d]->reset();
		}
		watch_.reset();
		sync_both();
		const auto start = std::chrono::steady_clock::now();
		for (int d = 0; d < 2; d++)
			launch(d, streams_[d], barrier_[d]->barrier(), watch_.on(d));
		streams_.sync();
		return ms_between(start, std::chrono::steady_clock::now());
	}

	/* Whether a wait of the last run timed out. */
	bool timed_out() const { return watch_.raised(); }
	const watch_words &watch() const { return watch_; }

private:
	watch_words watch_;
	stream_pair streams_;
	std::unique_ptr<grid_counter> barrier_[2];
};

/* What one repetition of an application gave: its time, and whether its result was right. */
struct rep_result {
	double ms;
	bool correct;
};

/*
 * repeat_runs() - runs @one(rep) for rep = 0 (a warm-up, not timed) to @reps, then prints the
 * application's line (report(): @name, @m, @params, the median time of the timed repetitions,
 * whether all were right). Returns the exit status: 0 when every repetition was right, 1 if not.
 */
template <typename One>
int repeat_runs(const char *name, mode m, const std::string &params, int reps, One one)
{
	std::vector<double> times;
	bool correct = true;
	for (int rep = 0; rep <= reps; rep++) {
		const rep_result r = one(rep);
		correct &= r.correct;
		if (rep)
			times.push_back(r.ms);
	}
	report(name, m, params, times, correct);
	return correct ? 0 : 1;
}

/*
 * halo_exchange_run() - the timed run of a halo exchange between GPUs 0 and 1 whose kernels take
 * one incoming and one outgoing endpoint each. @run(in, out, send, record) runs both kernels once
 * through @pair and returns its milliseconds. push, poll, tagged: one run through the
 * @exchange_in/@exchange_out channels. nowait: an untimed recording run first; then every
 * message GPU d received (@logged Ts at @log[d]) is published into its memory by
 * @publish_replayed(d, recorded) and both kernels are timed with nothing to wait for and nothing
 * to send. Sets *@failed when a wait of either run timed out.
 */
template <typename T, typename Run, typename Publish>
double halo_exchange_run(mode m, const exchange_pair &pair, Run run, const endpoint (&exchange_in)[2],
			 const endpoint (&exchange_out)[2], T *const (&log)[2], size_t logged, const ring &replayed,
			 Publish publish_replayed, bool *failed)
{
	if (m != mode::nowait) {
		const double ms = run(exchange_in, exchange_out, true, false);
		*failed = pair.timed_out();
		return ms;
	}
	run(exchange_in, exchange_out, true, true);
	*failed = pair.timed_out();
	std::unique_ptr<producer> recorded_by[2];
	endpoint given[2];
	std::vector<T> recorded(logged);
	for (int d = 0; d < 2; d++) {
		CHECK(cudaMemcpy(recorded.data(), log[d], logged * sizeof(T), cudaMemcpyDeviceToHost));
		recorded_by[d] = publish_replayed(d, recorded);
		given[d] = endpoint{recorded_by[d]->channel(), replayed};
	}
	const endpoint none[2] = {};
	const double ms = run(given, none, false, false);
	*failed |= pair.timed_out();
	for (int d = 0; d < 2; d++) {
		on_gpu g(d);
		recorded_by[d].reset();
	}
	return ms;
}

/*
 * halo_exchange - the host side of the applications that split an n x n grid by rows between
 * GPUs 0 and 1 and exchange the rows next to the split at every step (G_STN, G_C2D): on each GPU
 * its half twice (before and after a step), what a recording run received, and the channel
 * carrying its edge row to the other GPU, @streams messages of @words floats per step, @depth
 * slots each; one run of @kernel on both. A Half tells a GPU's rows: row0, cells().
 */
template <typename Half>
class halo_exchange {
public:
	using kernel_type = void (*)(endpoint, endpoint, bool, Half, float *, uint32_t, grid_barrier, watchdog, float *);
	/* Slots per stream and direction: a GPU may send two steps ahead of the other's reads. */
	static constexpr uint32_t depth = 2;

	halo_exchange(mode m, kernel_type kernel, const Half (&halves)[2], uint32_t n, uint32_t steps, uint32_t streams,
		      uint32_t words, uint32_t blocks, uint32_t threads)
		: m_(m), kernel_(kernel), halves_{halves[0], halves[1]}, n_(n), steps_(steps), streams_(streams),
		  words_(words), blocks_(blocks), threads_(threads), logged_((size_t)streams * steps * words),
		  live_{depth, steps, false}, replayed_{depth, steps, true}
	{
		for (int d = 0; d < 2; d++) {
			u_[d] = alloc_on<float>(d, 2 * halves_[d].cells());
			log_[d] = m == mode::nowait ? alloc_on<float>(d, logged_) : nullptr;
			on_gpu g(d);
			load(kernel);
		}
		/* to_[d] carries GPU d's edge row to GPU 1 - d. nowait records with push. */
		for (int d = 0; d < 2; d++)
			CHECK(to_[d].create(transport_of(m, words * sizeof(float)), 1 - d, d, live_.slots(streams),
					    words * sizeof(float), 1));
	}
	halo_exchange(const halo_exchange &) = delete;
	halo_exchange &operator=(const halo_exchange &) = delete;
	~halo_exchange()
	{
		for (int d = 0; d < 2; d++) {
			to_[d].destroy();
			free_on(d, u_[d]);
			if (log_[d])
				free_on(d, log_[d]);
		}
	}

	/*
	 * run() - the steps from the grid @u0 (row-major), the result in @got; in nowait mode
	 * through halo_exchange_run(). The other buffer of each half and every slot are poisoned
	 * (NaN) first, so a row read before it was written shows. Sets *@failed when a wait timed
	 * out; returns the milliseconds of the timed run.
	 */
	double run(const std::vector<float> &u0, std::vector<float> &got, bool *failed)
	{
		auto once = [&](const endpoint (&in)[2], const endpoint (&out)[2], bool send, bool record) {
			auto prepare = [&](int d) {
				const size_t cells = halves_[d].cells();
				CHECK(cudaMemcpy(u_[d], &u0[(size_t)halves_[d].row0 * n_], cells * sizeof(float),
						 cudaMemcpyHostToDevice));
				CHECK(cudaMemset(u_[d] + cells, 0xff, cells * sizeof(float)));
				if (record)
					CHECK(cudaMemset(log_[d], 0, logged_ * sizeof(float)));
				CHECK(to_[d].reset());
				const wic::channel ch = to_[d].device();
				on_gpu consumer(1 - d);
				CHECK(cudaMemset(const_cast<uint8_t *>(ch.data), 0xff, (size_t)ch.slots * ch.batch_bytes));
			};
			auto launch = [&](int d, cudaStream_t stream, grid_barrier barrier, watchdog wd) {
				launch_on(d, kernel_, blocks_, threads_, stream, in[d], out[d], send, halves_[d], u_[d],
					  steps_, barrier, wd, record ? log_[d] : nullptr);
			};
			return pair_.run(prepare, launch);
		};
		const endpoint in[2] = {{to_[1].device(), live_}, {to_[0].device(), live_}};
		const endpoint out[2] = {{to_[0].device(), live_}, {to_[1].device(), live_}};
		/* nowait: every row GPU d received, published into its memory before its kernel starts. */
		const double ms = halo_exchange_run(
			m_, pair_, once, in, out, log_, logged_, replayed_,
			[&](int d, const std::vector<float> &recorded) {
				return publish_recorded(d, recorded, streams_, steps_, words_);
			},
			failed);
		for (int d = 0; d < 2; d++)
			CHECK(cudaMemcpy(&got[(size_t)halves_[d].row0 * n_], u_[d] + (steps_ % 2) * halves_[d].cells(),
					 halves_[d].cells() * sizeof(float), cudaMemcpyDeviceToHost));
		return ms;
	}

private:
	mode m_;
	kernel_type kernel_;
	Half halves_[2];
	uint32_t n_, steps_, streams_, words_, blocks_, threads_;
	size_t logged_;
	ring live_, replayed_;
	exchange_pair pair_;
	float *u_[2] = {nullptr, nullptr};
	float *log_[2] = {nullptr, nullptr};
	wic::peer_channel to_[2];
};

} /* namespace app */

#endif /* WIC_APPS_PEER_CUH */
