/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * check_outcome.h - CHECK(call) for the test programs written against the public headers only:
 * a call that returns a cudaError_t or a wic::outcome, whose failure is printed with the name of
 * its status (wic::outcome::name()) and ends the program with 2.
 */
#ifndef WIC_TESTS_CHECK_OUTCOME_H
#define WIC_TESTS_CHECK_OUTCOME_H

#include <cstdio>
#include <cstdlib>

#include <wic/status.cuh>

#define CHECK(call)                                                                                            \
	do {                                                                                                   \
		const wic::outcome o_{(call)};                                                                  \
		if (!o_.ok()) {                                                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, o_.name());              \
			exit(2);                                                                               \
		}                                                                                              \
	} while (0)

#endif /* WIC_TESTS_CHECK_OUTCOME_H */
