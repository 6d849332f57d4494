/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_STN - stencil (Polybench jacobi-2d) on two GPUs, multiple-communication model, adjacent
 * pattern: Jacobi sweeps B[i][j] = 0.2f (A[i][j] + A[i][j-1] + A[i][j+1] + A[i+1][j] + A[i-1][j])
 * over the interior of an N x N grid of random values (fresh every run; the outer rows and
 * columns stay as they are, as in Polybench). GPU 0 owns rows 0 .. N/2 - 1, GPU 1 the others,
 * each with one persistent kernel (a cooperative launch: all its blocks resident). Every sweep
 * needs the other GPU's row next to a GPU's own (its halo), so each GPU sends its edge row as
 * TILES messages, one per band of columns, into the other GPU's memory through a channel (one
 * each way): the sending block writes the band over the peer link and wic::publish()es it,
 * the receiving block waits in wic::recv_block() and reports it consumed (wic::consumed()), which
 * the sender waits for before it reuses the slot. Each kernel first sweeps its rows that need
 * no halo; then block j sweeps band j of its edge row as soon as the other GPU's band j is
 * there and sends its new band j at once. Two slots per band: a GPU may send two sweeps ahead
 * of the other's reads. After ITERATIONS sweeps both halves are checked against a CPU-only run
 * of the whole grid in double (relative error below 1e-6 + 2e-8 per sweep: float rounding),
 * and must equal the same run in float bit for bit (the same operations in the same order), so
 * that even one late or stale band, which the smoothing would hide, is caught.
 *
 * push: the ready words are in the receiving GPU's memory; its warps wait with backoff. poll
 * (spinning): they are in the sending GPU's memory; the receiving warps spin on them
 * across the link.
 *
 * nowait: in an exchange neither GPU's messages can all be there before the other starts, for
 * each band depends on the other GPU's band of the sweep before. The closest honest lower
 * bound is both kernels with nothing to wait for and nothing to send: a first, untimed push
 * run records every band each GPU received; the host then publishes all of them into each
 * GPU's memory before the kernels start, the kernels send nothing, and the time from the
 * first launch until both ended is measured (the sweeps and the reads of the halos, without
 * any waiting or link traffic). The result is checked as in the other modes.
 *
 * Usage: g_stn MODE [REPS] [N] [ITERATIONS] [TILES]   (MODE: push, poll, alg1, tagged, picked, nowait; N (even)
 * defaults to 1024, ITERATIONS to 500, TILES to 8, REPS to 7; one block of 256 threads per SM
 * on each GPU; only the TILES blocks of the edge row wait, with one warp each, so poll spins
 * with TILES warps per GPU)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 *
 * With G_STN_TRACE=1 in the environment, the runs use a kernel whose block 0 stamps its sweeps
 * with the GPU's nanosecond timer (in the last run), and a line per GPU gives the median time of
 * a sweep's parts: the rows without halo, the wait for band 0 of the halo, the edge band with its
 * consumed report, the send of the new band, and the grid barrier. The stamps cost block 0 a
 * little: the traced runs' times are not the untraced ones'.
 */
#include <algorithm>
#include <cstdlib>
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 256;

/* Stamps of a sweep's parts (G_STN_TRACE): the sweep's start and the end of each part. */
constexpr uint32_t stamps = 6;
__device__ uint64_t *trace_stamps;

/* Stamps part @k of sweep @t into @at, block 0's thread 0's stamps (null for every other thread). */
__device__ inline void stamp(uint64_t *at, uint32_t t, uint32_t k)
{
	if (at)
		at[(size_t)t * stamps + k] = wic::detail::globaltimer();
}

/*
 * Polybench's update of column @x of @row, given the points below (row + 1) and above (row - 1)
 * it. The weight is Polybench's float 0.2f in both precisions: the reference solves the same
 * problem (with 0.2 in double, the runs would drift apart by the weights' ratio every sweep).
 */
template <typename T>
__host__ __device__ inline T jacobi(const T *row, uint32_t x, T below, T above)
{
	return T(0.2f) * (row[x] + row[x - 1] + row[x + 1] + below + above);
}

/* The first column of band @j of @tiles over @n columns. */
__host__ __device__ inline uint32_t band(uint32_t n, uint32_t tiles, uint32_t j)
{
	return (uint32_t)((uint64_t)n * j / tiles);
}

/*
 * half - the rows GPU @side owns: GPU 0 rows [0, n/2), GPU 1 rows [n/2, n), local row r being
 * row @row0 + r of the grid. Its edge row, next to the other half, is its last (GPU 0) or first
 * (GPU 1); its halo is the other GPU's edge row, below (GPU 0) or above (GPU 1) it.
 */
struct half {
	uint32_t n;
	uint32_t tiles;
	uint32_t side;
	uint32_t row0;
	uint32_t rows;

	__host__ __device__ uint32_t edge() const { return side ? 0 : rows - 1; }
	__host__ __device__ size_t cells() const { return (size_t)rows * n; }
	/* Columns of the widest band: floats of a message. */
	__host__ __device__ uint32_t most() const { return (n + tiles - 1) / tiles; }
	/* Whether local row @r, column @x is on the grid's border, which stays as it is. */
	__host__ __device__ bool fixed(uint32_t r, uint32_t x) const
	{
		const uint32_t y = row0 + r;
		return y == 0 || y + 1 == n || x == 0 || x + 1 == n;
	}
};

half make_half(uint32_t n, uint32_t tiles, uint32_t side)
{
	const uint32_t h = n / 2;
	return half{n, tiles, side, side ? h : 0, side ? n - h : h};
}

/* Block j sends columns [@x0, @x1) of @row as item (j, @t) of @out. */
__device__ inline void send_band(const app::endpoint &out, uint32_t j, uint32_t t, const float *row, uint32_t x0,
				 uint32_t x1, const app::watchdog &wd)
{
	const uint32_t slot = out.place.slot(j, t), gen = out.place.generation(t);
	float *to = reinterpret_cast<float *>(app::block_claim(out.ch, slot, gen, wd));

	for (uint32_t x = x0 + threadIdx.x; x < x1; x += blockDim.x)
		to[x - x0] = row[x];
	wic::publish_block(out.ch, slot, gen);
}

/*
 * sweeps() - the kernel of GPU @h.side: its rows are at u + (t % 2) * cells before sweep t.
 * Band j of its halo before sweep t is item (j, t) of @in; band j of its edge row after sweep
 * t is item (j, t + 1) of @out (item (j, 0): before the first), sent unless @send is false.
 * @log, unless null, receives every halo band, item (j, t) at (j * iterations + t) * most.
 */
template <bool traced>
__global__ void sweeps(app::endpoint in, app::endpoint out, bool send, half h, float *u, uint32_t iterations,
		       app::grid_barrier grid, app::watchdog wd, float *log)
{
	/* Untraced, the kernel has no stamp at all: one costs block 0 a load on its critical path. */
	uint64_t *const trace = traced && blockIdx.x == 0 && threadIdx.x == 0 ? trace_stamps : nullptr;
	const uint32_t n = h.n, edge = h.edge(), j = blockIdx.x;
	const size_t cells = h.cells(), e = (size_t)edge * n;
	const bool banded = j < h.tiles;
	const uint32_t x0 = band(n, h.tiles, j), x1 = band(n, h.tiles, j + 1);

	if (banded && send)
		send_band(out, j, 0, u + e, x0, x1, wd);
	for (uint32_t t = 0; t < iterations; t++) {
		const float *cur = u + (t % 2) * cells;
		float *next = u + ((t + 1) % 2) * cells;

		stamp(trace, t, 0);
		/* The rows other than the edge row need no halo: every block sweeps them first. */
		for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < cells - n;
		     i += (size_t)gridDim.x * blockDim.x) {
			const size_t at = i + (h.side ? n : 0);
			const uint32_t r = at / n, x = at % n;
			next[at] = h.fixed(r, x) ? cur[at] : jacobi(cur + (at - x), x, cur[at + n], cur[at - n]);
		}

		/* Block j sweeps band j of the edge row once the other GPU's band j is here. */
		if (banded) {
			stamp(trace, t, 1);
			const uint32_t slot = in.place.slot(j, t), gen = in.place.generation(t);
			const float *halo = reinterpret_cast<const float *>(app::block_recv(in.ch, slot, gen, wd));
			stamp(trace, t, 2);
			for (uint32_t x = x0 + threadIdx.x; x < x1; x += blockDim.x) {
				const float o = halo[x - x0];
				float v = cur[e + x];
				if (!h.fixed(edge, x) && h.side)
					v = jacobi(cur + e, x, cur[e + n + x], o);
				else if (!h.fixed(edge, x))
					v = jacobi(cur + e, x, o, cur[e - n + x]);
				next[e + x] = v;
				if (log)
					log[((size_t)j * iterations + t) * h.most() + x - x0] = o;
			}
			app::block_consumed(in.ch, slot, gen);
			stamp(trace, t, 3);
			if (send && t + 1 < iterations)
				send_band(out, j, t + 1, next + e, x0, x1, wd);
			stamp(trace, t, 4);
		}
		grid.sync(); /* sweep t + 1 reads what every block wrote */
		stamp(trace, t, 5);
	}
}

/*
 * The CPU-only run: @iterations sweeps of the whole grid in T. In float it does what the GPUs
 * do, the same operations in the same order (nothing to fuse), so it must match them bit for
 * bit; in double it is the reference.
 */
template <typename T>
std::vector<T> whole_grid(const std::vector<float> &u0, uint32_t n, uint32_t iterations)
{
	std::vector<T> cur(u0.begin(), u0.end()), next(cur);

	for (uint32_t t = 0; t < iterations; t++) {
		app::parallel_for(n - 2, [&](uint32_t, size_t begin, size_t end) {
			for (size_t y = begin + 1; y < end + 1; y++)
				for (uint32_t x = 1; x + 1 < n; x++) {
					const size_t i = y * n + x;
					next[i] = jacobi(&cur[y * n], x, cur[i + n], cur[i - n]);
				}
		});
		cur.swap(next);
	}
	return cur;
}

/*
 * tracer - the G_STN_TRACE stamps of block 0 of each GPU: set before a run, read after it.
 */
class tracer {
public:
	explicit tracer(uint32_t iterations) : iterations_(iterations)
	{
		for (int d = 0; d < 2; d++) {
			app::on_gpu g(d);
			CHECK(cudaMalloc(&stamps_[d], (size_t)iterations * stamps * sizeof(uint64_t)));
		}
	}
	tracer(const tracer &) = delete;
	tracer &operator=(const tracer &) = delete;
	~tracer()
	{
		for (int d = 0; d < 2; d++) {
			app::on_gpu g(d);
			arm(nullptr);
			CHECK(cudaFree(stamps_[d]));
		}
	}

	/* The next run stamps (@on) or not. */
	void set(bool on)
	{
		for (int d = 0; d < 2; d++) {
			app::on_gpu g(d);
			arm(on ? stamps_[d] : nullptr);
		}
	}

	/* One line per GPU: the median of each part over the sweeps after the first tenth. */
	void print(app::mode m) const
	{
		static const char *const parts[stamps - 1] = {"interior", "wait", "edge", "send", "barrier"};
		for (int d = 0; d < 2; d++) {
			std::vector<uint64_t> ns((size_t)iterations_ * stamps);
			{
				app::on_gpu g(d);
				CHECK(cudaMemcpy(ns.data(), stamps_[d], ns.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
			}
			printf("G_STN trace %s gpu=%d", app::mode_name(m), d);
			for (uint32_t k = 1; k < stamps; k++) {
				std::vector<double> us;
				for (uint32_t t = iterations_ / 10; t < iterations_; t++)
					us.push_back((double)(ns[(size_t)t * stamps + k] - ns[(size_t)t * stamps + k - 1]) / 1e3);
				std::sort(us.begin(), us.end());
				printf(" %s_us=%.3f", parts[k - 1], us.empty() ? 0.0 : us[us.size() / 2]);
			}
			printf("\n");
		}
	}

private:
	/* On the current GPU. */
	static void arm(uint64_t *at) { CHECK(cudaMemcpyToSymbol(trace_stamps, &at, sizeof(at))); }

	uint32_t iterations_;
	uint64_t *stamps_[2] = {nullptr, nullptr};
};

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[N] [ITERATIONS] [TILES]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t n = cli.size(0, G_STN_N);
	const uint32_t iterations = cli.size(1, G_STN_ITERATIONS);
	const uint32_t tiles = cli.size(2, G_STN_TILES);
	app::two_gpus("G_STN");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || n < 4 || n > 16384 || n % 2 || !iterations || !tiles || tiles > n || tiles > blocks) {
		fprintf(stderr, "REPS and ITERATIONS must be positive, N even between 4 and 16384, TILES between 1 "
				"and min(N, %u)\n",
			blocks);
		return 2;
	}
	const char *trace_env = getenv("G_STN_TRACE");
	const bool tracing = trace_env && !strcmp(trace_env, "1");
	const half halves[2] = {make_half(n, tiles, 0), make_half(n, tiles, 1)};
	app::halo_exchange<half> exchange(mode, tracing ? sweeps<true> : sweeps<false>, halves, n, iterations, tiles,
					  halves[0].most(), blocks, threads);
	std::vector<float> u0((size_t)n * n), got(u0.size());
	std::random_device entropy;
	tracer trace(iterations);

	auto one = [&](int rep) {
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
		for (float &v : u0)
			v = uniform(rng);

		bool failed;
		trace.set(tracing && rep == reps);
		const double ms = exchange.run(u0, got, &failed);
		if (tracing && rep == reps)
			trace.print(mode);
		const std::vector<double> ref = whole_grid<double>(u0, n, iterations);
		const std::vector<float> same = whole_grid<float>(u0, n, iterations);
		const size_t split = halves[0].cells();
		const double top = app::relative_error(got.data(), ref.data(), split);
		const double bottom = app::relative_error(&got[split], &ref[split], halves[1].cells());
		size_t differ = 0;
		for (size_t i = 0; i < got.size(); i++)
			differ += memcmp(&got[i], &same[i], sizeof(float)) != 0;
		/*
		 * float rounding grows by about 1e-8 a sweep on these smooth fields; a late or stale
		 * band can hide below that, but not from the bitwise comparison with the float run
		 */
		const double tolerance = 1e-6 + 2e-8 * iterations;
		const bool correct = !failed && !differ && top < tolerance && bottom < tolerance;
		if (!correct)
			fprintf(stderr,
				"G_STN %s rep %d: %s, %zu values differ from the CPU's float run, relative error "
				"GPU 0's half %g, GPU 1's half %g (tolerance %g)\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out", differ,
				top, bottom, tolerance);
		return app::rep_result{ms, correct};
	};
	const int status = app::repeat_runs("G_STN", mode,
					    "n=" + std::to_string(n) + " tiles=" + std::to_string(tiles) +
						    " blocks=" + std::to_string(blocks) +
						    " iterations=" + std::to_string(iterations) + " gpus=0,1",
					    reps, one);
	return status;
}
