/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/launch.cuh - launching consumer kernels: co_resident(), whether all blocks of a grid run
 * at once, as blocks that wait for each other's messages need; launched_generation(), what a
 * launch channel's consumer was launched for.
 */
#ifndef WIC_LAUNCH_CUH
#define WIC_LAUNCH_CUH

#include <cstdint>
#include <cuda_runtime.h>

#include <wic/channel.cuh>

namespace wic {

#ifdef __CUDACC__

/*
 * launched_generation() - in the consumer kernel of a launch channel's delivery (struct
 * delivery), the generation of @slot it was launched for: the slot's ready word, which landed
 * before the launch. Read it before the slot's wic::consumed(): after that the producer may
 * publish the slot's next generation.
 */
__device__ inline uint32_t launched_generation(const channel &ch, uint32_t slot)
{
	return detail::load_acquire(&ch.ready[slot]) - 1;
}

#endif /* __CUDACC__ */

/*
 * co_resident() - whether every block of a launch of @kernel would run at once on the current
 * device, as a kernel whose blocks wait for each other's messages (or a grid barrier) needs:
 * blocks that have not started cannot publish or consume, so the ones running wait forever
 * @kernel: the kernel
 * @grid: the grid it will be launched with
 * @block: its blocks
 * @shared_bytes: dynamic shared memory per block
 *
 * From the occupancy the runtime computes for the kernel's registers, shared memory and block
 * size on an idle device; kernels running beside it take SMs of their own, which this does not
 * see.
 *
 * Return: WIC_OK; WIC_EEXHAUSTED (cudaErrorCooperativeLaunchTooLarge) when the blocks would not
 * all be resident, also when not even one fits (too many registers per thread for the block);
 * WIC_EIO with a failed runtime call's error.
 */
template <typename Kernel>
inline outcome co_resident(Kernel *kernel, dim3 grid, dim3 block, size_t shared_bytes = 0)
{
	int device, sms, per_sm;
	cudaError_t err = cudaGetDevice(&device);
	if (err == cudaSuccess)
		err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
	if (err == cudaSuccess)
		err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)(block.x * block.y * block.z),
								    shared_bytes);
	if (err != cudaSuccess)
		return outcome{err};
	if ((uint64_t)grid.x * grid.y * grid.z > (uint64_t)per_sm * sms)
		return outcome{WIC_EEXHAUSTED, cudaErrorCooperativeLaunchTooLarge};
	return outcome{};
}

} /* namespace wic */

#endif /* WIC_LAUNCH_CUH */
