/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/wait.cuh - how each transport's consumers wait, in one place: on a ready word (push,
 * poll, alg1, mapped), on the tagged transport's lines, or stalled on a fault channel's run.
 * recv() and recv_block() (wic/recv.cuh) pick one of these, at compile time in their typed
 * forms.
 */
#ifndef WIC_WAIT_CUH
#define WIC_WAIT_CUH

#include <wic/channel.cuh>

namespace wic {

#ifdef __CUDACC__

namespace detail {

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

/*
 * Lines [@first, @end) of @slot, every @stride-th from @first: each waited for until it
 * carries generation @generation's tag, its 8 data bytes then unpacked into the slot's place
 * in ch.data. WIC_OK once all are; WIC_ESTALE when the first of a round's lines carries a
 * later generation's tag; WIC_ETIMED_OUT once @timeout_ns passed before.
 */
__device__ inline int receive_lines(const channel &ch, uint32_t slot, uint32_t generation, uint64_t first,
				    uint64_t end, uint32_t stride, uint64_t timeout_ns)
{
	uint64_t *to = reinterpret_cast<uint64_t *>(const_cast<uint8_t *>(ch.data) + (uint64_t)slot * ch.batch_bytes);
	const uint32_t tag = generation + 1;
	backoff pause(ch.backoff_ns, timeout_ns);

	for (uint64_t line = first; line < end; line += lines_per_round * stride) {
		uint64_t lo[lines_per_round], hi[lines_per_round];
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++)
			if (line + j * stride < end)
				load_line(line_at(ch, slot, line + j * stride), &lo[j], &hi[j]);
#pragma unroll
		for (uint32_t j = 0; j < lines_per_round; j++) {
			const uint64_t at = line + j * stride;
			if (at >= end)
				break;
			/* Not there yet: this one line is waited for, the round's later ones were loaded early. */
			while ((uint32_t)(lo[j] >> 32) != tag || (uint32_t)(hi[j] >> 32) != tag) {
				/*
				 * A later tag: the generation was overwritten. Looked for in the first
				 * half of a round's first line alone: a look at every line cost the
				 * run-time recv() 14 registers and a stack, and waiting for the round's
				 * lines one by one in a loop not unrolled 8. So a generation overwritten
				 * while a thread waits for a later line of a round is waited for until
				 * the timeout; only a producer under reuse::caller can overwrite one.
				 */
				if (j == 0 && (int)((uint32_t)(lo[j] >> 32) - tag) > 0)
					return WIC_ESTALE;
				if (!pause.pause())
					return WIC_ETIMED_OUT;
				load_line(line_at(ch, slot, at), &lo[j], &hi[j]);
			}
			to[at] = (lo[j] & 0xffffffffULL) | hi[j] << 32;
		}
	}
	return WIC_OK;
}

/*
 * Lane 0 waits until @slot has published @generation: WIC_OK; WIC_ESTALE if the slot holds a
 * later generation; WIC_ETIMED_OUT after @timeout_ns.
 */
__device__ inline int wait_ready(const channel &ch, uint32_t slot, uint32_t generation, uint64_t timeout_ns)
{
	unsigned seen;
	const int status = wait_past(&ch.ready[slot], generation, ch.backoff_ns, timeout_ns, &seen);

	return status == WIC_OK && seen != generation + 1 ? WIC_ESTALE : status;
}

/*
 * The warp's status from each lane's: the lowest, so WIC_ESTALE (-13) before WIC_ETIMED_OUT (-6)
 * before WIC_OK; one instruction (redux.sync) from sm_80 on.
 */
__device__ inline int warp_status(int own)
{
#if __CUDA_ARCH__ >= 800
	return __reduce_min_sync(0xffffffff, own);
#else
	if (__any_sync(0xffffffff, own == WIC_ESTALE))
		return WIC_ESTALE;
	return __any_sync(0xffffffff, own != WIC_OK) ? WIC_ETIMED_OUT : WIC_OK;
#endif
}

/* The block's status from each thread's: stale data before a timeout. */

__device__ inline int block_status(int own)
{
	if (__syncthreads_or(own == WIC_ESTALE))
		return WIC_ESTALE;
	return __syncthreads_or(own != WIC_OK) ? WIC_ETIMED_OUT : WIC_OK;
}

/* How a transport's consumers wait: three kinds, which the typed receives pick at compile time. */
enum class wait_kind { fault, lines, word };

__host__ __device__ constexpr wait_kind wait_of(transport kind)
{
	return kind == transport::fault ? wait_kind::fault : kind == transport::tagged ? wait_kind::lines : wait_kind::word;
}

template <wait_kind W>
__device__ inline int recv_as(const channel &ch, uint32_t slot, uint32_t generation, uint32_t warp_in_batch,
			      const uint8_t **message, uint64_t timeout_ns)
{
	const unsigned lane = threadIdx.x % 32;
	const uint64_t offset = (uint64_t)warp_in_batch * ch.message_bytes;
	const uint8_t *at;
	int status = WIC_OK;

	if (slot >= ch.slots || warp_in_batch >= ch.warps_per_batch)
		return WIC_EINVALID;

	if constexpr (W == wait_kind::fault) {
		at = reinterpret_cast<const uint8_t *>(ch.runs[2 * slot + generation % 2]) + offset;
		if (lane == 0) {
			/* The load that stalls until wicd maps the run; markers sit at page starts. */
			const uint64_t page = reinterpret_cast<uint64_t>(at) & ~4095ULL;

			status = marker_status(load_volatile(reinterpret_cast<const void *>(page)));
		}
	} else if constexpr (W == wait_kind::lines) {
		/* Every lane unpacks every 32nd line of the message. */
		at = ch.data + (uint64_t)slot * ch.batch_bytes + offset;
		const int rc = receive_lines(ch, slot, generation, offset / 8 + lane, (offset + ch.message_bytes) / 8, 32,
					     timeout_ns);
		status = warp_status(rc);
	} else {
		at = ch.data + (uint64_t)slot * ch.batch_bytes + offset;
		if (lane == 0)
			status = wait_ready(ch, slot, generation, timeout_ns);
	}
	status = __shfl_sync(0xffffffff, status, 0);
	__syncwarp();
	*message = at;
	return status;
}

/* recv_block()'s body for one kind of wait; @status is the block's shared word. */
template <wait_kind W>
__device__ inline int recv_block_as(const channel &ch, uint32_t slot, uint32_t generation, const uint8_t **batch,
				    uint64_t timeout_ns, int *status)
{
	const uint8_t *at;

	if (slot >= ch.slots)
		return WIC_EINVALID;
	if constexpr (W == wait_kind::fault)
		at = reinterpret_cast<const uint8_t *>(ch.runs[2 * slot + generation % 2]);
	else
		at = ch.data + (uint64_t)slot * ch.batch_bytes;
	__syncthreads();
	if constexpr (W == wait_kind::lines) {
		/* No word to wait on: the block unpacks the batch's lines, each thread every n-th. */
		const int rc =
			receive_lines(ch, slot, generation, thread_in_block(), ch.batch_bytes / 8, block_threads(), timeout_ns);
		*batch = at;
		return block_status(rc);
	} else {
		if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
			if constexpr (W == wait_kind::fault)
				*status = marker_status(load_volatile(at));
			else
				*status = wait_ready(ch, slot, generation, timeout_ns);
		}
		__syncthreads();
		const int result = *status;
		__syncthreads();
		*batch = at;
		return result;
	}
}

} /* namespace detail */

#endif /* __CUDACC__ */

} /* namespace wic */

#endif /* WIC_WAIT_CUH */
