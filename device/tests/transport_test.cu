/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * transport_test - wic.cuh on a GPU with the stock driver: push and poll deliver every byte of
 * every generation to the right warp, and so do alg1 (the paper's Algorithm 1 made correct:
 * managed memory, recv_block(), thread 0 alone waiting) and mapped, and push and alg1 when a
 * whole generation is published with publish_many(); a host producer through a tagged channel
 * delivers every byte of messages of random sizes, which the consumers check the moment they
 * arrive (a tag seen before its data would show there); a wait past its timeout returns
 * WIC_ETIMED_OUT; create() and publish() refuse bad arguments; wait_free() and reset() keep
 * count; results posted with post_result() reach the host; the fault transport addresses
 * each warp's message in the run of its generation and turns each error marker into its code
 * (its pages are ordinary device memory here, so nothing stalls); a producer kernel delivers
 * through push, poll, alg1 and tagged peer channels (publish_block(); recv() and recv_block()),
 * a launch channel launches each delivery's consumer after its data landed (per publish(), per
 * publish_many() and per coalesced run; for a producer kernel, after a stream wait for its
 * ready words), byte for byte,
 * reusing each slot only after its consumers reported it consumed, and a wait for a generation
 * never published times out: on one GPU (producer and consumer kernels side by side), and from GPU 1
 * to GPU 0 where there are two with peer access.
 * Exits 0 when every check passed; prints one line per check.
 */
#include <cstring>

#include "../apps/stream.cuh"

namespace {

constexpr uint32_t warps = 16;
constexpr uint32_t message_bytes = 256;
int failures;

void check(bool ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	failures += !ok;
}

/*
 * Bytes of @out (device memory: @blocks x @generations batches of @batch, block-major) that differ
 * from @pattern(b, g, i), the byte i of batch (b, g) that was sent.
 */
template <typename Pattern>
size_t wrong_bytes(const uint8_t *out, uint32_t blocks, uint32_t generations, size_t batch, Pattern pattern)
{
	std::vector<uint8_t> got((size_t)blocks * generations * batch);
	CHECK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
	size_t wrong = 0;
	for (uint32_t b = 0; b < blocks; b++)
		for (uint32_t g = 0; g < generations; g++)
			for (size_t i = 0; i < batch; i++)
				wrong += got[((size_t)b * generations + g) * batch + i] != pattern(b, g, i);
	return wrong;
}

/*
 * Each warp copies its message of every generation to out[(b * G + g) * warps + w]; the block
 * then reports the generation consumed.
 */
__global__ void copy_out(wic::channel ch, app::placement place, uint8_t *out, int *status)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;

	for (uint32_t g = 0; g < place.generations; g++) {
		const uint8_t *message;
		int rc = wic::recv(ch, place.slot(b, g), place.generation(g), w, &message);
		if (rc != WIC_OK && lane == 0)
			atomicExch(status, rc);
		uint8_t *dst = out + (((size_t)b * place.generations + g) * warps + w) * message_bytes;
		for (uint32_t i = lane; i < message_bytes; i += 32)
			dst[i] = message[i];
		app::block_consumed(ch, place.slot(b, g), place.generation(g));
	}
}

__global__ void wait_once(wic::channel ch, uint64_t timeout_ns, int *status)
{
	const uint8_t *message;
	int rc = wic::recv(ch, 0, 0, threadIdx.x / 32, &message, timeout_ns);
	if (threadIdx.x == 0)
		*status = rc;
}

/*
 * Block 0 waits for generation @generation of slot 0 in recv(), block 1 in recv_block(); the
 * codes they return are added up in *@sum.
 */
__global__ void wait_next(wic::channel ch, uint32_t generation, uint64_t timeout_ns, int *sum)
{
	const uint8_t *message;
	const int rc = blockIdx.x ? wic::recv_block(ch, 0, generation, &message, timeout_ns)
				  : wic::recv(ch, 0, generation, threadIdx.x / 32, &message, timeout_ns);
	if (threadIdx.x == 0)
		atomicAdd(sum, rc);
}

/* Warp w of generation g reports its message's first byte, or the error code. */
__global__ void fault_probe(wic::channel ch, uint32_t generation, int *out)
{
	const uint8_t *message;
	int rc = wic::recv(ch, 0, generation, threadIdx.x / 32, &message);
	if (threadIdx.x % 32 == 0)
		out[threadIdx.x / 32] = rc == WIC_OK ? message[0] : rc;
}

__host__ __device__ inline uint8_t peer_pattern(uint32_t b, uint32_t g, uint32_t i)
{
	return (uint8_t)(b * 29 + g * 11 + i * 7 + 3);
}

/*
 * The producer: block b writes generation g of slot b once its consumers are done with g - 1.
 * After a failure (status set) nothing waits any more, so both kernels end.
 */
__global__ void peer_produce(wic::channel ch, uint32_t generations, uint64_t timeout_ns, int *status)
{
	const uint32_t b = blockIdx.x;

	for (uint32_t g = 0; g < generations; g++) {
		if (threadIdx.x == 0 && g > 0 && !*(volatile int *)status) {
			const int rc = wic::wait_consumed(ch, b, g - 1, timeout_ns);
			if (rc != WIC_OK)
				*(volatile int *)status = rc;
		}
		__syncthreads();
		uint8_t *batch = wic::slot_buffer(ch, b);
		for (uint32_t i = threadIdx.x; i < ch.batch_bytes; i += blockDim.x)
			batch[i] = peer_pattern(b, g, i);
		wic::publish_block(ch, b, g);
	}
}

/*
 * Warp w of block b copies its @message of generation @g of slot b to out[(b * G + g) * warps +
 * w]; then, the block done, thread 0 reports it consumed. Called by every thread of the block.
 */
__device__ void peer_copy_out(const wic::channel &ch, uint32_t b, uint32_t g, uint32_t generations,
			      const uint8_t *message, uint8_t *out)
{
	const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32;
	uint8_t *dst = out + (((size_t)b * generations + g) * ch.warps_per_batch + w) * ch.message_bytes;

	for (uint32_t i = lane; i < ch.message_bytes; i += 32)
		dst[i] = message[i];
	__syncthreads();
	if (threadIdx.x == 0)
		wic::consumed(ch, b, g);
}

/*
 * The consumers: warp w of block b copies its message of every generation of slot b to out.
 * Even blocks' warps each wait in recv(), odd blocks wait together in recv_block().
 */
__global__ void peer_consume(wic::channel ch, uint32_t generations, uint64_t timeout_ns, uint8_t *out, int *status)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;

	for (uint32_t g = 0; g < generations; g++) {
		const uint8_t *message;
		const bool gave_up = *(volatile int *)status != 0;
		int rc;
		if (b % 2) {
			rc = wic::recv_block(ch, b, g, &message, gave_up ? 1 : timeout_ns);
			message += w * ch.message_bytes;
		} else {
			rc = wic::recv(ch, b, g, w, &message, gave_up ? 1 : timeout_ns);
		}
		if (rc != WIC_OK && lane == 0 && !gave_up)
			*(volatile int *)status = rc;
		peer_copy_out(ch, b, g, generations, message, out);
	}
}

/*
 * A launch channel's consumer of one generation of every slot, launched once the producer
 * kernel published it: warp w of block b copies its message of slot b, there at the first look,
 * to out as peer_consume() does.
 */
__global__ void peer_launched_consume(wic::channel ch, wic::delivery d, uint32_t generations, uint8_t *out,
				      int *status)
{
	const uint32_t b = d.first_slot + blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint32_t g = wic::launched_generation(ch, b);
	const uint8_t *message;

	if (wic::recv<wic::transport::launch>(ch, b, g, w, &message, 0) != WIC_OK || g >= generations) {
		if (lane == 0)
			*(volatile int *)status = g >= generations ? WIC_ESTALE : WIC_ETIMED_OUT;
		return;
	}
	peer_copy_out(ch, b, g, generations, message, out);
}

/* The shape of the producer-kernel tests: blocks x generations batches of peer_warps messages. */
constexpr uint32_t peer_blocks = 8, peer_generations = 32, peer_warps = 4;
constexpr size_t peer_batch = (size_t)peer_warps * message_bytes;

/*
 * What a producer-kernel test runs on: a stream on each GPU with its kernel loaded (with lazy
 * loading a launch may wait for the other, running kernel), and on the consumer GPU out (every
 * batch, poisoned) and a status word. The consumer GPU is current after the constructor and
 * after run_producer().
 */
struct peer_rig {
	int consumer, producer;
	cudaStream_t stream[2];
	uint8_t *out;
	int *status;

	peer_rig(int c, int p, const void *consumer_kernel) : consumer(c), producer(p)
	{
		for (int side = 0; side < 2; side++) {
			cudaFuncAttributes attr;
			CHECK(cudaSetDevice(side ? producer : consumer));
			CHECK(cudaStreamCreateWithFlags(&stream[side], cudaStreamNonBlocking));
			CHECK(cudaFuncGetAttributes(&attr, side ? (const void *)peer_produce : consumer_kernel));
		}
		CHECK(cudaSetDevice(consumer));
		CHECK(cudaMalloc(&out, peer_blocks * peer_generations * peer_batch));
		CHECK(cudaMalloc(&status, sizeof(int)));
		CHECK(cudaMemset(out, 0xa5, peer_blocks * peer_generations * peer_batch));
		CHECK(cudaMemset(status, 0, sizeof(int)));
		CHECK(cudaDeviceSynchronize());
	}
	peer_rig(const peer_rig &) = delete;
	peer_rig &operator=(const peer_rig &) = delete;
	~peer_rig()
	{
		for (int side = 0; side < 2; side++) {
			CHECK(cudaSetDevice(side ? producer : consumer));
			CHECK(cudaStreamDestroy(stream[side]));
		}
		CHECK(cudaSetDevice(consumer));
		CHECK(cudaFree(out));
		CHECK(cudaFree(status));
		CHECK(cudaSetDevice(0));
	}

	/* Starts peer_produce() on the producer GPU and waits for both streams. */
	void run_producer(const wic::channel &ch)
	{
		CHECK(cudaSetDevice(producer));
		peer_produce<<<peer_blocks, 128, 0, stream[1]>>>(ch, peer_generations, 2000000000, status);
		CHECK(cudaGetLastError());
		for (int side = 0; side < 2; side++) {
			CHECK(cudaSetDevice(side ? producer : consumer));
			CHECK(cudaStreamSynchronize(stream[side]));
		}
		CHECK(cudaSetDevice(consumer));
	}

	int status_now() const
	{
		int rc;
		CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
		return rc;
	}

	size_t wrong() const { return wrong_bytes(out, peer_blocks, peer_generations, peer_batch, peer_pattern); }
};

/*
 * A producer kernel on GPU @producer, and on GPU @consumer a launch channel's consumers: every
 * generation's wait and launch queued before the producer starts (launch_when_published()),
 * each found there at the first look and copied byte for byte; a bad delivery refused.
 */
void peer_launch(int consumer, int producer)
{
	wic::peer_channel ch;
	CHECK(ch.create(wic::transport::launch, consumer, producer, peer_blocks, message_bytes, peer_warps));
	{
		peer_rig rig(consumer, producer, (const void *)peer_launched_consume);
		const wic::channel view = ch.device();
		uint32_t launches = 0;
		const wic::launcher consume = [&](const wic::delivery &d, cudaStream_t s) {
			launches++;
			peer_launched_consume<<<d.slots, peer_warps * 32, 0, s>>>(view, d, peer_generations, rig.out,
										  rig.status);
			return cudaGetLastError();
		};
		const bool refused =
			ch.launch_when_published(peer_blocks, 1, 0, consume, rig.stream[0]) == cudaErrorInvalidValue &&
			ch.launch_when_published(0, 1, 0, consume, cudaStreamLegacy).status() == WIC_ESTREAM &&
			launches == 0;
		for (uint32_t g = 0; g < peer_generations; g++)
			CHECK(ch.launch_when_published(0, peer_blocks, g, consume, rig.stream[0]));
		rig.run_producer(ch.device());
		const int rc = rig.status_now();
		const size_t wrong = rig.wrong();
		char what[224];
		snprintf(what, sizeof(what),
			 "peer launch: a kernel on GPU %d delivers %u x %u batches to consumers launched on GPU %d once "
			 "each generation was published, byte for byte (%zu wrong, status %d, %u launches; bad "
			 "deliveries %s)",
			 producer, peer_blocks, peer_generations, consumer, wrong, rc, launches,
			 refused ? "refused" : "NOT refused");
		check(wrong == 0 && rc == WIC_OK && launches == peer_generations && refused, what);
	}
	ch.destroy();
}

/* A producer kernel on GPU @producer, consumers on GPU @consumer (possibly the same GPU). */
void gpu_producer(wic::transport kind, int consumer, int producer)
{
	wic::peer_channel ch;
	CHECK(ch.create(kind, consumer, producer, peer_blocks, message_bytes, peer_warps));
	{
		peer_rig rig(consumer, producer, (const void *)peer_consume);
		const uint64_t timeout_ns = 2000000000;
		peer_consume<<<peer_blocks, peer_warps * 32, 0, rig.stream[0]>>>(ch.device(), peer_generations, timeout_ns,
										 rig.out, rig.status);
		CHECK(cudaGetLastError());
		rig.run_producer(ch.device());
		int rc = rig.status_now();
		const size_t wrong = rig.wrong();
		char what[160];
		snprintf(what, sizeof(what),
			 "peer %s: a kernel on GPU %d delivers %u x %u batches to GPU %d byte for byte, slots reused after "
			 "consumed() (%zu wrong, status %d)",
			 wic::transport_name(kind), producer, peer_blocks, peer_generations, consumer, wrong, rc);
		check(wrong == 0 && rc == WIC_OK, what);
		/* Nothing more is published: the next generation's wait ends at its timeout. */
		CHECK(cudaMemsetAsync(rig.status, 0, sizeof(int), rig.stream[0]));
		wait_next<<<2, peer_warps * 32, 0, rig.stream[0]>>>(ch.device(), peer_generations, 1000000, rig.status);
		CHECK(cudaGetLastError());
		CHECK(cudaStreamSynchronize(rig.stream[0]));
		rc = rig.status_now();
		snprintf(what, sizeof(what),
			 "peer %s: recv() and recv_block() of an unpublished generation time out after 1 ms",
			 wic::transport_name(kind));
		check(rc == 2 * WIC_ETIMED_OUT, what);
	}
	ch.destroy();
}

void delivery(app::mode mode)
{
	const uint32_t blocks = 8, generations = 32;
	const size_t bytes = (size_t)blocks * generations * warps * message_bytes;
	uint8_t *out;
	int *status;
	CHECK(cudaMalloc(&out, bytes));
	CHECK(cudaMalloc(&status, sizeof(int)));
	CHECK(cudaMemset(out, 0xa5, bytes));
	CHECK(cudaMemset(status, 0, sizeof(int)));
	/* The kernel runs on a non-blocking stream, which does not wait for these. */
	CHECK(cudaDeviceSynchronize());
	auto pattern = [](uint32_t b, uint32_t g, uint32_t i) { return (uint8_t)(b * 131 + g * 7 + i * 13 + 1); };
	auto fill = [&](uint32_t b, uint32_t g, uint8_t *buf) {
		for (uint32_t i = 0; i < warps * message_bytes; i++)
			buf[i] = pattern(b, g, i);
	};
	auto launch = [&](const wic::channel &ch, app::placement place, cudaStream_t s) {
		copy_out<<<blocks, warps * 32, 0, s>>>(ch, place, out, status);
	};
	app::run(mode, blocks, generations, message_bytes, warps, fill, launch);
	int rc;
	CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
	const size_t wrong = wrong_bytes(out, blocks, generations, (size_t)warps * message_bytes, pattern);
	char what[96];
	snprintf(what, sizeof(what), "%s: %u x %u batches byte for byte (%zu wrong, status %d)", app::mode_name(mode),
		 blocks, generations, wrong, rc);
	check(wrong == 0 && rc == WIC_OK, what);
	CHECK(cudaFree(out));
	CHECK(cudaFree(status));
}

/*
 * Block b consumes slot b, generation after generation, as Algorithm 1's consumer: recv_block()
 * (thread 0 waits, the block meets), each warp copies its message, the block meets again and
 * thread 0 reports the generation consumed (wic::consumed()) so that the host may write the
 * slot again.
 */
__global__ void block_copy_out(wic::channel ch, uint32_t generations, uint8_t *out, int *status)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;

	for (uint32_t g = 0; g < generations; g++) {
		const uint8_t *batch;
		const int rc = wic::recv_block(ch, b, g, &batch);
		if (rc != WIC_OK && threadIdx.x == 0)
			atomicExch(status, rc);
		uint8_t *dst = out + (((size_t)b * generations + g) * warps + w) * message_bytes;
		for (uint32_t i = lane; i < message_bytes; i += 32)
			dst[i] = batch[w * message_bytes + i];
		app::block_consumed(ch, b, g);
	}
}

/*
 * Every block's batches through a host_channel of @kind to block_copy_out(), slot by slot with
 * publish() or, @many, a generation of all slots at once with publish_many(); the host writes
 * a slot again once wait_free() says its consumers are done with it.
 */
void block_delivery(wic::transport kind, bool many)
{
	const uint32_t blocks = 8, generations = 32, batch = warps * message_bytes;
	const size_t bytes = (size_t)blocks * generations * batch;
	wic::host_channel ch;
	uint8_t *out;
	int *status, rc = 0;
	CHECK(ch.create(kind, blocks, message_bytes, warps));
	CHECK(cudaMalloc(&out, bytes));
	CHECK(cudaMalloc(&status, sizeof(int)));
	CHECK(cudaMemset(status, 0, sizeof(int)));
	CHECK(cudaDeviceSynchronize());
	auto pattern = [](uint32_t b, uint32_t g, uint32_t i) { return (uint8_t)(b * 61 + g * 17 + i * 5 + 2); };
	/* The copies may not queue behind the consumer kernel, which ends only after the last of them. */
	cudaStream_t stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	block_copy_out<<<blocks, warps * 32, 0, stream>>>(ch.device(), generations, out, status);
	CHECK(cudaGetLastError());
	std::vector<uint8_t> buf((size_t)blocks * batch);
	bool stuck = false;
	for (uint32_t g = 0; g < generations && !stuck; g++) {
		for (uint32_t b = 0; b < blocks && !stuck; b++) {
			/* Slot b is free once its consumers are done with g - 1 (and so is buf: the copy is done). */
			const cudaError_t err = ch.wait_free(b, 20000000000ull);
			stuck = err == cudaErrorTimeout;
			if (!stuck)
				CHECK(err);
			uint8_t *at = buf.data() + (many ? (size_t)b * batch : 0);
			for (uint32_t i = 0; i < batch; i++)
				at[i] = pattern(b, g, i);
			if (!many)
				CHECK(ch.publish(b, at, batch, copy_stream));
		}
		if (many && !stuck)
			CHECK(ch.publish_many(0, blocks, buf.data(), copy_stream));
	}
	if (!stuck)
		CHECK(cudaStreamSynchronize(stream));
	size_t wrong = 0;
	if (!stuck) {
		CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
		wrong = wrong_bytes(out, blocks, generations, batch, pattern);
	}
	char what[192];
	snprintf(what, sizeof(what),
		 "%s: %u x %u batches by %s, thread 0 of each block waiting, byte for byte (%zu wrong, status %d%s)",
		 wic::transport_name(kind), blocks, generations, many ? "publish_many()" : "publish()", wrong, rc,
		 stuck ? ", stuck" : "");
	check(!stuck && wrong == 0 && rc == WIC_OK, what);
	if (stuck)
		exit(1); /* the consumer kernel still spins: nothing after it could run */
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(status));
	CHECK(cudaFree(out));
}

/*
 * A launch channel's consumer of one delivery: block i takes slot d.first_slot + i at the
 * generation it was launched for, which must be there at the first look (a timeout of 0), each
 * warp copies its message to out as block_copy_out() does, and thread 0 reports it consumed.
 */
__global__ void launched_copy_out(wic::channel ch, wic::delivery d, uint32_t generations, uint8_t *out, int *status)
{
	const uint32_t slot = d.first_slot + blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint32_t g = wic::launched_generation(ch, slot);
	const uint8_t *batch;

	if (wic::recv_block<wic::transport::launch>(ch, slot, g, &batch, 0) != WIC_OK || g >= generations) {
		if (threadIdx.x == 0)
			atomicExch(status, g >= generations ? WIC_ESTALE : WIC_ETIMED_OUT);
		return;
	}
	uint8_t *dst = out + (((size_t)slot * generations + g) * warps + w) * message_bytes;
	for (uint32_t i = lane; i < message_bytes; i += 32)
		dst[i] = batch[w * message_bytes + i];
	__syncthreads();
	if (threadIdx.x == 0)
		wic::consumed(ch, slot, g);
}

/* How launch_delivery() publishes. */
enum class publishing { per_slot, many, coalesced };

/*
 * Every slot's batches through a launch channel, each delivery's consumer launched by the
 * channel after its copies: per slot with publish() (slot b on stream b % 2, so that two
 * consumers may run at once), a generation of all slots with publish_many(), or per slot
 * under coalesce() in runs of 3 slots; byte for byte, one launch per publish() (per run
 * coalesced, per publish_many()), and every consumer finding its generation at once.
 */
void launch_delivery(publishing how)
{
	const uint32_t blocks = 8, generations = 32, batch = warps * message_bytes;
	wic::host_channel ch;
	uint8_t *out;
	int *status, rc = 0;
	CHECK(ch.create(wic::transport::launch, blocks, message_bytes, warps));
	CHECK(cudaMalloc(&out, (size_t)blocks * generations * batch));
	CHECK(cudaMalloc(&status, sizeof(int)));
	CHECK(cudaMemset(status, 0, sizeof(int)));
	CHECK(cudaDeviceSynchronize());
	const bool refused = ch.publish(0, out, batch, cudaStreamPerThread) == cudaErrorInvalidValue;
	uint32_t launches = 0, launched_slots = 0;
	const wic::channel view = ch.device();
	CHECK(ch.launch_consumer([&](const wic::delivery &d, cudaStream_t stream) {
		launches++;
		launched_slots += d.slots;
		launched_copy_out<<<d.slots, warps * 32, 0, stream>>>(view, d, generations, out, status);
		return cudaGetLastError();
	}));
	if (how == publishing::coalesced)
		CHECK(ch.coalesce(3 * batch));
	auto pattern = [](uint32_t b, uint32_t g, uint32_t i) { return (uint8_t)(b * 29 + g * 13 + i * 7 + 5); };
	cudaStream_t streams[2];
	for (cudaStream_t &stream : streams)
		CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	std::vector<uint8_t> buf((size_t)blocks * batch);
	for (uint32_t g = 0; g < generations; g++) {
		/* Every slot free first: no wait_free() between two publishes cuts a coalesced run short. */
		for (uint32_t b = 0; b < blocks; b++)
			CHECK(ch.wait_free(b, 20000000000ull));
		for (uint32_t b = 0; b < blocks; b++) {
			for (uint32_t i = 0; i < batch; i++)
				buf[(size_t)b * batch + i] = pattern(b, g, i);
			if (how != publishing::many)
				CHECK(ch.publish(b, buf.data() + (size_t)b * batch, batch,
						 streams[how == publishing::per_slot ? b % 2 : 0]));
		}
		if (how == publishing::many)
			CHECK(ch.publish_many(0, blocks, buf.data(), streams[0]));
	}
	CHECK(ch.flush());
	for (uint32_t b = 0; b < blocks; b++)
		CHECK(ch.wait_free(b, 20000000000ull));
	CHECK(cudaDeviceSynchronize());
	CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
	const size_t wrong = wrong_bytes(out, blocks, generations, batch, pattern);
	/* Coalesced runs end at 3 slots or at the last slot: 3 runs per generation of 8 slots. */
	const uint32_t want = how == publishing::per_slot ? blocks * generations
			      : how == publishing::many	 ? generations
							 : 3 * generations;
	char what[224];
	snprintf(what, sizeof(what),
		 "launch: %u x %u batches by %s, each delivery's consumer launched after its copies, byte for byte "
		 "(%zu wrong, status %d, %u launches of %u slots, want %u; publish before launch_consumer() %s)",
		 blocks, generations,
		 how == publishing::per_slot ? "publish() on two streams"
		 : how == publishing::many   ? "publish_many()"
					     : "coalesced publish()",
		 wrong, rc, launches, launched_slots, want, refused ? "refused" : "NOT refused");
	check(wrong == 0 && rc == WIC_OK && launches == want && launched_slots == blocks * generations && refused, what);
	for (cudaStream_t stream : streams)
		CHECK(cudaStreamDestroy(stream));
	CHECK(cudaFree(status));
	CHECK(cudaFree(out));
}

/*
 * Byte @i of generation @g of slot @b in the host tagged test: a hash, so every 4 bytes of a
 * slot differ from the generation before in all but about one case in 2^32.
 */
__host__ __device__ inline uint8_t tagged_pattern(uint32_t b, uint32_t g, uint32_t i)
{
	uint32_t x = b * 0x9e3779b9u ^ (g + 1) * 0x85ebca6bu ^ i * 0xc2b2ae35u;

	x ^= x >> 15;
	x *= 0x2c1b3c6du;
	x ^= x >> 12;
	return (uint8_t)x;
}

/*
 * Block b consumes slot b of a host tagged channel, generation after generation: even blocks'
 * warps each in recv(), odd blocks together in recv_block(). Every byte a warp receives is
 * checked at once against what the host sent (sizes[g * gridDim.x + b] bytes of
 * tagged_pattern(), zeros after them): bytes that differ are added to *@wrong. Then the block
 * reports the generation consumed.
 */
__global__ void check_tagged(wic::channel ch, uint32_t generations, const uint32_t *sizes, unsigned long long *wrong,
			     int *status)
{
	const uint32_t b = blockIdx.x, w = threadIdx.x / 32, lane = threadIdx.x % 32;

	for (uint32_t g = 0; g < generations; g++) {
		const uint8_t *message;
		int rc;
		if (b % 2) {
			rc = wic::recv_block(ch, b, g, &message, 2000000000ull);
			message += (uint64_t)w * ch.message_bytes;
		} else {
			rc = wic::recv(ch, b, g, w, &message, 2000000000ull);
		}
		if (rc != WIC_OK && lane == 0)
			atomicExch(status, rc);
		const uint32_t size = sizes[g * gridDim.x + b];
		unsigned long long bad = 0;
		for (uint32_t i = lane; i < ch.message_bytes; i += 32) {
			const uint32_t at = w * ch.message_bytes + i;
			bad += message[i] != (at < size ? tagged_pattern(b, g, at) : 0);
		}
		if (bad)
			atomicAdd(wrong, bad);
		__syncthreads();
		if (threadIdx.x == 0)
			wic::consumed(ch, b, g);
	}
}

/*
 * A host producer through a tagged host_channel: @blocks slots of @warps messages of
 * @message_bytes, @generations each, twice (reset() between). Each generation of a slot is
 * published with publish() of a random size from 1 byte to the whole batch, except every
 * fourth generation, which publish_many() sends for all slots at once; the source buffer is
 * overwritten as soon as publish() returns (tagged reads it before). The consumers check every
 * byte the moment recv() returns: a tag that arrived before its data bytes would show as
 * bytes of the generation before.
 */
void host_tagged(uint32_t message_bytes, uint32_t warps_per_batch, uint32_t blocks, uint32_t generations)
{
	const uint32_t batch = message_bytes * warps_per_batch;
	wic::host_channel ch;
	CHECK(ch.create(wic::transport::tagged, blocks, message_bytes, warps_per_batch));
	std::vector<uint32_t> sizes((size_t)generations * blocks);
	uint32_t seed = 12345 + message_bytes * 7 + warps_per_batch;
	uint32_t *sizes_dev;
	unsigned long long *wrong_dev;
	int *status;
	CHECK(cudaMalloc(&sizes_dev, sizes.size() * sizeof(uint32_t)));
	CHECK(cudaMalloc(&wrong_dev, sizeof(unsigned long long)));
	CHECK(cudaMalloc(&status, sizeof(int)));
	cudaStream_t stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	std::vector<uint8_t> buf((size_t)blocks * batch);
	unsigned long long wrong = 0;
	int rc = WIC_OK;
	bool stuck = false;
	for (int round = 0; round < 2 && !stuck; round++) {
		if (round)
			CHECK(ch.reset());
		for (uint32_t g = 0; g < generations; g++)
			for (uint32_t b = 0; b < blocks; b++) {
				seed = seed * 1664525u + 1013904223u;
				sizes[g * blocks + b] = g % 4 == 3 ? batch : 1 + (seed >> 8) % batch;
			}
		CHECK(cudaMemcpy(sizes_dev, sizes.data(), sizes.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
		CHECK(cudaMemset(wrong_dev, 0, sizeof(unsigned long long)));
		CHECK(cudaMemset(status, 0, sizeof(int)));
		CHECK(cudaDeviceSynchronize());
		check_tagged<<<blocks, warps_per_batch * 32, 0, stream>>>(ch.device(), generations, sizes_dev, wrong_dev,
									 status);
		CHECK(cudaGetLastError());
		for (uint32_t g = 0; g < generations && !stuck; g++) {
			const bool many = g % 4 == 3;
			for (uint32_t b = 0; b < blocks && !stuck; b++) {
				const cudaError_t err = ch.wait_free(b, 20000000000ull);
				stuck = err == cudaErrorTimeout;
				if (!stuck)
					CHECK(err);
				const uint32_t size = sizes[g * blocks + b];
				uint8_t *at = buf.data() + (many ? (size_t)b * batch : 0);
				for (uint32_t i = 0; i < size; i++)
					at[i] = tagged_pattern(b, g, i);
				/* Past the size: bytes publish() must not send. */
				memset(at + size, 0xee, batch - size);
				if (!many)
					CHECK(ch.publish(b, at, size, copy_stream));
			}
			if (many && !stuck)
				CHECK(ch.publish_many(0, blocks, buf.data(), copy_stream));
		}
		if (stuck)
			break;
		CHECK(cudaStreamSynchronize(stream));
		CHECK(cudaStreamSynchronize(copy_stream));
		unsigned long long w;
		int r;
		CHECK(cudaMemcpy(&w, wrong_dev, sizeof(w), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(&r, status, sizeof(r), cudaMemcpyDeviceToHost));
		wrong += w;
		if (r != WIC_OK)
			rc = r;
	}
	char what[224];
	snprintf(what, sizeof(what),
		 "tagged (host): %u x %u x 2 batches of %u x %u B, random sizes, publish() and publish_many(), every byte "
		 "checked on arrival (%llu wrong, status %d%s)",
		 blocks, generations, warps_per_batch, message_bytes, wrong, rc, stuck ? ", stuck" : "");
	check(!stuck && wrong == 0 && rc == WIC_OK, what);
	if (stuck)
		exit(1); /* the consumer kernel still spins: nothing after it could run */
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(sizes_dev));
	CHECK(cudaFree(wrong_dev));
	CHECK(cudaFree(status));
}

/* Block b writes part b of result generations 0..@generations - 1: its index, then post_result(). */
__global__ void post_results(wic::result_view results, uint32_t generations)
{
	for (uint32_t g = 0; g < generations; g++) {
		uint32_t *part = reinterpret_cast<uint32_t *>(results.slot(g)) + blockIdx.x * blockDim.x;
		part[threadIdx.x] = g * 1000 + blockIdx.x * blockDim.x + threadIdx.x;
		wic::post_result(results, g, blockIdx.x);
	}
}

/*
 * The results direction: each part of each generation is there once wait() returns; wait()
 * times out on a part never written and refuses one that does not exist.
 */
void results()
{
	const uint32_t parts = 4, threads = 64, generations = 16;
	wic::result_channel r;
	CHECK(r.create(generations, parts * threads * sizeof(uint32_t), parts));
	post_results<<<parts, threads>>>(r.device(), generations);
	CHECK(cudaGetLastError());
	size_t wrong = 0;
	for (uint32_t g = 0; g < generations; g++)
		for (uint32_t p = 0; p < parts; p++) {
			CHECK(r.wait(g, p, 2000000000ull));
			const uint32_t *part = reinterpret_cast<const uint32_t *>(r.host().slot(g)) + p * threads;
			for (uint32_t t = 0; t < threads; t++)
				wrong += part[t] != g * 1000 + p * threads + t;
		}
	CHECK(cudaDeviceSynchronize());
	const bool edges = r.wait(generations, 0, 1000000) == cudaErrorTimeout &&
			   r.wait(0, parts, 1000000) == cudaErrorInvalidValue && !r.ready(generations, 0);
	char what[160];
	snprintf(what, sizeof(what),
		 "results: %u generations x %u parts posted by post_result() and awaited with wait() (%zu wrong)",
		 generations, parts, wrong);
	check(wrong == 0 && edges, what);
}

/*
 * What create() refuses: a fault channel, a transport out of range, empty sizes; mapped for a
 * GPU producer, tagged messages not made of 8-byte words.
 */
void refusals()
{
	wic::host_channel h;
	wic::peer_channel p;
	const bool refused = h.create(wic::transport::fault, 1, 64, 1) == cudaErrorInvalidValue &&
			     h.create(wic::transport::tagged, 1, 60, 1) == cudaErrorInvalidValue &&
			     h.create((wic::transport)7, 1, 64, 1) == cudaErrorInvalidValue &&
			     h.create(wic::transport::push, 0, 64, 1) == cudaErrorInvalidValue &&
			     p.create(wic::transport::mapped, 0, 0, 1, 64, 1) == cudaErrorInvalidValue &&
			     p.create(wic::transport::tagged, 0, 0, 1, 60, 1) == cudaErrorInvalidValue &&
			     p.create((wic::transport)7, 0, 0, 1, 64, 1) == cudaErrorInvalidValue;
	CHECK(h.create(wic::transport::push, 2, 64, 1));
	cudaStream_t stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	const uint8_t batch[128] = {}; /* as many bytes as every call below names, refused or not */
	const bool ranges = h.publish_many(1, 2, batch, stream) == cudaErrorInvalidValue &&
			    h.publish_many(2, 1, batch, stream) == cudaErrorInvalidValue &&
			    h.publish(0, batch, 65, stream) == cudaErrorInvalidValue;
	/* The stream rule: the legacy default stream would wait for a running consumer kernel. */
	const bool legacy = h.publish(0, batch, 64, 0) == cudaErrorInvalidValue &&
			    h.publish(0, batch, 64, cudaStreamLegacy) == cudaErrorInvalidValue &&
			    h.next_generation(0) == 0;
	CHECK(h.publish(0, batch, 64, stream));
	CHECK(cudaStreamSynchronize(stream));
	CHECK(cudaStreamDestroy(stream));
	/* Nothing consumed generation 0: wait_free() times out; reset() forgets it was published. */
	const bool flow = h.wait_free(0, 1000000) == cudaErrorTimeout && h.wait_free(1, 1000000) == cudaSuccess &&
			  h.wait_free(2) == cudaErrorInvalidValue;
	const bool published = h.next_generation(0) == 1;
	CHECK(h.reset());
	const bool reset = h.next_generation(0) == 0 && h.wait_free(0, 1000000) == cudaSuccess;
	check(refused && ranges && legacy && published,
	      "create() and publish() refuse what they cannot do (bad sizes, the legacy default stream) with "
	      "cudaErrorInvalidValue, and a refused publish() publishes nothing");
	check(flow && reset, "wait_free() waits for the consumers' report and times out without it; reset() clears");
	const bool picks = wic::pick_host_transport(64, 1, 1) == wic::transport::mapped &&
			   wic::pick_host_transport(256, 4, 1) == wic::transport::mapped &&
			   wic::pick_host_transport(1025, 1, 1) == wic::transport::push &&
			   wic::pick_host_transport(64, 1, 2) == wic::transport::tagged &&
			   wic::pick_host_transport(128, 4, 16) == wic::transport::tagged &&
			   wic::pick_host_transport(128, 5, 16) == wic::transport::push &&
			   wic::pick_host_transport(60, 1, 2) == wic::transport::push;
	check(picks, "pick_host_transport(): mapped up to 1 KiB and one spinning waiter, tagged up to 512 B of whole "
		     "8-byte words, push beyond");
	const bool peer_picks = wic::pick_peer_transport(64, 1) == wic::transport::tagged &&
				wic::pick_peer_transport(1024, 4) == wic::transport::tagged &&
				wic::pick_peer_transport(1024, 5) == wic::transport::push &&
				wic::pick_peer_transport(4104, 1) == wic::transport::push &&
				wic::pick_peer_transport(500, 1) == wic::transport::push;
	check(peer_picks, "pick_peer_transport(): tagged up to 4 KiB of whole 8-byte words, push otherwise");
}

/*
 * The typed receives: block 0's warps each in recv<K>(), block 1 together in recv_block<K>(),
 * copy generation 0 of slot 0 out; first, recv<> of another transport must refuse the channel.
 */
template <wic::transport K, wic::transport Other>
__global__ void typed_copy_out(wic::channel ch, uint8_t *out, int *status)
{
	const uint32_t w = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint8_t *message = nullptr;
	if (wic::recv<Other>(ch, 0, 0, w, &message, 1000) != WIC_EINVALID || message)
		atomicExch(status, -100);
	int rc;
	if (blockIdx.x == 0) {
		rc = wic::recv<K>(ch, 0, 0, w, &message);
	} else {
		rc = wic::recv_block<K>(ch, 0, 0, &message);
		message += w * message_bytes;
	}
	if (rc != WIC_OK && lane == 0)
		atomicExch(status, rc);
	uint8_t *dst = out + ((size_t)blockIdx.x * warps + w) * message_bytes;
	for (uint32_t i = lane; i < message_bytes; i += 32)
		dst[i] = message[i];
}

template <wic::transport K, wic::transport Other>
void typed_delivery()
{
	const uint32_t batch = warps * message_bytes;
	wic::host_channel ch;
	uint8_t *out;
	int *status, rc = 0;
	CHECK(ch.create(K, 1, message_bytes, warps));
	CHECK(cudaMalloc(&out, 2 * (size_t)batch));
	CHECK(cudaMalloc(&status, sizeof(int)));
	CHECK(cudaMemset(status, 0, sizeof(int)));
	CHECK(cudaDeviceSynchronize());
	cudaStream_t stream, copy_stream;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
	typed_copy_out<K, Other><<<2, warps * 32, 0, stream>>>(ch.device(), out, status);
	CHECK(cudaGetLastError());
	std::vector<uint8_t> buf(batch);
	for (uint32_t i = 0; i < batch; i++)
		buf[i] = (uint8_t)(i * 11 + 5);
	CHECK(ch.publish(0, buf.data(), batch, copy_stream));
	CHECK(cudaStreamSynchronize(stream));
	CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
	std::vector<uint8_t> got(2 * (size_t)batch);
	CHECK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
	size_t wrong = 0;
	for (size_t i = 0; i < got.size(); i++)
		wrong += got[i] != buf[i % batch];
	char what[160];
	snprintf(what, sizeof(what),
		 "%s: recv<%s>() and recv_block<>() deliver byte for byte (%zu wrong, status %d); recv<%s>() refuses it",
		 wic::transport_name(K), wic::transport_name(K), wrong, rc, wic::transport_name(Other));
	check(wrong == 0 && rc == WIC_OK, what);
	CHECK(cudaStreamDestroy(stream));
	CHECK(cudaStreamDestroy(copy_stream));
	CHECK(cudaFree(out));
	CHECK(cudaFree(status));
}

void timeout(wic::transport kind)
{
	wic::host_channel ch;
	int *status, rc;
	CHECK(ch.create(kind, 1, message_bytes, warps));
	CHECK(cudaMalloc(&status, sizeof(int)));
	wait_once<<<1, warps * 32>>>(ch.device(), 1000000, status);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpy(&rc, status, sizeof(int), cudaMemcpyDeviceToHost));
	char what[64];
	snprintf(what, sizeof(what), "%s: unpublished slot times out after 1 ms", wic::transport_name(kind));
	check(rc == WIC_ETIMED_OUT, what);
	CHECK(cudaFree(status));
}

void fault_addressing()
{
	/* One slot, 2 runs of 1 page (16 warps x 256 B): run 0 holds data, run 1 markers. */
	uint8_t *pages;
	uint64_t *runs;
	int *out;
	CHECK(cudaMalloc(&pages, 2 * 4096));
	CHECK(cudaMalloc(&runs, 2 * sizeof(uint64_t)));
	CHECK(cudaMalloc(&out, warps * sizeof(int)));
	std::vector<uint8_t> host(2 * 4096);
	for (uint32_t w = 0; w < warps; w++)
		host[w * message_bytes] = (uint8_t)(w + 1);
	const uint64_t marker = WIC_ERROR_MARKER_MAGIC | 4;
	memcpy(&host[4096], &marker, sizeof(marker));
	CHECK(cudaMemcpy(pages, host.data(), host.size(), cudaMemcpyHostToDevice));
	struct wic_channel_info info = {};
	info.slots = 1;
	info.message_bytes = message_bytes;
	info.warps_per_batch = warps;
	info.batch_bytes = warps * message_bytes;
	struct wic_slot_info slot = {};
	slot.run_va[0] = (uint64_t)pages;
	slot.run_va[1] = (uint64_t)pages + 4096;
	wic::channel ch = wic::fault_channel(&info, &slot, runs);
	std::vector<int> got(warps);
	bool data_ok = ch.slots == 1, marker_ok = ch.slots == 1;
	fault_probe<<<1, warps * 32>>>(ch, 0, out);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpy(got.data(), out, warps * sizeof(int), cudaMemcpyDeviceToHost));
	for (uint32_t w = 0; w < warps; w++)
		data_ok &= got[w] == (int)(w + 1);
	fault_probe<<<1, warps * 32>>>(ch, 1, out);
	CHECK(cudaGetLastError());
	CHECK(cudaMemcpy(got.data(), out, warps * sizeof(int), cudaMemcpyDeviceToHost));
	for (uint32_t w = 0; w < warps; w++)
		marker_ok &= got[w] == WIC_ECONNECT;
	check(data_ok, "fault: generation 0 reads each warp's message in run P");
	check(marker_ok, "fault: generation 1 reads run P' and turns the daemon-gone marker into WIC_ECONNECT");
	CHECK(cudaFree(pages));
	CHECK(cudaFree(runs));
	CHECK(cudaFree(out));
}

} /* namespace */

int main()
{
	delivery(app::mode::push);
	delivery(app::mode::poll);
	delivery(app::mode::alg1);
	delivery(app::mode::nowait);
	timeout(wic::transport::push);
	timeout(wic::transport::poll);
	block_delivery(wic::transport::alg1, false);
	block_delivery(wic::transport::mapped, false);
	block_delivery(wic::transport::push, true);
	block_delivery(wic::transport::alg1, true);
	launch_delivery(publishing::per_slot);
	launch_delivery(publishing::many);
	launch_delivery(publishing::coalesced);
	timeout(wic::transport::alg1);
	timeout(wic::transport::mapped);
	timeout(wic::transport::tagged);
	/* Single words, odd sizes, a batch of 4 KiB, of 64 KiB and of 1 MiB (one warp unpacks 64 KiB). */
	host_tagged(8, 1, 8, 256);
	host_tagged(24, 4, 8, 256);
	host_tagged(1032, 4, 8, 128);
	host_tagged(256, 16, 8, 128);
	host_tagged(65536, 1, 4, 64);
	host_tagged(65536, 16, 4, 32);
	typed_delivery<wic::transport::push, wic::transport::tagged>();
	typed_delivery<wic::transport::poll, wic::transport::push>();
	typed_delivery<wic::transport::alg1, wic::transport::fault>();
	typed_delivery<wic::transport::mapped, wic::transport::push>();
	typed_delivery<wic::transport::tagged, wic::transport::push>();
	refusals();
	results();
	fault_addressing();
	gpu_producer(wic::transport::push, 0, 0);
	gpu_producer(wic::transport::poll, 0, 0);
	gpu_producer(wic::transport::alg1, 0, 0);
	gpu_producer(wic::transport::tagged, 0, 0);
	peer_launch(0, 0);
	int gpus = 0;
	CHECK(cudaGetDeviceCount(&gpus));
	const cudaError_t peer = gpus >= 2 ? wic::enable_peer_access(0, 1) : cudaErrorInvalidDevice;
	if (peer == cudaSuccess) {
		gpu_producer(wic::transport::push, 0, 1);
		gpu_producer(wic::transport::poll, 0, 1);
		gpu_producer(wic::transport::alg1, 0, 1);
		gpu_producer(wic::transport::tagged, 0, 1);
		peer_launch(0, 1);
	} else {
		printf("-- peer channels between two GPUs not checked: %d GPU(s)%s%s\n", gpus, gpus >= 2 ? ", " : "",
		       gpus >= 2 ? cudaGetErrorString(peer) : "");
	}
	printf("%s: %d failed\n", failures ? "FAIL" : "PASS", failures);
	return failures ? 1 : 0;
}
