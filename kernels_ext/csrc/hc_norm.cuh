// The grouped Gemma RMSNorm's second pass on one 16-byte vector (8 elements) of a stream, as vLLM's
// _grouped_gemma_rmsnorm_kernel: y = x rrms, y = fma(y, w, y), rounded to T. One copy for the three-
// kernel path (fused_hc.cu) and the one-launch kernel (fused_hc_tma.cuh).
#pragma once

#include <cuda_runtime.h>

#include "gemv_rows.cuh"

namespace qgate {

template <class T>
__device__ __forceinline__ uint4 hc_norm8(uint4 raw, const uint4 wraw, float rrms) {
  T* x = reinterpret_cast<T*>(&raw);
  const T* wv = reinterpret_cast<const T*>(&wraw);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float y = to_float(x[e]) * rrms;
    x[e] = round_to(fmaf(y, to_float(wv[e]), y), T());
  }
  return raw;
}

}  // namespace qgate
