// Route qsa_topk: Qwen4Exp's QSA block selection (vLLM's `_topk` contract), per row of a batch.
//
// Row r holds n = clamp(visible[r], 0, L) eligible fp32 logits at scores + r * stride (the columns past
// n are never read). Output block_indices [rows, k] int32: n <= k: 0..n-1 then -1; n > k: the set of
// the first k of a stable sort by value descending (equal values at the k-th: lower index first),
// written in increasing index order (vLLM's consumer, expand_qsa_block_indices, needs no order). NaN
// of any payload ranks above +inf and all NaNs tie; -0.0 and +0.0 tie.
//
// Kernels: on sm_90 the push kernel (qsa_topk_push.cuh: one thread-block cluster a row); before
// sm_90 (no clusters) the portable grid kernel below. Both give the same bits.
//
// Method of the grid kernel: each float maps to an order-preserving 32-bit key (key_of). G blocks share a row, each
// owning a contiguous index range, and meet at row barriers (a cooperative launch guarantees they
// are all resident; G = 1 needs no barrier at all).
//   passes 0-3: a 256-bin histogram of key byte 3, 2, 1, 0 among the keys that match the prefix
//               chosen so far (block counts in shared memory, then integer atomics into the row's
//               global histogram: the sum is the same in any order); after the barrier every block
//               reads the same counts and picks the same byte. After four passes the k-th largest
//               key T is known exactly, and how many keys equal to T are needed (need_eq).
//   compaction: every block counts its keys > T and == T; after a barrier, exclusive sums over the
//               blocks before it (in index order) give each block its first output slot and the
//               ties it may still take; each block then writes its selected indices (keys > T, and
//               keys == T by increasing index until need_eq are taken) in index order.
// Each thread holds its keys in registers across the passes when the block's range fits one tile.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "launchers.h"

namespace qgate {
namespace {

constexpr int kTopkThreads = 256;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkItems = 8;               // keys a thread holds in registers
constexpr int64_t kTopkTile = kTopkItems * kTopkThreads;
constexpr int64_t kTopkPerBlock = 1024;     // least elements per block when the grid has room
constexpr int64_t kTopkTargetBlocks = 64;   // blocks per row to aim for
constexpr int kTopkMaxBlocksPerRow = 1024;
constexpr size_t kRowHeaderBytes = 4 * 256 * sizeof(unsigned int) + 16;  // 4 histograms + barrier

// The row's eligible length (every block of the row reads the same value).
__device__ __forceinline__ int64_t topk_row_len(const TopkRows& in, int row) {
  const int64_t n = in.visible[row];
  return n < 0 ? 0 : (n > in.len ? in.len : n);
}

// A row of n <= k eligible columns selects all of them: 0..n-1, then -1. Part `part` of `parts`
// blocks writes its share of the row and the caller returns (all blocks of the row do, together).
__device__ __forceinline__ bool topk_fill_short(int64_t n, int k, int part, int parts, int* __restrict__ out) {
  if (n > k) return false;
  for (int j = part * blockDim.x + threadIdx.x; j < k; j += parts * blockDim.x) out[j] = j < n ? j : -1;
  return true;
}

__device__ __forceinline__ uint32_t key_of(float f) {
  const uint32_t u = __float_as_uint(f);
  if (f != f) return 0xffffffffu;          // NaN: above +inf (0xff800000), all payloads equal
  if ((u << 1) == 0) return 0x80000000u;   // -0.0 == +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct RowWorkspace {
  unsigned int* hist;         // [4][256], zeroed by the caller
  unsigned int* barrier;      // arrival counter, zeroed by the caller
  uint2* counts;              // [G]: (keys > T, keys == T) per block
};

__device__ __forceinline__ RowWorkspace row_workspace(unsigned char* ws, size_t row_bytes, int row, int blocks) {
  unsigned char* base = ws + static_cast<size_t>(row) * row_bytes;
  RowWorkspace w;
  w.hist = reinterpret_cast<unsigned int*>(base);
  w.barrier = reinterpret_cast<unsigned int*>(base + 4 * 256 * sizeof(unsigned int));
  w.counts = reinterpret_cast<uint2*>(base + kRowHeaderBytes);
  return w;
}

// All G blocks of a row arrive before any leaves; the counter counts up monotonically per call.
// bar.sync, then one thread's release add / acquire loads at gpu scope: the block's earlier global
// writes and atomics are visible to every block that passes the same barrier (release and
// acquire are cumulative through bar.sync).
__device__ __forceinline__ void row_barrier(unsigned int* counter, unsigned int target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    unsigned int seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

// From the counts of 256 bins, lane l holding bins 255 - 8 l - e (e = 0..7, highest first) and their
// sum `mine`: the bin where the running count from the top reaches `need` goes to *bin, the count
// strictly above it to *above (one lane writes). All 32 lanes of a warp call it.
__device__ __forceinline__ void select_from_counts(const unsigned int (&c)[8], unsigned int mine, int lane,
                                                   unsigned int need, unsigned int* bin, unsigned int* above) {
  unsigned int incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  const unsigned int hit = __ballot_sync(0xffffffffu, incl >= need);
  const int first = __ffs(hit) - 1;  // need <= row total, so some lane hits
  if (lane == first) {
    unsigned int run = incl - mine;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (run + c[e] >= need) {
        *bin = 255 - 8 * lane - e;
        *above = run;
        break;
      }
      run += c[e];
    }
  }
}

// Warp 0 finds, from the top bin down, the bin where the running count reaches `need`; returns it
// in *bin and the count strictly above it in *above (shared memory).
// kGlobal: hist is the row's global histogram (read through L2, other blocks wrote it); otherwise
// shared memory.
template <bool kGlobal>
__device__ void select_bin(const unsigned int* hist, unsigned int need, unsigned int* bin, unsigned int* above) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x >= 32) return;
  unsigned int c[8];
  unsigned int mine = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {  // lane l holds bins 255 - 8 l - e, highest first
    c[e] = kGlobal ? __ldcg(hist + 255 - 8 * lane - e) : hist[255 - 8 * lane - e];
    mine += c[e];
  }
  select_from_counts(c, mine, lane, need, bin, above);
}

// Keys of one tile: all loads issued before any is used; out-of-range items are never read.
__device__ __forceinline__ void load_tile(uint32_t (&keys)[kTopkItems], const float* __restrict__ s, int64_t base,
                                          int64_t hi) {
#pragma unroll
  for (int j = 0; j < kTopkItems; ++j) {
    const int64_t i = base + j * kTopkThreads + threadIdx.x;
    keys[j] = i < hi ? key_of(__ldg(s + i)) : 0u;
  }
}

// Add one to sh_hist[bin] for every lane with `counted`: lanes with the same bin are merged first
// (__match_any_sync), so a warp does one shared atomic per distinct bin; the heavy bins of the top
// byte (sign and exponent) would otherwise serialise. Called by all 32 lanes.
__device__ __forceinline__ void add_to_bin(unsigned int* sh_hist, unsigned int bin, bool counted) {
  const unsigned int active = __ballot_sync(0xffffffffu, counted);
  if (counted) {
    const unsigned int peers = __match_any_sync(active, bin);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(sh_hist + bin, __popc(peers));
  }
}

// Sum of one value per thread over the block (integer: the order does not matter).
__device__ __forceinline__ unsigned int block_sum(unsigned int v, unsigned int* warp_tot) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if ((threadIdx.x & 31) == 0) warp_tot[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned int sum = 0;
#pragma unroll
  for (int w = 0; w < kTopkWarps; ++w) sum += warp_tot[w];
  __syncthreads();
  return sum;
}

// Block-wide exclusive scan of per-thread flags, in thread order; returns this thread's offset
// and adds the block total to *running (all threads see the same total).
__device__ __forceinline__ unsigned int block_rank(bool flag, unsigned int* warp_tot, unsigned int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned int mask = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_tot[warp] = __popc(mask);
  __syncthreads();
  unsigned int before = 0;
  unsigned int sum = 0;
#pragma unroll
  for (int w = 0; w < kTopkWarps; ++w) {
    before += w < warp ? warp_tot[w] : 0;
    sum += warp_tot[w];
  }
  __syncthreads();
  *total = sum;
  return before + __popc(mask & ((1u << lane) - 1u));
}

__global__ void __launch_bounds__(kTopkThreads) qsa_topk_kernel(TopkRows in, int k, int blocks, unsigned char* ws,
                                                                size_t row_bytes, int* __restrict__ indices) {
  __shared__ unsigned int sh_hist[256];
  __shared__ unsigned int sh_bin, sh_above, sh_warp[kTopkWarps];
  const int row = blockIdx.x / blocks;
  const int g = blockIdx.x - row * blocks;
  const int64_t len = topk_row_len(in, row);
  if (topk_fill_short(len, k, g, blocks, indices + static_cast<int64_t>(row) * k)) return;
  const float* __restrict__ s = in.scores + static_cast<int64_t>(row) * in.stride;
  const RowWorkspace w = row_workspace(ws, row_bytes, row, blocks);
  const int64_t per = (len + blocks - 1) / blocks;
  const int64_t lo = g * per;
  const int64_t hi = lo + per < len ? lo + per : len;
  unsigned int phase = 0;

  // The block's keys come in tiles of kTopkItems x 256: item j of thread t is index
  // base + 256 j + t (coalesced per j, and tile order is index order). When the block's range fits
  // one tile (the usual case) the keys are loaded once into registers; otherwise each loop reloads
  // its tiles (all kTopkItems loads of a tile in flight at once).
  const bool one_tile = hi - lo <= kTopkTile;
  uint32_t keys[kTopkItems];
  if (one_tile) load_tile(keys, s, lo, hi);

  // Radix select: four 8-bit passes, most significant byte first.
  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    sh_hist[threadIdx.x] = 0;  // kTopkThreads == 256 bins
    __syncthreads();
    for (int64_t base = lo; base < hi; base += kTopkTile) {
      if (!one_tile) load_tile(keys, s, base, hi);
#pragma unroll
      for (int j = 0; j < kTopkItems; ++j) {
        const bool valid = base + j * kTopkThreads + threadIdx.x < hi;
        const bool counted = valid && (pass == 0 || (keys[j] >> (shift + 8)) == (prefix >> (shift + 8)));
        add_to_bin(sh_hist, (keys[j] >> shift) & 255u, counted);
      }
    }
    __syncthreads();
    if (sh_hist[threadIdx.x] != 0) atomicAdd(w.hist + pass * 256 + threadIdx.x, sh_hist[threadIdx.x]);
    row_barrier(w.barrier, ++phase * blocks);
    select_bin<true>(w.hist + pass * 256, need, &sh_bin, &sh_above);
    __syncthreads();
    prefix |= sh_bin << shift;
    need -= sh_above;
  }
  const uint32_t thr = prefix;  // the k-th largest key; `need` keys equal to it are taken

  // Compaction: every block counts its keys > thr and == thr.
  unsigned int my_gt = 0;
  unsigned int my_eq = 0;
  for (int64_t base = lo; base < hi; base += kTopkTile) {
    if (!one_tile) load_tile(keys, s, base, hi);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const bool valid = base + j * kTopkThreads + threadIdx.x < hi;
      my_gt += valid && keys[j] > thr;
      my_eq += valid && keys[j] == thr;
    }
  }
  const unsigned int n_gt = block_sum(my_gt, sh_warp);
  const unsigned int n_eq = block_sum(my_eq, sh_warp);
  if (threadIdx.x == 0) w.counts[g] = make_uint2(n_gt, n_eq);
  row_barrier(w.barrier, ++phase * blocks);
  unsigned int gt_before = 0;
  unsigned int eq_before = 0;
  for (int b = 0; b < g; ++b) {  // a few hundred L2 reads at most, the same sums in every thread
    const uint2 c = __ldcg(w.counts + b);
    gt_before += c.x;
    eq_before += c.y;
  }
  // Output in increasing index order: a key is selected when it is > thr, or == thr and among the
  // first `need` ties of the row by index. The blocks before this one hold gt_before + min(eq_before,
  // need) selected keys; within the block, tiles and items run in index order and a block-wide rank
  // per item gives each selected key its slot. The tie rank runs only in blocks that hold needed ties.
  const bool take_eq = n_eq > 0 && eq_before < need;
  unsigned int slot = gt_before + (eq_before < need ? eq_before : need);
  int* __restrict__ out = indices + static_cast<int64_t>(row) * k;
  unsigned int tile_total = 0;
  for (int64_t base = lo; base < hi; base += kTopkTile) {
    if (!one_tile) load_tile(keys, s, base, hi);
#pragma unroll
    for (int j = 0; j < kTopkItems; ++j) {
      const int64_t i = base + j * kTopkThreads + threadIdx.x;
      bool sel = i < hi && keys[j] > thr;
      if (take_eq) {  // uniform across the block
        const bool eq = i < hi && keys[j] == thr;
        const unsigned int r_eq = block_rank(eq, sh_warp, &tile_total);
        sel = sel || (eq && eq_before + r_eq < need);
        eq_before += tile_total;
      }
      const unsigned int at = block_rank(sel, sh_warp, &tile_total);
      if (sel) out[slot + at] = static_cast<int>(i);
      slot += tile_total;
    }
  }
}

}  // namespace
}  // namespace qgate

#include "qsa_topk_cluster.cuh"
#include "qsa_topk_push.cuh"

namespace qgate {
namespace {

// Sets the attributes of one cluster kernel and returns the largest cluster (16 needs the
// non-portable opt-in, at least 8) that the device can run with `smem` bytes a block, 0 if none.
template <class Kernel>
cudaError_t largest_cluster(Kernel kernel, int threads, size_t smem, int* out) {
  *out = 0;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  for (int c = kTcMaxCluster; c >= 8; c /= 2) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t config = tc_launch_config(c, threads, smem, c, false, nullptr, attr);
    int clusters = 0;
    err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (err == cudaSuccess && clusters > 0) {
      *out = c;
      return cudaSuccess;
    }
    (void)cudaGetLastError();  // a refused size is not an error of the call
  }
  return cudaSuccess;
}

// Largest cluster the device runs the push kernel in, 0 when the device has no clusters (before
// sm_90: the grid path runs).
cudaError_t topk_max_cluster(int device, int* out) {
  *out = 0;
  int major = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  if (major < 9) return cudaSuccess;
  return largest_cluster(qsa_topk_push_kernel<kTcItems>, kTpThreads, kTpSmemBytes, out);
}

// The least power of two of blocks that hold one tile each, at most max_cluster (longer rows loop
// over tiles).
int tc_cluster_size(int64_t len, int max_cluster, int64_t tile, int items) {
  int c = 1;
  while (c < max_cluster && ((len + c - 1) / c + items - 1) / items * items > tile) c *= 2;
  return c;
}

// Blocks a row for the push kernel: one for a row of at most kTpBlockN columns; else the least that
// hold one tile each (tc_cluster_size), raised to 8 while the rows' blocks fit the SMs. Not to 16:
// on the H200 a row of 65,536 took 0.15-0.36 us longer in the decode step in clusters of 16 than of
// 8 (tools/topk_probe.cu, every input kind); 131,072 columns need 16 for one tile a block.
int tp_cluster_size(int64_t rows, int64_t len, int max_cluster, int sms) {
  if (len <= kTpBlockN) return 1;  // one block holds the row (tp_hist_row)
  int c = tc_cluster_size(len, max_cluster, static_cast<int64_t>(kTpThreads) * kTcItems, kTcItems);
  const int cap = max_cluster > 8 ? 8 : max_cluster;
  while (c < cap && rows * 2 * c <= sms) c *= 2;
  return c;
}

}  // namespace

cudaError_t plan_qsa_topk(int64_t rows, int64_t len, int64_t k, int device, TopkPlan* plan) {
  if (rows <= 0 || len <= 0 || k <= 0 || k > kTopkMaxK || len >= (int64_t(1) << 31)) {
    return cudaErrorInvalidValue;
  }
  static int max_cluster = -1;  // per process: one kind of GPU
  static int device_sms = 0;
  if (max_cluster < 0) {
    int found = 0;
    cudaError_t cerr = topk_max_cluster(device, &found);
    if (cerr != cudaSuccess) return cerr;
    cerr = cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device);
    if (cerr != cudaSuccess) return cerr;
    max_cluster = found;
  }
  plan->cluster = 0;
  if (max_cluster > 0) {  // sm_90: one cluster a row
    const int c = tp_cluster_size(rows, len, max_cluster, device_sms);
    if (rows * c > 0x7fffffff) return cudaErrorInvalidValue;
    plan->cluster = c;
    plan->blocks_per_row = c;
    plan->row_workspace_bytes = 0;
    plan->workspace_bytes = 0;
    return cudaSuccess;
  }
  int sms = 0;
  int per_sm = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qsa_topk_kernel, kTopkThreads, 0);
  if (err != cudaSuccess) return err;
  const int64_t resident = static_cast<int64_t>(sms) * per_sm;
  // About kTopkTargetBlocks blocks a row, at least kTopkPerBlock elements each: on the H200 more
  // blocks cost more in the row barriers than they save in the passes.
  const int64_t per_block = std::max<int64_t>(kTopkPerBlock, (len + kTopkTargetBlocks - 1) / kTopkTargetBlocks);
  int64_t blocks = (len + per_block - 1) / per_block;
  if (blocks > kTopkMaxBlocksPerRow) blocks = kTopkMaxBlocksPerRow;
  if (blocks * rows > resident) blocks = resident / rows;  // all blocks of the grid must be resident
  if (blocks < 1) blocks = 1;
  if (rows * blocks > 0x7fffffff) return cudaErrorInvalidValue;
  plan->blocks_per_row = static_cast<int>(blocks);
  const size_t row_bytes = kRowHeaderBytes + static_cast<size_t>(blocks) * sizeof(uint2);
  plan->row_workspace_bytes = (row_bytes + 15) / 16 * 16;
  plan->workspace_bytes = plan->row_workspace_bytes * static_cast<size_t>(rows);
  return cudaSuccess;
}

cudaError_t launch_qsa_topk(const TopkRows& in, int64_t rows, int64_t k, const TopkPlan& plan, void* workspace,
                            int* indices, cudaStream_t stream) {
  int k32 = static_cast<int>(k);
  if (plan.cluster > 0) {
    // PDL: the kernel reads visible and the scores only after griddepcontrol.wait (qsa_topk_push.cuh).
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t config =
        tc_launch_config(rows * plan.cluster, kTpThreads, kTpSmemBytes, plan.cluster, true, stream, attr);
    cudaError_t err = cudaLaunchKernelEx(&config, qsa_topk_push_kernel<kTcItems>, in, k32, plan.cluster, indices);
    if (err != cudaSuccess) return err;
    return cudaGetLastError();
  }
  const int blocks = plan.blocks_per_row;
  const dim3 grid(static_cast<unsigned>(rows * blocks));
  const dim3 block(kTopkThreads);
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  size_t row_bytes = plan.row_workspace_bytes;
  if (blocks == 1) {  // no barrier ever waits on another block: an ordinary launch is enough
    qsa_topk_kernel<<<grid, block, 0, stream>>>(in, k32, blocks, ws, row_bytes, indices);
    return cudaGetLastError();
  }
  TopkRows in_arg = in;
  int blocks_arg = blocks;
  void* args[] = {&in_arg, &k32, &blocks_arg, &ws, &row_bytes, &indices};
  cudaError_t err = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(qsa_topk_kernel), grid, block, args, 0,
                                                stream);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace qgate
