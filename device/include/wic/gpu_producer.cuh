/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/gpu_producer.cuh - a kernel on another GPU (or the same one) as the producer:
 * wic::peer_channel, and the producer kernel's calls slot_buffer(), publish(), publish_block()
 * and wait_consumed(); pick_peer_transport(), enable_peer_access().
 */
#ifndef WIC_GPU_PRODUCER_CUH
#define WIC_GPU_PRODUCER_CUH

#include <cstdint>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#include <wic/channel.cuh>

namespace wic {

#ifdef __CUDACC__

namespace detail {

/*
 * Sends lines [@first, @end) of @slot's staged batch, every @stride-th from @first, as
 * generation @generation: line i carries data bytes 8i to 8i + 7.
 */
__device__ inline void send_lines(const channel &ch, uint32_t slot, uint32_t generation, uint64_t first, uint64_t end,
				  uint32_t stride)
{
	const uint64_t *staged = reinterpret_cast<const uint64_t *>(ch.staging + (uint64_t)slot * ch.batch_bytes);

	for (uint64_t line = first; line < end; line += lines_per_round * stride) {
		uint64_t data[lines_per_round];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				data[j] = staged[line + j * stride];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				store_line(line_at(ch, slot, line + j * stride), data[j], generation + 1);
	}
}

} /* namespace detail */

/*
 * slot_buffer() - where a GPU producer writes the batch of @slot (push, poll, alg1, tagged)
 * @ch: the channel
 * @slot: the slot
 *
 * The slot's batch_bytes in the consumer GPU's memory (alg1: managed memory), which a producer
 * on another GPU reaches over the peer link; tagged: in the producer GPU's own memory, from
 * where publish() or publish_block() sends the batch. Warp w's message is at offset
 * w * message_bytes.
 */
__device__ inline uint8_t *slot_buffer(const channel &ch, uint32_t slot)
{
	if (ch.kind == transport::tagged)
		return ch.staging + (uint64_t)slot * ch.batch_bytes;
	return const_cast<uint8_t *>(ch.data) + (uint64_t)slot * ch.batch_bytes;
}

/*
 * publish() - a GPU producer marks generation @generation of @slot ready
 * @ch: the channel (push, poll, alg1 or tagged)
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot; the one after the slot's last
 *
 * One thread calls it once the whole batch is written; publish_block() does the same with
 * every thread of the block. Before it, every thread that wrote part of the batch executes
 * __threadfence_system(), so its stores across the link are performed system-wide, and then
 * meets the calling thread at a barrier (__syncthreads(), or __syncwarp() when one warp wrote
 * the batch). publish() fences again and stores @generation + 1 to the slot's ready word with
 * release semantics at system scope: a consumer whose acquire load sees it reads the batch.
 * tagged needs no fence, only the barrier: the calling thread sends the whole batch as lines,
 * which for more than a few lines publish_block() does faster. Before writing generation
 * g > 0 of a slot, the producer waits for wait_consumed(ch, slot, g - 1).
 *
 * Return: WIC_OK; WIC_EINVALID for a bad @slot; WIC_EUNSUPPORTED for a fault channel, whose GPU
 * producer publishes by writing the slot's PAT page (needs the patched driver).
 */
__device__ inline int publish(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (slot >= ch.slots)
		return WIC_EINVALID;
	if (ch.kind == transport::fault)
		return WIC_EUNSUPPORTED;
	if (ch.kind == transport::tagged) {
		detail::send_lines(ch, slot, generation, 0, ch.batch_bytes / 8, 1);
		return WIC_OK;
	}
	__threadfence_system();
	detail::store_release(const_cast<unsigned int *>(&ch.ready[slot]), generation + 1);
	return WIC_OK;
}

/*
 * publish_block() - the block that wrote generation @generation of @slot publishes it
 * @ch: the channel (push, poll, alg1 or tagged)
 * @slot: the slot
 * @generation: as publish()
 *
 * Every thread of the block calls it after its own writes to slot_buffer(), none of them
 * inside a divergent branch. push, poll, alg1: each thread makes its writes visible
 * system-wide (they crossed the link), the barrier gathers the block, and thread 0
 * publish()es. tagged: after the barrier, each thread sends every n-th line of the batch;
 * no fence, so the block is on its way once its stores are issued.
 *
 * Return: as publish(), in every thread.
 */
__device__ inline int publish_block(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (slot >= ch.slots)
		return WIC_EINVALID;
	if (ch.kind == transport::fault)
		return WIC_EUNSUPPORTED;
	if (ch.kind == transport::tagged) {
		__syncthreads();
		detail::send_lines(ch, slot, generation, detail::thread_in_block(), ch.batch_bytes / 8,
				   detail::block_threads());
		return WIC_OK;
	}
	__threadfence_system();
	__syncthreads();
	if (detail::thread_in_block() == 0)
		publish(ch, slot, generation);
	return WIC_OK;
}

/*
 * wait_consumed() - a GPU producer waits until generation @generation of @slot is consumed
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation the producer is about to overwrite
 * @timeout_ns: give up after this long (0: look once; forever, the default: never)
 *
 * One thread calls it; the others of its block write the slot after a __syncthreads() that
 * follows it. The word is in this GPU's memory: the thread waits with push's backoff, an
 * acquire load at system scope each time, so the block's stores come after the consumers' reads.
 *
 * Return: WIC_OK (at once for channels without consumed words); WIC_EINVALID for a bad @slot;
 * WIC_ETIMED_OUT.
 */
__device__ inline int wait_consumed(const channel &ch, uint32_t slot, uint32_t generation,
				    uint64_t timeout_ns = forever)
{
	if (slot >= ch.slots)
		return WIC_EINVALID;
	if (!ch.consumed)
		return WIC_OK;
	return detail::wait_past(&ch.consumed[slot], generation, push_max_sleep_ns, timeout_ns);
}

#endif /* __CUDACC__ */

/*
 * pick_peer_transport() - the transport for a channel whose producer is a kernel on another GPU
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: messages in one generation of a slot
 *
 * tagged for batches of up to 4 KiB made of whole 8-byte words, push otherwise. The
 * measurements behind the limit: device/bench/README.md, "Choosing a GPU producer's
 * transport".
 */
inline transport pick_peer_transport(uint32_t message_bytes, uint32_t warps_per_batch)
{
	const uint64_t batch_bytes = (uint64_t)message_bytes * warps_per_batch;
	return batch_bytes <= 4096 && message_bytes % 8 == 0 ? transport::tagged : transport::push;
}

/*
 * pick_peer_transport() - the same, knowing what shares the consumers' GPU (@beside)
 *
 * Alone or beside arithmetic, as above: every transport's waiters but alg1's cost arithmetic
 * 2.3% of its speed at most. Beside memory-bound work, push: tagged's waiters, spinning on
 * device memory, left an L2-bound kernel 93.3% of its speed, push's sleeping 98.6% at least;
 * alg1's page migrations 88 to 90% 1 ms apart (device/bench/corun.cu --peer on two H200s;
 * device/README.md, "What waiting costs the work beside it"). poll cost the neighbour 0.4% at
 * most, but its waiters spin across the link on the producer GPU's memory, a cost the co-run
 * does not see. launch, with nothing resident while it waits, is the caller's choice: its
 * stream waits for every slot's ready word in turn, some 2 us each.
 */
inline transport pick_peer_transport(uint32_t message_bytes, uint32_t warps_per_batch, sharing beside)
{
	if (beside == sharing::memory)
		return transport::push;
	return pick_peer_transport(message_bytes, warps_per_batch);
}

namespace detail {

/* Runs @call with @device current; the caller's current device is kept. */
template <typename F>
inline cudaError_t on_device(int device, F call)
{
	int current;
	cudaError_t err = cudaGetDevice(&current);
	if (err != cudaSuccess)
		return err;
	err = cudaSetDevice(device);
	if (err == cudaSuccess)
		err = call();
	const cudaError_t restored = cudaSetDevice(current);
	return err != cudaSuccess ? err : restored;
}

/* Zeroes @bytes at @ptr in @device's memory, done when this returns. */
inline cudaError_t zero_on(int device, void *ptr, size_t bytes)
{
	return on_device(device, [&] { return zero_device(ptr, bytes); });
}

/* @bytes of @device's memory at *@out, zeroed when @zero. */
inline cudaError_t alloc_on(int device, size_t bytes, bool zero, void **out)
{
	cudaError_t err = on_device(device, [&] { return cudaMalloc(out, bytes); });
	return err != cudaSuccess || !zero ? err : zero_on(device, *out, bytes);
}

inline void free_on(int device, void *ptr)
{
	if (ptr)
		on_device(device, [&] { return cudaFree(ptr); });
}

/*
 * Queues on @stream a wait until the word at @word (device memory) is at least @value, modulo
 * 2^32 as generations count: a stream memory operation, cuStreamWaitValue32(), which the
 * stream's front end runs, no SM. Taken from the driver through the runtime, so that nothing
 * links libcuda. Returns cudaErrorNotSupported where the driver has none; its CUresult
 * otherwise (the codes of this call's errors are the runtime's numbers).
 */
inline cudaError_t stream_wait_at_least(cudaStream_t stream, const unsigned int *word, unsigned int value)
{
	using wait_value32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
	static const wait_value32 wait = [] {
		void *found = nullptr;
		cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
		const cudaError_t err =
			cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &found, 12000, cudaEnableDefault, &result);
#else
		const cudaError_t err = cudaGetDriverEntryPoint("cuStreamWaitValue32", &found, cudaEnableDefault, &result);
#endif
		return err == cudaSuccess && result == cudaDriverEntryPointSuccess ? reinterpret_cast<wait_value32>(found)
										 : nullptr;
	}();
	if (!wait)
		return cudaErrorNotSupported;
	return (cudaError_t)wait(stream, (CUdeviceptr)word, value, CU_STREAM_WAIT_VALUE_GEQ);
}

} /* namespace detail */

/*
 * enable_peer_access() - lets kernels on GPU @a reach GPU @b's memory, and the other way round
 * @a: a device
 * @b: a device; nothing to do when it is @a
 *
 * The current device is kept. Return: cudaSuccess, also where access was already enabled;
 * cudaErrorPeerAccessUnsupported where either direction is impossible; else the failed call's
 * error.
 */
inline cudaError_t enable_peer_access(int a, int b)
{
	cudaError_t err = cudaSuccess;

	for (int i = 0; i < 2 && a != b && err == cudaSuccess; i++) {
		const int from = i ? b : a, to = i ? a : b;
		int can = 0;
		err = cudaDeviceCanAccessPeer(&can, from, to);
		if (err == cudaSuccess && !can)
			err = cudaErrorPeerAccessUnsupported;
		if (err == cudaSuccess)
			err = detail::on_device(from, [&] {
				cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
				if (e == cudaErrorPeerAccessAlreadyEnabled) {
					(void)cudaGetLastError(); /* not an error here: clear it for later checks */
					e = cudaSuccess;
				}
				return e;
			});
	}
	return err;
}

/*
 * peer_channel - a push, poll, alg1, tagged or launch channel whose producer is a kernel on GPU
 * @producer and whose consumers run on GPU @consumer (host code; the GPUs may be the same one).
 *
 * create() enables peer access both ways and allocates the slots' data and (push) the ready
 * words in the consumer's memory, (poll) the ready words in the producer's memory, where the
 * consumers spin on them across the link, (alg1) data and ready words in managed memory,
 * (tagged) the lines and the unpacked data in the consumer's memory and the staging in the
 * producer's, and the consumed words in the producer's memory. Algorithm 1 runs once and has
 * no way back; the consumed words are the flow control every repeated exchange needs, the same
 * for all four. The producer kernel writes a batch into slot_buffer(), publish()es it, and
 * waits for wait_consumed() before it writes the slot again; consumers recv() and report
 * consumed(). No generation is published or consumed after create() or reset().
 *
 * launch: the producer kernel publishes as for push; no consumer waits on the GPU. The host
 * queues, with launch_when_published(), a wait of the consumer GPU's stream for a delivery's
 * ready words and then its consumer's launch: nothing of the consumer is resident meanwhile.
 */
class peer_channel {
public:
	peer_channel() = default;
	peer_channel(const peer_channel &) = delete;
	peer_channel &operator=(const peer_channel &) = delete;
	~peer_channel() { destroy(); }

	/*
	 * Return: WIC_OK; WIC_EINVALID for fault and mapped (host_channel), a zero size, or tagged
	 * messages of a size that is not a multiple of 8 bytes; else WIC_EIO with the failed call's
	 * error.
	 */
	outcome create(transport kind, int consumer, int producer, uint32_t slots, uint32_t message_bytes,
			   uint32_t warps_per_batch)
	{
		if (kind == transport::fault || kind == transport::mapped || kind > transport::launch || !slots ||
		    !message_bytes || !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return detail::invalid();
		destroy();
		cudaError_t err = enable_peer_access(consumer, producer);
		if (err != cudaSuccess)
			return outcome{err};
		ch_ = detail::empty_channel(kind, slots, message_bytes, warps_per_batch);
		consumer_ = consumer;
		producer_ = producer;
		const size_t data_bytes = ch_.batch_bytes * slots, word_bytes = slots * sizeof(unsigned int);
		switch (kind) {
		case transport::alg1:
			err = cudaMallocManaged(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMallocManaged((void **)&ready_, word_bytes);
			if (err == cudaSuccess)
				memset(ready_, 0, word_bytes);
			break;
		case transport::tagged:
			err = detail::alloc_on(consumer, data_bytes, false, &data_);
			if (err == cudaSuccess)
				err = detail::alloc_on(consumer, 2 * data_bytes, true, (void **)&lines_);
			if (err == cudaSuccess)
				err = detail::alloc_on(producer, data_bytes, false, (void **)&staging_);
			break;
		default: /* push, poll, launch */
			err = detail::alloc_on(consumer, data_bytes, false, &data_);
			if (err == cudaSuccess)
				err = detail::alloc_on(ready_device(), word_bytes, true, (void **)&ready_);
			break;
		}
		if (err == cudaSuccess)
			err = detail::alloc_on(producer, word_bytes, true, (void **)&consumed_);
		if (err != cudaSuccess) {
			destroy();
			return outcome{err};
		}
		ch_.data = static_cast<const uint8_t *>(data_);
		ch_.ready = ready_;
		ch_.consumed = consumed_;
		ch_.lines = lines_;
		ch_.staging = staging_;
		return outcome{};
	}

	/* What the producer and the consumer kernels take. */
	channel device() const { return ch_; }

	/*
	 * launch_when_published() - a launch channel's consumer of @generation of slots
	 * @first_slot to @first_slot + @slots - 1, queued on @stream (a stream of the consumer GPU)
	 * @first_slot: the first slot
	 * @slots: slots of the delivery
	 * @generation: the generation the producer kernel publishes into each of them
	 * @consume: queues the consumer (see launcher), called now
	 * @stream: where the waits and the consumer go; not the legacy default stream
	 *
	 * Queues a wait until each slot's ready word says @generation was published (a stream
	 * memory operation: the stream's front end waits, no SM), then @consume's launch with
	 * delivery{@first_slot, @slots}. Returns at once: queue a run's deliveries ahead,
	 * generation after generation; the stream runs them in order, and the producer still waits
	 * for wic::consumed() before it writes a slot again.
	 *
	 * Return: WIC_OK; WIC_EINVALID for a channel of another transport, slots out of range or
	 * an empty @consume; WIC_ESTREAM for the legacy default stream; WIC_EIO with the failed
	 * call's error (cudaErrorNotSupported where the driver has no stream memory operations).
	 */
	outcome launch_when_published(uint32_t first_slot, uint32_t slots, uint32_t generation, const launcher &consume,
				      cudaStream_t stream) const
	{
		if (ch_.kind != transport::launch || !consume || first_slot >= ch_.slots || !slots ||
		    slots > ch_.slots - first_slot)
			return detail::invalid();
		if (detail::legacy_default(stream))
			return outcome{WIC_ESTREAM, cudaErrorInvalidValue};
		cudaError_t err = cudaSuccess;
		for (uint32_t s = first_slot; s < first_slot + slots && err == cudaSuccess; s++)
			err = detail::stream_wait_at_least(stream, &ready_[s], generation + 1);
		if (err == cudaSuccess)
			err = consume(delivery{first_slot, slots}, stream);
		return outcome{err};
	}

	/* Back to no generation published or consumed, for another run; no kernel may use it now. */
	outcome reset()
	{
		if (!consumed_)
			return detail::invalid();
		const size_t bytes = ch_.slots * sizeof(unsigned int);
		const cudaError_t err = lines_ ? detail::zero_on(consumer_, lines_, 2 * ch_.batch_bytes * ch_.slots)
					       : detail::zero_on(ready_device(), ready_, bytes);
		return outcome{err != cudaSuccess ? err : detail::zero_on(producer_, consumed_, bytes)};
	}

	void destroy()
	{
		detail::free_on(consumer_, data_);
		detail::free_on(ready_device(), ready_);
		detail::free_on(consumer_, lines_);
		detail::free_on(producer_, staging_);
		detail::free_on(producer_, consumed_);
		data_ = nullptr;
		ready_ = nullptr;
		lines_ = nullptr;
		staging_ = nullptr;
		consumed_ = nullptr;
		ch_ = channel{};
	}

private:
	int ready_device() const { return ch_.kind == transport::poll ? producer_ : consumer_; }

	channel ch_{};
	int consumer_ = 0;
	int producer_ = 0;
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	uint64_t *lines_ = nullptr;
	uint8_t *staging_ = nullptr;
	unsigned int *consumed_ = nullptr;
};

} /* namespace wic */

#endif /* WIC_GPU_PRODUCER_CUH */
