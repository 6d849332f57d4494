/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * error_names - wic::error_name() gives every status its wic.h name at compile time, usable in
 * device code; compiled by tests/tests/device_compile.rs, which also checks that it names every
 * code wic.h defines.
 */
#include <wic/wic.cuh>

namespace {

constexpr bool same(const char *a, const char *b)
{
	return *a == *b && (*a == '\0' || same(a + 1, b + 1));
}

static_assert(same(wic::error_name(WIC_OK), "WIC_OK"));
static_assert(same(wic::error_name(WIC_ETIMED_OUT), "WIC_ETIMED_OUT"));
static_assert(same(wic::error_name(WIC_EIO), "WIC_EIO"));
static_assert(same(wic::error_name(1), "WIC_E?"));

} /* namespace */

/* A kernel names what recv() returned. */
__global__ void report_status(wic::channel ch, const char **name)
{
	const uint8_t *message;
	*name = wic::error_name(wic::recv<wic::transport::push>(ch, 0, 0, 0, &message, 1));
}
