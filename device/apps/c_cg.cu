/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * C_CG - conjugate gradients (Mantevo HPCCG), alternating model, random access: solves A x = b
 * for a 7-point stencil on an N^3 grid plus N^3 / 2 random long-range symmetric couplings
 * (CSR, symmetric, strictly diagonally dominant, fresh couplings and b every run). Per
 * iteration the host sends the search direction p (one batch: each block's rows to its warp 0),
 * one persistent kernel computes q = A p, gathering p at random columns, and p.q, and returns
 * both through pinned memory; the host updates x, r and p in double (cg.cuh). The final x is
 * checked against a double-precision CPU CG of the same iteration count, and its residual.
 *
 * nowait: every direction depends on the previous q, so a first push run records them; the
 * timed run is the kernel alone with all of them published before it starts (the GPU's share
 * without any waiting: a lower bound). The host's updates are then replayed with the results
 * it returned and must reproduce the recorded directions.
 *
 * launch: no kernel waits; each iteration's two steps are kernels the channel launches once its
 * direction landed.
 * Usage: c_cg MODE [REPS] [N] [ITERATIONS]   (MODE: push, poll, alg1, launch, nowait; N defaults to 64,
 * ITERATIONS to 50, REPS to 7; one block per SM, and only warp 0 of each block waits, so poll
 * spins with one warp per SM)
 * Prints the median wall time of REPS runs and whether every result matched.
 */
#include <random>

#include "cg.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 256;

__global__ void solve(app::forward fwd, wic::result_view back, cg::layout l, cg::csr_view a, float *p,
		      uint32_t iterations, app::grid_barrier grid, int *errors)
{
	cg::iterate(fwd, back, l, a, p, iterations, grid, errors);
}


/*
 * The matrix: off the diagonal -1 for each grid neighbour and each random partner (rows / 2
 * couplings (i, j), i != j, entered in both rows); on it, the row's off-diagonal count plus 1.
 * Symmetric and strictly diagonally dominant, so SPD with eigenvalues >= 1; every entry is a
 * small integer, exact in float.
 */
cg::csr make_matrix(uint32_t n, std::mt19937_64 &rng)
{
	cg::csr a;
	a.rows = n * n * n;
	const uint32_t couplings = a.rows / 2;
	std::uniform_int_distribution<uint32_t> any(0, a.rows - 1);
	std::vector<uint32_t> pair(2 * couplings);
	for (uint32_t c = 0; c < couplings; c++) {
		pair[2 * c] = any(rng);
		do
			pair[2 * c + 1] = any(rng);
		while (pair[2 * c + 1] == pair[2 * c]);
	}
	std::vector<uint32_t> count(a.rows, 1);
	for (uint32_t v : pair)
		count[v]++;
	auto neighbours = [&](uint32_t i, auto &&visit) {
		const uint32_t x = i % n, y = i / n % n, z = i / (n * n);
		if (x > 0)
			visit(i - 1);
		if (x + 1 < n)
			visit(i + 1);
		if (y > 0)
			visit(i - n);
		if (y + 1 < n)
			visit(i + n);
		if (z > 0)
			visit(i - n * n);
		if (z + 1 < n)
			visit(i + n * n);
	};
	for (uint32_t i = 0; i < a.rows; i++)
		neighbours(i, [&](uint32_t) { count[i]++; });
	a.row_ptr.assign(a.rows + 1, 0);
	for (uint32_t i = 0; i < a.rows; i++)
		a.row_ptr[i + 1] = a.row_ptr[i] + count[i];
	a.cols.resize(a.row_ptr[a.rows]);
	a.vals.assign(a.row_ptr[a.rows], -1.0);
	std::vector<uint32_t> next(a.row_ptr.begin(), a.row_ptr.end() - 1);
	for (uint32_t i = 0; i < a.rows; i++) {
		a.cols[next[i]] = i;
		a.vals[next[i]++] = count[i]; /* the count includes the diagonal: off-diagonals + 1 */
		neighbours(i, [&](uint32_t j) { a.cols[next[i]++] = j; });
	}
	for (uint32_t c = 0; c < couplings; c++) {
		const uint32_t i = pair[2 * c], j = pair[2 * c + 1];
		a.cols[next[i]++] = j;
		a.cols[next[j]++] = i;
	}
	return a;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[N] [ITERATIONS]", &cli, false, true))
		return 2;
	const uint32_t sms = app::sm_count();
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t n = cli.size(0, C_CG_N);
	const uint32_t iterations = cli.size(1, C_CG_ITERATIONS);
	if (reps < 1 || n < 2 || n > 512 || !iterations) {
		fprintf(stderr, "REPS and ITERATIONS must be positive, N between 2 and 512\n");
		return 2;
	}
	const uint32_t blocks = sms;
	const cg::layout l = cg::make_layout(n * n * n, blocks);
	float *p;
	int *errors;
	app::grid_counter barrier;
	CHECK(cudaMalloc(&p, 2 * (size_t)l.rows * sizeof(float)));
	CHECK(cudaMalloc(&errors, sizeof(int)));
	std::vector<double> times;
	std::vector<app::host_work> host;
	bool correct = true;
	std::random_device entropy;

	for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up */
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		const cg::csr a = make_matrix(n, rng);
		std::uniform_real_distribution<double> uniform(-1.0, 1.0);
		std::vector<double> b(l.rows);
		for (double &v : b)
			v = uniform(rng);
		cg::device_csr dev(a);
		dev.upload_values(a);
		cg::solver solver;

		app::alternating run;
		run.forward = {l.forward(iterations)};
		run.back = l.back(iterations);
		run.reset = [&] {
			CHECK(cudaMemset(p, 0xff, 2 * (size_t)l.rows * sizeof(float))); /* poison: NaN */
			CHECK(cudaMemset(errors, 0, sizeof(int)));
			barrier.reset();
		};
		run.launch = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, cudaStream_t s) {
			app::launch_cooperative(solve, blocks, threads, s, fwd[0], back, l, dev.view(), p, iterations,
						barrier.barrier(), errors);
		};
		run.launch_step = [&](const std::vector<app::forward> &fwd, const wic::result_view &back, uint32_t, uint32_t,
				      uint32_t k, cudaStream_t s) {
			cg::direction_step<<<blocks, threads, 0, s>>>(fwd[0], l, p, k, errors);
			cg::multiply_step<<<blocks, threads, 0, s>>>(fwd[0], back, l, dev.view(), p, k);
		};
		run.host = [&](app::host_io &io) { cg::host_iterations(io, 0, l, solver, b, iterations); };
		const app::exchange_timing t = app::exchange(mode, run);

		int failed;
		CHECK(cudaMemcpy(&failed, errors, sizeof(int), cudaMemcpyDeviceToHost));
		const std::vector<double> ref = cg::reference(a, b, iterations);
		const double x_error = app::relative_error(solver.x().data(), ref.data(), l.rows);
		const double res = cg::residual(a, b, solver.x()), res_ref = cg::residual(a, b, ref);
		/* float products: x within 1e-4 of the reference, and as converged to float precision */
		if (failed || !(x_error < 1e-4) || !(res <= 1.01 * res_ref + 1e-5) || !(t.replay_error < 1e-4)) {
			correct = false;
			fprintf(stderr,
				"C_CG %s rep %d: %d receives failed, x relative error %g, residual %g (reference %g), "
				"replay difference %g\n",
				app::mode_name(mode), rep, failed, x_error, res, res_ref, t.replay_error);
		}
		if (rep) {
			times.push_back(t.total_ms);
			host.push_back(t.host);
		}
	}
	app::report("C_CG", mode,
		    "rows=" + std::to_string(l.rows) + " blocks=" + std::to_string(blocks) +
			    " iterations=" + std::to_string(iterations),
		    times, correct, &host);
	CHECK(cudaFree(p));
	CHECK(cudaFree(errors));
	return correct ? 0 : 1;
}
