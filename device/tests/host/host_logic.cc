/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * host_logic - wic.cuh's host side without a GPU, over fake_cudart (host memory, streams that run
 * their copies at once unless held): what publish() refuses, which copies coalesce() queues on
 * which stream and with which ready words, when a held-back run is queued, what wait_free() and
 * a timeout of 0 answer, tagged's lines, launch's deliveries, the results direction's release(). The consumers are
 * played by the test, which writes a slot's consumed word as wic::consumed() would. Built and
 * run by tests/tests/device_compile.rs; device/tests/misuse_test.cu checks the same answers on a
 * GPU. Exits 0 when every check passed; prints one line per check.
 */
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <wic/gpu_producer.cuh>
#include <wic/host_producer.cuh>
#include <wic/results.cuh>

#include "fake_cudart.h"

namespace {

int failures;

void check(bool ok, const char *what)
{
	printf("%s %s\n", ok ? "ok" : "FAIL", what);
	failures += !ok;
}

/* The consumers report generation @g of @slot done, as wic::consumed() stores it. */
void consume(const wic::host_channel &ch, uint32_t slot, uint32_t g)
{
	__atomic_store_n(&ch.device().consumed[slot], g + 1, __ATOMIC_RELEASE);
}

cudaStream_t new_stream()
{
	cudaStream_t s;
	cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
	return s;
}

void refusals()
{
	const cudaStream_t stream = new_stream();
	uint8_t batch[128];
	memset(batch, 7, sizeof(batch));
	for (wic::transport kind : {wic::transport::push, wic::transport::poll, wic::transport::alg1,
				    wic::transport::mapped, wic::transport::tagged}) {
		wic::host_channel ch;
		const bool created = ch.create(kind, 2, 64, 1).ok();
		fake::clear();
		const wic::outcome first = ch.publish(0, batch, 64, stream);
		const size_t copies = fake::copies().size();
		const wic::outcome again = ch.publish(0, batch, 64, stream);
		const wic::outcome many = ch.publish_many(0, 2, batch, stream);
		const bool nothing = fake::copies().size() == copies && ch.next_generation(0) == 1;
		consume(ch, 0, 0);
		const wic::outcome after = ch.publish(0, batch, 64, stream);
		const wic::outcome legacy = ch.publish(1, batch, 64, 0);
		const wic::outcome legacy2 = ch.publish_many(1, 1, batch, cudaStreamLegacy);
		unsigned g = 99;
		const wic::outcome bad = ch.next_generation(2, &g);
		const wic::outcome good = ch.next_generation(0, &g);
		const cudaError_t as_cuda = again;
		char what[256];
		snprintf(what, sizeof(what),
			 "%s: publish() of an unconsumed slot %s (%s), publish_many() %s, nothing written; once consumed "
			 "%s; the legacy default stream %s, %s; next_generation(bad) %s",
			 wic::transport_name(kind), again.name(), cudaGetErrorName(as_cuda), many.name(), after.name(),
			 legacy.name(), legacy2.name(), bad.name());
		check(created && first.ok() && again.status() == WIC_EBUSY && as_cuda == cudaErrorNotReady &&
			      many.status() == WIC_EBUSY && nothing && after.ok() && legacy.status() == WIC_ESTREAM &&
			      (cudaError_t)legacy == cudaErrorInvalidValue && legacy2.status() == WIC_ESTREAM &&
			      bad.status() == WIC_EINVALID && good.ok() && g == 2,
		      what);
	}
	wic::host_channel caller;
	caller.create(wic::transport::push, 1, 64, 1, wic::reuse::caller);
	const bool overwrites = caller.publish(0, batch, 64, stream).ok() && caller.publish(0, batch, 64, stream).ok() &&
				caller.device().ready[0] == 2;
	check(overwrites, "reuse::caller: publish() overwrites, the ready word counts both generations");
	cudaStreamDestroy(stream);
}

/*
 * launch: publish() refuses a channel without its consumer; the consumer is launched once per
 * publish(), publish_many() or coalesced run, on the stream of that delivery's copies, after
 * the data's and the ready words' copies; a launch's error is publish()'s.
 */
void launch_deliveries()
{
	const uint32_t slots = 4, batch = 64;
	const cudaStream_t stream = new_stream();
	std::vector<uint8_t> src(slots * batch, 3);
	wic::host_channel ch, push;
	const bool created = ch.create(wic::transport::launch, slots, batch, 1).ok() &&
			     push.create(wic::transport::push, slots, batch, 1).ok();
	const wic::outcome unset = ch.publish(0, src.data(), batch, stream);
	const wic::outcome empty = ch.launch_consumer(nullptr);
	const wic::outcome other = push.launch_consumer([](const wic::delivery &, cudaStream_t) { return cudaSuccess; });
	struct launched {
		wic::delivery d;
		cudaStream_t stream;
		size_t copies_before;
		unsigned ready;
		bool held; /* the consumer's stream waits for something not done */
	};
	std::vector<launched> seen;
	cudaError_t fail = cudaSuccess;
	bool keeps_running = false; /* the consumer launched holds its stream, as a running kernel would */
	const wic::channel dev = ch.device();
	ch.launch_consumer([&](const wic::delivery &d, cudaStream_t on) {
		seen.push_back({d, on, fake::copies().size(), dev.ready[d.first_slot], fake::held(on)});
		if (keeps_running)
			fake::hold(on);
		return fail;
	});
	fake::clear();
	const bool one = ch.publish(1, src.data(), batch, stream).ok() && seen.size() == 1 &&
			 seen[0].d.first_slot == 1 && seen[0].d.slots == 1 && seen[0].stream == stream &&
			 seen[0].copies_before == 2 && fake::copies()[1].dst == dev.ready + 1 && seen[0].ready == 1;
	consume(ch, 1, 0);
	seen.clear();
	fake::clear();
	const bool many = ch.publish_many(0, slots, src.data(), stream).ok() && seen.size() == 1 &&
			  seen[0].d.first_slot == 0 && seen[0].d.slots == slots && seen[0].copies_before == 2 &&
			  seen[0].ready == 1;
	for (uint32_t s = 0; s < slots; s++)
		consume(ch, s, s == 1 ? 1 : 0);
	ch.coalesce(2 * batch);
	seen.clear();
	fake::clear();
	keeps_running = true;
	ch.publish(0, src.data(), batch, stream);
	const bool held = seen.empty();
	ch.publish(1, src.data() + batch, batch, stream);
	const bool run = held && seen.size() == 1 && seen[0].d.first_slot == 0 && seen[0].d.slots == 2 &&
			 seen[0].stream != stream && seen[0].stream == fake::copies()[0].stream && seen[0].copies_before == 2;
	/*
	 * The next run on the channel's other stream: its copies land while the first run's
	 * consumer still runs, and its consumer waits for that one.
	 */
	keeps_running = false;
	ch.publish(2, src.data() + 2 * batch, batch, stream);
	ch.publish(3, src.data() + 3 * batch, batch, stream);
	const bool in_turn = seen.size() == 2 && seen[1].d.first_slot == 2 && seen[1].stream != seen[0].stream &&
			     seen[1].ready == 2 && seen[1].held && !seen[0].held;
	if (!seen.empty())
		fake::release(seen[0].stream);
	ch.coalesce(0);
	for (uint32_t s = 0; s < slots; s++)
		consume(ch, s, s == 1 ? 2 : 1);
	fail = cudaErrorLaunchOutOfResources;
	const wic::outcome failed = ch.publish(0, src.data(), batch, stream);
	char what[288];
	snprintf(what, sizeof(what),
		 "launch: publish() before launch_consumer() %s, an empty consumer %s, on a push channel %s; the "
		 "consumer launched once per publish(), publish_many() and coalesced run, on its copies' stream after "
		 "them, each run's after the run before's consumer; a failed launch %s (%s)",
		 unset.name(), empty.name(), other.name(), wic::error_name(failed.status()),
		 cudaGetErrorName((cudaError_t)failed));
	check(created && unset.status() == WIC_EINVALID && empty.status() == WIC_EINVALID &&
		      other.status() == WIC_EINVALID && one && many && run && in_turn && failed.status() == WIC_EIO &&
		      (cudaError_t)failed == cudaErrorLaunchOutOfResources,
	      what);
	cudaStreamDestroy(stream);
}

/*
 * pick_host_transport() and pick_peer_transport() with what shares the GPU: beside memory-bound
 * work, push, never a spinner across PCIe nor tagged.
 */
void picks_beside_other_work()
{
	bool same = true;
	for (uint32_t bytes : {8u, 64u, 256u, 1024u, 65536u})
		for (uint32_t waiters : {1u, 16u})
			for (wic::sharing beside : {wic::sharing::alone, wic::sharing::arithmetic})
				same &= wic::pick_host_transport(bytes, 1, waiters, beside) ==
					wic::pick_host_transport(bytes, 1, waiters);
	const bool memory = wic::pick_host_transport(64, 1, 1, wic::sharing::memory) == wic::transport::push &&
			    wic::pick_host_transport(64, 1, 16, wic::sharing::memory) == wic::transport::push &&
			    wic::pick_host_transport(65536, 16, 16, wic::sharing::memory) == wic::transport::push &&
			    wic::pick_host_transport(64, 1, 1) == wic::transport::mapped;
	check(same && memory, "pick_host_transport(): alone or beside arithmetic as without the argument; beside "
			      "memory-bound work push, where alone it would be mapped or tagged");
	bool peer_same = true;
	for (uint32_t bytes : {8u, 64u, 500u, 1024u, 4096u, 65536u})
		for (uint32_t warps : {1u, 4u, 16u})
			for (wic::sharing beside : {wic::sharing::alone, wic::sharing::arithmetic})
				peer_same &= wic::pick_peer_transport(bytes, warps, beside) ==
					     wic::pick_peer_transport(bytes, warps);
	const bool peer_memory = wic::pick_peer_transport(64, 1, wic::sharing::memory) == wic::transport::push &&
				 wic::pick_peer_transport(1024, 4, wic::sharing::memory) == wic::transport::push &&
				 wic::pick_peer_transport(65536, 1, wic::sharing::memory) == wic::transport::push &&
				 wic::pick_peer_transport(64, 1) == wic::transport::tagged;
	check(peer_same && peer_memory, "pick_peer_transport(): alone or beside arithmetic as without the argument; "
					"beside memory-bound work push, where alone it would be tagged");
}

void coalescing()
{
	const uint32_t slots = 8, batch = 64;
	const cudaStream_t stream = new_stream();
	std::vector<uint8_t> src(slots * batch);
	for (size_t i = 0; i < src.size(); i++)
		src[i] = (uint8_t)(i * 13 + 1);
	wic::host_channel ch;
	ch.create(wic::transport::push, slots, batch, 1);
	const int streams_before = fake::live_streams();
	ch.coalesce(4 * batch);
	const bool lanes = fake::live_streams() == streams_before + 2;
	const wic::channel dev = ch.device();
	fake::clear();

	/* Slots 0..2: held back, nothing queued, but counted. */
	for (uint32_t s = 0; s < 3; s++)
		ch.publish(s, src.data() + s * batch, batch, stream);
	const bool held = fake::copies().empty() && ch.next_generation(2) == 1 && dev.ready[0] == 0;
	/* Slot 3 fills the run (4 batches): one data copy, one of the 4 ready words, on the channel's stream. */
	ch.publish(3, src.data() + 3 * batch, batch, stream);
	const auto &c = fake::copies();
	const bool first_run = c.size() == 2 && c[0].bytes == 4 * batch && c[0].src == src.data() &&
			       c[0].dst == dev.data && c[1].bytes == 4 * sizeof(unsigned) && c[1].dst == dev.ready &&
			       c[0].stream == c[1].stream && c[0].stream != stream;
	const bool landed = memcmp(dev.data, src.data(), 4 * batch) == 0 && dev.ready[0] == 1 && dev.ready[3] == 1;
	check(lanes && held && first_run && landed,
	      "coalesce(): a run is held back until it holds max_bytes, then queued as one data copy and one copy "
	      "of its ready words, on one of the channel's two streams");
	const cudaStream_t first_lane = c[0].stream;

	/* Slots 4, 5 from a source that does not follow: two runs; slot 6 partial; slot 7, the last, alone. */
	std::vector<uint8_t> other(batch, 0xab);
	fake::clear();
	ch.publish(4, src.data() + 4 * batch, batch, stream);
	ch.publish(5, other.data(), batch, stream); /* does not continue: slot 4's run is queued */
	const bool split = fake::copies().size() == 2 && fake::copies()[0].bytes == batch &&
			   fake::copies()[0].stream != stream && fake::copies()[0].stream != first_lane;
	ch.publish(6, src.data() + 6 * batch, batch / 2, stream); /* not contiguous with 5's source */
	const size_t before_last = fake::copies().size();
	ch.publish(7, src.data() + 7 * batch, batch, stream); /* after a partial batch: a run of its own */
	/* Slot 7 is the last: its run is queued at once, so nothing waits for a later call. */
	const bool last = fake::copies().size() == before_last + 4 && dev.ready[7] == 1 && dev.ready[6] == 1 &&
			  dev.data[7 * batch] == src[7 * batch] && dev.data[6 * batch + batch / 2 - 1] == src[6 * batch + batch / 2 - 1];
	check(split && last,
	      "coalesce(): a publish that does not continue the run (another source, after a partial batch) queues "
	      "it; a run that reaches the last slot is queued at once; runs alternate between the streams");

	/* wait_free(): a free slot does not queue the held-back run; a busy one does, then times out. */
	for (uint32_t s = 0; s < slots; s++)
		consume(ch, s, 0);
	fake::clear();
	ch.publish(0, src.data(), batch, stream);
	ch.publish(1, src.data() + batch, batch, stream);
	const bool free_no_flush = ch.wait_free(2, 0).ok() && fake::copies().empty();
	const auto t0 = std::chrono::steady_clock::now();
	const wic::outcome busy = ch.wait_free(0, 0);
	const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
	/* The run's two copies, then the timeout's read of the slot's ready word (not_arrived()). */
	const bool flushed = fake::copies().size() == 3 && fake::copies()[0].bytes == 2 * batch &&
			     fake::copies()[1].dst == dev.ready && fake::copies()[2].src == dev.ready && dev.ready[1] == 2;
	const wic::outcome timed = ch.wait_free(1, 1000000);
	char what[256];
	snprintf(what, sizeof(what),
		 "wait_free(): a free slot leaves the run held back; a busy one queues it first; timeout 0: %s after "
		 "%.3f ms; 1 ms with the copy done: %s",
		 busy.name(), ms, timed.name());
	check(free_no_flush && flushed && busy.status() == WIC_ETIMED_OUT && ms < 1.0 &&
		      timed.status() == WIC_ETIMED_OUT && (cudaError_t)timed == cudaErrorTimeout,
	      what);

	/* A copy that never runs (its stream held, as one waiting for the consumer kernel): WIC_ESTREAM. */
	ch.coalesce(0);
	consume(ch, 2, 0);
	fake::hold(stream);
	ch.publish(2, src.data(), batch, stream);
	const wic::outcome stuck = ch.wait_free(2, 1000000);
	fake::release(stream);
	const wic::outcome ran = ch.wait_free(2, 1000000);
	snprintf(what, sizeof(what),
		 "wait_free(): a copy that never ran %s (%s); once it ran, %s; coalesce(0) queues per publish", stuck.name(),
		 cudaGetErrorName(stuck), ran.name());
	check(stuck.status() == WIC_ESTREAM && (cudaError_t)stuck == cudaErrorTimeout &&
		      ran.status() == WIC_ETIMED_OUT,
	      what);

	/* A refused publish() queues the run held back: a retry loop gets there. */
	consume(ch, 5, 0);
	fake::clear();
	ch.publish(5, src.data() + 5 * batch, batch, stream);
	const wic::outcome refused = ch.publish(5, src.data() + 5 * batch, batch, stream);
	check(refused.status() == WIC_EBUSY && fake::copies().size() == 2 && dev.ready[5] == 2,
	      "a publish() refused for a slot held back in the run queues the run, so its consumers can free it");

	/* A run waits for the work queued on the publishes' stream before it. */
	consume(ch, 6, 0);
	fake::hold(stream);
	ch.publish(6, src.data() + 6 * batch, batch, stream);
	ch.flush();
	const bool waited = dev.ready[6] == 1;
	fake::release(stream);
	check(waited && dev.ready[6] == 2,
	      "a run on the channel's stream waits for what was queued on the publishes' stream before it");

	/* flush() and destroy() with a run held back. */
	ch.coalesce(wic::coalesce_bytes);
	consume(ch, 3, 0);
	consume(ch, 4, 0);
	fake::clear();
	ch.publish(3, src.data() + 3 * batch, batch, stream);
	ch.publish(4, src.data() + 4 * batch, batch, stream);
	const bool pending = fake::copies().empty();
	ch.flush();
	const bool queued = fake::copies().size() == 2 && fake::copies()[0].bytes == 2 * batch && dev.ready[4] == 2;
	ch.destroy();
	check(pending && queued && fake::live_streams() == streams_before,
	      "flush() queues the run held back; destroy() ends the channel's stream");
	cudaStreamDestroy(stream);
}

/* reuse::caller: one stream of the channel's own, so that two runs of a slot land in order. */
void one_lane()
{
	const cudaStream_t stream = new_stream();
	const int before = fake::live_streams();
	wic::host_channel ch;
	ch.create(wic::transport::push, 4, 64, 1, wic::reuse::caller);
	ch.coalesce(64);
	uint8_t batch[64] = {};
	fake::clear();
	for (int i = 0; i < 4; i++)
		ch.publish(0, batch, 64, stream);
	bool one = fake::live_streams() == before + 1 && fake::copies().size() == 8;
	for (const auto &c : fake::copies())
		one &= c.stream == fake::copies()[0].stream;
	check(one && ch.device().ready[0] == 4,
	      "reuse::caller, coalesced: every run on the one stream, so a slot's generations land in order");
	cudaStreamDestroy(stream);
}

void tagged_lines()
{
	const uint32_t slots = 4, batch = 32;
	const cudaStream_t stream = new_stream();
	wic::host_channel ch;
	ch.create(wic::transport::tagged, slots, batch, 1);
	ch.coalesce(wic::coalesce_bytes);
	const wic::channel dev = ch.device();
	uint8_t data[batch];
	fake::clear();
	for (uint32_t s = 0; s < slots; s++) {
		memset(data, (int)(s + 1), sizeof(data));
		ch.publish(s, data, s == 1 ? 5 : batch, stream); /* each source read at once, any source joins */
	}
	/* One copy of the 4 slots' lines; every line carries generation 0's tag (1). */
	bool tags = true;
	for (uint32_t w = 0; w < slots * batch / 4; w++)
		tags &= dev.lines[w] >> 32 == 1;
	const uint64_t slot1_line0 = dev.lines[2 * (1 * batch / 8)];
	const uint64_t slot1_line1 = dev.lines[2 * (1 * batch / 8 + 1)];
	const bool partial = (slot1_line0 & 0xffffffff) == 0x02020202 && (slot1_line1 & 0xffffffff) == 0;
	check(fake::copies().size() == 1 && fake::copies()[0].bytes == 2 * slots * batch && tags && partial,
	      "tagged, coalesced: every slot formatted with its generation's tag at publish(), one copy of the run's "
	      "lines, zeros past a partial batch");
	cudaStreamDestroy(stream);
}

/*
 * Code written for the cudaError_t that host calls returned before wic::outcome: it compiles and
 * compares as it did (a conditional expression with a cudaError_t, a const channel's wait_free()).
 */
void earlier_code()
{
	const cudaStream_t stream = new_stream();
	wic::host_channel ch;
	const cudaError_t created = ch.create(wic::transport::push, 2, 64, 1);
	const wic::host_channel &view = ch;
	uint8_t batch[64] = {};
	const bool skip = false;
	const cudaError_t published = skip ? cudaErrorInvalidValue : ch.publish(0, batch, 64, stream);
	const cudaError_t again = ch.publish(0, batch, 64, stream);
	const bool compared = ch.publish(0, batch, 64, stream) != cudaSuccess && view.wait_free(1) == cudaSuccess;
	check(created == cudaSuccess && published == cudaSuccess && again == cudaErrorNotReady && compared,
	      "code written for cudaError_t: assignments, conditional expressions, comparisons, a const channel");
	cudaStreamDestroy(stream);
}

void results()
{
	wic::result_channel r;
	const bool created = r.create(4, 64, 2).ok();
	const wic::result_view host = r.host();
	const wic::outcome none = r.wait(0, 0, 0);
	__atomic_store_n(host.word(0, 1), 1u, __ATOMIC_RELEASE);
	const bool one = r.ready(0, 1) && !r.ready(0, 0) && r.wait(0, 1, 0).ok();
	const wic::outcome bad = r.wait(0, 2, 0);
	r.release(5);
	r.release(2);
	const bool monotonic = *host.released == 6;
	check(created && none.status() == WIC_ETIMED_OUT && one && bad.status() == WIC_EINVALID && monotonic,
	      "result_channel: wait(_, _, 0) looks once; a part is ready once its word is set; release() counts in "
	      "order and never goes back");
}

} /* namespace */

int main()
{
	refusals();
	coalescing();
	launch_deliveries();
	picks_beside_other_work();
	one_lane();
	tagged_lines();
	earlier_code();
	results();
	printf("%s: %d failed\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
