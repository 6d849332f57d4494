/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * fake_cudart - the few CUDA runtime calls of wic.cuh's host side, implemented on host memory, so
 * that host_logic.cc runs the host side's bookkeeping (refusals, coalescing, flow control,
 * timeouts) on a machine without a GPU. It models a stream as a queue of copies that run at once
 * unless the test holds the stream, as a stream waiting for a running kernel would; it models
 * nothing of a GPU, and is no evidence about one (device/tests/misuse_test.cu runs on the GPU).
 */
#ifndef WIC_FAKE_CUDART_H
#define WIC_FAKE_CUDART_H

#include <cstddef>
#include <vector>
#include <cuda_runtime.h>

namespace fake {

/* One cudaMemcpyAsync() as queued. */
struct copy {
	void *dst;
	const void *src;
	size_t bytes;
	cudaStream_t stream;
};

/* Every copy queued since the last clear(), in order. */
const std::vector<copy> &copies();
void clear();

/* Copies and memsets queued on @stream wait until release(@stream). */
void hold(cudaStream_t stream);
void release(cudaStream_t stream);

/* Whether @stream is held: by hold(), or waiting for an event of a held stream. */
bool held(cudaStream_t stream);

/* Streams created and not yet destroyed. */
int live_streams();

} /* namespace fake */

#endif /* WIC_FAKE_CUDART_H */
