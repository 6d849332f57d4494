/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * inplace.cu - what a host producer's stores cost when it writes its batch in place, into the
 * consumer's run (CPU-resident managed memory that the consumer GPU maps remotely once the run
 * is completed), against the same stores into ordinary memory, as it writes a slot buffer.
 *
 * The patched driver is needed for a held fault, not for this: the stock driver makes the same
 * page state with advice. With cudaMemAdviseSetPreferredLocation(cudaCpuDeviceId) and
 * SetAccessedBy(GPU), a GPU read of a page maps it remotely and leaves it in CPU memory, as the
 * hook's map of a completed run does; the producer's stores then go through the CPU mapping
 * nvidia-uvm made at first touch. Rows, one host thread each, every byte of every batch written
 * (memcpy from a source buffer):
 *  - malloc: ordinary memory, touched before (the slot buffer's case);
 *  - managed-cpu: managed, preferred on the CPU, read by a GPU kernel before every pass (the run);
 *  - managed-cpu-first: the same allocation's first pass from the CPU after it was populated by
 *    the GPU's read (each page's first CPU store may fault once);
 *  - managed-gpu: managed without advice, read by the GPU before every pass: the pages migrate
 *    to the GPU and each pass moves them back (what docs/architecture.md warns of).
 * Prints one JSON line per row: bytes per pass, passes, GB/s (median pass).
 *
 * Usage: inplace [MiB per pass, default 16]
 */
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "host.cuh"

namespace {

constexpr int passes = 9;

void check(cudaError_t err, const char *what)
{
	if (err != cudaSuccess) {
		fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
		std::exit(1);
	}
}

/* One thread per 4 KiB page reads its first word, as a consumer warp reads its run. */
__global__ void read_pages(const uint64_t *mem, uint64_t pages, uint64_t *sink)
{
	uint64_t page = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	if (page < pages && mem[page * 512] == 0x5749434500000001ULL)
		*sink = page;
}

void gpu_reads(const void *mem, size_t bytes, uint64_t *sink)
{
	uint64_t pages = bytes / 4096;
	read_pages<<<(unsigned)((pages + 255) / 256), 256>>>(static_cast<const uint64_t *>(mem), pages, sink);
	check(cudaDeviceSynchronize(), "GPU read");
}

double gbps(size_t bytes, double seconds)
{
	return bytes / seconds / 1e9;
}

/* Times one pass of memcpy into @dst; returns its seconds. */
double pass(void *dst, const void *src, size_t bytes)
{
	auto start = bench::clock_type::now();
	std::memcpy(dst, src, bytes);
	return bench::seconds_since(start);
}

void row(const char *name, size_t bytes, std::vector<double> seconds)
{
	std::sort(seconds.begin(), seconds.end());
	double median = seconds[seconds.size() / 2];
	printf("{\"row\":\"%s\",\"bytes\":%zu,\"passes\":%zu,\"gbps_median\":%.3f,\"gbps_best\":%.3f,"
	       "\"gbps_worst\":%.3f}\n",
	       name, bytes, seconds.size(), gbps(bytes, median), gbps(bytes, seconds.front()),
	       gbps(bytes, seconds.back()));
	fflush(stdout);
}

} /* namespace */

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 16;
	size_t bytes = mib << 20;
	int device = 0;
	cudaDeviceProp prop;
	check(cudaGetDeviceProperties(&prop, device), "properties");
	printf("{\"gpu\":\"%s\",\"what\":\"host stores into a run written in place\",\"mib\":%zu}\n", prop.name, mib);

	std::vector<uint8_t> src(bytes);
	for (size_t i = 0; i < bytes; i++)
		src[i] = (uint8_t)(i * 31 + 7);
	uint64_t *sink;
	check(cudaMalloc(&sink, sizeof(*sink)), "sink");

	/* The slot buffer's case. */
	std::vector<uint8_t> plain(bytes, 1);
	std::vector<double> seconds;
	for (int i = 0; i < passes; i++)
		seconds.push_back(pass(plain.data(), src.data(), bytes));
	row("malloc", bytes, seconds);

	/* The run: CPU-resident, mapped remotely by the GPU's reads. */
	void *run;
	check(cudaMallocManaged(&run, bytes), "managed run");
#if CUDART_VERSION >= 13000 /* a location, no longer a device number */
	cudaMemLocation host = {}, gpu = {};
	host.type = cudaMemLocationTypeHost;
	gpu.type = cudaMemLocationTypeDevice;
	gpu.id = device;
	check(cudaMemAdvise(run, bytes, cudaMemAdviseSetPreferredLocation, host), "advise CPU");
	check(cudaMemAdvise(run, bytes, cudaMemAdviseSetAccessedBy, gpu), "advise accessed by");
#else
	check(cudaMemAdvise(run, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId), "advise CPU");
	check(cudaMemAdvise(run, bytes, cudaMemAdviseSetAccessedBy, device), "advise accessed by");
#endif
	gpu_reads(run, bytes, sink); /* populates, maps remotely; no CPU mapping yet */
	row("managed-cpu-first", bytes, {pass(run, src.data(), bytes)});
	seconds.clear();
	for (int i = 0; i < passes; i++) {
		gpu_reads(run, bytes, sink);
		seconds.push_back(pass(run, src.data(), bytes));
	}
	row("managed-cpu", bytes, seconds);
	if (std::memcmp(run, src.data(), bytes) != 0) {
		fprintf(stderr, "the run does not hold what was written\n");
		return 1;
	}

	/* No advice: every GPU read migrates the pages, every pass moves them back. */
	void *roaming;
	check(cudaMallocManaged(&roaming, bytes), "managed");
	std::memset(roaming, 1, bytes);
	seconds.clear();
	for (int i = 0; i < passes; i++) {
		gpu_reads(roaming, bytes, sink);
		seconds.push_back(pass(roaming, src.data(), bytes));
	}
	row("managed-gpu", bytes, seconds);

	check(cudaFree(roaming), "free");
	check(cudaFree(run), "free");
	check(cudaFree(sink), "free");
	return 0;
}
