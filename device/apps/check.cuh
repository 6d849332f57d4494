/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * check.cuh - CHECK(call): the device programs' (applications, tests, benchmarks) way to stop
 * at a failed CUDA runtime call, naming the call, where it is, and its error; exit status 2.
 */
#ifndef WIC_APPS_CHECK_CUH
#define WIC_APPS_CHECK_CUH

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CHECK(call)                                                                                     \
	do {                                                                                            \
		cudaError_t err_ = (call);                                                              \
		if (err_ != cudaSuccess) {                                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
			exit(2);                                                                        \
		}                                                                                       \
	} while (0)

#endif /* WIC_APPS_CHECK_CUH */
