/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/recv.cuh - the consumer's calls: recv() (a warp), recv_block() (a block, thread 0
 * waiting), each also typed by the transport (recv<K>(), recv_block<K>()), and consumed(),
 * the report that lets the producer write the slot again.
 */
#ifndef WIC_RECV_CUH
#define WIC_RECV_CUH

#include <wic/wait.cuh>

namespace wic {

#ifdef __CUDACC__

/*
 * recv() - wait for this warp's message of generation @generation of @slot
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot
 * @warp_in_batch: this warp's index among the batch's warps_per_batch
 * @message: receives the address of this warp's message_bytes
 * @timeout_ns: give up after this long (0: look once; forever, the default: never); fault: the
 *	channel's timeout, set at creation, applies instead
 *
 * Called by every lane of the warp, converged, with the same arguments. Return:
 *  - WIC_OK: *@message holds generation @generation;
 *  - WIC_EINVALID: @slot or @warp_in_batch is out of range (nothing read);
 *  - WIC_ESTALE: the slot already holds a later generation, so this one's data is gone (the
 *    producer overwrote it: it did not wait for wic::consumed(), or this warp came too late);
 *  - WIC_ETIMED_OUT: not published within @timeout_ns;
 *  - fault only: the error wicd or the module completed the request with (WIC_ETIMED_OUT,
 *    WIC_ECLOSED, WIC_ESTOPPING, or WIC_ECONNECT when wicd died); a fault channel cannot tell
 *    a stale generation.
 * A generation counts modulo 2^32: "later" means less than 2^31 generations ahead.
 *
 * This form decides at run time how to wait, so a kernel carries the code, and the registers,
 * of every transport's wait (tagged's the most); recv<K>() below carries only K's.
 */
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = forever)
{
	switch (detail::wait_of(ch.kind)) {
	case detail::wait_kind::fault:
		return detail::recv_as<detail::wait_kind::fault>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	case detail::wait_kind::lines:
		return detail::recv_as<detail::wait_kind::lines>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	default:
		return detail::recv_as<detail::wait_kind::word>(ch, slot, generation, warp_in_batch, message, timeout_ns);
	}
}

/*
 * recv<K>() - recv() for a channel of transport @K, known when the kernel is compiled: the kernel
 *	carries @K's wait alone, and needs only its registers (device/README.md has the figures;
 *	device_compile holds them to budgets)
 *
 * Return: as recv(); WIC_EINVALID, and *@message untouched, for a channel of another transport.
 */
template <transport K>
__device__ inline int recv(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			   const uint8_t **message, uint64_t timeout_ns = forever)
{
	if (ch.kind != K)
		return WIC_EINVALID;
	return detail::recv_as<detail::wait_of(K)>(ch, slot, generation, warp_in_batch, message, timeout_ns);
}

/*
 * recv_block() - the whole block waits for generation @generation of @slot, as the WIC paper's
 *	Algorithm 1 consumer does
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation, counted from 0 per slot
 * @batch: receives the address of the batch (warp w's message at w * message_bytes)
 * @timeout_ns: as recv()
 *
 * Called by every thread of the block, none of them inside a divergent branch. Algorithm 1,
 * line by line: (3) __syncthreads(); (4-7) thread 0 alone waits, spinning without backoff
 * (alg1, poll, mapped) or with push's backoff, on the slot's ready word with an acquire load
 * at system scope, or for a fault channel stalls on the batch's first page; (8) the batch is
 * then read through the returned address; (10) __syncthreads(), after which every thread has
 * the status. A trailing barrier lets the next call's thread 0 overwrite the shared status
 * safely. tagged has no word to wait on: every thread unpacks its share of the batch's lines,
 * then the barrier. recv_block<K>() carries @K's wait alone, as recv<K>() does.
 *
 * Return: as recv() (WIC_EINVALID for a bad @slot), the same in every thread.
 */
__device__ inline int recv_block(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				 uint64_t timeout_ns = forever)
{
	__shared__ int status;

	switch (detail::wait_of(ch.kind)) {
	case detail::wait_kind::fault:
		return detail::recv_block_as<detail::wait_kind::fault>(ch, slot, generation, batch, timeout_ns, &status);
	case detail::wait_kind::lines:
		return detail::recv_block_as<detail::wait_kind::lines>(ch, slot, generation, batch, timeout_ns, &status);
	default:
		return detail::recv_block_as<detail::wait_kind::word>(ch, slot, generation, batch, timeout_ns, &status);
	}
}

template <transport K>
__device__ inline int recv_block(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				 uint64_t timeout_ns = forever)
{
	__shared__ int status;

	if (ch.kind != K)
		return WIC_EINVALID;
	return detail::recv_block_as<detail::wait_of(K)>(ch, slot, generation, batch, timeout_ns, &status);
}

/*
 * consumed() - the consumers are done with generation @generation of @slot
 * @ch: the channel
 * @slot: the slot
 * @generation: the generation they read
 *
 * One thread calls it after every warp of the batch read its message for the last time (a
 * __syncthreads() between those reads and this call when they are one block's warps, a grid
 * barrier when they are several blocks). A release store at system scope of @generation + 1
 * to the slot's word, in the producer GPU's memory (peer_channel) or pinned host memory
 * (host_channel): the producer that sees it (wait_consumed() on the GPU, host_channel::
 * wait_free() on the host) overwrites the slot only after those reads. A store, not an
 * atomic: posted across the link, the consumer waits for no reply (the release orders its
 * earlier reads first). Nothing to do for a fault channel (consumed is null).
 */
__device__ inline void consumed(const channel &ch, uint32_t slot, uint32_t generation)
{
	if (ch.consumed)
		detail::store_release(&ch.consumed[slot], generation + 1);
}

#endif /* __CUDACC__ */

} /* namespace wic */

#endif /* WIC_RECV_CUH */
