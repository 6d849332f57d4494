/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * peer.cuh - what the inter-GPU applications share: the two GPUs (peer access, or exit 77);
 * where item g of stream b lives in a channel a kernel produces (ring); the block-level steps
 * of a GPU producer (claim a slot; wic::publish_block() publishes it) and of a consumer (receive, report consumed);
 * the watchdog that ends both kernels when a wait times out instead of leaving them waiting
 * for each other; cooperative launches on a given GPU; the recorded messages a no-wait run
 * publishes; a parallel loop for CPU references.
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
	/* After a failure nothing waits: the run is wrong already and only has to end. */
	const bool gave_up = wd.raised();
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
 * halo_exchange_run() - the timed run of a halo exchange between GPUs 0 and 1 whose kernels take
 * one incoming and one outgoing endpoint each. @run(in, out, send, record) runs both kernels once
 * and returns its milliseconds. push, poll: one run through the @exchange_in/@exchange_out
 * channels. nowait: an untimed recording run first; then every message GPU d received
 * (@logged Ts at @log[d]) is published into its memory by @publish_replayed(d, recorded) and
 * both kernels are timed with nothing to wait for and nothing to send. Sets *@failed when a wait
 * of either run timed out.
 */
template <typename T, typename Run, typename Publish>
double halo_exchange_run(mode m, const watch_words &watch, Run run, const endpoint (&exchange_in)[2],
			 const endpoint (&exchange_out)[2], T *const (&log)[2], size_t logged, const ring &replayed,
			 Publish publish_replayed, bool *failed)
{
	if (m != mode::nowait) {
		const double ms = run(exchange_in, exchange_out, true, false);
		*failed = watch.raised();
		return ms;
	}
	run(exchange_in, exchange_out, true, true);
	*failed = watch.raised();
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
	*failed |= watch.raised();
	for (int d = 0; d < 2; d++) {
		on_gpu g(d);
		recorded_by[d].reset();
	}
	return ms;
}

} /* namespace app */

#endif /* WIC_APPS_PEER_CUH */
