/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic/status.cuh - one vocabulary of answers: WIC_* statuses by name (error_name()) in host and
 * device code, what host calls return (outcome), and what a timeout means (forever).
 */
#ifndef WIC_STATUS_CUH
#define WIC_STATUS_CUH

#include <cstdint>
#include <cuda_runtime.h>

#include <wic.h>

namespace wic {

/*
 * error_name() - the name of a WIC_* status, "WIC_ETIMED_OUT" for WIC_ETIMED_OUT, in host and
 * device code alike and with no library linked (libwic's wic_strerror() describes a status on
 * the host): a kernel can print what recv() returned. "WIC_E?" for a value wic.h does not define.
 */
__host__ __device__ constexpr const char *error_name(int status)
{
	switch (status) {
	case WIC_OK:
		return "WIC_OK";
	case WIC_EINVALID:
		return "WIC_EINVALID";
	case WIC_EPERMISSION:
		return "WIC_EPERMISSION";
	case WIC_ENOT_FOUND:
		return "WIC_ENOT_FOUND";
	case WIC_EEXHAUSTED:
		return "WIC_EEXHAUSTED";
	case WIC_EBUSY:
		return "WIC_EBUSY";
	case WIC_ETIMED_OUT:
		return "WIC_ETIMED_OUT";
	case WIC_ECLOSED:
		return "WIC_ECLOSED";
	case WIC_ESTOPPING:
		return "WIC_ESTOPPING";
	case WIC_EPROTOCOL:
		return "WIC_EPROTOCOL";
	case WIC_ECONNECT:
		return "WIC_ECONNECT";
	case WIC_EUNSUPPORTED:
		return "WIC_EUNSUPPORTED";
	case WIC_EIO:
		return "WIC_EIO";
	case WIC_ESTALE:
		return "WIC_ESTALE";
	case WIC_ESTREAM:
		return "WIC_ESTREAM";
	default:
		return "WIC_E?";
	}
}

/*
 * outcome - what a host call of wic.cuh returns: a WIC_* status, which error_name() names, and
 * the cudaError_t it converts to, so code written for the cudaError_t that earlier versions
 * returned keeps compiling and comparing. A failed CUDA runtime call is WIC_EIO with the
 * runtime's error; the library's own refusals convert to the cudaError_t each call documents.
 */
class outcome {
public:
	constexpr outcome() : status_(WIC_OK), cuda_(cudaSuccess) {}
	constexpr explicit outcome(cudaError_t err) : status_(err == cudaSuccess ? WIC_OK : WIC_EIO), cuda_(err) {}
	constexpr outcome(int status, cudaError_t err) : status_(status), cuda_(err) {}

	constexpr int status() const { return status_; }
	constexpr cudaError_t cuda() const { return cuda_; }
	constexpr bool ok() const { return status_ == WIC_OK; }
	constexpr operator cudaError_t() const { return cuda_; }

	/* "WIC_EBUSY", or for a failed runtime call the runtime's name, "cudaErrorMemoryAllocation". */
	const char *name() const { return status_ == WIC_EIO ? cudaGetErrorName(cuda_) : error_name(status_); }

private:
	int status_;
	cudaError_t cuda_;
};

/*
 * forever - the timeout of a wait that never gives up. Every wait of wic.cuh, on the device and
 * on the host, takes a timeout in nanoseconds with the meaning libwic gives it: 0 looks once,
 * forever waits until the data (or the consumers' report) is there, anything else at most that
 * long. forever is the default wherever a timeout may be left out.
 */
constexpr uint64_t forever = ~0ULL;

} /* namespace wic */

#endif /* WIC_STATUS_CUH */
