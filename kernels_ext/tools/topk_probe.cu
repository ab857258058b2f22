// Lab harness (not the product): the sm_90 top-k kernel of csrc/ launched at chosen cluster sizes
// against vLLM 0.32's cooperative_topk (its kernels unmodified, through tools/vllm_coop_topk_launch.cu),
// in the decode-step condition of harness/qgate/ops/bench.py: each call between a producer that
// rewrites the scores in place and a consumer that reads the indices, op time = graph [producer, op,
// consumer] x R minus graph [producer, consumer] x R, over R, median of replays. Every route output
// is checked against a host reference (the set and the increasing index order); vLLM's set is
// compared too (it may differ on ties). Also the launch alone: an empty kernel with each launch
// configuration. Build (VLLM_CSRC: vLLM 0.32's csrc top-k files):
//   nvcc -std=c++17 -O3 -arch=sm_90a -I$VLLM_CSRC -o topk_probe kernels_ext/tools/topk_probe.cu
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// Time stamps (SM cycles) of block 0's thread 0 at the steps of the one-block path (QGATE_TP_MARK
// in csrc/qsa_topk_push.cuh): 0 entry, 1 set-up done, 2 previous kernel done (griddepcontrol.wait),
// 3 visible count read, 4 scores loaded, 5 histogram, 6 scan (the bin), 7 bin's candidates
// gathered, 8 T known, 9 index-order scan, 10 indices written.
__device__ long long g_marks[16];
#define QGATE_TP_MARK(i)                                       \
  do {                                                         \
    if (threadIdx.x == 0 && blockIdx.x == 0) g_marks[i] = clock64(); \
  } while (0)

#include "../csrc/qsa_topk.cu"
#include "vllm_coop_topk_launch.cu"

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void produce(float* x, int n, float a) {  // rewrites the scores in place
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = x[i] * a;
}
__global__ void consume(const int* idx, int k, int* sink) {  // reads the indices
  int acc = 0;
  for (int i = threadIdx.x; i < k; i += blockDim.x) acc += idx[i];
  if (acc == 0x7fffffff) sink[0] = acc;
}
template <int CS>
__global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(1024, 1) empty_cluster(int* sink) {
  extern __shared__ int dyn[];
  if (threadIdx.x == 0 && sink[1] == 12345) dyn[0] = sink[0];
}

static const char* kSteps[10] = {"set-up", "wait for producer", "visible read", "scores loaded",
                                 "histogram", "scan", "gather", "T", "index scan", "write"};

// Median cycles of each step of the one-block path over 21 eager calls after the producer.
template <class F>
static void print_steps(cudaStream_t st, float* x, int n_prod, F op) {
  std::vector<std::vector<long long>> d(10);
  for (int it = 0; it < 21; ++it) {
    long long zero[16] = {};
    CK(cudaMemcpyToSymbol(g_marks, zero, sizeof(zero)));
    produce<<<264, 256, 0, st>>>(x, n_prod, 1.0f);
    op();
    CK(cudaStreamSynchronize(st));
    long long m[16];
    CK(cudaMemcpyFromSymbol(m, g_marks, sizeof(m)));
    if (m[7] == 0) m[7] = m[6];  // the bin taken whole: no gather
    for (int i = 0; i < 10; ++i) d[i].push_back(m[i + 1] - m[i]);
  }
  std::printf("    steps (cycles, median of 21):");
  long long tot = 0;
  for (int i = 0; i < 10; ++i) {
    std::sort(d[i].begin(), d[i].end());
    tot += d[i][10];
    std::printf(" %s %lld;", kSteps[i], d[i][10]);
  }
  std::printf(" total %lld\n", tot);
}

static const char* kKinds[5] = {"continuous", "ties", "integers", "relu_sum", "exp3"};

static std::vector<float> make_row(int kind, int64_t stride, int64_t visible, std::mt19937& g) {
  std::normal_distribution<float> nd;
  std::vector<float> v(stride);
  for (auto& x : v) x = nd(g);
  for (int64_t i = 0; i < stride; ++i) {
    if (kind == 1) v[i] = std::round(v[i] * 4) / 4;
    if (kind == 2) v[i] = static_cast<float>(g() % 64);
    if (kind == 3) {
      float s = 0;
      for (int h = 0; h < 4; ++h) s += std::max(0.0f, nd(g));
      v[i] = s / 11.3f;
    }
    if (kind == 4) v[i] = std::exp(3 * v[i]);
  }
  if (kind == 1) {
    for (int j = 0; j < 8; ++j) {
      const float sp[4] = {NAN, -0.0f, INFINITY, -INFINITY};
      v[g() % visible] = sp[j / 2];
    }
  }
  for (int64_t i = visible; i < stride; ++i) v[i] = (i % 2 == 0) ? NAN : INFINITY;
  return v;
}

static uint32_t host_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f != f) return 0xffffffffu;
  if ((u << 1) == 0) return 0x80000000u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static std::vector<int> reference(const std::vector<float>& v, int64_t n, int k) {
  std::vector<int> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<int>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return host_key(v[a]) > host_key(v[b]); });
  idx.resize(std::min<int64_t>(n, k));
  std::sort(idx.begin(), idx.end());
  while (static_cast<int>(idx.size()) < k) idx.push_back(-1);
  return idx;
}

struct Bench {
  cudaStream_t st;
  cudaEvent_t a, b;
  float* x;
  int n_prod;
  int* idx;
  int k;
  int* sink;
};

template <class F>
static float graph_us(Bench& B, F op, bool with_op, int reps) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(B.st, cudaStreamCaptureModeGlobal));
  for (int r = 0; r < reps; ++r) {
    produce<<<264, 256, 0, B.st>>>(B.x, B.n_prod, 1.0f);
    if (with_op) op();
    consume<<<1, 256, 0, B.st>>>(B.idx, B.k, B.sink);
  }
  CK(cudaStreamEndCapture(B.st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> t;
  for (int i = 0; i < 25; ++i) {
    CK(cudaEventRecord(B.a, B.st));
    CK(cudaGraphLaunch(ge, B.st));
    CK(cudaEventRecord(B.b, B.st));
    CK(cudaEventSynchronize(B.b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, B.a, B.b));
    if (i >= 3) t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

template <class F>
static float step_us(Bench& B, F op) {
  constexpr int R = 20;
  float best = 1e30f;
  for (int trial = 0; trial < 3; ++trial) {  // alternate, keep the median-ish of three differences
    const float with = graph_us(B, op, true, R);
    const float without = graph_us(B, op, false, R);
    best = std::min(best, (with - without) / R);
  }
  return best;
}

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  qgate::TopkPlan plan0;
  CK(qgate::plan_qsa_topk(1, 65536, 512, dev, &plan0));  // sets the push kernel's attributes
  struct CaseDef {
    int64_t len, vis;
    int k;
  };
  const CaseDef cases[4] = {{65536, 65536, 512}, {4096, 4096, 512}, {65536, 513, 512}, {131072, 131072, 2048}};
  int* sink;
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(sink, 0, 64));
  void* ws;
  const size_t ws_bytes = 64 * 2048 * 8;
  CK(cudaMalloc(&ws, ws_bytes));
  int fails = 0;
  std::mt19937 g(47409404);
  for (const CaseDef& c : cases) {
    const int64_t stride = c.len + 64;
    float* x;
    int* vis;
    int* out;
    CK(cudaMalloc(&x, stride * 4));
    CK(cudaMalloc(&vis, 4));
    CK(cudaMalloc(&out, c.k * 4));
    const int v32 = static_cast<int>(c.vis);
    CK(cudaMemcpy(vis, &v32, 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    Bench B{st, nullptr, nullptr, x, static_cast<int>(stride), out, c.k, sink};
    CK(cudaEventCreate(&B.a));
    CK(cudaEventCreate(&B.b));
    qgate::TopkRows in{x, stride, c.len, vis};
    qgate::TopkPlan plan;
    CK(qgate::plan_qsa_topk(1, c.len, c.k, dev, &plan));
    std::vector<int> sizes = {plan.cluster};
    if (c.len > qgate::kTpBlockN) {
      for (int s : {8, 16}) {
        if (s != plan.cluster) sizes.push_back(s);
      }
    }
    for (int kind = 0; kind < 5; ++kind) {
      const std::vector<float> row = make_row(kind, stride, c.vis, g);
      CK(cudaMemcpy(x, row.data(), stride * 4, cudaMemcpyHostToDevice));
      const std::vector<int> ref = reference(row, c.vis, c.k);
      std::printf("L %lld visible %lld k %d %-10s", static_cast<long long>(c.len), static_cast<long long>(c.vis), c.k,
                  kKinds[kind]);
      for (int cs : sizes) {
        auto op = [&]() {
          cudaLaunchAttribute attr[2];
          const cudaLaunchConfig_t cfg =
              qgate::tc_launch_config(cs, qgate::kTpThreads, qgate::kTpSmemBytes, cs, true, st, attr);
          CK(cudaLaunchKernelEx(&cfg, qgate::qsa_topk_push_kernel<qgate::kTcItems>, in, c.k, cs, out));
        };
        CK(cudaMemset(out, 0xff, c.k * 4));
        op();
        CK(cudaStreamSynchronize(st));
        std::vector<int> got(c.k);
        CK(cudaMemcpy(got.data(), out, c.k * 4, cudaMemcpyDeviceToHost));
        const bool ok = got == ref;
        fails += !ok;
        std::printf(" | route c%-2d %6.2f us %s", cs, step_us(B, op), ok ? "ok" : "WRONG");
      }
      if (c.vis <= qgate::kTpBlockN) {
        const int cs = plan.cluster;
        auto nopdl = [&]() {
          cudaLaunchAttribute attr[2];
          const cudaLaunchConfig_t cfg =
              qgate::tc_launch_config(cs, qgate::kTpThreads, qgate::kTpSmemBytes, cs, false, st, attr);
          CK(cudaLaunchKernelEx(&cfg, qgate::qsa_topk_push_kernel<qgate::kTcItems>, in, c.k, cs, out));
        };
        std::printf(" | no PDL c%d %6.2f us", cs, step_us(B, nopdl));
      }
      auto vop = [&]() {
        const int rc = vllm_cooperative_topk(x, vis, out, ws, ws_bytes, 1, stride, c.k, st);
        if (rc != 0) {
          std::printf("vllm rc %d\n", rc);
          std::exit(1);
        }
      };
      vop();
      CK(cudaStreamSynchronize(st));
      std::vector<int> got(c.k);
      CK(cudaMemcpy(got.data(), out, c.k * 4, cudaMemcpyDeviceToHost));
      std::sort(got.begin(), got.end(), [](int p, int q) { return static_cast<unsigned>(p) < static_cast<unsigned>(q); });
      std::printf(" | vllm cs8 %6.2f us %s\n", step_us(B, vop), got == ref ? "same set" : "other set");
      if (c.vis <= qgate::kTpBlockN) {
        const int cs = plan.cluster;
        print_steps(st, x, static_cast<int>(stride), [&]() {
          cudaLaunchAttribute attr[2];
          const cudaLaunchConfig_t cfg =
              qgate::tc_launch_config(cs, qgate::kTpThreads, qgate::kTpSmemBytes, cs, true, st, attr);
          CK(cudaLaunchKernelEx(&cfg, qgate::qsa_topk_push_kernel<qgate::kTcItems>, in, c.k, cs, out));
        });
      }
    }
    CK(cudaFree(x));
    CK(cudaFree(vis));
    CK(cudaFree(out));
    CK(cudaStreamDestroy(st));
  }
  // The launch alone: an empty kernel of 1024 threads per block at each configuration.
  {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float* x;
    CK(cudaMalloc(&x, 65600 * 4));
    Bench B{st, nullptr, nullptr, x, 65600, sink, 1, sink};
    CK(cudaEventCreate(&B.a));
    CK(cudaEventCreate(&B.b));
    CK(cudaFuncSetAttribute(empty_cluster<16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const size_t sm[3] = {16 * 1024, ct::kSmemSize8, qgate::kTpSmemBytes};
    for (size_t s : sm) {
      CK(cudaFuncSetAttribute(empty_cluster<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s)));
      CK(cudaFuncSetAttribute(empty_cluster<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s)));
      CK(cudaFuncSetAttribute(empty_cluster<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s)));
      const float t1 = step_us(B, [&]() { empty_cluster<1><<<1, 1024, s, st>>>(sink); });
      const float t8 = step_us(B, [&]() { empty_cluster<8><<<8, 1024, s, st>>>(sink); });
      const float t16 = step_us(B, [&]() { empty_cluster<16><<<16, 1024, s, st>>>(sink); });
      std::printf("empty kernel, %zu B shared a block: 1 block %.2f us, cluster 8 %.2f us, cluster 16 %.2f us\n", s, t1,
                  t8, t16);
    }
  }
  std::printf("route outputs wrong: %d\n", fails);
  return fails ? 1 : 0;
}
