/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * alg1_probe - why the WIC paper's Algorithm 1 (Naive Communications) can hang on a GPU, and
 * which reading of it is correct there.
 *
 * Algorithm 1 keeps the data and one syncFlag per consumer block in UVM managed memory; thread
 * 0 of each block spins with atomicAdd(&syncFlag, 0) until the producer has set it to 1, then
 * reads the data. Here the producer is the host: it writes the block's data, then sets the
 * flag with a plain store (x86 stores are ordered, so the data is there first), as a host
 * producer of the paper's CPU-GPU applications would. Each variant changes one thing in the
 * consumer's wait:
 *
 *   atomic_dev    the paper's line: atomicAdd(&flag, 0), device scope
 *   atomic_sys    atomicAdd_system(&flag, 0): system scope
 *   volatile      a volatile load
 *   acquire_sys   an acquire load at system scope (ld.acquire.sys)
 *
 * and where the flag's page is when the wait starts: first touched by the host (resident in
 * host memory) or by the GPU (resident in GPU memory). Every wait gives up after 2 s.
 *
 * One-shot: the host stores once, about 20 ms after the launch. Each case prints one JSON line:
 * how many of the blocks saw the flag, how long after the kernel's start, and whether the data
 * read after the flag was the host's.
 *
 * Generations: as a CPU-GPU application runs, the host publishes generation g (data = g, then
 * flag = g) and waits for each block's acknowledgement (a word in pinned mapped memory the block
 * stores with system scope) before g + 1, 200 times: the flag's page moves back and forth
 * between the host's writes and the GPU's reads, and nvidia-uvm's thrashing detection may pin it
 * on one side and map it remotely on the other. Each case prints how many generations completed
 * before a wait gave up, the median round trip, and the wrong data words seen.
 *
 * Usage: alg1_probe [BLOCKS...]   (default: 1 and one per SM)
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../apps/check.cuh"

namespace {

enum class wait_kind : int { atomic_dev, atomic_sys, volatile_load, acquire_sys };
const char *const wait_names[] = {"atomic_dev", "atomic_sys", "volatile", "acquire_sys"};

constexpr uint64_t give_up_ns = 2000000000;
constexpr int data_words = 1024; /* 4 KiB of data per block, its own page */
constexpr int page_words = 1024;

__device__ inline uint64_t globaltimer()
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__device__ inline int read_flag(int *flag, wait_kind kind)
{
	switch (kind) {
	case wait_kind::atomic_dev:
		return atomicAdd(flag, 0);
	case wait_kind::atomic_sys:
		return atomicAdd_system(flag, 0);
	case wait_kind::volatile_load:
		return *(volatile int *)flag;
	default: {
		int value;
		asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
		return value;
	}
	}
}

/*
 * Block b: thread 0 waits for flags[b * page_words] (each flag on its own page) as @kind says,
 * then the block checks its data. out[b] = { seen after ns (0: never), spins, wrong words }.
 */
__global__ void consumer(int *flags, const int *data, wait_kind kind, unsigned long long *out)
{
	__shared__ int seen;
	const int b = blockIdx.x;
	if (threadIdx.x == 0) {
		const uint64_t start = globaltimer();
		unsigned long long spins = 0, after = 0;
		for (;;) {
			spins++;
			if (read_flag(&flags[(size_t)b * page_words], kind) == 1) {
				after = globaltimer() - start;
				break;
			}
			if (globaltimer() - start > give_up_ns)
				break;
		}
		seen = after != 0;
		out[3 * b] = after;
		out[3 * b + 1] = spins;
	}
	__syncthreads();
	if (!seen)
		return;
	unsigned wrong = 0;
	for (int i = threadIdx.x; i < data_words; i += blockDim.x)
		wrong += data[(size_t)b * data_words + i] != b * 7 + i;
	atomicAdd(&out[3 * b + 2], (unsigned long long)wrong);
}

/*
 * Generations: block b's thread 0 waits, generation after generation, until its flag reaches g,
 * checks its data word, and acknowledges g in @ack (pinned, mapped). Stops at the first wait that
 * gives up, recording the generation in done[b].
 */
__global__ void consumer_generations(int *flags, const int *data, wait_kind kind, int generations,
				     volatile int *ack, int *done, unsigned long long *wrong)
{
	if (threadIdx.x != 0)
		return;
	const int b = blockIdx.x;
	for (int g = 1; g <= generations; g++) {
		const uint64_t start = globaltimer();
		while (read_flag(&flags[(size_t)b * page_words], kind) < g) {
			if (globaltimer() - start > give_up_ns) {
				done[b] = g - 1;
				return;
			}
		}
		/* The data as the paper reads it: a plain load through UVM. */
		if (data[(size_t)b * data_words] != g)
			atomicAdd(wrong, 1ull);
		__threadfence_system();
		ack[b] = g;
	}
	done[b] = generations;
}

__global__ void touch(int *flags, int blocks)
{
	for (int b = threadIdx.x; b < blocks; b += blockDim.x)
		flags[(size_t)b * page_words] = 0;
}

void run(int blocks, wait_kind kind, bool gpu_first)
{
	int *flags, *data;
	unsigned long long *out;
	CHECK(cudaMallocManaged(&flags, (size_t)blocks * page_words * sizeof(int)));
	CHECK(cudaMallocManaged(&data, (size_t)blocks * data_words * sizeof(int)));
	CHECK(cudaMalloc(&out, (size_t)blocks * 3 * sizeof(unsigned long long)));
	CHECK(cudaMemset(out, 0, (size_t)blocks * 3 * sizeof(unsigned long long)));
	memset(data, 0, (size_t)blocks * data_words * sizeof(int));
	for (int b = 0; b < blocks; b++)
		flags[(size_t)b * page_words] = 0;
	if (gpu_first) {
		touch<<<1, 256>>>(flags, blocks);
		CHECK(cudaDeviceSynchronize());
	}
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	consumer<<<blocks, 128, 0, stream>>>(flags, data, kind, out);
	CHECK(cudaGetLastError());
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	for (int b = 0; b < blocks; b++) {
		for (int i = 0; i < data_words; i++)
			data[(size_t)b * data_words + i] = b * 7 + i;
		flags[(size_t)b * page_words] = 1;
	}
	CHECK(cudaStreamSynchronize(stream));
	std::vector<unsigned long long> host((size_t)blocks * 3);
	CHECK(cudaMemcpy(host.data(), out, host.size() * sizeof(host[0]), cudaMemcpyDeviceToHost));
	int seen = 0;
	unsigned long long wrong = 0, latest = 0, earliest = ~0ull, spins = 0;
	for (int b = 0; b < blocks; b++) {
		if (host[3 * b]) {
			seen++;
			latest = std::max(latest, host[3 * b]);
			earliest = std::min(earliest, host[3 * b]);
		}
		spins += host[3 * b + 1];
		wrong += host[3 * b + 2];
	}
	printf("{\"mode\": \"one-shot\", \"blocks\": %d, \"wait\": \"%s\", \"flag_first_touched_by\": \"%s\", \"seen\": %d, "
	       "\"seen_after_ms\": [%.3f, %.3f], \"spins_per_block\": %llu, \"wrong_data_words\": %llu}\n",
	       blocks, wait_names[(int)kind], gpu_first ? "gpu" : "host", seen, seen ? earliest / 1e6 : 0.0,
	       seen ? latest / 1e6 : 0.0, spins / blocks, wrong);
	fflush(stdout);
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(out));
	CHECK(cudaFree(data));
	CHECK(cudaFree(flags));
}

/*
 * @advise_cpu: the flags' pages preferred in host memory and mapped on the GPU
 * (cudaMemAdviseSetPreferredLocation to the CPU, cudaMemAdviseSetAccessedBy the GPU) from the
 * start: what nvidia-uvm's thrashing mitigation does by itself to a page that moves back and
 * forth too often (it pins the page on one side and maps it remotely on the other).
 */
void run_generations(int blocks, wait_kind kind, bool gpu_first, int generations, bool advise_cpu = false)
{
	int *flags, *data, *done, *ack;
	unsigned long long *wrong;
	CHECK(cudaMallocManaged(&flags, (size_t)blocks * page_words * sizeof(int)));
	CHECK(cudaMallocManaged(&data, (size_t)blocks * data_words * sizeof(int)));
	CHECK(cudaMalloc(&done, blocks * sizeof(int)));
	CHECK(cudaMalloc(&wrong, sizeof(*wrong)));
	CHECK(cudaMemset(done, 0, blocks * sizeof(int)));
	CHECK(cudaMemset(wrong, 0, sizeof(*wrong)));
	CHECK(cudaHostAlloc(&ack, blocks * sizeof(int), cudaHostAllocMapped));
	int *ack_device;
	CHECK(cudaHostGetDevicePointer(&ack_device, ack, 0));
	for (int b = 0; b < blocks; b++) {
		flags[(size_t)b * page_words] = 0;
		data[(size_t)b * data_words] = 0;
		ack[b] = 0;
	}
	if (advise_cpu) {
		const size_t bytes = (size_t)blocks * page_words * sizeof(int);
#if CUDART_VERSION >= 13000 /* a location, no longer a device number */
		cudaMemLocation host = {}, gpu = {};
		host.type = cudaMemLocationTypeHost;
		gpu.type = cudaMemLocationTypeDevice;
		gpu.id = 0;
		CHECK(cudaMemAdvise(flags, bytes, cudaMemAdviseSetPreferredLocation, host));
		CHECK(cudaMemAdvise(flags, bytes, cudaMemAdviseSetAccessedBy, gpu));
#else
		CHECK(cudaMemAdvise(flags, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId));
		CHECK(cudaMemAdvise(flags, bytes, cudaMemAdviseSetAccessedBy, 0));
#endif
	}
	if (gpu_first) {
		touch<<<1, 256>>>(flags, blocks);
		CHECK(cudaDeviceSynchronize());
	}
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	consumer_generations<<<blocks, 32, 0, stream>>>(flags, data, kind, generations, ack_device, done, wrong);
	CHECK(cudaGetLastError());
	std::vector<double> round_trip_us;
	int completed = 0;
	for (int g = 1; g <= generations; g++) {
		const auto start = std::chrono::steady_clock::now();
		for (int b = 0; b < blocks; b++) {
			data[(size_t)b * data_words] = g;
			flags[(size_t)b * page_words] = g;
		}
		bool all = false;
		while (!all && std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500)) {
			all = true;
			for (int b = 0; b < blocks && all; b++)
				all = ((volatile int *)ack)[b] >= g;
		}
		if (!all)
			break;
		round_trip_us.push_back(
			std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
		completed = g;
	}
	CHECK(cudaStreamSynchronize(stream));
	unsigned long long wrong_host = 0;
	CHECK(cudaMemcpy(&wrong_host, wrong, sizeof(wrong_host), cudaMemcpyDeviceToHost));
	std::sort(round_trip_us.begin(), round_trip_us.end());
	const double median = round_trip_us.empty() ? 0.0 : round_trip_us[round_trip_us.size() / 2];
	printf("{\"mode\": \"generations\", \"blocks\": %d, \"wait\": \"%s\", \"flag_first_touched_by\": \"%s\", "
	       "\"flag_placement\": \"%s\", \"generations\": %d, \"completed\": %d, \"median_round_trip_us\": %.1f, "
	       "\"wrong_data_words\": %llu}\n",
	       blocks, wait_names[(int)kind], gpu_first ? "gpu" : "host", advise_cpu ? "cpu_preferred_gpu_mapped" : "migrating",
	       generations, completed, median, wrong_host);
	fflush(stdout);
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFreeHost(ack));
	CHECK(cudaFree(wrong));
	CHECK(cudaFree(done));
	CHECK(cudaFree(data));
	CHECK(cudaFree(flags));
}

} /* namespace */

int main(int argc, char **argv)
{
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	int native = 0, concurrent = 0, pageable = 0;
	CHECK(cudaDeviceGetAttribute(&native, cudaDevAttrHostNativeAtomicSupported, 0));
	CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
	CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
	printf("{\"device\": \"%s\", \"sms\": %d, \"hostNativeAtomicSupported\": %d, \"concurrentManagedAccess\": %d, "
	       "\"pageableMemoryAccess\": %d}\n",
	       prop.name, prop.multiProcessorCount, native, concurrent, pageable);
	std::vector<int> block_counts;
	for (int i = 1; i < argc; i++)
		block_counts.push_back(atoi(argv[i]));
	if (block_counts.empty())
		block_counts = {1, prop.multiProcessorCount};
	for (int blocks : block_counts)
		for (int k = 0; k < 4; k++)
			for (bool gpu_first : {false, true})
				run(blocks, (wait_kind)k, gpu_first);
	for (int blocks : block_counts)
		for (int k = 0; k < 4; k++)
			for (bool gpu_first : {false, true})
				run_generations(blocks, (wait_kind)k, gpu_first, 200);
	for (int blocks : block_counts)
		for (int k = 0; k < 4; k++)
			run_generations(blocks, (wait_kind)k, false, 200, true);
	return 0;
}
