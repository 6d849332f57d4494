/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_KMN - k-means (Rodinia kmeans) on two GPUs, unidirectional model, streaming pattern: POINTS
 * points of 32 features, small integers 0 .. 255 stored as floats, drawn around 16 random
 * centres (fresh every run). GPU 0 holds the first half of the points, GPU 1 the rest. There
 * are ROUNDS rounds; round r is one k-means (Lloyd) iteration for 16 clusters from its own
 * initial centroids, 16 distinct points picked at random (Rodinia restarts from random initial
 * centroids; each round here is such a restart cut to its first iteration, since a second would
 * need GPU 0's result on GPU 1, a message the other way). The centroids of every round are
 * given to both GPUs before the run, so data flows only from GPU 1 to GPU 0 (the consumed
 * reports of flow control aside).
 *
 * One persistent kernel on each GPU (a cooperative launch: all its blocks resident) runs every
 * round: it assigns each of its points to the nearest centroid (squared distance, the lowest
 * index on ties) in batches of BATCH points, batch i in block i % blocks, and sums each batch
 * per cluster: features, points, squared distances. GPU 1, the producer, sends each batch's
 * sums as one message into GPU 0's memory through a channel: its block b writes them over the
 * peer link and wic::publish()es them in slot b's ring of 4 (so it runs at most 4 batches
 * ahead), after wic::wait_consumed(). GPU 0, the consumer, adds up its own batches' sums (work
 * that needs nothing from GPU 1) and, in between, GPU 1's: its block b takes block b's messages
 * with wic::recv_block() and reports each consumed (wic::consumed()). After the last round GPU 0
 * computes every round's new centroids: the mean of the points that chose a centroid, or the
 * centroid itself where none did. Features are integers, so every distance and per-batch sum is
 * an integer below 2^24, exact in float: the GPUs assign every point as the CPU reference (in
 * double and integers) does, and the counts and squared distances must match it exactly, the
 * centroids to float rounding.
 *
 * push: the ready words are in GPU 0's memory, its warps wait with backoff. poll
 * (spinning): they are in GPU 1's memory, GPU 0's warps spin on them across the link.
 * nowait: GPU 1's kernel runs to its end first, each message in a slot of its own; then GPU 0's
 * kernel starts and is timed alone (the consumer with every message already there).
 *
 * Usage: g_kmn MODE [REPS] [POINTS] [ROUNDS] [BATCH]   (MODE: push, poll, alg1, tagged, picked, nowait; POINTS
 * defaults to 1048576, ROUNDS to 16, BATCH to 512 (32 to 1024), REPS to 7; one block of 512
 * threads per SM on each GPU, one warp of each of GPU 0's blocks waiting, so poll spins with one
 * warp per SM)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 */
#include <climits>
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t features = G_KMN_FEATURES;
constexpr uint32_t clusters = G_KMN_CLUSTERS;
constexpr uint32_t threads = 512;
constexpr uint32_t groups = threads / features; /* threads that sum the same feature */
constexpr uint32_t most_batch = 1024;
constexpr uint32_t depth = 4; /* slots per producer block */

/* One batch's sums per cluster: one message from GPU 1. */
struct partial {
	float sum[clusters][features];
	uint32_t count[clusters];
	unsigned long long sse;
};
constexpr uint32_t message_bytes = sizeof(partial);
static_assert(message_bytes == G_KMN_CLUSTERS * (G_KMN_FEATURES + 1) * 4 + 8, "the message the emulator describes");
static_assert(sizeof(partial) % sizeof(uint32_t) == 0, "messages are copied in words");

/* The shared memory batch_partial() works in. */
struct scratch {
	float acc[groups][clusters][features];
	uint8_t member[most_batch];
};

/* A round's centroids into shared memory, once the block is done with the round before's. */
__device__ inline void load_centroids(float (&c)[clusters][features], const float *from)
{
	__syncthreads();
	for (uint32_t e = threadIdx.x; e < clusters * features; e += blockDim.x)
		c[e / features][e % features] = from[e];
	__syncthreads();
}

/*
 * batch_partial() - the sums of a batch of @count points at @points (point-major) into @out:
 * each thread assigns its points to the nearest centroid of @c; then thread (g, f) sums feature
 * f of points g, g + groups, ... per cluster, without atomics, and the groups' sums are added.
 * Every value is an integer below 2^24, so the order of the additions does not matter. The
 * block has `threads` threads.
 */
__device__ void batch_partial(const float *points, uint32_t count, const float (&c)[clusters][features],
			      partial &out, scratch &s)
{
	const uint32_t f = threadIdx.x % features, g = threadIdx.x / features;
	unsigned long long sse = 0;

	for (uint32_t k = 0; k < clusters; k++)
		s.acc[g][k][f] = 0.0f;
	if (threadIdx.x < clusters)
		out.count[threadIdx.x] = 0;
	if (threadIdx.x == 0)
		out.sse = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < count; i += blockDim.x) {
		const float4 *p = reinterpret_cast<const float4 *>(points + (size_t)i * features);
		float x[features];
#pragma unroll
		for (uint32_t q = 0; q < features / 4; q++) {
			const float4 v = p[q];
			x[4 * q] = v.x;
			x[4 * q + 1] = v.y;
			x[4 * q + 2] = v.z;
			x[4 * q + 3] = v.w;
		}
		float best = 0.0f;
		uint32_t nearest = 0;
		for (uint32_t k = 0; k < clusters; k++) {
			float d2 = 0.0f;
#pragma unroll
			for (uint32_t q = 0; q < features; q++) {
				const float diff = x[q] - c[k][q];
				d2 = fmaf(diff, diff, d2);
			}
			if (k == 0 || d2 < best) {
				best = d2;
				nearest = k;
			}
		}
		s.member[i] = nearest;
		atomicAdd(&out.count[nearest], 1u);
		sse += (unsigned long long)best;
	}
	for (int d = 16; d; d /= 2)
		sse += __shfl_down_sync(0xffffffff, sse, d);
	if (threadIdx.x % 32 == 0)
		atomicAdd(&out.sse, sse);
	__syncthreads();
	for (uint32_t i = g; i < count; i += groups)
		s.acc[g][s.member[i]][f] += points[(size_t)i * features + f];
	__syncthreads();
	for (uint32_t e = threadIdx.x; e < clusters * features; e += blockDim.x) {
		float sum = 0.0f;
		for (uint32_t q = 0; q < groups; q++)
			sum += s.acc[q][e / features][e % features];
		out.sum[e / features][e % features] = sum;
	}
	__syncthreads();
}

/* How many of @count points batch @i has. */
__host__ __device__ inline uint32_t batch_size(uint32_t count, uint32_t batch, uint32_t i)
{
	return count - i * batch < batch ? count - i * batch : batch;
}

/*
 * produce() - GPU 1: in every round, block b sends the sums of batches b, b + gridDim.x, ... of
 * its @count points, in that order, as items 0, 1, ... (counted over the rounds) of stream b of
 * @out. @centroids: every round's initial centroids.
 */
__global__ void produce(app::endpoint out, const float *points, uint32_t count, uint32_t batch,
			const float *centroids, uint32_t rounds, app::watchdog wd)
{
	__shared__ float c[clusters][features];
	__shared__ partial part;
	__shared__ scratch s;
	const uint32_t batches = (count + batch - 1) / batch;
	uint32_t g = 0;

	for (uint32_t r = 0; r < rounds; r++) {
		load_centroids(c, centroids + (size_t)r * clusters * features);
		for (uint32_t i = blockIdx.x; i < batches; i += gridDim.x, g++) {
			batch_partial(points + (size_t)i * batch * features, batch_size(count, batch, i), c, part, s);
			const uint32_t slot = out.place.slot(blockIdx.x, g), gen = out.place.generation(g);
			uint32_t *to = reinterpret_cast<uint32_t *>(app::block_claim(out.ch, slot, gen, wd));
			const uint32_t *from = reinterpret_cast<const uint32_t *>(&part);
			for (uint32_t w = threadIdx.x; w < message_bytes / sizeof(uint32_t); w += blockDim.x)
				to[w] = from[w];
			wic::publish_block(out.ch, slot, gen);
		}
	}
}

/* A consumer block's sums of one round; thread e keeps entry e. */
struct block_sums {
	double sum[clusters][features];
	unsigned long long count[clusters];
	unsigned long long sse;
};

/* Adds a batch's sums (GPU 0's in shared memory, or GPU 1's message) to the block's. */
__device__ inline void add(block_sums &acc, const partial &p)
{
	for (uint32_t e = threadIdx.x; e < clusters * features; e += blockDim.x)
		acc.sum[e / features][e % features] += p.sum[e / features][e % features];
	if (threadIdx.x < clusters)
		acc.count[threadIdx.x] += p.count[threadIdx.x];
	if (threadIdx.x == 0)
		acc.sse += p.sse;
}

/* Every round's sums, in GPU 0's memory: the blocks add theirs (zeroed before each run). */
struct totals {
	double *sum;		   /* [rounds][clusters][features] */
	unsigned long long *count; /* [rounds][clusters] */
	unsigned long long *sse;   /* [rounds] */
};

/* Every round's results, in GPU 0's memory (poisoned before each run). */
struct results {
	float *centroids; /* [rounds][clusters][features] */
	unsigned long long *count;
	unsigned long long *sse;
};

/*
 * consume() - GPU 0: in every round, block b sums its batches b, b + gridDim.x, ... of its
 * @count points and, after each, takes the next message of stream b of @in (GPU 1's batch of
 * the same index, of @theirs points), then adds its round's sums to @sum. After the last round
 * it writes every round's centroids, counts and squared distances into @res.
 */
__global__ void consume(app::endpoint in, const float *points, uint32_t count, uint32_t theirs, uint32_t batch,
			const float *centroids, uint32_t rounds, totals sum, results res, app::grid_barrier grid,
			app::watchdog wd)
{
	__shared__ float c[clusters][features];
	__shared__ partial part;
	__shared__ scratch s;
	__shared__ block_sums acc;
	const uint32_t mine = (count + batch - 1) / batch, others = (theirs + batch - 1) / batch;
	uint32_t g = 0;

	for (uint32_t r = 0; r < rounds; r++) {
		load_centroids(c, centroids + (size_t)r * clusters * features);
		for (uint32_t e = threadIdx.x; e < clusters * features; e += blockDim.x)
			acc.sum[e / features][e % features] = 0.0;
		if (threadIdx.x < clusters)
			acc.count[threadIdx.x] = 0;
		if (threadIdx.x == 0)
			acc.sse = 0;
		for (uint32_t i = blockIdx.x; i < mine || i < others; i += gridDim.x) {
			if (i < mine) {
				batch_partial(points + (size_t)i * batch * features, batch_size(count, batch, i), c,
					      part, s);
				add(acc, part);
			}
			if (i < others) {
				const uint32_t slot = in.place.slot(blockIdx.x, g), gen = in.place.generation(g);
				add(acc, *reinterpret_cast<const partial *>(app::block_recv(in.ch, slot, gen, wd)));
				app::block_consumed(in.ch, slot, gen);
				g++;
			}
		}
		const size_t base = (size_t)r * clusters;
		for (uint32_t e = threadIdx.x; e < clusters * features; e += blockDim.x)
			atomicAdd(&sum.sum[base * features + e], acc.sum[e / features][e % features]);
		if (threadIdx.x < clusters)
			atomicAdd(&sum.count[base + threadIdx.x], acc.count[threadIdx.x]);
		if (threadIdx.x == 0)
			atomicAdd(&sum.sse[r], acc.sse);
	}
	grid.sync(); /* every block's sums are in */

	const size_t stride = (size_t)gridDim.x * blockDim.x, first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	for (size_t e = first; e < (size_t)rounds * clusters * features; e += stride) {
		const unsigned long long n = sum.count[e / features];
		res.centroids[e] = n ? (float)(sum.sum[e] / (double)n) : centroids[e];
	}
	for (size_t e = first; e < (size_t)rounds * clusters; e += stride)
		res.count[e] = sum.count[e];
	for (size_t e = first; e < rounds; e += stride)
		res.sse[e] = sum.sse[e];
}

/* One round of the CPU reference. */
struct round_ref {
	std::vector<double> centroids;
	std::vector<uint64_t> count;
	uint64_t sse;
};

/*
 * reference() - every round on the CPU: @x holds @points points of features each, @initial
 * every round's initial centroids. Distances and sums in integers (exact), the means in double.
 */
std::vector<round_ref> reference(const std::vector<uint8_t> &x, uint32_t points, const std::vector<uint8_t> &initial,
				 uint32_t rounds)
{
	std::vector<round_ref> out(rounds);
	const uint32_t chunks = app::cpu_chunks();

	for (uint32_t r = 0; r < rounds; r++) {
		const uint8_t *c = &initial[(size_t)r * clusters * features];
		std::vector<std::vector<int64_t>> sum(chunks, std::vector<int64_t>(clusters * features + clusters + 1));
		app::parallel_for(points, [&](uint32_t chunk, size_t begin, size_t end) {
			int64_t *s = sum[chunk].data(), *count = s + clusters * features, *sse = count + clusters;
			for (size_t i = begin; i < end; i++) {
				const uint8_t *p = &x[i * features];
				int best = INT_MAX;
				uint32_t nearest = 0;
				for (uint32_t k = 0; k < clusters; k++) {
					int d2 = 0;
					for (uint32_t f = 0; f < features; f++) {
						const int diff = (int)p[f] - (int)c[k * features + f];
						d2 += diff * diff;
					}
					if (d2 < best) {
						best = d2;
						nearest = k;
					}
				}
				for (uint32_t f = 0; f < features; f++)
					s[nearest * features + f] += p[f];
				count[nearest]++;
				*sse += best;
			}
		});
		round_ref &ref = out[r];
		ref.centroids.assign(clusters * features, 0.0);
		ref.count.assign(clusters, 0);
		ref.sse = 0;
		std::vector<int64_t> total(clusters * features + clusters + 1, 0);
		for (const std::vector<int64_t> &part : sum)
			for (size_t e = 0; e < total.size(); e++)
				total[e] += part[e];
		for (uint32_t k = 0; k < clusters; k++) {
			ref.count[k] = total[clusters * features + k];
			for (uint32_t f = 0; f < features; f++) {
				const size_t e = k * features + f;
				ref.centroids[e] = ref.count[k] ? (double)total[e] / (double)ref.count[k] : (double)c[e];
			}
		}
		ref.sse = total[clusters * features + clusters];
	}
	return out;
}

/*
 * make_input() - @points points around 16 random centres (triangular noise of +-63, clamped to
 * 0 .. 255) into @x, and into @initial every round's initial centroids: 16 distinct points.
 */
void make_input(std::mt19937_64 &rng, uint32_t points, uint32_t rounds, std::vector<uint8_t> &x,
		std::vector<uint8_t> &initial)
{
	std::uniform_int_distribution<int> centre_value(48, 207);
	std::vector<int> centre(clusters * features);
	for (int &v : centre)
		v = centre_value(rng);
	const uint64_t seed = rng();
	app::parallel_for(points, [&](uint32_t, size_t begin, size_t end) {
		for (size_t i = begin; i < end; i++) {
			const uint64_t h = app::mix(seed ^ i);
			const int *at = &centre[(h % clusters) * features];
			for (uint32_t f = 0; f < features; f++) {
				const uint64_t n = app::mix(h + f);
				const int v = at[f] + (int)(n & 63) + (int)(n >> 6 & 63) - 63;
				x[i * features + f] = (uint8_t)std::min(255, std::max(0, v));
			}
		}
	});
	std::uniform_int_distribution<uint32_t> any(0, points - 1);
	for (uint32_t r = 0; r < rounds; r++) {
		uint32_t picked[clusters];
		for (uint32_t k = 0; k < clusters; k++) {
			bool again;
			do {
				picked[k] = any(rng);
				again = std::find(picked, picked + k, picked[k]) != picked + k;
			} while (again);
			memcpy(&initial[((size_t)r * clusters + k) * features], &x[(size_t)picked[k] * features],
			       features);
		}
	}
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[POINTS] [ROUNDS] [BATCH]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t points = cli.size(0, G_KMN_POINTS);
	const uint32_t rounds = cli.size(1, G_KMN_ROUNDS);
	const uint32_t batch = cli.size(2, G_KMN_BATCH);
	app::two_gpus("G_KMN");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || points < 2 * clusters || points > (1u << 26) || !rounds || rounds > 1024 || batch < 32 ||
	    batch > most_batch) {
		fprintf(stderr, "REPS must be positive, POINTS between %u and 2^26, ROUNDS between 1 and 1024, BATCH "
				"between 32 and %u\n",
			2 * clusters, most_batch);
		return 2;
	}
	/* GPU 0's points, then GPU 1's. */
	const uint32_t count[2] = {points / 2, points - points / 2};
	const uint32_t their_batches = (count[1] + batch - 1) / batch;
	const uint32_t items = rounds * ((their_batches + blocks - 1) / blocks); /* most items of a stream */
	const size_t centroid_floats = (size_t)rounds * clusters * features;
	float *x[2], *initial[2];
	for (int d = 0; d < 2; d++) {
		x[d] = app::alloc_on<float>(d, (size_t)count[d] * features);
		initial[d] = app::alloc_on<float>(d, centroid_floats);
	}
	const totals sum{app::alloc_on<double>(0, centroid_floats),
			 app::alloc_on<unsigned long long>(0, (size_t)rounds * clusters),
			 app::alloc_on<unsigned long long>(0, rounds)};
	const results res{app::alloc_on<float>(0, centroid_floats),
			  app::alloc_on<unsigned long long>(0, (size_t)rounds * clusters),
			  app::alloc_on<unsigned long long>(0, rounds)};
	std::unique_ptr<app::grid_counter> barrier;
	{
		app::on_gpu g(0);
		barrier.reset(new app::grid_counter());
		app::load(consume);
	}
	{
		app::on_gpu g(1);
		app::load(produce);
	}
	app::one_way_pair pair(mode, blocks, items, depth, message_bytes);
	const app::endpoint link = pair.link();
	std::vector<uint8_t> x8((size_t)points * features), initial8(centroid_floats);
	std::vector<float> xf(x8.size()), initialf(initial8.size()), centroids(centroid_floats);
	std::vector<unsigned long long> counts((size_t)rounds * clusters), sses(rounds);
	std::random_device entropy;

	auto one = [&](int rep) {
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		make_input(rng, points, rounds, x8, initial8);
		std::copy(x8.begin(), x8.end(), xf.begin());
		std::copy(initial8.begin(), initial8.end(), initialf.begin());
		for (int d = 0; d < 2; d++) {
			const size_t first = d ? (size_t)count[0] * features : 0, floats = (size_t)count[d] * features;
			CHECK(cudaMemcpy(x[d], &xf[first], floats * sizeof(float), cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy(initial[d], initialf.data(), centroid_floats * sizeof(float),
					 cudaMemcpyHostToDevice));
		}
		{
			app::on_gpu g(0);
			CHECK(cudaMemset(sum.sum, 0, centroid_floats * sizeof(double)));
			CHECK(cudaMemset(sum.count, 0, (size_t)rounds * clusters * sizeof(unsigned long long)));
			CHECK(cudaMemset(sum.sse, 0, rounds * sizeof(unsigned long long)));
			/* poison: NaN centroids, all-ones counts */
			CHECK(cudaMemset(res.centroids, 0xff, centroid_floats * sizeof(float)));
			CHECK(cudaMemset(res.count, 0xff, (size_t)rounds * clusters * sizeof(unsigned long long)));
			CHECK(cudaMemset(res.sse, 0xff, rounds * sizeof(unsigned long long)));
			barrier->reset();
		}
		auto consumer = [&](cudaStream_t stream, app::watchdog wd) {
			app::launch_on(0, consume, blocks, threads, stream, link, x[0], count[0], count[1], batch,
				       initial[0], rounds, sum, res, barrier->barrier(), wd);
		};
		auto producer = [&](cudaStream_t stream, app::watchdog wd) {
			app::launch_on(1, produce, blocks, threads, stream, link, x[1], count[1], batch, initial[1], rounds,
				       wd);
		};
		const double ms = pair.run(consumer, producer);
		const bool failed = pair.timed_out();

		const size_t ull = sizeof(unsigned long long);
		CHECK(cudaMemcpy(centroids.data(), res.centroids, centroid_floats * sizeof(float),
				 cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(counts.data(), res.count, counts.size() * ull, cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(sses.data(), res.sse, sses.size() * ull, cudaMemcpyDeviceToHost));
		const std::vector<round_ref> ref = reference(x8, points, initial8, rounds);
		double worst = 0;
		size_t count_errors = 0, sse_errors = 0;
		for (uint32_t r = 0; r < rounds; r++) {
			const double e = app::relative_error(&centroids[(size_t)r * clusters * features],
							      ref[r].centroids.data(), clusters * features);
			if (!std::isnan(worst) && !(e <= worst))
				worst = e; /* NaN stays */
			for (uint32_t k = 0; k < clusters; k++)
				count_errors += counts[(size_t)r * clusters + k] != ref[r].count[k];
			sse_errors += sses[r] != ref[r].sse;
		}
		/* the centroids: a double mean rounded to float */
		const bool correct = !failed && !count_errors && !sse_errors && worst < 1e-6;
		if (!correct)
			fprintf(stderr,
				"G_KMN %s rep %d: %s, %zu counts and %zu squared-distance sums differ, centroids' "
				"relative error %g\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out",
				count_errors, sse_errors, worst);
		return app::rep_result{ms, correct};
	};
	const int status = app::repeat_runs("G_KMN", mode,
					    "points=" + std::to_string(points) + " features=" + std::to_string(features) +
						    " clusters=" + std::to_string(clusters) +
						    " rounds=" + std::to_string(rounds) + " batch=" + std::to_string(batch) +
						    " blocks=" + std::to_string(blocks) + " gpus=0,1",
					    reps, one);
	for (int d = 0; d < 2; d++) {
		app::free_on(d, x[d]);
		app::free_on(d, initial[d]);
	}
	for (void *p : {(void *)sum.sum, (void *)sum.count, (void *)sum.sse, (void *)res.centroids, (void *)res.count,
			(void *)res.sse})
		app::free_on(0, p);
	{
		app::on_gpu g(0);
		barrier.reset();
	}
	return status;
}
