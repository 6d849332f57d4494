/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * misuse_test - what wic.cuh answers when it is used wrongly, the same for every host-producer
 * transport (push, poll, alg1, mapped, tagged), on a GPU with the stock driver:
 *  - publish() of a slot whose last generation was not consumed: WIC_EBUSY, nothing written
 *    (reuse::checked, the default); reuse::caller overwrites;
 *  - recv() of a generation the slot no longer holds: WIC_ESTALE (typed, run-time and block
 *    forms), the generation it holds: WIC_OK with its data;
 *  - a slot or warp out of range on the device: WIC_EINVALID, nothing read;
 *  - a timeout of 0 looks once, on the device and on the host; a timeout waits that long;
 *  - the legacy default stream: WIC_ESTREAM for every transport; a publish() on the consumer
 *    kernel's own stream: accepted, then WIC_ESTREAM from wait_free() (push, tagged);
 *  - next_generation() of a bad slot: WIC_EINVALID from its checked form;
 *  - results: result_flow keeps a kernel from overwriting a result the host has not release()d,
 *    and times out without the release; post_result_warp() posts a warp's part;
 *  - co_resident() refuses a grid that cannot be resident at once.
 * Written against the public headers only. Exits 0 when every check passed; one line per check.
 */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <wic/wic.cuh>

#include "check_outcome.h"

namespace {

int failures;

void check(bool ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	failures += !ok;
}

constexpr uint64_t second_ns = 1000ULL * 1000 * 1000;
constexpr uint32_t probes = 9;

/*
 * One warp asks a channel of 2 slots, 1 warp per batch, whose slot 0 holds generation 1 (and
 * held 0) and whose slot 1 holds none, what recv() answers: codes[i] per probe, ns[0] and [1]
 * the time the two timed-out waits took, *first the first byte of generation 1's message.
 */
template <wic::transport K>
__global__ void probe(wic::channel ch, int *codes, unsigned long long *ns, uint8_t *first)
{
	const uint8_t *m;
	int c[probes];

	c[0] = wic::recv<K>(ch, 0, 0, 0, &m, second_ns);
	c[1] = wic::recv<K>(ch, 0, 1, 0, &m, second_ns);
	if (c[1] == WIC_OK && threadIdx.x == 0)
		*first = m[0];
	c[2] = wic::recv(ch, 0, 0, 0, &m, second_ns);
	c[3] = wic::recv<K>(ch, 2, 0, 0, &m);
	c[4] = wic::recv<K>(ch, 0, 1, 1, &m);
	uint64_t t0 = wic::detail::globaltimer();
	c[5] = wic::recv<K>(ch, 1, 0, 0, &m, 0);
	const uint64_t once = wic::detail::globaltimer() - t0;
	t0 = wic::detail::globaltimer();
	c[6] = wic::recv<K>(ch, 1, 0, 0, &m, second_ns / 1000);
	const uint64_t waited = wic::detail::globaltimer() - t0;
	c[7] = wic::recv_block<K>(ch, 0, 0, &m, second_ns);
	c[8] = wic::recv_block<K>(ch, 3, 0, &m);
	if (threadIdx.x == 0) {
		for (uint32_t i = 0; i < probes; i++)
			codes[i] = c[i];
		ns[0] = once;
		ns[1] = waited;
	}
}

/* Waits for generation 0 of slot 0 for up to @timeout_ns: *@code gets what recv() said. */
template <wic::transport K>
__global__ void wait_first(wic::channel ch, uint64_t timeout_ns, int *code)
{
	const uint8_t *m;
	const int rc = wic::recv<K>(ch, 0, 0, threadIdx.x / 32, &m, timeout_ns);
	if (threadIdx.x == 0)
		*code = rc;
}

template <typename T>
T *device_array(size_t n)
{
	T *p;
	CHECK(cudaMalloc(&p, n * sizeof(T)));
	CHECK(cudaMemset(p, 0, n * sizeof(T)));
	return p;
}

template <typename T>
T from_device(const T *p)
{
	T v;
	CHECK(cudaMemcpy(&v, p, sizeof(T), cudaMemcpyDeviceToHost));
	return v;
}

template <wic::transport K>
void host_and_device(cudaStream_t stream)
{
	const char *name = wic::transport_name(K);
	char what[1024];
	uint8_t batch[128]; /* as many bytes as publish_many() of two slots reads */

	/* reuse::checked: the second publish of an unconsumed slot is refused and writes nothing. */
	{
		wic::host_channel ch;
		CHECK(ch.create(K, 2, 64, 1));
		memset(batch, 1, sizeof(batch));
		CHECK(ch.publish(0, batch, 64, stream));
		const wic::outcome again = ch.publish(0, batch, 64, stream);
		const wic::outcome again_many = ch.publish_many(0, 2, batch, stream);
		unsigned int next = 0;
		const wic::outcome bad_next = ch.next_generation(2, &next);
		const bool counted = ch.next_generation(0, &next).ok() && next == 1 && ch.next_generation(1) == 0;
		const auto t0 = std::chrono::steady_clock::now();
		const wic::outcome once = ch.wait_free(0, 0);
		const double once_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
		const wic::outcome legacy = ch.publish(1, batch, 64, 0);
		const wic::outcome legacy2 = ch.publish(1, batch, 64, cudaStreamLegacy);
		const wic::outcome legacy_many = ch.publish_many(1, 1, batch, 0);
		const cudaError_t as_cuda = again; /* what code written for cudaError_t sees */
		snprintf(what, sizeof(what),
			 "%s: publish() of an unconsumed slot: %s (%s), publish_many(): %s; next_generation(bad): %s; "
			 "wait_free(busy, 0): %s in %.3f ms; the legacy default stream: %s, %s, %s",
			 name, again.name(), cudaGetErrorName(as_cuda), again_many.name(), bad_next.name(), once.name(),
			 once_ms, legacy.name(), legacy2.name(), legacy_many.name());
		check(again.status() == WIC_EBUSY && as_cuda == cudaErrorNotReady && again_many.status() == WIC_EBUSY &&
			      bad_next.status() == WIC_EINVALID && counted && once.status() == WIC_ETIMED_OUT &&
			      once_ms < 1.0 && legacy.status() == WIC_ESTREAM && legacy2.status() == WIC_ESTREAM &&
			      legacy_many.status() == WIC_ESTREAM && ch.next_generation(1) == 0,
		      what);
		CHECK(cudaStreamSynchronize(stream));
	}

	/* reuse::caller: slot 0 overwritten with generation 1; the device's answers. */
	{
		wic::host_channel ch;
		CHECK(ch.create(K, 2, 64, 1, wic::reuse::caller));
		memset(batch, 10, sizeof(batch));
		CHECK(ch.publish(0, batch, 64, stream));
		memset(batch, 11, sizeof(batch));
		const wic::outcome over = ch.publish(0, batch, 64, stream);
		CHECK(cudaStreamSynchronize(stream));
		int *codes = device_array<int>(probes);
		unsigned long long *ns = device_array<unsigned long long>(2);
		uint8_t *first = device_array<uint8_t>(1);
		probe<K><<<1, 32>>>(ch.device(), codes, ns, first);
		CHECK(cudaDeviceSynchronize());
		int c[probes];
		unsigned long long t[2];
		CHECK(cudaMemcpy(c, codes, sizeof(c), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(t, ns, sizeof(t), cudaMemcpyDeviceToHost));
		const uint8_t byte = from_device(first);
		snprintf(what, sizeof(what),
			 "%s: reuse::caller overwrites (%s); recv() of the overwritten generation: %s, typed %s, block "
			 "%s; of the current one: %s (byte %u); slot and warp out of range: %s, %s, block %s; "
			 "timeout 0: %s after %.1f us; 1 ms: %s after %.3f ms",
			 name, over.name(), wic::error_name(c[2]), wic::error_name(c[0]), wic::error_name(c[7]),
			 wic::error_name(c[1]), byte, wic::error_name(c[3]), wic::error_name(c[4]), wic::error_name(c[8]),
			 wic::error_name(c[5]), t[0] / 1e3, wic::error_name(c[6]), t[1] / 1e6);
		check(over.ok() && c[0] == WIC_ESTALE && c[2] == WIC_ESTALE && c[7] == WIC_ESTALE && c[1] == WIC_OK &&
			      byte == 11 && c[3] == WIC_EINVALID && c[4] == WIC_EINVALID && c[8] == WIC_EINVALID &&
			      c[5] == WIC_ETIMED_OUT && t[0] < 50000 && c[6] == WIC_ETIMED_OUT && t[1] >= 1000000 &&
			      t[1] < 50000000,
		      what);
		CHECK(cudaFree(codes));
		CHECK(cudaFree(ns));
		CHECK(cudaFree(first));
	}

	/*
	 * The stream rule broken: publish() on the consumer kernel's own stream is queued behind
	 * the kernel, which times out; meanwhile wait_free() tells why. poll's publish() waits for
	 * its copy itself, alg1 and mapped use no stream.
	 */
	if (K == wic::transport::push || K == wic::transport::tagged) {
		wic::host_channel ch;
		CHECK(ch.create(K, 1, 64, 1));
		int *code = device_array<int>(1);
		wait_first<K><<<1, 32, 0, stream>>>(ch.device(), second_ns / 2, code);
		CHECK(cudaGetLastError());
		const wic::outcome queued = ch.publish(0, batch, 64, stream);
		const wic::outcome waited = ch.wait_free(0, second_ns / 10);
		CHECK(cudaStreamSynchronize(stream));
		const cudaError_t sticky = cudaGetLastError();
		const int rc = from_device(code);
		snprintf(what, sizeof(what),
			 "%s: publish() on the consumer kernel's stream: %s, then wait_free(): %s (%s); the kernel's "
			 "recv(): %s; no runtime error left behind: %s",
			 name, queued.name(), waited.name(), cudaGetErrorName(waited), wic::error_name(rc),
			 cudaGetErrorName(sticky));
		check(queued.ok() && waited.status() == WIC_ESTREAM && (cudaError_t)waited == cudaErrorTimeout &&
			      rc == WIC_ETIMED_OUT && sticky == cudaSuccess,
		      what);
		CHECK(cudaFree(code));
	}
}

/*
 * Block-wide parts (post_result()) and warp parts (post_result_warp()) of @generations result
 * generations through @slots slots: generation g's slot is written only after the host
 * release()d g - slots; every word of every part holds its generation.
 */
__global__ void post_in_turn(wic::result_view results, uint32_t generations, int *status)
{
	const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32;
	__shared__ int allowed;
	wic::result_flow flow; /* thread 0's */

	for (uint32_t g = 0; g < generations; g++) {
		if (threadIdx.x == 0)
			allowed = flow.wait(results, g, 5 * second_ns);
		__syncthreads();
		const int verdict = allowed;
		__syncthreads(); /* every thread read it before thread 0 writes the next */
		if (verdict != WIC_OK) {
			if (threadIdx.x == 0)
				*status = verdict;
			return;
		}
		uint32_t *slot = reinterpret_cast<uint32_t *>(results.slot(g));
		slot[w * 32 + lane] = g;
		wic::post_result_warp(results, g, w);
	}
}

__global__ void wait_unreleased(wic::result_view results, int *code)
{
	wic::result_flow flow;
	*code = flow.wait(results, results.slots, second_ns / 1000);
}

void results()
{
	const uint32_t slots = 2, generations = 12, warps = 4;
	wic::result_channel r;
	CHECK(r.create(slots, warps * 32 * sizeof(uint32_t), warps));
	int *status = device_array<int>(1);
	post_in_turn<<<1, warps * 32>>>(r.device(), generations, status);
	CHECK(cudaGetLastError());
	size_t wrong = 0;
	bool waited = true;
	for (uint32_t g = 0; g < generations; g++) {
		for (uint32_t p = 0; p < warps; p++)
			waited &= r.wait(g, p, 5 * second_ns).ok();
		/* A kernel that did not wait would overwrite this slot with g + 2 meanwhile. */
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
		const uint32_t *words = reinterpret_cast<const uint32_t *>(r.host().slot(g));
		for (uint32_t i = 0; i < warps * 32; i++)
			wrong += __atomic_load_n(&words[i], __ATOMIC_ACQUIRE) != g;
		CHECK(r.release(g));
	}
	CHECK(cudaDeviceSynchronize());
	const int rc = from_device(status);
	/* Releasing an older generation again takes nothing back. */
	CHECK(r.release(0));
	const bool monotonic = *r.host().released == generations;
	const auto t0 = std::chrono::steady_clock::now();
	const wic::outcome once = r.wait(generations, 0, 0);
	const double once_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
	wic::result_channel fresh;
	CHECK(fresh.create(slots, 64, 1));
	int *code = device_array<int>(1);
	wait_unreleased<<<1, 1>>>(fresh.device(), code);
	CHECK(cudaDeviceSynchronize());
	const int unreleased = from_device(code);
	char what[512];
	snprintf(what, sizeof(what),
		 "results: %u generations of %u warp parts through %u slots with result_flow and release(): "
		 "%zu words overwritten early, kernel %s; wait(_, _, 0): %s in %.3f ms; without release(): %s",
		 generations, warps, slots, wrong, wic::error_name(rc), once.name(), once_ms, wic::error_name(unreleased));
	check(waited && wrong == 0 && rc == WIC_OK && monotonic && once.status() == WIC_ETIMED_OUT && once_ms < 1.0 &&
		      unreleased == WIC_ETIMED_OUT,
	      what);
	CHECK(cudaFree(status));
	CHECK(cudaFree(code));
}

__global__ void wide(int *out)
{
	out[blockIdx.x] = threadIdx.x;
}

void co_residency()
{
	int device, sms, per_sm;
	CHECK(cudaGetDevice(&device));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
	CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, wide, 1024, 0));
	const wic::outcome fits = wic::co_resident(wide, sms * per_sm, 1024);
	const wic::outcome over = wic::co_resident(wide, sms * per_sm + 1, 1024);
	char what[160];
	snprintf(what, sizeof(what), "co_resident(): %d x %d blocks of 1024 threads: %s; one more: %s (%s)", sms, per_sm,
		 fits.name(), over.name(), cudaGetErrorName(over));
	check(fits.ok() && over.status() == WIC_EEXHAUSTED, what);
}

} /* namespace */

int main()
{
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	host_and_device<wic::transport::push>(stream);
	host_and_device<wic::transport::poll>(stream);
	host_and_device<wic::transport::alg1>(stream);
	host_and_device<wic::transport::mapped>(stream);
	host_and_device<wic::transport::tagged>(stream);
	results();
	co_residency();
	CHECK(cudaStreamDestroy(stream));
	printf("%s: %d failed\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
