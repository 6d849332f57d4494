/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/host_producer.cuh - a host thread as the producer: wic::host_channel (push, poll, alg1,
 * mapped, tagged, launch) with publish(), publish_many(), coalesce() and wait_free(),
 * launch_consumer(), and pick_host_transport().
 */
#ifndef WIC_HOST_PRODUCER_CUH
#define WIC_HOST_PRODUCER_CUH

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <cuda_runtime.h>
#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include <wic/channel.cuh>

namespace wic {

/*
 * pick_host_transport() - the transport for a host producer's channel
 * @message_bytes: bytes of one warp's message
 * @warps_per_batch: messages in one generation of a slot
 * @spinning_waiters: threads that wait on the channel at once: one per warp with recv(), one
 *	per block with recv_block()
 *
 * mapped for batches of up to 1 KiB with a single spinning waiter; tagged for batches of up to
 * 512 bytes made of whole 8-byte words with more waiters; push otherwise. poll (spinning
 * across the link) and alg1 (the paper's algorithm, kept to compare with) are never the pick. The
 * measurements behind the limits: device/bench/README.md, "Choosing a host producer's
 * transport".
 */
inline transport pick_host_transport(uint32_t message_bytes, uint32_t warps_per_batch, uint32_t spinning_waiters)
{
	const uint64_t batch_bytes = (uint64_t)message_bytes * warps_per_batch;
	if (batch_bytes <= 1024 && spinning_waiters <= 1)
		return transport::mapped;
	return batch_bytes <= 512 && message_bytes % 8 == 0 ? transport::tagged : transport::push;
}

/*
 * pick_host_transport() - the same, knowing what shares the GPU (@beside)
 *
 * Alone or beside arithmetic, as above: every transport's waiters cost arithmetic 3.2% of its
 * speed at most. Beside memory-bound work, push: waiters that spin across PCIe (mapped) left
 * such a kernel 1.4 to 3.6% of its speed, tagged's spinning on device memory cost it up to
 * 6.5%, push's sleeping 2.3% at most (device/bench/corun.cu on an H200; device/README.md, "What
 * waiting costs the work beside it"). launch, which costs it 1.5% at most with nothing resident
 * while it waits, is the caller's choice: only the caller knows whether its consumer can be
 * launched anew for every delivery.
 */
inline transport pick_host_transport(uint32_t message_bytes, uint32_t warps_per_batch, uint32_t spinning_waiters,
				     sharing beside)
{
	if (beside == sharing::memory)
		return transport::push;
	return pick_host_transport(message_bytes, warps_per_batch, spinning_waiters);
}

namespace detail {

/* Copies @bytes of device memory at @from to host memory at @to, done when this returns. */
inline cudaError_t read_device(void *to, const void *from, size_t bytes)
{
	return on_own_stream(
		[&](cudaStream_t stream) { return cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream); });
}

/*
 * Lines of this many bytes or more are formatted with non-temporal stores: the copy engine,
 * not this CPU, reads them next, and they would only push other data out of its caches.
 */
constexpr uint64_t streamed_lines_bytes = 64 * 1024;

/*
 * format_lines() - a host producer's batch as the tagged transport's lines (host code)
 * @to: 2 * @words 64-bit words of pinned host memory, 16-byte aligned
 * @from: @bytes of data, at most 8 * @words; the words past them carry zeros
 * @bytes: data bytes
 * @words: 8-byte data words of the batch (its lines)
 * @tag: the generation's tag (generation + 1)
 *
 * Line i holds data bytes 8i to 8i + 3 in the low half of its first word and 8i + 4 to 8i + 7
 * in the low half of its second, @tag in the high half of both, as send_lines() stores them on
 * a GPU. With SSE2, 16 data bytes become two lines by two unpacks with the tag.
 */
inline void format_lines(uint64_t *to, const uint8_t *from, size_t bytes, uint64_t words, uint32_t tag)
{
	const uint64_t high = (uint64_t)tag << 32;
	uint64_t w = 0;

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
	const __m128i t = _mm_set1_epi32((int)tag);
	const bool stream = 16 * words >= streamed_lines_bytes;
	for (; 8 * (w + 2) <= bytes; w += 2) {
		const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i *>(from + 8 * w));
		__m128i *at = reinterpret_cast<__m128i *>(to + 2 * w);
		if (stream) {
			_mm_stream_si128(at, _mm_unpacklo_epi32(d, t));
			_mm_stream_si128(at + 1, _mm_unpackhi_epi32(d, t));
		} else {
			_mm_store_si128(at, _mm_unpacklo_epi32(d, t));
			_mm_store_si128(at + 1, _mm_unpackhi_epi32(d, t));
		}
	}
	/* The non-temporal stores are weakly ordered: done before the copy is queued. */
	_mm_sfence();
#endif
	for (; w < words; w++) {
		uint64_t d = 0;
		if (8 * w < bytes)
			memcpy(&d, from + 8 * w, bytes - 8 * w < 8 ? bytes - 8 * w : 8);
		to[2 * w] = high | (d & 0xffffffffULL);
		to[2 * w + 1] = high | d >> 32;
	}
}

} /* namespace detail */

/*
 * reuse - who keeps a host_channel's producer from overwriting a generation its consumers have
 * not read yet.
 *  - checked (the default): the channel. publish() refuses a slot whose last generation the
 *    consumers have not reported done (wic::consumed()) with WIC_EBUSY; wait_free() waits for
 *    that report.
 *  - caller: the application's own protocol (its consumers acknowledge through words of its
 *    own, say); publish() overwrites without looking, and a consumer that asks for an older
 *    generation than the slot holds gets WIC_ESTALE. The protocol must still let the
 *    consumers see a slot's generation before the next is published into it: push's ready
 *    word and tagged's lines are copied from pinned memory that the next publish() rewrites,
 *    so a copy not yet run would carry the newer value beside the older data.
 */
enum class reuse { checked, caller };

/*
 * coalesce_bytes - a good limit for host_channel::coalesce(): a run of publishes is queued as
 * one copy once it holds this many bytes. The first slot of a run waits for the run to fill and
 * be copied (4 MiB: about 80 us on PCIe 5); in exchange the per-copy costs of the copy engine
 * and the runtime are paid once per 4 MiB. device/bench/README.md ("Per-slot publishing") has
 * the measurements.
 */
constexpr size_t coalesce_bytes = 4 << 20;

/*
 * host_channel - a push, poll, alg1, mapped, tagged or launch channel with a host producer:
 * its memory and its producer side (host code).
 *
 * create() allocates the slots' data and the ready words: push, both in the current device's
 * memory, and pinned host memory its ready words are copied from; poll, the data there and the
 * words in pinned host memory; alg1, both in managed memory, as the paper's Algorithm 1 keeps
 * them; mapped, both in pinned host memory mapped into the device, which the consumers read across
 * the link; tagged, no ready words but the lines (zeroed) and the data the consumers unpack them
 * into in the device's memory, and a pinned copy of the lines where the host formats them;
 * launch, as push.
 * publish() copies a batch into a slot and marks its next generation ready (push and poll in
 * stream order; alg1 and mapped by the calling thread's stores; tagged by the tags in the lines it
 * copies), so a kernel that sees the ready word sees the data. Every transport also gets a
 * consumed word per slot in pinned host memory: consumers report a generation done with
 * wic::consumed(), and wait_free() holds the producer back until the slot it is about to overwrite
 * is free.
 *
 * launch: no consumer waits. publish() queues push's copies and then, on the same stream, the
 * launch of the consumer of what landed, which launch_consumer() gave: nothing of the consumer
 * is resident on the GPU between two deliveries, so waiting costs the work beside it nothing.
 * What it gives up: each delivery pays a launch (a few microseconds from the copy's end to the
 * kernel's start), and a consumer keeps no state on the SMs (registers, shared memory) from one
 * delivery to the next. Consumers of one stream run one after the other; deliveries on two
 * streams may run at once.
 *
 * Every call returns an outcome: a WIC_* status (WIC_EIO when a CUDA runtime call failed, with
 * its cudaError_t in outcome::cuda()), which converts to the cudaError_t earlier versions
 * returned. After a runtime call failed the channel's state is unknown: destroy() it.
 */
class host_channel {
public:
	host_channel() = default;
	host_channel(const host_channel &) = delete;
	host_channel &operator=(const host_channel &) = delete;
	~host_channel() { destroy(); }

	/*
	 * create() - allocates the channel on the current device
	 * @kind: push, poll, alg1, mapped, tagged or launch (then launch_consumer() before the
	 *	first publish)
	 * @slots: slots
	 * @message_bytes: bytes of one warp's message (tagged: a multiple of 8)
	 * @warps_per_batch: messages of one generation of a slot
	 * @who: who keeps the producer from overwriting unread data (reuse::checked: the channel)
	 *
	 * Return: WIC_OK; WIC_EINVALID for fault, a zero size, or tagged messages of a size that
	 * is not a multiple of 8 bytes; else WIC_EIO with the failed call's error.
	 */
	outcome create(transport kind, uint32_t slots, uint32_t message_bytes, uint32_t warps_per_batch,
		       reuse who = reuse::checked)
	{
		if (kind == transport::fault || kind > transport::launch || !slots || !message_bytes ||
		    !warps_per_batch || (kind == transport::tagged && message_bytes % 8))
			return detail::invalid();
		destroy();
		ch_ = detail::empty_channel(kind, slots, message_bytes, warps_per_batch);
		reuse_ = who;
		published_ = new unsigned int[slots]();
		const size_t data_bytes = ch_.batch_bytes * slots, ready_bytes = slots * sizeof(unsigned int);
		cudaError_t err;
		switch (kind) {
		case transport::push:
		case transport::launch:
			err = cudaMalloc(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMalloc(&ready_, ready_bytes);
			if (err == cudaSuccess)
				err = detail::zero_device(ready_, ready_bytes);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&host_ready_, ready_bytes, cudaHostAllocDefault);
			break;
		case transport::alg1:
			err = cudaMallocManaged(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMallocManaged(&ready_, ready_bytes);
			break;
		case transport::tagged:
			err = cudaMalloc(&data_, data_bytes);
			if (err == cudaSuccess)
				err = cudaMalloc(&lines_, 2 * data_bytes);
			if (err == cudaSuccess)
				err = detail::zero_device(lines_, 2 * data_bytes);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&host_lines_, 2 * data_bytes, cudaHostAllocDefault);
			ch_.lines = lines_;
			break;
		default: /* poll, mapped */
			err = kind == transport::poll ? cudaMalloc(&data_, data_bytes)
						      : cudaHostAlloc(&data_, data_bytes, cudaHostAllocMapped);
			if (err == cudaSuccess)
				err = cudaHostAlloc(&ready_, ready_bytes, cudaHostAllocMapped);
			break;
		}
		if (err == cudaSuccess)
			err = cudaHostAlloc(&consumed_, ready_bytes, cudaHostAllocMapped);
		if (err == cudaSuccess)
			memset(consumed_, 0, ready_bytes);
		if (err == cudaSuccess)
			err = cudaHostGetDevicePointer((void **)&ch_.consumed, consumed_, 0);
		/* Host-visible words (all but push's and launch's; tagged has none) start at 0 by the host's stores. */
		if (err == cudaSuccess && !device_ready() && kind != transport::tagged)
			memset(ready_, 0, ready_bytes);
		if (err == cudaSuccess && kind == transport::mapped)
			err = cudaHostGetDevicePointer((void **)&ch_.data, data_, 0);
		else
			ch_.data = static_cast<const uint8_t *>(data_);
		if (err == cudaSuccess && (kind == transport::poll || kind == transport::mapped))
			err = cudaHostGetDevicePointer((void **)&ch_.ready, ready_, 0);
		else
			ch_.ready = ready_;
		if (err != cudaSuccess)
			destroy();
		return outcome{err};
	}

	/* What kernels take. */
	channel device() const { return ch_; }

	/*
	 * launch_consumer() - what a launch channel launches for each delivery
	 * @consume: queues the consumer of a delivery on the stream it is given (see launcher),
	 *	called on the producer's thread wherever the channel queues copies: publish(),
	 *	publish_many(), and with coalesce() also flush(), wait_free(), coalesce(0) and a
	 *	refused publish(), which queue the run held back
	 *
	 * A launch that fails leaves its delivery published and consumed by nobody: under
	 * reuse::checked its slots never come free. The call that queued it returns WIC_EIO with
	 * the launch's error; destroy() the channel, as after any WIC_EIO. As for every transport,
	 * a consumer's wic::consumed() of a slot must come after its last read of it: with
	 * coalesce() the next run's copies may land while the run before's consumer still runs.
	 *
	 * Return: WIC_OK; WIC_EINVALID for a channel of another transport or an empty @consume.
	 */
	outcome launch_consumer(launcher consume)
	{
		if (ch_.kind != transport::launch || !consume)
			return detail::invalid();
		launch_ = std::move(consume);
		return outcome{};
	}

	/*
	 * The generation publish() gives @slot next (generations published so far); 0 for a bad
	 * slot, which the form below tells apart from a slot not yet published.
	 */
	unsigned int next_generation(uint32_t slot) const { return slot < ch_.slots ? published_[slot] : 0; }

	/* The same into *@generation: WIC_OK, or WIC_EINVALID for a bad slot (nothing written). */
	outcome next_generation(uint32_t slot, unsigned int *generation) const
	{
		if (slot >= ch_.slots || !generation)
			return detail::invalid();
		*generation = published_[slot];
		return outcome{};
	}

	/*
	 * wait_free() - flow control: waits until the consumers reported every generation of @slot
	 * published so far done (wic::consumed()), so that the next publish() may overwrite it
	 * @slot: the slot
	 * @timeout_ns: give up after this long (0: look once; forever, the default: never)
	 *
	 * Spins on the slot's word in pinned host memory, yielding the CPU between looks. When it
	 * has to wait at all, it first queues what coalesce() holds back, which the consumers may
	 * be waiting for.
	 *
	 * Return: WIC_OK; WIC_EINVALID for a bad slot; WIC_ETIMED_OUT (cudaErrorTimeout);
	 * WIC_ESTREAM (also cudaErrorTimeout) when, at the timeout, the copy of the slot's last
	 * generation has not reached the device (push, tagged): its stream has not run it, as
	 * when the stream waits for the consumer kernel (the stream rule at publish()). A copy
	 * still on its way at a short timeout shows so too: give a timeout well beyond a copy's
	 * time when the answer matters.
	 */
	outcome wait_free(uint32_t slot, uint64_t timeout_ns = forever) const
	{
		if (slot >= ch_.slots)
			return detail::invalid();
		if (free_now(slot))
			return outcome{};
		outcome queued = queue_run();
		if (!queued.ok())
			return queued;
		const auto start = std::chrono::steady_clock::now();
		while (!free_now(slot)) {
			if (detail::past(start, timeout_ns))
				return not_arrived(slot) ? outcome{WIC_ESTREAM, cudaErrorTimeout} : detail::timed_out();
			std::this_thread::yield();
		}
		return outcome{};
	}

	/*
	 * reset() - back to no generation published or consumed, for another run; no kernel may
	 * use the channel now, and no publish() may be in flight (its stream synchronized): push's
	 * words are cleared on a stream of their own, which waits for no other. A run coalesce()
	 * still holds back is dropped; what it queued on the channel's own streams is waited for.
	 */
	outcome reset()
	{
		if (!published_)
			return detail::invalid();
		const size_t words = ch_.slots * sizeof(unsigned int);
		cudaError_t err = cudaSuccess;
		for (cudaStream_t lane : lanes_)
			if (lane && err == cudaSuccess)
				err = cudaStreamSynchronize(lane);
		if (err != cudaSuccess)
			return outcome{err};
		if (device_ready()) {
			err = detail::zero_device(ready_, words);
		} else if (ch_.kind == transport::tagged) {
			err = detail::zero_device(lines_, 2 * ch_.batch_bytes * ch_.slots);
		} else {
			memset(ready_, 0, words);
		}
		memset(consumed_, 0, words);
		memset(published_, 0, words);
		run_ = pending{};
		return outcome{err};
	}

	/*
	 * publish() - publishes the next generation of @slot
	 * @slot: the slot
	 * @src: the batch; push and poll copy from it later, so it must stay valid and unchanged
	 *	until the slot's next wait_free() returns (with coalesce(), the copy may be queued
	 *	after publish() returns), and only pinned memory (cudaHostAlloc) lets the copy
	 *	overlap; alg1, mapped and tagged read it before publish() returns
	 * @bytes: bytes of the batch, at most batch_bytes. Past them the slot keeps what it held
	 *	(push, poll, alg1, mapped) or holds zeros (tagged).
	 * @stream: push, poll, tagged: where the copies are queued (see the stream rule below)
	 *
	 * push: the copy and a copy of the ready word from pinned memory are queued on @stream.
	 * poll: the copy completes, then this thread stores the ready word, as the simplest producer
	 * would. alg1 and mapped: this thread writes the data, then the ready word with a release
	 * store; alg1's pages go where nvidia-uvm moves them, mapped's stay in host memory.
	 * tagged: this thread formats the whole batch as lines with the generation's tag and
	 * queues one copy of them on @stream. launch: push's copies, then the consumer's launch
	 * (launch_consumer()), on @stream. With coalesce() on, push, poll, tagged and launch may
	 * hold the copies back to queue them with the next publishes' (see there).
	 *
	 * Reuse: with reuse::checked (the default) a slot whose last generation its consumers
	 * have not reported done is refused with WIC_EBUSY, and nothing is written: call
	 * wait_free() first (a run coalesce() holds back is queued then, so that the consumers
	 * can get there). With reuse::caller the slot is overwritten.
	 *
	 * The stream rule: @stream must never wait for the consumer kernel, which runs until its
	 * last message arrives. Use a stream created with cudaStreamNonBlocking, not the kernel's.
	 * The legacy default stream (0 unless built with per-thread default streams), which waits
	 * for every blocking stream's kernels, is refused for every transport with WIC_ESTREAM;
	 * the kernel's own stream cannot be told at publish() and shows at wait_free() as
	 * WIC_ESTREAM.
	 *
	 * Return: WIC_OK; WIC_EINVALID (cudaErrorInvalidValue) for a bad slot or size, or a
	 * launch channel without its consumer; WIC_ESTREAM (cudaErrorInvalidValue) for the
	 * legacy default stream; WIC_EBUSY (cudaErrorNotReady) for a slot not free; WIC_EIO with
	 * the failed runtime call's (or consumer launch's) error.
	 */
	outcome publish(uint32_t slot, const void *src, size_t bytes, cudaStream_t stream)
	{
		if (slot >= ch_.slots || bytes > ch_.batch_bytes)
			return detail::invalid();
		outcome checked = may_publish(slot, 1, stream);
		if (!checked.ok())
			return checked;
		if (!coalesce_bytes_ || !queued_on_stream())
			return publish_now(slot, 1, static_cast<const uint8_t *>(src), bytes, stream);
		return publish_later(slot, static_cast<const uint8_t *>(src), bytes, stream);
	}

	/*
	 * publish_many() - publishes the next generation of @count consecutive slots from @first
	 * @first: the first slot
	 * @count: slots; first + count at most slots
	 * @src: their batches back to back, batch_bytes each, as publish() reads it
	 * @stream: as publish()
	 *
	 * push: one copy of the data and one of the ready words for all of them, instead of two
	 * per slot; poll: one copy, then the words; alg1 and mapped: one memcpy(), then the words;
	 * tagged: all slots formatted, then one copy; launch: push's copies, then one launch of
	 * the consumer for all of them. A run coalesce() holds back is queued
	 * first. All slots must be free (reuse::checked) or none is published.
	 *
	 * Return: as publish().
	 */
	outcome publish_many(uint32_t first, uint32_t count, const void *src, cudaStream_t stream)
	{
		if (first >= ch_.slots || !count || count > ch_.slots - first)
			return detail::invalid();
		outcome checked = may_publish(first, count, stream);
		if (checked.ok())
			checked = queue_run();
		if (!checked.ok())
			return checked;
		return publish_now(first, count, static_cast<const uint8_t *>(src), ch_.batch_bytes, stream);
	}

	/*
	 * coalesce() - lets publish() gather consecutive publishes into one copy (push, poll,
	 * tagged, launch: and one launch; alg1 and mapped have no copy to gather)
	 * @max_bytes: queue a run once it holds this many bytes (coalesce_bytes is a good value);
	 *	0 turns coalescing off, after queueing what is held back
	 *
	 * A publish() joins the run when it continues it: the next slot, the same stream, and for
	 * push and poll a source right after the previous batch, which was whole (tagged formats
	 * each batch into the slot's own place, so any source joins). The run is queued as one
	 * copy of the data and one of the ready words (tagged: of the lines) when it holds
	 * @max_bytes, when it reaches the channel's last slot, when a publish() does not continue
	 * it, when wait_free() has to wait or publish_many() is called, and on flush(). Until then
	 * its generations are published (next_generation() counts them) but not queued: nothing
	 * the consumers can see. Call flush() when the producer stops publishing for a while: the
	 * last run of a pause otherwise waits for the producer's next call.
	 *
	 * Once coalesce() was called, the channel queues its copies on two streams of its own
	 * (non-blocking, so the stream rule holds), each run first made to wait for the work
	 * queued on the publishes' stream so far: runs alternate between the two, so that one
	 * run's data moves while the run before waits for its data to land before its ready
	 * words. (reuse::caller: one stream, so that two runs of one slot land in order.) A launch
	 * channel's consumer of a run waits for the run before's consumer besides its copies, so
	 * the consumers run one after the other, as on the publishes' stream, while the next run's
	 * data moves. So a cudaStreamSynchronize() of the publishes' stream does not wait for the
	 * copies, nor for a launch channel's consumers; wait_free() is how a producer learns that
	 * a slot's copy is done with its source and its consumers with the slot. Call it after
	 * create(), with the channel's device current; create() and destroy() end it.
	 *
	 * Return: WIC_OK; WIC_EIO if a stream cannot be created; or flush()'s error when turned off.
	 */
	outcome coalesce(size_t max_bytes)
	{
		if (max_bytes && !lanes_[0] && queued_on_stream()) {
			cudaError_t err = cudaEventCreateWithFlags(&after_caller_, cudaEventDisableTiming);
			if (err == cudaSuccess && ch_.kind == transport::launch)
				err = cudaEventCreateWithFlags(&consumers_done_, cudaEventDisableTiming);
			for (int i = 0; i < (reuse_ == reuse::checked ? 2 : 1) && err == cudaSuccess; i++)
				err = cudaStreamCreateWithFlags(&lanes_[i], cudaStreamNonBlocking);
			if (err != cudaSuccess)
				return outcome{err};
		}
		coalesce_bytes_ = max_bytes;
		return max_bytes ? outcome{} : flush();
	}

	/* flush() - queues the run coalesce() holds back, if any. Return: WIC_OK; WIC_EIO. */
	outcome flush() { return queue_run(); }

	void destroy()
	{
		for (cudaStream_t &lane : lanes_) {
			if (lane) {
				/* Its copies read the pinned words and lines freed below. */
				cudaStreamSynchronize(lane);
				cudaStreamDestroy(lane);
				lane = nullptr;
			}
		}
		for (cudaEvent_t *event : {&after_caller_, &consumers_done_}) {
			if (*event)
				cudaEventDestroy(*event);
			*event = nullptr;
		}
		const bool host_data = ch_.kind == transport::mapped;
		const bool host_ready = ch_.kind == transport::poll || ch_.kind == transport::mapped;
		launch_ = nullptr;
		if (data_)
			host_data ? cudaFreeHost(data_) : cudaFree(data_);
		if (ready_)
			host_ready ? cudaFreeHost(ready_) : cudaFree(ready_);
		if (consumed_)
			cudaFreeHost(consumed_);
		if (lines_)
			cudaFree(lines_);
		if (host_lines_)
			cudaFreeHost(host_lines_);
		if (host_ready_)
			cudaFreeHost(host_ready_);
		delete[] published_;
		data_ = nullptr;
		ready_ = nullptr;
		consumed_ = nullptr;
		lines_ = nullptr;
		host_lines_ = nullptr;
		host_ready_ = nullptr;
		published_ = nullptr;
		run_ = pending{};
		coalesce_bytes_ = 0;
		next_lane_ = 0;
		ch_ = channel{};
	}

private:
	/* A run of publishes held back by coalesce(): slots first..first + count - 1. */
	struct pending {
		uint32_t first = 0, count = 0;
		const uint8_t *src = nullptr; /* push, poll: the first slot's batch */
		size_t last_bytes = 0;	      /* bytes of the last slot's batch */
		cudaStream_t stream = nullptr;
	};

	/* Whether publishing copies on a stream: push, poll, tagged, launch. */
	bool queued_on_stream() const { return ch_.kind != transport::alg1 && ch_.kind != transport::mapped; }

	/* Whether the ready words are in device memory, copied from pinned ones: push, launch. */
	bool device_ready() const { return ch_.kind == transport::push || ch_.kind == transport::launch; }

	/* Whether the consumers reported every generation of @slot published so far done. */
	bool free_now(uint32_t slot) const
	{
		/* Wrapping difference, as the generations on the device. */
		return (int)(__atomic_load_n(&consumed_[slot], __ATOMIC_ACQUIRE) - published_[slot]) >= 0;
	}

	/*
	 * Whether the copy of @slot's last generation has not reached the device: push's ready
	 * word, tagged's first line (whose tag is the generation + 1) still shows an earlier one.
	 * Read on a stream of its own, which waits for none of the application's.
	 */
	bool not_arrived(uint32_t slot) const
	{
		unsigned int seen = published_[slot];
		if (device_ready())
			detail::read_device(&seen, &ready_[slot], sizeof(seen));
		else if (ch_.kind == transport::tagged)
			detail::read_device(&seen, reinterpret_cast<const uint8_t *>(lines_ + 2 * slot * (ch_.batch_bytes / 8)) + 4,
					    sizeof(seen));
		return seen != published_[slot];
	}

	/*
	 * The stream rule and the reuse rule for slots first..first + count - 1. A refusal for a
	 * slot not free queues the run held back, which may hold the generation the consumers
	 * have to see before they can free it.
	 */
	outcome may_publish(uint32_t first, uint32_t count, cudaStream_t stream) const
	{
		if (ch_.kind == transport::launch && !launch_)
			return detail::invalid();
		if (detail::legacy_default(stream))
			return outcome{WIC_ESTREAM, cudaErrorInvalidValue};
		for (uint32_t s = first; reuse_ == reuse::checked && s < first + count; s++) {
			if (!free_now(s)) {
				const outcome queued = queue_run();
				return queued.ok() ? outcome{WIC_EBUSY, cudaErrorNotReady} : queued;
			}
		}
		return outcome{};
	}

	/* The run coalesce() holds back, queued now. */
	outcome queue_run() const
	{
		if (!run_.count)
			return outcome{};
		const pending run = run_;
		run_ = pending{};
		return queue(run.first, run.count, run.src, run.last_bytes, run.stream);
	}

	/* publish() under coalesce(): joins the run, or queues it and begins another. */
	outcome publish_later(uint32_t slot, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		const bool tagged = ch_.kind == transport::tagged;
		const bool joins = run_.count && stream == run_.stream && slot == run_.first + run_.count &&
				   (tagged || (run_.last_bytes == ch_.batch_bytes &&
					       src == run_.src + (uint64_t)run_.count * ch_.batch_bytes));
		if (!joins) {
			outcome queued = queue_run();
			if (!queued.ok())
				return queued;
			run_ = pending{slot, 0, src, 0, stream};
		}
		if (tagged)
			format(slot, 1, src, bytes);
		published_[slot]++;
		run_.count++;
		run_.last_bytes = bytes;
		if ((uint64_t)run_.count * ch_.batch_bytes >= coalesce_bytes_ || slot == ch_.slots - 1)
			return queue_run();
		return outcome{};
	}

	/* Slots first..first + count - 1, @bytes of the last (of the others batch_bytes), now. */
	outcome publish_now(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes, cudaStream_t stream)
	{
		if (!queued_on_stream()) {
			uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)first * ch_.batch_bytes;
			memcpy(dst, src, (size_t)(count - 1) * ch_.batch_bytes + bytes);
			for (uint32_t s = first; s < first + count; s++)
				__atomic_store_n(&ready_[s], ++published_[s], __ATOMIC_RELEASE);
			return outcome{};
		}
		if (ch_.kind == transport::tagged)
			format(first, count, src, bytes);
		for (uint32_t s = first; s < first + count; s++)
			published_[s]++;
		return queue(first, count, src, bytes, stream);
	}

	/*
	 * The copies that make slots first..first + count - 1 visible at the generations
	 * published_ counts: push, the data's copy and then one copy of the ready words from
	 * pinned memory, in stream order; poll, the data's copy, waited for, then the words by
	 * this thread; tagged, one copy of the slots' formatted lines; launch, push's copies and
	 * then the consumer's launch.
	 *
	 * push's ready words: that a kernel already running on another stream which sees a word
	 * then also sees the data is what push relies on and NVIDIA does not document for copies;
	 * the transport test checks it byte by byte (a write-value operation's default fence did
	 * guarantee it). Not a stream write-value operation per word: each costs the GPU's stream
	 * about as much as a small copy, so a generation of many slots would wait for its words
	 * after its data (device/bench/README.md, "Ready words"). A slot's pinned word is read
	 * when the copy runs and written again only for its next generation, after its consumers
	 * saw this one, so after the copy engine read it (tagged's pinned lines likewise).
	 */
	outcome queue(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes, cudaStream_t stream) const
	{
		if (lanes_[0]) {
			/* coalesce(): on the next of the channel's streams, after the work on @stream. */
			const cudaStream_t lane = lanes_[next_lane_];
			next_lane_ = lanes_[1] ? 1 - next_lane_ : 0;
			cudaError_t err = cudaEventRecord(after_caller_, stream);
			if (err == cudaSuccess)
				err = cudaStreamWaitEvent(lane, after_caller_, 0);
			if (err != cudaSuccess)
				return outcome{err};
			stream = lane;
		}
		if (ch_.kind == transport::tagged) {
			const uint64_t words = ch_.batch_bytes / 8;
			return outcome{cudaMemcpyAsync(lines_ + 2 * first * words, host_lines_ + 2 * first * words,
						       (size_t)count * 2 * ch_.batch_bytes, cudaMemcpyHostToDevice, stream)};
		}
		uint8_t *dst = static_cast<uint8_t *>(data_) + (uint64_t)first * ch_.batch_bytes;
		cudaError_t err = cudaMemcpyAsync(dst, src, (size_t)(count - 1) * ch_.batch_bytes + bytes,
						  cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess)
			return outcome{err};
		if (ch_.kind == transport::poll) {
			err = cudaStreamSynchronize(stream);
			for (uint32_t s = first; s < first + count && err == cudaSuccess; s++)
				__atomic_store_n(&ready_[s], published_[s], __ATOMIC_RELEASE);
			return outcome{err};
		}
		for (uint32_t s = first; s < first + count; s++)
			host_ready_[s] = published_[s];
		err = cudaMemcpyAsync(&ready_[first], &host_ready_[first], count * sizeof(unsigned int),
				      cudaMemcpyHostToDevice, stream);
		if (err != cudaSuccess || ch_.kind != transport::launch)
			return outcome{err};
		/* On the channel's two streams: after the run before's consumer, on the other one. */
		if (consumers_done_)
			err = cudaStreamWaitEvent(stream, consumers_done_, 0);
		if (err == cudaSuccess)
			err = launch_(delivery{first, count}, stream);
		if (err == cudaSuccess && consumers_done_)
			err = cudaEventRecord(consumers_done_, stream);
		return outcome{err};
	}

	/*
	 * tagged: slots first..first + count - 1 formatted as lines into their pinned copy with
	 * their next generation's tag, each slot's whole batch (past @bytes of the last, zeros,
	 * since the consumers wait for every line).
	 */
	void format(uint32_t first, uint32_t count, const uint8_t *src, size_t bytes)
	{
		const uint64_t words = ch_.batch_bytes / 8;
		for (uint32_t i = 0; i < count; i++)
			detail::format_lines(host_lines_ + 2 * (first + i) * words, src + (uint64_t)i * ch_.batch_bytes,
					     i + 1 < count ? ch_.batch_bytes : bytes, words, published_[first + i] + 1);
	}

	channel ch_{};
	reuse reuse_ = reuse::checked;
	size_t coalesce_bytes_ = 0;
	mutable pending run_{};
	cudaStream_t lanes_[2] = {};	     /* coalesce(): the channel's own streams */
	cudaEvent_t after_caller_ = nullptr; /* where a run waits for the publishes' stream */
	cudaEvent_t consumers_done_ = nullptr; /* launch, coalesce(): after the last run's consumer */
	mutable uint32_t next_lane_ = 0;
	void *data_ = nullptr;
	unsigned int *ready_ = nullptr;
	unsigned int *consumed_ = nullptr;
	uint64_t *lines_ = nullptr;
	uint64_t *host_lines_ = nullptr;
	unsigned int *host_ready_ = nullptr; /* push, launch: the ready words' next values, copied from here */
	launcher launch_;		     /* launch: queues the consumer of a delivery */
	unsigned int *published_ = nullptr;
};

} /* namespace wic */

#endif /* WIC_HOST_PRODUCER_CUH */
