// Route fp16_gemv: batch-one FP16 row-GEMV, y = W x (W [N, K] row-major), float32 accumulation.
#include "gemv_bulk.cuh"
#include "gemv_rows.cuh"
#include "launchers.h"

namespace qgate {
namespace {

struct GemvRows {
  using Elem = __half;
  const __half* w;
  int64_t k;
  __half* y;
  __device__ __forceinline__ const __half* row_ptr(int64_t row) const { return w + row * k; }
  __device__ __forceinline__ void store(int64_t row, float v) const { y[row] = __float2half_rn(v); }
};

}  // namespace

cudaError_t launch_gemv(const void* w, const void* x, void* y, int64_t n, int64_t k, bool static_weights,
                        cudaStream_t stream) {
  // sm_90 with QGATE_GEMV_IMPL=bulk: bulk copies into shared memory (gemv_bulk.cuh, same bits).
  const GemvBulkPlan bulk = plan_gemv_bulk(w, n, k);
  if (bulk.blocks > 0) {
    return launch_gemv_bulk(bulk, static_cast<const __half*>(w), static_cast<const __half*>(x), static_cast<__half*>(y),
                            n, k, static_weights, stream);
  }
  const GemvRows rows{static_cast<const __half*>(w), k, static_cast<__half*>(y)};
  return launch_gemv_rows(rows, static_cast<const __half*>(x), n, k, static_weights, stream);
}

}  // namespace qgate
