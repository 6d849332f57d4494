/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * C_H3D - halo exchange on a 3D cube (Comb), multiple-communication model, adjacent pattern:
 * weighted Jacobi sweeps, u' = u / 4 + (sum of the 6 neighbours) / 8 (0 outside the cube), over
 * an N^3 cube of random values (fresh every run). The host owns planes z < N/2, one persistent
 * kernel the others. Each iteration the host sends its boundary plane as TILES messages, one per
 * band of rows, and the kernel sends its boundary plane back as TILES messages through pinned
 * memory. Each side first sweeps its planes that need no halo, then its boundary plane band by
 * band as the other side's bands arrive: block j of the kernel receives band j, sweeps those
 * rows and returns them at once; the host sweeps its band j when the kernel's band j is there
 * and sends it on. After ITERATIONS sweeps both halves are checked against a CPU-only run of
 * the whole cube in double.
 *
 * nowait: the host's bands after the first depend on the kernel's, so a first push run records
 * them; the timed run is the kernel alone with all of them published before it starts (the
 * GPU's sweeps without waiting: a lower bound). The host's sweeps are then replayed with the
 * kernel's bands and must reproduce the recorded ones.
 *
 * launch: no kernel waits; the inner planes' sweeps and each band's are kernels the channel
 * launches once the band landed.
 * Usage: c_h3d MODE [REPS] [N] [ITERATIONS] [TILES]   (MODE: push, poll, alg1, launch, nowait; N (even)
 * defaults to 64, ITERATIONS to 100, TILES to 8, REPS to 7; the host's sweeps grow as N^3, so
 * a small cube keeps the exchange a large share; only the TILES receiving warps wait, so poll
 * spins with TILES warps)
 * Prints the median wall time of REPS runs and whether every result matched.
 */
#include <random>

#include "stream.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 256;

/* The sweep at row @y, column @x of plane @at, given the values below and above it in z. */
template <typename T>
__host__ __device__ inline T sweep(const T *at, T below, T above, uint32_t n, uint32_t x, uint32_t y)
{
	const uint32_t i = y * n + x;
	const T xm = x ? at[i - 1] : T(0), xp = x + 1 < n ? at[i + 1] : T(0);
	const T ym = y ? at[i - n] : T(0), yp = y + 1 < n ? at[i + n] : T(0);

	return T(0.25) * at[i] + T(0.125) * ((xm + xp) + (ym + yp) + (below + above));
}

/* The first row of band @j of @tiles over @n rows. */
__host__ __device__ inline uint32_t band(uint32_t n, uint32_t tiles, uint32_t j)
{
	return (uint32_t)((uint64_t)n * j / tiles);
}

/* Sweep @t of the planes above the boundary, which need no halo: the grid's threads share them. */
__device__ void sweep_inner(uint32_t n, float *u, uint32_t t)
{
	const uint32_t depth = n - n / 2;
	const size_t plane = (size_t)n * n, half = depth * plane;
	const float *cur = u + (t % 2) * half;
	float *next = u + ((t + 1) % 2) * half;

	for (size_t i = plane + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < half;
	     i += (size_t)gridDim.x * blockDim.x) {
		const size_t z = i / plane;
		const uint32_t y = i / n % n, x = i % n;
		next[i] = sweep(cur + z * plane, cur[i - plane], z + 1 < depth ? cur[i + plane] : 0.0f, n, x, y);
	}
}

/*
 * Sweep @t of band @j of the boundary plane, by the calling block, once the host's band j is
 * there: its rows are swept and returned as part j of result generation t at once.
 */
__device__ void sweep_band(const app::forward &halo, const wic::result_view &back, uint32_t n, uint32_t tiles,
			   float *u, uint32_t t, uint32_t j, int *errors)
{
	const uint32_t depth = n - n / 2, y0 = band(n, tiles, j), y1 = band(n, tiles, j + 1);
	const size_t plane = (size_t)n * n, half = depth * plane;
	const float *cur = u + (t % 2) * half;
	float *next = u + ((t + 1) % 2) * half;
	__shared__ const float *message;

	if (threadIdx.x < 32) {
		const uint8_t *m;
		int status = wic::recv(halo.ch, halo.place.slot(j, t), halo.place.generation(t), 0, &m);
		if (threadIdx.x == 0) {
			if (status != WIC_OK)
				atomicAdd(errors, 1);
			message = reinterpret_cast<const float *>(m);
		}
	}
	__syncthreads();
	float *out = reinterpret_cast<float *>(back.slot(t));
	for (uint32_t i = y0 * n + threadIdx.x; i < y1 * n; i += blockDim.x) {
		const float v = sweep(cur, message[i - y0 * n], depth > 1 ? cur[i + plane] : 0.0f, n, i % n, i / n);
		next[i] = v;
		out[i] = v;
	}
	app::block_consumed(halo.ch, halo.place.slot(j, t), halo.place.generation(t));
	wic::post_result(back, t, j);
}

/*
 * The kernel's half: planes z = n/2 .. n - 1 at u + (t % 2) * half before sweep t. Halo band j
 * (the host's plane n/2 - 1, rows of band j) is item (j, t) of @halo; the kernel's plane n/2
 * after sweep t is result generation t, band j its part j.
 */
__global__ void sweeps(app::forward halo, wic::result_view back, uint32_t n, uint32_t tiles, float *u,
		       uint32_t iterations, app::grid_barrier grid, int *errors)
{
	for (uint32_t t = 0; t < iterations; t++) {
		/* Planes above the boundary need no halo: every block sweeps them first. */
		sweep_inner(n, u, t);
		/* Block j sweeps band j of the boundary plane once the host's band j is there. */
		if (blockIdx.x < tiles)
			sweep_band(halo, back, n, tiles, u, t, blockIdx.x, errors);
		grid.sync(); /* sweep t + 1 reads what every block wrote */
	}
}

/*
 * launch mode: the inner planes' sweep and each band's, as kernels the channel launches once
 * the band landed. The inner sweep t + 1 is queued after the last band of sweep t, so that it
 * runs while the host works on its side, as the persistent kernel's does.
 */
__global__ void inner_step(uint32_t n, float *u, uint32_t t)
{
	sweep_inner(n, u, t);
}

__global__ void band_step(app::forward halo, wic::result_view back, uint32_t n, uint32_t tiles, float *u, uint32_t t,
			  uint32_t j, int *errors)
{
	sweep_band(halo, back, n, tiles, u, t, j, errors);
}

/* The cube's split: the host owns planes z < h, the kernel the others; TILES bands of rows. */
struct cube {
	uint32_t n;
	uint32_t tiles;
	uint32_t h;
	size_t plane;
	uint32_t most_rows; /* of a band */

	cube(uint32_t size, uint32_t bands)
		: n(size), tiles(bands), h(size / 2), plane((size_t)size * size), most_rows((size + bands - 1) / bands)
	{
	}
	size_t half() const { return (n - h) * plane; }
	uint32_t message_bytes() const { return most_rows * n * sizeof(float); }
};

/*
 * host_sweeps() - the host's side: @iterations sweeps of its planes of @u0, left in @mine
 * (@next: scratch of the same size). Sends band j of its boundary plane before sweep t as item
 * (j, t) and sweeps its band j with result generation t - 1 (the kernel's plane after sweep
 * t - 1), @u0's plane h for t = 0.
 */
template <typename IO>
void host_sweeps(IO &io, const cube &c, const std::vector<float> &u0, uint32_t iterations, std::vector<float> &mine,
		 std::vector<float> &next)
{
	const uint32_t n = c.n, h = c.h;
	const size_t plane = c.plane;
	auto send = [&](uint32_t j, uint32_t t, const std::vector<float> &from) {
		io.send(0, j, t, [&](uint8_t *buf) {
			float *out = reinterpret_cast<float *>(buf);
			const uint32_t y0 = band(n, c.tiles, j), y1 = band(n, c.tiles, j + 1);
			memcpy(out, &from[(h - 1) * plane + y0 * n], (y1 - y0) * n * sizeof(float));
			std::fill(out + (y1 - y0) * n, out + c.most_rows * n, 0.0f);
		});
	};

	std::copy(u0.begin(), u0.begin() + h * plane, mine.begin());
	for (uint32_t j = 0; j < c.tiles; j++)
		send(j, 0, mine);
	for (uint32_t t = 0; t < iterations; t++) {
		/* Planes below the boundary need no halo. */
		for (uint32_t z = 0; z + 1 < h; z++)
			for (uint32_t y = 0; y < n; y++)
				for (uint32_t x = 0; x < n; x++) {
					const size_t i = z * plane + y * n + x;
					const float below = z ? mine[i - plane] : 0.0f;
					next[i] = sweep(&mine[z * plane], below, mine[i + plane], n, x, y);
				}
		/* The boundary plane, band by band as the kernel's bands arrive. */
		for (uint32_t j = 0; j < c.tiles; j++) {
			const float *halo = t ? reinterpret_cast<const float *>(io.result(t - 1, j)) : &u0[h * plane];
			for (uint32_t y = band(n, c.tiles, j); y < band(n, c.tiles, j + 1); y++)
				for (uint32_t x = 0; x < n; x++) {
					const size_t i = (h - 1) * plane + y * n + x;
					const float below = h > 1 ? mine[i - plane] : 0.0f;
					next[i] = sweep(&mine[(h - 1) * plane], below, halo[y * n + x], n, x, y);
				}
			if (t + 1 < iterations)
				send(j, t + 1, next);
		}
		mine.swap(next);
	}
}

/* The CPU-only run: @iterations sweeps of the whole cube in double. */
std::vector<double> reference(const std::vector<float> &u0, uint32_t n, uint32_t iterations)
{
	const size_t plane = (size_t)n * n;
	std::vector<double> cur(u0.begin(), u0.end()), next(cur.size());

	for (uint32_t t = 0; t < iterations; t++) {
		for (uint32_t z = 0; z < n; z++)
			for (uint32_t y = 0; y < n; y++)
				for (uint32_t x = 0; x < n; x++) {
					const size_t i = z * plane + y * n + x;
					const double below = z ? cur[i - plane] : 0.0;
					const double above = z + 1 < n ? cur[i + plane] : 0.0;
					next[i] = sweep(&cur[z * plane], below, above, n, x, y);
				}
		cur.swap(next);
	}
	return cur;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[N] [ITERATIONS] [TILES]", &cli, false, true))
		return 2;
	const uint32_t sms = app::sm_count();
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t n = cli.size(0, C_H3D_N);
	const uint32_t iterations = cli.size(1, C_H3D_ITERATIONS);
	const uint32_t tiles = cli.size(2, C_H3D_TILES);
	const uint32_t blocks = sms;
	if (reps < 1 || n < 4 || n > 512 || n % 2 || !iterations || tiles < 2 || tiles > n || tiles > blocks) {
		fprintf(stderr, "REPS and ITERATIONS must be positive, N even between 4 and 512, TILES between 2 "
				"and min(N, %u)\n",
			blocks);
		return 2;
	}
	const cube c(n, tiles);
	const uint32_t h = c.h;
	const size_t plane = c.plane, half = c.half();
	float *u;
	int *errors;
	app::grid_counter barrier;
	CHECK(cudaMalloc(&u, 2 * half * sizeof(float)));
	CHECK(cudaMalloc(&errors, sizeof(int)));
	std::vector<float> u0(n * plane), mine(h * plane), next(h * plane), theirs(half);
	std::vector<double> times;
	std::vector<app::host_work> host;
	bool correct = true;
	std::random_device entropy;

	for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up */
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
		for (float &v : u0)
			v = uniform(rng);

		app::alternating run;
		run.forward = {{tiles, iterations, c.message_bytes(), 1}};
		run.back = {iterations, plane * sizeof(float), tiles, 2};
		run.reset = [&] {
			CHECK(cudaMemset(u, 0xff, 2 * half * sizeof(float))); /* poison: NaN */
			CHECK(cudaMemcpy(u, &u0[h * plane], half * sizeof(float), cudaMemcpyHostToDevice));
			CHECK(cudaMemset(errors, 0, sizeof(int)));
			barrier.reset();
		};
		run.launch = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, cudaStream_t s) {
			app::launch_cooperative(sweeps, blocks, threads, s, fwd[0], back, n, tiles, u, iterations,
						barrier.barrier(), errors);
		};
		run.launch_step = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, uint32_t,
				      uint32_t j, uint32_t t, cudaStream_t s) {
			if (t == 0 && j == 0)
				inner_step<<<blocks, threads, 0, s>>>(n, u, 0);
			band_step<<<1, threads, 0, s>>>(fwd[0], back, n, tiles, u, t, j, errors);
			if (j + 1 == tiles && t + 1 < iterations)
				inner_step<<<blocks, threads, 0, s>>>(n, u, t + 1);
		};
		run.host = [&](app::host_io &io) { host_sweeps(io, c, u0, iterations, mine, next); };
		const app::exchange_timing t = app::exchange(mode, run);

		int failed;
		CHECK(cudaMemcpy(&failed, errors, sizeof(int), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(theirs.data(), u + (iterations % 2) * half, half * sizeof(float), cudaMemcpyDeviceToHost));
		const std::vector<double> ref = reference(u0, n, iterations);
		const double mine_error = app::relative_error(mine.data(), ref.data(), h * plane);
		const double theirs_error = app::relative_error(theirs.data(), &ref[h * plane], half);
		/* float sweeps contract: the rounding stays near float precision */
		if (failed || !(mine_error < 1e-5) || !(theirs_error < 1e-5) || !(t.replay_error < 1e-4)) {
			correct = false;
			fprintf(stderr,
				"C_H3D %s rep %d: %d receives failed, relative error host half %g, GPU half %g, replay "
				"difference %g\n",
				app::mode_name(mode), rep, failed, mine_error, theirs_error, t.replay_error);
		}
		if (rep) {
			times.push_back(t.total_ms);
			host.push_back(t.host);
		}
	}
	app::report("C_H3D", mode,
		    "n=" + std::to_string(n) + " tiles=" + std::to_string(tiles) + " blocks=" + std::to_string(blocks) +
			    " iterations=" + std::to_string(iterations),
		    times, correct, &host);
	CHECK(cudaFree(u));
	CHECK(cudaFree(errors));
	return correct ? 0 : 1;
}
