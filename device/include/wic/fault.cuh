/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/fault.cuh - the fault transport's host side: a libwic channel's device view
 * (fault_channel()) and nvidia-uvm's id of a CUDA device (uvm_gpu_id()). Its wait is in
 * wic/wait.cuh; it needs the patched driver (device/README.md).
 */
#ifndef WIC_FAULT_CUH
#define WIC_FAULT_CUH

#include <cstdint>
#include <cuda_runtime.h>

#include <wic/channel.cuh>

namespace wic {

/*
 * fault_channel() - the device view of a libwic channel placed in managed memory
 * @info: wic_channel_info() of the channel
 * @slots: wic_channel_slot() of each of its slots
 * @runs: device memory for 2 * info->slots addresses, filled here
 *
 * Return: the channel kernels take, or one with slots = 0 if copying @runs failed.
 */
inline channel fault_channel(const struct wic_channel_info *info, const struct wic_slot_info *slots, uint64_t *runs)
{
	channel ch{transport::fault, info->slots, info->message_bytes, info->warps_per_batch, info->batch_bytes,
		   runs, nullptr, nullptr, nullptr, nullptr, nullptr, 0};
	for (uint32_t s = 0; s < info->slots; s++)
		if (cudaMemcpy(runs + 2 * s, slots[s].run_va, sizeof(slots[s].run_va), cudaMemcpyHostToDevice) !=
		    cudaSuccess)
			ch.slots = 0;
	return ch;
}

/*
 * uvm_gpu_id() - nvidia-uvm's id of a CUDA device, what a fault channel's GPU fields take
 * @device: the CUDA device (as CUDA_VISIBLE_DEVICES numbers them)
 * @id: receives the id
 *
 * The shim backend names GPUs as nvidia-uvm does, by ids that depend on which GPUs the
 * processes of the machine use (wic_uvm_gpu_id() in wic.h): translate, never assume 1 and 9.
 * Initializes CUDA if it is not yet, which registers every visible GPU with nvidia-uvm (seen
 * with the stock 580.159.04 driver), and creates no context.
 *
 * Return: WIC_OK, WIC_EIO if CUDA cannot say the device's UUID, or wic_uvm_gpu_id()'s error.
 */
inline int uvm_gpu_id(int device, uint32_t *id)
{
	cudaDeviceProp prop;
	if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
		return WIC_EIO;
	return wic_uvm_gpu_id(reinterpret_cast<const uint8_t *>(prop.uuid.bytes), id);
}

} /* namespace wic */

#endif /* WIC_FAULT_CUH */
