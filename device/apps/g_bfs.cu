/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_BFS - breadth-first search (Rodinia bfs) on two GPUs, probabilistic model, random pattern:
 * a random directed graph of VERTICES vertices (fresh every run), each with 1 to 2 DEGREE - 1
 * edges (DEGREE on average) to vertices drawn uniformly, searched from a random source. GPU 0
 * owns the first half of the vertices, GPU 1 the others: each holds its vertices' edges and
 * levels and runs one persistent kernel (a cooperative launch: all its blocks resident) that
 * searches level by level, as Rodinia's does.
 *
 * In level l every block expands part of the GPU's frontier (its vertices of level l). A
 * neighbour the GPU owns that has no level yet gets l + 1 (an atomic compare-and-swap decides
 * which thread found it) and joins the next frontier; a neighbour the other GPU owns goes into
 * an outbox, unless this GPU sent it before (a bitmap: a vertex sent once gets a level no later
 * than a later send would give it). After a grid-wide barrier the outbox goes to the other GPU
 * as messages of ENTRIES vertices, message m on stream m % S, S being half the blocks, through
 * a channel each way: block s < S sends stream s, writing each message over the peer link and
 * wic::publish()ing it once the slot is free (wic::wait_consumed(), four slots per stream),
 * and block S + s takes the other GPU's stream s with wic::recv_block(), gives each vertex without a
 * level l + 1, adds it to the next frontier and reports the message consumed
 * (wic::consumed()). How many messages a level has depends on the graph and the level: the
 * probabilistic model. So each message tells its number of vertices, and each stream sends at
 * least one message per level, the last one marked: the receiving block reads up to it. A
 * receiving block waits only for messages, a sending block only for its stream's receiver on
 * the other GPU, which waits for nothing but messages: whatever the number of messages, no
 * two blocks wait for each other. Every message also carries the sender's frontier size: after
 * level l both GPUs know both frontier sizes of level l, and both stop after the first level
 * in which both were empty. Every vertex's level (or none: unreached) must equal a CPU search's
 * exactly.
 *
 * push: the ready words are in the receiving GPU's memory; its warps wait with backoff. poll
 * (spinning): they are in the sending GPU's memory; the receiving warps spin on them
 * across the link.
 *
 * nowait: a GPU's messages of a level depend on the other GPU's of the level before, so none
 * can all be there before the other starts. The closest honest lower bound is both kernels
 * with nothing to wait for and nothing to send: a first, untimed push run records every
 * message each GPU took; the host then publishes all of them into each GPU's memory before
 * the kernels start, the kernels send nothing, and the time from the first launch until both
 * ended is measured (the search and the reads of the messages, without any waiting or link
 * traffic). The result is checked as in the other modes.
 *
 * Usage: g_bfs MODE [REPS] [VERTICES] [DEGREE] [ENTRIES]   (MODE: push, poll, alg1, tagged, picked, nowait; VERTICES
 * defaults to 4194304, DEGREE to 8, ENTRIES to 1021 (messages of 4 KiB), REPS to 7; one block
 * of 1024 threads per SM on each GPU, half of them with one warp waiting, so poll spins with one
 * warp per two SMs)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 */
#include <atomic>
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 1024;
constexpr uint32_t depth = 4; /* slots per stream */
constexpr uint32_t unreached = 0xffffffffu;

/* What a message starts with; its vertices follow. */
struct header {
	uint32_t count;	   /* vertices in this message */
	uint32_t last;	   /* the stream's last message of the level */
	uint32_t frontier; /* the sender's frontier size in this level */
};
constexpr uint32_t header_words = sizeof(header) / sizeof(uint32_t);
static_assert(header_words == G_BFS_HEADER_WORDS, "the header the emulator describes");

/*
 * part - the vertices GPU @side owns, [@first, @first + @count), and the other GPU's,
 * [@other, @other + @others).
 */
struct part {
	uint32_t side;
	uint32_t first;
	uint32_t count;
	uint32_t other;
	uint32_t others;

	__host__ __device__ bool mine(uint32_t v) const { return v - first < count; }
};

part make_part(uint32_t vertices, uint32_t side)
{
	const uint32_t h = vertices / 2;
	return side ? part{1, h, vertices - h, 0, h} : part{0, 0, h, h, vertices - h};
}

/* A GPU's vertices' edges: vertex first + u's targets (global indices) at [offsets[u], offsets[u + 1]). */
struct edges {
	const uint32_t *offsets;
	const uint32_t *targets;
};

/* The words of a search in a GPU's memory; the kernel sets them. */
struct counters {
	uint32_t size[3]; /* frontier sizes: level l's at l % 3 */
	uint32_t out[2];  /* outbox sizes: level l's at l % 2 */
	uint32_t theirs;  /* the other GPU's frontier size in this level */
	uint32_t abort;	  /* a wait timed out: every block stops after this level */
};

/* One GPU's search in its memory. */
struct search {
	uint32_t *level;       /* [count]: a vertex's level, or unreached */
	uint32_t *frontier[2]; /* [count] each: level l's at l % 2 */
	uint32_t *outbox;      /* [others] */
	uint32_t *sent;	       /* a bit per vertex of the other GPU: sent already */
	counters *c;
};

/*
 * wire - a GPU's ends of the channels: @in from the other GPU, @out to it (used only if @send);
 * @streams streams each way, messages of @entries vertices after the header.
 */
struct wire {
	app::endpoint in, out;
	uint32_t streams;
	uint32_t entries;
	bool send;
};

/*
 * recorder - where a run records every message a GPU took (unless @data is null): item g of
 * stream s at (s * @items + g) * words, words being the message's; @count[s] receives the
 * number of items of stream s, of which only the first @items are kept.
 */
struct recorder {
	uint32_t *data;
	uint32_t items;
	uint32_t *count;
};

__device__ inline uint32_t peek(const uint32_t *word)
{
	return *(const volatile uint32_t *)word;
}

__device__ inline void poke(uint32_t *word, uint32_t value)
{
	*(volatile uint32_t *)word = value;
}

/*
 * The index of a new entry of a list whose size is at @size: one atomic for the lanes of the warp
 * that append together (those active here; the shuffle waits for each of them).
 */
__device__ inline uint32_t append(uint32_t *size)
{
	const unsigned together = __activemask(), lane = threadIdx.x % 32;
	const int leader = __ffs(together) - 1;
	uint32_t at = 0;

	if (lane == (unsigned)leader)
		at = atomicAdd(size, __popc(together));
	return __shfl_sync(together, at, leader) + __popc(together & ((1u << lane) - 1));
}

/* Vertex @v, which this GPU owns, gets level @l + 1 unless it has one; if so it joins @next. */
__device__ inline void reach(const part &p, const search &st, uint32_t *next, uint32_t v, uint32_t l)
{
	uint32_t *at = &st.level[v - p.first];

	/* the plain read only saves atomics: a stale value is `unreached`, and the swap decides */
	if (*at == unreached && atomicCAS(at, unreached, l + 1) == unreached)
		next[append(&st.c->size[(l + 1) % 3])] = v;
}

/* Level @l's expansion of this GPU's @size frontier vertices at @front, grid-wide. */
__device__ void expand(const part &p, const edges &g, const search &st, const uint32_t *front, uint32_t size,
		       uint32_t *next, uint32_t l)
{
	const uint32_t stride = gridDim.x * blockDim.x;

	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride) {
		const uint32_t u = front[i] - p.first;
		for (uint32_t e = g.offsets[u]; e < g.offsets[u + 1]; e++) {
			const uint32_t v = g.targets[e];
			if (p.mine(v)) {
				reach(p, st, next, v, l);
				continue;
			}
			const uint32_t o = v - p.other, bit = 1u << (o % 32);
			if (!(st.sent[o / 32] & bit) && !(atomicOr(&st.sent[o / 32], bit) & bit))
				st.outbox[append(&st.c->out[l % 2])] = v;
		}
	}
}

/*
 * send_level() - stream @s's messages of a level: messages s, s + streams, ... of the @count
 * vertices at @outbox, at least one (empty if need be), the last one marked; @frontier is this
 * GPU's frontier size. @items counts the stream's messages.
 */
__device__ void send_level(const wire &ln, uint32_t s, const uint32_t *outbox, uint32_t count, uint32_t frontier,
			   uint32_t &items, const app::watchdog &wd)
{
	const uint32_t messages = (count + ln.entries - 1) / ln.entries;

	for (uint32_t m = s; m < messages || m == s; m += ln.streams, items++) {
		const uint32_t first = m < messages ? m * ln.entries : count;
		const uint32_t n = count - first < ln.entries ? count - first : ln.entries;
		const uint32_t slot = ln.out.place.slot(s, items), gen = ln.out.place.generation(items);
		uint32_t *to = reinterpret_cast<uint32_t *>(app::block_claim(ln.out.ch, slot, gen, wd));
		for (uint32_t e = threadIdx.x; e < n; e += blockDim.x)
			to[header_words + e] = outbox[first + e];
		if (threadIdx.x == 0)
			*reinterpret_cast<header *>(to) = header{n, m + ln.streams >= messages, frontier};
		wic::publish_block(ln.out.ch, slot, gen);
	}
}

/*
 * take_level() - the other GPU's stream @s of level @l, up to its message marked last: each
 * vertex without a level gets l + 1 and joins @next. The sender's frontier size goes to
 * c->theirs. @items counts the stream's messages.
 */
__device__ void take_level(const wire &ln, uint32_t s, const part &p, const search &st, uint32_t *next, uint32_t l,
			   uint32_t &items, const app::watchdog &wd, const recorder &rec)
{
	const uint32_t words = header_words + ln.entries;

	for (bool last = false; !last; items++) {
		const uint32_t slot = ln.in.place.slot(s, items), gen = ln.in.place.generation(items);
		const uint32_t *msg = reinterpret_cast<const uint32_t *>(app::block_recv(ln.in.ch, slot, gen, wd));
		const header h = *reinterpret_cast<const header *>(msg);
		const uint32_t n = h.count < ln.entries ? h.count : ln.entries;
		for (uint32_t e = threadIdx.x; e < n; e += blockDim.x) {
			const uint32_t v = msg[header_words + e];
			if (p.mine(v)) /* always, unless a wait timed out and this is not a message */
				reach(p, st, next, v, l);
		}
		if (rec.data && items < rec.items)
			for (uint32_t w = threadIdx.x; w < words; w += blockDim.x)
				rec.data[((size_t)s * rec.items + items) * words + w] = msg[w];
		if (threadIdx.x == 0)
			poke(&st.c->theirs, h.frontier);
		/* the level's end, or a run whose wait timed out: nothing more will come */
		last = __syncthreads_or(h.last || (threadIdx.x == 0 && wd.raised()));
		app::block_consumed(ln.in.ch, slot, gen);
	}
}

/*
 * bfs() - the kernel of GPU @p.side: the search from @source over @g, levels into @st.level.
 * Blocks [0, streams) send, blocks [streams, 2 streams) receive; every block expands. At most
 * @max_levels levels (more than any search takes).
 */
__global__ void __launch_bounds__(threads, 1) bfs(part p, edges g, uint32_t source, search st, wire ln,
						  uint32_t max_levels, app::grid_barrier grid, app::watchdog wd,
						  recorder rec)
{
	const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
	const bool sender = blockIdx.x < ln.streams, receiver = !sender && blockIdx.x < 2 * ln.streams;
	const uint32_t s = sender ? blockIdx.x : blockIdx.x - ln.streams;
	uint32_t items = 0; /* messages this block sent or took */

	for (uint32_t i = tid; i < p.count; i += stride)
		st.level[i] = p.first + i == source ? 0 : unreached;
	for (uint32_t i = tid; i < (p.others + 31) / 32; i += stride)
		st.sent[i] = 0;
	if (tid == 0) {
		const bool has = p.mine(source);
		*st.c = counters{{has ? 1u : 0u, 0, 0}, {0, 0}, 0, 0};
		if (has)
			st.frontier[0][0] = source;
	}
	grid.sync();
	for (uint32_t l = 0;; l++) {
		const uint32_t size = peek(&st.c->size[l % 3]);
		const uint32_t *front = l % 2 ? st.frontier[1] : st.frontier[0];
		uint32_t *next = l % 2 ? st.frontier[0] : st.frontier[1];
		expand(p, g, st, front, size, next, l);
		if (tid == 0) {
			/* counted from the next level on; nobody reads them in this one */
			poke(&st.c->size[(l + 2) % 3], 0);
			poke(&st.c->out[(l + 1) % 2], 0);
		}
		grid.sync(); /* the outbox is complete */
		if (sender && ln.send)
			send_level(ln, s, st.outbox, peek(&st.c->out[l % 2]), size, items, wd);
		else if (receiver)
			take_level(ln, s, p, st, next, l, items, wd, rec);
		if (threadIdx.x == 0 && wd.raised())
			poke(&st.c->abort, 1);
		grid.sync(); /* the next frontier is complete */
		/*
		 * Every block reads the same words: written before the barrier, and not again before
		 * the next level's first barrier. Both GPUs know both frontier sizes of this level, so
		 * they stop after the same level.
		 */
		if ((size == 0 && peek(&st.c->theirs) == 0) || peek(&st.c->abort) || l + 1 >= max_levels)
			break;
	}
	if (receiver && threadIdx.x == 0 && rec.count)
		rec.count[s] = items;
}

/*
 * make_graph() - @vertices vertices, vertex u with 1 to 2 @degree - 1 edges to uniformly drawn
 * vertices, in CSR: u's targets at [@offsets[u], @offsets[u + 1]) of @targets.
 */
void make_graph(uint64_t seed, uint32_t vertices, uint32_t degree, std::vector<uint32_t> &offsets,
		std::vector<uint32_t> &targets)
{
	offsets.assign((size_t)vertices + 1, 0);
	app::parallel_for(vertices, [&](uint32_t, size_t begin, size_t end) {
		for (size_t u = begin; u < end; u++)
			offsets[u + 1] = 1 + (uint32_t)(app::mix(seed ^ u) % (2 * degree - 1));
	});
	for (size_t u = 0; u < vertices; u++)
		offsets[u + 1] += offsets[u];
	targets.resize(offsets[vertices]);
	app::parallel_for(vertices, [&](uint32_t, size_t begin, size_t end) {
		for (size_t u = begin; u < end; u++) {
			const uint64_t h = app::mix(seed ^ u);
			for (uint32_t e = offsets[u]; e < offsets[u + 1]; e++)
				targets[e] = (uint32_t)(app::mix(h + e) % vertices);
		}
	});
}

/*
 * reference() - the CPU search, level by level on every CPU core: every vertex's level from
 * @source, or unreached. An atomic compare-and-swap gives each vertex to one core's list.
 */
std::vector<uint32_t> reference(const std::vector<uint32_t> &offsets, const std::vector<uint32_t> &targets,
				uint32_t source)
{
	const size_t vertices = offsets.size() - 1;
	std::unique_ptr<std::atomic<uint32_t>[]> level(new std::atomic<uint32_t>[vertices]);
	std::vector<std::vector<uint32_t>> found(app::cpu_chunks());
	std::vector<uint32_t> frontier{source}, out(vertices);

	app::parallel_for(vertices, [&](uint32_t, size_t begin, size_t end) {
		for (size_t v = begin; v < end; v++)
			level[v].store(unreached, std::memory_order_relaxed);
	});
	level[source] = 0;
	for (uint32_t l = 0; !frontier.empty(); l++) {
		app::parallel_for(frontier.size(), [&](uint32_t chunk, size_t begin, size_t end) {
			std::vector<uint32_t> &mine = found[chunk];
			mine.clear();
			for (size_t i = begin; i < end; i++) {
				const uint32_t u = frontier[i], last = offsets[u + 1];
				for (uint32_t e = offsets[u]; e < last; e++) {
					std::atomic<uint32_t> &at = level[targets[e]];
					uint32_t none = unreached;
					if (at.load(std::memory_order_relaxed) == unreached &&
					    at.compare_exchange_strong(none, l + 1, std::memory_order_relaxed))
						mine.push_back(targets[e]);
				}
			}
		});
		frontier.clear();
		for (const std::vector<uint32_t> &f : found)
			frontier.insert(frontier.end(), f.begin(), f.end());
	}
	for (size_t v = 0; v < vertices; v++)
		out[v] = level[v].load(std::memory_order_relaxed);
	return out;
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[VERTICES] [DEGREE] [ENTRIES]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t vertices = cli.size(0, G_BFS_VERTICES);
	const uint32_t degree = cli.size(1, G_BFS_DEGREE);
	const uint32_t entries = cli.size(2, G_BFS_ENTRIES);
	app::two_gpus("G_BFS");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || vertices < 2 || vertices > (1u << 24) || !degree || degree > 32 || !entries ||
	    entries > 65536 || blocks < 2) {
		fprintf(stderr, "REPS must be positive, VERTICES between 2 and 2^24, DEGREE between 1 and 32, ENTRIES "
				"between 1 and 65536\n");
		return 2;
	}
	const uint32_t streams = blocks / 2;
	const uint32_t words = header_words + entries; /* of a message */
	const part parts[2] = {make_part(vertices, 0), make_part(vertices, 1)};
	uint32_t *offsets[2], *targets[2], *log_count[2];
	search st[2];
	for (int d = 0; d < 2; d++) {
		const part &p = parts[d];
		offsets[d] = app::alloc_on<uint32_t>(d, (size_t)p.count + 1);
		targets[d] = app::alloc_on<uint32_t>(d, (size_t)p.count * (2 * degree - 1)); /* the most edges */
		log_count[d] = app::alloc_on<uint32_t>(d, streams);
		st[d].level = app::alloc_on<uint32_t>(d, p.count);
		st[d].frontier[0] = app::alloc_on<uint32_t>(d, p.count);
		st[d].frontier[1] = app::alloc_on<uint32_t>(d, p.count);
		st[d].outbox = app::alloc_on<uint32_t>(d, p.others);
		st[d].sent = app::alloc_on<uint32_t>(d, (p.others + 31) / 32);
		st[d].c = app::alloc_on<counters>(d, 1);
		app::on_gpu g(d);
		app::load(bfs);
	}
	app::exchange_pair pair;
	/* to[d] carries GPU d's messages to GPU 1 - d. nowait records with push. */
	wic::peer_channel to[2];
	const app::ring streaming{depth, 0, false};
	for (int d = 0; d < 2; d++)
		CHECK(to[d].create(app::transport_of(mode, words * sizeof(uint32_t)), 1 - d, d,
				   streaming.slots(streams), words * sizeof(uint32_t), 1));
	std::vector<uint32_t> csr, edge, got(vertices), recorded, counts(streams);
	std::random_device entropy;

	auto one = [&](int rep) {
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		make_graph(rng(), vertices, degree, csr, edge);
		const uint32_t source = std::uniform_int_distribution<uint32_t>(0, vertices - 1)(rng);
		const std::vector<uint32_t> want = reference(csr, edge, source);
		uint32_t deepest = 0;
		for (uint32_t v : want)
			if (v != unreached && v > deepest)
				deepest = v;
		/*
		 * The messages a stream carries: a level runs for each level of the search and one
		 * more, in which both frontiers are empty, with at most messages / streams + 1 of the
		 * stream's, and no vertex is sent twice.
		 */
		const uint32_t levels = deepest + 2;
		const uint32_t capacity = levels + (levels + streams - 1) / streams +
					  (uint32_t)(((uint64_t)vertices + (uint64_t)entries * streams - 1) /
						     ((uint64_t)entries * streams)) +
					  1;
		for (int d = 0; d < 2; d++) {
			const part &p = parts[d];
			std::vector<uint32_t> local(csr.begin() + p.first, csr.begin() + p.first + p.count + 1);
			const uint32_t base = local[0];
			for (uint32_t &o : local)
				o -= base;
			app::on_gpu g(d);
			CHECK(cudaMemcpy(offsets[d], local.data(), local.size() * sizeof(uint32_t),
					 cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy(targets[d], &edge[base], (size_t)local.back() * sizeof(uint32_t),
					 cudaMemcpyHostToDevice));
		}
		uint32_t *log[2] = {nullptr, nullptr};
		const size_t logged = (size_t)streams * capacity * words;
		if (mode == app::mode::nowait)
			for (int d = 0; d < 2; d++)
				log[d] = app::alloc_on<uint32_t>(d, logged);

		auto run = [&](const wire (&ln)[2], bool record) {
			auto prepare = [&](int d) {
				CHECK(cudaMemset(st[d].level, 0xfe, parts[d].count * sizeof(uint32_t))); /* poison */
				if (record) {
					CHECK(cudaMemset(log[d], 0, logged * sizeof(uint32_t)));
					CHECK(cudaMemset(log_count[d], 0, streams * sizeof(uint32_t)));
				}
				CHECK(to[d].reset());
			};
			auto launch = [&](int d, cudaStream_t stream, app::grid_barrier barrier, app::watchdog wd) {
				const recorder rec{record ? log[d] : nullptr, capacity,
						   record ? log_count[d] : nullptr};
				app::launch_on(d, bfs, blocks, threads, stream, parts[d], edges{offsets[d], targets[d]},
					       source, st[d], ln[d], vertices + 2, barrier, wd, rec);
			};
			return pair.run(prepare, launch);
		};
		const wire exchange[2] = {
			{{to[1].device(), streaming}, {to[0].device(), streaming}, streams, entries, true},
			{{to[0].device(), streaming}, {to[1].device(), streaming}, streams, entries, true}};
		double ms;
		bool failed, overflow = false;
		if (mode != app::mode::nowait) {
			ms = run(exchange, false);
			failed = pair.timed_out();
		} else {
			run(exchange, true);
			failed = pair.timed_out();
			/* Every message GPU d took, published into its memory before its kernel starts. */
			std::unique_ptr<app::producer> given[2];
			wire replay[2];
			const app::ring nowait{depth, capacity, true};
			for (int d = 0; d < 2; d++) {
				CHECK(cudaMemcpy(counts.data(), log_count[d], streams * sizeof(uint32_t),
						 cudaMemcpyDeviceToHost));
				for (uint32_t c : counts)
					overflow |= c > capacity;
				recorded.resize(logged);
				CHECK(cudaMemcpy(recorded.data(), log[d], logged * sizeof(uint32_t),
						 cudaMemcpyDeviceToHost));
				given[d] = app::publish_recorded(d, recorded, streams, capacity, words);
				replay[d] = wire{{given[d]->channel(), nowait}, {}, streams, entries, false};
			}
			ms = run(replay, false);
			failed |= pair.timed_out();
			for (int d = 0; d < 2; d++) {
				app::on_gpu g(d);
				given[d].reset();
				app::free_on(d, log[d]);
			}
		}

		for (int d = 0; d < 2; d++)
			CHECK(cudaMemcpy(&got[parts[d].first], st[d].level, parts[d].count * sizeof(uint32_t),
					 cudaMemcpyDeviceToHost));
		size_t differ = 0;
		for (size_t v = 0; v < vertices; v++)
			differ += got[v] != want[v];
		if (failed || overflow || differ)
			fprintf(stderr,
				"G_BFS %s rep %d: %s%s, %zu of %u levels differ from the CPU's (%u levels, source "
				"%u)\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out",
				overflow ? ", more messages than recorded" : "", differ, vertices, deepest + 1, source);
		return app::rep_result{ms, !failed && !overflow && !differ};
	};
	const int status = app::repeat_runs("G_BFS", mode,
					    "vertices=" + std::to_string(vertices) + " degree=" + std::to_string(degree) +
						    " entries=" + std::to_string(entries) +
						    " streams=" + std::to_string(streams) +
						    " blocks=" + std::to_string(blocks) + " gpus=0,1",
					    reps, one);
	for (int d = 0; d < 2; d++) {
		to[d].destroy();
		for (void *ptr : {(void *)offsets[d], (void *)targets[d], (void *)log_count[d], (void *)st[d].level,
				  (void *)st[d].frontier[0], (void *)st[d].frontier[1], (void *)st[d].outbox,
				  (void *)st[d].sent, (void *)st[d].c})
			app::free_on(d, ptr);
	}
	return status;
}
