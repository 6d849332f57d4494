/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * C_FE - finite element mini-application (Mantevo miniFE), alternating model, random access:
 * the 3D Poisson problem -lap u = f on the unit cube, u = 0 on its boundary, with trilinear
 * hexahedra on an E^3 mesh whose interior nodes are moved randomly (fresh every run). The host
 * streams the elements, in a random order, to one persistent kernel: 32 per warp message, each
 * its corners' unknowns and coordinates, a generation of every block's batches made on every
 * core and published at once. Each lane computes its element's stiffness matrix
 * (2x2x2 Gauss points) and adds it into the CSR matrix at the rows and columns of its corners,
 * wherever they are (atomics, in fixed point so that every run sums to the same bits). After
 * a grid barrier the same kernel runs CG iterations alternating with the host as C_CG does
 * (cg.cuh). Checked against CPU references in double: the assembled matrix applied to a random
 * vector, and x after the same iterations with its residual.
 *
 * nowait: the elements and (recorded by a first push run, as in C_CG) every direction are
 * published before the kernel starts; the kernel alone is timed, a lower bound. The host's
 * updates are then replayed with its results and must reproduce the recorded directions.
 *
 * launch: no kernel waits; each generation of elements, the conversion after the last, and each
 * CG iteration's two steps are kernels the channels launch once their data landed.
 * Usage: c_fe MODE [REPS] [E] [ITERATIONS]   (MODE: push, poll, alg1, launch, nowait; E defaults to 48,
 * ITERATIONS to 20, REPS to 7; one block of 4 warps per SM, all of them receiving elements, so
 * poll spins with 4 warps per SM while elements stream and 1 during CG)
 * Prints the median wall time of REPS runs and whether every result matched.
 */
#include <random>

#include "cg.cuh"
#include "description.h"

namespace {

constexpr uint32_t warps = C_FE_WARPS;
constexpr uint32_t threads = warps * 32;

/*
 * element - one element as the host sends it (128 bytes). Corner a sits at offset
 * (a & 1, a >> 1 & 1, a >> 2 & 1) of the element's grid cell, which is also the corner
 * (+-1, +-1, +-1) of the reference cube, bit d set for +1 along axis d.
 */
struct element {
	int32_t node[8]; /* the corner's unknown; -1 on the boundary, where u = 0 */
	float xyz[8][3];
};
static_assert(sizeof(element) == C_FE_ELEMENT_BYTES, "four elements per 512 bytes");
constexpr uint32_t message_bytes = C_FE_ELEMENTS_PER_MESSAGE * sizeof(element);

/* Entry (a, b), a <= b, of a packed symmetric 8 x 8 matrix. */
__host__ __device__ inline int tri(int a, int b)
{
	return a * (15 - a) / 2 + b;
}

/*
 * element_matrix() - the element's stiffness matrix, k(a, b) = integral of grad N_a . grad N_b,
 * by 2x2x2 Gauss quadrature (exact for trilinear hexahedra). T: float on the GPU, double for
 * the reference.
 */
template <typename T>
__host__ __device__ inline void element_matrix(const T (&xyz)[8][3], T (&k)[36])
{
	const T g = T(0.57735026918962576451); /* 1 / sqrt(3) */

	for (int i = 0; i < 36; i++)
		k[i] = 0;
	for (int q = 0; q < 8; q++) {
		const T at[3] = {q & 1 ? g : -g, q & 2 ? g : -g, q & 4 ? g : -g};
		T dn[8][3]; /* dN_a / d xi_d at the Gauss point */
		T j[3][3] = {}; /* dx_i / d xi_d */
		for (int a = 0; a < 8; a++)
			for (int d = 0; d < 3; d++) {
				T v = T(a >> d & 1 ? 0.125 : -0.125);
				for (int e = 0; e < 3; e++)
					if (e != d)
						v *= 1 + (a >> e & 1 ? at[e] : -at[e]);
				dn[a][d] = v;
				for (int i = 0; i < 3; i++)
					j[i][d] += xyz[a][i] * v;
			}
		/* adj[d][i] = det * d xi_d / dx_i */
		const T adj[3][3] = {
			{j[1][1] * j[2][2] - j[2][1] * j[1][2], j[2][1] * j[0][2] - j[0][1] * j[2][2],
			 j[0][1] * j[1][2] - j[1][1] * j[0][2]},
			{j[2][0] * j[1][2] - j[1][0] * j[2][2], j[0][0] * j[2][2] - j[2][0] * j[0][2],
			 j[1][0] * j[0][2] - j[0][0] * j[1][2]},
			{j[1][0] * j[2][1] - j[2][0] * j[1][1], j[2][0] * j[0][1] - j[0][0] * j[2][1],
			 j[0][0] * j[1][1] - j[1][0] * j[0][1]},
		};
		const T det = j[0][0] * adj[0][0] + j[0][1] * adj[1][0] + j[0][2] * adj[2][0];
		T grad[8][3]; /* det * dN_a / dx_i */
		for (int a = 0; a < 8; a++)
			for (int i = 0; i < 3; i++)
				grad[a][i] = dn[a][0] * adj[0][i] + dn[a][1] * adj[1][i] + dn[a][2] * adj[2][i];
		const T w = 1 / det; /* (grad / det) . (grad / det) * det, the Gauss weights being 1 */
		for (int a = 0; a < 8; a++)
			for (int b = a; b < 8; b++) {
				const T dot = grad[a][0] * grad[b][0] + grad[a][1] * grad[b][1] + grad[a][2] * grad[b][2];
				k[tri(a, b)] += w * dot;
			}
	}
}

/*
 * The GPU sums the matrix in fixed point, 2^-40 steps (magnitudes below 2^23): integer adds
 * are associative, so the matrix, and everything computed from it, is the same bit for bit in
 * every run, whatever order the atomics land in.
 */
constexpr double fixed_one = 1099511627776.0;

__host__ __device__ inline void accumulate(unsigned long long *at, float v)
{
	const unsigned long long step = (unsigned long long)llrint((double)v * fixed_one);
#ifdef __CUDA_ARCH__
	atomicAdd(at, step);
#else
	*at += step;
#endif
}

__host__ __device__ inline float from_fixed(unsigned long long sum)
{
	return (float)((double)(long long)sum / fixed_one);
}

/* The reference's sums, in double on the host (assemble() is also compiled for the device). */
__host__ __device__ inline void accumulate(double *at, double v)
{
	*at += v;
}

/* Position of column @c in row @r; the columns of a row are sorted and include @c. */
__host__ __device__ inline uint32_t find(const uint32_t *row_ptr, const uint32_t *cols, uint32_t r, uint32_t c)
{
	uint32_t lo = row_ptr[r], hi = row_ptr[r + 1];

	while (hi - lo > 1) {
		const uint32_t mid = (lo + hi) / 2;
		if (cols[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* Adds @e's stiffness matrix, computed in T, into @sums (the GPU's: fixed point, atomic). */
template <typename T, typename S>
__host__ __device__ inline void assemble(const element &e, const uint32_t *row_ptr, const uint32_t *cols, S *sums)
{
	bool any = false;
	for (int a = 0; a < 8; a++)
		any |= e.node[a] >= 0;
	if (!any) /* padding, or all on the boundary */
		return;
	T xyz[8][3], k[36];
	for (int a = 0; a < 8; a++)
		for (int i = 0; i < 3; i++)
			xyz[a][i] = e.xyz[a][i];
	element_matrix(xyz, k);
	for (int a = 0; a < 8; a++) {
		if (e.node[a] < 0)
			continue;
		for (int b = 0; b < 8; b++) {
			if (e.node[b] < 0)
				continue;
			const T v = k[a <= b ? tri(a, b) : tri(b, a)];
			accumulate(&sums[find(row_ptr, cols, e.node[a], e.node[b])], v);
		}
	}
}

/* Block b's warps receive their elements of generation @g and assemble them into @sums. */
__device__ void assemble_generation(const app::forward &elements, const cg::csr_view &a, unsigned long long *sums,
				    uint32_t g, int *errors)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint8_t *message;
	const int status = app::receive(elements.ch, elements.place.slot(b, g), elements.place.generation(g), w, &message);

	if (status == WIC_OK)
		assemble<float>(reinterpret_cast<const element *>(message)[lane], a.row_ptr, a.cols, sums);
	else if (lane == 0)
		atomicAdd(errors, 1);
	app::block_consumed(elements.ch, elements.place.slot(b, g), elements.place.generation(g));
}

/* The matrix's values from the sums, once every element is in: the grid's threads share them. */
__device__ void convert(uint32_t nnz, const unsigned long long *sums, float *vals)
{
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nnz; i += gridDim.x * blockDim.x)
		vals[i] = from_fixed(sums[i]);
}

/*
 * Streams the elements in (4 warps x 32 per block and generation) and assembles them into
 * @sums, converts the sums to @vals (a.vals), then runs CG.
 */
__global__ void solve(app::forward elements, app::forward directions, wic::result_view back, cg::layout l,
		      cg::csr_view a, uint32_t nnz, unsigned long long *sums, float *vals, float *p,
		      uint32_t iterations, app::grid_barrier grid, int *errors)
{
	for (uint32_t g = 0; g < elements.place.generations; g++)
		assemble_generation(elements, a, sums, g, errors);
	grid.sync(); /* the matrix is whole */
	convert(nnz, sums, vals);
	/* iterate() synchronizes the grid before its first product */
	cg::iterate(directions, back, l, a, p, iterations, grid, errors);
}

/*
 * launch mode: a generation of elements, the conversion after the last (and each CG
 * iteration's two steps, cg.cuh's), as kernels the channels launch once their data landed.
 */
__global__ void assemble_step(app::forward elements, cg::csr_view a, unsigned long long *sums, uint32_t g,
			      int *errors)
{
	assemble_generation(elements, a, sums, g, errors);
}

__global__ void convert_step(uint32_t nnz, const unsigned long long *sums, float *vals)
{
	convert(nnz, sums, vals);
}


/* Node (i, j, k)'s unknown in an E^3 mesh: the interior nodes, in order; -1 on the boundary. */
int32_t unknown(uint32_t e, uint32_t i, uint32_t j, uint32_t k)
{
	if (!i || !j || !k || i == e || j == e || k == e)
		return -1;
	return (int32_t)(((k - 1) * (e - 1) + (j - 1)) * (e - 1) + (i - 1));
}

/* The matrix's structure for an E^3 mesh: each unknown couples with the unknowns around it. */
cg::csr structure(uint32_t e)
{
	cg::csr a;
	a.rows = (e - 1) * (e - 1) * (e - 1);
	a.row_ptr.push_back(0);
	for (uint32_t k = 1; k < e; k++)
		for (uint32_t j = 1; j < e; j++)
			for (uint32_t i = 1; i < e; i++) {
				for (int dk = -1; dk <= 1; dk++)
					for (int dj = -1; dj <= 1; dj++)
						for (int di = -1; di <= 1; di++) {
							const int32_t c = unknown(e, i + di, j + dj, k + dk);
							if (c >= 0)
								a.cols.push_back(c);
						}
				a.row_ptr.push_back(a.cols.size());
			}
	a.vals.assign(a.cols.size(), 0.0);
	return a;
}

/*
 * mesh - E^3 hexahedra filling the unit cube; node (i, j, k) at (i, j, k) / E, interior nodes
 * moved by up to 0.2 / E along each axis (each element stays convex).
 */
struct mesh {
	uint32_t e;
	std::vector<float> xyz;

	mesh(uint32_t elements_per_side, std::mt19937_64 &rng) : e(elements_per_side)
	{
		std::uniform_real_distribution<double> shift(-0.2, 0.2);
		xyz.resize(3 * (size_t)(e + 1) * (e + 1) * (e + 1));
		for (uint32_t k = 0; k <= e; k++)
			for (uint32_t j = 0; j <= e; j++)
				for (uint32_t i = 0; i <= e; i++) {
					const bool inside = unknown(e, i, j, k) >= 0;
					const uint32_t c[3] = {i, j, k};
					float *at = &xyz[3 * node(i, j, k)];
					for (int d = 0; d < 3; d++)
						at[d] = (float)((c[d] + (inside ? shift(rng) : 0.0)) / e);
				}
	}
	uint32_t node(uint32_t i, uint32_t j, uint32_t k) const { return (k * (e + 1) + j) * (e + 1) + i; }
	uint32_t elements() const { return e * e * e; }

	element at(uint32_t id) const
	{
		element out;
		const uint32_t i = id % e, j = id / e % e, k = id / (e * e);
		for (uint32_t a = 0; a < 8; a++) {
			const uint32_t ci = i + (a & 1), cj = j + (a >> 1 & 1), ck = k + (a >> 2 & 1);
			out.node[a] = unknown(e, ci, cj, ck);
			for (int d = 0; d < 3; d++)
				out.xyz[a][d] = xyz[3 * node(ci, cj, ck) + d];
		}
		return out;
	}
};

/* The element a warp's lane gets: item (b, g) of @blocks streams, in @order, padded past the end. */
element element_for(const mesh &m, const std::vector<uint32_t> &order, uint32_t blocks, uint32_t b, uint32_t g,
		    uint32_t w, uint32_t lane)
{
	const size_t at = (((size_t)g * blocks + b) * warps + w) * 32 + lane;
	if (at < order.size())
		return m.at(order[at]);
	element pad;
	memset(&pad, 0, sizeof(pad));
	for (int32_t &n : pad.node)
		n = -1;
	return pad;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[E] [ITERATIONS]", &cli, false, true))
		return 2;
	const uint32_t sms = app::sm_count();
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t e = cli.size(0, C_FE_E);
	const uint32_t iterations = cli.size(1, C_FE_ITERATIONS);
	if (reps < 1 || e < 3 || e > 256 || !iterations) {
		fprintf(stderr, "REPS and ITERATIONS must be positive, E between 3 and 256\n");
		return 2;
	}
	const uint32_t blocks = sms;
	const uint32_t per_generation = blocks * warps * 32;
	const uint32_t generations = (e * e * e + per_generation - 1) / per_generation;
	const cg::csr shape = structure(e);
	const cg::layout l = cg::make_layout(shape.rows, blocks);
	cg::device_csr dev(shape);
	const uint32_t nnz = shape.cols.size();
	unsigned long long *sums;
	float *p;
	int *errors;
	app::grid_counter barrier;
	cudaEvent_t assembled; /* launch mode: after the conversion */
	CHECK(cudaMalloc(&sums, nnz * sizeof(unsigned long long)));
	CHECK(cudaMalloc(&p, 2 * (size_t)l.rows * sizeof(float)));
	CHECK(cudaMalloc(&errors, sizeof(int)));
	CHECK(cudaEventCreateWithFlags(&assembled, cudaEventDisableTiming));
	std::vector<double> times;
	std::vector<app::host_work> host;
	bool correct = true;
	std::random_device entropy;

	for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up */
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		const mesh m(e, rng);
		std::vector<uint32_t> order(m.elements());
		for (uint32_t i = 0; i < order.size(); i++)
			order[i] = i;
		std::shuffle(order.begin(), order.end(), rng);
		std::uniform_real_distribution<double> uniform(-1.0, 1.0);
		std::vector<double> rhs(l.rows), v(l.rows);
		for (uint32_t i = 0; i < l.rows; i++) {
			rhs[i] = uniform(rng);
			v[i] = uniform(rng);
		}
		cg::solver solver;

		app::alternating run;
		run.forward = {{blocks, generations, message_bytes, warps}, l.forward(iterations)};
		run.back = l.back(iterations);
		run.reset = [&] {
			CHECK(cudaMemset(sums, 0, nnz * sizeof(unsigned long long)));
			CHECK(cudaMemset(dev.vals(), 0xff, nnz * sizeof(float))); /* poison: NaN */
			CHECK(cudaMemset(p, 0xff, 2 * (size_t)l.rows * sizeof(float))); /* poison: NaN */
			CHECK(cudaMemset(errors, 0, sizeof(int)));
			barrier.reset();
		};
		run.launch = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, cudaStream_t s) {
			app::launch_cooperative(solve, blocks, threads, s, fwd[0], fwd[1], back, l, dev.view(), nnz, sums,
						dev.vals(), p, iterations, barrier.barrier(), errors);
		};
		/*
		 * The two channels launch on streams of their own: the first product waits for the
		 * conversion, which the elements' channel queued before the host sent a direction.
		 */
		run.launch_step = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, uint32_t channel,
				      uint32_t, uint32_t g, cudaStream_t s) {
			if (channel == 0) {
				assemble_step<<<blocks, threads, 0, s>>>(fwd[0], dev.view(), sums, g, errors);
				if (g + 1 == generations) {
					convert_step<<<blocks, threads, 0, s>>>(nnz, sums, dev.vals());
					CHECK(cudaEventRecord(assembled, s));
				}
				return;
			}
			if (g == 0)
				CHECK(cudaStreamWaitEvent(s, assembled, 0));
			cg::direction_step<<<blocks, threads, 0, s>>>(fwd[1], l, p, g, errors);
			cg::multiply_step<<<blocks, threads, 0, s>>>(fwd[1], back, l, dev.view(), p, g);
		};
		run.host = [&](app::host_io &io) {
			/* A generation's batches on every core, published at once. */
			for (uint32_t g = 0; g < generations; g++)
				io.send_generation(0, g, [&](uint32_t b, uint8_t *buf) {
					element *out = reinterpret_cast<element *>(buf);
					for (uint32_t i = 0; i < warps * 32; i++)
						out[i] = element_for(m, order, blocks, b, g, i / 32, i % 32);
				});
			cg::host_iterations(io, 1, l, solver, rhs, iterations);
		};
		const app::exchange_timing t = app::exchange(mode, run);

		int failed;
		CHECK(cudaMemcpy(&failed, errors, sizeof(int), cudaMemcpyDeviceToHost));
		cg::csr a = shape, assembled = shape;
		for (uint32_t id = 0; id < m.elements(); id++)
			assemble<double>(m.at(id), a.row_ptr.data(), a.cols.data(), a.vals.data());
		const std::vector<float> got = dev.download_values();
		assembled.vals.assign(got.begin(), got.end());
		std::vector<double> av(l.rows), av_ref(l.rows);
		cg::spmv(assembled, v.data(), av.data());
		cg::spmv(a, v.data(), av_ref.data());
		const double a_error = app::relative_error(av.data(), av_ref.data(), l.rows);
		const std::vector<double> ref = cg::reference(a, rhs, iterations);
		const double x_error = app::relative_error(solver.x().data(), ref.data(), l.rows);
		const double res = cg::residual(a, rhs, solver.x()), res_ref = cg::residual(a, rhs, ref);
		if (failed || !(a_error < 1e-4) || !(x_error < 1e-4) || !(res <= 1.01 * res_ref + 1e-5) ||
		    !(t.replay_error < 1e-4)) {
			correct = false;
			fprintf(stderr,
				"C_FE %s rep %d: %d receives failed, A v relative error %g, x relative error %g, "
				"residual %g (reference %g), replay difference %g\n",
				app::mode_name(mode), rep, failed, a_error, x_error, res, res_ref, t.replay_error);
		}
		if (rep) {
			times.push_back(t.total_ms);
			host.push_back(t.host);
		}
	}
	app::report("C_FE", mode,
		    "elements=" + std::to_string(e * e * e) + " unknowns=" + std::to_string(l.rows) +
			    " blocks=" + std::to_string(blocks) + " iterations=" + std::to_string(iterations),
		    times, correct, &host);
	CHECK(cudaFree(sums));
	CHECK(cudaFree(p));
	CHECK(cudaFree(errors));
	CHECK(cudaEventDestroy(assembled));
	return correct ? 0 : 1;
}
