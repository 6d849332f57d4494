/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic.cuh - the device side of wic: how consumer warps wait for a channel's data.
 *
 * A channel carries, per slot and generation, one batch of warps_per_batch messages of
 * message_bytes each; warp w of the batch reads bytes [w * message_bytes, (w + 1) *
 * message_bytes). Generation g of slot s is published once; its consumers call wic::recv().
 *
 * Three transports, chosen per channel:
 *  - fault: the batch's run is an unmapped managed page; reading it stalls the warp in hardware
 *    until wicd (shim backend, patched nvidia-uvm) writes the data, maps the run and replays.
 *    Needs the patched driver. The channel comes from libwic (wic_channel_create_at).
 *  - push: the producer's helper copies the data into device memory, then sets a device-local
 *    ready word in stream order; warps wait on that word with __nanosleep backoff, never across
 *    PCIe. Runs on the stock driver.
 *  - poll: the naive baseline (the WIC paper's Algorithm 1): warps spin without backoff on a
 *    ready word in pinned host memory, across PCIe; the data is in device memory.
 *
 * Device code includes this header; host code uses wic::host_channel to create push and poll
 * channels and to publish, and wic::fault_channel() to wrap a libwic channel.
 */
#ifndef WIC_WIC_CUH
#define WIC_WIC_CUH

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include <wic.h>

namespace wic {

/* How a channel's consumers wait. */
enum class transport : uint32_t { fault = 0, push = 1, poll = 2 };

/* The longest __nanosleep of push's backoff, in nanoseconds. */
constexpr unsigned push_max_sleep_ns = 2048;

/*
 * channel - what a kernel needs of a channel; passed by value.
 * @kind: the transport
 * @slots: slots of the channel
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: warps served by one generation of a slot
 * @batch_bytes: warps_per_batch * message_bytes
 * @runs: fault: device array of 2 * slots run addresses, runs[2 * s + g % 2]
 * @data: push, poll: device memory, slot s at data + s * batch_bytes
 * @ready: push (device memory), poll (pinned host memory): generations published per slot
 */
struct channel {
	transport kind;
	uint32_t slots;
	uint32_t message_bytes;
	uint32_t warps_per_batch;
	uint64_t batch_bytes;
	const uint64_t *runs;
	const uint8_t *data;
	const unsigned int *ready;
};

#ifdef __CUDACC__

namespace detail {

__device__ inline unsigned load_acquire(const unsigned int *word)
{
	unsigned value;

	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(word) : "memory");
	return value;
}

__device__ inline uint64_t load_volatile(const void *address)
{
	return *static_cast<const volatile uint64_t *>(address);
}

__device__ inline uint64_t globaltimer()
{
	uint64_t ns;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
	return ns;
}

/* The error a marker word stands for, or WIC_OK for data. */
__device__ inline int marker_status(uint64_t word)
{
	if ((word & 0xffffffff00000000ULL) != WIC_ERROR_MARKER_MAGIC)
		return WIC_OK;
	switch (word & 0xffffffffULL) {
	case 1:
		return WIC_ETIMED_OUT;
	case 2:
		return WIC_ECLOSED;
	case 3:
		return WIC_ESTOPPING;
	case 4:
		return WIC_ECONNECT;
	default:
		return WIC_OK;
	}
}

/* Lane 0 waits until @slot has published @generation; WIC_ETIMED_OUT after @timeout_ns. */
__device__ inline int wait_ready(const channel &ch, uint32_t slot, uint32_t generation, uint64_t timeout_ns)
{
	const uint64_t start = timeout_ns ? globaltimer() : 0;
	unsigned sleep_ns = 32;

	/* Wrapping difference: generations count modulo 2^32. */
	while ((int)(load_acquire(&ch.ready[slot]) - generation) <= 0) {
		if (timeout_ns && globaltimer() - start > timeout_ns)
			return WIC_ETIMED_OUT;
		if (ch.kind == transport::push) {
			__nanosleep(sleep_ns);
			sleep_ns = sleep_ns < push_max_sleep_ns ? 2 * sleep_ns : push_max_sleep_ns;
		}
	}
	return WIC_OK;
}

} /* namespace detail */

/*
 * recv() - wait for this warp's message of generation @generation of @slot
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot
 * @warp_in_batch: this warp's index among the batch's warps_per_batch
 * @message: receives the address of this warp's message_bytes
 * @timeout_ns: push and poll: give up after this long (0: wait forever); fault: the channel's
 *	timeout, set at creation, applies instead
 *
 * Called by every lane of the warp (the warp must be converged). Return: WIC_OK, or for the
 * fault transport the error wicd or the module completed the request with: WIC_ETIMED_OUT,
 * WIC_ECLOSED, WIC_ESTOPPING or WIC_ECONNECT (wicd died); push and poll: WIC_ETIMED_OUT.
 */
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = 0)
{
	const unsigned lane = threadIdx.x % 32;
	const uint64_t offset = (uint64_t)warp_in_batch * ch.message_bytes;
	const uint8_t *at;
	int status = WIC_OK;

	if (ch.kind == transport::fault) {
		at = reinterpret_cast<const uint8_t *>(ch.runs[2 * slot + generation % 2]) + offset;
		if (lane == 0) {
			/* The load that stalls until wicd maps the run; markers sit at page starts. */
			const uint64_t page = reinterpret_cast<uint64_t>(at) & ~4095ULL;

			status = detail::marker_status(detail::load_volatile(reinterpret_cast<const void *>(page)));
		}
	} else {
		at = ch.data + (uint64_t)slot * ch.batch_bytes + offset;
		if (lane == 0)
			status = detail::wait_ready(ch, slot, generation, timeout_ns);
	}
	status = __shfl_sync(0xffffffff, status, 0);
	__syncwarp();
	*message = at;
	return status;
}

#endif /* __CUDACC__ */

/*
 * host_channel - a push or poll channel's memory and its producer side (host code).
 *
 * create() allocates the slots' data in device memory and the ready words (device memory for
 * push, pinned host memory for poll). publish() copies a batch into a slot and marks its next
 * generation ready in stream order, so a kernel that sees the ready word sees the data.
 */
class host_channel {
public:
	host_channel() = default;
	host_channel(const host_channel &) = delete;
	host_channel &operator=(const host_channel &) = delete;
	~host_channel() { destroy(); }

	cudaError_t create(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch)
	{
		if (kind == transport::fault || !slots || !message_bytes || !warps_per_batch)
			return cudaErrorInvalidValue;
		destroy();
		ch_ = channel{kind, slots, message_bytes, warps_per_batch,
			      (uint64_t)warps_per_batch * message_bytes, nullptr, nullptr, nullptr};
		published_ = new unsigned int[slots]();
		cudaError_t err = cudaMalloc(&data_, ch_.batch_bytes * slots);
		if (err == cudaSuccess && kind == transport::push) {
			err = cudaMalloc(&ready_, slots * sizeof(unsigned int));
			if (err == cudaSuccess)
				err = cudaMemset(ready_, 0, slots * sizeof(unsigned int));
		} else if (err == cudaSuccess) {
			err = cudaHostAlloc(&ready_, slots * sizeof(unsigned int), cudaHostAllocMapped);
			if (err == cudaSuccess)
				for (uint32_t s = 0; s < slots; s++)
					ready_[s] = 0;
		}
		if (err != cudaSuccess) {
			destroy();
			return err;
		}
		ch_.data = static_cast<const uint8_t *>(data_);
		if (kind == transport::push)
			ch_.ready = ready_;
		else
			err = cudaHostGetDevicePointer((void **)&ch_.ready, ready_, 0);
		return err;
	}

	/* What kernels take. */
	channel device() const { return ch_; }

	/*
	 * Publishes the next generation of @slot: @bytes (at most batch_bytes) from @src, which
	 * must stay valid until @stream reaches this point. push: both steps are queued on
	 * @stream (the consumer kernel runs on another). poll: the copy completes, then the ready
	 * word is stored by this thread, as a naive producer would.
	 */
	cudaError_t publish(uint32_t slot, const void *src, size_t bytes, cudaStream_t stream)
	{
		if (slot >= ch_.slots || bytes > ch_.batch_bytes)
			return cudaErrorInvalidValue;
		uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)slot * ch_.batch_bytes;
		cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return err;
		const unsigned int generation = ++published_[slot];
		if (ch_.kind == transport::push) {
			CUresult res = cuStreamWriteValue32(stream, (CUdeviceptr)&ready_[slot], generation,
							    CU_STREAM_WRITE_VALUE_DEFAULT);
			return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
		}
		err = cudaStreamSynchronize(stream);
		if (err == cudaSuccess)
			__atomic_store_n(&ready_[slot], generation, __ATOMIC_RELEASE);
		return err;
	}

	void destroy()
	{
		if (data_)
			cudaFree(data_);
		if (ready_ && ch_.kind == transport::push)
			cudaFree(ready_);
		else if (ready_)
			cudaFreeHost(ready_);
		delete[] published_;
		data_ = nullptr;
		ready_ = nullptr;
		published_ = nullptr;
	}

private:
	channel ch_{};
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	unsigned int *published_ = nullptr;
};

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
		   runs, nullptr, nullptr};
	for (uint32_t s = 0; s < info->slots; s++)
		if (cudaMemcpy(runs + 2 * s, slots[s].run_va, sizeof(slots[s].run_va), cudaMemcpyHostToDevice) !=
		    cudaSuccess)
			ch.slots = 0;
	return ch;
}

} /* namespace wic */

#endif /* WIC_WIC_CUH */
