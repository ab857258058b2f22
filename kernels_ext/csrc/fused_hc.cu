// Route fused_hc_fp16: Qwen4Exp's GatedResidual HyperConnection (vLLM 0.32,
// models/qwen4_exp/nvidia/hyperconnection.py) for one token, fp16 or bf16. On sm_90 one launch
// (fused_hc_tma.cuh: weights staged by bulk copies, tagged partials instead of a grid barrier);
// elsewhere, and for shapes that launch does not take, three kernels:
//   hc_norm_kernel     one block a stream: the pending combine h_s + c_s o (c_s = 2 sigmoid(inj_s / HC),
//                      or 1), one fma in float32, rounded (written to h_out), then the grouped Gemma
//                      RMSNorm in float32: rrms = 1 / sqrt(sum(x^2) / HS + eps), y = x rrms,
//                      y = fma(y, w, y), rounded -> xn. (vLLM: _hc_combine_norm_kernel /
//                      _grouped_gemma_rmsnorm_kernel.)
//   down projection    gemv_rows.cuh on xn: rows 0..R-1 -> lora_raw, rows R..R+HC-1 -> injection (the
//                      pad rows are never read), each rounded once.
//   hc_up_mix_kernel   every block: lora = silu(lora_raw / HC), rounded, into shared memory; then a
//                      warp per output position i: the HC rows s HS + i of w_up (float32, fixed order),
//                      each rounded, and block_input[i] = (sum_s fma(sigmoid(g_s), xn_s, acc)) / HC in
//                      stream order, rounded. (vLLM: _hc_silu_kernel, the up GEMM, _hc_gate_mix_kernel.)
// reference.hc_mix / hc_combine_mix are the definition; their float32 steps are the same operations
// (sums of squares and GEMM sums in another order: those differ by float32 rounding only).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>


#include "fused_hc_tma.cuh"
#include "gemv_rows.cuh"
#include "hc_norm.cuh"
#include "launchers.h"

namespace qgate {
namespace {

constexpr int kHcThreads = 256;
constexpr int kHcWarps = kHcThreads / 32;

__device__ __forceinline__ float hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One block a stream s: combine (when block_output is given), then the norm. hs % 8 == 0.
template <class T>
__global__ void __launch_bounds__(kHcThreads) hc_norm_kernel(HcArgs p) {
  __shared__ float warp_sum[kHcWarps];
  const int s = blockIdx.x;
  const int64_t n_vec = p.hs / 8;
  const T* __restrict__ h = static_cast<const T*>(p.h) + s * p.hs;
  const T* __restrict__ o = static_cast<const T*>(p.block_output);
  const bool combine = o != nullptr;
  T* __restrict__ h_out = combine ? static_cast<T*>(p.h_out) + s * p.hs : nullptr;
  float c = 1.0f;
  if (combine && p.injection != nullptr) {
    c = 2.0f * hc_sigmoid(to_float(static_cast<const T*>(p.injection)[s]) / static_cast<float>(p.hc));
  }
  // Pass 1: the (combined, rounded) stream and this thread's sum of squares, in a fixed order.
  float sq = 0.f;
  for (int64_t v = threadIdx.x; v < n_vec; v += kHcThreads) {
    uint4 raw = *reinterpret_cast<const uint4*>(h + v * 8);
    T* x = reinterpret_cast<T*>(&raw);
    if (combine) {
      const uint4 oraw = *reinterpret_cast<const uint4*>(o + v * 8);
      const T* ov = reinterpret_cast<const T*>(&oraw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xo = to_float(ov[e]);
        const float xh = to_float(x[e]);
        x[e] = round_to(p.injection != nullptr ? fmaf(xo, c, xh) : xh + xo, T());
      }
      *reinterpret_cast<uint4*>(h_out + v * 8) = raw;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float xf = to_float(x[e]);
      sq = fmaf(xf, xf, sq);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = sq;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kHcWarps; ++w) total += warp_sum[w];
  const float rrms = 1.0f / sqrtf(total / static_cast<float>(p.hs) + p.eps);
  // Pass 2: y = x rrms, y = fma(y, w, y), rounded. A thread re-reads the elements it wrote.
  const T* __restrict__ src = combine ? h_out : h;
  const T* __restrict__ w = static_cast<const T*>(p.norm_weight) + (p.shared_norm_weight ? 0 : s * p.hs);
  T* __restrict__ xn = static_cast<T*>(p.xn) + s * p.hs;
  for (int64_t v = threadIdx.x; v < n_vec; v += kHcThreads) {
    uint4 raw = *reinterpret_cast<const uint4*>(src + v * 8);
    const uint4 wraw = *reinterpret_cast<const uint4*>(w + v * 8);
    raw = hc_norm8<T>(raw, wraw, rrms);
    *reinterpret_cast<uint4*>(xn + v * 8) = raw;
  }
}

// The down projection's rows: the rank rows go to lora_raw, the hc injection rows to injection_out.
template <class T>
struct HcDownRows {
  using Elem = T;
  const T* w;
  int64_t k;
  int rank;
  T* lora_raw;
  T* injection;
  __device__ __forceinline__ const T* row_ptr(int64_t row) const { return w + row * k; }
  __device__ __forceinline__ void store(int64_t row, float v) const {
    if (row < rank) {
      lora_raw[row] = round_to(v, T());
    } else {
      injection[row - rank] = round_to(v, T());
    }
  }
};

// A warp per output position i (kHcWarps a block): silu prologue, the hc rows of w_up, the gate mix.
// rank % 8 == 0 and rank <= kHcMaxRank: a lane holds at most 2 of a row's 16-byte vectors.
template <class T>
__global__ void __launch_bounds__(kHcThreads) hc_up_mix_kernel(HcArgs p) {
  __shared__ uint4 lora_s[kHcMaxRank / 8];
  const int hc = p.hc;
  const int rank = p.rank;
  const T* __restrict__ raw = static_cast<const T*>(p.lora_raw);
  T* lora = reinterpret_cast<T*>(lora_s);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kHcWarps + warp;
  const bool active = i < p.hs;
  const int n_vec = rank / 8;
  // The weights first (they do not depend on the previous kernels), then the silu.
  uint4 wv[kHcMaxStreams][2];
  const T* __restrict__ w_up = static_cast<const T*>(p.w_up);
#pragma unroll
  for (int s = 0; s < kHcMaxStreams; ++s) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int v = lane + 32 * j;
      if (active && s < hc && v < n_vec) wv[s][j] = load_weight16(w_up + ((s * p.hs + i) * rank + v * 8));
    }
  }
  for (int r = threadIdx.x; r < rank; r += kHcThreads) {
    const float x = to_float(raw[r]) / static_cast<float>(hc);
    lora[r] = round_to(x * hc_sigmoid(x), T());
  }
  __syncthreads();
  if (!active) return;
  const T* __restrict__ xn = static_cast<const T*>(p.xn);
  float acc = 0.f;
#pragma unroll
  for (int s = 0; s < kHcMaxStreams; ++s) {
    if (s < hc) {
      float g = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int v = lane + 32 * j;
        if (v < n_vec) g = dot8_acc(wv[s][j], lora_s[v], g, T());
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) g += __shfl_xor_sync(0xffffffffu, g, off);
      const float gate = to_float(round_to(g, T()));
      acc = fmaf(hc_sigmoid(gate), to_float(xn[s * p.hs + i]), acc);
    }
  }
  if (lane == 0) static_cast<T*>(p.block_input)[i] = round_to(acc / static_cast<float>(hc), T());
}

template <class T>
cudaError_t launch_hc_typed(const HcArgs& p, cudaStream_t stream) {
  hc_norm_kernel<T><<<p.hc, kHcThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t d = static_cast<int64_t>(p.hc) * p.hs;
  const HcDownRows<T> rows{static_cast<const T*>(p.w_down), d, p.rank, static_cast<T*>(p.lora_raw),
                           static_cast<T*>(p.injection_out)};
  err = launch_gemv_rows(rows, static_cast<const T*>(p.xn), p.rank + (p.use_combine ? p.hc : 0), d, false, stream);
  if (err != cudaSuccess) return err;
  const unsigned blocks = static_cast<unsigned>((p.hs + kHcWarps - 1) / kHcWarps);
  hc_up_mix_kernel<T><<<blocks, kHcThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_hc(const HcArgs& p, cudaStream_t stream) {
  if (p.hc < 1 || p.hc > kHcMaxStreams || p.rank < 8 || p.rank > kHcMaxRank || p.rank % 8 != 0 || p.hs <= 0 ||
      p.hs % 8 != 0 || p.hs > 0x7fffffff || static_cast<int64_t>(p.hc) * p.hs > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t err =
      p.bf16 ? launch_hc_tma_typed<__nv_bfloat16>(p, stream) : launch_hc_tma_typed<__half>(p, stream);
  if (err != cudaErrorNotSupported) return err;  // not applicable (nothing launched): the three kernels
  return p.bf16 ? launch_hc_typed<__nv_bfloat16>(p, stream) : launch_hc_typed<__half>(p, stream);
}

}  // namespace qgate
