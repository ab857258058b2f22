// Host entry points of the CUDA kernels: raw pointers in, cudaError_t out, launched on `stream`.
// Plain C++ (no torch): each .cu that defines them compiles alone with nvcc (tools/compile_check.py).
// Element counts are 64-bit; the torch binding (ops_cuda.cpp) checks dtypes, shapes and alignment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qgate {

// y[n] = sum_k w[n, k] * x[k]; w, x, y fp16 (as raw pointers), k % 8 == 0, 16-byte aligned rows.
// static_weights: no kernel of the current step writes w (a model's weights): on sm_90 the kernel
// is then launched with programmatic dependent launch and reads w while the previous kernel in the
// stream finishes (gemv_rows.cuh). Same bits either way.
cudaError_t launch_gemv(const void* w, const void* x, void* y, int64_t n, int64_t k, bool static_weights,
                        cudaStream_t stream);

// Both Qwen3-Next GDN input GEMVs in one launch, written de-interleaved (see gdn_input.cu).
struct GdnArgs {
  const void* x;       // [hidden] fp16
  const void* w_qkvz;  // [nk * (2 dk + 2 r dv), hidden] fp16
  const void* w_ba;    // [2 nv, hidden] fp16
  void* mixed_qkv;     // [2 nk dk + nv dv] fp16
  void* z;             // [nv dv] fp16
  void* b;             // [nv] fp16
  void* a;             // [nv] fp16
  int64_t hidden;
  int num_k_heads, num_v_heads, head_k_dim, head_v_dim;
  bool static_weights;  // as for launch_gemv
};
cudaError_t launch_gdn_input(const GdnArgs& args, cudaStream_t stream);

// Dynamic hyper-connection for one token (see fused_hc.cu for the math).
struct HcArgs {
  const void* h;            // [n, d] fp16
  const void* norm_weight;  // [d] fp16
  const void* w_a;          // [n + 1, d] fp16
  const float* a_static;    // [n, n + 1]
  const float* scale_a;     // [1]
  const void* w_b;          // [d] fp16
  const float* b_static;    // [n]
  const float* scale_b;     // [1]
  float eps;
  int n;
  int64_t d;
  void* layer_input;  // [d] fp16
  void* mixed;        // [n, d] fp16
  float* b;           // [n]
};
constexpr int kHcMaxStreams = 8;
cudaError_t launch_fused_hc(const HcArgs& args, cudaStream_t stream);

// Exact top-k per row (see qsa_topk.cu). The plan fixes the blocks per row and the workspace size;
// the workspace (empty on the cluster path) must be zero-filled before each launch.
constexpr int64_t kTopkMaxK = 4096;
struct TopkPlan {
  int cluster;  // > 0: sm_90 cluster path, this many blocks a row, no workspace
  int pull;     // cluster path: 1 = the pull kernel (QGATE_TOPK_IMPL=cluster), 0 = the push kernel
  int pdl;      // push kernel: launched with programmatic dependent launch (QGATE_TOPK_PDL=0: not)
  int blocks_per_row;
  size_t row_workspace_bytes;
  size_t workspace_bytes;
};
cudaError_t plan_qsa_topk(int64_t rows, int64_t len, int64_t k, int device, TopkPlan* plan);
cudaError_t launch_qsa_topk(const float* scores, int64_t rows, int64_t len, int64_t k, const TopkPlan& plan,
                            void* workspace, float* values, int64_t* indices, cudaStream_t stream);

}  // namespace qgate
