// The HC route on sm_90 in one launch with its weights staged into shared memory by the bulk-copy
// engine and no grid barrier (other archs, shapes over kHcTmaMaxSmem of shared memory a block or
// hc * hs over kHcTagXn, and weights not 16-byte aligned take the three kernels of fused_hc.cu).
//
// Grid: one block per multiprocessor (G blocks, 256 threads, __launch_bounds__(256, 2) so that the
// next call's blocks fit beside this call's under programmatic dependent launch). Block b:
//   down task:  stream s = b / bpg (bpg = G / hc blocks per stream), rows [j rpb, (j + 1) rpb) of the
//               merged down projection (j = b % bpg), the columns of stream s only (s hs .. s hs + hs):
//               so the block needs the normalised stream s alone (one norm, one stream's inputs);
//   up task:    output positions [b ppb, (b + 1) ppb) (ppb = ceil(hs / G)): the hc rows of w_up per
//               position, the gate mix.
// 1. At entry thread 0 issues cp.async.bulk copies of the block's down rows (one per row, hs * 2
//    bytes) into shared memory on their mbarrier, then every block waits for the previous kernel
//    (griddepcontrol.wait). The weights are read before that wait: under PDL they must not be written
//    by a kernel still running before this one (a model's weights during inference: static). A block
//    without a down task copies its up rows at entry too and lets the next kernel launch at once.
// 2. Stream s: each thread issues its first input loads, then thread 0 queues the up rows' copies
//    (one per stream, ppb * rank * 2 bytes; after the inputs, so that those do not queue behind 40 KB
//    a multiprocessor of up rows). The pending combine h_s + c_s o (c_s = 2 sigmoid(inj_s / hc), or
//    1; rounded), the sum of squares in a fixed order, rrms, y = x rrms, fma(y, w, y) rounded -> xn_s
//    in shared memory. The bpg blocks of stream s compute the same bits; each writes its slice of
//    h_out, of xn and of the tagged xn words other blocks read.
// 3. Down rows of the chunk (10 or 16 rows, rows past the block's clamped to its last and never
//    stored): a thread per 16-byte vector (its vectors in order), one warp reduce-scatter, the 8 warps
//    in order -> the tagged partial of (row, s). Then the next call may launch: its weight copies
//    (10.8 MB at the production shape) would otherwise queue ahead of this call's loads.
// 4. Every block: down row r = sum over s in stream order of the tagged partials (the same bits on
//    every block), rounded; silu(raw / hc) rounded -> lora (float32) in shared memory; block 0
//    writes the injection rows. The xn values of the block's positions (all streams) come in the
//    same polling trip.
// 5. Up dots from shared memory (8 threads a (position, stream) pair, two pairs at once),
//    gate = sigmoid(rounded dot), block_input[i] = (sum over s in order of fma(gate_s, xn_s, acc)) /
//    hc, rounded.
// Published values are tagged 64-bit words (low 32 bits the value, high 32 bits the call's epoch),
// each stored and loaded whole (single-copy atomic); a reader spins on the words it needs until
// their tags name its call. Epoch = ticket / G + 1 (each block adds 1 to its slot's counter once per
// call), so 0 (the buffers' initial value) never matches. Every block must be resident at once (one
// block per multiprocessor, checked by the occupancy query): a reader spins on other blocks' words.
// Operations and roundings are those of the three-kernel path (fused_hc.cu); only float32 summation
// orders differ (sum of squares, the down and up dots), as the tests' tolerances allow.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "gemv_rows.cuh"
#include "hc_norm.cuh"
#include "launchers.h"

namespace qgate {

constexpr int kHcTmaThreads = 256;
constexpr int kHcTmaWarps = kHcTmaThreads / 32;
constexpr int kHcTmaRowChunk = 16;    // down rows reduced together (accumulators a thread)
constexpr int kHcTmaRowsPerThread = 3;  // down rows a thread sums in step 4: n_down <= 512 + 8 <= 3 * 256
constexpr int kHcTmaSlots = 64;  // calls in flight at once (each its ticket counter and tagged buffers)
constexpr int kHcTmaMaxSmem = 200 * 1024;  // dynamic shared memory a block at most (sm_90: 227 KiB)

constexpr int kHcTmaPartialStride = 8;  // tagged words a down row (hc <= 8: 16-byte loads)
// ns between polls of tagged words: a little less L2 traffic from 132 x 256 pollers (0 and 128 timed
// the same).
constexpr unsigned kHcTagPollNs = 32;

__device__ unsigned long long g_hc_tma_ticket[kHcTmaSlots];

constexpr int kHcTagRows = kHcMaxRank + kHcMaxStreams;  // down rows
constexpr int kHcTagXn = 16384;                         // hc * hs at most (else: not applicable)
__device__ __align__(16) unsigned long long g_hc_tag_part[kHcTmaSlots][kHcTagRows * kHcTmaPartialStride];
__device__ __align__(16) unsigned long long g_hc_tag_xn[kHcTmaSlots][kHcTagXn];

struct HcTmaPlan {
  int bpg;     // blocks per stream for the down rows
  int rpb;     // down rows a block
  int ppb;     // output positions a block
  int n_down;  // down rows: rank (+ hc injection rows)
  int slot;    // ticket counter and tagged buffers of this call
  int nw_off, xs_off, gate_off, xmix_off, loraf_off, down_off, up_off;  // byte offsets into shared memory
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

// The 8 elements of a 16-byte vector as float32, from its four 32-bit words (values, not a pointer
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
// Written out stage by stage: a generic halving template moved instructions in this kernel.
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

// Down rows [c, c + C) of the block (C <= 16; rows past nr clamped to its last, computed, never
// stored) against xs; the reduce-scatter (rows >= C are zeros in it), the warps in order, each sum
// published as the tagged partial of (row, stream).
template <class T, int C>
__device__ __forceinline__ void hc_tma_down_chunk(const uint4* down_v, const uint4* xs, int c, int nr, int hs_vec,
                                                  float (*red)[kHcTmaWarps], unsigned long long* tag_out,
                                                  unsigned long long ep) {
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
    hc_tag_st(tag_out + static_cast<int64_t>(c + tid) * kHcTmaPartialStride, (ep << 32) | __float_as_uint(sum));
  }
  __syncthreads();
}
#endif

template <class T>
__global__ void __launch_bounds__(kHcTmaThreads, 2) hc_tma_kernel(HcArgs p, HcTmaPlan plan) {
  __shared__ unsigned long long ep_s;  // this call's epoch
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
  float* gate = reinterpret_cast<float*>(smem + plan.gate_off);
  float* xmix = reinterpret_cast<float*>(smem + plan.xmix_off);
  float* lora_f = reinterpret_cast<float*>(smem + plan.loraf_off);
  const uint4* down_v = reinterpret_cast<const uint4*>(smem + plan.down_off);
  const uint4* up_v = reinterpret_cast<const uint4*>(smem + plan.up_off);
  const uint32_t bar_down = hc_smem_addr(bars);
  const uint32_t bar_up = hc_smem_addr(bars + 1);

  // 1. The down rows, issued before anything waits (they do not depend on the previous kernel).
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
  if (tid == 0 && !in_group) issue_up();
  __syncthreads();  // the barriers' initialisation before anyone waits on them
  wait_for_previous_grid();
  unsigned long long ticket = 0;  // thread 0
  if (tid == 0) ticket = atomicAdd(&g_hc_tma_ticket[plan.slot], 1ull);
  if (!in_group) allow_next_grid();

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
    // Each thread's first vector loaded before the up rows' copies are issued.
    uint4 pre_h = make_uint4(0, 0, 0, 0);
    uint4 pre_o = make_uint4(0, 0, 0, 0);
    uint4 pre_w = make_uint4(0, 0, 0, 0);
    if (tid < hs_vec) {
      pre_h = load_x16(h + tid * 8);
      if (combine) pre_o = load_x16(o + tid * 8);
      pre_w = load_x16(nw + tid * 8);
    }
    __syncthreads();  // every thread's input loads issued (not awaited) before the up rows queue
    if (tid == 0) issue_up();
    for (int v = tid; v < hs_vec; v += kHcTmaThreads) {
      uint4 raw, oraw, wraw;
      if (v == tid) {
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
    if (tid == 0) ep_s = ticket / gridDim.x + 1;
    __syncthreads();  // every thread's inputs have arrived
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
        const unsigned long long eh = ep_s << 32;
        const uint32_t w4[4] = {raw.x, raw.y, raw.z, raw.w};
        unsigned long long* dst = g_hc_tag_xn[plan.slot] + static_cast<int64_t>(s) * hs + v * 8;
#pragma unroll
        for (int e = 0; e < 4; ++e) hc_tag_st2(dst + 2 * e, eh | (w4[e] & 0xffffu), eh | (w4[e] >> 16));
      }
    }
    __syncthreads();  // xs complete; red[0] read by everyone before the down rows reuse it

    // 3. Down rows of stream s: the tagged partials of (row, s).
    if (nr > 0) {
      hc_bulk_wait(bar_down);
      unsigned long long* tag_out = g_hc_tag_part[plan.slot] + static_cast<int64_t>(r0) * kHcTmaPartialStride + s;
      for (int c = 0; c < nr; c += kHcTmaRowChunk) {
        if (nr - c <= 10) {  // 10 rows a block at the production shape: not 16 computed
          hc_tma_down_chunk<T, 10>(down_v, xs, c, nr, hs_vec, red, tag_out, ep_s);
        } else {
          hc_tma_down_chunk<T, kHcTmaRowChunk>(down_v, xs, c, nr, hs_vec, red, tag_out, ep_s);
        }
      }
    }
    allow_next_grid();  // after the down rows (see step 3 above)
  }

  if (!in_group && tid == 0) ep_s = ticket / gridDim.x + 1;
  __syncthreads();  // ep_s

  // 4. Down rows summed in stream order (the same bits on every block), silu; the xn of the positions.
  {
    const int n_rows = b == 0 ? plan.n_down : rank;  // block 0 also writes the injection rows
    float part[kHcTmaRowsPerThread][kHcMaxStreams];
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
        const unsigned long long* src =
            g_hc_tag_part[plan.slot] + static_cast<int64_t>(tid + k * kHcTmaThreads) * kHcTmaPartialStride;
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
        if (hc_globaltimer() - t0 > 5000000000ull) __trap();  // 5 s: a block never came: fail, not hang
        __nanosleep(kHcTagPollNs);
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
          lora_f[r] = to_float(round_to(x * hc_tma_sigmoid(x), T()));  // float32: one conversion a product
        } else {
          static_cast<T*>(p.injection_out)[r - rank] = raw;
        }
      }
    }
  }
  __syncthreads();

  // 5. Up dots (8 threads a (position, stream) pair, two pairs at once), gates, the mix.
  if (np > 0) {
    hc_bulk_wait(bar_up);
    const int nq = np * hc;
    const int sub = tid & 7;
    const float4* lora4 = reinterpret_cast<const float4*>(lora_f);
    for (int q0 = 0; q0 < nq; q0 += kHcTmaThreads / 4) {
      const int qa = q0 + (tid >> 3);
      const int qb = qa + kHcTmaThreads / 8;
      const int ca = qa < nq ? qa : 0;  // an idle pair computes pair 0 and stores nothing
      const int cb = qb < nq ? qb : 0;
      const uint4* row_a = up_v + (static_cast<int64_t>(ca % hc) * plan.ppb + ca / hc) * r_vec;
      const uint4* row_b = up_v + (static_cast<int64_t>(cb % hc) * plan.ppb + cb / hc) * r_vec;
      float ga = 0.f;
      float gb = 0.f;
      for (int v = sub; v < r_vec; v += 8) {
        const float4 l0 = lora4[2 * v];
        const float4 l1 = lora4[2 * v + 1];
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
inline bool plan_hc_tma(const HcArgs& p, int sms, HcTmaPlan* plan) {
  if (sms <= 0 || p.hc < 1 || p.hc > kHcMaxStreams || p.rank > kHcMaxRank) return false;
  if (static_cast<int64_t>(p.hc) * p.hs > kHcTagXn) return false;
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
  q.nw_off = static_cast<int>(off);
  off += up16(hs * 2);
  q.xs_off = static_cast<int>(off);
  off += up16(hs * 2);
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

// cudaErrorNotSupported where the path does not apply (not sm_90+, weights not 16-byte aligned,
// shape outside plan_hc_tma, no resident block): the caller runs the three kernels then. Launched
// with PDL (see step 1).
template <class T>
cudaError_t launch_hc_tma_typed(const HcArgs& p, cudaStream_t stream) {
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
      if ((err = cudaFuncSetAttribute(hc_tma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      kHcTmaMaxSmem)) != cudaSuccess) {
        return err;
      }
      // Residency at the largest shared memory this path takes, so that it holds for every call.
      if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, hc_tma_kernel<T>, kHcTmaThreads,
                                                               static_cast<size_t>(kHcTmaMaxSmem))) != cudaSuccess) {
        return err;
      }
    }
    info[device].sms = major >= 9 && per_sm >= 1 ? sms : 0;
  }
  const int sms = info[device].sms;
  if (sms <= 0 || reinterpret_cast<uintptr_t>(p.w_down) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w_up) % 16 != 0) {
    return cudaErrorNotSupported;
  }
  HcTmaPlan plan{};
  if (!plan_hc_tma(p, sms, &plan)) return cudaErrorNotSupported;
  static std::atomic<unsigned> next_slot{0};
  plan.slot = static_cast<int>(next_slot.fetch_add(1, std::memory_order_relaxed) % kHcTmaSlots);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(sms));
  config.blockDim = dim3(kHcTmaThreads);
  config.dynamicSmemBytes = static_cast<size_t>(plan.smem);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, hc_tma_kernel<T>, p, plan);
}

}  // namespace qgate
