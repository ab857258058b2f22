// Standalone check and benchmark of the qsa_topk kernels (no torch), on vLLM `_topk`'s contract:
// logits [rows, L] fp32 at a row stride >= L, visible_blocks [rows] int32 (row r's first
// n = clamp(visible[r], 0, L) columns are eligible), block_indices [rows, k] int32: n <= k: 0..n-1
// then -1; n > k: the first k of a stable sort of the n columns by value descending (equal values:
// lower index first; NaN above +inf, -0.0 == +0.0).
//   --check: exactness against a CPU stable sort on fresh random inputs: heavy ties (the k-th value
//            shared), NaNs of several payloads, both zeros, infinities, integers 0..63, lumpy rows,
//            n = 0, n < k, n = k, n = k + 1, n = L, n < L on long rows, visible < 0 and > L, k > L,
//            row strides above L (odd ones: unaligned rows), NaN / inf / FLT_MAX garbage past n and
//            in the stride's padding (selected if ever read), L up to 2^20, 3000 rows.
//   --time:  medians of CUDA-graph replays like `qgate bench ops` (one graph holds one call per input
//            set, the sets together over the 60 MiB L2, so every call reads its row from device memory;
//            stride L + 64, row 0 all L columns, the other rows n in [k/2, L], garbage past n), one
//            line per input kind: continuous, steps of 0.25 (ties), integers 0..63.
//   --phases: per-phase clocks of the cluster kernels when built with -DQGATE_TOPK_PHASES.
//
// Build (repository root), [-DQGATE_TOPK_PHASES] for the phase table:
//   nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I kernels_ext/csrc kernels_ext/tools/topk_bench.cu -o topk_bench
// (kernels_ext/tools/topk_device.sh builds both; tools/compile_check.py compiles both for sm_90.)
// Run: ./topk_bench [--check] [--time] [--phases] [--reps N] [--only IMPL]   (default: all three, every impl)
// Exit status 1 on any mismatch or CUDA error.
#include "../csrc/qsa_topk.cu"

#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using qgate::TopkPlan;
using qgate::TopkRows;

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
cudaError_t launch_tc(const TopkRows& in, int64_t rows, int k, int max_cluster, int* ix, cudaStream_t st) {
  static bool ready = false;
  const auto kernel = qgate::qsa_topk_cluster_kernel<NT, ITEMS>;
  if (!ready) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(qgate::tc_smem_bytes(qgate::kTopkMaxK))));
    ready = true;
  }
  const int c = qgate::tc_cluster_size(in.len, max_cluster, static_cast<int64_t>(NT) * ITEMS, ITEMS);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config =
      qgate::tc_launch_config(rows * c, NT, qgate::tc_smem_bytes(k), c, false, st, attr);
  return cudaLaunchKernelEx(&config, kernel, in, k, c, ix);
}

cudaError_t launch_tp(const TopkRows& in, int64_t rows, int k, int max_cluster, bool pdl, int* ix, cudaStream_t st) {
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
  const int c = qgate::tp_cluster_size(rows, in.len, max_cluster, sms);
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t config =
      qgate::tc_launch_config(rows * c, qgate::kTpThreads, qgate::kTpSmemBytes, c, pdl, st, attr);
  return cudaLaunchKernelEx(&config, kernel, in, k, c, ix);
}

// One call; the grid path's workspace memset is part of the call (as in ops_cuda.cpp).
struct Runner {
  void* ws = nullptr;
  size_t ws_bytes = 0;
  Runner() {  // allocated here: no allocation may happen under graph capture
    ws_bytes = 256u << 20;
    CK(cudaMalloc(&ws, ws_bytes));
  }
  void call(const Impl& im, const TopkRows& in, int64_t rows, int k, int* ix, cudaStream_t st) {
    switch (im.kind) {
      case kGrid: {
        TopkPlan plan{};
        CK(qgate::plan_qsa_topk(rows, in.len, k, 0, &plan));
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
        CK(qgate::launch_qsa_topk(in, rows, k, plan, ws, ix, st));
        break;
      }
      case kPush:
      case kPushPdl:
        CK(launch_tp(in, rows, k, im.max_cluster, im.kind == kPushPdl, ix, st));
        break;
      case kCluster:
        if (im.nt == 1024 && im.items == 8) {
          CK((launch_tc<1024, 8>(in, rows, k, im.max_cluster, ix, st)));
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
int64_t eligible(int visible, int64_t len) { return visible < 0 ? 0 : std::min<int64_t>(visible, len); }

// The contract's order, written on floats (not on the kernels' keys): NaN of any payload above
// everything, all NaNs equal; -0.0 == +0.0 (as float comparison has it).
bool ranks_above(float a, float b) {
  if (b != b) return false;
  if (a != a) return true;
  return a > b;
}

// `_topk` on the host: n <= k: 0..n-1 then -1; n > k: the first k of std::stable_sort of the row's
// first n columns by ranks_above (equal values keep their index order). x is [rows, stride].
void reference(const std::vector<float>& x, int64_t rows, int64_t len, int64_t stride, const std::vector<int>& vis,
               int k, std::vector<int>& idx) {
  idx.assign(rows * k, -1);
  std::vector<int> order;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = eligible(vis[r], len);
    int* out = idx.data() + r * k;
    if (n <= k) {
      for (int64_t j = 0; j < n; ++j) out[j] = static_cast<int>(j);
      continue;
    }
    const float* s = x.data() + r * stride;
    order.resize(n);
    for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int>(i);
    std::stable_sort(order.begin(), order.end(), [s](int a, int b) { return ranks_above(s[a], s[b]); });
    std::copy(order.begin(), order.begin() + k, out);
  }
}

// ---------------------------------------------------------------- inputs
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

const uint32_t kNans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu, 0x7fa00000u};

// rows x len eligible values (dense; placed at the row stride by place()).
std::vector<float> make_input(const std::string& dist, int64_t rows, int64_t len, std::mt19937_64& rng) {
  std::vector<float> x(rows * len);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int64_t> pos(0, rows * len - 1);
  for (auto& v : x) v = nd(rng);
  if (dist == "ties" || dist == "nanheavy") {
    for (auto& v : x) v = std::round(v * 2.f) / 2.f;
    const int64_t stride = std::max<int64_t>(1, len / 7);
    int n = 0;
    for (int64_t i = 0; i < rows * len; i += stride) x[i] = from_bits(kNans[n++ % 6]);
    for (int j = 0; j < 64; ++j) {
      x[pos(rng)] = -0.0f;
      x[pos(rng)] = 0.0f;
      x[pos(rng)] = INFINITY;
      x[pos(rng)] = -INFINITY;
    }
    if (dist == "nanheavy")
      for (int64_t i = 0; i < rows * len; ++i)
        if (rng() % 2) x[i] = from_bits(kNans[rng() % 6]);
  } else if (dist == "quarter") {  // as `qgate bench ops` draws its tie rows: steps of 0.25
    for (auto& v : x) v = std::round(v * 4.f) / 4.f;
  } else if (dist == "integers") {  // as `qgate bench ops` draws them: 0..63, every value ~L/64 times
    for (auto& v : x) v = static_cast<float>(rng() % 64);
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
  } else if (dist == "int4") {  // 0..3: the second histogram of pass 0 applies, then two more passes
    for (auto& v : x) v = static_cast<float>(rng() % 4);
  } else if (dist == "plateau") {  // one value, about 6000 of 131072, above the rest: a bin of one key
    for (auto& v : x) v = rng() % 131072 < 6000 ? 5.0f : std::max(-1.9f, std::min(1.9f, 0.4f * v));
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

// visible_blocks per row. kAll: L. kShort: n in (k, L) on every row (a long row cut short).
// kEdge: by row, L, 0, k, k + 1, k - 1, n in (k, L), 1, n in [0, k], -3, L + 5 (the kernels clamp
// to [0, L]). kDrawn: as `qgate bench ops`: row 0 L, the others n in [k/2, L].
enum Vis { kAll, kShort, kEdge, kDrawn };

std::vector<int> make_visible(Vis mode, int64_t rows, int64_t len, int k, std::mt19937_64& rng) {
  auto in = [&rng](int64_t lo, int64_t hi) {  // uniform in [lo, hi], lo when empty
    return static_cast<int>(hi <= lo ? lo : lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)));
  };
  std::vector<int> vis(rows, static_cast<int>(len));
  for (int64_t r = 0; r < rows; ++r) {
    if (mode == kShort) vis[r] = in(std::min<int64_t>(k + 1, len), len - 1);
    if (mode == kDrawn && r > 0) vis[r] = in(k / 2, len);
    if (mode != kEdge) continue;
    const int64_t edge[] = {len, 0, k, k + 1, k - 1, in(k + 1, len - 1), 1, in(0, k), -3, len + 5};
    vis[r] = static_cast<int>(edge[r % 10]);
  }
  return vis;
}

// [rows, stride]: row r's first n columns from the dense x, the rest (past n, and the stride's
// padding) garbage that ranks at the top if it is ever read: NaNs, +inf, FLT_MAX.
std::vector<float> place(const std::vector<float>& x, int64_t rows, int64_t len, int64_t stride,
                         const std::vector<int>& vis) {
  std::vector<float> buf(rows * stride);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = eligible(vis[r], len);
    for (int64_t i = 0; i < stride; ++i) {
      const int64_t g = i % 8;
      buf[r * stride + i] = i < n ? x[r * len + i] : g < 6 ? from_bits(kNans[g]) : g == 6 ? INFINITY : FLT_MAX;
    }
  }
  return buf;
}

struct Case {
  int64_t rows, len, pad;  // row stride len + pad
  int k;
  const char* dist;
  Vis vis;
};
const Case kCases[] = {
    {1, 131072, 0, 2048, "normal", kAll},      {1, 131072, 64, 2048, "normal", kShort},
    {1, 131072, 64, 2048, "ties", kAll},       {4, 131072, 64, 2048, "ties", kEdge},
    {3, 257, 0, 257, "normal", kAll},          {3, 257, 3, 256, "ties", kAll},  // n = k = L; n = k + 1 = L
    {3000, 512, 16, 16, "ties", kEdge},        {1, 1 << 20, 0, 64, "normal", kAll},
    {1, 1 << 20, 40, 4096, "ties", kShort},    {8, 32768, 64, 1024, "normal", kDrawn},
    {8, 32768, 64, 1024, "ties", kEdge},       {2, 5000, 0, 4096, "allequal", kAll},
    {1, 131072, 0, 4096, "ascending", kAll},   {1, 131072, 64, 2048, "descending", kShort},
    {5, 10001, 7, 777, "ties", kEdge},         {1, 8193, 1, 1, "normal", kShort},
    {2, 4096, 0, 100, "nanheavy", kAll},       {1, 131072, 0, 3000, "zeros", kAll},
    {1, 200000, 64, 2048, "normal", kShort},   {7, 1, 0, 1, "normal", kAll},
    {2, 4099, 0, 4096, "ties", kAll},          {12, 4100, 1, 4096, "ties", kEdge},
    {3, 50, 64, 300, "normal", kEdge},  // k > L: every row 0..n-1, then -1
    {1, 131072, 64, 2048, "quarter", kAll},    {8, 32768, 64, 1024, "quarter", kDrawn},
    {1, 131072, 64, 2048, "integers", kAll},   {4, 65536, 64, 2048, "integers", kDrawn},
    {10, 32768, 64, 1024, "integers", kEdge},  {1, 131072, 0, 2048, "narrow", kAll},
    {2, 65536, 0, 3000, "narrow", kAll},       {1, 131072, 64, 2048, "lumpy", kAll},
    {3, 65536, 64, 1500, "lumpy", kEdge},      {1, 131072, 0, 2048, "plateau", kAll},
    {2, 131072, 64, 4096, "plateau", kShort},  {2, 131072, 64, 2048, "int4", kAll},
    {1, 131072, 0, 64, "integers", kAll},
};

// --only NAME: the implementation checked, timed and clocked (default: all).
const char* g_only = nullptr;
bool skip(const Impl& im) { return g_only != nullptr && std::strcmp(im.name, g_only) != 0; }

const char* vis_name(Vis v) {
  return v == kAll ? "n=L" : v == kShort ? "k<n<L" : v == kEdge ? "edges" : "drawn";
}

int run_checks(Runner& run, std::mt19937_64& rng) {
  int bad = 0;
  cudaStream_t st = 0;
  for (const Case& c : kCases) {
    const int64_t stride = c.len + c.pad;
    const std::vector<int> vis = make_visible(c.vis, c.rows, c.len, c.k, rng);
    const std::vector<float> x = place(make_input(c.dist, c.rows, c.len, rng), c.rows, c.len, stride, vis);
    std::vector<int> ri;
    reference(x, c.rows, c.len, stride, vis, c.k, ri);
    // The last row ends at its L-th column: a read past it would leave the allocation.
    const int64_t elems = (c.rows - 1) * stride + c.len;
    float* d_x;
    int* d_vis;
    int* d_i;
    CK(cudaMalloc(&d_x, elems * 4));
    CK(cudaMalloc(&d_vis, c.rows * 4));
    CK(cudaMalloc(&d_i, c.rows * c.k * 4));
    CK(cudaMemcpy(d_x, x.data(), elems * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_vis, vis.data(), c.rows * 4, cudaMemcpyHostToDevice));
    const TopkRows in{d_x, stride, c.len, d_vis};
    std::printf("check %5" PRId64 " x %-8" PRId64 " +%-2" PRId64 " k=%-5d %-10s %-6s", c.rows, c.len, c.pad, c.k,
                c.dist, vis_name(c.vis));
    for (const Impl& im : kImpls) {
      if (skip(im)) continue;
      const int bad_before = bad;
      for (int rep = 0; rep < 2; ++rep) {  // twice: the same output on every call
        CK(cudaMemset(d_i, 0x7f, c.rows * c.k * 4));  // poison (0x7f7f7f7f, no index): every element is written
        run.call(im, in, c.rows, c.k, d_i, st);
        CK(cudaDeviceSynchronize());
        std::vector<int> gi(c.rows * c.k);
        CK(cudaMemcpy(gi.data(), d_i, gi.size() * 4, cudaMemcpyDeviceToHost));
        int64_t first = -1;
        for (size_t j = 0; j < gi.size() && first < 0; ++j)
          if (gi[j] != ri[j]) first = static_cast<int64_t>(j);
        if (first >= 0) {
          ++bad;
          const int64_t r = first / c.k;
          std::printf("\n  MISMATCH %s rep %d at row %" PRId64 " (n %" PRId64 ") position %" PRId64
                      ": got %d want %d",
                      im.name, rep, r, eligible(vis[r], c.len), first % c.k, gi[first], ri[first]);
        }
      }
      std::printf(" %s:%s", im.name, bad == bad_before ? "ok" : "MISMATCH");
    }
    std::printf("\n");
    CK(cudaFree(d_x));
    CK(cudaFree(d_vis));
    CK(cudaFree(d_i));
  }
  return bad;
}

// ---------------------------------------------------------------- timing
// Input kinds of the timed sets, as `qgate bench ops` draws its top-k rows.
enum InputKind { kContinuous, kQuarter, kIntegers };
const char* const kKindNames[] = {"continuous", "steps of 0.25", "integers 0..63"};

// Rows [rows, stride]: a row's first n = clamp(vis[row], 0, len) columns of the kind, NaN / +inf past n.
__global__ void gen_rows(float* out, const int* vis, int64_t rows, int64_t len, int64_t stride, int kind,
                         uint64_t seed) {
  const int64_t total = rows * stride;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / stride;
    const int64_t col = i - row * stride;
    const int64_t w = vis[row];
    const int64_t n = w < 0 ? 0 : w > len ? len : w;
    if (col >= n) {
      out[i] = col % 2 ? INFINITY : __int_as_float(0x7fc00000);
      continue;
    }
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (kind == kIntegers) {
      out[i] = static_cast<float>(z >> 58);
      continue;
    }
    const float u1 = (static_cast<float>(z >> 40) + 1.f) * (1.f / 16777217.f);
    const float u2 = static_cast<float>((z >> 16) & 0xffffff) * (1.f / 16777216.f);
    const float v = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    out[i] = kind == kQuarter ? rintf(v * 4.f) / 4.f : v;
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
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return {t[t.size() / 2], t.front()};
}

// n input sets of one shape and kind, stride len + 64 (vLLM's buffers are wider than the row).
struct Sets {
  int64_t rows, len, stride;
  int k, n;
  float* x;
  int* vis;
  int* ix;
  TopkRows in(int i) const { return {x + i * rows * stride, stride, len, vis + i * rows}; }
  int* out(int i) const { return ix + i * rows * k; }
};

Sets make_sets(int64_t rows, int64_t len, int k, InputKind kind, uint64_t seed) {
  Sets s{rows, len, len + 64, k, 0, nullptr, nullptr, nullptr};
  const int64_t per = rows * s.stride * 4;
  s.n = static_cast<int>(std::min<int64_t>(512, (256ll << 20) / per + 1));
  std::mt19937_64 rng(seed + static_cast<uint64_t>(kind));
  std::vector<int> vis;
  for (int i = 0; i < s.n; ++i) {
    const std::vector<int> v = make_visible(kDrawn, rows, len, k, rng);
    vis.insert(vis.end(), v.begin(), v.end());
  }
  CK(cudaMalloc(&s.x, per * s.n));
  CK(cudaMalloc(&s.vis, vis.size() * 4));
  CK(cudaMalloc(&s.ix, rows * k * 4 * s.n));
  CK(cudaMemcpy(s.vis, vis.data(), vis.size() * 4, cudaMemcpyHostToDevice));
  gen_rows<<<1024, 256>>>(s.x, s.vis, rows * s.n, len, s.stride, kind, seed);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return s;
}

void free_sets(Sets& s) {
  CK(cudaFree(s.x));
  CK(cudaFree(s.vis));
  CK(cudaFree(s.ix));
}

void run_timing(Runner& run, int reps, uint64_t seed) {
  const int64_t shapes[][3] = {{1, 131072, 2048}, {8, 32768, 1024}};
  for (const auto& sh : shapes) {
    for (const InputKind kind : {kContinuous, kQuarter, kIntegers}) {
      Sets s = make_sets(sh[0], sh[1], static_cast<int>(sh[2]), kind, seed);
      std::printf("time %" PRId64 " x %" PRId64 " k=%d, %s: %d sets, %.0f MiB rotated\n", s.rows, s.len, s.k,
                  kKindNames[kind], s.n, s.n * s.rows * s.stride * 4.0 / (1 << 20));
      for (int rep = 0; rep < 2; ++rep) {  // every version twice: the spread between the two is the noise
        for (const Impl& im : kImpls) {
          if (skip(im)) continue;
          const Timing t = time_graph([&](int i, cudaStream_t st) { run.call(im, s.in(i), s.rows, s.k, s.out(i), st); },
                                      s.n, reps);
          std::printf("  %-14s median %7.2f us  min %7.2f us\n", im.name, t.median_us, t.min_us);
        }
      }
      free_sets(s);
    }
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
// Blocks that left early (a row of n <= k) have no end stamp (20) and are left out.
void print_phases(const char* name, const std::vector<unsigned long long>& p, int blocks, const int* ids,
                  const char* const* labels, int n) {
  // clock rate from each block's first/last clock against the global timer
  double rate = 0;
  unsigned long long g0 = ~0ull, g1 = 0, s0 = ~0ull, s1 = 0;
  int nb = 0, done = 0;
  for (int b = 0; b < blocks; ++b) {
    const unsigned long long* q = p.data() + b * 32;
    s0 = std::min(s0, q[0]);
    s1 = std::max(s1, q[0]);
    if (q[20] == 0) continue;
    ++done;
    g0 = std::min(g0, q[0]);
    g1 = std::max(g1, q[20]);
    const double dt = static_cast<double>(q[20] - q[0]);
    const double dc = static_cast<double>(q[ids[n - 1]] - q[ids[0]]);
    if (dt > 0) {
      rate += dc / dt;
      ++nb;
    }
  }
  rate = nb ? rate / nb : 1.98;
  std::printf("phases %s: %d blocks (%d ran to the end), kernel span %.2f us by globaltimer (first start to last "
              "end), clock %.2f GHz\n",
              name, blocks, done, done ? (g1 - g0) / 1000.0 : 0.0, rate);
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

// The stamps kept are the last call's (the last set's); every call reads cold rows. rows == 1: one
// row of 131072, k = 2048 (all columns visible); else rows x 32768, k = 1024 (row 0 all columns,
// the others n in [k/2, L], as timed).
void run_phases(Runner& run, uint64_t seed, InputKind kind, int rows) {
  Sets s = rows == 1 ? make_sets(1, 131072, 2048, kind, seed) : make_sets(rows, 32768, 1024, kind, seed);
  std::printf("phases on %d x %" PRId64 ", k = %d, %s (blocks of every row):\n", rows, s.len, s.k, kKindNames[kind]);
  unsigned long long* d;
  CK(cudaMalloc(&d, 4096 * 32 * 8));
  std::vector<unsigned long long> h(64 * 32);
  for (const Impl& im : kImpls) {
    if (im.kind == kGrid || skip(im)) continue;
    CK(cudaMemcpyToSymbol(qgate::g_tc_phase, &d, sizeof(d)));
    for (int rep = 0; rep < 3; ++rep) {  // the last call's stamps remain; every call reads cold rows
      if (rep == 2) CK(cudaMemset(d, 0, 4096 * 32 * 8));
      for (int i = 0; i < s.n; ++i) run.call(im, s.in(i), s.rows, s.k, s.out(i), 0);
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
    if (a == "--only" && i + 1 < argc) g_only = argv[++i];
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
    Sets s = make_sets(1, 65536, 100, kContinuous, seed);
    for (const Impl& im : kImpls) run.call(im, s.in(0), s.rows, s.k, s.out(0), 0);
    CK(cudaDeviceSynchronize());
    free_sets(s);
  }
  int bad = 0;
  if (do_check) bad = run_checks(run, rng);
  if (do_time) run_timing(run, reps, seed);
#ifdef QGATE_TOPK_PHASES
  if (do_phases) {
    for (const InputKind kind : {kContinuous, kQuarter, kIntegers}) run_phases(run, seed, kind, 1);
    run_phases(run, seed, kContinuous, 8);
  }
#else
  (void)do_phases;
#endif
  std::printf("%s: %d mismatches\n", bad ? "FAIL" : "ok", bad);
  return bad ? 1 : 0;
}
