// One-block top-k for short rows (n <= kTbMaxLen eligible keys, k <= kTbMaxK), every architecture:
// the whole row in the registers of one 1024-thread block, so no grid or cluster synchronisation.
// Included by qsa_topk.cu after key_of and select_bin; same key, tie rule and output as the other
// kernels (bit-identical).
//
//   load:    thread t holds keys t ITEMS .. t ITEMS + ITEMS - 1 (index order = thread order), key 0
//            for none (no float maps to 0).
//   passes:  8-bit radix select, most significant byte first, on a lane-striped histogram (bin b,
//            lane l at word 32 b + l: no bank conflict, no serialisation on the skewed top byte);
//            the pass stops early once the chosen bin holds exactly the keys still needed.
//   compact: keys above the prefix and (by increasing index, up to `need`) keys in the chosen bin,
//            written in index order by one block scan: exactly k keys.
//   order:   a bitonic sort, descending, of the k composites key << 32 | ~index (unique; equal keys
//            by increasing index: the stable sort's order of the contract).
// Used by the standalone kernel below (rows of L <= kTbMaxLen) and by the sm_90 push kernel for a
// row whose visible prefix is that short (its other blocks leave at once).
#pragma once

namespace qgate {
namespace {

constexpr int kTbThreads = 1024;
constexpr int kTbItems = 16;                                  // keys a thread holds
constexpr int64_t kTbMaxLen = int64_t(kTbThreads) * kTbItems;  // 16384
constexpr int kTbMaxK = kTbThreads;                           // the sort holds one key a thread

struct TbState {
  unsigned int bin, above;
  unsigned int warp[32];
};
constexpr size_t kTbStripedBytes = 256 * 32 * sizeof(unsigned int);
constexpr size_t kTbUnionBytes = kTbStripedBytes;
// Dynamic shared memory: striped histogram (zeroed before the call), the pass's 256 counts, the
// list of k keys (the sort's exchange buffer afterwards: 8 bytes an element either way), the state.
constexpr size_t kTbSmemBytes = kTbUnionBytes + 256 * sizeof(unsigned int) + kTbMaxK * sizeof(uint2) + sizeof(TbState);

// Exclusive block scan of v in thread order (kTbThreads threads); *total gets the block sum.
__device__ __forceinline__ unsigned int tb_scan(unsigned int v, unsigned int* warp_tot, unsigned int* total) {
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
  const unsigned int w = warp_tot[lane];  // kTbThreads / 32 == 32 warps
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

__device__ __forceinline__ void tb_zero(unsigned char* smem) {
  unsigned int* striped = reinterpret_cast<unsigned int*>(smem);
  for (int i = threadIdx.x; i < 256 * 32; i += kTbThreads) striped[i] = 0;
}

// Row s[0, n), k < n <= kTbMaxLen, k <= kTbMaxK; the striped histogram zeroed (tb_zero) and a block
// barrier since. Writes out[0, k). All kTbThreads threads call it.
__device__ __noinline__ void tb_select_row(const float* __restrict__ s, int n, int k, unsigned char* smem,
                                           int* __restrict__ out) {
  unsigned int* striped = reinterpret_cast<unsigned int*>(smem);
  unsigned int* hist = reinterpret_cast<unsigned int*>(smem + kTbUnionBytes);
  uint2* list = reinterpret_cast<uint2*>(hist + 256);
  TbState& st = *reinterpret_cast<TbState*>(list + kTbMaxK);
  const unsigned int lane = threadIdx.x & 31;
  const int first = threadIdx.x * kTbItems;

  uint32_t keys[kTbItems];
  if (first + kTbItems <= n && (reinterpret_cast<uintptr_t>(s + first) & 15) == 0) {
#pragma unroll
    for (int q = 0; q < kTbItems / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(s + first) + q);
      keys[4 * q] = key_of(v.x);
      keys[4 * q + 1] = key_of(v.y);
      keys[4 * q + 2] = key_of(v.z);
      keys[4 * q + 3] = key_of(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTbItems; ++j) keys[j] = first + j < n ? key_of(__ldg(s + first + j)) : 0u;
  }

  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  int shift = 24;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    shift = 24 - 8 * pass;
    const uint32_t hi_mask = pass == 0 ? 0u : 0xffffffffu << (shift + 8);  // bytes chosen so far
#pragma unroll
    for (int j = 0; j < kTbItems; ++j) {
      if (keys[j] != 0 && (keys[j] & hi_mask) == prefix) atomicAdd(striped + ((keys[j] >> shift) & 255u) * 32 + lane, 1u);
    }
    __syncthreads();
    {  // 4 threads a bin (consecutive lanes), 8 lane words each, read and zeroed for the next pass
      const unsigned int bin = threadIdx.x >> 2;
      unsigned int* p = striped + bin * 32 + (threadIdx.x & 3) * 8;
      unsigned int sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned int w = (i + bin) & 7;  // rotated: the 8 threads of a word group hit 8 banks
        sum += p[w];
        p[w] = 0;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if ((threadIdx.x & 3) == 0) hist[bin] = sum;
    }
    __syncthreads();
    select_bin<false>(hist, need, &st.bin, &st.above);
    __syncthreads();
    const unsigned int bin = st.bin;
    need -= st.above;
    prefix |= bin << shift;
    if (hist[bin] == need) break;  // every key of the bin is taken: no further byte decides
  }

  // Keys above the prefix at the stopping byte, and the first `need` keys in its bin by index.
  const uint32_t lo_pfx = prefix >> shift;
  unsigned int gt = 0;
  unsigned int eq = 0;
#pragma unroll
  for (int j = 0; j < kTbItems; ++j) {
    const uint32_t d = keys[j] >> shift;
    gt += keys[j] != 0 && d > lo_pfx;
    eq += keys[j] != 0 && d == lo_pfx;
  }
  unsigned int total = 0;
  const unsigned int excl = tb_scan(gt | (eq << 16), st.warp, &total);  // n < 2^16
  unsigned int seen = excl >> 16;
  unsigned int slot = (excl & 0xffffu) + (seen < need ? seen : need);
#pragma unroll
  for (int j = 0; j < kTbItems; ++j) {
    const uint32_t d = keys[j] >> shift;
    const uint2 e = make_uint2(keys[j], static_cast<unsigned int>(first + j));
    if (keys[j] != 0 && d > lo_pfx) {
      list[slot++] = e;
    } else if (keys[j] != 0 && d == lo_pfx) {
      if (seen < need) list[slot++] = e;
      ++seen;
    }
  }
  __syncthreads();

  // Order: a bitonic sort, descending, of the k composites (key << 32 | ~index: unique, larger for a
  // larger key, then for a smaller index: the stable sort's order) padded with 0 to P = a power of
  // two >= k (at least a warp); thread i holds element i. Distances under 32 are warp shuffles,
  // larger ones go through shared memory (the list, read into registers first).
  int p2 = 32;
  while (p2 < k) p2 <<= 1;
  const int i = threadIdx.x;
  unsigned long long v = 0;
  if (i < k) {
    const uint2 e = list[i];
    v = (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
  }
  __syncthreads();  // the list is the exchange buffer from here
  unsigned long long* xbuf = reinterpret_cast<unsigned long long*>(list);
  const bool active = i < p2;  // whole warps (p2 is a multiple of 32)
  for (int size = 2; size <= p2; size <<= 1) {
    const bool desc = (i & size) == 0;
    for (int j = size >> 1; j > 0; j >>= 1) {
      unsigned long long other;
      if (j >= 32) {
        if (active) xbuf[i] = v;
        __syncthreads();
        other = active ? xbuf[i ^ j] : 0ull;
        __syncthreads();
      } else {
        other = active ? __shfl_xor_sync(0xffffffffu, v, j) : 0ull;
      }
      const bool keep_max = ((i & j) == 0) == desc;
      v = keep_max ? (v > other ? v : other) : (v < other ? v : other);
    }
  }
  if (i < k) out[i] = static_cast<int>(0xffffffffu - static_cast<uint32_t>(v));
}

__global__ void __launch_bounds__(kTbThreads, 1) qsa_topk_block_kernel(TopkRows in, int k, int* __restrict__ indices) {
  extern __shared__ __align__(16) unsigned char tb_smem[];
  tb_zero(tb_smem);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // PDL as in the push kernel: nothing the previous kernel may write is read before the wait.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int row = blockIdx.x;
  const int64_t n = topk_row_len(in, row);
  int* out = indices + static_cast<int64_t>(row) * k;
  if (topk_fill_short(n, k, 0, 1, out)) return;
  __syncthreads();  // tb_zero
  tb_select_row(in.scores + static_cast<int64_t>(row) * in.stride, static_cast<int>(n), k, tb_smem, out);
}

}  // namespace
}  // namespace qgate
