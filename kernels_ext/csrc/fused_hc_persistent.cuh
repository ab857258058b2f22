// The HC route in one kernel launch (QGATE_HC_IMPL=fused, opt-in): one block per multiprocessor, all
// resident, one grid-wide barrier. The three kernels of fused_hc.cu cost a launch and a drain each
// (11.4 us on the H200 at HC 4, hidden 2048, rank 320, for 2.6 us of weight traffic); here:
//   1. every warp issues the loads of its first down-projection slice and its first up rows (the
//      weights do not depend on the token), so the whole 10.8 MB is in flight from the start;
//   2. every block computes the combine and the norm of all HC streams itself (4 x 2048 elements,
//      read from L2): no barrier between the norm and the down projection;
//   3. a warp's down task is (row, group of kHcDownChunks chunks of 256 columns): its float32 dot
//      goes to `partials` (one float a task, no atomics);
//   4. the grid barrier;
//   5. every block sums the partials of each down row in group order (fixed: the same bits on every
//      block and every call), rounds, applies silu (block 0 writes the injection rows);
//   6. a warp per output position: the up rows (already in registers) and the gate mix, as in
//      hc_up_mix_kernel.
// The operations and roundings are those of the three-kernel path; only the float32 summation order
// of the down rows differs (group partials summed in order), which the tests' tolerance covers.
// Barrier: cooperative launch (the driver guarantees residency and gives each launch its own
// barrier). kCoop = false (a plain launch of one wave and a sense-reversing barrier in global memory)
// is no longer selectable: QGATE_HC_IMPL=fused_plain measured slowest (BENCH.md) and was dropped.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gemv_rows.cuh"
#include "launchers.h"

namespace qgate {

constexpr int kHcFusedThreads = 512;
constexpr int kHcFusedWarps = kHcFusedThreads / 32;
constexpr int kHcDownChunks = 8;      // 256-column chunks per down task: 8 x 16 B a lane in flight
constexpr int kHcPassVectors = 2;     // 16-byte vectors of h a thread loads before it uses them
constexpr int64_t kHcFusedMaxSmem = 40 * 1024;  // dynamic, under the 48 KiB default with the static arrays
constexpr int kHcHeldStreams = 4;

__device__ unsigned int g_hc_arrived;
__device__ unsigned int g_hc_epoch;

__device__ __forceinline__ float hc_fused_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sense-reversing barrier over the grid (plain launch, every block resident). The last block to
// arrive resets the count and then advances the epoch; the others wait for the epoch to move.
__device__ __forceinline__ void hc_plain_grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* epoch = &g_hc_epoch;
    const unsigned int seen = *epoch;
    __threadfence();
    if (atomicAdd(&g_hc_arrived, 1u) == gridDim.x - 1) {
      atomicExch(&g_hc_arrived, 0u);
      __threadfence();
      atomicAdd(&g_hc_epoch, 1u);
    } else {
      while (*epoch == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__host__ __device__ inline int hc_down_groups(int64_t d) {
  const int64_t chunks = (d + kGemvChunk - 1) / kGemvChunk;
  return static_cast<int>((chunks + kHcDownChunks - 1) / kHcDownChunks);
}

// kS: 4 or 8, >= p.hc; the up rows of the first kHcHeldStreams streams are held in registers.
template <class T, int kS, bool kCoop>
__global__ void __launch_bounds__(kHcFusedThreads, 1) hc_fused_kernel(HcArgs p) {
  extern __shared__ uint4 hc_smem[];  // xn: [d / 8], then lora: [rank / 8]
  __shared__ float red[kHcMaxStreams][kHcFusedWarps];
  __shared__ float rrms_s[kHcMaxStreams];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int total_warps = static_cast<int>(gridDim.x) * kHcFusedWarps;
  const int gw = warp * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);  // spreads tasks over blocks
  const int hc = p.hc;
  const int rank = p.rank;
  const int hs = static_cast<int>(p.hs);
  const int d = hc * hs;
  const int n_groups = hc_down_groups(d);
  const int n_down = rank + (p.use_combine ? hc : 0);
  const int n_tasks = n_down * n_groups;
  const int n_rvec = rank / 8;
  const T* __restrict__ w_down = static_cast<const T*>(p.w_down);
  const T* __restrict__ w_up = static_cast<const T*>(p.w_up);

  // 1. The token's inputs first (their round trip is on the critical path: issued behind 80 KB of
  //    weights a multiprocessor they would arrive last), then the weights of this warp's first down
  //    task and first up position.
  __shared__ float c_s[kHcMaxStreams];
  T* xs = reinterpret_cast<T*>(hc_smem);
  const T* __restrict__ h = static_cast<const T*>(p.h);
  const T* __restrict__ o = static_cast<const T*>(p.block_output);
  const T* __restrict__ inj = static_cast<const T*>(p.injection);
  const T* __restrict__ nw = static_cast<const T*>(p.norm_weight);
  T* __restrict__ h_out = static_cast<T*>(p.h_out);
  const bool combine = o != nullptr;
  const int n_vec = d / 8;
  const int hs_vec = hs / 8;
  uint4 hv[kHcPassVectors];
  uint4 ov[kHcPassVectors];
  uint4 nv[kHcPassVectors];
  auto load_token = [&](int base, bool norm_weight) {
#pragma unroll
    for (int q = 0; q < kHcPassVectors; ++q) {
      const int v = base + q * kHcFusedThreads + threadIdx.x;
      if (v < n_vec) {
        hv[q] = load_x16(h + v * 8);
        if (combine) ov[q] = load_x16(o + (v % hs_vec) * 8);
        if (norm_weight) nv[q] = load_x16(nw + (p.shared_norm_weight ? (v % hs_vec) : v) * 8);
      }
    }
  };
  load_token(0, true);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.prefetch == 1 || p.prefetch == 2) {  // the bulk copy engine pulls this warp's weights into L2: no registers held
    if (lane == 0 && gw < n_tasks) {
      const int c0 = (gw % n_groups) * kHcDownChunks * static_cast<int>(kGemvChunk);
      const int cols = min(kHcDownChunks * static_cast<int>(kGemvChunk), d - c0);
      const T* src = w_down + static_cast<int64_t>(gw / n_groups) * d + c0;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(cols * 2) : "memory");
    }
    if (lane < hc && gw < hs) {
      const T* src = w_up + (static_cast<int64_t>(lane) * hs + gw) * rank;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(rank * 2) : "memory");
    }
  }
#endif
  // This warp's first weights loaded into registers now (2, 3: where used; 3 without any prefetch).
  const bool held = p.prefetch != 2 && p.prefetch != 3;
  const float inj_t = combine && inj != nullptr && threadIdx.x < hc ? to_float(inj[threadIdx.x]) : 0.f;
  uint4 wd[kHcDownChunks];
  if (held && gw < n_tasks) {
    const T* row = w_down + static_cast<int64_t>(gw / n_groups) * d;
    const int c0 = (gw % n_groups) * kHcDownChunks;
#pragma unroll
    for (int u = 0; u < kHcDownChunks; ++u) {
      const int col = (c0 + u) * static_cast<int>(kGemvChunk) + lane * 8;
      if (col < d) wd[u] = load_weight16(row + col);
    }
  }
  uint4 wu[kHcHeldStreams][2];
  if (held && gw < hs) {
#pragma unroll
    for (int s = 0; s < kHcHeldStreams; ++s) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int v = lane + 32 * j;
        if (s < hc && v < n_rvec) wu[s][j] = load_weight16(w_up + ((static_cast<int64_t>(s) * hs + gw) * rank + v * 8));
      }
    }
  }
  if (threadIdx.x < hc) {
    c_s[threadIdx.x] =
        inj != nullptr ? 2.0f * hc_fused_sigmoid(inj_t / static_cast<float>(hc)) : 1.0f;  // unused by mix
  }
  __syncthreads();

  // 2. Combine (written to h_out by a few blocks each) and norm of every stream, into shared memory.
  for (int base = 0; base < n_vec; base += kHcPassVectors * kHcFusedThreads) {
    if (base != 0) load_token(base, false);
#pragma unroll
    for (int q = 0; q < kHcPassVectors; ++q) {
      const int v = base + q * kHcFusedThreads + threadIdx.x;
      if (v >= n_vec) continue;
      if (combine) {
        const float c = c_s[v / hs_vec];
        T* x = reinterpret_cast<T*>(&hv[q]);
        const T* ob = reinterpret_cast<const T*>(&ov[q]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xo = to_float(ob[e]);
          const float xh = to_float(x[e]);
          x[e] = round_to(inj != nullptr ? fmaf(xo, c, xh) : xh + xo, T());
        }
        if ((v >> 5) % static_cast<int>(gridDim.x) == static_cast<int>(blockIdx.x)) {
          *reinterpret_cast<uint4*>(h_out + v * 8) = hv[q];
        }
      }
      hc_smem[v] = hv[q];
    }
  }
  __syncthreads();
  for (int s = 0; s < hc; ++s) {  // sums of squares, a fixed order: the same bits on every block
    float sq = 0.f;
    for (int v = threadIdx.x; v < hs_vec; v += kHcFusedThreads) {
      const uint4 raw = hc_smem[s * hs_vec + v];
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xf = to_float(x[e]);
        sq = fmaf(xf, xf, sq);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if (lane == 0) red[s][warp] = sq;
  }
  __syncthreads();
  if (threadIdx.x < hc) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kHcFusedWarps; ++w) total += red[threadIdx.x][w];
    rrms_s[threadIdx.x] = 1.0f / sqrtf(total / static_cast<float>(hs) + p.eps);
  }
  __syncthreads();
  for (int base = 0; base < n_vec; base += kHcPassVectors * kHcFusedThreads) {
#pragma unroll
    for (int q = 0; q < kHcPassVectors; ++q) {
      const int v = base + q * kHcFusedThreads + threadIdx.x;
      if (v >= n_vec) continue;
      if (base != 0) nv[q] = load_x16(nw + (p.shared_norm_weight ? (v % hs_vec) : v) * 8);
      uint4 raw = hc_smem[v];
      T* x = reinterpret_cast<T*>(&raw);
      const T* wv = reinterpret_cast<const T*>(&nv[q]);
      const float r = rrms_s[v / hs_vec];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float y = to_float(x[e]) * r;
        x[e] = round_to(fmaf(y, to_float(wv[e]), y), T());
      }
      hc_smem[v] = raw;
    }
  }
  __syncthreads();
  if (p.phase_stop == 1) return;

  // 3. Down tasks: a float32 partial dot per (row, group).
  for (int task = gw; task < n_tasks; task += total_warps) {
    const T* row = w_down + static_cast<int64_t>(task / n_groups) * d;
    const int c0 = (task % n_groups) * kHcDownChunks;
    if (task != gw || !held) {
#pragma unroll
      for (int u = 0; u < kHcDownChunks; ++u) {
        const int col = (c0 + u) * static_cast<int>(kGemvChunk) + lane * 8;
        if (col < d) wd[u] = load_weight16(row + col);
      }
    }
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < kHcDownChunks; ++u) {
      const int col = (c0 + u) * static_cast<int>(kGemvChunk) + lane * 8;
      if (col < d) acc = dot8_acc(wd[u], hc_smem[col / 8], acc, T());
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) __stcg(p.partials + task, acc);
  }

  if (p.phase_stop == 2) return;
  // 4. Every partial written before any block reads them.
  if constexpr (kCoop) {
    __threadfence();
    cooperative_groups::this_grid().sync();
  } else {
    hc_plain_grid_barrier();
  }

  if (p.phase_stop == 3) return;
  // 5. Down rows: partials in group order, one rounding; silu into shared memory.
  T* lora = reinterpret_cast<T*>(hc_smem + n_vec);
  for (int r = threadIdx.x; r < n_down; r += kHcFusedThreads) {
    float part[4];  // the first four loads in flight together, the sum in group order
#pragma unroll
    for (int g = 0; g < 4; ++g) part[g] = g < n_groups ? __ldcg(p.partials + r * n_groups + g) : 0.f;
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      if (g < n_groups) sum += part[g];
    }
    for (int g = 4; g < n_groups; ++g) sum += __ldcg(p.partials + r * n_groups + g);
    const T raw = round_to(sum, T());
    if (r < rank) {
      const float x = to_float(raw) / static_cast<float>(hc);
      lora[r] = round_to(x * hc_fused_sigmoid(x), T());
    } else if (blockIdx.x == 0) {
      static_cast<T*>(p.injection_out)[r - rank] = raw;
    }
  }
  __syncthreads();

  // 6. Up rows and the gate mix, a warp per output position.
  const uint4* lora_v = hc_smem + n_vec;
  for (int i = gw; i < hs; i += total_warps) {
    if (i != gw || !held) {
#pragma unroll
      for (int s = 0; s < kHcHeldStreams; ++s) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int v = lane + 32 * j;
          if (s < hc && v < n_rvec) wu[s][j] = load_weight16(w_up + ((static_cast<int64_t>(s) * hs + i) * rank + v * 8));
        }
      }
    }
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      if (s < hc) {
        float g = 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int v = lane + 32 * j;
          if (v < n_rvec) {
            // Streams past kHcHeldStreams are read here (holding 8 would spill on sm_70).
            const uint4 w = s < kHcHeldStreams
                                ? wu[s < kHcHeldStreams ? s : 0][j]
                                : load_weight16(w_up + ((static_cast<int64_t>(s) * hs + i) * rank + v * 8));
            g = dot8_acc(w, lora_v[v], g, T());
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) g += __shfl_xor_sync(0xffffffffu, g, off);
        const float gate = to_float(round_to(g, T()));
        acc = fmaf(hc_fused_sigmoid(gate), to_float(xs[s * hs + i]), acc);
      }
    }
    if (lane == 0) static_cast<T*>(p.block_input)[i] = round_to(acc / static_cast<float>(hc), T());
  }
}

inline size_t hc_fused_smem_bytes(const HcArgs& p) {
  return static_cast<size_t>(p.hc) * static_cast<size_t>(p.hs) * 2 + static_cast<size_t>(p.rank) * 2;
}

// The blocks of one wave of this kernel on the current device (0 when unknown); cached per device.
template <class T, int kS, bool kCoop>
int hc_fused_grid(size_t smem) {
  static int cached[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 0;
  if (cached[device] == 0) {
    int sms = 0;
    int per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    // Residency is computed for the largest shared memory this path takes, so it holds for every call.
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, hc_fused_kernel<T, kS, kCoop>, kHcFusedThreads,
                                                      static_cast<size_t>(kHcFusedMaxSmem)) != cudaSuccess) {
      return 0;
    }
    cached[device] = sms * (per_sm < 1 ? 0 : 1);
  }
  (void)smem;
  return cached[device];
}

template <class T, int kS, bool kCoop>
cudaError_t launch_hc_fused_typed(const HcArgs& p, cudaStream_t stream) {
  const size_t smem = hc_fused_smem_bytes(p);
  const int grid = hc_fused_grid<T, kS, kCoop>(smem);
  if (grid <= 0) return cudaErrorNotSupported;
  if constexpr (kCoop) {
    HcArgs args = p;
    void* params[] = {&args};
    return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(hc_fused_kernel<T, kS, kCoop>), dim3(grid),
                                       dim3(kHcFusedThreads), params, smem, stream);
  } else {
    hc_fused_kernel<T, kS, kCoop><<<grid, kHcFusedThreads, smem, stream>>>(p);
    return cudaGetLastError();
  }
}

}  // namespace qgate
