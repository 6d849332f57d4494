/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* fake_cudart - see fake_cudart.h. */
#include "fake_cudart.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>

namespace {

std::vector<fake::copy> log_;
std::set<cudaStream_t> held_;
std::map<cudaStream_t, std::deque<std::function<void()>>> queued_;
/* An event recorded on a held stream: the stream it waits for. */
std::map<cudaEvent_t, cudaStream_t> pending_;
/* Streams made to wait for a held stream's event: released with it. */
std::multimap<cudaStream_t, cudaStream_t> waiting_;
int streams_;

/* Runs @op now, or after release() of its stream while it is held. */
void submit(cudaStream_t stream, std::function<void()> op)
{
	if (held_.count(stream))
		queued_[stream].push_back(std::move(op));
	else
		op();
}

cudaError_t allocate(void **ptr, size_t bytes)
{
	*ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
	return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

} /* namespace */

namespace fake {

const std::vector<copy> &copies()
{
	return log_;
}

void clear()
{
	log_.clear();
}

void hold(cudaStream_t stream)
{
	held_.insert(stream);
}

void release(cudaStream_t stream)
{
	held_.erase(stream);
	for (auto &op : queued_[stream])
		op();
	queued_.erase(stream);
	for (auto it = pending_.begin(); it != pending_.end();)
		it = it->second == stream ? pending_.erase(it) : std::next(it);
	const auto [first, last] = waiting_.equal_range(stream);
	std::vector<cudaStream_t> waiters;
	for (auto it = first; it != last; ++it)
		waiters.push_back(it->second);
	waiting_.erase(stream);
	for (cudaStream_t waiter : waiters)
		release(waiter);
}

bool held(cudaStream_t stream)
{
	return held_.count(stream) != 0;
}

int live_streams()
{
	return streams_;
}

} /* namespace fake */

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
	return allocate(ptr, bytes);
}

cudaError_t cudaMallocManaged(void **ptr, size_t bytes, unsigned int)
{
	return allocate(ptr, bytes);
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int)
{
	return allocate(ptr, bytes);
}

cudaError_t cudaHostGetDevicePointer(void **device, void *host, unsigned int)
{
	*device = host;
	return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
	std::free(ptr);
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
	std::free(ptr);
	return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int)
{
	*stream = reinterpret_cast<cudaStream_t>(new char);
	streams_++;
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	delete reinterpret_cast<char *>(stream);
	streams_--;
	return cudaSuccess;
}

/* A held stream's work waits for release(): synchronizing it would hang, as on a GPU. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	return held_.count(stream) ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind, cudaStream_t stream)
{
	log_.push_back(fake::copy{dst, src, bytes, stream});
	submit(stream, [=] { std::memcpy(dst, src, bytes); });
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
	submit(stream, [=] { std::memset(ptr, value, bytes); });
	return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int)
{
	*event = reinterpret_cast<cudaEvent_t>(new char);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	pending_.erase(event);
	delete reinterpret_cast<char *>(event);
	return cudaSuccess;
}

/* An event recorded on a held stream completes when the stream is released. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	if (held_.count(stream))
		pending_[event] = stream;
	else
		pending_.erase(event);
	return cudaSuccess;
}

/* A stream that waits for a pending event is held until the event's stream is released. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int)
{
	const auto it = pending_.find(event);
	if (it != pending_.end()) {
		held_.insert(stream);
		waiting_.emplace(it->second, stream);
	}
	return cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t error)
{
	switch (error) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	case cudaErrorNotReady:
		return "cudaErrorNotReady";
	case cudaErrorTimeout:
		return "cudaErrorTimeout";
	case cudaErrorLaunchOutOfResources:
		return "cudaErrorLaunchOutOfResources";
	default:
		return "cudaError?";
	}
}

} /* extern "C" */
