// One row-dot-product engine (fp16 or bf16 rows: Rows::Elem) shared by the GEMV, the fused GDN input
// and the HyperConnection down projection, so that all give the same bits for the same row: float32
// accumulation in a fixed order, no atomics.
//
// A row of K halves is read in chunks of 256 halves: lane l of a warp loads 16 bytes (8 halves) at
// chunk offset 8 l. WPR warps share a row, warp s taking chunks s, s + WPR, ...; each warp keeps
// kGemvUnroll 16-byte loads of the weight (and of x) in flight before the first use. Lane sums are
// combined by a xor butterfly (every lane ends with the same value), warps of a row in slot order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launchers.h"

namespace qgate {

constexpr int kGemvThreads = 256;
constexpr int kGemvUnroll = 8;
constexpr int64_t kGemvChunk = 256;  // halves per warp-wide step: 32 lanes x 8
constexpr int64_t kGemvMaxSmemX = 48 * 1024;  // bytes of x staged in shared memory at most

// Weights are read once per call: streaming loads keep them from evicting x.
__device__ __forceinline__ uint4 load_weight16(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
// x by a plain coherent load (ld.global.ca: L1 and L2, so the blocks of a multiprocessor share it),
// never the non-coherent read-only path (__ldg): under PDL this kernel starts while the previous
// one may still write x, and the .nc path is only valid for data that no one writes during the
// reading kernel's lifetime; griddepcontrol.wait makes the previous grid's writes visible to
// ordinary loads (BENCH.md: one wrong chain seen with __ldg; none in 3,000 with .cg or .ca loads).
__device__ __forceinline__ uint4 load_x16(const void* p) { return __ldca(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ float dot8_acc(const uint4& w, const uint4& x, float acc) {
  const __half2* w2 = reinterpret_cast<const __half2*>(&w);
  const __half2* x2 = reinterpret_cast<const __half2*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = __half22float2(w2[i]);
    const float2 xf = __half22float2(x2[i]);
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
  return acc;
}

// The same for 8 bf16 (bf16 -> float is the 16 bits shifted up: exact, and on every arch, sm_70 too).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
__device__ __forceinline__ float dot8_acc(const uint4& w, const uint4& x, float acc, __nv_bfloat16) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = bf16x2_to_float2(wv[i]);
    const float2 xf = bf16x2_to_float2(xv[i]);
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
  return acc;
}
__device__ __forceinline__ float dot8_acc(const uint4& w, const uint4& x, float acc, __half) {
  return dot8_acc(w, x, acc);
}

// One rounding of a float32 result to the element type.
__device__ __forceinline__ __half round_to(float v, __half) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 round_to(float v, __nv_bfloat16) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// Programmatic dependent launch (PDL, sm_90). The rows kernel is written for it either way:
// - it lets the next kernel in the stream launch as soon as all of its own blocks are running
//   (allow_next_grid, at the start). That changes nothing unless the next kernel was itself
//   launched with PDL, and such a kernel waits for this one before it reads what this one wrote.
// - it issues its first weight loads before wait_for_previous_grid and reads x and writes the
//   output only after it. When the kernel itself was launched with PDL (static weights, see
//   launch_gemv_rows), it may start while the previous kernel drains, so the weight loads overlap
//   that kernel's tail; without PDL both calls return at once.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <int WPR, class T>
__device__ __forceinline__ void load_weight_group(uint4 (&wv)[kGemvUnroll], const T* __restrict__ w,
                                                  int64_t c0, int64_t k, int lane) {
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {  // kGemvUnroll x 16 B in flight per lane
    const int64_t col = (c0 + static_cast<int64_t>(u) * WPR) * kGemvChunk + lane * 8;
    if (col < k) wv[u] = load_weight16(w + col);
  }
}

// The end of a row: lane sums by a xor butterfly, then the WPR warps of the row in slot order
// (through `partial`, one float a warp; a block barrier when WPR > 1, so every thread calls it).
template <int WPR, class Rows>
__device__ __forceinline__ void finish_row(const Rows& rows, int64_t row, bool active, float acc, float* partial) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if constexpr (WPR == 1) {
    if (active && lane == 0) rows.store(row, acc);
  } else {
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (active && warp % WPR == 0 && lane == 0) {
      float sum = partial[warp];
#pragma unroll
      for (int s = 1; s < WPR; ++s) sum += partial[warp + s];
      rows.store(row, sum);
    }
  }
}

// Rows supplies Elem (__half or __nv_bfloat16), row_ptr(row) -> const Elem* and store(row, float)
// (where the result goes, rounded once to Elem).
// X_IN_SMEM: once its first weight loads are in flight, the block stages x in shared memory
// (k * 2 bytes <= kGemvMaxSmemX) so that its warps read x from there; otherwise each warp reads x
// through L1.
template <int WPR, bool X_IN_SMEM, class Rows>
__global__ void __launch_bounds__(kGemvThreads) gemv_rows_kernel(Rows rows, const typename Rows::Elem* __restrict__ x,
                                                                 int64_t n_rows, int64_t k) {
  constexpr int kWarps = kGemvThreads / 32;
  constexpr int kRowsPerBlock = kWarps / WPR;
  constexpr int64_t kStep = static_cast<int64_t>(WPR) * kGemvUnroll;
  extern __shared__ uint4 x_smem[];  // [k / 8] when X_IN_SMEM
  __shared__ float partial[kWarps];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = warp % WPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / WPR;
  const bool active = row < n_rows;
  using T = typename Rows::Elem;
  const T* __restrict__ w = rows.row_ptr(active ? row : 0);
  const int64_t n_chunks = (k + kGemvChunk - 1) / kGemvChunk;
  allow_next_grid();
  uint4 wv[kGemvUnroll];
  if (active) load_weight_group<WPR>(wv, w, slot, k, lane);
  wait_for_previous_grid();
  if constexpr (X_IN_SMEM) {
    for (int64_t i = threadIdx.x; i < k / 8; i += kGemvThreads) x_smem[i] = load_x16(x + i * 8);
    __syncthreads();
  }
  float acc = 0.f;
  if (active) {
    for (int64_t c0 = slot;;) {
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        const int64_t col = (c0 + static_cast<int64_t>(u) * WPR) * kGemvChunk + lane * 8;
        if (col < k) acc = dot8_acc(wv[u], X_IN_SMEM ? x_smem[col / 8] : load_x16(x + col), acc, T());
      }
      c0 += kStep;
      if (c0 >= n_chunks) break;
      load_weight_group<WPR>(wv, w, c0, k, lane);
    }
  }
  finish_row<WPR>(rows, row, active, acc, partial);
}

// The common decode case, K = WPR * G * kGemvChunk for G = 6, 8 or 10 loads a lane (K = 1536,
// 2048, 2560, 4096, 5120, 8192, 10240, 16384, ...): each warp loads its whole share of a row in one
// group, so the loop, the bounds checks and the per-load addresses go away (one base pointer,
// constant offsets), and x is staged one vector per thread at a time. One round trip a row: at
// K = 2560 the general kernel needs two (8 loads, then 2). Fewer registers than the general kernel
// (48 against 76 at G = 8: 32 of them hold the weights in flight) let 5 blocks share a
// multiprocessor instead of 3: more of a large matrix in flight per wave, and room for the next
// kernel's blocks under PDL. Same per-lane order as gemv_rows_kernel, so the same bits.
template <int G>
constexpr int gemv_one_group_min_blocks() {
  return G <= 8 ? 5 : 4;  // registers: 48 at G = 8 (6 blocks would spill), 40 of weights at G = 10
}

template <int WPR, int G, class Rows>
__global__ void __launch_bounds__(kGemvThreads, gemv_one_group_min_blocks<G>())
    gemv_one_group_kernel(Rows rows, const typename Rows::Elem* __restrict__ x, int64_t n_rows) {
  using T = typename Rows::Elem;
  constexpr int kWarps = kGemvThreads / 32;
  constexpr int kRowsPerBlock = kWarps / WPR;
  constexpr int kK = WPR * G * static_cast<int>(kGemvChunk);
  __shared__ uint4 x_smem[kK / 8];
  __shared__ float partial[kWarps];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int slot = warp % WPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp / WPR;
  const bool active = row < n_rows;
  const T* __restrict__ w = rows.row_ptr(active ? row : 0) + slot * kGemvChunk + lane * 8;
  allow_next_grid();
  uint4 wv[G];  // an inactive warp (past the last row) reads row 0 and stores nothing
#pragma unroll
  for (int u = 0; u < G; ++u) wv[u] = load_weight16(w + u * WPR * kGemvChunk);
  wait_for_previous_grid();
#pragma unroll
  for (int j = 0; j < WPR * G / kGemvUnroll; ++j) {  // kK / 8 = WPR * G * 32 vectors of x
    const int i = j * kGemvThreads + threadIdx.x;
    x_smem[i] = load_x16(x + i * 8);
  }
  if constexpr (WPR * G % kGemvUnroll != 0) {
    const int i = WPR * G / kGemvUnroll * kGemvThreads + threadIdx.x;
    if (i < kK / 8) x_smem[i] = load_x16(x + i * 8);
  }
  __syncthreads();
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < G; ++u) acc = dot8_acc(wv[u], x_smem[(slot + u * WPR) * 32 + lane], acc, T());
  finish_row<WPR>(rows, row, active, acc, partial);
}

// Warps per row: enough that each warp loads about kGemvGroupsPerWarp groups of kGemvUnroll chunks
// at most (fewer warps a row mean fewer waves of blocks but more round trips per warp; 2 was the
// fastest of 1-8 on the H200).
constexpr int64_t kGemvGroupsPerWarp = 2;
inline int gemv_warps_per_row(int64_t k) {
  const int64_t n_chunks = (k + kGemvChunk - 1) / kGemvChunk;
  int wpr = 1;
  while (wpr < 8 && n_chunks >= static_cast<int64_t>(wpr) * kGemvGroupsPerWarp * kGemvUnroll) wpr *= 2;
  return wpr;
}

// Plain launch, or with PDL (programmatic stream serialization) when pdl.
template <class... Params, class... Args>
cudaError_t launch_rows_kernel(void (*kernel)(Params...), dim3 grid, size_t smem, cudaStream_t stream, bool pdl,
                               Args... args) {
  if (!pdl) {
    kernel<<<grid, kGemvThreads, smem, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kGemvThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

template <int WPR, class Rows>
cudaError_t launch_wpr(const Rows& rows, const typename Rows::Elem* x, int64_t n_rows, int64_t k, dim3 grid, bool static_weights,
                       cudaStream_t stream) {
  int device = 0;
  int major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  const bool pdl = static_weights && major >= 9;
  if (k * 2 > kGemvMaxSmemX) {  // x too large to stage: read through L1
    return launch_rows_kernel(gemv_rows_kernel<WPR, false, Rows>, grid, 0, stream, pdl, rows, x, n_rows, k);
  }
  const int64_t row_step = static_cast<int64_t>(WPR) * kGemvChunk;  // halves a warp's load covers
  if (k == row_step * 8) {
    return launch_rows_kernel(gemv_one_group_kernel<WPR, 8, Rows>, grid, 0, stream, pdl, rows, x, n_rows);
  }
  if (k == row_step * 10) {
    return launch_rows_kernel(gemv_one_group_kernel<WPR, 10, Rows>, grid, 0, stream, pdl, rows, x, n_rows);
  }
  if (k == row_step * 6) {
    return launch_rows_kernel(gemv_one_group_kernel<WPR, 6, Rows>, grid, 0, stream, pdl, rows, x, n_rows);
  }
  return launch_rows_kernel(gemv_rows_kernel<WPR, true, Rows>, grid, static_cast<size_t>(k) * 2, stream, pdl, rows, x,
                            n_rows, k);
}

// static_weights: the caller promises that no kernel still running before this one in the stream
// writes the weights (true of a model's weights during inference). Only then is the kernel
// launched with PDL on sm_90, reading its weights while the previous kernel finishes; x is always
// read after the previous kernel has completed.
template <class Rows>
cudaError_t launch_gemv_rows(const Rows& rows, const typename Rows::Elem* x, int64_t n_rows, int64_t k, bool static_weights,
                             cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  if (k <= 0 || k % 8 != 0) return cudaErrorInvalidValue;
  const int wpr = gemv_warps_per_row(k);
  const int64_t rows_per_block = kGemvThreads / 32 / wpr;
  const int64_t blocks = (n_rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (wpr) {
    case 1: return launch_wpr<1>(rows, x, n_rows, k, grid, static_weights, stream);
    case 2: return launch_wpr<2>(rows, x, n_rows, k, grid, static_weights, stream);
    case 4: return launch_wpr<4>(rows, x, n_rows, k, grid, static_weights, stream);
    default: return launch_wpr<8>(rows, x, n_rows, k, grid, static_weights, stream);
  }
}

}  // namespace qgate
