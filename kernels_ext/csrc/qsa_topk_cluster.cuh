// Shared pieces of the sm_90 top-k kernel (qsa_topk_push.cuh): one thread-block cluster per row,
// the same key (key_of), four 8-bit radix passes and tie rule as the grid path in qsa_topk.cu (which
// includes this file after its helpers), so the output is bit-identical on every path.
//
// C blocks share a row (C = 1..16, a power of two); block r owns the contiguous range
// [r per, (r + 1) per), per a multiple of ITEMS, and thread t holds ITEMS consecutive keys of each
// tile of NT x ITEMS (registers across all phases when the range is one tile, the usual case).
// Counting adds each key into a lane-striped histogram (bin b, lane l at word 32 b + l): the lanes of
// a warp never hit the same bank or word, so the skewed top byte costs no serialisation.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QGATE_TC_SM90 1
#endif

namespace qgate {
namespace {

constexpr int kTcItems = 8;       // consecutive keys a thread holds per tile
constexpr int kTcMaxCluster = 16;
constexpr size_t kTcStripedBytes = 256 * 32 * sizeof(unsigned int);
// Bytes of dynamic shared memory before the pass counts: the striped histogram.
constexpr size_t kTcUnionBytes = kTcStripedBytes;

// Small per-block state, in static shared memory.
struct TcShared {
  unsigned long long bar[5];  // one mbarrier per pass, one for the lists
  unsigned int bin, above, eq_before, nsel, cand;
  unsigned int thr, need_eq, kmin, kmax;  // the one-block path (tp_hist_row)
  unsigned int part[2 * kTcMaxCluster];
  unsigned int pass_bin[4];
  unsigned int warp[32];
  unsigned int off[kTcMaxCluster + 1];
  unsigned int top_warp[32];  // each warp's largest top key byte (the second histogram of pass 0)
};


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

#endif  // QGATE_TC_SM90

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

}  // namespace
}  // namespace qgate
