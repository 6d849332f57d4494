/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * C_SRS - streaming: a host producer streams sensor batches; each consumer block processes its
 * slot's batches as they arrive (per warp: energy and peak of 1024 samples). Checked against a
 * CPU reference computed in double precision.
 *
 * Usage: c_srs MODE [REPS] [BLOCKS] [GENERATIONS]   (MODE: push, poll, alg1, launch, nowait; BLOCKS
 * defaults to the number of SMs, GENERATIONS to 64, REPS to 7)
 * Prints the median wall time of REPS runs and whether every result matched.
 */
#include <cmath>
#include <random>

#include "stream.cuh"
#include "description.h"
#include "srs.cuh"

namespace {

constexpr uint32_t warps = C_SRS_WARPS;
constexpr uint32_t samples = C_SRS_SAMPLES; /* floats per warp message */
constexpr uint32_t message_bytes = samples * sizeof(float);

__global__ void consume(wic::channel ch, app::placement place, float2 *results, int *errors)
{
	const uint32_t b = blockIdx.x;
	const uint32_t w = threadIdx.x / 32;
	const uint32_t lane = threadIdx.x % 32;

	for (uint32_t g = place.first; g < place.end(); g++) {
		const uint8_t *message;
		const int status = app::receive(ch, place.slot(b, g), place.generation(g), w, &message);
		if (status != WIC_OK) {
			if (lane == 0)
				atomicAdd(errors, 1);
		} else {
			const float2 e = app::energy_and_peak(reinterpret_cast<const float *>(message), samples);
			if (lane == 0)
				results[((size_t)b * place.generations + g) * warps + w] = e;
		}
		app::block_consumed(ch, place.slot(b, g), place.generation(g));
	}
}

float sample(uint64_t seed, uint32_t b, uint32_t g, uint32_t i)
{
	uint64_t x = seed ^ ((uint64_t)b << 40) ^ ((uint64_t)g << 20) ^ i;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return (float)((x >> 40) % 2001) / 1000.0f - 1.0f;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[BLOCKS] [GENERATIONS]", &cli, false, true))
		return 2;
	const uint32_t sms = app::sm_count();
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t blocks = cli.size(0, sms);
	const uint32_t generations = cli.size(1, C_SRS_GENERATIONS);
	/*
	 * Streaming, every block must be resident at once: the producer writes a generation only
	 * after every block is done with the one two before, which a block waiting for a free SM
	 * never is. (No-wait publishes everything before the launch.)
	 */
	int per_sm = 0;
	CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, consume, warps * 32, 0));
	const uint32_t resident = (uint32_t)per_sm * sms;
	if (reps < 1 || !blocks || !generations) {
		fprintf(stderr, "REPS, BLOCKS and GENERATIONS must be positive\n");
		return 2;
	}
	if (mode != app::mode::nowait && blocks > resident) {
		fprintf(stderr, "BLOCKS must be at most %u here (all resident at once) but for nowait\n", resident);
		return 2;
	}
	const size_t items = (size_t)blocks * generations * warps;
	float2 *results;
	int *errors;
	CHECK(cudaMalloc(&results, items * sizeof(float2)));
	CHECK(cudaMalloc(&errors, sizeof(int)));
	std::vector<float2> got(items);
	std::vector<double> times;
	std::vector<app::host_work> host;
	std::vector<double> pipeline; /* nowait only */
	bool correct = true;
	std::random_device entropy;

	for (int rep = 0; rep <= reps; rep++) { /* rep 0 warms up */
		const uint64_t seed = ((uint64_t)entropy() << 32) | entropy();
		CHECK(cudaMemset(results, 0xff, items * sizeof(float2))); /* poison: NaN */
		CHECK(cudaMemset(errors, 0, sizeof(int)));
		/* The kernel runs on a non-blocking stream, which does not wait for these. */
		CHECK(cudaDeviceSynchronize());
		auto fill = [&](uint32_t b, uint32_t g, uint8_t *buf) {
			float *x = reinterpret_cast<float *>(buf);
			for (uint32_t i = 0; i < warps * samples; i++)
				x[i] = sample(seed, b, g, i);
		};
		auto launch = [&](const wic::channel &ch, app::placement place, cudaStream_t s) {
			consume<<<blocks, warps * 32, 0, s>>>(ch, place, results, errors);
		};
		app::timing t = app::run(mode, blocks, generations, message_bytes, warps, fill, launch);
		int failed;
		CHECK(cudaMemcpy(&failed, errors, sizeof(int), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(got.data(), results, items * sizeof(float2), cudaMemcpyDeviceToHost));
		double err2 = 0, ref2 = 0;
		for (uint32_t b = 0; b < blocks; b++)
			for (uint32_t g = 0; g < generations; g++)
				for (uint32_t w = 0; w < warps; w++) {
					double energy = 0, peak = 0;
					for (uint32_t i = 0; i < samples; i++) {
						double x = sample(seed, b, g, w * samples + i);
						energy += x * x;
						peak = std::max(peak, std::fabs(x));
					}
					float2 r = got[((size_t)b * generations + g) * warps + w];
					err2 += (r.x - energy) * (r.x - energy) + (r.y - peak) * (r.y - peak);
					ref2 += energy * energy + peak * peak;
				}
		const double rel = std::sqrt(err2 / ref2);
		if (failed || !(rel < 1e-5)) {
			correct = false;
			fprintf(stderr, "C_SRS %s rep %d: %d warps failed, relative error %g\n", app::mode_name(mode), rep,
				failed, rel);
		}
		if (rep) {
			times.push_back(t.total_ms);
			host.push_back(t.host);
			if (mode == app::mode::nowait)
				pipeline.push_back(t.pipeline_ms);
		}
	}
	app::report("C_SRS", mode, "blocks=" + std::to_string(blocks) + " generations=" + std::to_string(generations),
		    times, correct, &host, &pipeline);
	CHECK(cudaFree(results));
	CHECK(cudaFree(errors));
	return correct ? 0 : 1;
}
