/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * observe - a CUDA program whose GPU faults wicd observes through nvidia-uvm-tools on the
 * stock driver: it attaches its address space (trying each of CUDA's /dev/nvidia-uvm files),
 * has wicd watch a managed buffer, then makes the GPU fault on every page of it, round after
 * round (the CPU writes each page between rounds, so each GPU read faults and migrates it).
 *
 * Usage: observe SOCKET|- [PAGES] [ROUNDS]    ("-": no wicd, only the faults)
 * Exits 0 when every value read on the GPU was right.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <unistd.h>

#include <wic.h>

#define CHECK(call)                                                                             \
	do {                                                                                    \
		cudaError_t err_ = (call);                                                      \
		if (err_ != cudaSuccess) {                                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
				cudaGetErrorString(err_));                                      \
			exit(2);                                                                \
		}                                                                               \
	} while (0)

namespace {

constexpr size_t page_bytes = 4096;

/* Warp w reads the first word of page w and adds it to the sum. */
__global__ void touch(const unsigned long long *pages, size_t words_per_page, unsigned npages,
		      unsigned long long *sum)
{
	const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;

	if (warp < npages && threadIdx.x % 32 == 0)
		atomicAdd(sum, pages[(size_t)warp * words_per_page]);
}

/* Attaches the first of this process's /dev/nvidia-uvm files that wicd accepts. */
int attach(wic_client *client, uint32_t *space)
{
	DIR *dir = opendir("/proc/self/fd");
	int rc = WIC_ENOT_FOUND;
	struct dirent *entry;

	if (!dir)
		return WIC_EIO;
	while ((entry = readdir(dir))) {
		char path[300], target[64];
		snprintf(path, sizeof(path), "/proc/self/fd/%s", entry->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (strcmp(target, "/dev/nvidia-uvm"))
			continue;
		rc = wic_attach_space(client, atoi(entry->d_name), space);
		if (rc == WIC_OK)
			break;
	}
	closedir(dir);
	return rc;
}

} /* namespace */

int main(int argc, char **argv)
{
	const char *socket = argc > 1 ? argv[1] : "-";
	const unsigned npages = argc > 2 ? atoi(argv[2]) : 256;
	const int rounds = argc > 3 ? atoi(argv[3]) : 20;
	const size_t words = page_bytes / sizeof(unsigned long long);
	wic_client *client = nullptr;
	uint32_t space = 0;

	if (!npages || rounds < 1) {
		fprintf(stderr, "usage: %s SOCKET|- [PAGES] [ROUNDS]\n", argv[0]);
		return 2;
	}
	CHECK(cudaFree(0)); /* the context, and with it CUDA's nvidia-uvm files */
	unsigned long long *pages, *sum;
	CHECK(cudaMallocManaged(&pages, npages * page_bytes));
	CHECK(cudaMalloc(&sum, sizeof(*sum)));
	if (strcmp(socket, "-")) {
		int rc = wic_connect(socket, &client);
		if (rc == WIC_OK)
			rc = attach(client, &space);
		if (rc == WIC_OK)
			rc = wic_watch_range(client, (uint64_t)pages, npages * page_bytes);
		if (rc != WIC_OK) {
			fprintf(stderr, "observe: wicd: %s\n", wic_strerror(rc));
			return 1;
		}
	}
	bool correct = true;
	for (int r = 0; r < rounds; r++) {
		unsigned long long expected = 0, got;
		for (unsigned p = 0; p < npages; p++) {
			pages[p * words] = (unsigned long long)r * npages + p; /* CPU write: host-resident */
			expected += pages[p * words];
		}
		CHECK(cudaMemset(sum, 0, sizeof(*sum)));
		touch<<<(npages * 32 + 255) / 256, 256>>>(pages, words, npages, sum);
		CHECK(cudaGetLastError());
		CHECK(cudaMemcpy(&got, sum, sizeof(got), cudaMemcpyDeviceToHost));
		correct &= got == expected;
	}
	printf("observe: space %u, %u pages x %d rounds of GPU faults, values %s\n", space, npages, rounds,
	       correct ? "right" : "WRONG");
	wic_disconnect(client);
	CHECK(cudaFree(pages));
	CHECK(cudaFree(sum));
	return correct ? 0 : 1;
}
