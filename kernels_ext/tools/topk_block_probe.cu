// Diagnosis harness (not the product): where the one-block top-k kernel of commit fc2a7db
// (csrc/qsa_topk_block.cuh there; not shipped: slower than the push kernel) spends its time on the
// H200. A copy of its routine with clock64 stamps after the load, each radix pass, the compaction
// and the bitonic order, plus per-launch times (events over back-to-back launches, plain and in a
// CUDA graph). Build: nvcc -std=c++17 -O3 -arch=sm_90 -o topk_block_probe kernels_ext/tools/topk_block_probe.cu
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <random>
#include <vector>

#include "../csrc/qsa_topk.cu"

#define PB_STAMP()                                     \
  do {                                                 \
    __syncthreads();                                   \
    if (threadIdx.x == 0) stamps[stamp] = clock64();   \
    ++stamp;                                           \
  } while (0)

namespace qgate {
namespace {
constexpr int kPbThreads = 1024;
constexpr int kPbItems = 16;                                  // keys a thread holds
constexpr int64_t kPbMaxLen = int64_t(kPbThreads) * kPbItems;  // 16384
constexpr int kPbMaxK = kPbThreads;                           // the sort holds one key a thread

struct PbState {
  unsigned int bin, above;
  unsigned int warp[32];
};
constexpr size_t kPbStripedBytes = 256 * 32 * sizeof(unsigned int);
constexpr size_t kPbUnionBytes = kPbStripedBytes;
// Dynamic shared memory: striped histogram (zeroed before the call), the pass's 256 counts, the
// list of k keys (the sort's exchange buffer afterwards: 8 bytes an element either way), the state.
constexpr size_t kPbSmemBytes = kPbUnionBytes + 256 * sizeof(unsigned int) + kPbMaxK * sizeof(uint2) + sizeof(PbState);

// Exclusive block scan of v in thread order (kPbThreads threads); *total gets the block sum.
__device__ __forceinline__ unsigned int pb_scan(unsigned int v, unsigned int* warp_tot, unsigned int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  unsigned int incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int u = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += u;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  const unsigned int w = warp_tot[lane];  // kPbThreads / 32 == 32 warps
  unsigned int wincl = w;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int u = __shfl_up_sync(0xffffffffu, wincl, off);
    if (lane >= off) wincl += u;
  }
  *total = __shfl_sync(0xffffffffu, wincl, 31);
  const unsigned int before = __shfl_sync(0xffffffffu, wincl - w, warp);
  __syncthreads();
  return before + incl - v;
}

__device__ __noinline__ void pb_select_row(const float* __restrict__ s, int n, int k, unsigned char* smem,
                                           int* __restrict__ out, long long* stamps) {
  int stamp = 1;
  unsigned int* striped = reinterpret_cast<unsigned int*>(smem);
  unsigned int* hist = reinterpret_cast<unsigned int*>(smem + kPbUnionBytes);
  uint2* list = reinterpret_cast<uint2*>(hist + 256);
  PbState& st = *reinterpret_cast<PbState*>(list + kPbMaxK);
  const unsigned int lane = threadIdx.x & 31;
  const int first = threadIdx.x * kPbItems;

  uint32_t keys[kPbItems];
  if (first + kPbItems <= n && (reinterpret_cast<uintptr_t>(s + first) & 15) == 0) {
#pragma unroll
    for (int q = 0; q < kPbItems / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(s + first) + q);
      keys[4 * q] = key_of(v.x);
      keys[4 * q + 1] = key_of(v.y);
      keys[4 * q + 2] = key_of(v.z);
      keys[4 * q + 3] = key_of(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPbItems; ++j) keys[j] = first + j < n ? key_of(__ldg(s + first + j)) : 0u;
  }

  PB_STAMP();
  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  int shift = 24;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : 0xffffffffu << (shift + 8);  // bytes chosen so far
#pragma unroll
    for (int j = 0; j < kPbItems; ++j) {
      if (keys[j] != 0 && (keys[j] & hi_mask) == prefix) atomicAdd(striped + ((keys[j] >> shift) & 255u) * 32 + lane, 1u);
    }
    __syncthreads();
    {  // 4 threads a bin (consecutive lanes), 8 lane words each, read and zeroed for the next pass
      const unsigned int bin = threadIdx.x >> 2;
      unsigned int* p = striped + bin * 32 + (threadIdx.x & 3) * 8;
      unsigned int sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned int w = (i + bin) & 7;  // rotated: the 8 threads of a word group hit 8 banks
        sum += p[w];
        p[w] = 0;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if ((threadIdx.x & 3) == 0) hist[bin] = sum;
    }
    __syncthreads();
    select_bin<false>(hist, need, &st.bin, &st.above);
    __syncthreads();
    const unsigned int bin = st.bin;
    need -= st.above;
    prefix |= bin << shift;
    PB_STAMP();
    if (hist[bin] == need) break;  // every key of the bin is taken: no further byte decides
  }

  // Keys above the prefix at the stopping byte, and the first `need` keys in its bin by index.
  const uint32_t lo_pfx = prefix >> shift;
  unsigned int gt = 0;
  unsigned int eq = 0;
#pragma unroll
  for (int j = 0; j < kPbItems; ++j) {
    const uint32_t d = keys[j] >> shift;
    gt += keys[j] != 0 && d > lo_pfx;
    eq += keys[j] != 0 && d == lo_pfx;
  }
  unsigned int total = 0;
  const unsigned int excl = pb_scan(gt | (eq << 16), st.warp, &total);  // n < 2^16
  unsigned int seen = excl >> 16;
  unsigned int slot = (excl & 0xffffu) + (seen < need ? seen : need);
#pragma unroll
  for (int j = 0; j < kPbItems; ++j) {
    const uint32_t d = keys[j] >> shift;
    const uint2 e = make_uint2(keys[j], static_cast<unsigned int>(first + j));
    if (keys[j] != 0 && d > lo_pfx) {
      list[slot++] = e;
    } else if (keys[j] != 0 && d == lo_pfx) {
      if (seen < need) list[slot++] = e;
      ++seen;
    }
  }
  __syncthreads();

  PB_STAMP();
  // Order: a bitonic sort, descending, of the k composites (key << 32 | ~index: unique, larger for a
  // larger key, then for a smaller index: the stable sort's order) padded with 0 to P = a power of
  // two >= k (at least a warp); thread i holds element i. Distances under 32 are warp shuffles,
  // larger ones go through shared memory (the list, read into registers first).
  int p2 = 32;
  while (p2 < k) p2 <<= 1;
  const int i = threadIdx.x;
  unsigned long long v = 0;
  if (i < k) {
    const uint2 e = list[i];
    v = (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
  }
  __syncthreads();  // the list is the exchange buffer from here
  unsigned long long* xbuf = reinterpret_cast<unsigned long long*>(list);
  const bool active = i < p2;  // whole warps (p2 is a multiple of 32)
  for (int size = 2; size <= p2; size <<= 1) {
    const bool desc = (i & size) == 0;
    for (int j = size >> 1; j > 0; j >>= 1) {
      unsigned long long other;
      if (j >= 32) {
        if (active) xbuf[i] = v;
        __syncthreads();
        other = active ? xbuf[i ^ j] : 0ull;
        __syncthreads();
      } else {
        other = active ? __shfl_xor_sync(0xffffffffu, v, j) : 0ull;
      }
      const bool keep_max = ((i & j) == 0) == desc;
      v = keep_max ? (v > other ? v : other) : (v < other ? v : other);
    }
  }
  if (i < k) out[i] = static_cast<int>(0xffffffffu - static_cast<uint32_t>(v));
  __syncthreads();
  PB_STAMP();
  if (threadIdx.x == 0) stamps[15] = stamp;
}

__global__ void __launch_bounds__(kPbThreads, 1) pb_kernel(const float* s, int n, int k, int* out, long long* stamps) {
  extern __shared__ __align__(16) unsigned char pb_smem[];
  if (threadIdx.x == 0) stamps[0] = clock64();
  unsigned int* striped = reinterpret_cast<unsigned int*>(pb_smem);
  for (int i = threadIdx.x; i < 256 * 32; i += kPbThreads) striped[i] = 0;
  __syncthreads();
  pb_select_row(s, n, k, pb_smem, out, stamps);
}

}  // namespace
}  // namespace qgate

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

int main() {
  using namespace qgate;
  const int kLen = 4096, kK = 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  const char* kinds[2] = {"relu_sum", "exp3"};
  float* d_s; int* d_out; long long* d_st;
  CK(cudaMalloc(&d_s, kLen * 4)); CK(cudaMalloc(&d_out, kK * 4)); CK(cudaMalloc(&d_st, 16 * 8));
  CK(cudaFuncSetAttribute(pb_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kPbSmemBytes));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> h(kLen);
    for (auto& v : h) {
      if (kind == 0) { float t = 0; for (int q = 0; q < 4; ++q) t += std::max(0.f, 3.f * g(rng)); v = t / std::sqrt(128.f) * 4; }
      else v = std::exp(3.f * g(rng));
    }
    CK(cudaMemcpy(d_s, h.data(), kLen * 4, cudaMemcpyHostToDevice));
    for (int n : {kLen, 513}) {
      for (int w = 0; w < 5; ++w) pb_kernel<<<1, kPbThreads, kPbSmemBytes, st>>>(d_s, n, kK, d_out, d_st);
      CK(cudaStreamSynchronize(st));
      long long hs[16]; CK(cudaMemcpy(hs, d_st, sizeof(hs), cudaMemcpyDeviceToHost));
      printf("%s n=%d k=%d stamps(cycles from start):", kinds[kind], n, kK);
      for (int i = 1; i < hs[15]; ++i) printf(" %lld", hs[i] - hs[0]);
      printf("  [load (after zeroing), each pass, compaction, order]\n");
      const int reps = 200;
      CK(cudaEventRecord(a, st));
      for (int r = 0; r < reps; ++r) pb_kernel<<<1, kPbThreads, kPbSmemBytes, st>>>(d_s, n, kK, d_out, d_st);
      CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
      float ms; CK(cudaEventElapsedTime(&ms, a, b));
      cudaGraph_t graph; cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int r = 0; r < reps; ++r) pb_kernel<<<1, kPbThreads, kPbSmemBytes, st>>>(d_s, n, kK, d_out, d_st);
      CK(cudaStreamEndCapture(st, &graph)); CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, st)); CK(cudaStreamSynchronize(st));
      CK(cudaEventRecord(a, st)); CK(cudaGraphLaunch(exec, st)); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
      float gms; CK(cudaEventElapsedTime(&gms, a, b));
      int clk = 0; CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
      printf("%s n=%d: plain launches %.2f us each, graph %.2f us each (clock %d MHz)\n", kinds[kind], n, ms * 1000 / reps, gms * 1000 / reps, clk / 1000);
      CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph));
    }
  }
  return 0;
}
