// sm_90 path of fp16_gemv: the weight rows come into shared memory by bulk copies (the TMA engine,
// cp.async.bulk with an mbarrier per stage), so one thread per warp requests whole rows (4-8 KiB
// each) and a block keeps up to ~190 KiB of weights in flight without a register per byte.
//
// Grid: one block per SM at most; each block takes R = ceil(N / SMs) consecutive rows (equal work
// per SM up to one row). Warp w of the block takes rows w, w + 8, ... of its range, through a
// private ring of SW row stages (no cross-warp synchronisation: the warp that consumed a stage
// refills it). x is staged in shared memory once per block.
//
// Summation order: chunk c of 256 halves, lane l taking halves 8 l .. 8 l + 7 (as gemv_rows.cuh);
// accumulator slot c % WPR over increasing c, each slot reduced by the same xor butterfly, the slots
// added in slot order, with WPR = gemv_warps_per_row(K). That is exactly what gemv_rows_kernel
// computes with WPR warps a row, so both paths give the same bits (and the GDN rows still match).
#pragma once

#include "gemv_rows.cuh"

namespace qgate {

constexpr int kBulkThreads = 256;
constexpr int kBulkWarps = kBulkThreads / 32;
constexpr int kBulkMaxStagesPerWarp = 16;
constexpr size_t kBulkBarrierBytes = sizeof(unsigned long long) * kBulkWarps * kBulkMaxStagesPerWarp;  // 1 KiB
constexpr size_t kBulkSmemBudget = 227 * 1024;  // sm_90 opt-in shared memory per block

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Lane 0 only: expect `bytes` on the stage's barrier and start the copy of one row into it.
__device__ __forceinline__ void bulk_row(uint32_t dst, const __half* src, uint32_t bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
#endif

// y[row] = W[row] . x for rows [blockIdx.x R, min(N, (blockIdx.x + 1) R)). sw: stages per warp.
template <int WPR>
__global__ void __launch_bounds__(kBulkThreads, 1) gemv_bulk_kernel(const __half* __restrict__ w,
                                                                    const __half* __restrict__ x,
                                                                    __half* __restrict__ y, int64_t n, int64_t k,
                                                                    int64_t rows_per_block, int sw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const uint32_t row_bytes = static_cast<uint32_t>(k * 2);
  const size_t x_bytes = (static_cast<size_t>(k) * 2 + 127) / 128 * 128;
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem) + warp * kBulkMaxStagesPerWarp;
  const uint4* xs = reinterpret_cast<const uint4*>(smem + kBulkBarrierBytes);
  unsigned char* stages = smem + kBulkBarrierBytes + x_bytes + static_cast<size_t>(warp) * sw * row_bytes;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_block + warp;
  const int64_t row_end = row0 - warp + rows_per_block < n ? row0 - warp + rows_per_block : n;
  const int64_t my_rows = row0 < row_end ? (row_end - row0 + kBulkWarps - 1) / kBulkWarps : 0;
  if (lane == 0) {
    for (int s = 0; s < sw; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + s)) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int64_t j = 0; j < my_rows && j < sw; ++j) {
      bulk_row(smem_addr(stages + j * row_bytes), w + (row0 + j * kBulkWarps) * k, row_bytes, smem_addr(bars + j));
    }
  }
  wait_for_previous_grid();
  for (int64_t i = threadIdx.x; i < k / 8; i += kBulkThreads) {
    const_cast<uint4*>(xs)[i] = load_x16(x + i * 8);
  }
  __syncthreads();
  const int64_t n_chunks = (k + kGemvChunk - 1) / kGemvChunk;
  for (int64_t j = 0; j < my_rows; ++j) {
    const int s = static_cast<int>(j % sw);
    bulk_wait(smem_addr(bars + s), static_cast<uint32_t>((j / sw) & 1));
    const uint4* wr = reinterpret_cast<const uint4*>(stages + s * row_bytes);
    float acc[WPR];
#pragma unroll
    for (int u = 0; u < WPR; ++u) acc[u] = 0.f;
    for (int64_t c0 = 0; c0 < n_chunks; c0 += WPR) {
#pragma unroll
      for (int u = 0; u < WPR; ++u) {
        const int64_t col = (c0 + u) * kGemvChunk + lane * 8;
        if (c0 + u < n_chunks && col < k) acc[u] = dot8_acc(wr[col / 8], xs[col / 8], acc[u]);
      }
    }
    float sum = 0.f;
#pragma unroll
    for (int u = 0; u < WPR; ++u) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
      sum = u == 0 ? acc[0] : sum + acc[u];
    }
    __syncwarp();  // every lane has read the stage before it is refilled
    if (lane == 0) {
      y[row0 + j * kBulkWarps] = __float2half_rn(sum);
      if (j + sw < my_rows) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bulk_row(smem_addr(stages + s * row_bytes), w + (row0 + (j + sw) * kBulkWarps) * k, row_bytes,
                 smem_addr(bars + s));
      }
    }
  }
#endif
}

// The bulk path's plan: launched when blocks > 0 (sm_90, QGATE_GEMV_IMPL=bulk, 16-byte
// aligned weights, enough shared memory for at least min(2, rows a warp) stages a warp).
struct GemvBulkPlan {
  int64_t blocks = 0;
  int64_t rows_per_block = 0;
  int stages = 0;
  size_t smem = 0;
};

inline GemvBulkPlan plan_gemv_bulk(const void* w, int64_t n, int64_t k) {
  GemvBulkPlan plan;
  static const bool off = [] {
    const char* impl = std::getenv("QGATE_GEMV_IMPL");
    return impl == nullptr || std::strcmp(impl, "bulk") != 0;  // opt-in: slower so far (BENCH.md)
  }();
  static const int sms = [] {
    int device = 0;
    int major = 0;
    int count = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return major >= 9 ? count : 0;
  }();
  if (off || sms == 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 || n <= 0 || k <= 0 || k % 8 != 0) return plan;
  const int64_t rows_per_block = (n + sms - 1) / sms;
  const int64_t rows_per_warp = (rows_per_block + kBulkWarps - 1) / kBulkWarps;
  const size_t x_bytes = (static_cast<size_t>(k) * 2 + 127) / 128 * 128;
  const size_t row_bytes = static_cast<size_t>(k) * 2;
  if (kBulkBarrierBytes + x_bytes >= kBulkSmemBudget) return plan;
  const int64_t fit = static_cast<int64_t>((kBulkSmemBudget - kBulkBarrierBytes - x_bytes) / (kBulkWarps * row_bytes));
  int64_t stages = rows_per_warp < fit ? rows_per_warp : fit;
  if (stages > kBulkMaxStagesPerWarp) stages = kBulkMaxStagesPerWarp;
  if (stages < (rows_per_warp < 2 ? rows_per_warp : 2)) return plan;  // no double buffering: keep the rows path
  plan.rows_per_block = rows_per_block;
  plan.blocks = (n + rows_per_block - 1) / rows_per_block;
  plan.stages = static_cast<int>(stages);
  plan.smem = kBulkBarrierBytes + x_bytes + static_cast<size_t>(kBulkWarps) * stages * row_bytes;
  return plan;
}

template <int WPR>
cudaError_t launch_bulk_wpr(const GemvBulkPlan& plan, const __half* w, const __half* x, __half* y, int64_t n,
                            int64_t k, bool static_weights, cudaStream_t stream) {
  static const cudaError_t attr_err = cudaFuncSetAttribute(
      gemv_bulk_kernel<WPR>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBulkSmemBudget));
  if (attr_err != cudaSuccess) return attr_err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(plan.blocks));
  config.blockDim = dim3(kBulkThreads);
  config.dynamicSmemBytes = plan.smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = static_weights ? 1 : 0;  // PDL: see launch_gemv_rows
  return cudaLaunchKernelEx(&config, gemv_bulk_kernel<WPR>, w, x, y, n, k, plan.rows_per_block, plan.stages);
}

inline cudaError_t launch_gemv_bulk(const GemvBulkPlan& plan, const __half* w, const __half* x, __half* y, int64_t n,
                                    int64_t k, bool static_weights, cudaStream_t stream) {
  switch (gemv_warps_per_row(k)) {
    case 1: return launch_bulk_wpr<1>(plan, w, x, y, n, k, static_weights, stream);
    case 2: return launch_bulk_wpr<2>(plan, w, x, y, n, k, static_weights, stream);
    case 4: return launch_bulk_wpr<4>(plan, w, x, y, n, k, static_weights, stream);
    default: return launch_bulk_wpr<8>(plan, w, x, y, n, k, static_weights, stream);
  }
}

}  // namespace qgate
