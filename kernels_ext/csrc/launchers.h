// Host entry points of the CUDA kernels: raw pointers in, cudaError_t out, launched on `stream`.
// Plain C++ (no torch): each .cu that defines them compiles alone with nvcc (tools/compile_check.py).
// Element counts are 64-bit; the torch binding (ops_cuda.cpp) checks dtypes, shapes and alignment.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace qgate {

// y[n] = sum_k w[n, k] * x[k]; w, x, y all fp16 or all bf16 (as raw pointers), k % 8 == 0, 16-byte
// aligned rows.
// static_weights: no kernel of the current step writes w (a model's weights): on sm_90 the kernel
// is then launched with programmatic dependent launch and reads w while the previous kernel in the
// stream finishes (gemv_rows.cuh). Same bits either way.
cudaError_t launch_gemv(const void* w, const void* x, void* y, int64_t n, int64_t k, bool bf16, bool static_weights,
                        cudaStream_t stream);

// Both GDN input GEMVs in one launch, written where vLLM's GDN core takes them (see gdn_input.cu).
struct GdnArgs {
  const void* x;       // [hidden] fp16 or bf16
  const void* w_qkvz;  // [2 nk dk + 2 nv dv, hidden], flat or interleaved rows
  const void* w_ba;    // [2 nv, hidden]
  void* mixed_qkv;     // [2 nk dk + nv dv]
  void* z;             // [nv dv]
  void* b;             // [nv]
  void* a;             // [nv]
  int64_t hidden;
  int num_k_heads, num_v_heads, head_k_dim, head_v_dim;
  bool interleaved;     // Qwen3-Next's per-key-head rows; false: flat [q | k | v | z], [b | a]
  bool bf16;            // element type: bf16, else fp16
  bool static_weights;  // as for launch_gemv
};
cudaError_t launch_gdn_input(const GdnArgs& args, cudaStream_t stream);

// Qwen4Exp GatedResidual HyperConnection for one token (see fused_hc.cu for the math).
struct HcArgs {
  const void* h;             // [D] fp16 or bf16, D = hc * hs
  const void* block_output;  // [hs] (combine_and_mix) or nullptr (mix)
  const void* injection;     // [hc] logits of the pending combine, or nullptr (unit weight)
  const void* norm_weight;   // [hs] or [D]
  const void* w_down;        // [rank + hc (+ pad), D] or [rank, D] (final mixer)
  const void* w_up;          // [D, rank]
  float eps;
  int hc, rank;
  int64_t hs;
  bool shared_norm_weight;  // norm_weight is [hs]
  bool use_combine;         // w_down holds the hc injection rows after the rank rows
  bool bf16;
  void* h_out;          // [D] the combined streams (combine_and_mix only)
  void* xn;             // [D] workspace: the normalised streams
  void* lora_raw;       // [rank] workspace: the down projection before silu
  void* injection_out;  // [hc] (use_combine only)
  void* block_input;    // [hs]
};
constexpr int kHcMaxStreams = 8;
constexpr int kHcMaxRank = 512;
cudaError_t launch_hc(const HcArgs& args, cudaStream_t stream);

// Exact top-k per row (see qsa_topk.cu). The plan fixes the blocks per row and the workspace size;
// the workspace (empty on the cluster path) must be zero-filled before each launch.
constexpr int64_t kTopkMaxK = 4096;
struct TopkPlan {
  int cluster;  // > 0: sm_90 cluster path (the push kernel, with PDL), this many blocks a row, no workspace
  int blocks_per_row;
  size_t row_workspace_bytes;
  size_t workspace_bytes;
};
// One call's rows: row r is scores[r * stride, r * stride + len), of which only the first
// min(max(visible[r], 0), len) columns are eligible (the rest is never read).
struct TopkRows {
  const float* scores;
  int64_t stride;
  int64_t len;
  const int* visible;
};
cudaError_t plan_qsa_topk(int64_t rows, int64_t len, int64_t k, int device, TopkPlan* plan);
// indices: [rows, k] int32: n <= k: 0..n-1 then -1; n > k: the top k by value descending, ties by index.
cudaError_t launch_qsa_topk(const TopkRows& in, int64_t rows, int64_t k, const TopkPlan& plan, void* workspace,
                            int* indices, cudaStream_t stream);

}  // namespace qgate
