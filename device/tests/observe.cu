/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * observe - consumer warps on wic.cuh's fault transport over the stock driver, with wicd
 * observing their faults through nvidia-uvm-tools. The channel's runs are pages of a managed
 * buffer (what wic_channel_create_at would place on the patched driver); the host writes each
 * generation's messages into the run the generation reads, which moves those pages to the host,
 * and the warps' wic::recv faults on them: the stock driver services those faults itself
 * (migrating the pages back) instead of wicd holding them. The program attaches its address
 * space (trying each of CUDA's /dev/nvidia-uvm files) and has wicd watch the runs.
 *
 * Usage: observe SOCKET|- [SLOTS] [GENERATIONS]    ("-": no wicd, only the faults)
 * Exits 0 when every warp received exactly its message of every generation.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

#include <wic/wic.cuh>

#include "../apps/check.cuh"
#include "attach_space.h"

namespace {

constexpr uint32_t warps = 16;
constexpr uint32_t message_bytes = 256; /* 16 warps x 256 B: one page per run */
constexpr size_t page_bytes = 4096;

__host__ __device__ uint64_t message_word(uint32_t generation, uint32_t slot, uint32_t warp)
{
	return ((uint64_t)generation << 40) | ((uint64_t)slot << 8) | warp;
}

/* Block s consumes slot s's generation: each warp checks the first word of its message. */
__global__ void consume(wic::channel ch, uint32_t generation, unsigned *wrong)
{
	const uint32_t slot = blockIdx.x, warp = threadIdx.x / 32;
	const uint8_t *message;
	int rc = wic::recv(ch, slot, generation, warp, &message);

	if (threadIdx.x % 32 == 0 &&
	    (rc != WIC_OK || *reinterpret_cast<const uint64_t *>(message) != message_word(generation, slot, warp)))
		atomicAdd(wrong, 1u);
}


} /* namespace */

int main(int argc, char **argv)
{
	const char *socket = argc > 1 ? argv[1] : "-";
	const uint32_t slots = argc > 2 ? atoi(argv[2]) : 128;
	const int generations = argc > 3 ? atoi(argv[3]) : 20;
	wic_client *client = nullptr;
	uint32_t space = 0;

	if (!slots || generations < 1) {
		fprintf(stderr, "usage: %s SOCKET|- [SLOTS] [GENERATIONS]\n", argv[0]);
		return 2;
	}
	CHECK(cudaFree(0)); /* the context, and with it CUDA's nvidia-uvm files */
	const size_t bytes = 2 * slots * page_bytes;
	uint8_t *pages;
	uint64_t *runs;
	unsigned *wrong;
	CHECK(cudaMallocManaged(&pages, bytes));
	CHECK(cudaMalloc(&runs, 2 * slots * sizeof(uint64_t)));
	CHECK(cudaMalloc(&wrong, sizeof(*wrong)));
	CHECK(cudaMemset(wrong, 0, sizeof(*wrong)));
	struct wic_channel_info info = {};
	info.slots = slots;
	info.message_bytes = message_bytes;
	info.pages_per_run = 1;
	info.warps_per_batch = warps;
	info.batch_bytes = (uint64_t)warps * message_bytes;
	std::vector<struct wic_slot_info> slot(slots);
	for (uint32_t s = 0; s < slots; s++)
		for (int side = 0; side < 2; side++)
			slot[s].run_va[side] = (uint64_t)(pages + (2 * s + side) * page_bytes);
	const wic::channel ch = wic::fault_channel(&info, slot.data(), runs);
	if (ch.slots != slots) {
		fprintf(stderr, "observe: cannot copy the run addresses\n");
		return 2;
	}
	if (strcmp(socket, "-")) {
		int rc = wic_connect(socket, &client);
		if (rc == WIC_OK)
			rc = attach_space(client, &space);
		if (rc == WIC_OK)
			rc = wic_watch_range(client, (uint64_t)pages, bytes);
		if (rc != WIC_OK) {
			fprintf(stderr, "observe: wicd: %s\n", wic_strerror(rc));
			return 1;
		}
	}
	for (int g = 0; g < generations; g++) {
		/* The producer writes generation g into the run it uses (CPU writes: host-resident). */
		for (uint32_t s = 0; s < slots; s++)
			for (uint32_t w = 0; w < warps; w++) {
				uint8_t *at = reinterpret_cast<uint8_t *>(slot[s].run_va[g % 2]) + w * message_bytes;
				*reinterpret_cast<uint64_t *>(at) = message_word(g, s, w);
			}
		consume<<<slots, warps * 32>>>(ch, g, wrong);
		CHECK(cudaGetLastError());
		CHECK(cudaDeviceSynchronize());
	}
	unsigned failed;
	CHECK(cudaMemcpy(&failed, wrong, sizeof(failed), cudaMemcpyDeviceToHost));
	printf("observe: space %u, %u slots x %d generations through the fault transport, %u of %u messages wrong\n",
	       space, slots, generations, failed, slots * warps * generations);
	wic_disconnect(client);
	CHECK(cudaFree(pages));
	CHECK(cudaFree(runs));
	CHECK(cudaFree(wrong));
	return failed ? 1 : 0;
}
