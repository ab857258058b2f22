// The HC route in one launch with its weights staged into shared memory by the bulk-copy engine
// (QGATE_HC_IMPL=tma4, the default, and its earlier versions tma, tma_v1, tma3; sm_90 only: other archs,
// shapes over kHcTmaMaxSmem of shared memory a block and weights not 16-byte aligned take the three
// kernels of fused_hc.cu). The steps below are tma's (v2); tma3 and tma4 change them as their comments
// at hc_tma_kernel and g_hc_tag_part say (tma4: step 4 is gone, step 5 spins on tagged words).
//
// Grid: one block per multiprocessor (G blocks, 256 threads, __launch_bounds__(256, 2) so that the
// next call's blocks fit beside this call's under programmatic dependent launch). Block b:
//   down task:  stream s = b / bpg (bpg = G / hc blocks per stream), rows [j rpb, (j + 1) rpb) of the
//               merged down projection (j = b % bpg), the columns of stream s only (s hs .. s hs + hs):
//               so the block needs the normalised stream s alone (one norm, one stream's inputs);
//   up task:    output positions [b ppb, (b + 1) ppb) (ppb = ceil(hs / G)): the hc rows of w_up per
//               position, the gate mix.
// 1. At entry thread 0 issues cp.async.bulk copies of the block's down rows (one per row, hs * 2 bytes)
//    and up rows (one per stream, ppb * rank * 2 bytes) into shared memory, each set on its own
//    mbarrier (transaction bytes), then lets the next kernel in the stream launch
//    (griddepcontrol.launch_dependents) and waits for the previous one (griddepcontrol.wait). The
//    weights are read before that wait: under PDL (QGATE_HC_PDL, default on) they must not be written
//    by a kernel still running before this one (a model's weights during inference: static).
// 2. Stream s: the pending combine h_s + c_s o (c_s = 2 sigmoid(inj_s / hc), or 1; rounded), the sum
//    of squares in a fixed order, rrms, y = x rrms, fma(y, w, y) rounded -> xn_s in shared memory. The
//    bpg blocks of stream s compute the same bits; each writes its slice of h_out and of xn (xn is
//    read back by the mix of other blocks).
// 3. Down rows: a thread per 16-byte vector of the row (fixed order: the thread's vectors in order, the
//    warp's xor butterfly, the 8 warps in order) -> partials[row * hc + s] (float32, no atomics).
// 4. Grid barrier: one 64-bit ticket counter per call slot (atom.acq_rel.gpu; every call adds G).
//    Plain launch: every block must be resident at once (one block per multiprocessor, checked by
//    the occupancy query), and two HC calls must not run concurrently on one device from different
//    streams when a block of this kernel does not fit twice on a multiprocessor.
// 5. Every block: down row r = sum over s in stream order of partials[r * hc + s] (the same bits on
//    every block), rounded; silu(raw / hc) rounded -> lora in shared memory; block 0 writes the
//    injection rows. The xn values of the block's positions (all streams) are loaded in the same trip.
// 6. Up dots from shared memory (8 threads a (position, stream) pair), gate = sigmoid(rounded dot),
//    block_input[i] = (sum over s in order of fma(gate_s, xn_s, acc)) / hc, rounded.
// Operations and roundings are those of the three-kernel path (fused_hc.cu); only float32 summation
// orders differ (sum of squares, the down and up dots), as the tests' tolerances allow.
// Tenth session: tma4 lets the next call launch after its down rows, not after the norm
// (QGATE_HC_ALLOW, default 3). A row-split form (v5: every block normalises every stream and owns
// whole down rows) was exact but slower at every setting (BENCH.md; in git at 02336c5).
// Diagnosis: QGATE_HC_PHASE_STOP=6 returns right after griddepcontrol.wait (once the weights are in);
// QGATE_HC_CLOCKS=2 counts points 1-7 from the wait's return; QGATE_HC_SPIN the poll backoff (ns).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "gemv_rows.cuh"
#include "hc_norm.cuh"
#include "launchers.h"

namespace qgate {

constexpr int kHcTmaThreads = 256;
constexpr int kHcTmaWarps = kHcTmaThreads / 32;
constexpr int kHcTmaRowChunk = 16;    // down rows reduced together (accumulators a thread)
constexpr int kHcTmaRowsPerThread = 3;  // post-barrier rows a thread: n_down <= 512 + 8 <= 3 * 256
constexpr int kHcTmaSlots = 64;
constexpr int kHcTmaMaxSmem = 200 * 1024;  // dynamic shared memory a block at most (sm_90: 227 KiB)

constexpr int kHcTmaPartialStride = 8;  // v2: floats a down row in `partials` (two 16-byte loads at most)

__device__ unsigned long long g_hc_tma_ticket[4][kHcTmaSlots];  // [v1, v2, v3, v4][slot]

// v4 (QGATE_HC_IMPL=tma4): no grid barrier; the down partials and the xn values other blocks read are
// published as tagged 64-bit words (low 32 bits the value, high 32 bits the call's epoch), each one
// stored and loaded whole (single-copy atomic), and a reader spins on the words it needs until their
// tags name its call. Epoch = ticket / G + 1 (each block adds 1 to its slot's counter once per call),
// so 0 (the buffers' initial value) never matches. Persistent buffers per call slot.
constexpr int kHcTagRows = kHcMaxRank + kHcMaxStreams;  // down rows
constexpr int kHcTagXn = 16384;                         // hc * hs at most for v4 (else: not applicable)
__device__ __align__(16) unsigned long long g_hc_tag_part[kHcTmaSlots][kHcTagRows * kHcTmaPartialStride];
__device__ __align__(16) unsigned long long g_hc_tag_xn[kHcTmaSlots][kHcTagXn];

// v3/v4 diagnosis (QGATE_HC_CLOCKS=1): thread 0 of each block records clock64() cycles since its entry at
// 8 points (0 griddepcontrol.wait returned, 1 inputs arrived, 2 norm done, 3 down rows arrived, 4 down
// rows done, 5 barrier passed, 6 partials and xn loaded + silu, 7 up dots done); max and min over blocks
// per call slot. After each call on a slot that is a multiple of 8 the launcher adds hc_tma_clk_print (one
// thread, a graph node when captured): it prints that slot's figures ("HCCLK", cycles) and resets them
// (a slot's first line holds min 0: the buffers start at 0).
constexpr int kHcClkPoints = 8;
__device__ unsigned long long g_hc_clk[kHcTmaSlots][kHcClkPoints][2];
__global__ void hc_tma_clk_print(int ver, int slot) {
  unsigned long long(*c)[2] = g_hc_clk[slot];
  printf("HCCLK v%d slot %d max %llu %llu %llu %llu %llu %llu %llu %llu min %llu %llu %llu %llu %llu %llu %llu %llu\n", ver, slot,
         c[0][0], c[1][0], c[2][0], c[3][0], c[4][0], c[5][0], c[6][0], c[7][0], c[0][1], c[1][1], c[2][1], c[3][1],
         c[4][1], c[5][1], c[6][1], c[7][1]);
  for (int k = 0; k < kHcClkPoints; ++k) {
    c[k][0] = 0;
    c[k][1] = ~0ull;
  }
}

struct HcTmaPlan {
  int bpg;     // blocks per stream for the down rows
  int rpb;     // down rows a block
  int ppb;     // output positions a block
  int n_down;  // down rows: rank (+ hc injection rows)
  int slot;    // ticket counter of this call
  int stop;    // QGATE_HC_PHASE_STOP (diagnosis): 1 norm, 2 down, 3 barrier, 5 weights only
  int pstride;  // floats a down row in `partials`: hc (v1) or kHcTmaPartialStride (v2, v3)
  int up_mode;  // v3 (QGATE_HC_UP): when the up rows are copied: 0 once the inputs arrived (as v2), 1 once
                // the inputs' loads are issued (default), 2 at entry (as v1)
  int nw_off, xs_off, lora_off, gate_off, xmix_off, down_off, up_off;  // byte offsets into shared memory
  int loraf_off;  // v3: lora as float32 (rank floats)
  int clocks;     // v3/v4: QGATE_HC_CLOCKS (2: points 1-7 counted from griddepcontrol.wait's return)
  int spin;       // v4: QGATE_HC_SPIN, ns between polls of tagged words
  int allow;      // v4: QGATE_HC_ALLOW, where the next call may launch (hc_tma_allow)
  int smem;
};

__device__ __forceinline__ float hc_tma_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t hc_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void hc_bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void hc_bulk_wait(uint32_t bar) {  // phase 0: each barrier is used once
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(0u)
        : "memory");
  } while (!done);
}
// Every block arrives once per call; the counter of a slot grows by gridDim.x per call, so a block's
// ticket says which multiple of gridDim.x ends its call.
__device__ __forceinline__ void hc_tma_grid_barrier(unsigned long long* ctr) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    unsigned long long old = 0;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(ctr) : "memory");
    const unsigned long long target = (old / n + 1) * n;
    unsigned long long now = old + 1;
    unsigned long long t0 = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (now < target) {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(ctr) : "memory");
      unsigned long long t = 0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > 5000000000ull) __trap();  // 5 s: a block never came (not resident): fail, not hang
    }
  }
  __syncthreads();
}
// v2: each block took a ticket (atomicAdd, returned) right after griddepcontrol.wait and adds 1 more
// here without a return (red.release): a call adds 2 gridDim.x, and the ticket (in [2 G k, 2 G k + 2 G))
// names the multiple of 2 G that ends call k. One round trip less than v1 (no returned atomic here).
__device__ __forceinline__ void hc_tma_grid_barrier_v2(unsigned long long* ctr, unsigned long long ticket) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long n2 = 2ull * gridDim.x;
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(ctr) : "memory");
    const unsigned long long target = (ticket / n2 + 1) * n2;
    unsigned long long now = 0;
    unsigned long long t0 = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(ctr) : "memory");
      unsigned long long t = 0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > 5000000000ull) __trap();
    } while (now < target);
  }
  __syncthreads();
}
__device__ __forceinline__ unsigned short hc_ld_cg_u16(const void* p) {
  return __ldcg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ void hc_tag_st(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void hc_tag_st2(unsigned long long* p, unsigned long long a, unsigned long long b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ unsigned long long hc_tag_ld(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void hc_tag_ld2(const unsigned long long* p, unsigned long long& a, unsigned long long& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ unsigned long long hc_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

template <class T>
__device__ __forceinline__ float hc_u16_to_float(unsigned short v) {
  T t;
  *reinterpret_cast<unsigned short*>(&t) = v;
  return to_float(t);
}

// v3: the 8 elements of a 16-byte vector as float32, from its four 32-bit words (values, not a pointer
// into shared memory: gemv_rows' fp16 dot8_acc reinterprets a uint4 reference as __half2s, which made
// nvcc split each 16-byte shared-memory load into four 4-byte loads with 4-way bank conflicts).
__device__ __forceinline__ float2 hc_pair_to_float2(uint32_t v, __half) {
  return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xffffu))),
                     __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16))));
}
__device__ __forceinline__ float2 hc_pair_to_float2(uint32_t v, __nv_bfloat16) { return bf16x2_to_float2(v); }

// The same operations in the same order as dot8_acc (element 0 .. 7, one fma each).
template <class T>
__device__ __forceinline__ float hc_dot8(const uint4 w, const uint4 x, float acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  const uint32_t xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 wf = hc_pair_to_float2(wv[i], T());
    const float2 xf = hc_pair_to_float2(xv[i], T());
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
  return acc;
}
// w (8 elements) against x already in float32 (x0: elements 0..3, x1: 4..7); same order as hc_dot8.
template <class T>
__device__ __forceinline__ float hc_dot8f(const uint4 w, const float4 x0, const float4 x1, float acc) {
  const float2 w0 = hc_pair_to_float2(w.x, T());
  const float2 w1 = hc_pair_to_float2(w.y, T());
  const float2 w2 = hc_pair_to_float2(w.z, T());
  const float2 w3 = hc_pair_to_float2(w.w, T());
  acc = fmaf(w0.x, x0.x, acc);
  acc = fmaf(w0.y, x0.y, acc);
  acc = fmaf(w1.x, x0.z, acc);
  acc = fmaf(w1.y, x0.w, acc);
  acc = fmaf(w2.x, x1.x, acc);
  acc = fmaf(w2.y, x1.y, acc);
  acc = fmaf(w3.x, x1.z, acc);
  acc = fmaf(w3.y, x1.w, acc);
  return acc;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Reduce-scatter of 16 per-thread row sums over a warp (16 shuffles, not 5 a row): after it lane l
// holds the warp's sum of row (l >> 1); the same additions in the same order on every lane pair.
// Written out stage by stage: a generic halving template moved instructions in the tma4 kernel.
__device__ __forceinline__ float hc_warp_reduce_scatter16(const float (&acc)[16], int lane) {
  float a8[8];
  const bool b4 = (lane >> 4) & 1;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float keep = b4 ? acc[k + 8] : acc[k];
    const float send = b4 ? acc[k] : acc[k + 8];
    a8[k] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
  float a4[4];
  const bool b3 = (lane >> 3) & 1;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float keep = b3 ? a8[k + 4] : a8[k];
    const float send = b3 ? a8[k] : a8[k + 4];
    a4[k] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  float a2[2];
  const bool b2 = (lane >> 2) & 1;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float keep = b2 ? a4[k + 2] : a4[k];
    const float send = b2 ? a4[k] : a4[k + 2];
    a2[k] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
  const bool b1 = (lane >> 1) & 1;
  float a1 = (b1 ? a2[1] : a2[0]) + __shfl_xor_sync(0xffffffffu, b1 ? a2[0] : a2[1], 2);
  a1 += __shfl_xor_sync(0xffffffffu, a1, 1);
  return a1;
}

// v3: down rows [c, c + C) of the block (C <= 16; rows past nr clamped to its last, computed, never
// stored) against xs; the v2 reduce-scatter (rows >= C are zeros in it), the warps in order.
template <class T, int C>
__device__ __forceinline__ void hc_tma_down_chunk(const uint4* down_v, const uint4* xs, int c, int nr, int hs_vec,
                                                  float (*red)[kHcTmaWarps], float* out, int pstride,
                                                  unsigned long long* tag_out, unsigned long long ep) {
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  float acc[kHcTmaRowChunk];
#pragma unroll
  for (int u = 0; u < kHcTmaRowChunk; ++u) acc[u] = 0.f;
  for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
    const uint4 xv = xs[v];
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const int row = min(c + u, nr - 1);
      acc[u] = hc_dot8<T>(down_v[row * hs_vec + v], xv, acc[u]);
    }
  }
  const float a1 = hc_warp_reduce_scatter16(acc, lane);
  if ((lane & 1) == 0) red[lane >> 1][warp] = a1;
  __syncthreads();
  if (tid < C && c + tid < nr) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kHcTmaWarps; ++w) sum += red[tid][w];
    if (tag_out != nullptr) {  // v4
      hc_tag_st(tag_out + static_cast<int64_t>(c + tid) * kHcTmaPartialStride, (ep << 32) | __float_as_uint(sum));
    } else {
      __stcg(out + static_cast<int64_t>(c + tid) * pstride, sum);
    }
  }
  __syncthreads();
}
#endif

// kV2 (QGATE_HC_IMPL=tma; v1 is QGATE_HC_IMPL=tma_v1, the first version, kept for comparison):
//   - only the down rows are copied before griddepcontrol.wait; the up rows once the block's inputs
//     have arrived (so the inputs' loads do not queue behind 40 KB a multiprocessor of up rows);
//   - the next kernel is let launch after the norm (not at entry), so that its weight copies do not
//     delay this call's inputs either but still stream during this call's down rows, barrier and tail;
//   - down rows: all 16 rows of a chunk computed without branches (rows past the block's clamped to
//     its last), reduced in a warp by one reduce-scatter (16 shuffles, not 5 a row);
//   - partials at a stride of 8 floats (16-byte loads), the barrier with the ticket taken early;
//   - up dots: two (position, stream) pairs a thread at once.
// (tma4: where the next kernel may launch is QGATE_HC_ALLOW, default 3: after the down rows.)
// kVer 3 (QGATE_HC_IMPL=tma3): v2 plus
//   - fp16: 16-byte shared-memory loads of the weights (hc_dot8: values, not a __half2 pointer);
//   - the up rows copied once every thread has issued its input loads (QGATE_HC_UP, plan.up_mode);
//   - down rows in chunks of 10 or 16 (10 rows a block at the production shape: v2 computed 16);
//   - lora kept in float32 in shared memory for the up dots (one conversion a product, not two).
// Same operations and summation orders as v2: the same bits.
template <class T, int kVer>
__global__ void __launch_bounds__(kHcTmaThreads, 2) hc_tma_kernel(HcArgs p, HcTmaPlan plan) {
  constexpr bool kV2 = kVer >= 2;
  constexpr bool kV3 = kVer >= 3;
  constexpr bool kV4 = kVer >= 4;
  __shared__ unsigned long long ep_s;  // v4: this call's epoch
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float red[kHcTmaRowChunk][kHcTmaWarps];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int hc = p.hc;
  const int rank = p.rank;
  const int hs = static_cast<int>(p.hs);
  const int64_t d = static_cast<int64_t>(hc) * hs;
  const int hs_vec = hs / 8;
  const int r_vec = rank / 8;
  const int b = blockIdx.x;
  const int s = b / plan.bpg;  // this block's stream of the down projection (>= hc: none)
  const int j = b - s * plan.bpg;
  const bool in_group = s < hc;
  const int r0 = j * plan.rpb;
  const int nr = in_group ? max(0, min(plan.n_down, r0 + plan.rpb) - r0) : 0;
  const int i0 = b * plan.ppb;
  const int np = max(0, min(hs, i0 + plan.ppb) - i0);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem);
  uint4* nws = reinterpret_cast<uint4*>(smem + plan.nw_off);
  uint4* xs = reinterpret_cast<uint4*>(smem + plan.xs_off);
  uint4* lora_v = reinterpret_cast<uint4*>(smem + plan.lora_off);
  T* lora = reinterpret_cast<T*>(lora_v);
  float* gate = reinterpret_cast<float*>(smem + plan.gate_off);
  float* xmix = reinterpret_cast<float*>(smem + plan.xmix_off);
  const uint4* down_v = reinterpret_cast<const uint4*>(smem + plan.down_off);
  const uint4* up_v = reinterpret_cast<const uint4*>(smem + plan.up_off);
  const uint32_t bar_down = hc_smem_addr(bars);
  const uint32_t bar_up = hc_smem_addr(bars + 1);
  long long clk0 = clock64();
  const bool clocks = kV3 && plan.clocks != 0;
  auto clk = [&](int point) {
    if (clocks && tid == 0) {
      const unsigned long long dt = static_cast<unsigned long long>(clock64() - clk0);
      atomicMax(&g_hc_clk[plan.slot][point][0], dt);
      atomicMin(&g_hc_clk[plan.slot][point][1], dt);
    }
  };

  // 1. The weights, issued before anything waits (they do not depend on the previous kernel).
  if (tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_down) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_up) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const uint32_t row_bytes = static_cast<uint32_t>(hs) * 2;
    if (nr > 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_down),
                   "r"(row_bytes * static_cast<uint32_t>(nr))
                   : "memory");
      const T* src = static_cast<const T*>(p.w_down) + static_cast<int64_t>(r0) * d + static_cast<int64_t>(s) * hs;
      const uint32_t dst = hc_smem_addr(smem + plan.down_off);
      for (int r = 0; r < nr; ++r) hc_bulk_copy(dst + r * row_bytes, src + r * d, row_bytes, bar_down);
    }
  }
  auto issue_up = [&]() {  // thread 0
    if (np > 0) {
      const uint32_t bytes = static_cast<uint32_t>(np) * rank * 2;
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_up),
                   "r"(bytes * static_cast<uint32_t>(hc))
                   : "memory");
      const uint32_t dst = hc_smem_addr(smem + plan.up_off);
      const uint32_t stream_bytes = static_cast<uint32_t>(plan.ppb) * rank * 2;
      for (int t = 0; t < hc; ++t) {
        const T* src = static_cast<const T*>(p.w_up) + (static_cast<int64_t>(t) * hs + i0) * rank;
        hc_bulk_copy(dst + t * stream_bytes, src, bytes, bar_up);
      }
    }
  };
  const bool up_early = !kV2 || !in_group || plan.stop == 5 || plan.stop == 6 || (kV3 && plan.up_mode == 2);
  if (tid == 0 && up_early) issue_up();
  if (!kV2 || (kV4 && plan.allow == 1)) allow_next_grid();
  __syncthreads();  // the barriers' initialisation before anyone waits on them
  if (plan.stop == 5) {
    if (nr > 0) hc_bulk_wait(bar_down);
    if (np > 0) hc_bulk_wait(bar_up);
    return;
  }
  wait_for_previous_grid();
  clk(0);
  if (plan.clocks == 2) clk0 = clock64();
  if (plan.stop == 6) {  // diagnosis: the launch and the wait alone
    if (nr > 0) hc_bulk_wait(bar_down);
    if (np > 0) hc_bulk_wait(bar_up);
    return;
  }
  unsigned long long ticket = 0;  // v2, thread 0
  if constexpr (kV2) {
    if (tid == 0 && (plan.stop == 0 || plan.stop == 3)) ticket = atomicAdd(&g_hc_tma_ticket[kV4 ? 3 : kV3 ? 2 : 1][plan.slot], 1ull);
    if ((!in_group && !(kV4 && plan.allow == 1)) || (in_group && kV4 && plan.allow == 2)) allow_next_grid();
  }

  if (in_group) {
    // 2. Combine and norm of stream s.
    const T* __restrict__ h = static_cast<const T*>(p.h) + static_cast<int64_t>(s) * hs;
    const T* __restrict__ o = static_cast<const T*>(p.block_output);
    const T* __restrict__ inj = static_cast<const T*>(p.injection);
    const T* __restrict__ nw =
        static_cast<const T*>(p.norm_weight) + (p.shared_norm_weight ? 0 : static_cast<int64_t>(s) * hs);
    const bool combine = o != nullptr;
    const int slice = (hs_vec + plan.bpg - 1) / plan.bpg;  // vectors of h_out and xn this block writes
    const int v_lo = j * slice;
    const int v_hi = v_lo + slice;
    const float inj_s = combine && inj != nullptr ? to_float(inj[s]) : 0.f;
    float sq = 0.f;
    // v3: each thread's first vector loaded before the up rows' copies are issued (up_mode 1).
    uint4 pre_h = make_uint4(0, 0, 0, 0);
    uint4 pre_o = make_uint4(0, 0, 0, 0);
    uint4 pre_w = make_uint4(0, 0, 0, 0);
    if constexpr (kV3) {
      if (tid < hs_vec) {
        pre_h = load_x16(h + tid * 8);
        if (combine) pre_o = load_x16(o + tid * 8);
        pre_w = load_x16(nw + tid * 8);
      }
      if (plan.up_mode == 1) {
        __syncthreads();  // every thread's input loads issued (not awaited) before the up rows queue
        if (tid == 0) issue_up();
      }
    }
    for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
      uint4 raw, oraw, wraw;
      if (kV3 && v == tid) {
        raw = pre_h;
        oraw = pre_o;
        wraw = pre_w;
      } else {
        raw = load_x16(h + v * 8);
        oraw = make_uint4(0, 0, 0, 0);
        if (combine) oraw = load_x16(o + v * 8);
        wraw = load_x16(nw + v * 8);
      }
      nws[v] = wraw;
      T* x = reinterpret_cast<T*>(&raw);
      if (combine) {
        const float c = inj != nullptr ? 2.0f * hc_tma_sigmoid(inj_s / static_cast<float>(hc)) : 1.0f;
        const T* ov = reinterpret_cast<const T*>(&oraw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xo = to_float(ov[e]);
          const float xh = to_float(x[e]);
          x[e] = round_to(inj != nullptr ? fmaf(xo, c, xh) : xh + xo, T());
        }
        if (v >= v_lo && v < v_hi) {
          *reinterpret_cast<uint4*>(static_cast<T*>(p.h_out) + static_cast<int64_t>(s) * hs + v * 8) = raw;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xf = to_float(x[e]);
        sq = fmaf(xf, xf, sq);
      }
      xs[v] = raw;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if (lane == 0) red[0][warp] = sq;
    if (kV4 && tid == 0) ep_s = ticket / gridDim.x + 1;
    __syncthreads();  // every thread's inputs have arrived
    clk(1);
    if (kV2 && tid == 0 && (!kV3 || plan.up_mode == 0)) issue_up();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kHcTmaWarps; ++w) total += red[0][w];
    const float rrms = 1.0f / sqrtf(total / static_cast<float>(hs) + p.eps);
    for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
      uint4 raw = xs[v];
      const uint4 wraw = nws[v];
      raw = hc_norm8<T>(raw, wraw, rrms);
      xs[v] = raw;
      if (v >= v_lo && v < v_hi) {
        *reinterpret_cast<uint4*>(static_cast<T*>(p.xn) + static_cast<int64_t>(s) * hs + v * 8) = raw;
        if constexpr (kV4) {
          const unsigned long long eh = ep_s << 32;
          const uint32_t w4[4] = {raw.x, raw.y, raw.z, raw.w};
          unsigned long long* dst = g_hc_tag_xn[plan.slot] + static_cast<int64_t>(s) * hs + v * 8;
#pragma unroll
          for (int e = 0; e < 4; ++e) hc_tag_st2(dst + 2 * e, eh | (w4[e] & 0xffffu), eh | (w4[e] >> 16));
        }
      }
    }
    __syncthreads();  // xs complete; red[0] read by everyone before the down rows reuse it
    clk(2);
    if (kV2 && (!kV4 || plan.allow == 0)) allow_next_grid();
    if (plan.stop == 1) {
      if (nr > 0) hc_bulk_wait(bar_down);
      if (np > 0) hc_bulk_wait(bar_up);
      return;
    }

    // 3. Down rows of stream s: partials[row * hc + s].
    if (nr > 0) {
      hc_bulk_wait(bar_down);
      clk(3);
      if constexpr (kV3) {
        float* out = p.partials + static_cast<int64_t>(r0) * plan.pstride + s;
        unsigned long long* tag_out =
            kV4 ? g_hc_tag_part[plan.slot] + static_cast<int64_t>(r0) * kHcTmaPartialStride + s : nullptr;
        for (int c = 0; c < nr; c += kHcTmaRowChunk) {
          if (nr - c <= 10) {
            hc_tma_down_chunk<T, 10>(down_v, xs, c, nr, hs_vec, red, out, plan.pstride, tag_out, ep_s);
          } else {
            hc_tma_down_chunk<T, kHcTmaRowChunk>(down_v, xs, c, nr, hs_vec, red, out, plan.pstride, tag_out, ep_s);
          }
        }
        clk(4);
      }
      for (int c = 0; kV2 && !kV3 && c < nr; c += kHcTmaRowChunk) {
        float acc[kHcTmaRowChunk];
#pragma unroll
        for (int u = 0; u < kHcTmaRowChunk; ++u) acc[u] = 0.f;
        for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
          const uint4 xv = xs[v];
#pragma unroll
          for (int u = 0; u < kHcTmaRowChunk; ++u) {
            const int row = min(c + u, nr - 1);  // rows past the block's: computed, never stored
            acc[u] = dot8_acc(down_v[row * hs_vec + v], xv, acc[u], T());
          }
        }
        // Reduce-scatter over the warp: after it lane l holds the warp's sum of row (l >> 1).
        const float a1 = hc_warp_reduce_scatter16(acc, lane);
        if ((lane & 1) == 0) red[lane >> 1][warp] = a1;
        __syncthreads();
        if (tid < kHcTmaRowChunk && c + tid < nr) {
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kHcTmaWarps; ++w) sum += red[tid][w];
          __stcg(p.partials + static_cast<int64_t>(r0 + c + tid) * plan.pstride + s, sum);
        }
        __syncthreads();
      }
      for (int c = 0; !kV2 && c < nr; c += kHcTmaRowChunk) {
        float acc[kHcTmaRowChunk];
#pragma unroll
        for (int u = 0; u < kHcTmaRowChunk; ++u) acc[u] = 0.f;
        for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
          const uint4 xv = xs[v];
#pragma unroll
          for (int u = 0; u < kHcTmaRowChunk; ++u) {
            if (c + u < nr) acc[u] = dot8_acc(down_v[(c + u) * hs_vec + v], xv, acc[u], T());
          }
        }
#pragma unroll
        for (int u = 0; u < kHcTmaRowChunk; ++u) {
          if (c + u < nr) {  // uniform over the block
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
            if (lane == 0) red[u][warp] = acc[u];
          }
        }
        __syncthreads();
        if (tid < kHcTmaRowChunk && c + tid < nr) {
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kHcTmaWarps; ++w) sum += red[tid][w];
          __stcg(p.partials + static_cast<int64_t>(r0 + c + tid) * plan.pstride + s, sum);
        }
        __syncthreads();
      }
    }
    if (kV4 && plan.allow == 3) allow_next_grid();  // after the down rows
  } else if (plan.stop == 1) {
    if (np > 0) hc_bulk_wait(bar_up);
    return;
  }
  if (plan.stop == 2) {
    if (np > 0) hc_bulk_wait(bar_up);
    return;
  }

  // 4. Every partial and every xn slice written before any block reads them.
  if constexpr (kV4) {
    if (!in_group && tid == 0) ep_s = ticket / gridDim.x + 1;
    __syncthreads();  // ep_s
  } else if constexpr (kV2) {
    hc_tma_grid_barrier_v2(&g_hc_tma_ticket[kV3 ? 2 : 1][plan.slot], ticket);  // v4: not reached
  } else {
    hc_tma_grid_barrier(&g_hc_tma_ticket[0][plan.slot]);
  }
  clk(5);
  if (plan.stop == 3) {
    if (np > 0) hc_bulk_wait(bar_up);
    return;
  }

  // 5. Down rows summed in stream order (the same bits on every block), silu; the xn of the positions.
  {
    const int n_rows = b == 0 ? plan.n_down : rank;  // block 0 also writes the injection rows
    float part[kHcTmaRowsPerThread][kHcMaxStreams];
    const T* xn_g = static_cast<const T*>(p.xn);
    if constexpr (kV4) {
      // Spin on the tagged words this thread needs (its rows' hc partials and its first xn value in
      // one pass, so that both are one round trip; xn values past the first, if any, after).
      const unsigned long long ep = ep_s;
      const unsigned long long t0 = hc_globaltimer();
      constexpr unsigned kXBit = 1u << kHcTmaRowsPerThread;
      unsigned pending = 0;
#pragma unroll
      for (int k = 0; k < kHcTmaRowsPerThread; ++k) {
        if (tid + k * kHcTmaThreads < n_rows) pending |= 1u << k;
      }
      const unsigned long long* xsrc = nullptr;
      if (tid < np * hc) {
        const int pp = tid / hc;
        xsrc = g_hc_tag_xn[plan.slot] + static_cast<int64_t>(tid - pp * hc) * hs + i0 + pp;
        pending |= kXBit;
      }
      while (pending != 0) {
        const unsigned long long xw = (pending & kXBit) ? hc_tag_ld(xsrc) : 0ull;
        unsigned long long w[kHcTmaRowsPerThread][kHcMaxStreams];
#pragma unroll
        for (int k = 0; k < kHcTmaRowsPerThread; ++k) {
          const unsigned long long* src = g_hc_tag_part[plan.slot] +
                                          static_cast<int64_t>(tid + k * kHcTmaThreads) * kHcTmaPartialStride;
#pragma unroll
          for (int g = 0; g < kHcMaxStreams; g += 2) {
            w[k][g] = w[k][g + 1] = ep << 32;
            if (((pending >> k) & 1u) && g < hc) hc_tag_ld2(src + g, w[k][g], w[k][g + 1]);
          }
        }
#pragma unroll
        for (int k = 0; k < kHcTmaRowsPerThread; ++k) {
          if ((pending >> k) & 1u) {
            bool ok = true;
#pragma unroll
            for (int g = 0; g < kHcMaxStreams; ++g) {
              if (g < hc) ok = ok && (w[k][g] >> 32) == ep;
              part[k][g] = g < hc ? __uint_as_float(static_cast<uint32_t>(w[k][g])) : 0.f;
            }
            if (ok) pending &= ~(1u << k);
          }
        }
        if ((pending & kXBit) && (xw >> 32) == ep) {
          xmix[tid] = hc_u16_to_float<T>(static_cast<unsigned short>(xw & 0xffffu));
          pending &= ~kXBit;
        }
        if (pending != 0) {
          if (hc_globaltimer() - t0 > 5000000000ull) __trap();
          __nanosleep(plan.spin);  // a little less L2 traffic from 132 x 256 pollers (QGATE_HC_SPIN, 32 ns)
        }
      }
      for (int q = tid + kHcTmaThreads; q < np * hc; q += kHcTmaThreads) {
        const int pp = q / hc;
        const int t = q - pp * hc;
        const unsigned long long* src = g_hc_tag_xn[plan.slot] + static_cast<int64_t>(t) * hs + i0 + pp;
        unsigned long long v = hc_tag_ld(src);
        while ((v >> 32) != ep) {
          if (hc_globaltimer() - t0 > 5000000000ull) __trap();
          v = hc_tag_ld(src);
        }
        xmix[q] = hc_u16_to_float<T>(static_cast<unsigned short>(v & 0xffffu));
      }
    }
#pragma unroll
    for (int k = 0; !kV4 && k < kHcTmaRowsPerThread; ++k) {
      const int r = tid + k * kHcTmaThreads;
      if constexpr (kV2) {
        if (r < n_rows) {
          const float4* src = reinterpret_cast<const float4*>(p.partials + static_cast<int64_t>(r) * kHcTmaPartialStride);
          const float4 lo = __ldcg(src);
          const float4 hi = hc > 4 ? __ldcg(src + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
          part[k][0] = lo.x, part[k][1] = lo.y, part[k][2] = lo.z, part[k][3] = lo.w;
          part[k][4] = hi.x, part[k][5] = hi.y, part[k][6] = hi.z, part[k][7] = hi.w;
        }
      } else {
#pragma unroll
        for (int g = 0; g < kHcMaxStreams; ++g) {
          part[k][g] = r < n_rows && g < hc ? __ldcg(p.partials + static_cast<int64_t>(r) * hc + g) : 0.f;
        }
      }
    }
    for (int q = tid; !kV4 && q < np * hc; q += kHcTmaThreads) {
      const int pp = q / hc;
      const int t = q - pp * hc;
      xmix[q] = hc_u16_to_float<T>(hc_ld_cg_u16(xn_g + static_cast<int64_t>(t) * hs + i0 + pp));
    }
#pragma unroll
    for (int k = 0; k < kHcTmaRowsPerThread; ++k) {
      const int r = tid + k * kHcTmaThreads;
      if (r < n_rows) {
        float sum = 0.f;
#pragma unroll
        for (int g = 0; g < kHcMaxStreams; ++g) {
          if (g < hc) sum += part[k][g];
        }
        const T raw = round_to(sum, T());
        if (r < rank) {
          const float x = to_float(raw) / static_cast<float>(hc);
          const T l = round_to(x * hc_tma_sigmoid(x), T());
          if constexpr (kV3) {
            reinterpret_cast<float*>(smem + plan.loraf_off)[r] = to_float(l);
          } else {
            lora[r] = l;
          }
        } else {
          static_cast<T*>(p.injection_out)[r - rank] = raw;
        }
      }
    }
  }
  __syncthreads();
  clk(6);

  // 6. Up dots (8 threads a (position, stream) pair), gates, the mix.
  if (np > 0) {
    hc_bulk_wait(bar_up);
    const int nq = np * hc;
    const int sub = tid & 7;
    const float4* lora_f = reinterpret_cast<const float4*>(smem + plan.loraf_off);
    for (int q0 = 0; kV3 && q0 < nq; q0 += kHcTmaThreads / 4) {
      const int qa = q0 + (tid >> 3);
      const int qb = qa + kHcTmaThreads / 8;
      const int ca = qa < nq ? qa : 0;
      const int cb = qb < nq ? qb : 0;
      const uint4* row_a = up_v + (static_cast<int64_t>(ca % hc) * plan.ppb + ca / hc) * r_vec;
      const uint4* row_b = up_v + (static_cast<int64_t>(cb % hc) * plan.ppb + cb / hc) * r_vec;
      float ga = 0.f;
      float gb = 0.f;
      for (int v = sub; v < r_vec; v += 8) {
        const float4 l0 = lora_f[2 * v];
        const float4 l1 = lora_f[2 * v + 1];
        ga = hc_dot8f<T>(row_a[v], l0, l1, ga);
        gb = hc_dot8f<T>(row_b[v], l0, l1, gb);
      }
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) {
        ga += __shfl_xor_sync(0xffffffffu, ga, off);
        gb += __shfl_xor_sync(0xffffffffu, gb, off);
      }
      if (sub == 0 && qa < nq) gate[qa] = hc_tma_sigmoid(to_float(round_to(ga, T())));
      if (sub == 0 && qb < nq) gate[qb] = hc_tma_sigmoid(to_float(round_to(gb, T())));
    }
    if (kV3) clk(7);
    for (int q0 = 0; kV2 && !kV3 && q0 < nq; q0 += kHcTmaThreads / 4) {
      const int qa = q0 + (tid >> 3);
      const int qb = qa + kHcTmaThreads / 8;
      const int ca = qa < nq ? qa : 0;  // an idle pair computes pair 0 and stores nothing
      const int cb = qb < nq ? qb : 0;
      const uint4* row_a = up_v + (static_cast<int64_t>(ca % hc) * plan.ppb + ca / hc) * r_vec;
      const uint4* row_b = up_v + (static_cast<int64_t>(cb % hc) * plan.ppb + cb / hc) * r_vec;
      float ga = 0.f;
      float gb = 0.f;
      for (int v = sub; v < r_vec; v += 8) {
        const uint4 lv = lora_v[v];
        ga = dot8_acc(row_a[v], lv, ga, T());
        gb = dot8_acc(row_b[v], lv, gb, T());
      }
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) {
        ga += __shfl_xor_sync(0xffffffffu, ga, off);
        gb += __shfl_xor_sync(0xffffffffu, gb, off);
      }
      if (sub == 0 && qa < nq) gate[qa] = hc_tma_sigmoid(to_float(round_to(ga, T())));
      if (sub == 0 && qb < nq) gate[qb] = hc_tma_sigmoid(to_float(round_to(gb, T())));
    }
    for (int q0 = 0; !kV2 && q0 < nq; q0 += kHcTmaThreads / 8) {
      const int q = q0 + (tid >> 3);
      const bool active = q < nq;
      float g = 0.f;
      if (active) {
        const int pp = q / hc;
        const int t = q - pp * hc;
        const uint4* row = up_v + (static_cast<int64_t>(t) * plan.ppb + pp) * r_vec;
        for (int v = sub; v < r_vec; v += 8) g = dot8_acc(row[v], lora_v[v], g, T());
      }
      g += __shfl_xor_sync(0xffffffffu, g, 4);
      g += __shfl_xor_sync(0xffffffffu, g, 2);
      g += __shfl_xor_sync(0xffffffffu, g, 1);
      if (active && sub == 0) gate[q] = hc_tma_sigmoid(to_float(round_to(g, T())));
    }
    __syncthreads();
    for (int pp = tid; pp < np; pp += kHcTmaThreads) {
      float acc = 0.f;
      for (int t = 0; t < hc; ++t) acc = fmaf(gate[pp * hc + t], xmix[pp * hc + t], acc);
      static_cast<T*>(p.block_input)[i0 + pp] = round_to(acc / static_cast<float>(hc), T());
    }
  }
#endif
}

// The plan for this device's multiprocessor count; false where the path does not apply (then the
// three kernels run).
inline bool plan_hc_tma(const HcArgs& p, int sms, bool v2, HcTmaPlan* plan) {  // v2: v2 or v3
  if (sms <= 0 || p.hc < 1 || p.hc > kHcMaxStreams || p.rank > kHcMaxRank) return false;
  const int hc = p.hc;
  const int64_t hs = p.hs;
  const int64_t rank = p.rank;
  const int n_down = p.rank + (p.use_combine ? hc : 0);
  if (n_down > kHcTmaRowsPerThread * kHcTmaThreads) return false;
  const int bpg = sms / hc;
  if (bpg < 1) return false;
  const int64_t rpb = (n_down + bpg - 1) / bpg;
  const int64_t ppb = (hs + sms - 1) / sms;
  auto up16 = [](int64_t x) { return (x + 15) / 16 * 16; };
  int64_t off = 128;  // two mbarriers
  HcTmaPlan q{};
  q.bpg = bpg;
  q.rpb = static_cast<int>(rpb);
  q.ppb = static_cast<int>(ppb);
  q.n_down = n_down;
  q.pstride = v2 ? kHcTmaPartialStride : hc;
  q.nw_off = static_cast<int>(off);
  off += up16(hs * 2);
  q.xs_off = static_cast<int>(off);
  off += up16(hs * 2);
  q.lora_off = static_cast<int>(off);
  off += up16(rank * 2);
  q.gate_off = static_cast<int>(off);
  off += up16(ppb * hc * 4);
  q.xmix_off = static_cast<int>(off);
  off += up16(ppb * hc * 4);
  q.loraf_off = static_cast<int>(off);
  off += up16(rank * 4);
  off = (off + 127) / 128 * 128;
  q.down_off = static_cast<int>(off);
  off += rpb * hs * 2;
  q.up_off = static_cast<int>(off);
  off += ppb * hc * rank * 2;
  if (off > kHcTmaMaxSmem) return false;
  q.smem = static_cast<int>(off);
  *plan = q;
  return true;
}

// QGATE_HC_PDL (read once per process): 0 launches without programmatic dependent launch.
inline bool hc_tma_pdl() {
  static const bool pdl = [] {
    const char* v = std::getenv("QGATE_HC_PDL");
    return v == nullptr || std::atoi(v) != 0;
  }();
  return pdl;
}

// QGATE_HC_UP (v3, read once per process): 0, 1 (default) or 2, see HcTmaPlan::up_mode.
inline int hc_tma_up_mode() {
  static const int mode = [] {
    const char* v = std::getenv("QGATE_HC_UP");
    const int m = v != nullptr ? std::atoi(v) : 1;
    return m >= 0 && m <= 2 ? m : 1;
  }();
  return mode;
}

// QGATE_HC_SPIN (read once per process): ns of __nanosleep between polls of tagged words (tma4).
inline int hc_spin_ns() {
  static const int ns = [] {
    const char* v = std::getenv("QGATE_HC_SPIN");
    const int n = v != nullptr ? std::atoi(v) : 32;
    return n >= 0 && n <= 10000 ? n : 32;
  }();
  return ns;
}

// QGATE_HC_ALLOW (read once per process): where tma4 lets the next call launch
// (griddepcontrol.launch_dependents): 0 after the norm (the ninth session's tma4), 1 at entry (before
// the wait), 2 right after the wait, 3 after the down rows (default: H200, tenth session, 6.66-6.98 us
// against 6.93-7.40 with 0 in the same call; 1 and 2 slower, BENCH.md). Earlier, the next call's
// weight copies (10.8 MB) queue ahead of this call's loads in the memory system.
inline int hc_tma_allow() {
  static const int a = [] {
    const char* v = std::getenv("QGATE_HC_ALLOW");
    const int m = v != nullptr ? std::atoi(v) : 3;
    return m >= 0 && m <= 3 ? m : 3;
  }();
  return a;
}
// cudaErrorNotSupported where the path does not apply (not sm_90+, weights not 16-byte aligned,
// shared memory over kHcTmaMaxSmem, no resident block): the caller runs the three kernels then.
template <class T, int kVer>
cudaError_t launch_hc_tma_typed(const HcArgs& p, int stop, cudaStream_t stream) {
  struct DeviceInfo {
    int sms = -1;  // -1 unknown, 0 path unavailable
  };
  static DeviceInfo info[64];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < 0 || device >= 64) return cudaErrorNotSupported;
  if (info[device].sms < 0) {
    int major = 0;
    int sms = 0;
    int per_sm = 0;
    if ((err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) return err;
    if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
    if (major >= 9) {
      if ((err = cudaFuncSetAttribute(hc_tma_kernel<T, kVer>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kHcTmaMaxSmem)) != cudaSuccess) {
        return err;
      }
      // Residency at the largest shared memory this path takes, so that it holds for every call.
      if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, hc_tma_kernel<T, kVer>, kHcTmaThreads,
                                                               static_cast<size_t>(kHcTmaMaxSmem))) != cudaSuccess) {
        return err;
      }
    }
    info[device].sms = major >= 9 && per_sm >= 1 ? sms : 0;
  }
  const int sms = info[device].sms;
  if (sms <= 0 || reinterpret_cast<uintptr_t>(p.w_down) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w_up) % 16 != 0 ||
      p.partials == nullptr) {
    return cudaErrorNotSupported;
  }
  HcTmaPlan plan{};
  if (!plan_hc_tma(p, sms, kVer >= 2, &plan)) return cudaErrorNotSupported;
  plan.up_mode = kVer >= 3 ? hc_tma_up_mode() : 0;
  static const int clocks = [] {
    const char* v = std::getenv("QGATE_HC_CLOCKS");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  plan.clocks = kVer >= 3 ? clocks : 0;
  if (kVer >= 4 && static_cast<int64_t>(p.hc) * p.hs > kHcTagXn) return cudaErrorNotSupported;
  plan.spin = hc_spin_ns();
  plan.allow = hc_tma_allow();
  static std::atomic<unsigned> next_slot{0};
  plan.slot = static_cast<int>(next_slot.fetch_add(1, std::memory_order_relaxed) % kHcTmaSlots);
  plan.stop = stop;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(sms));
  config.blockDim = dim3(kHcTmaThreads);
  config.dynamicSmemBytes = static_cast<size_t>(plan.smem);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = hc_tma_pdl() ? 1 : 0;
  err = cudaLaunchKernelEx(&config, hc_tma_kernel<T, kVer>, p, plan);
  if (err != cudaSuccess || plan.clocks == 0 || plan.slot % 8 != 0) return err;
  hc_tma_clk_print<<<1, 1, 0, stream>>>(kVer, plan.slot);
  return cudaGetLastError();
}

}  // namespace qgate
