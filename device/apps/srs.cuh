/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * srs.cuh - C_SRS's work on one message, which the co-run benchmark's neighbour does too.
 */
#ifndef WIC_APPS_SRS_CUH
#define WIC_APPS_SRS_CUH

#include <cstdint>

namespace app {

/*
 * The energy (sum of squares) and peak (largest magnitude) of the @samples floats at @x, each
 * lane taking every 32nd; called by the whole warp, the sums complete in lane 0.
 */
__device__ inline float2 energy_and_peak(const float *x, uint32_t samples)
{
	const uint32_t lane = threadIdx.x % 32;
	float energy = 0.0f, peak = 0.0f;

	for (uint32_t i = lane; i < samples; i += 32) {
		energy = fmaf(x[i], x[i], energy);
		peak = fmaxf(peak, fabsf(x[i]));
	}
	for (int d = 16; d; d /= 2) {
		energy += __shfl_down_sync(0xffffffff, energy, d);
		peak = fmaxf(peak, __shfl_down_sync(0xffffffff, peak, d));
	}
	return make_float2(energy, peak);
}

} /* namespace app */

#endif /* WIC_APPS_SRS_CUH */
