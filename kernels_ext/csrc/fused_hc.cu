// Route fused_hc_fp16: dynamic hyper-connection (Zhu et al. 2024, arXiv 2409.19606) for one token.
//
// H: n residual streams of size d (fp16). With Hn = H / sqrt(mean(H^2) + eps) * norm_weight per
// stream:
//   A = a_static + scale_a * tanh(Hn w_a^T)   [n, n+1]  width weights
//   b = b_static + scale_b * tanh(Hn w_b)     [n]       depth weights
//   layer_input = sum_j A[j, 0] H[j],  mixed[i] = sum_j A[j, i+1] H[j]
// One block does it all in two passes over d. Pass 1 gathers, per stream j, sum H_j^2 and the
// n+2 dot products sum_k H_jk g_k w_k (g = norm_weight) in float32; Hn . w = rms_j * that, so no
// normalised copy is stored. The block reduces these sums in a fixed order (warp butterfly, then
// warps in index order), computes A and b, and pass 2 mixes the streams.
#include <cuda_fp16.h>

#include "launchers.h"

namespace qgate {
namespace {

constexpr int kHcThreads = 256;
constexpr int kHcWarps = kHcThreads / 32;

__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const __half2* h2 = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h2[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  uint4 v;
  __half2* h2 = reinterpret_cast<__half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h2[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

template <int N>
struct HcSums {
  static constexpr int kDots = N * (N + 2);  // per stream: n+1 dots with w_a rows, 1 with w_b
  static constexpr int kCount = kDots + N;   // plus per stream sum of squares
};

// Pass 1 for one 8-wide chunk at column c: adds into s[j * (N + 2) + i] and s[kDots + j].
template <int N>
__device__ __forceinline__ void hc_accumulate(const HcArgs& p, int64_t c, float* s) {
  const __half* h = static_cast<const __half*>(p.h);
  const __half* wa = static_cast<const __half*>(p.w_a);
  float g[8];
  float wb[8];
  unpack8(__ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(p.norm_weight) + c)), g);
  unpack8(__ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(p.w_b) + c)), wb);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float hj[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(h + j * p.d + c)), hj);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      s[HcSums<N>::kDots + j] = fmaf(hj[e], hj[e], s[HcSums<N>::kDots + j]);
      hj[e] *= g[e];
      s[j * (N + 2) + N + 1] = fmaf(hj[e], wb[e], s[j * (N + 2) + N + 1]);
    }
#pragma unroll
    for (int i = 0; i <= N; ++i) {
      float w[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(wa + i * p.d + c)), w);
#pragma unroll
      for (int e = 0; e < 8; ++e) s[j * (N + 2) + i] = fmaf(hj[e], w[e], s[j * (N + 2) + i]);
    }
  }
}

template <int N>
__global__ void __launch_bounds__(kHcThreads, 1) fused_hc_kernel(HcArgs p) {
  constexpr int kS = HcSums<N>::kCount;
  __shared__ float red[kHcWarps][kS];
  __shared__ float total[kS];
  __shared__ float a_mix[N][N + 1];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;

  float s[kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = 0.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < p.d; c += kHcThreads * 8) hc_accumulate<N>(p, c, s);

#pragma unroll
  for (int i = 0; i < kS; ++i) {
    float v = s[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) red[warp][i] = v;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kS; i += kHcThreads) {
    float v = red[0][i];
    for (int w = 1; w < kHcWarps; ++w) v += red[w][i];
    total[i] = v;
  }
  __syncthreads();

  const float scale_a = __ldg(p.scale_a);
  const float scale_b = __ldg(p.scale_b);
  for (int t = threadIdx.x; t < N * (N + 2); t += kHcThreads) {
    const int j = t / (N + 2);
    const int i = t - j * (N + 2);
    const float rms = rsqrtf(total[HcSums<N>::kDots + j] / static_cast<float>(p.d) + p.eps);
    const float proj = tanhf(rms * total[t]);
    if (i <= N) {
      a_mix[j][i] = __ldg(p.a_static + j * (N + 1) + i) + scale_a * proj;
    } else {
      p.b[j] = __ldg(p.b_static + j) + scale_b * proj;
    }
  }
  __syncthreads();

  const __half* h = static_cast<const __half*>(p.h);
  __half* layer_input = static_cast<__half*>(p.layer_input);
  __half* mixed = static_cast<__half*>(p.mixed);
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < p.d; c += kHcThreads * 8) {
    float hj[N][8];
#pragma unroll
    for (int j = 0; j < N; ++j) unpack8(__ldg(reinterpret_cast<const uint4*>(h + j * p.d + c)), hj[j]);
#pragma unroll
    for (int i = 0; i <= N; ++i) {
      float out[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < N; ++j) acc = fmaf(a_mix[j][i], hj[j][e], acc);
        out[e] = acc;
      }
      __half* dst = i == 0 ? layer_input + c : mixed + (i - 1) * p.d + c;
      *reinterpret_cast<uint4*>(dst) = pack8(out);
    }
  }
}

template <int N>
cudaError_t launch_n(const HcArgs& p, cudaStream_t stream) {
  fused_hc_kernel<N><<<1, kHcThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fused_hc(const HcArgs& p, cudaStream_t stream) {
  if (p.d <= 0 || p.d % 8 != 0) return cudaErrorInvalidValue;
  switch (p.n) {
    case 1: return launch_n<1>(p, stream);
    case 2: return launch_n<2>(p, stream);
    case 3: return launch_n<3>(p, stream);
    case 4: return launch_n<4>(p, stream);
    case 5: return launch_n<5>(p, stream);
    case 6: return launch_n<6>(p, stream);
    case 7: return launch_n<7>(p, stream);
    case 8: return launch_n<8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace qgate
