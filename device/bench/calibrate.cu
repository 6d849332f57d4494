// GPU calibration microbenchmarks for the emulator's constants (emu/calibration.toml).
//
// Build: nvcc -O2 -arch=sm_90 -std=c++17 -o calibrate calibrate.cu
// Run:   ./calibrate [results.json]          (default: calibration-results.json)
//
// Measurements (README.md beside this file says what each one maps to):
//   timer                              %globaltimer step, SM clock, single-warp IPC (informational)
//   fault_first_touch                  GPU faults on host-resident managed pages, W = 1..4096 warps
//   fault_first_touch_unpopulated      GPU faults on never-touched managed pages (no migration)
//   stalled_warps_do_not_block_issue   compute beside fault-stalled warps vs alone
//   poll_issue_weight                  compute beside polling warps vs alone
//   mapped_poll_round_trip             host <-> GPU ping-pong through pinned mapped memory
//   pcie_copy                          cudaMemcpy 256 MiB pinned <-> device
//   cpu_fault_on_gpu_page              CPU write to a GPU-resident managed page
//   host_memcpy                        single-thread memcpy of 64 KiB chunks into pinned memory
//
// Every CUDA call is checked; any error ends the program with a message and a non-zero status.
// Managed memory in use never exceeds about 40 MiB, so it never oversubscribes the GPU.

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

// ---------------------------------------------------------------------------------------------
// Errors

[[noreturn]] static void fail(const std::string& message) {
  fflush(stdout);
  fprintf(stderr, "calibrate: error: %s\n", message.c_str());
  exit(1);
}

static void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s:%d: %s: %s (%s)", file, line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    fail(buf);
  }
}

#define CK(call) check((call), #call, __FILE__, __LINE__)
// After every kernel launch.
#define CK_LAUNCH() check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Parameters

constexpr int kReps = 7;                                // measured repetitions (medians reported)
constexpr int kChains = 8;                              // independent FMA chains per thread
constexpr int kUnroll = 16;                             // FMAs per chain per loop iteration
constexpr int kFmaPerIter = kChains * kUnroll;          // 128 FMA instructions per iteration
constexpr uint64_t kSpinTimeoutNs = 2'000'000'000ull;   // any GPU spin gives up after 2 s
constexpr double kResumeGapNs = 2000.0;                 // end-time gap that separates two replays
constexpr size_t kPage = 4096;                          // managed pages touched: 4 KiB apart (x86)

// ---------------------------------------------------------------------------------------------
// Device functions

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_volatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One load timed with %globaltimer. The store of the loaded value makes the warp wait for it
// (a warp issues in order and the store reads the register) before the second timer read.
__device__ __forceinline__ void timed_load(const uint32_t* p, uint32_t* sink, uint64_t& t0, uint64_t& t1) {
  t0 = gtime();
  const uint32_t v = load_volatile(p);
  store_volatile(sink, v);
  t1 = gtime();
}

// One loop iteration of the compute work: CHAINS independent chains of kUnroll dependent FMAs.
template <int CHAINS>
__device__ __forceinline__ void fma_step(float (&a)[CHAINS], float m, float c) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
    for (int k = 0; k < CHAINS; ++k) a[k] = fmaf(a[k], m, c);
  }
}

template <int CHAINS>
__device__ __forceinline__ void fma_init(float (&a)[CHAINS], float seed) {
#pragma unroll
  for (int k = 0; k < CHAINS; ++k) a[k] = seed + 0.001f * float(k);
}

template <int CHAINS>
__device__ __forceinline__ float fma_sum(const float (&a)[CHAINS]) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < CHAINS; ++k) s += a[k];
  return s;
}

// `iters` iterations of fma_step (SASS: CHAINS * kUnroll FFMA + counter, compare, branch).
template <int CHAINS>
__device__ __forceinline__ float fma_work(uint32_t iters, float m, float c, float seed) {
  float a[CHAINS];
  fma_init(a, seed);
#pragma unroll 1
  for (uint32_t i = 0; i < iters; ++i) fma_step(a, m, c);
  return fma_sum(a);
}

// Runs the compute loop and records {globaltimer start, end, clock64 start, end} (lane 0).
__device__ __forceinline__ float timed_compute(uint32_t iters, float m, float c, uint64_t* rec, int lane) {
  const uint64_t g0 = gtime();
  const long long c0 = clock64();
  const float s = fma_work<kChains>(iters, m, c, 1.0f + 1e-6f * float(threadIdx.x));
  const long long c1 = clock64();
  const uint64_t g1 = gtime();
  if (lane == 0) {
    rec[0] = g0;
    rec[1] = g1;
    rec[2] = uint64_t(c0);
    rec[3] = uint64_t(c1);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Kernels

// %globaltimer step: the smallest non-zero difference and the mean difference between reads.
__global__ void timer_probe_kernel(uint64_t* out, int reads) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  uint64_t first = gtime(), prev = first, min_step = ~0ull, changes = 0;
  for (int i = 0; i < reads; ++i) {
    const uint64_t t = gtime();
    if (t != prev) {
      min_step = min(min_step, t - prev);
      ++changes;
      prev = t;
    }
  }
  out[0] = min_step;
  out[1] = changes;
  out[2] = prev - first;
}

// One warp: CHAINS chains for `iters` iterations; {g0, g1, c0, c1} to rec.
template <int CHAINS>
__global__ void ipc_kernel(uint32_t iters, float m, float c, uint64_t* rec, float* sink) {
  const uint64_t g0 = gtime();
  const long long c0 = clock64();
  const float s = fma_work<CHAINS>(iters, m, c, 1.0f + 1e-6f * float(threadIdx.x));
  const long long c1 = clock64();
  const uint64_t g1 = gtime();
  sink[threadIdx.x] = s;
  if (threadIdx.x == 0) {
    rec[0] = g0;
    rec[1] = g1;
    rec[2] = uint64_t(c0);
    rec[3] = uint64_t(c1);
  }
}

// One warp per block; lane 0 of warp w reads the first word of page w and times the load.
__global__ void fault_touch_kernel(const uint8_t* pages, size_t stride, uint32_t* sink, uint64_t* t0s, uint64_t* t1s) {
  if (threadIdx.x != 0) return;
  const uint32_t w = blockIdx.x;
  uint64_t t0, t1;
  timed_load(reinterpret_cast<const uint32_t*>(pages + size_t(w) * stride), sink + w, t0, t1);
  t0s[w] = t0;
  t1s[w] = t1;
}

constexpr int kStallFaultWarps = 4;    // warps 0..3: one per SM sub-partition (warp i -> scheduler i % 4)
constexpr int kStallComputeWarps = 8;  // warps 4..11: two per sub-partition

// One block per SM. Fault warps (lane 0) read `pages_per_warp` host-resident pages one after the
// other, each a new fault, and record each load's [start, end]; compute warps run the FMA loop.
__global__ void stall_issue_kernel(const uint8_t* pages, size_t stride, uint32_t pages_per_warp, uint32_t region_pages,
                                   int faults_on, uint32_t iters, float m, float c, uint64_t* fault_rec,
                                   uint64_t* comp_rec, uint32_t* sink, float* fsink) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp < kStallFaultWarps) {
    if (!faults_on || lane != 0) return;
    const uint32_t g = blockIdx.x * kStallFaultWarps + uint32_t(warp);
    const uint8_t* base = pages + size_t(g) * region_pages * stride;
    uint64_t* rec = fault_rec + size_t(g) * pages_per_warp * 2;
    for (uint32_t k = 0; k < pages_per_warp; ++k) {
      uint64_t t0, t1;
      timed_load(reinterpret_cast<const uint32_t*>(base + size_t(k) * stride), sink + g, t0, t1);
      rec[2 * k] = t0;
      rec[2 * k + 1] = t1;
    }
    return;
  }
  const uint32_t cw = blockIdx.x * kStallComputeWarps + uint32_t(warp - kStallFaultWarps);
  fsink[blockIdx.x * blockDim.x + threadIdx.x] = timed_compute(iters, m, c, comp_rec + size_t(cw) * 4, lane);
}

enum PollMode : int {
  kPollNone = 0,         // pollers exit at once (compute alone)
  kPollManaged = 1,      // tight loop of volatile loads of a device-resident managed flag
  kPollPinned = 2,       // tight loop of volatile loads of a flag in pinned mapped host memory
  kPollNanosleep = 3,    // device-memory flag, __nanosleep backoff 100 ns doubling to 10 us
  kPollManagedAtomic = 4,  // tight loop of atomicOr(flag, 0) on the managed flag
  kPollFmaCorunner = 5,  // co-runners run the compute loop itself (validates the method: w = 1)
};

__device__ __forceinline__ bool spin_volatile(const uint32_t* flag, uint64_t deadline) {
  for (;;) {
    // 64 polls between timeout checks: each poll is load, compare, branch.
#pragma unroll
    for (int i = 0; i < 64; ++i)
      if (load_volatile(flag) != 0) return true;
    if (gtime() > deadline) return false;
  }
}

__device__ __forceinline__ bool spin_atomic(uint32_t* flag, uint64_t deadline) {
  for (;;) {
#pragma unroll
    for (int i = 0; i < 64; ++i)
      if (atomicOr(flag, 0u) != 0) return true;
    if (gtime() > deadline) return false;
  }
}

__device__ __forceinline__ bool spin_backoff(const uint32_t* flag, uint64_t deadline) {
  unsigned ns = 100;
  while (load_volatile(flag) == 0) {
    if (gtime() > deadline) return false;
    __nanosleep(ns);
    ns = min(ns * 2u, 10000u);
  }
  return true;
}

// One block per SM: warps 0..compute_warps-1 compute; the others poll (lane 0) until the last
// compute warp of the block sets the block's flag, after the measured window.
__global__ void poll_kernel(int mode, uint32_t* flags, int compute_warps, uint32_t iters, float m, float c,
                            uint64_t* comp_rec, uint64_t* poll_rec, float* fsink, uint32_t* status) {
  __shared__ uint32_t finished;
  __shared__ volatile uint32_t stop;
  if (threadIdx.x == 0) {
    finished = 0;
    stop = 0;
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int pollers = int(blockDim.x) / 32 - compute_warps;
  uint32_t* flag = flags + size_t(blockIdx.x) * 32;
  if (warp < compute_warps) {
    const uint32_t cw = blockIdx.x * uint32_t(compute_warps) + uint32_t(warp);
    fsink[blockIdx.x * blockDim.x + threadIdx.x] = timed_compute(iters, m, c, comp_rec + size_t(cw) * 4, lane);
    __syncwarp();
    if (lane == 0 && atomicAdd(&finished, 1u) == uint32_t(compute_warps - 1)) {
      stop = 1;
      store_volatile(flag, 1);
      __threadfence_system();
    }
    return;
  }
  if (mode == kPollNone) return;
  if (mode != kPollFmaCorunner && lane != 0) return;
  const uint64_t t0 = gtime();
  const uint64_t deadline = t0 + kSpinTimeoutNs;
  bool ok = true;
  float s = 0.0f;
  switch (mode) {
    case kPollManaged:
    case kPollPinned:
      ok = spin_volatile(flag, deadline);
      break;
    case kPollManagedAtomic:
      ok = spin_atomic(flag, deadline);
      break;
    case kPollNanosleep:
      ok = spin_backoff(flag, deadline);
      break;
    case kPollFmaCorunner: {
      float a[kChains];
      fma_init(a, 2.0f + 1e-6f * float(threadIdx.x));
      while (stop == 0) {
        fma_step(a, m, c);
        if (gtime() > deadline) {
          ok = false;
          break;
        }
      }
      s = fma_sum(a);
      break;
    }
    default:
      ok = false;
  }
  const uint64_t t1 = gtime();
  fsink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (!ok) atomicExch(status, 1u);
  if (lane == 0) {
    const size_t p = size_t(blockIdx.x) * size_t(pollers) + size_t(warp - compute_warps);
    poll_rec[2 * p] = t0;
    poll_rec[2 * p + 1] = t1;
  }
}

// One thread echoes every value the host writes to *h2d into *d2h, for values 1..n.
__global__ void echo_kernel(const uint32_t* h2d, uint32_t* d2h, uint32_t n, uint32_t* status) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (uint32_t i = 1; i <= n; ++i) {
    const uint64_t deadline = gtime() + kSpinTimeoutNs;
    while (load_volatile(h2d) != i) {
      if (gtime() > deadline) {
        store_volatile(status, 1);
        __threadfence_system();
        return;
      }
    }
    store_volatile(d2h, i);
    __threadfence_system();
  }
}

// `reads` timed loads of one word of pinned host memory by one thread: GPU -> host read latency.
__global__ void pinned_read_kernel(const uint32_t* word, int reads, uint32_t* sink, uint64_t* lat) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int i = 0; i < reads; ++i) {
    uint64_t t0, t1;
    timed_load(word, sink, t0, t1);
    lat[i] = t1 - t0;
  }
}

__global__ void write_pages_kernel(uint8_t* pages, size_t stride, uint32_t first, uint32_t step, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) pages[size_t(first + i * step) * stride] = uint8_t(i + 1);
}

__global__ void fill_kernel(uint32_t* p, size_t n, uint32_t v) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

// ---------------------------------------------------------------------------------------------
// Host side: time, statistics, JSON

static double host_ns() {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stats {
  size_t n = 0;
  double min = NAN, p10 = NAN, median = NAN, p90 = NAN, max = NAN, mean = NAN;
};

static double quantile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return NAN;
  const double pos = q * double(s.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, s.size() - 1);
  return s[lo] + (s[hi] - s[lo]) * (pos - double(lo));
}

static Stats stats_of(std::vector<double> v) {
  Stats st;
  st.n = v.size();
  if (v.empty()) return st;
  std::sort(v.begin(), v.end());
  st.min = v.front();
  st.max = v.back();
  st.p10 = quantile_sorted(v, 0.1);
  st.median = quantile_sorted(v, 0.5);
  st.p90 = quantile_sorted(v, 0.9);
  double sum = 0;
  for (double x : v) sum += x;
  st.mean = sum / double(v.size());
  return st;
}

static double median_of(const std::vector<double>& v) { return stats_of(v).median; }

static std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  snprintf(b, sizeof b, "%.10g", v);
  return b;
}

static std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += char(ch);
    } else if (ch < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", ch);
      o += b;
    } else {
      o += char(ch);
    }
  }
  return o + "\"";
}

static std::string jarr(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + jnum(v[i]);
  return o + "]";
}

static std::string jarr_raw(const std::vector<std::string>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? "," : "") + v[i];
  return o + "]";
}

// A JSON object built in insertion order.
class Obj {
 public:
  Obj& num(const std::string& k, double v) { return raw(k, jnum(v)); }
  Obj& str(const std::string& k, const std::string& v) { return raw(k, jstr(v)); }
  Obj& boolean(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  Obj& null(const std::string& k) { return raw(k, "null"); }
  Obj& arr(const std::string& k, const std::vector<double>& v) { return raw(k, jarr(v)); }
  Obj& obj(const std::string& k, const Obj& o) { return raw(k, o.json()); }
  Obj& stats(const std::string& k, const Stats& s) {
    Obj o;
    o.num("n", double(s.n)).num("min", s.min).num("p10", s.p10).num("median", s.median).num("p90", s.p90);
    o.num("max", s.max).num("mean", s.mean);
    return obj(k, o);
  }
  Obj& raw(const std::string& k, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + jstr(k) + ":" + json;
    return *this;
  }
  std::string json() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

static std::string read_text(const char* path) {
  std::ifstream f(path);
  if (!f) return "";
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The kernel module's version, e.g. "580.65.06".
static std::string kernel_driver_version() {
  std::string v = read_text("/sys/module/nvidia/version");
  if (!v.empty()) return v;
  const std::string proc = read_text("/proc/driver/nvidia/version");
  const size_t at = proc.find("Kernel Module");
  if (at != std::string::npos) {
    size_t i = at + strlen("Kernel Module");
    while (i < proc.size() && proc[i] == ' ') ++i;
    size_t j = i;
    while (j < proc.size() && proc[j] != ' ' && proc[j] != '\n') ++j;
    if (j > i) return proc.substr(i, j - i);
  }
  return "unknown";
}

struct Device {
  std::string name, driver, uvm_version;
  int sms = 0, cc_major = 0, cc_minor = 0, max_threads_per_sm = 0, max_blocks_per_sm = 0;
  int concurrent_managed = 0, pageable_access = 0, cuda_driver_api = 0, cuda_runtime = 0;
  long host_page = 0;
  Obj uvm_params;
};

static Device query_device() {
  Device d;
  CK(cudaSetDevice(0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  d.name = p.name;
  CK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  CK(cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, 0));
  CK(cudaDeviceGetAttribute(&d.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  CK(cudaDeviceGetAttribute(&d.max_blocks_per_sm, cudaDevAttrMaxBlocksPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&d.concurrent_managed, cudaDevAttrConcurrentManagedAccess, 0));
  CK(cudaDeviceGetAttribute(&d.pageable_access, cudaDevAttrPageableMemoryAccess, 0));
  CK(cudaDriverGetVersion(&d.cuda_driver_api));
  CK(cudaRuntimeGetVersion(&d.cuda_runtime));
  d.driver = kernel_driver_version();
  d.uvm_version = read_text("/sys/module/nvidia_uvm/version");
  d.host_page = sysconf(_SC_PAGESIZE);
  // The UVM driver's fault-path parameters in force (read only).
  const char* params[] = {"uvm_perf_fault_batch_count", "uvm_perf_fault_replay_policy", "uvm_perf_fault_coalesce",
                          "uvm_perf_fault_max_batches_per_service", "uvm_perf_prefetch_enable",
                          "uvm_perf_prefetch_threshold", "uvm_perf_thrashing_enable"};
  for (const char* name : params) {
    const std::string path = std::string("/sys/module/nvidia_uvm/parameters/") + name;
    const std::string v = read_text(path.c_str());
    if (v.empty())
      d.uvm_params.null(name);
    else
      d.uvm_params.str(name, v);
  }
  return d;
}

static void watchdog(int) {
  const char msg[] = "calibrate: error: still running after 300 s; giving up\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  _exit(3);
}

// A device buffer freed on scope exit.
template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    CK(cudaMalloc(&p, count * sizeof(T)));
    CK(cudaMemset(p, 0, count * sizeof(T)));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::vector<T> get(size_t count) const {
    std::vector<T> v(count);
    CK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Writes one word per page on the CPU: the pages become CPU-resident (faulting back from the GPU).
static void cpu_touch(uint8_t* pages, size_t stride, size_t n, uint32_t value) {
  for (size_t i = 0; i < n; ++i) *reinterpret_cast<volatile uint32_t*>(pages + i * stride) = value;
}

static float g_m = 0.9999f, g_c = 1e-4f;  // FMA operands (runtime values: nothing folds)

static double overlap(double a0, double a1, double b0, double b1) { return std::max(0.0, std::min(a1, b1) - std::max(a0, b0)); }

// Sizes of groups of end times separated by more than kResumeGapNs (warps resumed by one replay
// finish their load within a short time of each other).
static std::vector<double> resume_groups(std::vector<double> ends) {
  std::vector<double> sizes;
  if (ends.empty()) return sizes;
  std::sort(ends.begin(), ends.end());
  double size = 1;
  for (size_t i = 1; i < ends.size(); ++i) {
    if (ends[i] - ends[i - 1] > kResumeGapNs) {
      sizes.push_back(size);
      size = 0;
    }
    size += 1;
  }
  sizes.push_back(size);
  return sizes;
}

// ---------------------------------------------------------------------------------------------
// timer: %globaltimer step, SM clock, single-warp IPC

struct TimerInfo {
  double step_min_ns = 0, step_mean_ns = 0, clock_ghz = 0, ipc_dependent = 0, ipc_chains = 0;
};

static TimerInfo measure_timer(Obj& results) {
  TimerInfo ti;
  DevBuf<uint64_t> out(4);
  DevBuf<float> sink(32);
  timer_probe_kernel<<<1, 32>>>(out.p, 200000);
  CK_LAUNCH();
  CK(cudaDeviceSynchronize());
  auto o = out.get(3);
  ti.step_min_ns = double(o[0]);
  ti.step_mean_ns = o[1] ? double(o[2]) / double(o[1]) : NAN;

  // Single warp, one dependent chain vs kChains independent chains.
  std::vector<double> ghz, ipc1, ipc8;
  const uint32_t iters = 20000;
  for (int rep = 0; rep < kReps + 1; ++rep) {
    ipc_kernel<1><<<1, 32>>>(iters, g_m, g_c, out.p, sink.p);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    auto r1 = out.get(4);
    ipc_kernel<kChains><<<1, 32>>>(iters, g_m, g_c, out.p, sink.p);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    auto r8 = out.get(4);
    if (rep == 0) continue;  // warm-up
    const double cyc1 = double(r1[3] - r1[2]), cyc8 = double(r8[3] - r8[2]);
    ipc1.push_back(double(kUnroll) * iters / cyc1);
    ipc8.push_back(double(kFmaPerIter) * iters / cyc8);
    ghz.push_back(cyc8 / double(r8[1] - r8[0]));
  }
  ti.clock_ghz = median_of(ghz);
  ti.ipc_dependent = median_of(ipc1);
  ti.ipc_chains = median_of(ipc8);
  printf("[timer] globaltimer step: min %.0f ns, mean %.1f ns; SM clock %.3f GHz (clock64 / globaltimer)\n",
         ti.step_min_ns, ti.step_mean_ns, ti.clock_ghz);
  printf("[timer] one warp alone: %.3f FMA instr/cycle on one dependent chain, %.3f on %d independent chains\n",
         ti.ipc_dependent, ti.ipc_chains, kChains);
  Obj r;
  r.null("constant")
      .str("note", "informational: timer resolution, SM clock under load (compare gpu.clock_ghz), one warp's IPC (compare gpu.warp_ipc)")
      .num("globaltimer_step_min_ns", ti.step_min_ns)
      .num("globaltimer_step_mean_ns", ti.step_mean_ns)
      .num("sm_clock_ghz", ti.clock_ghz)
      .arr("sm_clock_ghz_reps", ghz)
      .num("single_warp_ipc_dependent_chain", ti.ipc_dependent)
      .arr("single_warp_ipc_dependent_chain_reps", ipc1)
      .num("single_warp_ipc_independent_chains", ti.ipc_chains)
      .arr("single_warp_ipc_independent_chains_reps", ipc8)
      .num("independent_chains", kChains);
  results.obj("timer", r);
  return ti;
}

// ---------------------------------------------------------------------------------------------
// fault_first_touch (host-resident pages) and fault_first_touch_unpopulated (never-touched pages)

static void measure_fault_first_touch(Obj& results, const Device& dev, bool host_resident) {
  const char* name = host_resident ? "fault_first_touch" : "fault_first_touch_unpopulated";
  const std::vector<uint32_t> ws = {1, 16, 256, 1024, 4096};
  const uint32_t wmax = ws.back();
  const size_t stride = std::max(kPage, size_t(dev.host_page));
  DevBuf<uint32_t> sink(wmax);
  DevBuf<uint64_t> t0s(wmax), t1s(wmax);
  uint8_t* pages = nullptr;
  if (host_resident) CK(cudaMallocManaged(&pages, size_t(wmax) * stride));
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));

  std::vector<std::string> per_w;
  for (uint32_t w : ws) {
    if (w > uint32_t(dev.sms * dev.max_blocks_per_sm))
      printf("[%s] warning: W=%u exceeds the resident block limit; late blocks fault later\n", name, w);
    std::vector<double> med, mx, mn, p90, window, kernel_us, res_med, res_max, groups, first_group, gaps_median;
    std::vector<double> raw_stalls;  // every warp's stall, W <= 16 only
    for (int rep = -1; rep < kReps; ++rep) {  // rep -1: warm-up, discarded
      if (host_resident) {
        cpu_touch(pages, stride, w, uint32_t(rep + 2));
      } else {
        CK(cudaMallocManaged(&pages, size_t(w) * stride));
      }
      CK(cudaEventRecord(ev0));
      fault_touch_kernel<<<w, 32>>>(pages, stride, sink.p, t0s.p, t1s.p);
      CK_LAUNCH();
      CK(cudaEventRecord(ev1));
      CK(cudaEventSynchronize(ev1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, ev0, ev1));
      const auto a = t0s.get(w), b = t1s.get(w);
      // The same kernel again: the pages are GPU-resident now (no fault): the plain load cost.
      fault_touch_kernel<<<w, 32>>>(pages, stride, sink.p, t0s.p, t1s.p);
      CK_LAUNCH();
      CK(cudaDeviceSynchronize());
      const auto ra = t0s.get(w), rb = t1s.get(w);
      if (!host_resident) {
        CK(cudaFree(pages));
        pages = nullptr;
      }
      if (rep < 0) continue;
      std::vector<double> stall(w), resident(w), ends(w);
      double first = 1e300, last = 0;
      for (uint32_t i = 0; i < w; ++i) {
        stall[i] = double(b[i] - a[i]);
        resident[i] = double(rb[i] - ra[i]);
        ends[i] = double(b[i]);
        first = std::min(first, double(a[i]));
        last = std::max(last, double(b[i]));
      }
      const Stats s = stats_of(stall), r = stats_of(resident);
      med.push_back(s.median);
      mx.push_back(s.max);
      mn.push_back(s.min);
      p90.push_back(s.p90);
      window.push_back(last - first);
      kernel_us.push_back(ms * 1000.0);
      res_med.push_back(r.median);
      res_max.push_back(r.max);
      const auto g = resume_groups(ends);
      groups.push_back(double(g.size()));
      first_group.push_back(g.front());
      if (w <= 16) raw_stalls.insert(raw_stalls.end(), stall.begin(), stall.end());
      // Gaps between consecutive resume groups (batch service + replay periods).
      std::vector<double> sorted_ends = ends, gap;
      std::sort(sorted_ends.begin(), sorted_ends.end());
      for (size_t i = 1; i < sorted_ends.size(); ++i)
        if (sorted_ends[i] - sorted_ends[i - 1] > kResumeGapNs) gap.push_back(sorted_ends[i] - sorted_ends[i - 1]);
      gaps_median.push_back(gap.empty() ? NAN : median_of(gap));
    }
    printf("[%s] W=%4u: stall median %9.0f ns, max %9.0f ns, window %9.0f ns, kernel %8.1f us; resident load %5.0f ns; resume groups %.0f\n",
           name, w, median_of(med), median_of(mx), median_of(window), median_of(kernel_us), median_of(res_med),
           median_of(groups));
    Obj o;
    o.num("warps", w)
        .num("stall_median_ns", median_of(med))
        .num("stall_max_ns", median_of(mx))
        .num("window_ns", median_of(window))
        .num("kernel_us", median_of(kernel_us))
        .num("resident_load_median_ns", median_of(res_med))
        .num("resume_groups", median_of(groups))
        .arr("reps_stall_median_ns", med)
        .arr("reps_stall_max_ns", mx)
        .arr("reps_stall_min_ns", mn)
        .arr("reps_stall_p90_ns", p90)
        .arr("reps_window_ns", window)
        .arr("reps_kernel_us", kernel_us)
        .arr("reps_resident_load_median_ns", res_med)
        .arr("reps_resident_load_max_ns", res_max)
        .arr("reps_resume_groups", groups)
        .arr("reps_first_group_warps", first_group)
        .arr("reps_resume_gap_median_ns", gaps_median);
    if (w <= 16) o.arr("all_stalls_ns", raw_stalls);
    per_w.push_back(o.json());
  }
  if (host_resident) CK(cudaFree(pages));
  CK(cudaEventDestroy(ev0));
  CK(cudaEventDestroy(ev1));

  Obj r;
  if (host_resident) {
    r.null("constant").str("note",
                           "host-resident managed pages (CPU-touched before every rep), one warp per page; stall = "
                           "globaltimer around the load; window = last load end - first load start; resident = same "
                           "kernel again on the now GPU-resident pages. Bounds sums of fault.* constants (derive.py)");
  } else {
    r.str("constant", "fault.per_fault_ns")
        .str("note",
             "never-touched managed pages (fresh allocation every rep, populated on the GPU by the fault, no "
             "migration); per_fault_ns = (window(W) - window(1)) / (W - 1) for the largest W served by one replay");
  }
  r.num("page_stride_bytes", double(stride)).num("resume_gap_threshold_ns", kResumeGapNs).raw("by_warps", jarr_raw(per_w));
  results.obj(name, r);
}

// ---------------------------------------------------------------------------------------------
// stalled_warps_do_not_block_issue

static void measure_stalled_warps(Obj& results, const Device& dev) {
  const char* name = "stalled_warps_do_not_block_issue";
  const uint32_t blocks = uint32_t(dev.sms);
  const uint32_t fault_warps = blocks * kStallFaultWarps;
  const size_t stride = std::max(kPage, size_t(dev.host_page));
  // Each fault warp owns a region of 2k pages and faults on its first k, one after the other: at
  // most half of any 64 KiB / 2 MiB region is ever touched, which keeps the driver's prefetcher
  // (threshold 51%) from migrating pages ahead of the faults.
  uint32_t per_warp = 8;
  while (per_warp > 1 && size_t(fault_warps) * 2 * per_warp * stride > (size_t(36) << 20)) per_warp /= 2;
  const uint32_t region = 2 * per_warp;
  const size_t bytes = size_t(fault_warps) * region * stride;
  uint8_t* pages = nullptr;
  CK(cudaMallocManaged(&pages, bytes));
  const uint32_t threads = 32 * (kStallFaultWarps + kStallComputeWarps);
  DevBuf<uint64_t> fault_rec(size_t(fault_warps) * per_warp * 2), comp_rec(size_t(blocks) * kStallComputeWarps * 4);
  DevBuf<uint32_t> sink(fault_warps);
  DevBuf<float> fsink(size_t(blocks) * threads);
  auto touch_all = [&](uint32_t v) {
    for (uint32_t g = 0; g < fault_warps; ++g) cpu_touch(pages + size_t(g) * region * stride, stride, per_warp, v);
  };
  auto run = [&](int faults_on, uint32_t iters) {
    stall_issue_kernel<<<blocks, threads>>>(pages, stride, per_warp, region, faults_on, iters, g_m, g_c, fault_rec.p,
                                            comp_rec.p, sink.p, fsink.p);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
  };
  const size_t ncomp = size_t(blocks) * kStallComputeWarps;

  // Compute speed alone, and how long the fault warps stay stalled with no compute beside them.
  const uint32_t probe_iters = 2000;
  run(0, probe_iters);
  run(0, probe_iters);
  auto cr = comp_rec.get(ncomp * 4);
  std::vector<double> t;
  for (size_t i = 0; i < ncomp; ++i) t.push_back(double(cr[4 * i + 1] - cr[4 * i]));
  const double ns_per_iter = median_of(t) / probe_iters;
  std::vector<double> phase;
  for (int rep = 0; rep < 2; ++rep) {
    touch_all(100 + rep);
    run(1, 0);
  }
  auto fr = fault_rec.get(size_t(fault_warps) * per_warp * 2);
  for (uint32_t g = 0; g < fault_warps; ++g) phase.push_back(double(fr[size_t(g) * per_warp * 2 + 2 * (per_warp - 1) + 1] - fr[size_t(g) * per_warp * 2]));
  const double phase_p10 = stats_of(phase).p10;
  if (!(phase_p10 > 0) || !(ns_per_iter > 0)) fail(std::string(name) + ": no fault phase or compute speed measured");
  // Compute for 60% of the shortest fault phases, so it runs inside the stalls.
  const uint32_t iters = std::max<uint32_t>(16, uint32_t(0.6 * phase_p10 / ns_per_iter));
  printf("[%s] %u blocks x (%d fault warps x %u pages, %d compute warps); fault phase p10 %.0f us; compute %u iterations (~%.0f us alone)\n",
         name, blocks, kStallFaultWarps, per_warp, kStallComputeWarps, phase_p10 / 1000, iters, iters * ns_per_iter / 1000);

  std::vector<double> ratio_cycles, ratio_ns, alone_us, stalled_us, cover_sibling, cover_any, cover_sibling_p10;
  for (int rep = 0; rep < kReps; ++rep) {
    run(0, iters);
    cr = comp_rec.get(ncomp * 4);
    std::vector<double> a_cyc, a_ns;
    for (size_t i = 0; i < ncomp; ++i) {
      a_ns.push_back(double(cr[4 * i + 1] - cr[4 * i]));
      a_cyc.push_back(double(cr[4 * i + 3] - cr[4 * i + 2]));
    }
    touch_all(uint32_t(rep + 1));
    run(1, iters);
    cr = comp_rec.get(ncomp * 4);
    fr = fault_rec.get(size_t(fault_warps) * per_warp * 2);
    std::vector<double> s_cyc, s_ns, cov_sib, cov_any;
    for (uint32_t b = 0; b < blocks; ++b) {
      // Union of the block's fault-stall intervals, for the "any fault warp stalled" coverage.
      std::vector<std::pair<double, double>> iv;
      for (int f = 0; f < kStallFaultWarps; ++f)
        for (uint32_t k = 0; k < per_warp; ++k) {
          const size_t at = (size_t(b) * kStallFaultWarps + f) * per_warp * 2 + 2 * k;
          iv.push_back({double(fr[at]), double(fr[at + 1])});
        }
      std::sort(iv.begin(), iv.end());
      std::vector<std::pair<double, double>> uni;
      for (auto& x : iv) {
        if (!uni.empty() && x.first <= uni.back().second)
          uni.back().second = std::max(uni.back().second, x.second);
        else
          uni.push_back(x);
      }
      for (int j = 0; j < kStallComputeWarps; ++j) {
        const size_t i = size_t(b) * kStallComputeWarps + j;
        const double g0 = double(cr[4 * i]), g1 = double(cr[4 * i + 1]);
        s_ns.push_back(g1 - g0);
        s_cyc.push_back(double(cr[4 * i + 3] - cr[4 * i + 2]));
        // The fault warp on the same scheduler: warp (kStallFaultWarps + j) % 4.
        const int f = (kStallFaultWarps + j) % 4;
        double sib = 0, any = 0;
        for (uint32_t k = 0; k < per_warp; ++k) {
          const size_t at = (size_t(b) * kStallFaultWarps + f) * per_warp * 2 + 2 * k;
          sib += overlap(g0, g1, double(fr[at]), double(fr[at + 1]));
        }
        for (auto& u : uni) any += overlap(g0, g1, u.first, u.second);
        cov_sib.push_back(sib / std::max(1.0, g1 - g0));
        cov_any.push_back(any / std::max(1.0, g1 - g0));
      }
    }
    ratio_cycles.push_back(median_of(s_cyc) / median_of(a_cyc));
    ratio_ns.push_back(median_of(s_ns) / median_of(a_ns));
    alone_us.push_back(median_of(a_ns) / 1000);
    stalled_us.push_back(median_of(s_ns) / 1000);
    const Stats cs = stats_of(cov_sib);
    cover_sibling.push_back(cs.median);
    cover_sibling_p10.push_back(cs.p10);
    cover_any.push_back(median_of(cov_any));
  }
  CK(cudaFree(pages));
  const double ratio = median_of(ratio_cycles);
  printf("[%s] compute time beside stalled warps / alone: %.4f (cycles), %.4f (ns); alone %.1f us; compute time covered by the same-scheduler warp's stall: median %.2f, p10 %.2f\n",
         name, ratio, median_of(ratio_ns), median_of(alone_us), median_of(cover_sibling), median_of(cover_sibling_p10));
  Obj r;
  r.null("constant")
      .str("note",
           "checks the model's assumption that a fault-stalled warp takes no issue slots (ratio ~1.0); coverage = "
           "share of each compute warp's interval during which the fault warp on its scheduler was stalled")
      .num("ratio_cycles", ratio)
      .num("ratio_ns", median_of(ratio_ns))
      .num("compute_alone_us", median_of(alone_us))
      .num("compute_beside_stalls_us", median_of(stalled_us))
      .num("coverage_same_scheduler_median", median_of(cover_sibling))
      .num("coverage_same_scheduler_p10", median_of(cover_sibling_p10))
      .num("coverage_any_fault_warp_median", median_of(cover_any))
      .num("blocks", blocks)
      .num("fault_warps_per_block", kStallFaultWarps)
      .num("compute_warps_per_block", kStallComputeWarps)
      .num("pages_per_fault_warp", per_warp)
      .num("compute_iterations", iters)
      .num("fma_per_iteration", kFmaPerIter)
      .stats("fault_phase_ns", stats_of(phase))
      .arr("reps_ratio_cycles", ratio_cycles)
      .arr("reps_ratio_ns", ratio_ns)
      .arr("reps_alone_us", alone_us)
      .arr("reps_beside_stalls_us", stalled_us)
      .arr("reps_coverage_same_scheduler_median", cover_sibling)
      .arr("reps_coverage_same_scheduler_p10", cover_sibling_p10)
      .arr("reps_coverage_any_median", cover_any);
  results.obj(name, r);
}

// ---------------------------------------------------------------------------------------------
// poll_issue_weight
//
// Model (emu/src/sim/sm.rs): each computing warp of an SM runs at
//   min(warp_ipc, schedulers / (computing + issue_weight * polling))  instructions per cycle.
// When compute is issue-bound the second term applies, so with c compute and p polling warps per
// SM the compute time grows by  slowdown = (c + w * p) / c,  hence  w = (slowdown - 1) * c / p.
// The compute warps here are issue-bound: 8 independent FMA chains each, two warps per scheduler,
// i.e. at least 16 FMAs in flight per scheduler against a ~4-cycle FMA latency (checked below:
// the SM's FMA throughput with 8 compute warps per SM must match the one with 12). The fma
// co-runner mode validates the formula: co-runners that issue like compute warps must give w ~ 1.

static void measure_poll(Obj& results, const Device& dev) {
  const char* name = "poll_issue_weight";
  const uint32_t blocks = uint32_t(dev.sms);
  const int nc = 8, np = 4;  // per SM: 2 compute warps and 1 polling warp per scheduler
  const int max_warps = 12;
  DevBuf<uint64_t> comp_rec(size_t(blocks) * max_warps * 4), poll_rec(size_t(blocks) * max_warps * 2);
  DevBuf<float> fsink(size_t(blocks) * max_warps * 32);
  DevBuf<uint32_t> status(1), dev_flags(size_t(blocks) * 32);
  uint32_t* managed_flags = nullptr;
  CK(cudaMallocManaged(&managed_flags, size_t(blocks) * 32 * sizeof(uint32_t)));
  uint32_t* pinned_host = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_host), size_t(blocks) * 32 * sizeof(uint32_t), cudaHostAllocMapped));
  uint32_t* pinned_dev = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&pinned_dev), pinned_host, 0));

  // Returns per compute warp {ns, cycles}, and the share of each compute interval covered by
  // every poller of its block.
  struct Run {
    std::vector<double> ns, cyc, coverage;
  };
  auto run = [&](int mode, int compute_warps, int pollers, uint32_t iters) {
    uint32_t* flags = dev_flags.p;
    const size_t nflags = size_t(blocks) * 32;
    if (mode == kPollManaged || mode == kPollManagedAtomic) {
      flags = managed_flags;
      fill_kernel<<<uint32_t((nflags + 255) / 256), 256>>>(flags, nflags, 0);  // keeps the flags GPU-resident
      CK_LAUNCH();
    } else if (mode == kPollPinned) {
      flags = pinned_dev;
      memset(pinned_host, 0, nflags * sizeof(uint32_t));
    } else {
      CK(cudaMemset(flags, 0, nflags * sizeof(uint32_t)));
    }
    CK(cudaMemset(status.p, 0, sizeof(uint32_t)));
    poll_kernel<<<blocks, 32 * (compute_warps + pollers)>>>(mode, flags, compute_warps, iters, g_m, g_c, comp_rec.p,
                                                            poll_rec.p, fsink.p, status.p);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    if (status.get(1)[0] != 0) fail(std::string(name) + ": a polling warp timed out (flag write never seen)");
    const auto cr = comp_rec.get(size_t(blocks) * compute_warps * 4);
    const auto pr = poll_rec.get(size_t(blocks) * std::max(pollers, 1) * 2);
    Run out;
    for (uint32_t b = 0; b < blocks; ++b)
      for (int j = 0; j < compute_warps; ++j) {
        const size_t i = size_t(b) * compute_warps + j;
        const double g0 = double(cr[4 * i]), g1 = double(cr[4 * i + 1]);
        out.ns.push_back(g1 - g0);
        out.cyc.push_back(double(cr[4 * i + 3] - cr[4 * i + 2]));
        if (mode != kPollNone) {
          double cov = 1.0;
          for (int q = 0; q < pollers; ++q) {
            const size_t p = size_t(b) * pollers + q;
            cov = std::min(cov, overlap(g0, g1, double(pr[2 * p]), double(pr[2 * p + 1])) / std::max(1.0, g1 - g0));
          }
          out.coverage.push_back(cov);
        }
      }
    return out;
  };

  // Iterations for ~2 ms of compute.
  run(kPollNone, nc, np, 200);
  const Run probe = run(kPollNone, nc, np, 2000);
  if (!(median_of(probe.ns) > 0)) fail(std::string(name) + ": no compute speed measured");
  const uint32_t iters = std::max<uint32_t>(100, uint32_t(2.0e6 / (median_of(probe.ns) / 2000)));

  // Issue-bound check: SM FMA throughput (lane FMAs per cycle) with 4, 8 and 12 compute warps.
  Obj bound;
  double thr8 = 0, thr12 = 0;
  for (int c : {4, 8, 12}) {
    std::vector<double> thr;
    for (int rep = 0; rep < 3; ++rep) {
      const Run r = run(kPollNone, c, 0, iters / 2);
      thr.push_back(double(c) * 32 * kFmaPerIter * (iters / 2) / median_of(r.cyc));
    }
    const double t = median_of(thr);
    if (c == 8) thr8 = t;
    if (c == 12) thr12 = t;
    bound.num("fma_lanes_per_cycle_per_sm_" + std::to_string(c) + "_warps", t);
  }
  const bool issue_bound = thr8 >= 0.97 * thr12;
  bound.boolean("issue_bound", issue_bound);
  printf("[%s] compute: %d warps/SM x %d FMA/iteration x %u iterations; SM FMA lanes/cycle: %s -> issue-bound with %d warps: %s\n",
         name, nc, kFmaPerIter, iters, bound.json().c_str(), nc, issue_bound ? "yes" : "NO");

  struct ModeDef {
    int mode;
    const char* key;
  };
  const ModeDef modes[] = {{kPollNone, "none_again"},
                           {kPollManaged, "managed_tight"},
                           {kPollPinned, "pinned_tight"},
                           {kPollNanosleep, "device_nanosleep_backoff"},
                           {kPollManagedAtomic, "managed_atomic_tight"},
                           {kPollFmaCorunner, "fma_corunner"}};
  Obj per_mode;
  double weight_managed = NAN, weight_fma = NAN;
  for (const ModeDef& md : modes) {
    std::vector<double> slow, slow_ns, cover;
    for (int rep = -1; rep < kReps; ++rep) {
      const Run alone = run(kPollNone, nc, np, iters);
      const Run with = run(md.mode, nc, np, iters);
      if (rep < 0) continue;
      slow.push_back(median_of(with.cyc) / median_of(alone.cyc));
      slow_ns.push_back(median_of(with.ns) / median_of(alone.ns));
      if (!with.coverage.empty()) cover.push_back(stats_of(with.coverage).min);
    }
    const double s = median_of(slow);
    const double w = (s - 1.0) * nc / np;
    if (md.mode == kPollManaged) weight_managed = w;
    if (md.mode == kPollFmaCorunner) weight_fma = w;
    printf("[%s] %-26s slowdown %.4f (cycles) %.4f (ns) -> weight %.4f; min coverage %.3f\n", name, md.key, s,
           median_of(slow_ns), w, cover.empty() ? 1.0 : median_of(cover));
    Obj o;
    o.num("slowdown_cycles", s)
        .num("slowdown_ns", median_of(slow_ns))
        .num("issue_weight", w)
        .arr("reps_slowdown_cycles", slow)
        .arr("reps_slowdown_ns", slow_ns)
        .arr("reps_min_coverage", cover);
    per_mode.obj(md.key, o);
  }
  printf("[%s] issue_weight = (slowdown - 1) * c / p with c=%d compute, p=%d polling warps per SM (issue-bound compute: %s); managed tight loop: %.4f; validation with co-running compute warps (expect ~1): %.3f\n",
         name, nc, np, issue_bound ? "yes" : "NO", weight_managed, weight_fma);
  CK(cudaFree(managed_flags));
  CK(cudaFreeHost(pinned_host));
  Obj r;
  r.str("constant", "poll.issue_weight")
      .str("note",
           "w = (slowdown - 1) * c / p, slowdown = compute time with p polling warps per SM / without, c compute "
           "warps per SM, issue-bound compute; value = managed_tight (flag in device-resident managed memory)")
      .num("value", weight_managed)
      .num("compute_warps_per_sm", nc)
      .num("polling_warps_per_sm", np)
      .num("compute_iterations", iters)
      .num("fma_per_iteration", kFmaPerIter)
      .obj("issue_bound_check", bound)
      .num("validation_weight_fma_corunner", weight_fma)
      .obj("modes", per_mode);
  results.obj(name, r);
}

// ---------------------------------------------------------------------------------------------
// mapped_poll_round_trip

static void measure_round_trip(Obj& results) {
  const char* name = "mapped_poll_round_trip";
  uint32_t* host = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&host), 4096, cudaHostAllocMapped));
  memset(host, 0, 4096);
  uint32_t* devp = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&devp), host, 0));
  // Words on separate 128-byte lines: h2d at 0, d2h at 32, status at 64.
  volatile uint32_t* h2d = host;
  volatile uint32_t* d2h = host + 32;
  volatile uint32_t* st = host + 64;
  const uint32_t warmup = 1000, n = 20000;
  echo_kernel<<<1, 32>>>(devp, devp + 32, warmup + n, devp + 64);
  CK_LAUNCH();
  std::vector<double> rtt;
  rtt.reserve(n);
  for (uint32_t i = 1; i <= warmup + n; ++i) {
    const double t0 = host_ns();
    *h2d = i;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    uint64_t spins = 0;
    while (*d2h != i) {
      if ((++spins & 0xfff) == 0 && (host_ns() - t0 > 2e9 || *st != 0)) {
        cudaDeviceSynchronize();
        fail(std::string(name) + ": the GPU did not echo value " + std::to_string(i));
      }
    }
    const double t1 = host_ns();
    if (i > warmup) rtt.push_back(t1 - t0);
  }
  CK(cudaDeviceSynchronize());
  if (*st != 0) fail(std::string(name) + ": the echo kernel timed out");

  // Cross-check: the GPU's own read latency of a pinned host word (one PCIe read round trip).
  const int reads = 2000;
  DevBuf<uint64_t> lat(reads);
  DevBuf<uint32_t> sink(1);
  pinned_read_kernel<<<1, 32>>>(devp + 96, reads, sink.p, lat.p);
  CK_LAUNCH();
  CK(cudaDeviceSynchronize());
  const auto l = lat.get(reads);
  std::vector<double> read_ns(l.begin() + 100, l.end());
  CK(cudaFreeHost(host));

  const Stats s = stats_of(rtt), rd = stats_of(read_ns);
  printf("[%s] host->GPU->host round trip: median %.0f ns (p10 %.0f, p90 %.0f, min %.0f) -> one way %.0f ns; GPU read of pinned host word: median %.0f ns\n",
         name, s.median, s.p10, s.p90, s.min, s.median / 2, rd.median);
  Obj r;
  r.str("constant", "link.pcie_latency_ns")
      .str("note",
           "host writes a counter to pinned mapped memory, one GPU thread spinning on it (volatile loads) echoes it "
           "to another pinned word the host spins on; value = median round trip / 2")
      .num("value", s.median / 2)
      .num("iterations", n)
      .stats("round_trip_ns", s)
      .stats("gpu_read_pinned_word_ns", rd);
  results.obj(name, r);
}

// ---------------------------------------------------------------------------------------------
// pcie_copy and host_memcpy (share the 256 MiB pinned buffer)

static void measure_copies(Obj& results) {
  const size_t bytes = size_t(256) << 20;
  uint8_t* pinned = nullptr;
  CK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), bytes, cudaHostAllocDefault));
  memset(pinned, 1, bytes);
  uint8_t* d = nullptr;
  CK(cudaMalloc(&d, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto copy_gbps = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(dst, src, bytes, kind, 0));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return double(bytes) / (double(ms) * 1e6);  // GB/s = bytes per ns
  };
  std::vector<double> h2d, d2h;
  for (int rep = -1; rep < kReps; ++rep) {
    const double a = copy_gbps(d, pinned, cudaMemcpyHostToDevice);
    const double b = copy_gbps(pinned, d, cudaMemcpyDeviceToHost);
    if (rep < 0) continue;
    h2d.push_back(a);
    d2h.push_back(b);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(d));
  printf("[pcie_copy] 256 MiB pinned: H2D %.2f GB/s, D2H %.2f GB/s (medians)\n", median_of(h2d), median_of(d2h));
  Obj pc;
  pc.str("constant", "link.pcie_gbps")
      .str("note", "cudaMemcpy of 256 MiB from/to pinned host memory, CUDA events; value = H2D median, GB/s = 1e9 B/s")
      .num("value", median_of(h2d))
      .num("bytes", double(bytes))
      .num("h2d_gbps", median_of(h2d))
      .num("d2h_gbps", median_of(d2h))
      .arr("reps_h2d_gbps", h2d)
      .arr("reps_d2h_gbps", d2h);
  results.obj("pcie_copy", pc);

  // Single-thread memcpy of 64 KiB chunks into the pinned buffer.
  const size_t chunk = 64 << 10, src_bytes = size_t(64) << 20, total = size_t(1) << 30;
  std::vector<uint8_t> src(src_bytes);
  for (size_t i = 0; i < src_bytes; ++i) src[i] = uint8_t(i * 31);
  auto copy_run = [&](bool hot_source) {
    const double t0 = host_ns();
    for (size_t done = 0; done < total; done += chunk) {
      const size_t s_off = hot_source ? 0 : done % src_bytes;
      memcpy(pinned + done % bytes, src.data() + s_off, chunk);
    }
    const double t1 = host_ns();
    return double(total) / (t1 - t0);
  };
  std::vector<double> stream, hot;
  for (int rep = -1; rep < 5; ++rep) {
    const double a = copy_run(false), b = copy_run(true);
    if (rep < 0) continue;
    stream.push_back(a);
    hot.push_back(b);
  }
  unsigned checksum = 0;
  for (size_t i = 0; i < bytes; i += 4096) checksum += pinned[i];
  CK(cudaFreeHost(pinned));
  printf("[host_memcpy] 64 KiB chunks into pinned memory: %.2f GB/s streaming source, %.2f GB/s cache-hot source (checksum %u)\n",
         median_of(stream), median_of(hot), checksum);
  Obj hm;
  hm.str("constant", "host.memcpy_gbps")
      .str("note",
           "one thread, memcpy of 64 KiB chunks into a 256 MiB pinned buffer (1 GiB per rep); value = streaming "
           "source (64 MiB, beyond the caches); hot = the same 64 KiB source chunk every time")
      .num("value", median_of(stream))
      .num("chunk_bytes", double(chunk))
      .num("streaming_gbps", median_of(stream))
      .num("hot_source_gbps", median_of(hot))
      .arr("reps_streaming_gbps", stream)
      .arr("reps_hot_source_gbps", hot);
  results.obj("host_memcpy", hm);
}

// ---------------------------------------------------------------------------------------------
// cpu_fault_on_gpu_page

static void measure_cpu_fault(Obj& results, const Device& dev) {
  const char* name = "cpu_fault_on_gpu_page";
  const uint32_t n = 1024;
  const size_t stride = std::max(kPage, size_t(dev.host_page));
  uint8_t* pages = nullptr;
  CK(cudaMallocManaged(&pages, size_t(n) * stride));
  memset(pages, 0, size_t(n) * stride);
  std::vector<double> all, rep_medians, rep_means;
  for (int rep = -1; rep < 5; ++rep) {
    write_pages_kernel<<<(n + 255) / 256, 256>>>(pages, stride, 0, 1, n);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    std::vector<double> t(n);
    for (uint32_t i = 0; i < n; ++i) {
      volatile uint8_t* q = pages + size_t(i) * stride;
      const double t0 = host_ns();
      *q = uint8_t(rep + 7);
      const double t1 = host_ns();
      t[i] = t1 - t0;
    }
    if (rep < 0) continue;
    all.insert(all.end(), t.begin(), t.end());
    const Stats s = stats_of(t);
    rep_medians.push_back(s.median);
    rep_means.push_back(s.mean);
  }
  // Isolated: the GPU writes one page, then the CPU writes it; 64 trials over pages far apart.
  std::vector<double> isolated;
  for (int trial = 0; trial < 64 + 4; ++trial) {
    const uint32_t page = uint32_t(trial % 16) * 64 + uint32_t(trial / 16);
    write_pages_kernel<<<1, 32>>>(pages, stride, page, 1, 1);
    CK_LAUNCH();
    CK(cudaDeviceSynchronize());
    volatile uint8_t* q = pages + size_t(page) * stride;
    const double t0 = host_ns();
    *q = uint8_t(trial);
    const double t1 = host_ns();
    if (trial >= 4) isolated.push_back(t1 - t0);
  }
  CK(cudaFree(pages));
  const Stats s = stats_of(all), iso = stats_of(isolated);
  size_t fast = 0;
  for (double x : all) fast += x < 1000.0;
  const double fast_share = double(fast) / double(all.size());
  printf("[%s] CPU write to a GPU-resident page: median %.0f ns (p10 %.0f, p90 %.0f, mean %.0f); %.1f%% under 1 us; isolated page: median %.0f ns\n",
         name, s.median, s.p10, s.p90, s.mean, 100 * fast_share, iso.median);
  Obj r;
  r.str("constant", "fault.cpu_fault_ns")
      .str("note",
           "a kernel writes 1024 managed pages (GPU-resident), then the CPU writes one byte per page, each timed "
           "with steady_clock; value = median; isolated = one page written by the GPU then by the CPU")
      .num("value", s.median)
      .num("pages", n)
      .num("share_under_1us", fast_share)
      .stats("per_page_ns", s)
      .arr("reps_median_ns", rep_medians)
      .arr("reps_mean_ns", rep_means)
      .stats("isolated_ns", iso);
  results.obj(name, r);
}

// ---------------------------------------------------------------------------------------------

static std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "calibration-results.json";
  signal(SIGALRM, watchdog);
  alarm(300);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const double started = host_ns();
  const std::string started_utc = utc_now();

  Device dev = query_device();
  printf("calibrate: %s (sm_%d%d, %d SMs, %d threads/SM), driver %s, CUDA driver API %d, runtime %d, host page %ld B\n",
         dev.name.c_str(), dev.cc_major, dev.cc_minor, dev.sms, dev.max_threads_per_sm, dev.driver.c_str(),
         dev.cuda_driver_api, dev.cuda_runtime, dev.host_page);
  printf("calibrate: UVM parameters: %s\n", dev.uvm_params.json().c_str());
  if (dev.cc_major != 9) fail("built for sm_90 (Hopper); this device is sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor));
  if (!dev.concurrent_managed)
    fail("concurrentManagedAccess is 0: managed memory does not fault on demand here, the fault measurements would be meaningless");
  CK(cudaFree(nullptr));  // context

  Obj results;
  const TimerInfo ti = measure_timer(results);
  measure_fault_first_touch(results, dev, true);
  measure_fault_first_touch(results, dev, false);
  measure_stalled_warps(results, dev);
  measure_poll(results, dev);
  measure_round_trip(results);
  measure_copies(results);
  measure_cpu_fault(results, dev);

  const double elapsed_s = (host_ns() - started) / 1e9;
  Obj device;
  device.str("name", dev.name)
      .str("driver_version", dev.driver)
      .str("uvm_version", dev.uvm_version)
      .num("cuda_driver_api_version", dev.cuda_driver_api)
      .num("cuda_runtime_version", dev.cuda_runtime)
      .str("compute_capability", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor))
      .num("sms", dev.sms)
      .num("max_threads_per_sm", dev.max_threads_per_sm)
      .num("warp_slots_per_sm", dev.max_threads_per_sm / 32)
      .num("max_blocks_per_sm", dev.max_blocks_per_sm)
      .num("concurrent_managed_access", dev.concurrent_managed)
      .num("pageable_memory_access", dev.pageable_access)
      .num("host_page_bytes", double(dev.host_page))
      .num("sm_clock_ghz_measured", ti.clock_ghz)
      .obj("uvm_parameters", dev.uvm_params);
  Obj top;
  top.str("schema", "wic-calibration-results/1")
      .str("program", "device/bench/calibrate.cu")
      .str("date_utc", started_utc)
      .num("elapsed_s", elapsed_s)
      .num("reps", kReps)
      .obj("device", device)
      .obj("results", results);
  std::ofstream f(out_path);
  if (!f) fail("cannot write " + out_path);
  f << top.json() << "\n";
  f.close();
  if (!f) fail("cannot write " + out_path);
  printf("calibrate: done in %.1f s; results in %s\n", elapsed_s, out_path.c_str());
  return 0;
}
