// Copy of the first cluster top-k kernel (commit ba4a0a8, 43.5 us on the H200), renamed, with phase
// stamps, for tools/topk_bench.cu only: to see where its time went. Not part of the extension.
#pragma once
__device__ unsigned long long* g_oc_phase = nullptr;
#define OC_STAMP(i) \
  if (threadIdx.x == 0 && g_oc_phase != nullptr) g_oc_phase[blockIdx.x * 32 + (i)] = clock64()
#define OC_GSTAMP(i)                                                    \
  if (threadIdx.x == 0 && g_oc_phase != nullptr) {                      \
    unsigned long long t_;                                              \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));              \
    g_oc_phase[blockIdx.x * 32 + (i)] = t_;                             \
  }
// sm_90 path of qsa_topk: one thread-block cluster per row, the histograms and the candidates in
// distributed shared memory, so a row costs six cluster barriers (hardware, sub-microsecond) and no
// global workspace, memset or grid-wide barrier. Included by qsa_topk.cu after its helpers; same
// definition, same key, same passes, same tie rule, so the result is bit-identical to the grid path.
//
// C blocks of kOcThreads threads share a row (C = 1..16, a power of two); block r of the cluster
// owns the index range [r per, (r + 1) per). Per pass every block builds its 256-bin histogram in
// its own shared memory (one buffer per pass, so no buffer is rewritten while another block may read
// it), the cluster meets at a barrier, and every block sums bin t over the C blocks in rank order.
// Compaction: counts exchanged the same way; every block pushes its candidates into the candidate
// array of every block of the cluster (remote stores), a barrier, then each block orders k / C of
// them by counting larger composites. A last barrier keeps each block's shared memory alive while
// others may still read it.

namespace qgate {
namespace {

constexpr int kOcThreads = 1024;
constexpr int kOcWarps = kOcThreads / 32;
constexpr int kOcItems = 8;
constexpr int64_t kOcTile = static_cast<int64_t>(kOcItems) * kOcThreads;
constexpr int kOcMaxCluster = 16;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t oc_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// All threads of all blocks of the cluster; release/acquire makes shared (local and remote) writes
// before it visible after it. Also a block-wide barrier.
__device__ __forceinline__ void oc_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Generic address of the same shared variable in block `rank` of the cluster: plain loads and
// stores through it reach distributed shared memory, and the compiler may overlap them (ordered
// against oc_sync by its memory clobber).
template <class T>
__device__ __forceinline__ T* oc_map(T* p, uint32_t rank) {
  unsigned long long r;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(reinterpret_cast<unsigned long long>(p)), "r"(rank));
  return reinterpret_cast<T*>(r);
}

__device__ __forceinline__ void oc_load_tile(uint32_t (&keys)[kOcItems], const float* __restrict__ s, int64_t base,
                                             int64_t hi) {
#pragma unroll
  for (int j = 0; j < kOcItems; ++j) {
    const int64_t i = base + j * kOcThreads + threadIdx.x;
    keys[j] = i < hi ? key_of(__ldg(s + i)) : 0u;
  }
}

// Exclusive rank of `flag` in thread order over the block, block total in *total.
__device__ __forceinline__ unsigned int oc_block_rank(bool flag, unsigned int* warp_tot, unsigned int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const unsigned int mask = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_tot[warp] = __popc(mask);
  __syncthreads();
  unsigned int before = 0;
  unsigned int sum = 0;
#pragma unroll 8
  for (int w = 0; w < kOcWarps; ++w) {
    before += w < warp ? warp_tot[w] : 0;
    sum += warp_tot[w];
  }
  __syncthreads();
  *total = sum;
  return before + __popc(mask & ((1u << lane) - 1u));
}
#endif

__global__ void __launch_bounds__(kOcThreads, 1) old_cluster_kernel(const float* __restrict__ scores,
                                                                          int64_t len, int k, int csize,
                                                                          float* __restrict__ values,
                                                                          int64_t* __restrict__ indices) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ unsigned int sh_hist[4][256];
  __shared__ unsigned int sh_tot[256];
  __shared__ unsigned int sh_bin, sh_above, sh_gt_fill, sh_warp[kOcWarps];
  __shared__ uint2 sh_counts;
  __shared__ unsigned long long sh_cand[kTopkMaxK];
  const uint32_t rank = oc_rank();
  const int row = blockIdx.x / csize;
  const float* __restrict__ s = scores + static_cast<int64_t>(row) * len;
  const int64_t per = (len + csize - 1) / csize;
  const int64_t lo = static_cast<int64_t>(rank) * per < len ? static_cast<int64_t>(rank) * per : len;
  const int64_t hi = lo + per < len ? lo + per : len;
  const bool one_tile = hi - lo <= kOcTile;
  uint32_t keys[kOcItems];
  if (one_tile) oc_load_tile(keys, s, lo, hi);
  OC_GSTAMP(0);
  OC_STAMP(1);
  for (int i = threadIdx.x; i < 4 * 256; i += kOcThreads) (&sh_hist[0][0])[i] = 0;
  __syncthreads();

  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int64_t base = lo; base < hi; base += kOcTile) {
      if (!one_tile) oc_load_tile(keys, s, base, hi);
#pragma unroll
      for (int j = 0; j < kOcItems; ++j) {
        const bool valid = base + j * kOcThreads + threadIdx.x < hi;
        const bool counted = valid && (pass == 0 || (keys[j] >> (shift + 8)) == (prefix >> (shift + 8)));
        add_to_bin(sh_hist[pass], (keys[j] >> shift) & 255u, counted);
      }
    }
    oc_sync();
    if (threadIdx.x < 256) {
      unsigned int sum = 0;
#pragma unroll 16
      for (int r = 0; r < csize; ++r) sum += *oc_map(&sh_hist[pass][threadIdx.x], r);
      sh_tot[threadIdx.x] = sum;
    }
    __syncthreads();
    select_bin<false>(sh_tot, need, &sh_bin, &sh_above);
    __syncthreads();
    prefix |= sh_bin << shift;
    need -= sh_above;
    OC_STAMP(2 + pass);
  }
  const uint32_t thr = prefix;

  unsigned int my_gt = 0;
  unsigned int my_eq = 0;
  for (int64_t base = lo; base < hi; base += kOcTile) {
    if (!one_tile) oc_load_tile(keys, s, base, hi);
#pragma unroll
    for (int j = 0; j < kOcItems; ++j) {
      const bool valid = base + j * kOcThreads + threadIdx.x < hi;
      my_gt += valid && keys[j] > thr;
      my_eq += valid && keys[j] == thr;
    }
  }
  unsigned int tot = 0;
  // Block sums of my_gt and my_eq: warp sums, then warp 0 adds the 32 warp sums in order.
  {
    unsigned int g = my_gt;
    unsigned int e = my_eq;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      g += __shfl_xor_sync(0xffffffffu, g, off);
      e += __shfl_xor_sync(0xffffffffu, e, off);
    }
    __shared__ uint2 sh_we[kOcWarps];
    if ((threadIdx.x & 31) == 0) sh_we[threadIdx.x >> 5] = make_uint2(g, e);
    __syncthreads();
    if (threadIdx.x == 0) {
      uint2 t = make_uint2(0, 0);
      for (int w = 0; w < kOcWarps; ++w) t = make_uint2(t.x + sh_we[w].x, t.y + sh_we[w].y);
      sh_counts = t;
      sh_gt_fill = 0;
    }
  }
  OC_STAMP(6);
  oc_sync();
  unsigned int gt_before = 0;
  unsigned int eq_before = 0;
  for (uint32_t r = 0; r < rank; ++r) {
    const uint2 c = *oc_map(&sh_counts, r);
    gt_before += c.x;
    eq_before += c.y;
  }
  const unsigned int n_eq = sh_counts.y;
  const unsigned int eq_slot0 = static_cast<unsigned int>(k) - need;
  const bool take_eq = n_eq > 0 && eq_before < need;
  // Every candidate goes to slot `slot` of every block's sh_cand.
  auto push = [&](unsigned int slot, unsigned long long comp) {
    for (int r = 0; r < csize; ++r) *oc_map(&sh_cand[slot], r) = comp;
  };
  for (int64_t base = lo; base < hi; base += kOcTile) {
    if (!one_tile) oc_load_tile(keys, s, base, hi);
#pragma unroll
    for (int j = 0; j < kOcItems; ++j) {
      const int64_t i = base + j * kOcThreads + threadIdx.x;
      const unsigned long long comp =
          (static_cast<unsigned long long>(keys[j]) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
      if (i < hi && keys[j] > thr) push(gt_before + atomicAdd(&sh_gt_fill, 1u), comp);
      if (take_eq) {  // uniform across the block
        const bool eq = i < hi && keys[j] == thr;
        const unsigned int r_eq = oc_block_rank(eq, sh_warp, &tot);
        if (eq && eq_before + r_eq < need) push(eq_slot0 + eq_before + r_eq, comp);
        eq_before += tot;
      }
    }
  }
  oc_sync();
  OC_STAMP(7);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int c = static_cast<int>(rank) + csize * warp; c < k; c += csize * kOcWarps) {
    const unsigned long long mine = sh_cand[c];
    unsigned int larger = 0;
    for (int j = lane; j < k; j += 32) larger += sh_cand[j] > mine ? 1u : 0u;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) larger += __shfl_xor_sync(0xffffffffu, larger, off);
    if (lane == 0) {
      const int64_t idx = 0xffffffffu - static_cast<uint32_t>(mine & 0xffffffffu);
      const int64_t out = static_cast<int64_t>(row) * k + larger;
      values[out] = s[idx];
      indices[out] = idx;
    }
  }
  oc_sync();  // no block leaves while another may still read its shared memory
  OC_STAMP(8);
  OC_GSTAMP(20);
#endif
}

}  // namespace
}  // namespace qgate
