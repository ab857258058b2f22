// sm_90 path of qsa_topk: one thread-block cluster per row. Same definition, same key (key_of), same
// four 8-bit radix passes, same tie rule as the grid path in qsa_topk.cu (which includes this file
// after its helpers), so the output is bit-identical; no global workspace, memset or grid barrier.
//
// C blocks of NT threads share a row (C = 1..16, a power of two); block r owns the contiguous range
// [r per, (r + 1) per), per a multiple of ITEMS, and thread t holds ITEMS consecutive keys of each
// tile of NT x ITEMS (registers across all phases when the range is one tile, the usual case).
//   passes 0-3: every thread adds its counted keys into a lane-striped histogram (bin b, lane l at
//               word 32 b + l): the lanes of a warp never hit the same bank or word, so the skewed top
//               byte costs no serialisation (no __match_any_sync). The block's 256 counts go to
//               shared memory (one buffer per pass, never rewritten while another block may read
//               it), a cluster barrier, then every block sums bin b over the C blocks in rank order
//               (distributed shared memory) and picks the same byte.
//   compaction: the block's ties before it (pass-3 counts of the other blocks, already read) and one
//               block-wide scan of (keys > T, keys == T) per thread give each selected key its slot
//               in the block's own list, in increasing index order.
//   ordering:   every block reads the C lists in rank order (all k selected keys of the row), puts
//               them into the cells that the passes define (exact counts from the pass totals, so
//               the order between cells is known: tc_cell), and ranks the keys in its 1/C of the
//               list by counting larger composites (key << 32 | ~index) within their cell, so
//               the order is the stable sort's; the indices are written as int32.
// Cluster barriers: one per pass, one after the compaction, and one that keeps every block's shared
// memory alive until every block has read its list.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QGATE_TC_SM90 1
#endif

namespace qgate {
namespace {

constexpr int kTcThreads = 1024;  // threads a block (production configuration, BENCH.md)
constexpr int kTcItems = 8;       // consecutive keys a thread holds per tile
constexpr int kTcMaxCluster = 16;
constexpr size_t kTcStripedBytes = 256 * 32 * sizeof(unsigned int);
// Bytes of dynamic shared memory before the pass counts: the striped histogram, aliased by the cell
// offsets and fill counters of the ordering afterwards.
constexpr size_t kTcUnionBytes = kTcStripedBytes;
constexpr int kTcCells = 4 * 256;

// Small per-block state, in static shared memory.
struct TcShared {
  unsigned long long bar[5];  // push path (qsa_topk_push.cuh): one mbarrier per pass, one for the lists
  unsigned int bin, above, eq_before, nsel, max_key, cand, queued, mixed;
  unsigned int part[2 * kTcMaxCluster];
  unsigned int pass_bin[4];
  unsigned int warp[32];
  unsigned int off[kTcMaxCluster + 1];
  unsigned int top_warp[32];  // push path, QGATE_TP_SPEC: each warp's largest top key byte
};

#ifdef QGATE_TOPK_PHASES
// Phase timestamps (tools/topk_bench.cu): [block][32] clock64 / %globaltimer readings, null when off.
__device__ unsigned long long* g_tc_phase = nullptr;
__device__ __forceinline__ unsigned long long tc_gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define TC_STAMP(i) \
  if (threadIdx.x == 0 && g_tc_phase != nullptr) g_tc_phase[blockIdx.x * 32 + (i)] = clock64()
#define TC_GSTAMP(i) \
  if (threadIdx.x == 0 && g_tc_phase != nullptr) g_tc_phase[blockIdx.x * 32 + (i)] = tc_gtimer()
#else
#define TC_STAMP(i)
#define TC_GSTAMP(i)
#endif

#ifdef QGATE_TC_SM90
__device__ __forceinline__ uint32_t tc_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// All threads of all blocks of the cluster; release/acquire makes shared (local and remote) writes
// before it visible after it. Also a block-wide barrier.
__device__ __forceinline__ void tc_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void tc_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void tc_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// Generic address of the same shared variable in block `rank` of the cluster.
template <class T>
__device__ __forceinline__ T* tc_map(T* p, uint32_t rank) {
  unsigned long long r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(reinterpret_cast<unsigned long long>(p)), "r"(rank));
  return reinterpret_cast<T*>(r);
}

// This thread's ITEMS consecutive keys from index `first`; indices at or past `hi` get key 0, which
// no float maps to (the least key, of -inf, is 0x007fffff), so 0 marks "no element" everywhere.
template <int ITEMS>
__device__ __forceinline__ void tc_load(uint32_t (&keys)[ITEMS], const float* __restrict__ s, int64_t first,
                                        int64_t hi) {
  static_assert(ITEMS % 4 == 0, "ITEMS must be a multiple of 4");
  if (first + ITEMS <= hi && (reinterpret_cast<uintptr_t>(s + first) & 15) == 0) {
#pragma unroll
    for (int q = 0; q < ITEMS / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(s + first) + q);
      keys[4 * q] = key_of(v.x);
      keys[4 * q + 1] = key_of(v.y);
      keys[4 * q + 2] = key_of(v.z);
      keys[4 * q + 3] = key_of(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) keys[j] = first + j < hi ? key_of(__ldg(s + first + j)) : 0u;
  }
}

// Adds the keys that match the prefix above byte `shift` into the lane-striped histogram.
template <int ITEMS>
__device__ __forceinline__ void tc_count(unsigned int* striped, const uint32_t (&keys)[ITEMS], int shift,
                                         uint32_t prefix, bool first_pass) {
  const unsigned int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const uint32_t key = keys[j];
    const bool counted = key != 0 && (first_pass || ((key ^ prefix) >> (shift + 8)) == 0);
    if (counted) atomicAdd(striped + ((key >> shift) & 255u) * 32 + lane, 1u);
  }
}

// Block `rank`'s range [lo, hi) of a row of len keys split over csize blocks (a multiple of ITEMS
// each, the last one shorter or empty).
template <int ITEMS>
__device__ __forceinline__ void tc_block_range(int64_t len, int csize, uint32_t rank, int64_t* lo, int64_t* hi) {
  int64_t per = (len + csize - 1) / csize;
  per = (per + ITEMS - 1) / ITEMS * ITEMS;
  *lo = static_cast<int64_t>(rank) * per < len ? static_cast<int64_t>(rank) * per : len;
  *hi = *lo + per < len ? *lo + per : len;
}

// One pass's counts of this block's range [lo, hi): from the keys in registers when the range is one
// tile, else tile by tile from memory (keys is scratch then).
template <int NT, int ITEMS>
__device__ __forceinline__ void tc_count_range(unsigned int* striped, uint32_t (&keys)[ITEMS],
                                               const float* __restrict__ s, int64_t lo, int64_t hi, bool one_tile,
                                               int shift, uint32_t prefix, bool first_pass) {
  constexpr int64_t kTile = static_cast<int64_t>(NT) * ITEMS;
  if (one_tile) {
    tc_count(striped, keys, shift, prefix, first_pass);
    return;
  }
  for (int64_t base = lo; base < hi; base += kTile) {
    tc_load(keys, s, base + threadIdx.x * ITEMS, hi);
    tc_count(striped, keys, shift, prefix, first_pass);
  }
}

#ifdef QGATE_TOPK_PHASES
// Phase clocks only: waits for the keys of a one-tile range, so the loads are timed apart.
template <int ITEMS>
__device__ __forceinline__ void tc_stamp_loaded(const uint32_t (&keys)[ITEMS], bool one_tile, TcShared& sh) {
  if (one_tile) {
    uint32_t any = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) any |= keys[j];
    if (any == 1u) sh.max_key = any;
  }
  __syncthreads();
  TC_STAMP(21);
}
#define TC_STAMP_LOADED(keys, one_tile, sh) tc_stamp_loaded(keys, one_tile, sh)
#else
#define TC_STAMP_LOADED(keys, one_tile, sh)
#endif

// hist[b] = sum over lanes of striped[32 b + l], and the striped words back to zero. NT / 256
// threads a bin, each over a rotated run of lanes (no bank conflicts).
template <int NT>
__device__ __forceinline__ void tc_reduce(unsigned int* striped, unsigned int* hist) {
  constexpr int kTpb = NT / 256;
  constexpr int kLanes = 32 / kTpb;
  const int bin = threadIdx.x / kTpb;
  const int part = threadIdx.x % kTpb;
  unsigned int sum = 0;
#pragma unroll
  for (int i = 0; i < kLanes; ++i) {
    unsigned int* p = striped + bin * 32 + part * kLanes + ((i + bin) & (kLanes - 1));
    sum += *p;
    *p = 0;
  }
#pragma unroll
  for (int off = kTpb / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (part == 0) hist[bin] = sum;
}

// Exclusive block scan of v in thread order; *total gets the block sum. Two block barriers.
template <int NT>
__device__ __forceinline__ unsigned int tc_scan(unsigned int v, unsigned int* warp_tot, unsigned int* total) {
  constexpr int kWarps = NT / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  unsigned int incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int u = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += u;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  const unsigned int w = lane < kWarps ? warp_tot[lane] : 0u;
  unsigned int wincl = w;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int u = __shfl_up_sync(0xffffffffu, wincl, off);
    if (lane >= off) wincl += u;
  }
  *total = __shfl_sync(0xffffffffu, wincl, 31);
  const unsigned int before = __shfl_sync(0xffffffffu, wincl - w, warp);
  __syncthreads();
  return before + incl - v;
}

#include "qsa_topk_order.cuh"
#endif  // QGATE_TC_SM90

template <int NT, int ITEMS>
__global__ void __launch_bounds__(NT, 1) qsa_topk_cluster_kernel(TopkRows in, int k, int csize,
                                                                  int* __restrict__ indices) {
#ifdef QGATE_TC_SM90
  constexpr int64_t kTile = static_cast<int64_t>(NT) * ITEMS;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  __shared__ TcShared sh;
  unsigned int* striped = reinterpret_cast<unsigned int*>(tc_smem);
  unsigned int* hist = reinterpret_cast<unsigned int*>(tc_smem + kTcUnionBytes);  // [4][256]
  unsigned int* tot = hist + 4 * 256;                                           // [4][256] row totals
  uint2* sel = reinterpret_cast<uint2*>(tot + 4 * 256);                        // [k] this block's list
  uint2* all = sel + k;                                                         // [k] the row's lists
  unsigned long long* cell_items = reinterpret_cast<unsigned long long*>(all + k);  // [k] by cell
  TC_GSTAMP(0);
  TC_STAMP(1);
  const uint32_t rank = tc_rank();
  const int row = blockIdx.x / csize;
  const int64_t len = topk_row_len(in, row);
  // A short row: every block of the cluster leaves here, before any cluster barrier.
  if (topk_fill_short(len, k, static_cast<int>(rank), csize, indices + static_cast<int64_t>(row) * k)) return;
  const float* __restrict__ s = in.scores + static_cast<int64_t>(row) * in.stride;
  int64_t lo = 0;
  int64_t hi = 0;
  tc_block_range<ITEMS>(len, csize, rank, &lo, &hi);
  const bool one_tile = hi - lo <= kTile;
  const int64_t mine = threadIdx.x * ITEMS;  // this thread's first index within a tile
  uint32_t keys[ITEMS];
  if (one_tile) tc_load(keys, s, lo + mine, hi);
  for (int i = threadIdx.x; i < 256 * 32; i += NT) striped[i] = 0;
  __syncthreads();
  TC_STAMP_LOADED(keys, one_tile, sh);

  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  unsigned int eq_before = 0;  // keys == T in the blocks before this one
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    tc_count_range<NT>(striped, keys, s, lo, hi, one_tile, shift, prefix, pass == 0);
    __syncthreads();
    tc_reduce<NT>(striped, hist + pass * 256);
    TC_STAMP(2 + 3 * pass);
    tc_sync();
    TC_STAMP(3 + 3 * pass);
    unsigned int v[kTcMaxCluster];
    if (threadIdx.x < 256) {
      unsigned int total = 0;
#pragma unroll
      for (int r = 0; r < kTcMaxCluster; ++r) {
        v[r] = r < csize ? *tc_map(hist + pass * 256 + threadIdx.x, static_cast<uint32_t>(r)) : 0u;
        total += v[r];
      }
      tot[pass * 256 + threadIdx.x] = total;
    }
    __syncthreads();
    select_bin<false>(tot + pass * 256, need, &sh.bin, &sh.above);
    __syncthreads();
    const unsigned int bin = sh.bin;
    if (threadIdx.x == 0) sh.pass_bin[pass] = bin;
    prefix |= bin << shift;
    need -= sh.above;
    if (pass == 3) {  // bin b of pass 3 counts the keys == T: the ties in the blocks before this one
      if (threadIdx.x == bin) {
        unsigned int before = 0;
#pragma unroll
        for (int r = 0; r < kTcMaxCluster; ++r) before += r < static_cast<int>(rank) ? v[r] : 0u;
        sh.eq_before = before;
      }
      __syncthreads();
      eq_before = sh.eq_before;
    }
    TC_STAMP(4 + 3 * pass);
  }
  const uint32_t thr = prefix;  // the k-th largest key; `need` keys equal to it are taken

  // Compaction into this block's list, in index order: keys > thr, and keys == thr while the row's
  // tie rank (ties in earlier blocks and tiles first) is below need.
  unsigned int nsel = 0;
  for (int64_t base = lo; base < hi; base += kTile) {
    if (!one_tile) tc_load(keys, s, base + mine, hi);
    unsigned int gt = 0;
    unsigned int eq = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      gt += keys[j] > thr;
      eq += keys[j] == thr;
    }
    unsigned int total = 0;
    const unsigned int excl = tc_scan<NT>(gt | (eq << 16), sh.warp, &total);  // tile <= 2^16 keys
    const unsigned int rem = need > eq_before ? need - eq_before : 0u;        // ties still to take
    unsigned int seen = excl >> 16;
    unsigned int slot = nsel + (excl & 0xffffu) + (seen < rem ? seen : rem);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const uint32_t idx = static_cast<uint32_t>(base + mine + j);
      if (keys[j] > thr) {
        sel[slot++] = make_uint2(keys[j], idx);
      } else if (keys[j] == thr) {
        if (seen < rem) sel[slot++] = make_uint2(keys[j], idx);
        ++seen;
      }
    }
    const unsigned int eq_tot = total >> 16;
    nsel += (total & 0xffffu) + (eq_tot < rem ? eq_tot : rem);
    eq_before += eq_tot;
  }
  if (threadIdx.x == 0) sh.nsel = nsel;
  TC_STAMP(14);
  tc_sync();
  TC_STAMP(15);
  // Every block reads the C lists in rank order: all k selected keys of the row, in index order.
  if (threadIdx.x < 32) {
    const unsigned int n = threadIdx.x < static_cast<unsigned int>(csize) ? *tc_map(&sh.nsel, threadIdx.x) : 0u;
    unsigned int incl = n;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned int u = __shfl_up_sync(0xffffffffu, incl, off);
      if (threadIdx.x >= off) incl += u;
    }
    if (threadIdx.x <= kTcMaxCluster) sh.off[threadIdx.x] = incl - n;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < k; p += NT) {
    int r = 0;
    while (r + 1 < csize && static_cast<int>(sh.off[r + 1]) <= p) ++r;
    all[p] = *tc_map(sel + (p - static_cast<int>(sh.off[r])), static_cast<uint32_t>(r));
  }
  tc_arrive();  // this block has read every list; it waits for the others before it leaves
  TC_STAMP(16);
  tc_order<NT>(striped, tot, sh, all, k, 4, cell_items, k, need, thr, rank, csize,
               indices + static_cast<int64_t>(row) * k);
  tc_wait();
  TC_STAMP(19);
  TC_GSTAMP(20);
#endif
}

// Launch of `blocks` blocks of `threads` in clusters of `csize`, optionally with programmatic
// dependent launch; attr (two entries) must outlive the launch call.
inline cudaLaunchConfig_t tc_launch_config(int64_t blocks, int threads, size_t smem, int csize, bool pdl,
                                           cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(csize);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 2 : 1;
  return config;
}

// Dynamic shared memory of one block for k.
inline size_t tc_smem_bytes(int64_t k) {
  return kTcUnionBytes + 8 * 256 * sizeof(unsigned int) + static_cast<size_t>(k) * 3 * sizeof(uint2);
}

}  // namespace
}  // namespace qgate
