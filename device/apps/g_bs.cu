/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * G_BS - bitonic sort (Batcher's network, as Savina's BitonicSort) on two GPUs, multiple-
 * communication model, scatter-gather pattern: KEYS random 32-bit keys (fresh every run), cut
 * into CHUNKS chunks of KEYS / CHUNKS keys (both powers of two). GPU 0 holds the even chunks,
 * GPU 1 the odd ones, each GPU its chunks one after the other, and runs one persistent kernel (a
 * cooperative launch: all its blocks resident). Each step of the network compares and swaps
 * the keys whose global indices differ in one bit; only the bit of the chunk size pairs a key
 * of one GPU with a key of the other. So each GPU first sorts its chunks alone (every stage up
 * to the chunk size), and each of the log2(CHUNKS) stages after that has one global merge
 * step, which pairs local key p of GPU 0 with local key p of GPU 1; the stage's other steps are
 * local again. With CHUNKS = 2 this is the classic split: each GPU sorts its half, one step
 * across, each merges its half. Local steps of distance 8192 and more are passes over the
 * GPU's keys between grid-wide barriers; each block does the shorter ones on tiles of 8192 keys
 * in shared memory.
 *
 * A global merge step is a gather and a scatter. The GPU's keys are cut into messages of
 * MESSAGE keys, owned alternately by GPU 0 and GPU 1 (message t by GPU t % 2). Each GPU sends
 * the keys of the messages the other owns into the other's memory (gather: one channel each
 * way); the owner compares and swaps them with its own keys, keeps its side of each pair and
 * sends the other side back (scatter: a second channel each way), which the other writes over
 * its keys. Block b of each GPU sends and takes messages b, b + blocks, ... of each kind: the
 * sending block writes a message over the peer link and wic::publish()es it, the receiving
 * block waits in wic::recv_block() and reports it consumed (wic::consumed()), which the sender waits
 * for before it reuses the slot. Every message of a step has a slot of its own, used once per
 * step, and a block first sends all its gathers, then takes the other GPU's and sends their
 * scatters, then takes the other GPU's scatters. So in a step a block waits only for slots its
 * peer (the other GPU's block b) freed in the step before, for the peer's gathers, which the
 * peer sends before it waits for anything of the step, and for the peer's scatters, which need
 * nothing but those gathers and this block's own, sent first: no two blocks wait for each other.
 * The keys, put back in global order, must equal std::sort of the input exactly.
 *
 * push: the ready words are in the receiving GPU's memory; its warps wait with backoff. poll
 * (spinning): they are in the sending GPU's memory; the receiving warps spin on them
 * across the link.
 *
 * nowait: a GPU's messages depend on the other GPU's sort, so none can all be there before the
 * other starts. The closest honest lower bound is both kernels with nothing to wait for and
 * nothing to send: a first, untimed push run records every message each GPU took; the host
 * then publishes all of them into each GPU's memory before the kernels start, the kernels send
 * nothing, and the time from the first launch until both ended is measured (the sort and the
 * reads of the messages, without any waiting or link traffic). The result is checked as in the
 * other modes.
 *
 * Usage: g_bs MODE [REPS] [KEYS] [CHUNKS] [MESSAGE]   (MODE: push, poll, alg1, tagged, picked, nowait; KEYS defaults
 * to 16777216, CHUNKS to 16 (so 4 global merge steps), MESSAGE to 4096 keys, REPS to 7; powers
 * of two with KEYS / CHUNKS at least 8192; one block of 1024 threads per SM on each GPU, each
 * with one warp waiting at a time, so poll spins with one warp per SM)
 * Prints the two GPUs, then the median wall time of REPS runs and whether every result
 * matched. Exits 77 (skipped) without two GPUs with peer access.
 */
#include <random>

#include "peer.cuh"
#include "description.h"

namespace {

constexpr uint32_t threads = 1024;
constexpr uint32_t tile = 8192;	 /* keys a block sorts in shared memory */
constexpr uint32_t unroll = 4;	 /* pairs a thread loads at once in a pass: loads in flight */
constexpr uint32_t gather = 0;	 /* the kinds of message */
constexpr uint32_t scatter = 1;

/*
 * layout - the keys GPU @side holds: @keys / 2 of them, its chunks of @chunk keys one after the
 * other, local chunk c being global chunk 2 c + @side.
 */
struct layout {
	uint32_t keys;
	uint32_t chunk;
	uint32_t side;

	__host__ __device__ uint32_t local() const { return keys / 2; }
	/* The global index of local key @p. */
	__host__ __device__ uint32_t global(uint32_t p) const
	{
		return ((p & ~(chunk - 1)) << 1) | (side ? chunk : 0) | (p & (chunk - 1));
	}
};

/* Pair @r of a step of distance @j (a power of two): its lower index; the other is that | @j. */
__host__ __device__ inline uint32_t lower(uint32_t r, uint32_t j)
{
	return ((r & ~(j - 1)) << 1) | (r & (j - 1));
}

/* Compare and swap: @a (the lower index's key) and @b end ascending if @up, else descending. */
__host__ __device__ inline void order(uint32_t &a, uint32_t &b, bool up)
{
	if ((a > b) == up) {
		const uint32_t t = a;
		a = b;
		b = t;
	}
}

/*
 * links - a GPU's ends of the merge steps' channels: @gather_in and @scatter_in from the other
 * GPU, @gather_out and @scatter_out to it (used only if @send). Messages of @message keys; a
 * block's i-th message of a kind in global merge step q is item q * @per_block + i of the
 * block's stream, @phases steps in all.
 */
struct links {
	app::endpoint gather_in, scatter_in, gather_out, scatter_out;
	uint32_t message;
	uint32_t per_block;
	uint32_t phases;
	bool send;
};

/*
 * in_tiles() - on each tile of `tile` keys of @from (block b takes tiles b, b + gridDim.x, ...):
 * the stages @first to @last (powers of two), each from its step of distance min(k, tile) / 2
 * down to 1, in shared memory @s; the tile goes to @to (which may be @from).
 */
__device__ void in_tiles(const layout &h, const uint32_t *from, uint32_t *to, uint32_t first, uint32_t last,
			 uint32_t *s)
{
	for (uint32_t w = blockIdx.x; w < h.local() / tile; w += gridDim.x) {
		const uint32_t base = w * tile;
		for (uint32_t e = threadIdx.x; e < tile; e += blockDim.x)
			s[e] = from[base + e];
		__syncthreads();
		for (uint32_t k = first; k <= last; k *= 2)
			for (uint32_t j = (k < tile ? k : tile) / 2; j; j /= 2) {
				for (uint32_t r = threadIdx.x; r < tile / 2; r += blockDim.x) {
					const uint32_t lo = lower(r, j);
					order(s[lo], s[lo | j], (h.global(base + lo) & k) == 0);
				}
				__syncthreads();
			}
		for (uint32_t e = threadIdx.x; e < tile; e += blockDim.x)
			to[base + e] = s[e];
		__syncthreads(); /* the next tile overwrites s */
	}
}

/*
 * step() - the step of stage @k over local distance @j (within a chunk, or between two of the
 * GPU's chunks): one pass over the GPU's keys @x, each pair once, written only where swapped.
 */
__device__ void step(const layout &h, uint32_t *x, uint32_t j, uint32_t k)
{
	const uint32_t pairs = h.local() / 2, stride = gridDim.x * blockDim.x;

	for (uint32_t r0 = blockIdx.x * blockDim.x + threadIdx.x; r0 < pairs; r0 += unroll * stride) {
		uint32_t a[unroll], b[unroll];
		/* every load first, so that each thread has several in flight */
#pragma unroll
		for (uint32_t u = 0; u < unroll; u++) {
			const uint32_t r = r0 + u * stride, lo = lower(r, j);
			a[u] = r < pairs ? x[lo] : 0;
			b[u] = r < pairs ? x[lo | j] : 0;
		}
#pragma unroll
		for (uint32_t u = 0; u < unroll; u++) {
			const uint32_t r = r0 + u * stride, lo = lower(r, j), was = a[u];
			order(a[u], b[u], (h.global(lo) & k) == 0);
			if (r < pairs && a[u] != was) {
				x[lo] = a[u];
				x[lo | j] = b[u];
			}
		}
	}
}

/*
 * merge_across() - global merge step @phase, of stage @k: local key p of GPU 0 against local
 * key p of GPU 1 (global distance: the chunk size). Message t, keys [t * message, (t + 1) *
 * message) of each GPU, is compared on GPU t % 2; a block's messages are the q-th, q = b, b +
 * gridDim.x, ..., of those each GPU owns. @log, unless null, receives every message taken:
 * item g of kind c of block b's stream at ((c * gridDim.x + b) * phases * per_block + g) * message.
 */
__device__ void merge_across(const layout &h, uint32_t *x, const links &ln, uint32_t phase, uint32_t k,
			     const app::watchdog &wd, uint32_t *log)
{
	const uint32_t m = ln.message, owned = h.local() / m / 2, d = h.side;
	const layout lower_side{h.keys, h.chunk, 0}; /* GPU 0 holds the lower index of every pair */
	auto logged = [&](uint32_t kind, uint32_t g) {
		const size_t item = (size_t)(kind * gridDim.x + blockIdx.x) * ln.phases * ln.per_block + g;
		return log ? log + item * m : nullptr;
	};

	/* Gather: the keys of the messages the other GPU owns, to it. */
	if (ln.send)
		for (uint32_t i = 0, q = blockIdx.x; q < owned; i++, q += gridDim.x) {
			const uint32_t g = phase * ln.per_block + i;
			const uint32_t slot = ln.gather_out.place.slot(blockIdx.x, g);
			const uint32_t gen = ln.gather_out.place.generation(g);
			const uint32_t *from = x + (size_t)(2 * q + 1 - d) * m;
			uint32_t *to = reinterpret_cast<uint32_t *>(app::block_claim(ln.gather_out.ch, slot, gen, wd));
			for (uint32_t e = threadIdx.x; e < m; e += blockDim.x)
				to[e] = from[e];
			wic::publish_block(ln.gather_out.ch, slot, gen);
		}

	/* This GPU's messages: compare and swap, keep this side, scatter the other side back. */
	for (uint32_t i = 0, q = blockIdx.x; q < owned; i++, q += gridDim.x) {
		const uint32_t g = phase * ln.per_block + i, first = (2 * q + d) * m;
		const uint32_t slot = ln.gather_in.place.slot(blockIdx.x, g), gen = ln.gather_in.place.generation(g);
		const uint32_t back_slot = ln.send ? ln.scatter_out.place.slot(blockIdx.x, g) : 0;
		const uint32_t back_gen = ln.send ? ln.scatter_out.place.generation(g) : 0;
		const uint32_t *theirs =
			reinterpret_cast<const uint32_t *>(app::block_recv(ln.gather_in.ch, slot, gen, wd));
		uint32_t *back = ln.send ? reinterpret_cast<uint32_t *>(
						   app::block_claim(ln.scatter_out.ch, back_slot, back_gen, wd))
					 : nullptr;
		uint32_t *record = logged(gather, g);
		for (uint32_t e = threadIdx.x; e < m; e += blockDim.x) {
			const uint32_t p = first + e, other = theirs[e];
			uint32_t lo = d ? other : x[p], hi = d ? x[p] : other;
			order(lo, hi, (lower_side.global(p) & k) == 0);
			x[p] = d ? hi : lo;
			if (back)
				back[e] = d ? lo : hi;
			if (record)
				record[e] = other;
		}
		if (back) /* first: the other GPU waits for it */
			wic::publish_block(ln.scatter_out.ch, back_slot, back_gen);
		app::block_consumed(ln.gather_in.ch, slot, gen);
	}

	/* Scatter: the other GPU's results for the messages it owns. */
	for (uint32_t i = 0, q = blockIdx.x; q < owned; i++, q += gridDim.x) {
		const uint32_t g = phase * ln.per_block + i;
		const uint32_t slot = ln.scatter_in.place.slot(blockIdx.x, g), gen = ln.scatter_in.place.generation(g);
		uint32_t *to = x + (size_t)(2 * q + 1 - d) * m, *record = logged(scatter, g);
		const uint32_t *mine =
			reinterpret_cast<const uint32_t *>(app::block_recv(ln.scatter_in.ch, slot, gen, wd));
		for (uint32_t e = threadIdx.x; e < m; e += blockDim.x) {
			to[e] = mine[e];
			if (record)
				record[e] = mine[e];
		}
		app::block_consumed(ln.scatter_in.ch, slot, gen);
	}
}

/*
 * bitonic() - the kernel of GPU @h.side: the network on its keys, read from @input, sorted in @x,
 * with the other GPU through @ln. @log: see merge_across().
 */
__global__ void __launch_bounds__(threads, 1) bitonic(layout h, const uint32_t *input, uint32_t *x, links ln,
						   app::grid_barrier grid, app::watchdog wd, uint32_t *log)
{
	__shared__ uint32_t s[tile];
	uint32_t phase = 0;

	in_tiles(h, input, x, 2, tile, s);
	grid.sync();
	for (uint32_t k = 2 * tile; k <= h.keys; k *= 2) {
		for (uint32_t j = k / 2; j >= tile; j /= 2) {
			if (j == h.chunk)
				merge_across(h, x, ln, phase++, k, wd, log);
			else /* between two of this GPU's chunks (their local distance is half), or within one */
				step(h, x, j > h.chunk ? j / 2 : j, k);
			grid.sync(); /* the next step reads what every block wrote */
		}
		in_tiles(h, x, x, k, k, s);
		grid.sync();
	}
}

/* std::sort of @in on every CPU core: the cores' pieces sorted, then merged pairwise. */
std::vector<uint32_t> sorted(const std::vector<uint32_t> &in)
{
	std::vector<uint32_t> out(in);
	const size_t n = out.size();
	const uint32_t chunks = app::cpu_chunks();
	std::vector<size_t> bound;

	app::parallel_for(n, [&](uint32_t, size_t begin, size_t end) {
		std::sort(out.begin() + begin, out.begin() + end);
	});
	for (uint32_t c = 0; c <= chunks; c++)
		bound.push_back(c * n / chunks); /* parallel_for's pieces */
	while (bound.size() > 2) {
		std::vector<std::thread> pool;
		std::vector<size_t> merged;
		for (size_t i = 0; i + 2 < bound.size(); i += 2)
			pool.emplace_back([&out, &bound, i] {
				std::inplace_merge(out.begin() + bound[i], out.begin() + bound[i + 1],
						   out.begin() + bound[i + 2]);
			});
		for (std::thread &t : pool)
			t.join();
		for (size_t i = 0; i < bound.size(); i += 2)
			merged.push_back(bound[i]);
		if (bound.size() % 2 == 0) /* an odd piece out: it stays as it is */
			merged.push_back(bound.back());
		bound.swap(merged);
	}
	return out;
}

bool power_of_two(uint32_t v)
{
	return v && !(v & (v - 1));
}

} /* namespace */

int main(int argc, char **argv)
{
	app::command_line cli;
	if (!app::parse_command_line(argc, argv, "[KEYS] [CHUNKS] [MESSAGE]", &cli, true))
		return 2;
	const int reps = cli.reps;
	const app::mode mode = cli.m;
	const uint32_t keys = cli.size(0, G_BS_KEYS);
	const uint32_t chunks = cli.size(1, G_BS_CHUNKS);
	const uint32_t message = cli.size(2, G_BS_MESSAGE);
	app::two_gpus("G_BS");
	const uint32_t blocks = app::common_sms();
	if (reps < 1 || !power_of_two(keys) || !power_of_two(chunks) || !power_of_two(message) || keys > (1u << 30) ||
	    chunks < 2 || keys / chunks < tile || message > keys / 4 || message > 65536) {
		fprintf(stderr, "REPS must be positive; KEYS (at most 2^30), CHUNKS (at least 2) and MESSAGE (at most "
				"KEYS / 4 and 65536) powers of two with KEYS / CHUNKS at least %u\n",
			tile);
		return 2;
	}
	uint32_t phases = 0;
	while ((1u << phases) < chunks)
		phases++;
	const uint32_t local = keys / 2, chunk = keys / chunks;
	const uint32_t owned = local / message / 2, per_block = (owned + blocks - 1) / blocks;
	const uint32_t items = phases * per_block; /* messages of a kind in a block's stream */
	const layout halves[2] = {{keys, chunk, 0}, {keys, chunk, 1}};
	const size_t logged = (size_t)2 * blocks * items * message;
	uint32_t *input[2], *x[2], *log[2];
	for (int d = 0; d < 2; d++) {
		input[d] = app::alloc_on<uint32_t>(d, local);
		x[d] = app::alloc_on<uint32_t>(d, local);
		log[d] = mode == app::mode::nowait ? app::alloc_on<uint32_t>(d, logged) : nullptr;
		app::on_gpu g(d);
		app::load(bitonic);
	}
	app::exchange_pair pair;
	/* gathers[d], scatters[d] carry GPU d's messages to GPU 1 - d. nowait records with push. */
	wic::peer_channel gathers[2], scatters[2];
	const app::ring streaming{per_block, items, false}, nowait{per_block, items, true};
	const wic::transport kind = app::transport_of(mode, message * sizeof(uint32_t));
	for (int d = 0; d < 2; d++) {
		CHECK(gathers[d].create(kind, 1 - d, d, streaming.slots(blocks), message * sizeof(uint32_t), 1));
		CHECK(scatters[d].create(kind, 1 - d, d, streaming.slots(blocks), message * sizeof(uint32_t), 1));
	}
	std::vector<uint32_t> in(keys), got(keys), recorded;
	std::vector<uint32_t> half[2] = {std::vector<uint32_t>(local), std::vector<uint32_t>(local)};
	std::random_device entropy;

	auto one = [&](int rep) {
		std::mt19937_64 rng(((uint64_t)entropy() << 32) | entropy());
		const uint64_t seed = rng();
		app::parallel_for(keys, [&](uint32_t, size_t begin, size_t end) {
			for (size_t i = begin; i < end; i++)
				in[i] = (uint32_t)(app::mix(seed ^ i) >> 32);
		});
		for (uint32_t c = 0; c < chunks; c++) /* global chunk c is GPU c % 2's local chunk c / 2 */
			memcpy(&half[c % 2][(size_t)(c / 2) * chunk], &in[(size_t)c * chunk], chunk * sizeof(uint32_t));

		auto run = [&](const links (&ln)[2], bool record) {
			auto prepare = [&](int d) {
				CHECK(cudaMemcpy(input[d], half[d].data(), local * sizeof(uint32_t),
						 cudaMemcpyHostToDevice));
				CHECK(cudaMemset(x[d], 0xff, local * sizeof(uint32_t))); /* poison */
				if (record)
					CHECK(cudaMemset(log[d], 0, logged * sizeof(uint32_t)));
				CHECK(gathers[d].reset());
				CHECK(scatters[d].reset());
			};
			auto launch = [&](int d, cudaStream_t stream, app::grid_barrier barrier, app::watchdog wd) {
				app::launch_on(d, bitonic, blocks, threads, stream, halves[d], input[d], x[d], ln[d],
					       barrier, wd, record ? log[d] : nullptr);
			};
			return pair.run(prepare, launch);
		};
		links exchange[2];
		for (int d = 0; d < 2; d++)
			exchange[d] = links{{gathers[1 - d].device(), streaming},
					    {scatters[1 - d].device(), streaming},
					    {gathers[d].device(), streaming},
					    {scatters[d].device(), streaming},
					    message,
					    per_block,
					    phases,
					    true};
		double ms;
		bool failed;
		if (mode != app::mode::nowait) {
			ms = run(exchange, false);
			failed = pair.timed_out();
		} else {
			run(exchange, true);
			failed = pair.timed_out();
			/* Every message GPU d took, published into its memory before its kernel starts. */
			std::unique_ptr<app::producer> given[2][2];
			links replay[2];
			for (int d = 0; d < 2; d++) {
				recorded.resize(logged);
				CHECK(cudaMemcpy(recorded.data(), log[d], logged * sizeof(uint32_t),
						 cudaMemcpyDeviceToHost));
				for (uint32_t c = 0; c < 2; c++)
					given[d][c] = app::publish_recorded(d, recorded, blocks, items, message, c * blocks);
				replay[d] = links{{given[d][gather]->channel(), nowait},
						  {given[d][scatter]->channel(), nowait},
						  {},
						  {},
						  message,
						  per_block,
						  phases,
						  false};
			}
			ms = run(replay, false);
			failed |= pair.timed_out();
			for (int d = 0; d < 2; d++) {
				app::on_gpu g(d);
				given[d][gather].reset();
				given[d][scatter].reset();
			}
		}

		for (int d = 0; d < 2; d++)
			CHECK(cudaMemcpy(half[d].data(), x[d], local * sizeof(uint32_t), cudaMemcpyDeviceToHost));
		for (uint32_t c = 0; c < chunks; c++)
			memcpy(&got[(size_t)c * chunk], &half[c % 2][(size_t)(c / 2) * chunk],
			       chunk * sizeof(uint32_t));
		const std::vector<uint32_t> want = sorted(in);
		size_t differ = 0;
		for (size_t i = 0; i < keys; i++)
			differ += got[i] != want[i];
		if (failed || differ)
			fprintf(stderr, "G_BS %s rep %d: %s, %zu of %u keys differ from std::sort's\n",
				app::mode_name(mode), rep, failed ? "a wait timed out" : "no wait timed out", differ,
				keys);
		return app::rep_result{ms, !failed && !differ};
	};
	const int status = app::repeat_runs("G_BS", mode,
					    "keys=" + std::to_string(keys) + " chunks=" + std::to_string(chunks) +
						    " message=" + std::to_string(message) +
						    " merges=" + std::to_string(phases) +
						    " blocks=" + std::to_string(blocks) + " gpus=0,1",
					    reps, one);
	for (int d = 0; d < 2; d++) {
		gathers[d].destroy();
		scatters[d].destroy();
		app::free_on(d, input[d]);
		app::free_on(d, x[d]);
		if (log[d])
			app::free_on(d, log[d]);
	}
	return status;
}
