// Route fp16_gemv: batch-one row-GEMV, y = W x (W [N, K] row-major), fp16 or bf16 (W, x and y of
// one dtype), float32 accumulation, one rounding. One kernel family on every arch (gemv_rows.cuh):
// the rows kernel, with PDL on sm_90 for static weights. A bulk-copy (TMA) kernel staging rows in
// shared memory gave the same bits but was slower at every measured shape (in git history).
#include "gemv_rows.cuh"
#include "launchers.h"

namespace qgate {
namespace {

template <class T>
struct GemvRows {
  using Elem = T;
  const T* w;
  int64_t k;
  T* y;
  __device__ __forceinline__ const T* row_ptr(int64_t row) const { return w + row * k; }
  __device__ __forceinline__ void store(int64_t row, float v) const { y[row] = round_to(v, T()); }
};

template <class T>
cudaError_t launch_gemv_typed(const void* w, const void* x, void* y, int64_t n, int64_t k, bool static_weights,
                              cudaStream_t stream) {
  const GemvRows<T> rows{static_cast<const T*>(w), k, static_cast<T*>(y)};
  return launch_gemv_rows(rows, static_cast<const T*>(x), n, k, static_weights, stream);
}

}  // namespace

cudaError_t launch_gemv(const void* w, const void* x, void* y, int64_t n, int64_t k, bool bf16, bool static_weights,
                        cudaStream_t stream) {
  return bf16 ? launch_gemv_typed<__nv_bfloat16>(w, x, y, n, k, static_weights, stream)
              : launch_gemv_typed<__half>(w, x, y, n, k, static_weights, stream);
}

}  // namespace qgate
