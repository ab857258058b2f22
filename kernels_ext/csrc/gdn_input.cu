// Route fused_gdn_input_fp16: the Gated-DeltaNet input projection (Part 1 of vLLM's
// QwenGatedDeltaNetAttention), both GEMVs in one launch, fp16 or bf16.
//
// Row r of the virtual matrix [w_qkvz; w_ba] is one output, written straight to its place in what
// vLLM's GDN core takes: mixed_qkv = [q of all heads | k of all heads | v of all heads], z [nv, dv],
// b [nv], a [nv], so no split / cat copies follow. Two weight layouts (the caller names one):
//   flat (gqa_interleaved_layout=False, Qwen3.5 / Qwen4Exp): w_qkvz rows [q | k | v | z], w_ba rows
//       [b | a]: the outputs are consecutive row ranges;
//   interleaved (Qwen3-Next): rows per key head g, w_qkvz [q (dk) | k (dk) | v (r dv) | z (r dv)],
//       w_ba [b (r) | a (r)], r = nv / nk.
// The per-row arithmetic is gemv_rows.cuh's, as for fp16_gemv.
#include "gemv_rows.cuh"
#include "launchers.h"

namespace qgate {
namespace {

// Flat rows: the outputs are consecutive row ranges (no division per row).
template <class T>
struct GdnFlatRows {
  using Elem = T;
  const T* w_qkvz;
  const T* w_ba;
  int64_t k;
  int64_t n_qkv, n_qkvz, nv;
  T* mixed;
  T* z;
  T* b;
  T* a;

  __device__ __forceinline__ const T* row_ptr(int64_t row) const {
    return row < n_qkvz ? w_qkvz + row * k : w_ba + (row - n_qkvz) * k;
  }

  __device__ __forceinline__ void store(int64_t row, float v) const {
    const T out = round_to(v, T());
    if (row < n_qkv) {
      mixed[row] = out;
    } else if (row < n_qkvz) {
      z[row - n_qkv] = out;
    } else if (row - n_qkvz < nv) {
      b[row - n_qkvz] = out;
    } else {
      a[row - n_qkvz - nv] = out;
    }
  }
};

// Interleaved rows (Qwen3-Next): per key head g, [q | k | v | z] and [b | a].
template <class T>
struct GdnInterleavedRows {
  using Elem = T;
  const T* w_qkvz;
  const T* w_ba;
  int64_t k;
  int64_t n_qkvz;
  int64_t nk, r, dk, dv;
  T* mixed;
  T* z;
  T* b;
  T* a;

  __device__ __forceinline__ const T* row_ptr(int64_t row) const {
    return row < n_qkvz ? w_qkvz + row * k : w_ba + (row - n_qkvz) * k;
  }

  __device__ __forceinline__ void store(int64_t row, float v) const {
    const T out = round_to(v, T());
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

template <class T>
cudaError_t launch_typed(const GdnArgs& p, cudaStream_t stream) {
  const int64_t nk = p.num_k_heads;
  const int64_t nv = p.num_v_heads;
  const int64_t n_qkvz = 2 * nk * p.head_k_dim + 2 * nv * p.head_v_dim;
  const T* x = static_cast<const T*>(p.x);
  const T* wq = static_cast<const T*>(p.w_qkvz);
  const T* wb = static_cast<const T*>(p.w_ba);
  T* mixed = static_cast<T*>(p.mixed_qkv);
  T* z = static_cast<T*>(p.z);
  T* b = static_cast<T*>(p.b);
  T* a = static_cast<T*>(p.a);
  if (!p.interleaved) {
    const GdnFlatRows<T> rows{wq, wb, p.hidden, n_qkvz - nv * p.head_v_dim, n_qkvz, nv, mixed, z, b, a};
    return launch_gemv_rows(rows, x, n_qkvz + 2 * nv, p.hidden, p.static_weights, stream);
  }
  const GdnInterleavedRows<T> rows{wq, wb, p.hidden, n_qkvz, nk, nv / nk, p.head_k_dim, p.head_v_dim,
                                   mixed, z, b, a};
  return launch_gemv_rows(rows, x, n_qkvz + 2 * nv, p.hidden, p.static_weights, stream);
}

}  // namespace

cudaError_t launch_gdn_input(const GdnArgs& p, cudaStream_t stream) {
  if (p.num_k_heads <= 0 || p.num_v_heads <= 0) return cudaErrorInvalidValue;
  if (p.interleaved && p.num_v_heads % p.num_k_heads != 0) return cudaErrorInvalidValue;
  return p.bf16 ? launch_typed<__nv_bfloat16>(p, stream) : launch_typed<__half>(p, stream);
}

}  // namespace qgate
