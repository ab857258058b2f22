// Standalone check and benchmark of the qsa_topk kernels (no torch): exactness against a CPU
// reference on fresh random inputs (heavy ties, NaNs of several payloads, both zeros, infinities,
// k = L, small L, rows > 1, L up to 2^20, adversarial layouts), then medians of CUDA-graph replays
// like `qgate bench ops` (one graph holds one call per input set, the sets together over the 60 MiB
// L2, so every call reads its row from device memory), then per-phase clocks when built with
// -DQGATE_TOPK_PHASES.
//
// Build (repository root): nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I kernels_ext/csrc \
//   kernels_ext/tools/topk_bench.cu -o topk_bench   [-DQGATE_TOPK_PHASES for the phase table]
// Run: ./topk_bench [--check] [--time] [--phases] [--reps N]   (default: all three)
// Exit status 1 on any mismatch or CUDA error.
#include "../csrc/qsa_topk.cu"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using qgate::TopkPlan;

void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error %s at line %d: %s\n", cudaGetErrorString(e), line, what);
    std::exit(1);
  }
}
#define CK(x) check((x), #x, __LINE__)

// ---------------------------------------------------------------- implementations under test
enum Kind { kGrid, kCluster, kPush, kPushPdl };
struct Impl {
  const char* name;
  Kind kind;
  int nt, items, max_cluster;
};

template <int NT, int ITEMS>
cudaError_t launch_tc(const float* s, int64_t rows, int64_t len, int k, int max_cluster, float* v, int64_t* ix,
                      cudaStream_t st) {
  static bool ready = false;
  const auto kernel = qgate::qsa_topk_cluster_kernel<NT, ITEMS>;
  if (!ready) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(qgate::tc_smem_bytes(qgate::kTopkMaxK))));
    ready = true;
  }
  const int c = qgate::tc_cluster_size(len, max_cluster, static_cast<int64_t>(NT) * ITEMS, ITEMS);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config =
      qgate::tc_launch_config(rows * c, NT, qgate::tc_smem_bytes(k), c, false, st, attr);
  return cudaLaunchKernelEx(&config, kernel, s, len, k, c, v, ix);
}

cudaError_t launch_tp(const float* s, int64_t rows, int64_t len, int k, int max_cluster, bool pdl, float* v,
                      int64_t* ix, cudaStream_t st) {
  static bool ready = false;
  const auto kernel = qgate::qsa_topk_push_kernel<8>;
  if (!ready) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(qgate::kTpSmemBytes)));
    ready = true;
  }
  static int sms = 0;
  if (sms == 0) CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int c = qgate::tp_cluster_size(rows, len, max_cluster, sms);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config =
      qgate::tc_launch_config(rows * c, qgate::kTpThreads, qgate::kTpSmemBytes, c, pdl, st, attr);
  return cudaLaunchKernelEx(&config, kernel, s, len, k, c, v, ix);
}

// One call; the grid path's workspace memset is part of the call (as in ops_cuda.cpp).
struct Runner {
  void* ws = nullptr;
  size_t ws_bytes = 0;
  Runner() {  // allocated here: no allocation may happen under graph capture
    ws_bytes = 256u << 20;
    CK(cudaMalloc(&ws, ws_bytes));
  }
  void call(const Impl& im, const float* s, int64_t rows, int64_t len, int k, float* v, int64_t* ix,
            cudaStream_t st) {
    switch (im.kind) {
      case kGrid: {
        TopkPlan plan{};
        CK(qgate::plan_qsa_topk(rows, len, k, 0, &plan));
        if (plan.cluster != 0) {
          std::fprintf(stderr, "grid plan picked the cluster path (QGATE_TOPK_IMPL?)\n");
          std::exit(1);
        }
        if (plan.workspace_bytes > ws_bytes) {
          std::fprintf(stderr, "grid workspace of %zu bytes over the preallocated %zu\n", plan.workspace_bytes,
                       ws_bytes);
          std::exit(1);
        }
        CK(cudaMemsetAsync(ws, 0, plan.workspace_bytes, st));
        CK(qgate::launch_qsa_topk(s, rows, len, k, plan, ws, v, ix, st));
        break;
      }
      case kPush:
      case kPushPdl:
        CK(launch_tp(s, rows, len, k, im.max_cluster, im.kind == kPushPdl, v, ix, st));
        break;
      case kCluster:
        if (im.nt == 1024 && im.items == 8) {
          CK((launch_tc<1024, 8>(s, rows, len, k, im.max_cluster, v, ix, st)));
        } else {  // (512 x 16 and 256 x 32 were slower: BENCH.md)
          std::fprintf(stderr, "no instantiation %dx%d\n", im.nt, im.items);
          std::exit(1);
        }
        break;
    }
    CK(cudaGetLastError());
  }
};

const Impl kImpls[] = {
    {"grid", kGrid, 256, 8, 0},
    {"push1024x8", kPush, 1024, 8, 16},
    {"push1024x8pdl", kPushPdl, 1024, 8, 16},
    {"tc1024x8", kCluster, 1024, 8, 16},
};

// ---------------------------------------------------------------- CPU reference
uint32_t key_host(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f != f) return 0xffffffffu;
  if ((u << 1) == 0) return 0x80000000u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The first k of a stable sort by (key desc, index asc): composite key << 32 | ~index, descending.
void reference(const std::vector<float>& x, int64_t rows, int64_t len, int k, std::vector<uint32_t>& vbits,
               std::vector<int64_t>& idx) {
  vbits.assign(rows * k, 0);
  idx.assign(rows * k, 0);
  std::vector<uint64_t> comp(len);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < len; ++i)
      comp[i] = (static_cast<uint64_t>(key_host(x[r * len + i])) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
    std::partial_sort(comp.begin(), comp.begin() + k, comp.end(), std::greater<uint64_t>());
    for (int j = 0; j < k; ++j) {
      const int64_t i = 0xffffffffu - static_cast<uint32_t>(comp[j] & 0xffffffffu);
      idx[r * k + j] = i;
      std::memcpy(&vbits[r * k + j], &x[r * len + i], 4);
    }
  }
}

// ---------------------------------------------------------------- inputs
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> make_input(const std::string& dist, int64_t rows, int64_t len, std::mt19937_64& rng) {
  std::vector<float> x(rows * len);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int64_t> pos(0, rows * len - 1);
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu, 0x7fa00000u};
  for (auto& v : x) v = nd(rng);
  if (dist == "ties" || dist == "nanheavy") {
    for (auto& v : x) v = std::round(v * 2.f) / 2.f;
    const int64_t stride = std::max<int64_t>(1, len / 7);
    int n = 0;
    for (int64_t i = 0; i < rows * len; i += stride) x[i] = from_bits(nans[n++ % 6]);
    for (int j = 0; j < 64; ++j) {
      x[pos(rng)] = -0.0f;
      x[pos(rng)] = 0.0f;
      x[pos(rng)] = INFINITY;
      x[pos(rng)] = -INFINITY;
    }
    if (dist == "nanheavy")
      for (int64_t i = 0; i < rows * len; ++i)
        if (rng() % 2) x[i] = from_bits(nans[rng() % 6]);
  } else if (dist == "quarter") {  // as `qgate bench ops` draws its tie rows: steps of 0.25
    for (auto& v : x) v = std::round(v * 4.f) / 4.f;
  } else if (dist == "lumpy") {  // large cells of one key beside one of many keys, dense and not
    for (auto& v : x) {
      const uint32_t r = static_cast<uint32_t>(rng());
      const uint32_t pick = r % 10000;
      uint32_t bits = 0x3f000000u | ((r >> 10) & 0x7fffffu);  // below 1
      if (pick < 100) {                                         // two values, 0.5 % each
        bits = 0x3f800000u | ((0x80u + 0x10u * (pick % 2)) << 8);
      } else if (pick < 140) {  // one byte-2 bin of many keys, 0.4 %
        bits = 0x3f800000u | (0x50u << 8) | ((r >> 12) & 255u);
      } else if (pick < 155) {  // one value, 0.15 %
        bits = 0x3f800000u | (0x70u << 8);
      } else if (pick < 8000) {  // below those: byte 2 under 0x40
        bits = 0x3f800000u | ((r >> 10) & 0x3fffu);
      }
      v = from_bits(bits);
    }
  } else if (dist == "narrow") {  // one value of the top 16 key bits: the passes split late
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    for (auto& v : x) v = 1.0f + ud(rng) / 256.f;
  } else if (dist == "allequal") {
    for (auto& v : x) v = 1.5f;
  } else if (dist == "zeros") {  // mostly signed zeros, a few of each sign around them
    for (auto& v : x) v = (rng() % 2) ? 0.0f : -0.0f;
    for (int j = 0; j < 500; ++j) x[pos(rng)] = nd(rng);
  } else if (dist == "ascending" || dist == "descending") {  // top-k all in the last / first block, ties
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < len; ++i) {
        const int64_t j = dist == "ascending" ? i : len - 1 - i;
        x[r * len + i] = static_cast<float>(j / 3) * 0.25f - 100.f;
      }
  }
  return x;
}

struct Case {
  int64_t rows, len;
  int k;
  const char* dist;
};
const Case kCases[] = {
    {1, 131072, 2048, "normal"},   {1, 131072, 2048, "ties"},      {4, 131072, 2048, "ties"},
    {3, 257, 257, "normal"},       {3, 257, 257, "ties"},          {3000, 512, 16, "ties"},
    {1, 1 << 20, 64, "normal"},    {1, 1 << 20, 4096, "ties"},     {8, 32768, 1024, "normal"},
    {8, 32768, 1024, "ties"},      {2, 5000, 4096, "allequal"},    {1, 131072, 4096, "ascending"},
    {1, 131072, 2048, "descending"}, {5, 10001, 777, "ties"},      {1, 8193, 1, "normal"},
    {2, 4096, 100, "nanheavy"},    {1, 131072, 3000, "zeros"},     {1, 200000, 2048, "normal"},
    {7, 1, 1, "normal"},           {2, 4099, 4096, "ties"},       {1, 131072, 2048, "quarter"},
    {8, 32768, 1024, "quarter"},   {1, 131072, 2048, "narrow"},    {2, 65536, 3000, "narrow"},
    {1, 131072, 2048, "lumpy"},    {3, 65536, 1500, "lumpy"},
};

int run_checks(Runner& run, std::mt19937_64& rng) {
  int bad = 0;
  cudaStream_t st = 0;
  for (const Case& c : kCases) {
    const std::vector<float> x = make_input(c.dist, c.rows, c.len, rng);
    std::vector<uint32_t> rv;
    std::vector<int64_t> ri;
    reference(x, c.rows, c.len, c.k, rv, ri);
    float* d_x;
    float* d_v;
    int64_t* d_i;
    CK(cudaMalloc(&d_x, x.size() * 4));
    CK(cudaMalloc(&d_v, c.rows * c.k * 4));
    CK(cudaMalloc(&d_i, c.rows * c.k * 8));
    CK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    std::printf("check %5" PRId64 " x %-8" PRId64 " k=%-5d %-10s", c.rows, c.len, c.k, c.dist);
    for (const Impl& im : kImpls) {
      for (int rep = 0; rep < 2; ++rep) {  // twice: the same bits on every call
        CK(cudaMemset(d_v, 0xff, c.rows * c.k * 4));  // poison: every element must be written
        CK(cudaMemset(d_i, 0xff, c.rows * c.k * 8));
        run.call(im, d_x, c.rows, c.len, c.k, d_v, d_i, st);
        CK(cudaDeviceSynchronize());
        std::vector<uint32_t> gv(c.rows * c.k);
        std::vector<int64_t> gi(c.rows * c.k);
        CK(cudaMemcpy(gv.data(), d_v, gv.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gi.data(), d_i, gi.size() * 8, cudaMemcpyDeviceToHost));
        int64_t first = -1;
        for (size_t j = 0; j < gv.size() && first < 0; ++j)
          if (gv[j] != rv[j] || gi[j] != ri[j]) first = static_cast<int64_t>(j);
        if (first >= 0) {
          ++bad;
          std::printf("\n  MISMATCH %s rep %d at %" PRId64 ": got (%08x, %" PRId64 ") want (%08x, %" PRId64 ")",
                      im.name, rep, first, gv[first], gi[first], rv[first], ri[first]);
        }
      }
      std::printf(" %s:ok", im.name);
    }
    std::printf("\n");
    CK(cudaFree(d_x));
    CK(cudaFree(d_v));
    CK(cudaFree(d_i));
  }
  return bad;
}

// ---------------------------------------------------------------- timing
// quarter: every other set in steps of 0.25 (ties), as `qgate bench ops` draws its top-k inputs.
__global__ void gen_normal(float* out, int64_t n, uint64_t seed, int64_t quarter_every = 0) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u1 = (static_cast<float>(z >> 40) + 1.f) * (1.f / 16777217.f);
    const float u2 = static_cast<float>((z >> 16) & 0xffffff) * (1.f / 16777216.f);
    const float v = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    out[i] = quarter_every > 0 && (i / quarter_every) % 2 == 1 ? rintf(v * 4.f) / 4.f : v;
  }
}

template <int NT>
__global__ void __launch_bounds__(NT, 1) empty_kernel(int* p) {
  if (p != nullptr && threadIdx.x == 0) p[blockIdx.x] = 1;
}

struct Timing {
  double median_us, min_us;
};

// Median per call over `reps` replays of one graph that makes `sets` calls.
Timing time_graph(const std::function<void(int, cudaStream_t)>& call, int sets, int reps) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < sets; ++i) call(i, st);
  CK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0 / sets);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return {t[t.size() / 2], t.front()};
}

struct Sets {
  int64_t rows, len;
  int k, n;
  float* x;
  float* v;
  int64_t* ix;
};

Sets make_sets(int64_t rows, int64_t len, int k, uint64_t seed, bool mixed = false) {
  Sets s{rows, len, k, 0, nullptr, nullptr, nullptr};
  const int64_t per = rows * len * 4;
  s.n = static_cast<int>(std::min<int64_t>(512, (256ll << 20) / per + 1));
  CK(cudaMalloc(&s.x, per * s.n));
  CK(cudaMalloc(&s.v, rows * k * 4 * s.n));
  CK(cudaMalloc(&s.ix, rows * k * 8 * s.n));
  gen_normal<<<1024, 256>>>(s.x, rows * len * s.n, seed, mixed ? rows * len : 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return s;
}

void free_sets(Sets& s) {
  CK(cudaFree(s.x));
  CK(cudaFree(s.v));
  CK(cudaFree(s.ix));
}

void run_timing(Runner& run, int reps, uint64_t seed) {
  // Last number: 1 = every other set in steps of 0.25 (ties), as `qgate bench ops` draws them.
  const int64_t shapes[][4] = {{1, 131072, 2048, 0}, {1, 131072, 2048, 1}, {8, 32768, 1024, 0}};
  for (const auto& sh : shapes) {
    Sets s = make_sets(sh[0], sh[1], static_cast<int>(sh[2]), seed, sh[3] == 1);
    std::printf("time %" PRId64 " x %" PRId64 " k=%d%s: %d sets, %.0f MiB rotated\n", s.rows, s.len, s.k,
                sh[3] ? " (every other set in steps of 0.25)" : "", s.n, s.n * s.rows * s.len * 4.0 / (1 << 20));
    for (int rep = 0; rep < 2; ++rep) {  // every version twice: the spread between the two is the noise
      for (const Impl& im : kImpls) {
        const Timing t = time_graph(
            [&](int i, cudaStream_t st) {
              run.call(im, s.x + i * s.rows * s.len, s.rows, s.len, s.k, s.v + i * s.rows * s.k,
                       s.ix + i * s.rows * s.k, st);
            },
            s.n, reps);
        std::printf("  %-12s median %7.2f us  min %7.2f us\n", im.name, t.median_us, t.min_us);
      }
    }
    free_sets(s);
  }
  // Launch floor: an empty kernel of the same shape as the cluster launch, one per set.
  int* sink;
  CK(cudaMalloc(&sink, 1 << 20));
  CK(cudaFuncSetAttribute(empty_kernel<1024>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(empty_kernel<1024>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(qgate::tc_smem_bytes(2048))));
  for (int c : {1, 8, 16}) {
    const Timing t = time_graph(
        [&](int, cudaStream_t st) {
          cudaLaunchAttribute attr[2];
          const cudaLaunchConfig_t config =
              qgate::tc_launch_config(c, 1024, qgate::tc_smem_bytes(2048), c, false, st, attr);
          CK(cudaLaunchKernelEx(&config, empty_kernel<1024>, sink));
        },
        512, reps);
    std::printf("  empty cluster kernel %2d x 1024 threads: median %6.2f us  min %6.2f us\n", c, t.median_us,
                t.min_us);
  }
  CK(cudaFree(sink));
}

// ---------------------------------------------------------------- phases
#ifdef QGATE_TOPK_PHASES
void print_phases(const char* name, const std::vector<unsigned long long>& p, int blocks, const int* ids,
                  const char* const* labels, int n) {
  // clock rate from each block's first/last clock against the global timer
  double rate = 0;
  unsigned long long g0 = ~0ull, g1 = 0;
  for (int b = 0; b < blocks; ++b) {
    g0 = std::min(g0, p[b * 32 + 0]);
    g1 = std::max(g1, p[b * 32 + 20]);
  }
  int nb = 0;
  for (int b = 0; b < blocks; ++b) {
    const double dt = static_cast<double>(p[b * 32 + 20] - p[b * 32 + 0]);
    const double dc = static_cast<double>(p[b * 32 + ids[n - 1]] - p[b * 32 + ids[0]]);
    if (dt > 0) {
      rate += dc / dt;
      ++nb;
    }
  }
  rate = nb ? rate / nb : 1.98;
  std::printf("phases %s: %d blocks, kernel span %.2f us by globaltimer (first start to last end), clock %.2f GHz\n",
              name, blocks, (g1 - g0) / 1000.0, rate);
  unsigned long long s0 = ~0ull, s1 = 0;
  for (int b = 0; b < blocks; ++b) {
    s0 = std::min(s0, p[b * 32 + 0]);
    s1 = std::max(s1, p[b * 32 + 0]);
  }
  std::printf("  block start spread %.2f us\n", (s1 - s0) / 1000.0);
  for (int i = 1; i < n; ++i) {
    double sum = 0, mx = 0, b0 = 0;
    int m = 0;
    for (int b = 0; b < blocks; ++b) {
      // from the last stamp before it that this block wrote (a phase it skipped has none)
      unsigned long long a = 0;
      for (int j = i - 1; j >= 0 && a == 0; --j) a = p[b * 32 + ids[j]];
      const unsigned long long c = p[b * 32 + ids[i]];
      if (a == 0 || c == 0) continue;
      const double us = (c - a) / rate / 1000.0;
      sum += us;
      mx = std::max(mx, us);
      if (b == 0) b0 = us;
      ++m;
    }
    if (m) std::printf("  %-28s mean %6.3f  max %6.3f  block0 %6.3f us\n", labels[i], sum / m, mx, b0);
  }
}

// mixed: every other set in steps of 0.25; the stamps kept are the last call's, on such a set.
void run_phases(Runner& run, uint64_t seed, bool mixed, int rows = 1) {
  Sets s = rows == 1 ? make_sets(1, 131072, 2048, seed, mixed) : make_sets(rows, 32768, 1024, seed, mixed);
  if (mixed) std::printf("phases on a row in steps of 0.25 (ties):\n");
  if (rows > 1) std::printf("phases on %d x 32768, k = 1024 (blocks of every row):\n", rows);
  unsigned long long* d;
  CK(cudaMalloc(&d, 4096 * 32 * 8));
  std::vector<unsigned long long> h(64 * 32);
  for (const Impl& im : kImpls) {
    if (im.kind == kGrid) continue;
    CK(cudaMemcpyToSymbol(qgate::g_tc_phase, &d, sizeof(d)));
    for (int rep = 0; rep < 3; ++rep) {  // the last call's stamps remain; every call reads cold rows
      if (rep == 2) CK(cudaMemset(d, 0, 4096 * 32 * 8));
      for (int i = 0; i < s.n; ++i)
        run.call(im, s.x + i * s.rows * s.len, s.rows, s.len, s.k, s.v + i * s.rows * s.k, s.ix + i * s.rows * s.k, 0);
    }
    CK(cudaDeviceSynchronize());
    unsigned long long* null = nullptr;
    CK(cudaMemcpyToSymbol(qgate::g_tc_phase, &null, sizeof(null)));
    CK(cudaMemcpy(h.data(), d, h.size() * 8, cudaMemcpyDeviceToHost));
    int blocks = 0;
    while (blocks < 64 && h[blocks * 32 + 0] != 0) ++blocks;
    const int ids[] = {1, 21, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    // push kernel: the passes after pass 0 only when its candidates are too many (none on one row)
    const int push_ids[] = {1, 21, 2, 3, 4, 5, 6, 7, 14, 15, 16, 17, 18, 19};
    const char* push_labels[] = {"",
                                 "load (keys ready)",
                                 "p0 count+reduce",
                                 "p0 push+wait",
                                 "p0 sum+select",
                                 "p1 count+reduce",
                                 "p1 push+wait",
                                 "p1 sum+select",
                                 "offsets+compaction",
                                 "list push+wait",
                                 "local count",
                                 "cell bucketing",
                                 "large cells",
                                 "rank+write"};
    if (im.kind != kCluster) {
      print_phases(im.name, h, blocks, push_ids, push_labels, 14);
      continue;
    }
    const char* labels[] = {"",           "load (keys ready)", "p0 count+reduce", "p0 cluster barrier",
                            "p0 gather+select", "p1 count+reduce", "p1 barrier",      "p1 gather+select",
                            "p2 count+reduce",  "p2 barrier",      "p2 gather+select", "p3 count+reduce",
                            "p3 barrier",       "p3 gather+select+ties", "compaction",  "compaction barrier",
                            "gather all lists", "cell bucketing",  "large cells",     "rank+write+exit wait"};
    print_phases(im.name, h, blocks, ids, labels, 20);
  }
  CK(cudaFree(d));
  free_sets(s);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool do_check = false, do_time = false, do_phases = false;
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") do_check = true;
    if (a == "--time") do_time = true;
    if (a == "--phases") do_phases = true;
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  if (!do_check && !do_time && !do_phases) do_check = do_time = do_phases = true;
  setenv("QGATE_TOPK_IMPL", "grid", 1);  // plan_qsa_topk: the grid path; cluster kernels are launched here
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MiB, smem/block opt-in %zu KiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin >> 10);
  const uint64_t seed = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  std::printf("seed %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);
  Runner run;
  {  // first launches (attributes, plan caches) outside any graph capture
    float* x;
    float* v;
    int64_t* ix;
    CK(cudaMalloc(&x, 1 << 20));
    CK(cudaMalloc(&v, 1 << 20));
    CK(cudaMalloc(&ix, 1 << 20));
    gen_normal<<<64, 256>>>(x, 65536, 1);
    for (const Impl& im : kImpls) run.call(im, x, 1, 65536, 100, v, ix, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaFree(x));
    CK(cudaFree(v));
    CK(cudaFree(ix));
  }
  int bad = 0;
  if (do_check) bad = run_checks(run, rng);
  if (do_time) run_timing(run, reps, seed);
#ifdef QGATE_TOPK_PHASES
  if (do_phases) {
    run_phases(run, seed, false);
    run_phases(run, seed, true);
    run_phases(run, seed, false, 8);
  }
#else
  (void)do_phases;
#endif
  std::printf("%s: %d mismatches\n", bad ? "FAIL" : "ok", bad);
  return bad ? 1 : 0;
}
