/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * host.cuh - what the benchmarks' host threads share: their clock, the bound on every wait for
 * the GPU, and what they do when a wait gives up.
 */
#ifndef WIC_BENCH_HOST_CUH
#define WIC_BENCH_HOST_CUH

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "../apps/check.cuh"

namespace bench {

using clock_type = std::chrono::steady_clock;

/* Every wait for the GPU gives up after this long: a kernel may hang, the program must not. */
constexpr uint64_t timeout_ns = 2000000000;
constexpr double timeout_s = 2.0;

inline double seconds_since(clock_type::time_point t)
{
	return std::chrono::duration<double>(clock_type::now() - t).count();
}

inline double us_between(clock_type::time_point a, clock_type::time_point b)
{
	return std::chrono::duration<double, std::micro>(b - a).count();
}

/*
 * Exits after a wait gave up: a kernel may still be spinning, so nothing after it is safe, the
 * runtime's teardown at exit() included, which would wait for that kernel.
 */
[[noreturn]] inline void stuck(const char *what)
{
	fprintf(stderr, "%s: a wait gave up after %.0f s or a check failed; stopping\n", what, timeout_s);
	fflush(stdout);
	fflush(stderr);
	std::_Exit(1); /* the JSON lines are flushed as written */
}

/* Waits for @stream's work, or gives up after a second more than a wait may take. */
inline void finish(cudaStream_t stream, const char *what)
{
	const auto start = clock_type::now();
	cudaError_t err;
	while ((err = cudaStreamQuery(stream)) == cudaErrorNotReady)
		if (seconds_since(start) > timeout_s + 1)
			stuck(what);
	CHECK(err);
}

/* Spins until *@word, written by a GPU, reaches @want; false after 2 s or on the failure value ~0. */
inline bool host_wait(const unsigned int *word, unsigned int want)
{
	const auto start = clock_type::now();
	for (unsigned spins = 0;; spins++) {
		const unsigned int v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
		if (v == ~0u)
			return false;
		if ((int)(v - want) >= 0)
			return true;
		if (spins % 4096 == 0 && seconds_since(start) > timeout_s)
			return false;
	}
}

} /* namespace bench */

#endif /* WIC_BENCH_HOST_CUH */
