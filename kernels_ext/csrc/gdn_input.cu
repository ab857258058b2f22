// Route fused_gdn_input_fp16: Qwen3-Next Gated-DeltaNet input projection, both GEMVs in one launch.
//
// Row r of the virtual matrix [w_qkvz; w_ba] is one output. w_qkvz rows come per key head g as
// [q (dk) | k (dk) | v (r dv) | z (r dv)], w_ba rows per key head as [b (r) | a (r)], r = nv / nk.
// Each row's result goes straight to its place in the layout vLLM's GDN core takes:
//   mixed_qkv = [q of all heads | k of all heads | v of all heads], z [nv, dv], b [nv], a [nv],
// so no split / cat copies follow. The per-row arithmetic is gemv_rows.cuh's, as for fp16_gemv.
#include "gemv_rows.cuh"
#include "launchers.h"

namespace qgate {
namespace {

struct GdnRows {
  const __half* w_qkvz;
  const __half* w_ba;
  int64_t k;
  int64_t n_qkvz;
  int64_t nk, r, dk, dv;
  __half* mixed;
  __half* z;
  __half* b;
  __half* a;

  __device__ __forceinline__ const __half* row_ptr(int64_t row) const {
    return row < n_qkvz ? w_qkvz + row * k : w_ba + (row - n_qkvz) * k;
  }

  __device__ __forceinline__ void store(int64_t row, float v) const {
    const __half out = __float2half_rn(v);
    if (row < n_qkvz) {
      const int64_t per_group = 2 * dk + 2 * r * dv;
      const int64_t g = row / per_group;
      const int64_t o = row - g * per_group;
      if (o < dk) {
        mixed[g * dk + o] = out;  // q
      } else if (o < 2 * dk) {
        mixed[nk * dk + g * dk + (o - dk)] = out;  // k
      } else if (o < 2 * dk + r * dv) {
        mixed[2 * nk * dk + g * r * dv + (o - 2 * dk)] = out;  // v
      } else {
        z[g * r * dv + (o - 2 * dk - r * dv)] = out;
      }
    } else {
      const int64_t rr = row - n_qkvz;
      const int64_t g = rr / (2 * r);
      const int64_t o = rr - g * 2 * r;
      if (o < r) {
        b[g * r + o] = out;
      } else {
        a[g * r + (o - r)] = out;
      }
    }
  }
};

}  // namespace

cudaError_t launch_gdn_input(const GdnArgs& p, cudaStream_t stream) {
  if (p.num_k_heads <= 0 || p.num_v_heads % p.num_k_heads != 0) return cudaErrorInvalidValue;
  const int64_t nk = p.num_k_heads;
  const int64_t r = p.num_v_heads / p.num_k_heads;
  const int64_t n_qkvz = nk * (2 * p.head_k_dim + 2 * r * p.head_v_dim);
  const GdnRows rows{static_cast<const __half*>(p.w_qkvz), static_cast<const __half*>(p.w_ba),
                     p.hidden,  n_qkvz, nk, r, p.head_k_dim, p.head_v_dim,
                     static_cast<__half*>(p.mixed_qkv), static_cast<__half*>(p.z),
                     static_cast<__half*>(p.b), static_cast<__half*>(p.a)};
  return launch_gemv_rows(rows, static_cast<const __half*>(p.x), n_qkvz + 2 * p.num_v_heads, p.hidden,
                          p.static_weights, stream);
}

}  // namespace qgate
