/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * stall_cost - what warps stalled on page faults cost the warps beside them, on the stock driver.
 *
 * One block per SM: 8 warps of work, and S warps (0 to 24: a block has at most 32 warps) whose
 * lane 0 reads managed pages one after another, each read a new replayable fault, until the
 * block's work is done. The work is one of
 *   fma_chain     one dependent FMA chain per thread (issue latency-bound, low ILP)
 *   fma_ilp       eight independent FMA chains per thread (issue-bound, high ILP)
 *   fma_params    the same with the FMAs' operands kernel parameters, as the calibration's
 *                 loop has them: each FMA reads the constant bank
 *   shared_loads  16-byte loads from shared memory (no address translation at all)
 *   l1_loads      16-byte global loads of the block's 16 KiB, again and again (L1 and TLB hits)
 *   l2_loads      16-byte global loads bypassing L1 (ld.global.cg) of the block's 256 KiB (L2 hits)
 *   dram_loads    16-byte loads streaming through the block's 8 MiB (1 GiB in all, far past L2)
 *   tlb_misses    16-byte loads, each in another 2 MiB page of a buffer of up to 8 GiB (each
 *                 misses the TLBs, as far as their reach is smaller, and L2)
 * sized so that the work alone takes about 1 ms. Each configuration's slowdown is the median
 * block's work span beside the stalled warps over the median span alone (no stalled warps),
 * median of 3 runs each. Every stalled warp's faults are on pages of its own: every other page
 * of an interleaved range (at most half of any 2 MiB region is ever touched, below nvidia-uvm's
 * prefetch threshold of 51%), resident in host memory (the CPU wrote them before the run:
 * each fault migrates a page) or, for "fresh", never touched (each fault populates one).
 * Measured besides: the share of the block's work span during which at least one of its warps
 * was stalled (coverage), and from it how fast the work went on meanwhile (progress while
 * stalled: 1 = as fast as alone, 0 = not at all, assuming full speed outside the stalls); the
 * mean stall of one fault, how many pages a stalled warp got through and how many ran out of
 * pages before the work ended; for S = 1 and 2 the work warps on the schedulers of the stalled
 * warps against the others (assuming warp w issues from scheduler w % 4); and with S = 8 only
 * on the SMs of even %smid, the SMs with stalled warps against the SMs without: is the cost
 * local to the SM, or shared with the other SM of its TPC (SMs 2t and 2t + 1, as far as
 * %smid numbers them so)? And with the stalled warps first in the block (warps 0 to S - 1,
 * "first") rather than last: does a stalled warp's cost depend on where the scheduler ranks it?
 *
 * Usage: stall_cost [--quick] [OUT.jsonl]   (--quick: S = 1 and 8, one run each)
 * Prints one line per configuration; writes one JSON object per configuration to OUT.jsonl,
 * the first naming the GPU and the date. Reads the GPU's state; changes none of its settings.
 */
#include <cstring>
#include <ctime>
#include <vector>

#include <wic/wic.cuh>

#include "../apps/check.cuh"
#include "report.cuh"
#include "work.cuh"

namespace {

using bench::do_work;
using bench::dram_bytes;
using bench::l1_bytes;
using bench::large_page;
using bench::quantile;
using bench::record;
using bench::work;
using bench::work_name;
using bench::work_threads;
using bench::work_warps;

const work every_work[] = {work::fma_chain, work::fma_ilp,  work::fma_params, work::shared_loads,
			   work::l1_loads,  work::l2_loads, work::dram_loads, work::tlb_misses};

constexpr uint32_t max_stalled_warps = 24;
/* Dynamic shared memory of a block: more than half an SM's, so one block per SM. */
constexpr uint32_t smem_bytes = 120 * 1024;
constexpr uint64_t page_bytes = 4096;
/* Pages the CPU writes before a run, shared out among the stalled warps of the grid. */
constexpr uint64_t fault_budget_pages = 65536;
constexpr uint32_t max_pages_per_warp = 512;

/*
 * stall_plan - which warps stall, on which pages.
 * @pages: managed memory of 2 * fault_budget_pages pages; stalled warp g reads page
 *	2 * (k * @grid_warps + g) as its k-th
 * @warps: stalled warps per block
 * @grid_warps: stalled warps of the grid
 * @per_warp: the most pages one reads
 * @even_sms_only: blocks on an SM of odd %smid have no stalled warps (theirs end at once)
 * @stalled_first: the stalled warps are the block's first (warps 0 to @warps - 1), not its last
 */
struct stall_plan {
	const uint8_t *pages;
	uint32_t warps;
	uint32_t grid_warps;
	uint32_t per_warp;
	bool even_sms_only;
	bool stalled_first;
};

/*
 * What a run leaves per block and per warp: the block's work span and the part of it during
 * which a warp of the block was stalled, each work warp's time, and for each stalled warp the
 * pages it read and the time it spent stalled.
 */
struct run_record {
	uint32_t *smid;
	uint64_t *span_ns;
	uint64_t *stalled_span_ns;
	uint64_t *warp_ns;
	uint32_t *touched;
	uint64_t *stalled_ns;
};

/*
 * beside_stalls() - one block per SM: warps [0, work_warps) do @rounds rounds of @kind and time
 * themselves; the plan's stalled warps read their pages, one fault after another, until the
 * block's work is done.
 */
__global__ void beside_stalls(work kind, uint32_t rounds, const uint4 *data, uint64_t data_bytes, stall_plan plan,
			      run_record rec, uint32_t *sink, float m, float c)
{
	extern __shared__ uint4 smem[];
	__shared__ unsigned long long first_start, last_end, stalled_since, stalled_span;
	__shared__ volatile int work_over;
	__shared__ unsigned int finished, outstanding, stall_warps_done;
	const uint32_t lane = threadIdx.x % 32, b = blockIdx.x;
	const bool stalls = plan.stalled_first ? threadIdx.x / 32 < plan.warps : threadIdx.x / 32 >= work_warps;
	/* The warp's index among the work warps, or among the stalled ones. */
	uint32_t warp = threadIdx.x / 32;
	if (stalls && !plan.stalled_first)
		warp -= work_warps;
	else if (!stalls && plan.stalled_first)
		warp -= plan.warps;
	const uint32_t t = warp * 32 + lane;

	if (threadIdx.x == 0) {
		first_start = ~0ull;
		last_end = 0;
		stalled_span = 0;
		work_over = 0;
		finished = 0;
		outstanding = 0;
		stall_warps_done = 0;
	}
	uint32_t sm;
	asm("mov.u32 %0, %%smid;" : "=r"(sm));
	if (threadIdx.x == 0)
		rec.smid[b] = sm;
	__syncthreads();
	if (stalls) {
		const uint32_t g = b * plan.warps + warp;
		if (lane != 0 || (plan.even_sms_only && sm % 2))
			return;
		uint64_t stalled = 0, sum = 0;
		uint32_t k = 0;
		for (; k < plan.per_warp && !work_over; k++) {
			const uint8_t *at = plan.pages + 2 * ((uint64_t)k * plan.grid_warps + g) * page_bytes;
			const uint64_t t0 = wic::detail::globaltimer();
			/* The first warp of the block to stall opens an interval, the last to resume closes it. */
			if (atomicAdd(&outstanding, 1u) == 0)
				atomicExch(&stalled_since, (unsigned long long)t0);
			sum += wic::detail::load_volatile(at);
			const uint64_t t1 = wic::detail::globaltimer();
			stalled += t1 - t0;
			/*
			 * Read before this warp stops counting: once it has, another warp may open the
			 * next interval. Only what lies within the work span counts.
			 */
			const unsigned long long since = atomicAdd(&stalled_since, 0ull);
			if (atomicSub(&outstanding, 1u) == 1) {
				const uint64_t from = max(since, (unsigned long long)atomicAdd(&first_start, 0ull));
				const bool work_done = atomicAdd(&finished, 0u) == work_warps;
				const uint64_t to = work_done ? min((unsigned long long)t1, atomicAdd(&last_end, 0ull)) : t1;
				if (to > from)
					atomicAdd(&stalled_span, (unsigned long long)(to - from));
			}
		}
		rec.touched[g] = k;
		rec.stalled_ns[g] = stalled;
		/* The last stalled warp of the block to end leaves the block's stalled span. */
		if (atomicAdd(&stall_warps_done, 1u) == plan.warps - 1)
			rec.stalled_span_ns[b] = atomicAdd(&stalled_span, 0ull);
		if (sum == 42) /* never: keeps the loads */
			sink[0] = 1;
		return;
	}
	/* Only the work warps meet here: the stalled ones never come to a block-wide barrier. */
	for (uint32_t k = t; k < l1_bytes / 16; k += work_threads)
		smem[k] = make_uint4(k, k, k, k);
	asm volatile("bar.sync 1, %0;" ::"r"(work_threads) : "memory");
	const uint64_t start = wic::detail::globaltimer();
	if (lane == 0) /* now: the stalled warps clip their intervals to it */
		atomicMin(&first_start, (unsigned long long)start);
	const uint32_t result = do_work(kind, rounds, data, data_bytes, t, b, smem, m, c);
	const uint64_t end = wic::detail::globaltimer();
	if (result == 42)
		sink[1] = result;
	if (lane == 0) {
		rec.warp_ns[b * work_warps + warp] = end - start;
		atomicMax(&last_end, (unsigned long long)end);
		__threadfence_block();
		if (atomicAdd(&finished, 1u) == work_warps - 1) {
			__threadfence_block();
			rec.span_ns[b] = last_end - first_start;
			work_over = 1;
		}
	}
}

/* What one run measured. */
struct outcome {
	std::vector<uint32_t> smid;	  /* per block: the SM it ran on */
	std::vector<double> span_us;	  /* per block */
	std::vector<double> warp_us;	  /* per work warp, block-major */
	std::vector<double> coverage;	  /* per block with stalled warps: stalled span / work span */
	std::vector<double> stall_us;	  /* per stalled warp that read a page: mean stall of a fault */
	std::vector<double> touched;	  /* per stalled warp */
	double ran_out = 0;		  /* share of stalled warps that read every page they had */
};

class bench_state {
public:
	bench_state()
	{
		CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0));
		size_t free_bytes, total;
		CHECK(cudaMemGetInfo(&free_bytes, &total));
		/* tlb_misses' buffer: up to 8 GiB, a quarter of what is free at most. */
		data_bytes_ = std::min<uint64_t>(8ull << 30, free_bytes / 4) / large_page * large_page;
		data_bytes_ = std::max<uint64_t>(data_bytes_, (uint64_t)sms_ * dram_bytes);
		CHECK(cudaMalloc(&data_, data_bytes_));
		CHECK(cudaMemset(data_, 1, data_bytes_));
		pages_bytes_ = 2 * fault_budget_pages * page_bytes;
		CHECK(cudaMallocManaged(&pages_, pages_bytes_));
		CHECK(cudaMalloc(&smid_, sms_ * sizeof(uint32_t)));
		CHECK(cudaMalloc(&span_, sms_ * sizeof(uint64_t)));
		CHECK(cudaMalloc(&stalled_span_, sms_ * sizeof(uint64_t)));
		CHECK(cudaMalloc(&warp_, sms_ * work_warps * sizeof(uint64_t)));
		CHECK(cudaMalloc(&touched_, sms_ * max_stalled_warps * sizeof(uint32_t)));
		CHECK(cudaMalloc(&stalled_, sms_ * max_stalled_warps * sizeof(uint64_t)));
		CHECK(cudaMalloc(&sink_, 2 * sizeof(uint32_t)));
		CHECK(cudaFuncSetAttribute(beside_stalls, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
		CHECK(cudaDeviceSynchronize());
	}
	bench_state(const bench_state &) = delete;
	bench_state &operator=(const bench_state &) = delete;
	~bench_state()
	{
		CHECK(cudaFree(data_));
		CHECK(cudaFree(pages_));
		CHECK(cudaFree(smid_));
		CHECK(cudaFree(span_));
		CHECK(cudaFree(stalled_span_));
		CHECK(cudaFree(warp_));
		CHECK(cudaFree(touched_));
		CHECK(cudaFree(stalled_));
		CHECK(cudaFree(sink_));
	}

	int sms() const { return sms_; }
	uint64_t data_bytes() const { return data_bytes_; }

	/* Rounds of @kind that take about 1 ms alone. */
	uint32_t rounds_for(work kind)
	{
		const uint32_t probe = 16;
		const double us = quantile(run(kind, probe, 0, false, false).span_us, 0.5);
		return std::max<uint32_t>(1, (uint32_t)(probe * 1000.0 / std::max(us, 1e-3)));
	}

	/*
	 * run() - @kind for @rounds beside @stalled warps per block (only on SMs of even %smid
	 * with @even_only; the block's first warps with @first, else its last), whose pages are
	 * fresh (@fresh) or host-resident.
	 */
	outcome run(work kind, uint32_t rounds, uint32_t stalled, bool even_only, bool fresh, bool first = false)
	{
		const uint32_t grid_warps = stalled * sms_;
		const uint32_t per_warp =
			grid_warps ? std::min<uint64_t>(max_pages_per_warp, fault_budget_pages / grid_warps) : 0;
		if (stalled) {
			if (fresh) {
				CHECK(cudaFree(pages_));
				CHECK(cudaMallocManaged(&pages_, pages_bytes_));
			} else {
				memset(pages_, 1, pages_bytes_); /* resident in host memory: every read faults */
			}
		}
		CHECK(cudaMemset(touched_, 0, sms_ * max_stalled_warps * sizeof(uint32_t)));
		CHECK(cudaMemset(stalled_, 0, sms_ * max_stalled_warps * sizeof(uint64_t)));
		CHECK(cudaMemset(stalled_span_, 0, sms_ * sizeof(uint64_t)));
		CHECK(cudaDeviceSynchronize());
		const stall_plan plan{pages_, stalled, grid_warps, per_warp, even_only, first};
		const run_record rec{smid_, span_, stalled_span_, warp_, touched_, stalled_};
		beside_stalls<<<sms_, (work_warps + stalled) * 32, smem_bytes>>>(kind, rounds, data_, data_bytes_, plan,
										    rec, sink_, 0.999f, 0.5f);
		CHECK(cudaGetLastError());
		CHECK(cudaDeviceSynchronize());
		std::vector<uint64_t> span(sms_), stalled_span(sms_), warp(sms_ * work_warps), stalled_ns(grid_warps);
		std::vector<uint32_t> touched(grid_warps), smid(sms_);
		CHECK(cudaMemcpy(smid.data(), smid_, sms_ * sizeof(uint32_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(span.data(), span_, span.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(stalled_span.data(), stalled_span_, sms_ * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(warp.data(), warp_, warp.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(touched.data(), touched_, grid_warps * sizeof(uint32_t), cudaMemcpyDeviceToHost));
		CHECK(cudaMemcpy(stalled_ns.data(), stalled_, grid_warps * sizeof(uint64_t), cudaMemcpyDeviceToHost));
		outcome o;
		o.smid = smid;
		for (uint64_t v : span)
			o.span_us.push_back(v / 1000.0);
		for (uint64_t v : warp)
			o.warp_us.push_back(v / 1000.0);
		uint32_t ran_out = 0, active = 0;
		for (uint32_t g = 0; g < grid_warps; g++) {
			const uint32_t b = g / stalled;
			if (even_only && smid[b] % 2)
				continue;
			active++;
			ran_out += touched[g] == per_warp;
			o.touched.push_back(touched[g]);
			if (touched[g])
				o.stall_us.push_back(stalled_ns[g] / 1000.0 / touched[g]);
		}
		o.ran_out = active ? (double)ran_out / active : 0;
		for (int b = 0; stalled && b < sms_; b++)
			if (!(even_only && smid[b] % 2))
				o.coverage.push_back(std::min(1.0, stalled_span[b] / std::max(1.0, (double)span[b])));
		return o;
	}

private:
	int sms_ = 0;
	uint64_t data_bytes_ = 0;
	uint4 *data_ = nullptr;
	uint64_t pages_bytes_ = 0;
	uint8_t *pages_ = nullptr;
	uint32_t *smid_ = nullptr;
	uint64_t *span_ = nullptr;
	uint64_t *stalled_span_ = nullptr;
	uint64_t *warp_ = nullptr;
	uint32_t *touched_ = nullptr;
	uint64_t *stalled_ = nullptr;
	uint32_t *sink_ = nullptr;
};

/* The median span of the blocks on SMs of %smid parity @parity (-1: all) of one run. */
double median_span(const outcome &o, int parity)
{
	std::vector<double> v;
	for (size_t b = 0; b < o.span_us.size(); b++)
		if (parity < 0 || (int)(o.smid[b] % 2) == parity)
			v.push_back(o.span_us[b]);
	return quantile(v, 0.5);
}

/*
 * The median time of the work warps on the schedulers of @stalled (at most 4) stalled warps
 * (@same) or the others; @first: the stalled warps come first in the block.
 */
double median_warps(const outcome &o, uint32_t stalled, bool first, bool same)
{
	std::vector<double> v;
	for (size_t i = 0; i < o.warp_us.size(); i++) {
		/* Warp k of the block issues from scheduler k % 4; stalled warp j is warp j or work_warps + j. */
		const uint32_t w = i % work_warps, k = first ? stalled + w : w;
		const bool shares = k % 4 < stalled;
		if (shares == same)
			v.push_back(o.warp_us[i]);
	}
	return quantile(v, 0.5);
}

/*
 * One configuration, against @kind alone: median of @reps runs each. @first: the stalled warps
 * are the block's first.
 */
void measure(bench_state &st, work kind, uint32_t rounds, uint32_t stalled, bool even_only, bool fresh, int reps,
	     bool first = false)
{
	std::vector<double> alone, beside, beside_odd, same, other, alone_warp, coverage, stall, touched, ran_out;
	for (int r = 0; r < reps; r++) {
		const outcome a = st.run(kind, rounds, 0, false, false);
		const outcome s = st.run(kind, rounds, stalled, even_only, fresh, first);
		alone.push_back(median_span(a, -1));
		alone_warp.push_back(quantile(a.warp_us, 0.5));
		beside.push_back(median_span(s, even_only ? 0 : -1));
		if (even_only)
			beside_odd.push_back(median_span(s, 1));
		if (stalled <= 2) {
			same.push_back(median_warps(s, stalled, first, true));
			other.push_back(median_warps(s, stalled, first, false));
		}
		coverage.push_back(quantile(s.coverage, 0.5));
		stall.push_back(quantile(s.stall_us, 0.5));
		touched.push_back(quantile(s.touched, 0.5));
		ran_out.push_back(s.ran_out);
	}
	const double a = quantile(alone, 0.5), slowdown = quantile(beside, 0.5) / a, u = quantile(coverage, 0.5);
	/* Full speed outside the stalls, speed p during them: 1 / slowdown = (1 - u) + p u. */
	const double progress = u > 0 ? std::max(0.0, (1 / slowdown - (1 - u)) / u) : 1.0;
	printf("stall_cost  %-12s S=%2u%s%s  alone %8.1f us  beside %9.1f us  %7.3fx  coverage %.3f  progress %.3f"
	       "  stall %7.1f us/fault  pages %4.0f  ran out %3.0f%%",
	       work_name(kind), stalled, fresh ? " fresh" : first ? " first" : "", even_only ? " even SMs" : "", a, quantile(beside, 0.5),
	       slowdown, u, progress, quantile(stall, 0.5), quantile(touched, 0.5), 100 * quantile(ran_out, 0.5));
	record rec("stall_cost");
	rec.add("work", work_name(kind))
		.add("stalled_warps_per_sm", (double)stalled)
		.add("work_warps_per_sm", (double)work_warps)
		.add("pages", fresh ? "fresh" : "host_resident")
		.add("stalled_warps_first", first)
		.add("alone_us", a)
		.add("beside_us", quantile(beside, 0.5))
		.add("slowdown", slowdown)
		.add("coverage", u)
		.add("progress_while_stalled", progress)
		.add("stall_us_per_fault", quantile(stall, 0.5))
		.add("pages_touched", quantile(touched, 0.5))
		.add("ran_out", quantile(ran_out, 0.5))
		.add("reps", (double)reps);
	if (even_only) {
		const double odd = quantile(beside_odd, 0.5) / a;
		printf("  SMs without stalled warps %.3fx", odd);
		rec.add("stalls_on", "even_smid").add("slowdown_blocks_without_stalls", odd);
	}
	if (stalled <= 2) {
		const double aw = quantile(alone_warp, 0.5), s = quantile(same, 0.5) / aw, o = quantile(other, 0.5) / aw;
		printf("  warps on a stalled warp's scheduler %.3fx, others %.3fx", s, o);
		rec.add("slowdown_same_scheduler", s).add("slowdown_other_schedulers", o);
	}
	printf("\n");
	rec.emit();
}

} /* namespace */

int main(int argc, char **argv)
{
	const bool quick = bench::quick_and_output(argc, argv);
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	int driver = 0;
	CHECK(cudaDriverGetVersion(&driver));
	char date[32];
	const time_t now = time(nullptr);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	bench_state st;
	printf("stall_cost: %s (%d SMs), CUDA driver API %d, %s; tlb_misses over %.1f GiB\n", prop.name, st.sms(),
	       driver, date, st.data_bytes() / double(1ull << 30));
	record("device")
		.add("name", prop.name)
		.add("sms", (double)st.sms())
		.add("driver_api", (double)driver)
		.add("date", date)
		.add("tlb_buffer_bytes", (double)st.data_bytes())
		.emit();

	const int reps = quick ? 1 : 3;
	const std::vector<uint32_t> counts = quick ? std::vector<uint32_t>{1, 8} : std::vector<uint32_t>{1, 2, 4, 8, 16, 24};
	for (work kind : every_work) {
		const uint32_t rounds = st.rounds_for(kind);
		for (uint32_t s : counts)
			measure(st, kind, rounds, s, false, false, reps);
	}
	/* Is the cost local to the SM, and does a fresh page's fault cost the same? */
	for (work kind : {work::dram_loads, work::fma_ilp})
		measure(st, kind, st.rounds_for(kind), 8, true, false, reps);
	for (work kind : {work::dram_loads, work::l1_loads, work::fma_ilp})
		for (uint32_t s : counts)
			if (s == 1 || s == 8 || s == 24)
				measure(st, kind, st.rounds_for(kind), s, false, true, reps);
	/* Does a stalled warp cost more issue slots when it is among the block's first warps? */
	for (work kind : {work::fma_ilp, work::fma_chain, work::dram_loads})
		for (uint32_t s : {1u, 4u})
			measure(st, kind, st.rounds_for(kind), s, false, false, reps, true);
	if (bench::json)
		fclose(bench::json);
	return 0;
}
