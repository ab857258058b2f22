// Host launcher for vLLM's cooperative_topk kernels, built standalone where vLLM's compiled _C is
// not installed (the H200 image). The kernels are vLLM 0.32's own, included unmodified from its
// csrc (cooperative_topk.cuh, topk_histogram_4096.cuh: -I that folder); this file repeats only the
// host side of vLLM 0.32's csrc/cooperative_topk.cu (its checks, the cluster size chosen by the
// row count and the arch, the shared-memory sizes, the cluster launch), without the torch stable
// ABI, behind a C entry that tools/vllm_topk_build.py loads with ctypes.

#include <cuda_runtime.h>

#include <cstdint>

#include "cooperative_topk.cuh"

namespace ct = vllm::cooperative;
namespace hist4096 = vllm::topk_histogram_4096;

namespace {

template <uint32_t TopK, uint32_t CS>
cudaError_t launch_cluster(ct::CooperativeTopKParams<TopK>& params, size_t smem,
                           cudaStream_t stream) {
  auto kernel = []() {
    if constexpr (CS == 2) {
      return &ct::cooperative_topk_cs2<TopK>;
    } else if constexpr (CS == 16) {
      return &ct::cooperative_topk_cs16<TopK>;
    } else if constexpr (CS == 8) {
      return &ct::cooperative_topk_cs8<TopK>;
    } else {
      return &ct::cooperative_topk_cs4<TopK>;
    }
  }();
  if constexpr (CS > 8) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(params.num_rows, CS);
  cfg.blockDim = dim3(hist4096::kBlockSize);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim = {1, CS, 1};
  cfg.numAttrs = 1;
  cfg.attrs = attrs;
  return cudaLaunchKernelEx(&cfg, kernel, params);
}

template <uint32_t TopK>
int launch(const float* logits, const int32_t* lengths, int32_t* output, void* workspace,
           int64_t workspace_bytes, int64_t num_rows, int64_t stride, cudaStream_t stream) {
  if (num_rows > 64) return -2;   // vLLM: "cooperative_topk supports <=64 rows"
  if (stride % 4 != 0) return -3;  // vLLM: "stride must be multiple of 4 for TMA alignment"
  constexpr uint32_t kTieWsPerRow = TopK <= hist4096::kBlockSize ? hist4096::kMaxTies : TopK;
  if (workspace_bytes < num_rows * static_cast<int64_t>(kTieWsPerRow * sizeof(hist4096::Tie))) {
    return -4;  // vLLM: "workspace too small"
  }
  ct::CooperativeTopKParams<TopK> params;
  params.input = logits;
  params.output = output;
  params.lengths = lengths;
  params.num_rows = static_cast<uint32_t>(num_rows);
  params.stride = static_cast<uint32_t>(stride);
  params.tie_ws = reinterpret_cast<hist4096::Tie*>(workspace);
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaError_t err;
  if (num_rows <= 4 && major >= 10) {
    err = launch_cluster<TopK, 16>(params, ct::kSmemSize8, stream);
  } else if (num_rows <= 8) {
    err = launch_cluster<TopK, 8>(params, ct::kSmemSize8, stream);
  } else if (num_rows <= 33) {
    err = launch_cluster<TopK, 4>(params, ct::kSmemSize4, stream);
  } else {
    err = launch_cluster<TopK, 2>(params, ct::kSmemSize2, stream);
  }
  return static_cast<int>(err);
}

}  // namespace

// 0 on success, a cudaError_t (> 0) from the launch, or -1..-4 for a check vLLM's launcher makes
// (-1: k not 512, 1024 or 2048).
extern "C" int vllm_cooperative_topk(const float* logits, const int32_t* lengths, int32_t* output,
                                     void* workspace, int64_t workspace_bytes, int64_t num_rows,
                                     int64_t stride, int64_t k, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (k == 512) return launch<512>(logits, lengths, output, workspace, workspace_bytes, num_rows, stride, s);
  if (k == 1024) return launch<1024>(logits, lengths, output, workspace, workspace_bytes, num_rows, stride, s);
  if (k == 2048) return launch<2048>(logits, lengths, output, workspace, workspace_bytes, num_rows, stride, s);
  return -1;
}
