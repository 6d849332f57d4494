/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * bringup - the CUDA cases of device/bringup.sh, for a machine with the patched nvidia-uvm,
 * wic_shim loaded and wicd serving the shim backend. Each case places a fault channel in this
 * process's managed memory through libwic (wic_attach_space, wic_channel_create_at) and runs
 * consumer warps on wic::recv:
 *
 *   host          a host producer: every warp of every generation gets exactly its bytes; the
 *                 percentiles of fault -> wake (wic::recv timed on the GPU's globaltimer, the
 *                 data published before the kernel starts, so each wait is the fault's service:
 *                 hold, record, wicd's completion, map, replay)
 *   timeout       nobody publishes: every warp gets WIC_ETIMED_OUT after the channel's timeout
 *   close         the channel closed while warps wait: every warp gets WIC_ECLOSED
 *   gpu-producer  a kernel on another GPU with peer access stores the batch in its own memory and
 *                 signals through the slot's PAT page; the warps get its bytes (skipped with
 *                 fewer than two GPUs with peer access)
 *   daemon-death  wicd killed (SIGKILL, WICD_PID) while warps wait: every warp gets WIC_ECONNECT
 *                 (skipped without WICD_PID)
 *   neighbour     another process's kernel, faulting on managed memory the host wrote, runs on
 *                 the consumer's GPU while a fault is held there (this program again, as
 *                 `bringup --neighbour`): it must finish, its sums right, and the warps get the
 *                 bytes published 500 ms later; how long it took says what the held fault cost
 *                 it (time-slicing waits while a fault is held: docs/operations.md). Skipped
 *                 where the GPU admits one process (EXCLUSIVE_PROCESS, as the deployment rule
 *                 wants)
 *   process-kill  a process holding a fault (this program again, as `bringup --holder SOCKET`;
 *                 its connection to wicd kept open by another process, so that wicd does not
 *                 end the hold) is killed with SIGKILL: nvidia-uvm stops its channels at exit,
 *                 which must not wait for the hold's bound (the hook's
 *                 uvm_wic_space_shutdown()); it must be gone within a second, and a kernel of
 *                 this process run after it
 *
 *   batches       (alone, as `bringup --batches SOCKET`) channels of 1-, 16- and 64-page runs,
 *                 32 generations each: the command batches bringup.sh times wicd's submission
 *                 and per-page costs on (wicctl stats before and after, wicd calibrate)
 *
 * Usage: bringup SOCKET [WICD_PID] | bringup --batches SOCKET
 * Prints one line per case, "CASE name PASS|FAIL|SKIP detail", and exits 0 when none failed.
 *
 * The shim backend names GPUs as nvidia-uvm does (the processor id of a fault), not as CUDA
 * does: the consumer is CUDA device 0 and the producer CUDA device 1 (CUDA_VISIBLE_DEVICES picks
 * them: bringup.sh --gpus), each translated with wic::uvm_gpu_id(). The ids depend on which GPUs
 * the machine's processes use, so they are never assumed.
 */
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/select.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <wic/wic.cuh>

#include "attach_space.h"

namespace {

constexpr uint32_t message_bytes = 256; /* 16 warps x 256 B: one page per run */
constexpr uint64_t long_timeout_ns = 2000000000; /* under wic_shim's default max_hold_ms */
constexpr uint64_t short_timeout_ns = 100000000;

bool failed_any = false;
uint16_t consumer_id = 0, producer_id = 0; /* nvidia-uvm's ids of CUDA devices 0 and 1 */

void report(const char *name, const char *result, const std::string &detail)
{
	printf("CASE %s %s %s\n", name, result, detail.c_str());
	fflush(stdout);
	failed_any |= !strcmp(result, "FAIL");
}

std::string cuda_error(const char *what, cudaError_t err)
{
	return std::string(what) + ": " + cudaGetErrorString(err);
}

std::string wic_error(const char *what, int rc)
{
	return std::string(what) + ": " + wic_strerror(rc);
}

__host__ __device__ inline uint8_t pattern(uint32_t generation, uint32_t warp, uint32_t i)
{
	return (uint8_t)(generation * 13 + warp * 7 + i * 3 + 1);
}

__device__ inline uint64_t globaltimer()
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/*
 * Each warp of the block reads its message of @generation of slot 0: its status in @status,
 * how long wic::recv took in @wait_ns, and in @wrong the bytes that differ from pattern().
 */
__global__ void consume(wic::channel ch, uint32_t generation, bool check, int *status, uint64_t *wait_ns,
			unsigned *wrong)
{
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint8_t *message;
	const uint64_t start = globaltimer();
	const int rc = wic::recv(ch, 0, generation, warp, &message);
	const uint64_t end = globaltimer();

	if (rc == WIC_OK && check)
		for (uint32_t i = lane; i < ch.message_bytes; i += 32)
			if (message[i] != pattern(generation, warp, i))
				atomicAdd(wrong, 1u);
	if (lane == 0) {
		status[warp] = rc;
		wait_ns[warp] = end - start;
	}
}

/* The producer GPU's kernel: the batch into its memory, then a write to the PAT page. */
__global__ void produce(uint8_t *batch, uint64_t batch_bytes, uint32_t message_bytes_, volatile uint32_t *pat)
{
	for (uint64_t i = threadIdx.x; i < batch_bytes; i += blockDim.x)
		batch[i] = pattern(0, (uint32_t)(i / message_bytes_), (uint32_t)(i % message_bytes_));
	__threadfence_system();
	__syncthreads();
	if (threadIdx.x == 0)
		*pat = 1; /* wicd holds this write until it has copied the batch */
}


/* A one-slot fault channel placed in managed memory, and its device view. */
struct placed {
	wic_channel *channel = nullptr;
	void *memory = nullptr;
	uint64_t *runs = nullptr;
	struct wic_channel_info info = {};
	struct wic_slot_info slot = {};
	wic::channel device = {};

	int create(wic_client *client, const struct wic_channel_spec &spec, std::string *why)
	{
		uint64_t bytes = 0;
		int rc = wic_placement_bytes(client, &spec, &bytes);
		if (rc != WIC_OK)
			return *why = wic_error("wic_placement_bytes", rc), rc;
		cudaError_t err = cudaMallocManaged(&memory, bytes);
		if (err != cudaSuccess)
			return *why = cuda_error("cudaMallocManaged", err), WIC_EIO;
		rc = wic_channel_create_at(client, &spec, (uint64_t)memory, &channel);
		if (rc != WIC_OK)
			return *why = wic_error("wic_channel_create_at", rc), rc;
		wic_channel_info(channel, &info);
		wic_channel_slot(channel, 0, &slot);
		if (cudaMalloc(&runs, 2 * sizeof(uint64_t)) != cudaSuccess)
			return *why = "cudaMalloc", WIC_EIO;
		device = wic::fault_channel(&info, &slot, runs);
		return device.slots == 1 ? WIC_OK : (*why = "copying the run addresses", WIC_EIO);
	}

	~placed()
	{
		if (channel)
			wic_channel_close(channel);
		cudaFree(runs);
		cudaFree(memory);
	}
};

/* Per-warp results of one consume() launch. */
struct outcome {
	std::vector<int> status;
	std::vector<uint64_t> wait_ns;
	unsigned wrong = 0;
	cudaError_t err = cudaSuccess;

	bool all(int rc) const
	{
		return err == cudaSuccess && !status.empty() &&
		       std::all_of(status.begin(), status.end(), [rc](int s) { return s == rc; });
	}
};

/* Launches consume() for @generation; @during runs on the host while the warps wait. */
template <typename F>
outcome run_consume(const placed &p, uint32_t generation, bool check, F during)
{
	const uint32_t warps = p.info.warps_per_batch;
	outcome out;
	int *status = nullptr;
	uint64_t *wait_ns = nullptr;
	unsigned *wrong = nullptr;

	out.status.assign(warps, 1);
	out.wait_ns.assign(warps, 0);
	if ((out.err = cudaMalloc(&status, warps * sizeof(int))) != cudaSuccess ||
	    (out.err = cudaMalloc(&wait_ns, warps * sizeof(uint64_t))) != cudaSuccess ||
	    (out.err = cudaMalloc(&wrong, sizeof(unsigned))) != cudaSuccess ||
	    (out.err = cudaMemset(wrong, 0, sizeof(unsigned))) != cudaSuccess)
		goto out;
	consume<<<1, warps * 32>>>(p.device, generation, check, status, wait_ns, wrong);
	during();
	if ((out.err = cudaDeviceSynchronize()) != cudaSuccess)
		goto out;
	cudaMemcpy(out.status.data(), status, warps * sizeof(int), cudaMemcpyDeviceToHost);
	cudaMemcpy(out.wait_ns.data(), wait_ns, warps * sizeof(uint64_t), cudaMemcpyDeviceToHost);
	cudaMemcpy(&out.wrong, wrong, sizeof(unsigned), cudaMemcpyDeviceToHost);
out:
	cudaFree(status);
	cudaFree(wait_ns);
	cudaFree(wrong);
	return out;
}

struct wic_channel_spec host_spec(uint64_t timeout_ns, uint32_t bytes = message_bytes)
{
	struct wic_channel_spec spec = {};
	spec.consumer_gpu = consumer_id;
	spec.producer_kind = WIC_PRODUCER_HOST;
	spec.message_bytes = bytes;
	spec.slots = 1;
	spec.timeout_ns = timeout_ns;
	return spec;
}

/*
 * batches_case() - what device/bringup.sh times wicd's command batches on (wicctl stats before
 * and after it, then wicd calibrate): host channels of messages of 256 B, 4 KiB and 16 KiB
 * (with wicd's default 16 warps a batch, runs of 1, 16 and 64 pages), 32 generations each, each
 * published before its warps read: each channel's completions map runs of another size, which
 * is what a fit of a batch's time against its pages needs.
 */
void batches_case(wic_client *client)
{
	constexpr uint32_t generations = 32;
	std::string runs;
	for (uint32_t bytes : {256u, 4096u, 16384u}) {
		placed p;
		std::string why;
		if (p.create(client, host_spec(long_timeout_ns, bytes), &why) != WIC_OK)
			return report("batches", "FAIL", std::to_string(bytes) + "-byte messages: " + why);
		std::vector<uint8_t> batch(p.info.batch_bytes, 0xa5); /* unchecked: only the batches' times count */
		runs += (runs.empty() ? "" : ", ") + std::to_string((p.info.batch_bytes + 4095) / 4096);
		for (uint32_t g = 0; g < generations; g++) {
			int rc = wic_wait_writable(p.channel, 0, long_timeout_ns);
			if (rc == WIC_OK)
				rc = wic_publish_copy(p.channel, 0, batch.data(), batch.size());
			if (rc != WIC_OK)
				return report("batches", "FAIL", wic_error("publish", rc));
			const outcome out = run_consume(p, g, false, [] {});
			if (!out.all(WIC_OK))
				return report("batches", "FAIL",
					      std::to_string(bytes) + "-byte messages, generation " + std::to_string(g) +
						      ": a warp did not get its data");
		}
	}
	report("batches", "PASS", std::to_string(generations) + " generations each of runs of " + runs + " pages");
}

void host_case(wic_client *client)
{
	constexpr uint32_t generations = 64;
	placed p;
	std::string why;
	if (p.create(client, host_spec(long_timeout_ns), &why) != WIC_OK)
		return report("host", "FAIL", why);
	std::vector<uint8_t> batch(p.info.batch_bytes);
	std::vector<uint64_t> waits;
	unsigned wrong = 0;
	for (uint32_t g = 0; g < generations; g++) {
		int rc = wic_wait_writable(p.channel, 0, long_timeout_ns);
		for (uint64_t i = 0; i < batch.size(); i++)
			batch[i] = pattern(g, (uint32_t)(i / message_bytes), (uint32_t)(i % message_bytes));
		if (rc == WIC_OK)
			rc = wic_publish_copy(p.channel, 0, batch.data(), batch.size());
		if (rc != WIC_OK)
			return report("host", "FAIL", wic_error("publish", rc) + " at generation " + std::to_string(g));
		const outcome out = run_consume(p, g, true, [] {});
		if (!out.all(WIC_OK))
			return report("host", "FAIL",
				      "generation " + std::to_string(g) + ": " +
					      (out.err != cudaSuccess ? cuda_error("kernel", out.err)
								      : std::string("a warp got ") +
									      wic_strerror(*std::find_if(
										      out.status.begin(), out.status.end(),
										      [](int s) { return s != WIC_OK; }))));
		wrong += out.wrong;
		waits.insert(waits.end(), out.wait_ns.begin(), out.wait_ns.end());
	}
	std::sort(waits.begin(), waits.end());
	auto at = [&](double q) { return waits[std::min(waits.size() - 1, (size_t)(q * waits.size()))] / 1000.0; };
	char detail[200];
	snprintf(detail, sizeof(detail), "%u generations x %u warps x %u B, %u wrong bytes; fault->wake us p50 %.1f p90 %.1f p99 %.1f max %.1f",
		 generations, p.info.warps_per_batch, message_bytes, wrong, at(0.5), at(0.9), at(0.99), at(1.0));
	report("host", wrong == 0 ? "PASS" : "FAIL", detail);
}

void timeout_case(wic_client *client)
{
	placed p;
	std::string why;
	if (p.create(client, host_spec(short_timeout_ns), &why) != WIC_OK)
		return report("timeout", "FAIL", why);
	const outcome out = run_consume(p, 0, false, [] {});
	const uint64_t shortest = out.wait_ns.empty() ? 0 : *std::min_element(out.wait_ns.begin(), out.wait_ns.end());
	const bool ok = out.all(WIC_ETIMED_OUT) && shortest >= short_timeout_ns;
	report("timeout", ok ? "PASS" : "FAIL",
	       std::string("unpublished slot, 100 ms timeout: ") + (ok ? "every warp got WIC_ETIMED_OUT" : "not every warp timed out") +
		       ", shortest wait " + std::to_string(shortest / 1000000) + " ms");
}

void close_case(wic_client *client)
{
	placed p;
	std::string why;
	if (p.create(client, host_spec(long_timeout_ns), &why) != WIC_OK)
		return report("close", "FAIL", why);
	const outcome out = run_consume(p, 0, false, [&p] {
		usleep(200000);
		wic_channel_close(p.channel);
		p.channel = nullptr;
	});
	report("close", out.all(WIC_ECLOSED) ? "PASS" : "FAIL",
	       out.all(WIC_ECLOSED) ? "channel closed while warps waited: every warp got WIC_ECLOSED" : "not every warp got WIC_ECLOSED");
}

void gpu_producer_case(wic_client *client)
{
	int count = 0, access = 0;
	cudaGetDeviceCount(&count);
	if (count >= 2)
		cudaDeviceCanAccessPeer(&access, 0, 1);
	if (count < 2 || !access)
		return report("gpu-producer", "SKIP", "needs two GPUs with peer access");
	/*
	 * GPU 1's context first, so that nvidia-uvm has registered it in this address space before
	 * wicd arms the PAT pages on it.
	 */
	cudaError_t err = cudaSetDevice(1);
	if (err == cudaSuccess)
		err = cudaFree(0);
	if (err == cudaSuccess)
		err = cudaSetDevice(0);
	if (err != cudaSuccess)
		return report("gpu-producer", "FAIL", cuda_error("GPU 1's context", err));
	/* The producer's batches: managed memory its kernel writes, so that it is resident there. */
	struct wic_channel_spec spec = host_spec(long_timeout_ns);
	uint8_t *batches = nullptr;
	const uint64_t batch_bytes = (uint64_t)message_bytes * 16;
	if (cudaMallocManaged(&batches, batch_bytes) != cudaSuccess)
		return report("gpu-producer", "FAIL", "cudaMallocManaged of the producer's batches");
	spec.producer_kind = WIC_PRODUCER_GPU;
	spec.producer_gpu = producer_id;
	spec.producer_base_va = (uint64_t)batches;
	placed p;
	std::string why;
	if (p.create(client, spec, &why) != WIC_OK || p.info.batch_bytes > batch_bytes) {
		cudaFree(batches);
		return report("gpu-producer", "FAIL", why.empty() ? "the channel's batch is larger than 16 messages" : why);
	}
	cudaError_t produced = cudaSuccess;
	const outcome out = run_consume(p, 0, true, [&] {
		produced = cudaSetDevice(1);
		if (produced == cudaSuccess) {
			produce<<<1, 256>>>(batches, p.info.batch_bytes, message_bytes,
					    (volatile uint32_t *)p.slot.pat_va[0]);
			produced = cudaGetLastError();
		}
		if (produced == cudaSuccess)
			produced = cudaDeviceSynchronize();
		cudaSetDevice(0);
	});
	if (produced != cudaSuccess) {
		cudaFree(batches);
		return report("gpu-producer", "FAIL", cuda_error("the producer's kernel on GPU 1", produced));
	}
	cudaFree(batches);
	const bool ok = out.all(WIC_OK) && out.wrong == 0;
	report("gpu-producer", ok ? "PASS" : "FAIL",
	       "GPU 1's batch copied by DMA into GPU 0's run: " + std::to_string(out.wrong) + " wrong bytes" +
		       (out.all(WIC_OK) ? "" : ", not every warp got WIC_OK"));
}

void daemon_death_case(wic_client *client, pid_t wicd)
{
	if (wicd <= 0)
		return report("daemon-death", "SKIP", "no WICD_PID: wicd is not this run's to kill");
	placed p;
	std::string why;
	if (p.create(client, host_spec(long_timeout_ns), &why) != WIC_OK)
		return report("daemon-death", "FAIL", why);
	int killed = 0;
	const outcome out = run_consume(p, 0, false, [&] {
		usleep(200000);
		killed = kill(wicd, SIGKILL) == 0 ? 0 : errno;
	});
	if (killed)
		return report("daemon-death", "FAIL", std::string("kill wicd: ") + strerror(killed));
	report("daemon-death", out.all(WIC_ECONNECT) ? "PASS" : "FAIL",
	       out.all(WIC_ECONNECT) ? "wicd killed while warps waited: every warp got WIC_ECONNECT (the daemon-gone marker)"
				     : "not every warp got WIC_ECONNECT");
}

/* Milliseconds since @start. */
double ms_since(std::chrono::steady_clock::time_point start)
{
	return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

/*
 * Runs this program again with @args, its stdout a pipe; the child's pid, and in *@out the
 * pipe's read end. -1 on failure.
 */
pid_t spawn_self(const std::vector<const char *> &args, int *out)
{
	int fds[2];
	if (pipe(fds))
		return -1;
	const pid_t pid = fork();
	if (pid == 0) {
		dup2(fds[1], STDOUT_FILENO);
		close(fds[0]);
		close(fds[1]);
		std::vector<char *> argv{const_cast<char *>("bringup")};
		for (const char *arg : args)
			argv.push_back(const_cast<char *>(arg));
		argv.push_back(nullptr);
		execv("/proc/self/exe", argv.data());
		_exit(127);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		return -1;
	}
	*out = fds[0];
	return pid;
}

/* The child's first line, waiting at most @timeout_ms; empty when none came. */
std::string read_line(int fd, int timeout_ms)
{
	std::string line;
	const auto start = std::chrono::steady_clock::now();
	char c;
	while (ms_since(start) < timeout_ms) {
		fd_set set;
		FD_ZERO(&set);
		FD_SET(fd, &set);
		struct timeval tv = {0, 10000};
		if (select(fd + 1, &set, nullptr, nullptr, &tv) <= 0)
			continue;
		if (read(fd, &c, 1) != 1 || c == '\n')
			return line;
		line += c;
	}
	return line;
}

/* The neighbour's kernel: one read of every page. */
__global__ void touch(const uint8_t *pages, uint64_t count, unsigned long long *sum)
{
	unsigned long long s = 0;
	for (uint64_t i = threadIdx.x; i < count; i += blockDim.x)
		s += pages[i * 4096];
	atomicAdd(sum, s);
}

/*
 * `bringup --neighbour`: a kernel faulting on 256 pages of managed memory the host wrote.
 * Prints "NEIGHBOUR ok|wrong|error MS detail"; exits 3 when it cannot have a context.
 */
int neighbour_main()
{
	constexpr uint64_t pages = 256;
	const auto start = std::chrono::steady_clock::now();
	cudaError_t err = cudaFree(0);
	if (err != cudaSuccess) {
		printf("NEIGHBOUR nocontext 0 %s\n", cudaGetErrorString(err));
		return 3;
	}
	uint8_t *memory = nullptr;
	unsigned long long *sum = nullptr;
	if ((err = cudaMallocManaged(&memory, pages * 4096)) != cudaSuccess ||
	    (err = cudaMallocManaged(&sum, sizeof(*sum))) != cudaSuccess) {
		printf("NEIGHBOUR error 0 %s\n", cudaGetErrorString(err));
		return 1;
	}
	unsigned long long want = 0;
	for (uint64_t i = 0; i < pages; i++) {
		memory[i * 4096] = (uint8_t)(i * 3 + 1);
		want += (uint8_t)(i * 3 + 1);
	}
	*sum = 0;
	touch<<<1, 256>>>(memory, pages, sum);
	err = cudaDeviceSynchronize();
	const double took = ms_since(start);
	if (err != cudaSuccess) {
		printf("NEIGHBOUR error %.1f %s\n", took, cudaGetErrorString(err));
		return 1;
	}
	printf("NEIGHBOUR %s %.1f sum %llu of %llu\n", *sum == want ? "ok" : "wrong", took, *sum, want);
	return *sum == want ? 0 : 1;
}

void neighbour_case(wic_client *client)
{
	placed p;
	std::string why;
	if (p.create(client, host_spec(long_timeout_ns), &why) != WIC_OK)
		return report("neighbour", "FAIL", why);
	std::vector<uint8_t> batch(p.info.batch_bytes);
	for (uint64_t i = 0; i < batch.size(); i++)
		batch[i] = pattern(0, (uint32_t)(i / message_bytes), (uint32_t)(i % message_bytes));
	std::string line;
	int published = WIC_OK;
	const outcome out = run_consume(p, 0, true, [&] {
		usleep(100000); /* the warps' faults are held by now */
		int fd = -1;
		const pid_t child = spawn_self({"--neighbour"}, &fd);
		if (child < 0) {
			line = "cannot start the neighbour";
		} else {
			usleep(500000);
			published = wic_publish_copy(p.channel, 0, batch.data(), batch.size());
			line = read_line(fd, 20000);
			close(fd);
			kill(child, SIGKILL);
			waitpid(child, nullptr, 0);
		}
		if (published != WIC_OK)
			published = wic_publish_copy(p.channel, 0, batch.data(), batch.size());
	});
	char verdict[16] = "", detail[160] = "";
	double took = 0;
	if (sscanf(line.c_str(), "NEIGHBOUR %15s %lf %159[^\n]", verdict, &took, detail) < 2)
		return report("neighbour", "FAIL", "the neighbour said nothing in 20 s: " + line);
	if (!strcmp(verdict, "nocontext"))
		return report("neighbour", "SKIP",
			      std::string("no second process can use the GPU (EXCLUSIVE_PROCESS, as the deployment rule wants): ") +
				      detail);
	const bool ok = !strcmp(verdict, "ok") && out.all(WIC_OK) && out.wrong == 0 && published == WIC_OK;
	char text[400];
	snprintf(text, sizeof(text),
		 "another process's faulting kernel took %.0f ms (its start included) while a fault was held for ~500 ms; its %s; the warps %s",
		 took, detail, out.all(WIC_OK) && out.wrong == 0 ? "got their bytes" : "did not all get their bytes");
	report("neighbour", ok ? "PASS" : "FAIL", text);
}

/*
 * `bringup --holder SOCKET`: a consumer whose fault is held (nobody publishes); prints
 * "HOLDER held KEEPER" once its kernel is seen waiting, then waits to be killed. KEEPER is a
 * process forked before CUDA starts that keeps the connection to wicd open (and nothing of
 * CUDA's), so that wicd does not hear of the holder's death: what ends the hold must be the
 * exit's own teardown, not wicd destroying the channel.
 */
int holder_main(const char *socket)
{
	wic_client *client = nullptr;
	uint32_t space = 0;
	if (wic_connect(socket, &client) != WIC_OK)
		return 1;
	const pid_t keeper = fork();
	if (keeper == 0) {
		sleep(60);
		_exit(0);
	}
	if (keeper < 0 || cudaFree(0) != cudaSuccess || attach_space(client, &space) != WIC_OK)
		return 1;
	placed p;
	std::string why;
	if (p.create(client, host_spec(long_timeout_ns), &why) != WIC_OK)
		return 1;
	int *status = nullptr;
	uint64_t *wait_ns = nullptr;
	unsigned *wrong = nullptr;
	const uint32_t warps = p.info.warps_per_batch;
	if (cudaMalloc(&status, warps * sizeof(int)) != cudaSuccess ||
	    cudaMalloc(&wait_ns, warps * sizeof(uint64_t)) != cudaSuccess ||
	    cudaMalloc(&wrong, sizeof(unsigned)) != cudaSuccess)
		return 1;
	consume<<<1, warps * 32>>>(p.device, 0, false, status, wait_ns, wrong);
	cudaError_t err = cudaGetLastError();
	usleep(200000);
	/* Still running 200 ms later: its warps wait on the held fault. */
	if (err == cudaSuccess && cudaStreamQuery(0) == cudaErrorNotReady)
		printf("HOLDER held %d\n", (int)keeper);
	else
		printf("HOLDER notheld %s\n", err == cudaSuccess ? "the consumer kernel ended" : cudaGetErrorString(err));
	fflush(stdout);
	cudaDeviceSynchronize();
	return 0;
}

__global__ void nothing() {}

void process_kill_case(const char *socket)
{
	int fd = -1;
	const pid_t child = spawn_self({"--holder", socket}, &fd);
	if (child < 0)
		return report("process-kill", "FAIL", "cannot start the holding process");
	const std::string line = read_line(fd, 20000);
	close(fd);
	int keeper = 0;
	if (sscanf(line.c_str(), "HOLDER held %d", &keeper) != 1 || keeper <= 0) {
		kill(child, SIGKILL);
		waitpid(child, nullptr, 0);
		return report("process-kill", "FAIL", "the holding process had no held fault: " + line);
	}
	const auto killed = std::chrono::steady_clock::now();
	kill(child, SIGKILL);
	waitpid(child, nullptr, 0);
	const double gone = ms_since(killed);
	/* Now wicd may hear of it. */
	kill(keeper, SIGKILL);
	nothing<<<1, 1>>>();
	const cudaError_t err = cudaDeviceSynchronize();
	const double ran = ms_since(killed);
	char detail[200];
	snprintf(detail, sizeof(detail), "a process killed with a fault held was gone %.0f ms after SIGKILL; a kernel of ours ran %.0f ms after it%s",
		 gone, ran, err == cudaSuccess ? "" : (std::string(": ") + cudaGetErrorString(err)).c_str());
	report("process-kill", gone < 1000 && err == cudaSuccess ? "PASS" : "FAIL", detail);
}

} /* namespace */

/*
 * Connects to wicd on @socket with this process's address space attached, nvidia-uvm's GPU ids
 * known; null after a failure, reported.
 */
wic_client *connect_attached(const char *socket)
{
	cudaError_t err = cudaFree(0); /* the context, and with it CUDA's nvidia-uvm files */
	if (err != cudaSuccess) {
		report("cuda", "FAIL", cuda_error("cudaFree(0)", err));
		return nullptr;
	}
	int devices = 0;
	cudaGetDeviceCount(&devices);
	uint16_t *ids[] = {&consumer_id, &producer_id};
	for (int device = 0; device < std::min(devices, 2); device++) {
		uint32_t id = 0;
		int rc = wic::uvm_gpu_id(device, &id);
		if (rc != WIC_OK || id == 0 || id > 0xffff) {
			report("gpu-ids", "FAIL", wic_error(("wic::uvm_gpu_id(" + std::to_string(device) + ")").c_str(), rc));
			return nullptr;
		}
		*ids[device] = (uint16_t)id;
	}
	report("gpu-ids", "PASS",
	       "CUDA device 0 is nvidia-uvm GPU " + std::to_string(consumer_id) +
		       (devices > 1 ? ", device 1 GPU " + std::to_string(producer_id) : std::string()));
	wic_client *client = nullptr;
	uint32_t space = 0;
	int rc = wic_connect(socket, &client);
	if (rc != WIC_OK) {
		report("attach", "FAIL", wic_error("wic_connect", rc));
		return nullptr;
	}
	rc = attach_space(client, &space);
	if (rc != WIC_OK) {
		report("attach", "FAIL", wic_error("wic_attach_space", rc));
		wic_disconnect(client);
		return nullptr;
	}
	report("attach", "PASS", "this process's address space attached as space " + std::to_string(space));
	return client;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--neighbour"))
		return neighbour_main();
	if (argc == 3 && !strcmp(argv[1], "--holder"))
		return holder_main(argv[2]);
	const bool batches = argc == 3 && !strcmp(argv[1], "--batches");
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s SOCKET [WICD_PID] | --batches SOCKET\n", argv[0]);
		return 2;
	}
	wic_client *client = connect_attached(argv[batches ? 2 : 1]);
	if (!client)
		return 1;
	if (batches) {
		batches_case(client);
		wic_disconnect(client);
		return failed_any ? 1 : 0;
	}
	const pid_t wicd = argc == 3 ? (pid_t)atoi(argv[2]) : 0;
	host_case(client);
	timeout_case(client);
	close_case(client);
	gpu_producer_case(client);
	neighbour_case(client);
	process_kill_case(argv[1]);
	daemon_death_case(client, wicd);
	wic_disconnect(client);
	return failed_any ? 1 : 0;
}
