/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * host.cuh - what the benchmarks' host threads share: their clock, the bound on every wait for
 * the GPU, and what they do when a wait gives up.
 */
#ifndef WIC_BENCH_HOST_CUH
#define WIC_BENCH_HOST_CUH

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <thread>

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

/*
 * blocking_call_guard - stops the program (stuck()) once the call it spans took a second more
 * than a wait may: a CUDA call that queues work on a stream whose queue is full blocks the host
 * inside the driver until the GPU ran some of it, and when that work waits for something that
 * never comes (a producer kernel that gave up), no wait of ours can time the call out. One
 * background thread, started by the first guard, watches the armed deadline; one guard at a time.
 */
class blocking_call_guard {
public:
	explicit blocking_call_guard(const char *what)
	{
		static const bool watching = (std::thread(watch).detach(), true);
		const auto limit = std::chrono::duration<double>(timeout_s + 1);

		(void)watching;
		what_.store(what, std::memory_order_relaxed);
		deadline_.store((clock_type::now() + std::chrono::duration_cast<clock_type::duration>(limit))
					.time_since_epoch()
					.count(),
				std::memory_order_release);
	}
	~blocking_call_guard() { deadline_.store(0, std::memory_order_relaxed); }
	blocking_call_guard(const blocking_call_guard &) = delete;
	blocking_call_guard &operator=(const blocking_call_guard &) = delete;

private:
	/* The armed call's deadline (steady_clock ticks), 0 when none is armed, and its name. */
	static inline std::atomic<clock_type::rep> deadline_{0};
	static inline std::atomic<const char *> what_{nullptr};

	[[noreturn]] static void watch()
	{
		for (;;) {
			std::this_thread::sleep_for(std::chrono::milliseconds(100));
			const clock_type::rep deadline = deadline_.load(std::memory_order_acquire);
			if (deadline && clock_type::now().time_since_epoch().count() > deadline)
				stuck(what_.load(std::memory_order_relaxed));
		}
	}
};

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
