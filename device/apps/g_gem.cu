/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_GEM - matrix multiplication (Polybench gemm, C = alpha A B + beta C with Polybench/C's
 * alpha = 1.5, beta = 1.2) on two GPUs, multiple-communication model, streaming pattern: N x N
 * matrices A, B and C of random values in [0, 1) (fresh every run) and ITERATIONS passes, each
 * pass's C the next one's input. Pass t multiplies by B with its columns rotated by t,
 * B_t[k][j] = B[k][(j + t) mod N], so that every pass's products differ (a stale tile would
 * show) while the CPU reference computes A B once:
 *	C_{t+1} = alpha A B_t + beta C_t,	C_0 = C.
 *
 * The product is split along K: GPU 0 holds columns 0 .. N/2 - 1 of A and rows 0 .. N/2 - 1 of
 * B, GPU 1 the other halves; C lives on GPU 0. Each GPU runs one persistent kernel (a
 * cooperative launch: all its blocks resident) whose block b takes the 64 x 64 tiles of C
 * b, b + blocks, ... (row-major order of tiles) in every pass. GPU 1, the producer, computes its
 * half of each of its tiles' product (A[rows, N/2:] B_t[N/2:, cols]) and sends it as one message
 * of 16 KB into GPU 0's memory through a channel: its block b writes the tile over the peer link
 * and wic::publish()es it in slot b's ring of 4 (so it runs at most 4 tiles ahead), after
 * wic::wait_consumed(). GPU 0, the consumer, computes its own half of the same tile's product
 * (work that needs nothing from GPU 1), then its block b takes block b's next message with
 * wic::recv_block(), writes C's tile, alpha (its half + GPU 1's half) + beta C_t, and reports the
 * message consumed (wic::consumed()). So every pass streams all N^2 / 4096 tiles from GPU 1 to
 * GPU 0, several messages per block and pass, and nothing goes back but the consumed reports.
 * Both halves are a simple shared-memory tiled float GEMM (no cuBLAS): 256 threads per block,
 * each accumulating 4 x 4 elements of the tile with fmaf over K in steps of 32.
 *
 * The result is checked against a CPU reference in double (A B once, then the passes), element
 * by element: every term is positive, so a float sum of m products is within m 2^-24 of the exact
 * one; with the few roundings a pass adds, the relative error of every element must stay below
 * (N + 4 ITERATIONS) 2^-24 (float rounding leaves about 1e-6). A stale tile (the pass before's,
 * each column its neighbour's product) is off by far more (at N = 2048, 2.6e-3 and up: 20 times
 * the tolerance), a missing one more still; C is poisoned (NaN) before each run, and so are the
 * channel's slots.
 *
 * push: the ready words are in GPU 0's memory, its warps wait with backoff. poll
 * (spinning): they are in GPU 1's memory, GPU 0's warps spin on them across the link.
 * nowait: GPU 1's kernel runs to its end first, each message in a slot of its own; then GPU 0's
 * kernel starts and is timed alone (the consumer with every message already there).
 *
 * Usage: g_gem MODE [REPS] [N] [ITERATIONS]   (MODE: push, poll, alg1, tagged, picked, nowait; N (a multiple of 64,
 * 64 to 8192) defaults to 2048, ITERATIONS (1 to 64) to 8, REPS to 7; one block of 256 threads
 * per SM on each GPU, one warp of each of GPU 0's blocks waiting, so poll spins with one warp
 * per SM)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 */
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t tile = G_GEM_TILE; /* C tiles are tile x tile */
constexpr uint32_t step = 32;	 /* K per shared-memory stage */
constexpr uint32_t threads = 256; /* 16 x 16, each 4 x 4 elements of a tile */
constexpr uint32_t depth = 4;	 /* slots per producer block */
constexpr uint32_t most_iterations = 64;
constexpr float alpha = 1.5f, beta = 1.2f;
constexpr uint32_t message_bytes = tile * tile * sizeof(float);
static_assert(threads == (tile / 4) * (tile / 4), "each thread keeps 4 x 4 elements");

/* One stage of a tile's operands: A transposed (k-major, padded: conflict-free stores), B. */
struct operands {
	float a[step][tile + 1];
	float b[step][tile];
};

/*
 * product() - one GPU's half of the tile of A B_t at rows @row0, columns @col0: @a holds the
 * GPU's @kc columns of A (N rows, row-major), @b its @kc rows of B (row-major, @n columns);
 * column j of B_t is column (j + @shift) mod @n of B. Thread (y, x) = (threadIdx.x / 16,
 * threadIdx.x % 16) gets element (y + 16 i, x + 16 j) of the tile in @acc[i][j]: neighbouring
 * threads read neighbouring columns of B, and the few rows of A they share are broadcasts.
 */
__device__ void product(const float *a, const float *b, uint32_t n, uint32_t kc, uint32_t row0, uint32_t col0,
			uint32_t shift, float (&acc)[4][4], operands &s)
{
	const uint32_t x = threadIdx.x % 16, y = threadIdx.x / 16;

	for (uint32_t i = 0; i < 4; i++)
		for (uint32_t j = 0; j < 4; j++)
			acc[i][j] = 0.0f;
	for (uint32_t k0 = 0; k0 < kc; k0 += step) {
		for (uint32_t e = threadIdx.x; e < tile * step; e += blockDim.x) {
			uint32_t col = col0 + e % tile + shift;
			if (col >= n)
				col -= n;
			s.a[e % step][e / step] = a[(size_t)(row0 + e / step) * kc + k0 + e % step];
			s.b[e / tile][e % tile] = b[(size_t)(k0 + e / tile) * n + col];
		}
		__syncthreads();
#pragma unroll
		for (uint32_t k = 0; k < step; k++) {
			float u[4], v[4];
			for (uint32_t i = 0; i < 4; i++) {
				u[i] = s.a[k][y + 16 * i];
				v[i] = s.b[k][x + 16 * i];
			}
			for (uint32_t i = 0; i < 4; i++)
				for (uint32_t j = 0; j < 4; j++)
					acc[i][j] = fmaf(u[i], v[j], acc[i][j]);
		}
		__syncthreads(); /* the next stage overwrites s */
	}
}

/* Where thread (y, x)'s element (i, j) is within a tile. */
__device__ inline uint32_t in_tile(uint32_t i, uint32_t j)
{
	return (threadIdx.x / 16 + 16 * i) * tile + threadIdx.x % 16 + 16 * j;
}

/*
 * produce() - GPU 1: in every pass t, block b sends its half of the product of tiles b,
 * b + gridDim.x, ..., in that order, as items 0, 1, ... (counted over the passes) of stream b
 * of @out; each message is the tile, row-major.
 */
__global__ void produce(app::endpoint out, const float *a, const float *b, uint32_t n, uint32_t kc,
			uint32_t iterations, app::watchdog wd)
{
	__shared__ operands s;
	const uint32_t across = n / tile, tiles = across * across;
	uint32_t g = 0;

	for (uint32_t t = 0; t < iterations; t++)
		for (uint32_t i = blockIdx.x; i < tiles; i += gridDim.x, g++) {
			float acc[4][4];
			product(a, b, n, kc, i / across * tile, i % across * tile, t % n, acc, s);
			const uint32_t slot = out.place.slot(blockIdx.x, g), gen = out.place.generation(g);
			float *to = reinterpret_cast<float *>(app::block_claim(out.ch, slot, gen, wd));
			for (uint32_t r = 0; r < 4; r++)
				for (uint32_t c = 0; c < 4; c++)
					to[in_tile(r, c)] = acc[r][c];
			wic::publish_block(out.ch, slot, gen);
		}
}

/*
 * consume() - GPU 0: in every pass t, block b computes its half of the product of tiles b,
 * b + gridDim.x, ..., takes GPU 1's half of the same tile (the next message of stream b of @in)
 * and writes the tile of C_{t+1} = alpha A B_t + beta C_t into @c (C_t: @c0 for t = 0, else @c,
 * each element read and written by the same thread).
 */
__global__ void consume(app::endpoint in, const float *a, const float *b, const float *c0, float *c, uint32_t n,
			uint32_t kc, uint32_t iterations, app::watchdog wd)
{
	__shared__ operands s;
	const uint32_t across = n / tile, tiles = across * across;
	uint32_t g = 0;

	for (uint32_t t = 0; t < iterations; t++)
		for (uint32_t i = blockIdx.x; i < tiles; i += gridDim.x, g++) {
			const uint32_t row0 = i / across * tile, col0 = i % across * tile;
			float acc[4][4];
			product(a, b, n, kc, row0, col0, t % n, acc, s);
			const uint32_t slot = in.place.slot(blockIdx.x, g), gen = in.place.generation(g);
			const float *theirs = reinterpret_cast<const float *>(app::block_recv(in.ch, slot, gen, wd));
			const float *from = t ? c : c0;
			for (uint32_t r = 0; r < 4; r++)
				for (uint32_t q = 0; q < 4; q++) {
					const size_t at = (size_t)(row0 + threadIdx.x / 16 + 16 * r) * n + col0 +
							  threadIdx.x % 16 + 16 * q;
					c[at] = alpha * (acc[r][q] + theirs[in_tile(r, q)]) + beta * from[at];
				}
			app::block_consumed(in.ch, slot, gen);
		}
}

/* A B in double, both N x N row-major; four rows of the result at a time share each row of B. */
std::vector<double> whole_product(const std::vector<float> &a, const std::vector<float> &b, uint32_t n)
{
	std::vector<double> p((size_t)n * n, 0.0);

	app::parallel_for(n / 4, [&](uint32_t, size_t begin, size_t end) {
		for (size_t i = 4 * begin; i < 4 * end; i += 4) {
			double *p0 = &p[i * n], *p1 = p0 + n, *p2 = p1 + n, *p3 = p2 + n;
			for (uint32_t k = 0; k < n; k++) {
				const double a0 = a[i * n + k], a1 = a[(i + 1) * n + k], a2 = a[(i + 2) * n + k],
					     a3 = a[(i + 3) * n + k];
				const float *row = &b[(size_t)k * n];
				for (uint32_t j = 0; j < n; j++) {
					const double v = row[j];
					p0[j] += a0 * v;
					p1[j] += a1 * v;
					p2[j] += a2 * v;
					p3[j] += a3 * v;
				}
			}
		}
	});
	return p;
}

/* The CPU reference: @iterations passes from @c0, pass t with A B_t, A B's columns rotated by t. */
std::vector<double> reference(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c0,
			      uint32_t n, uint32_t iterations)
{
	const std::vector<double> p = whole_product(a, b, n);
	std::vector<double> c(c0.begin(), c0.end());

	app::parallel_for(n, [&](uint32_t, size_t begin, size_t end) {
		for (size_t i = begin; i < end; i++)
			for (uint32_t t = 0; t < iterations; t++)
				for (uint32_t j = 0; j < n; j++)
					c[i * n + j] = (double)alpha * p[i * n + (j + t) % n] + (double)beta * c[i * n + j];
	});
	return c;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[N] [ITERATIONS]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t n = cli.size(0, G_GEM_N);
	const uint32_t iterations = cli.size(1, G_GEM_ITERATIONS);
	app::two_gpus("G_GEM");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || n < tile || n > 8192 || n % tile || !iterations || iterations > most_iterations) {
		fprintf(stderr, "REPS must be positive, N a multiple of %u between %u and 8192, ITERATIONS between 1 "
				"and %u\n",
			tile, tile, most_iterations);
		return 2;
	}
	/* K is split in two halves of kc, each a multiple of step as N is of 64. */
	const uint32_t kc = n / 2;
	const size_t cells = (size_t)n * n, part = (size_t)n * kc;
	const uint32_t tiles = (n / tile) * (n / tile);
	const uint32_t items = iterations * ((tiles + blocks - 1) / blocks); /* most items of a stream */
	float *a[2], *b[2];
	for (int d = 0; d < 2; d++) {
		a[d] = app::alloc_on<float>(d, part);
		b[d] = app::alloc_on<float>(d, part);
	}
	float *c0 = app::alloc_on<float>(0, cells), *c = app::alloc_on<float>(0, cells);
	{
		app::on_gpu g(0);
		app::load(consume);
	}
	{
		app::on_gpu g(1);
		app::load(produce);
	}
	app::one_way_pair pair(mode, blocks, items, depth, message_bytes);
	const app::endpoint link = pair.link();
	std::vector<float> am(cells), bm(cells), cm(cells), split(part), got(cells);
	std::random_device entropy;

	auto one = [&](int rep) {
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		app::random_unit(rng(), am);
		app::random_unit(rng(), bm);
		app::random_unit(rng(), cm);
		for (int d = 0; d < 2; d++) {
			/* GPU d's columns of A, and its rows of B (contiguous) */
			for (size_t i = 0; i < n; i++)
				memcpy(&split[i * kc], &am[i * n + d * kc], kc * sizeof(float));
			CHECK(cudaMemcpy(a[d], split.data(), part * sizeof(float), cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy(b[d], &bm[d * part], part * sizeof(float), cudaMemcpyHostToDevice));
		}
		{
			app::on_gpu g(0);
			CHECK(cudaMemcpy(c0, cm.data(), cells * sizeof(float), cudaMemcpyHostToDevice));
			CHECK(cudaMemset(c, 0xff, cells * sizeof(float))); /* poison: NaN */
			/* NaN in every slot too: a tile read before it was written shows */
			CHECK(cudaMemset(const_cast<uint8_t *>(link.ch.data), 0xff,
					 (size_t)link.ch.slots * link.ch.batch_bytes));
		}
		auto consumer = [&](cudaStream_t stream, app::watchdog wd) {
			app::launch_on(0, consume, blocks, threads, stream, link, a[0], b[0], c0, c, n, kc, iterations, wd);
		};
		auto producer = [&](cudaStream_t stream, app::watchdog wd) {
			app::launch_on(1, produce, blocks, threads, stream, link, a[1], b[1], n, kc, iterations, wd);
		};
		const double ms = pair.run(consumer, producer);
		const bool failed = pair.timed_out();

		CHECK(cudaMemcpy(got.data(), c, cells * sizeof(float), cudaMemcpyDeviceToHost));
		const std::vector<double> ref = reference(am, bm, cm, n, iterations);
		double worst = 0;
		for (size_t i = 0; i < cells; i++) {
			const double e = std::fabs((double)got[i] - ref[i]) / std::fabs(ref[i]);
			if (!std::isnan(worst) && !(e <= worst))
				worst = e; /* NaN stays */
		}
		/* positive terms: a float sum of m products is within m 2^-24; a pass adds a few roundings */
		const double tolerance = (n + 4.0 * iterations) * 0x1p-24;
		const bool correct = !failed && worst < tolerance;
		if (!correct)
			fprintf(stderr, "G_GEM %s rep %d: %s, largest relative error of an element %g (tolerance %g)\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out", worst,
				tolerance);
		return app::rep_result{ms, correct};
	};
	const int status = app::repeat_runs("G_GEM", mode,
					    "n=" + std::to_string(n) + " tile=" + std::to_string(tile) +
						    " blocks=" + std::to_string(blocks) +
						    " iterations=" + std::to_string(iterations) + " gpus=0,1",
					    reps, one);
	for (int d = 0; d < 2; d++) {
		app::free_on(d, a[d]);
		app::free_on(d, b[d]);
	}
	app::free_on(0, c0);
	app::free_on(0, c);
	return status;
}
