/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_C2D - 2D convolution (Polybench 2DConvolution) on two GPUs, alternating model, adjacent
 * pattern: ITERATIONS passes of Polybench's 3 x 3 filter
 *	B[i][j] = 0.2 A[i-1][j-1] - 0.3 A[i][j-1] + 0.4 A[i+1][j-1]
 *		+ 0.5 A[i-1][j]   + 0.6 A[i][j]   + 0.7 A[i+1][j]
 *		- 0.8 A[i-1][j+1] - 0.9 A[i][j+1] + 0.1 A[i+1][j+1]
 * over the interior of an N x N image of random values (fresh every run), each pass's output the
 * next one's input; the outer rows and columns stay as they are (Polybench never writes them).
 * GPU 0 owns rows 0 .. N/2 - 1, GPU 1 the others, each with one persistent kernel (a
 * cooperative launch: all its blocks resident).
 *
 * The halves take turns at the seam, as the WIC paper's alternating model has it
 * ((D0 -> D1, D1 -> D0)^N): in pass t GPU 0 filters its rows, its last one (row N/2 - 1) with
 * GPU 1's first (row N/2) as it was before the pass, and sends its new last row to GPU 1; GPU 1
 * filters its rows, its first one with that new row above it, and sends its new first row back,
 * which GPU 0's pass t + 1 needs. So within a pass the top half is filtered before the bottom
 * half (a Gauss-Seidel order by halves, the one that makes each side consume what the other
 * just produced), and every message needs the one before it. Each message is a whole row, one
 * per direction and pass (a 3 x 3 filter's band of a row needs its neighbours' edge columns, so
 * bands as in G_STN would each wait for three messages). It goes through a channel (one each
 * way) into the other GPU's memory: block 0 writes the row over the peer link and
 * wic::publish()es it; the other GPU's block 0 waits in wic::recv_block(), filters its edge row and
 * reports the message consumed (wic::consumed()), which the sender waits for before it reuses
 * the slot. The other rows of a half need nothing from the other GPU: every block filters
 * them first, then block 0 does the edge row. GPU 0 sends its last row after every pass; GPU 1
 * sends its first row once before the first pass and after every pass but the last; so in pass
 * t each GPU takes item t of the other's. Two slots per direction.
 *
 * The filter's gain reaches 3.1 (on columns that alternate in sign), so values grow about 3.1
 * times a pass: ITERATIONS is at most 64, where they stay about 10^7 below float's range. The
 * result is checked against a CPU-only run of the whole image in the same order, in double:
 * relative error below 1e-5 in each half (float rounding stays near 1e-7, below 1e-6 even on
 * the smallest images). Unlike Jacobi (G_STN) this filter does not smooth: a late or stale row
 * changes the seam by as much as a pass does, and the error grows with the image (at N = 4096
 * one stale row in the last pass leaves 7e-3), so no float run for a bit-exact comparison is
 * needed. The other buffer of each half and the channels' slots are poisoned (NaN) before each
 * run.
 *
 * push: the ready words are in the receiving GPU's memory; its warps wait with backoff. poll
 * (spinning): they are in the sending GPU's memory; the receiving warps spin on them
 * across the link.
 *
 * nowait: in an exchange neither GPU's messages can all be there before the other starts. As in
 * G_STN, the lower bound is both kernels with nothing to wait for and nothing to send: a first,
 * untimed push run records every row each GPU received; the host then publishes all of them
 * into each GPU's memory before the kernels start, the kernels send nothing, and the time from
 * the first launch until both ended is measured. The result is checked as in the other modes.
 *
 * Usage: g_c2d MODE [REPS] [N] [ITERATIONS]   (MODE: push, poll, alg1, tagged, picked, nowait; N (even, 8 to 16384)
 * defaults to 4096, ITERATIONS (1 to 64) to 64, REPS to 7; one block of 256 threads per SM on
 * each GPU; only block 0 waits, with one warp, so poll spins with one warp per GPU)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 */
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 256;
constexpr uint32_t most_iterations = 64; /* 3.1^64 = 3e31: float's range holds it */

/*
 * Polybench's filter at column @x of @row, given the rows above and below it, in Polybench's
 * order (its c11, c12, c13, c21, ...). The weights are Polybench's float values in both
 * precisions: the reference solves the same problem.
 */
template <typename T>
__host__ __device__ inline T filter(const T *above, const T *row, const T *below, uint32_t x)
{
	return T(0.2f) * above[x - 1] + T(-0.3f) * row[x - 1] + T(0.4f) * below[x - 1] + T(0.5f) * above[x] +
	       T(0.6f) * row[x] + T(0.7f) * below[x] + T(-0.8f) * above[x + 1] + T(-0.9f) * row[x + 1] +
	       T(0.1f) * below[x + 1];
}

/*
 * half - the rows GPU @side owns: GPU 0 rows [0, n/2), GPU 1 rows [n/2, n), local row r being
 * row @row0 + r of the image. Its edge row, next to the other half, is its last (GPU 0) or first
 * (GPU 1); its halo is the other GPU's edge row, below (GPU 0) or above (GPU 1) it.
 */
struct half {
	uint32_t n;
	uint32_t side;
	uint32_t row0;
	uint32_t rows;

	__host__ __device__ uint32_t edge() const { return side ? 0 : rows - 1; }
	__host__ __device__ size_t cells() const { return (size_t)rows * n; }
	/* Whether local row @r, column @x is on the image's border, which stays as it is. */
	__host__ __device__ bool fixed(uint32_t r, uint32_t x) const
	{
		const uint32_t y = row0 + r;
		return y == 0 || y + 1 == n || x == 0 || x + 1 == n;
	}
};

half make_half(uint32_t n, uint32_t side)
{
	const uint32_t h = n / 2;
	return half{n, side, side ? h : 0, side ? n - h : h};
}

/*
 * point() - local row @r, column @x of @h after a pass, from its rows @cur before it; the edge
 * row takes the other GPU's row @halo in place of the row it lacks.
 */
__host__ __device__ inline float point(const half &h, const float *cur, const float *halo, uint32_t r, uint32_t x)
{
	const float *row = cur + (size_t)r * h.n;

	if (h.fixed(r, x))
		return row[x];
	const bool edge = r == h.edge();
	return filter(edge && h.side ? halo : row - h.n, row, edge && !h.side ? halo : row + h.n, x);
}

/* Block 0 sends the @n floats of @row as item @g of @out. */
__device__ inline void send_row(const app::endpoint &out, uint32_t g, const float *row, uint32_t n,
				const app::watchdog &wd)
{
	const uint32_t slot = out.place.slot(0, g), gen = out.place.generation(g);
	float *to = reinterpret_cast<float *>(app::block_claim(out.ch, slot, gen, wd));

	for (uint32_t x = threadIdx.x; x < n; x += blockDim.x)
		to[x] = row[x];
	wic::publish_block(out.ch, slot, gen);
}

/*
 * passes() - the kernel of GPU @h.side: its rows are at u + (t % 2) * cells before pass t, and
 * its halo in pass t is item t of @in. GPU 0 sends its edge row after pass t as item t of @out;
 * GPU 1 sends its edge row before the first pass as item 0 and after pass t as item t + 1 (the
 * last pass's is nobody's). Nothing is sent if @send is false. @log, unless null, receives every
 * halo row, item t at t * n.
 */
__global__ void passes(app::endpoint in, app::endpoint out, bool send, half h, float *u, uint32_t iterations,
		       app::grid_barrier grid, app::watchdog wd, float *log)
{
	const uint32_t n = h.n, edge = h.edge();
	const size_t cells = h.cells(), e = (size_t)edge * n;
	const bool seam = blockIdx.x == 0;

	if (seam && send && h.side)
		send_row(out, 0, u + e, n, wd);
	for (uint32_t t = 0; t < iterations; t++) {
		const float *cur = u + (t % 2) * cells;
		float *next = u + ((t + 1) % 2) * cells;

		/*
		 * The rows other than the edge row need no halo: every block filters them first
		 * (32-bit indices: a half has at most 2^27 points).
		 */
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < cells - n; i += gridDim.x * blockDim.x) {
			const uint32_t at = i + (h.side ? n : 0);
			next[at] = point(h, cur, nullptr, at / n, at % n);
		}

		/* Block 0 filters the edge row once the other GPU's row is here, and sends it on. */
		if (seam) {
			const uint32_t slot = in.place.slot(0, t), gen = in.place.generation(t);
			const float *halo = reinterpret_cast<const float *>(app::block_recv(in.ch, slot, gen, wd));
			for (uint32_t x = threadIdx.x; x < n; x += blockDim.x) {
				next[e + x] = point(h, cur, halo, edge, x);
				if (log)
					log[(size_t)t * n + x] = halo[x];
			}
			app::block_consumed(in.ch, slot, gen);
			if (send && !h.side)
				send_row(out, t, next + e, n, wd);
			else if (send && t + 1 < iterations)
				send_row(out, t + 1, next + e, n, wd);
		}
		grid.sync(); /* pass t + 1 reads what every block wrote */
	}
}

/*
 * The CPU-only run in double: @iterations passes over the whole image, each filtering the top
 * half from the image before it and then the bottom half, whose first row sees the top half's
 * new last row (the order the two GPUs keep).
 */
std::vector<double> whole_image(const std::vector<float> &u0, uint32_t n, uint32_t iterations)
{
	std::vector<double> cur(u0.begin(), u0.end()), next(cur);
	const uint32_t h = n / 2;

	for (uint32_t t = 0; t < iterations; t++) {
		for (uint32_t side = 0; side < 2; side++) {
			const uint32_t first = side ? h : 1, last = side ? n - 1 : h; /* rows [first, last) */
			app::parallel_for(last - first, [&](uint32_t, size_t begin, size_t end) {
				for (size_t y = first + begin; y < first + end; y++) {
					const double *above = y == h ? &next[(y - 1) * n] : &cur[(y - 1) * n];
					for (uint32_t x = 1; x + 1 < n; x++)
						next[y * n + x] = filter(above, &cur[y * n], &cur[(y + 1) * n], x);
				}
			});
		}
		cur.swap(next); /* the border is the same in both */
	}
	return cur;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[N] [ITERATIONS]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t n = cli.size(0, G_C2D_N);
	const uint32_t iterations = cli.size(1, G_C2D_ITERATIONS);
	app::two_gpus("G_C2D");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || n < 8 || n > 16384 || n % 2 || !iterations || iterations > most_iterations) {
		fprintf(stderr, "REPS must be positive, N even between 8 and 16384, ITERATIONS between 1 and %u\n",
			most_iterations);
		return 2;
	}
	const half halves[2] = {make_half(n, 0), make_half(n, 1)};
	app::halo_exchange<half> exchange(mode, passes, halves, n, iterations, 1, n, blocks, threads);
	std::vector<float> u0((size_t)n * n), got(u0.size());
	std::random_device entropy;

	auto one = [&](int rep) {
		app::random_unit(((uint64_t)entropy() << 32) | entropy(), u0);

		bool failed;
		const double ms = exchange.run(u0, got, &failed);
		const std::vector<double> ref = whole_image(u0, n, iterations);
		const size_t split = halves[0].cells();
		const double top = app::relative_error(got.data(), ref.data(), split);
		const double bottom = app::relative_error(&got[split], &ref[split], halves[1].cells());
		/* float rounding stays below 1e-6 here; a late or stale row leaves far more */
		const double tolerance = 1e-5;
		const bool correct = !failed && top < tolerance && bottom < tolerance;
		if (!correct)
			fprintf(stderr,
				"G_C2D %s rep %d: %s, relative error GPU 0's half %g, GPU 1's half %g (tolerance %g)\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out", top, bottom,
				tolerance);
		return app::rep_result{ms, correct};
	};
	const int status = app::repeat_runs("G_C2D", mode,
					    "n=" + std::to_string(n) + " blocks=" + std::to_string(blocks) +
						    " iterations=" + std::to_string(iterations) + " gpus=0,1",
					    reps, one);
	return status;
}
