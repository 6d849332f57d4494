/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * newcomer - the loop a new user writes from device/README.md and the public headers alone,
 * on a GPU with the stock driver, for one transport (host producer):
 *
 *   consumer kernel, one block of 16 warps per SM, co_resident() checked before the launch:
 *     per generation: each warp recv<K>() its message and sums its 8-byte words; the block
 *     reports the slot consumed(), waits for a free result slot (result_flow), writes
 *     its sum as its part of the result generation and post_result()s it;
 *   host, one thread: per generation, per block: wait_free(slot), stamp the batch's first word,
 *     publish(slot) (coalesce()d with --coalesce); after each generation, every result
 *     generation that is complete is checked against the sum the host expects and release()d.
 *
 * Two slots per block (--slots-per-block), so the host publishes while the blocks read.
 * The loop's time, from the first publish to the last result checked, is compared with one
 * cudaMemcpyAsync of the same bytes from pinned memory into device memory (the best of three, in
 * the same run): "x bulk".
 *
 * Usage: newcomer TRANSPORT BATCH_BYTES [--coalesce | --coalesce-bytes N] [--total MIB]
 *        [--max-over-bulk X] [--block] [--no-results]   (--block: thread 0 waits for the block, recv_block<K>(); --no-results:
 *        no results back, the loop's time ends with the kernel)
 * Exits 0 when every sum matched, no call failed and (with --max-over-bulk) the loop took at
 * most X times the bulk copy; prints one line, "ok" or "FAIL" first.
 */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <wic/wic.cuh>

#include "check_outcome.h"

namespace {

constexpr uint32_t warps = 16;
constexpr uint64_t timeout_ns = 10ULL * 1000 * 1000 * 1000;
constexpr uint32_t result_slots = 32;

/*
 * Block b: generation g of slot (g % depth) * blocks + b is its batch (generation g / depth of
 * the slot), where depth = ch.slots / blocks; the block's sum of the
 * batch's 8-byte words is part b of result generation g. A failure is stored in *@status, after
 * which the block stops.
 */
template <wic::transport K>
__global__ void consume(wic::channel ch, uint32_t generations, wic::result_view results, bool block_waits,
			bool send_results, int *status)
{
	const uint32_t b = blockIdx.x, lane = threadIdx.x % 32, w = threadIdx.x / 32, depth = ch.slots / gridDim.x;
	__shared__ unsigned long long sum;
	__shared__ int failed;
	wic::result_flow flow; /* thread 0's */

	for (uint32_t g = 0; g < generations; g++) {
		const uint32_t slot = (g % depth) * gridDim.x + b;
		if (threadIdx.x == 0) {
			sum = 0;
			failed = *(volatile int *)status;
		}
		__syncthreads();
		if (failed)
			return;
		const uint8_t *message;
		int rc;
		if (block_waits) {
			rc = wic::recv_block<K>(ch, slot, g / depth, &message, timeout_ns);
			message += w * ch.message_bytes;
		} else {
			rc = wic::recv<K>(ch, slot, g / depth, w, &message, timeout_ns);
		}
		unsigned long long mine = 0;
		if (rc == WIC_OK) {
			const uint64_t *words = reinterpret_cast<const uint64_t *>(message);
			for (uint32_t i = lane; i < ch.message_bytes / 8; i += 32)
				mine += words[i];
		} else if (lane == 0) {
			atomicCAS(status, 0, rc);
		}
		for (int d = 16; d; d /= 2)
			mine += __shfl_down_sync(0xffffffff, mine, d);
		if (lane == 0)
			atomicAdd(&sum, mine);
		__syncthreads(); /* every warp read its message */
		if (threadIdx.x == 0)
			wic::consumed(ch, slot, g / depth);
		if (!send_results)
			continue;
		if (threadIdx.x == 0) {
			const int free = flow.wait(results, g, timeout_ns);
			if (free != WIC_OK)
				atomicCAS(status, 0, free);
			reinterpret_cast<unsigned long long *>(results.slot(g))[b] = sum;
		}
		wic::post_result(results, g, b);
	}
}

double seconds(std::chrono::steady_clock::time_point since)
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

/* The best of three copies of @bytes from pinned host memory into device memory, in seconds. */
double bulk_copy_s(size_t bytes)
{
	void *host, *device;
	cudaStream_t stream;
	CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
	CHECK(cudaMalloc(&device, bytes));
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	memset(host, 0x5a, bytes);
	double best = 1e9;
	for (int i = 0; i < 3; i++) {
		const auto start = std::chrono::steady_clock::now();
		CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
		CHECK(cudaStreamSynchronize(stream));
		best = std::min(best, seconds(start));
	}
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(device));
	CHECK(cudaFreeHost(host));
	return best;
}

struct options {
	wic::transport kind;
	uint32_t batch;
	bool coalesce = false;
	size_t coalesce_bytes = wic::coalesce_bytes;
	uint64_t total = 512ULL << 20;
	double max_over_bulk = 0;
	uint32_t depth = 2;
	bool block_waits = false;
	bool send_results = true;
};

template <wic::transport K>
int run(const options &opt)
{
	int device, sms;
	CHECK(cudaGetDevice(&device));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
	const uint32_t blocks = (uint32_t)sms, slots = opt.depth * blocks, words = opt.batch / 8;
	const uint32_t generations = (uint32_t)std::max<uint64_t>(4, opt.total / ((uint64_t)opt.batch * blocks));
	const uint64_t total = (uint64_t)generations * blocks * opt.batch;

	wic::host_channel ch;
	CHECK(ch.create(K, slots, opt.batch / warps, warps));
	if (opt.coalesce)
		CHECK(ch.coalesce(opt.coalesce_bytes));
	wic::result_channel results;
	CHECK(results.create(result_slots, blocks * sizeof(unsigned long long), blocks));
	CHECK(wic::co_resident(consume<K>, blocks, warps * 32));

	/* The batches: one pinned buffer per slot, its words but the first fixed. */
	uint64_t *src;
	CHECK(cudaHostAlloc(&src, (size_t)slots * opt.batch, cudaHostAllocDefault));
	std::vector<unsigned long long> rest(slots, 0);
	for (uint32_t s = 0; s < slots; s++)
		for (uint32_t i = 1; i < words; i++)
			rest[s] += src[(size_t)s * words + i] = (uint64_t)s * 0x9e3779b97f4a7c15ULL + i * 0x100000001b3ULL;
	std::vector<unsigned long long> expected((size_t)generations * blocks);

	int *status;
	CHECK(cudaMalloc(&status, sizeof(int)));
	CHECK(cudaMemset(status, 0, sizeof(int)));
	cudaStream_t kernel_stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&kernel_stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	CHECK(cudaDeviceSynchronize());
	consume<K><<<blocks, warps * 32, 0, kernel_stream>>>(ch.device(), generations, results.device(), opt.block_waits,
							      opt.send_results, status);
	CHECK(cudaGetLastError());

	uint32_t checked = 0;
	size_t wrong = 0;
	/* Checks and releases every result generation whose parts are all there; true if one was. */
	auto drain = [&]() {
		bool any = false;
		if (!opt.send_results) {
			checked = generations;
			return false;
		}
		while (checked < generations) {
			for (uint32_t b = 0; b < blocks; b++)
				if (!results.ready(checked, b))
					return any;
			const auto *sums = reinterpret_cast<const unsigned long long *>(results.host().slot(checked));
			for (uint32_t b = 0; b < blocks; b++)
				wrong += sums[b] != expected[(size_t)checked * blocks + b];
			CHECK(results.release(checked++));
			any = true;
		}
		return any;
	};

	const auto start = std::chrono::steady_clock::now();
	for (uint32_t g = 0; g < generations; g++) {
		for (uint32_t b = 0; b < blocks; b++) {
			const uint32_t slot = (g % opt.depth) * blocks + b;
			CHECK(ch.wait_free(slot, timeout_ns));
			uint64_t *batch = src + (size_t)slot * words;
			batch[0] = (uint64_t)g << 32 | b;
			expected[(size_t)g * blocks + b] = rest[slot] + batch[0];
			CHECK(ch.publish(slot, batch, opt.batch, copy_stream));
		}
		drain();
	}
	CHECK(ch.flush());
	const auto last = std::chrono::steady_clock::now();
	while (checked < generations) {
		if (!drain() && std::chrono::steady_clock::now() - last > std::chrono::nanoseconds(timeout_ns))
			break;
	}
	CHECK(cudaStreamSynchronize(kernel_stream));
	const double loop_s = seconds(start);
	int rc;
	CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
	const double bulk_s = bulk_copy_s(total);
	const double over = loop_s / bulk_s;
	const bool ok = rc == WIC_OK && checked == generations && wrong == 0 &&
			(opt.max_over_bulk == 0 || over <= opt.max_over_bulk);
	printf("%s newcomer %-6s %8u B batches%s%s%s%s: %u generations x %u blocks (%llu MiB), %zu wrong sums, "
	       "status %s; loop %.2f ms = %.1f GB/s, bulk copy %.2f ms = %.1f GB/s: %.2fx bulk%s\n",
	       ok ? "ok" : "FAIL", wic::transport_name(K), opt.batch, opt.coalesce ? " coalesced by " : "",
	       opt.coalesce ? std::to_string(opt.coalesce_bytes >> 10).append(" KiB").c_str() : "",
	       opt.block_waits ? " block-waits" : "", opt.send_results ? "" : " no-results", generations,
	       blocks, (unsigned long long)(total >> 20), wrong, wic::error_name(rc), loop_s * 1e3, total / loop_s / 1e9,
	       bulk_s * 1e3, total / bulk_s / 1e9, over,
	       opt.max_over_bulk ? (std::string(" (at most ") + std::to_string(opt.max_over_bulk) + ")").c_str() : "");
	CHECK(cudaStreamDestroy(kernel_stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(status));
	CHECK(cudaFreeHost(src));
	return ok ? 0 : 1;
}

[[noreturn]] void usage()
{
	fprintf(stderr, "usage: newcomer push|poll|alg1|mapped|tagged BATCH_BYTES [--coalesce | --coalesce-bytes N] "
			"[--total MIB] [--max-over-bulk X] [--block] [--no-results]\n");
	exit(2);
}

} /* namespace */

int main(int argc, char **argv)
{
	if (argc < 3)
		usage();
	options opt;
	const std::string name = argv[1];
	if (name == "push")
		opt.kind = wic::transport::push;
	else if (name == "poll")
		opt.kind = wic::transport::poll;
	else if (name == "alg1")
		opt.kind = wic::transport::alg1;
	else if (name == "mapped")
		opt.kind = wic::transport::mapped;
	else if (name == "tagged")
		opt.kind = wic::transport::tagged;
	else
		usage();
	opt.batch = (uint32_t)strtoul(argv[2], nullptr, 0);
	if (opt.batch < warps * 8 || opt.batch % (warps * 8) || !opt.depth)
		usage();
	for (int i = 3; i < argc; i++) {
		const std::string arg = argv[i];
		if (arg == "--coalesce")
			opt.coalesce = true;
		else if (arg == "--coalesce-bytes" && i + 1 < argc)
			opt.coalesce = true, opt.coalesce_bytes = strtoull(argv[++i], nullptr, 0);
		else if (arg == "--total" && i + 1 < argc)
			opt.total = strtoull(argv[++i], nullptr, 0) << 20;
		else if (arg == "--max-over-bulk" && i + 1 < argc)
			opt.max_over_bulk = strtod(argv[++i], nullptr);
		else if (arg == "--slots-per-block" && i + 1 < argc)
			opt.depth = (uint32_t)strtoul(argv[++i], nullptr, 0);
		else if (arg == "--block")
			opt.block_waits = true;
		else if (arg == "--no-results")
			opt.send_results = false;
		else
			usage();
	}
	switch (opt.kind) {
	case wic::transport::push:
		return run<wic::transport::push>(opt);
	case wic::transport::poll:
		return run<wic::transport::poll>(opt);
	case wic::transport::alg1:
		return run<wic::transport::alg1>(opt);
	case wic::transport::mapped:
		return run<wic::transport::mapped>(opt);
	default:
		return run<wic::transport::tagged>(opt);
	}
}
