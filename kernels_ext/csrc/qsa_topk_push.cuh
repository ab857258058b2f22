// The sm_90 kernel of qsa_topk: one thread-block cluster per row, counts and candidates pushed
// (st.async into every block's shared memory, completing on that block's mbarrier) rather than
// pulled after cluster barriers (one barrier a pass fewer), and the passes finished locally once the
// candidates are few. Same definition, key (key_of), passes and tie rule as the grid path, with the
// helpers of qsa_topk_cluster.cuh: bit-identical output (the selected indices in increasing order).
//
// C blocks of 1024 threads share a row, block r owning [r per, (r + 1) per). A row of at most 4096
// eligible keys (a row of few columns, which runs in a cluster of one block, or few visible blocks)
// is selected by block 0 alone on a 4096-bin histogram (tp_hist_row); the others leave.
//   cluster passes: every block counts byte p of its keys matching the prefix (lane-striped
//       histogram), pushes its 256 counts (as 16-bit pairs when a block holds at most 65535 keys)
//       into slot r of every block's receive buffer for pass p,
//       waits on its own mbarrier of pass p (all C pushes landed), sums the C rows and picks the
//       same byte. After pass p the keys whose bytes down to p are >= the prefix are the candidates:
//       (k - need) above it and the ones in the chosen bin. When they are at most 4 k (and fit
//       the candidate buffer, kTpCap), or after pass 3 (then the ties are trimmed to `need` by
//       index: exactly k), stop.
//   candidate lists: every block knows every block's pass counts, hence every block's candidate
//       count and offset (in rank order, so the row's list is in increasing index order). Each
//       block writes its candidates (one block scan) into its own buffer and pushes them to the
//       others, then waits on its list mbarrier.
//   local passes: every block runs the remaining passes over the candidate list in its own shared
//       memory (the same counts in every block), which gives the k-th largest key T and the ties
//       it takes; one block scan trims the list to the keys > T and the first `need` ties (the k
//       selected keys, still in index order). Each block writes its 1/C of the k indices.
// No block reads another block's shared memory, so no cluster barrier is needed after the one that
// publishes the mbarrier initialisation (overlapped with the loads). Launched with PDL (see below).
#pragma once

// QGATE_TP_MARK(i): a time stamp at step i of the one-block path, for tools/topk_probe.cu (which
// defines it before including this file); nothing otherwise.
#ifndef QGATE_TP_MARK
#define QGATE_TP_MARK(i)
#endif

namespace qgate {
namespace {

constexpr int kTpThreads = 1024;  // the pushes and the offset sums map 64 threads to each of 16 blocks
constexpr int kTpCap = 12288;     // candidates a block holds for the local passes
// The cluster passes stop once the candidates are at most this many times k (fewer passes against a
// longer local list).
constexpr unsigned int kTpPerK = 4;
constexpr size_t kTpRecvWords = 4 * kTcMaxCluster * 256;  // [pass][source block][bin]
// Second histogram of pass 0: each block also counts byte 2 of its keys whose top byte is its
// largest (lane-striped over 8 lanes). When pass 0 picks the row's largest top byte (nothing above
// the bin) and pass 1 is needed, a block's pass-1 counts are that histogram if its largest top byte
// is the bin, else zero: pass 1 is not counted. It keeps rows of many ties (integers) under 13 us at
// 1 x 131072, k 2048, for ~0.3 us more on continuous rows.
// Pass counts are pushed as 16-bit pairs (half the bytes, half the st.async) when no block holds
// more than 65535 keys; else 32-bit words. The striped histogram of a cluster pass is zeroed while
// the block waits for the pushed counts (the reduce only reads). A block waits for pushed data by
// spinning on mbarrier.test_wait with acquire at CTA scope (tp_wait: the cluster-scope acquire
// would invalidate L1 in every warp at every wait, and nothing read after it is in global memory).
constexpr unsigned int kTpSpecLanes = 8;
constexpr size_t kTpSpecBytes = 256 * kTpSpecLanes * sizeof(unsigned int);
// Dynamic shared memory: striped histogram, this block's counts of a pass, the row totals [4][256],
// the receive buffers (aliased by the final list of k keys once the offsets are known), the
// candidate buffer.
constexpr size_t kTpSmemBytes = kTcUnionBytes + (256 + 4 * 256 + kTpRecvWords) * sizeof(unsigned int) +
                                static_cast<size_t>(kTpCap) * sizeof(uint2) + kTpSpecBytes;  // + [256][8] (*)
static_assert(kTpCap < 65536, "tp_trim packs candidate counts into 16 bits");
static_assert(8 * kTopkMaxK <= kTpRecvWords * sizeof(unsigned int), "the final list must fit the receive buffers");

// The one-block path (tp_hist_row): a row of at most kTpBlockN eligible keys is selected by block 0
// alone, four consecutive keys a thread, over a histogram of kThBins coarse bins.
constexpr int kTpBlockN = 4 * kTpThreads;
constexpr int kThBins = 4096;
// Candidates of the k-th key's coarse bin ranked by warp ballots up to this many (a warp's cost grows
// with the square of the count); more: 8-bit radix rounds over their keys.
constexpr unsigned int kThBallotMax = 128;
static_assert(kThBins * sizeof(unsigned int) <= kTcUnionBytes, "the coarse histogram fits the zeroed striped words");
static_assert(kTpBlockN <= kTpCap, "a block row's candidates fit the candidate buffer");

#ifdef QGATE_TC_SM90
__device__ __forceinline__ uint32_t tp_saddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Address of the same shared location in block `rank` of the cluster (shared::cluster window).
__device__ __forceinline__ uint32_t tp_mapa(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void tp_bar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}
// The one arrival of the barrier's phase, with the bytes it still expects from st.async stores (which
// may already have landed: the transaction count may go negative before this).
__device__ __forceinline__ void tp_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Every barrier completes one phase per launch: parity 0. Acquire at cluster scope: the stores of
// the other blocks that completed the phase are visible after it.
__device__ __forceinline__ void tp_wait(uint32_t bar) {
  asm volatile(
      "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
      "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 done, [%0], 0;\n\t"
      "@!done bra TP_WAIT;\n\t}" ::"r"(bar)
      : "memory");
}
__device__ __forceinline__ void tp_push4(uint32_t dst, uint4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.u32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   dst),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tp_push2(uint32_t dst, uint2 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.u32 [%0], {%1, %2}, [%3];" ::"r"(dst),
               "r"(v.x), "r"(v.y), "r"(bar)
               : "memory");
}

// A block's counts of a pass as pushed: 256 words, or (packed) 128 words of two 16-bit counts.
// Bins b0 .. b0 + 3 (b0 a multiple of 4), and bin b alone.
__device__ __forceinline__ uint4 tp_counts4(const unsigned int* row, unsigned int b0, bool packed) {
  if (!packed) return reinterpret_cast<const uint4*>(row)[b0 / 4];
  const uint2 w = reinterpret_cast<const uint2*>(row)[b0 / 4];
  return make_uint4(w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16);
}
__device__ __forceinline__ unsigned int tp_count1(const unsigned int* row, unsigned int b, bool packed) {
  return packed ? (row[b >> 1] >> (16 * (b & 1u))) & 0xffffu : row[b];
}
// The count of bin threadIdx.x / 4 (held by its 4 threads, consecutive lanes) into hist, as pushed.
__device__ __forceinline__ void tp_put_bin(unsigned int sum, unsigned int* hist, bool packed) {
  const unsigned int odd = __shfl_down_sync(0xffffffffu, sum, 4);  // bin + 1 (packed: same warp)
  if (!packed) {
    if ((threadIdx.x & 3) == 0) hist[threadIdx.x >> 2] = sum;
  } else if ((threadIdx.x & 7) == 0) {
    hist[threadIdx.x >> 3] = sum | (odd << 16);
  }
}
// tc_reduce for the push kernel (1024 threads: 4 a bin), output as pushed.
__device__ __forceinline__ void tp_reduce(unsigned int* striped, unsigned int* hist, bool packed) {
  const int bin = threadIdx.x >> 2;
  const int part = threadIdx.x & 3;
  unsigned int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    unsigned int* p = striped + bin * 32 + part * 8 + ((i + bin) & 7);
    sum += *p;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  tp_put_bin(sum, hist, packed);
}


// Pass 0's counts (top byte) and the second histogram: byte 2 of the keys whose top byte is `top`.
template <int ITEMS>
__device__ __forceinline__ void tp_count0(unsigned int* striped, unsigned int* spec, const uint32_t (&keys)[ITEMS],
                                          uint32_t top) {
  const unsigned int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const uint32_t key = keys[j];
    if (key != 0) {
      atomicAdd(striped + (key >> 24) * 32 + lane, 1u);
      if ((key >> 24) == top) atomicAdd(spec + ((key >> 16) & 255u) * kTpSpecLanes + (lane & 7u), 1u);
    }
  }
}
// Pass 1's counts from the second histogram (take), or zero (the block has no key in the bin).
__device__ __forceinline__ void tp_spec_reduce(const unsigned int* spec, unsigned int* hist, bool take, bool packed) {
  static_assert(kTpSpecLanes == 8 && kTpThreads == 1024, "4 threads a bin, 2 lane words each");
  const uint2 w = reinterpret_cast<const uint2*>(spec)[threadIdx.x];
  unsigned int sum = take ? w.x + w.y : 0u;
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  tp_put_bin(sum, hist, packed);
}

// Candidates of every block after pass `last` from the pushed per-block counts: the keys above the
// prefix (bins above the chosen one, every pass up to `last`) plus the chosen bin of pass `last`
// (before pass 3) or the ties each block takes (pass 3: by index, blocks in rank order). Sets
// sh.off[r] (exclusive, rank order), sh.cand (the row's list length) and sh.eq_before (ties in the
// blocks before this one). Three block barriers.
__device__ __forceinline__ void tp_offsets(const unsigned int* recv, TcShared& sh, int last, unsigned int need,
                                           int csize, uint32_t rank, bool packed) {
  __syncthreads();  // sh.pass_bin[last], written by thread 0 after the last pass's barrier
  const int src = threadIdx.x >> 6;  // 64 threads a source block, 4 bins each
  const unsigned int b0 = 4 * (threadIdx.x & 63);
  unsigned int c = 0;
  if (src < csize) {
    for (int q = 0; q <= last; ++q) {
      const uint4 v = tp_counts4(recv + (q * kTcMaxCluster + src) * 256, b0, packed);
      const unsigned int pb = sh.pass_bin[q];
      const bool in_bin = q == last && last < 3;  // the chosen bin itself is a candidate bin
      c += (b0 > pb || (in_bin && b0 == pb)) ? v.x : 0u;
      c += (b0 + 1 > pb || (in_bin && b0 + 1 == pb)) ? v.y : 0u;
      c += (b0 + 2 > pb || (in_bin && b0 + 2 == pb)) ? v.z : 0u;
      c += (b0 + 3 > pb || (in_bin && b0 + 3 == pb)) ? v.w : 0u;
    }
  }
  c = __reduce_add_sync(0xffffffffu, c);
  if ((threadIdx.x & 31) == 0) sh.part[threadIdx.x >> 5] = c;  // warp 2 src + half
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    unsigned int n = lane < csize ? sh.part[2 * lane] + sh.part[2 * lane + 1] : 0u;
    if (last == 3) {  // ties: block r takes min(its ties, need - ties before it) by index
      const unsigned int e = lane < csize ? tp_count1(recv + (3 * kTcMaxCluster + lane) * 256, sh.pass_bin[3], packed) : 0u;
      unsigned int incl = e;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned int u = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += u;
      }
      const unsigned int before = incl - e;
      const unsigned int left = need > before ? need - before : 0u;
      n += e < left ? e : left;
      if (lane == static_cast<int>(rank)) sh.eq_before = before;
    }
    unsigned int incl = n;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const unsigned int u = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += u;
    }
    if (lane <= kTcMaxCluster) sh.off[lane] = incl - n;
    if (lane == 31) sh.cand = incl;
  }
  __syncthreads();
}

// This block's candidates, in index order, into cand[sh.off[rank] ...]: before pass 3 the keys
// whose bytes down to `shift` are >= the prefix; after pass 3 the keys > thr and the ties whose
// row tie rank is below need. Returns how many (the same as tp_offsets' count for this block).
// kTies: last == 3 (the template keeps the usual case, last < 3, free of the tie logic).
template <bool kTies, int ITEMS>
__device__ __forceinline__ unsigned int tp_compact(uint32_t (&keys)[ITEMS], const float* __restrict__ s, int64_t lo,
                                                   int64_t hi, bool one_tile, TcShared& sh, uint32_t prefix,
                                                   unsigned int need, uint2* cand, uint32_t rank, int last) {
  constexpr int64_t kTile = static_cast<int64_t>(kTpThreads) * ITEMS;
  const int shift = kTies ? 0 : 24 - 8 * last;
  const uint32_t lowest = prefix >> shift;  // before pass 3: candidates have key >> shift >= lowest
  const int64_t mine = threadIdx.x * ITEMS;
  unsigned int eq_before = kTies ? sh.eq_before : 0u;
  unsigned int nsel = 0;
  const unsigned int base_slot = sh.off[rank];
  for (int64_t base = lo; base < hi; base += kTile) {
    if (!one_tile) tc_load(keys, s, base + mine, hi);
    unsigned int gt = 0;
    unsigned int eq = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      gt += kTies ? keys[j] > prefix : (keys[j] != 0 && (keys[j] >> shift) >= lowest);
      eq += kTies && keys[j] == prefix;
    }
    unsigned int total = 0;
    const unsigned int excl = tc_scan<kTpThreads>(gt | (eq << 16), sh.warp, &total);  // tile <= 2^16 keys
    const unsigned int rem = need > eq_before ? need - eq_before : 0u;                // ties still to take
    unsigned int seen = excl >> 16;
    unsigned int slot = base_slot + nsel + (excl & 0xffffu) + (seen < rem ? seen : rem);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const uint32_t idx = static_cast<uint32_t>(base + mine + j);
      const bool take = kTies ? keys[j] > prefix : (keys[j] != 0 && (keys[j] >> shift) >= lowest);
      if (take) {
        cand[slot++] = make_uint2(keys[j], idx);
      } else if (kTies && keys[j] == prefix) {
        if (seen < rem) cand[slot++] = make_uint2(keys[j], idx);
        ++seen;
      }
    }
    const unsigned int eq_tot = total >> 16;
    nsel += (total & 0xffffu) + (eq_tot < rem ? eq_tot : rem);
    eq_before += eq_tot;
  }
  return nsel;
}

// The counts of one local pass over the candidate list (the same in every block): the candidates
// that match the prefix above byte `pass`, by that byte, into tot[pass].
__device__ __forceinline__ void tp_local_count(unsigned int* striped, unsigned int* tot, const uint2* cand,
                                               unsigned int m, int pass, uint32_t prefix) {
  const int shift = 24 - 8 * pass;
  const unsigned int lane = threadIdx.x & 31;
  for (unsigned int i = threadIdx.x; i < m; i += kTpThreads) {
    const uint32_t key = cand[i].x;
    if (((key ^ prefix) >> (shift + 8)) == 0) atomicAdd(striped + ((key >> shift) & 255u) * 32 + lane, 1u);
  }
  __syncthreads();
  tc_reduce<kTpThreads>(striped, tot + pass * 256);
  __syncthreads();
}

// Picks the byte of pass `pass` from tot[pass] (every block the same).
__device__ __forceinline__ void tp_select(const unsigned int* tot, TcShared& sh, int pass, uint32_t& prefix,
                                          unsigned int& need) {
  select_bin<false>(tot + pass * 256, need, &sh.bin, &sh.above);
  __syncthreads();
  if (threadIdx.x == 0) sh.pass_bin[pass] = sh.bin;
  prefix |= sh.bin << (24 - 8 * pass);
  need -= sh.above;
}

// The final list from the candidates (index order): keys > thr, then ties by index up to need.
__device__ __forceinline__ void tp_trim(const uint2* cand, unsigned int m, uint32_t thr, unsigned int need,
                                        TcShared& sh, uint2* all) {
  const unsigned int per = (m + kTpThreads - 1) / kTpThreads;  // consecutive candidates a thread
  const unsigned int first = threadIdx.x * per < m ? threadIdx.x * per : m;
  const unsigned int last = first + per < m ? first + per : m;
  unsigned int gt = 0;
  unsigned int eq = 0;
  for (unsigned int i = first; i < last; ++i) {
    gt += cand[i].x > thr;
    eq += cand[i].x == thr;
  }
  unsigned int total = 0;
  const unsigned int excl = tc_scan<kTpThreads>(gt | (eq << 16), sh.warp, &total);  // m <= kTpCap < 2^16
  unsigned int seen = excl >> 16;
  unsigned int slot = (excl & 0xffffu) + (seen < need ? seen : need);
  for (unsigned int i = first; i < last; ++i) {
    const uint2 e = cand[i];
    if (e.x > thr) {
      all[slot++] = e;
    } else if (e.x == thr) {
      if (seen < need) all[slot++] = e;
      ++seen;
    }
  }
  __syncthreads();
}

// Coarse bin of a score for the one-block path: the top 12 bits of the order-preserving key of its
// float16 rounding (sign, 5 exponent bits, 6 mantissa bits: 1/64 of a binade over fp16's range, the
// finer split of the scores an indexer produces; vLLM's 4096-bin top-k uses the same). NaN takes the
// top bin and zero is canonical, so the bin never decreases as key_of increases: a key in a higher
// bin is larger, and the k-th largest key lies in the bin where the count from the top reaches k.
__device__ __forceinline__ uint32_t tp_coarse(float f) {
  if (f != f) return kThBins - 1;
  const uint32_t h = __half_as_ushort(__float2half_rn(f == 0.0f ? 0.0f : f));
  return ((h & 0x8000u) ? (~h & 0xffffu) : (h | 0x8000u)) >> 4;
}

// Block 0 selects a row of n <= kTpBlockN keys (k < n) alone; thread t holds indices 4t .. 4t + 3,
// so thread order is index order.
//   1. coarse histogram (hist: kThBins words, zero on entry) and one block scan from the top bin
//      down: the bin B where the count reaches k, A keys above it, E in it; need = k - A of B's.
//   2. E == need: every key of B is taken. Else the k-th largest key T and the ties at T to take
//      (need_eq) from B's candidates (list): up to kThBallotMax by warp ballots (each candidate's
//      rank by (key desc, index asc); the one at rank need - 1 is T), all equal keys at once, else
//      8-bit radix rounds over their keys.
//   3. one block scan over (keys > T, keys == T) per thread writes the keys > T and the first
//      need_eq ties by index: the k selected indices in increasing order.
// sh.nsel, sh.kmin and sh.kmax are set (0, ~0, 0) by the caller before its block barrier.
__device__ __forceinline__ void tp_hist_row(const float* __restrict__ s, int n, int k, int* __restrict__ out,
                                            unsigned int* hist, uint2* list, TcShared& sh) {
  const int t = threadIdx.x;
  const int lane = t & 31;
  const int warp = t >> 5;
  const int i0 = 4 * t;
  float v[4];
  if (i0 + 4 <= n && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(s) + t);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = i0 + j < n ? __ldg(s + i0 + j) : 0.0f;
  }
  uint32_t key[4];
  uint32_t bin[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    key[j] = i0 + j < n ? key_of(v[j]) : 0u;  // 0: no element
    bin[j] = tp_coarse(v[j]);
  }
  __syncthreads();  // hist zeroed, sh set
  QGATE_TP_MARK(4);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (key[j] != 0) atomicAdd(hist + bin[j], 1u);
  }
  __syncthreads();
  QGATE_TP_MARK(5);
  const unsigned int kk = static_cast<unsigned int>(k);
  {
    // Thread t holds bins 4095 - 4t - e, e = 0..3 (thread 0 the highest).
    const uint4 h4 = reinterpret_cast<const uint4*>(hist)[kThBins / 4 - 1 - t];
    const unsigned int c[4] = {h4.w, h4.z, h4.y, h4.x};
    unsigned int total = 0;
    unsigned int acc = tc_scan<kTpThreads>(c[0] + c[1] + c[2] + c[3], sh.warp, &total);  // keys above
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (acc < kk && acc + c[e] >= kk) {
        sh.bin = static_cast<unsigned int>(kThBins - 1 - 4 * t - e);
        sh.above = acc;
        sh.cand = c[e];
      }
      acc += c[e];
    }
  }
  __syncthreads();
  QGATE_TP_MARK(6);
  const uint32_t b = sh.bin;
  const unsigned int cand = sh.cand;
  const unsigned int need = kk - sh.above;  // 1 .. cand
  const bool all_of_bin = cand == need;
  uint32_t thr = 0;         // T
  unsigned int need_eq = 0;  // keys == T taken (the lowest indices)
  if (!all_of_bin) {
    uint32_t lo = 0xffffffffu;
    uint32_t hi = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (key[j] != 0 && bin[j] == b) {
        list[atomicAdd(&sh.nsel, 1u)] = make_uint2(key[j], static_cast<uint32_t>(i0 + j));
        lo = min(lo, key[j]);
        hi = max(hi, key[j]);
      }
    }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0 && hi != 0) {
      atomicMin(&sh.kmin, lo);
      atomicMax(&sh.kmax, hi);
    }
    __syncthreads();
    QGATE_TP_MARK(7);
    if (sh.kmin == sh.kmax) {  // one key in the bin (ties): T, and need of them
      thr = sh.kmin;
      need_eq = need;
    } else if (cand <= kThBallotMax) {
      // Warp w ranks candidates w, w + 32, ...: rank = candidates before it in (key desc, index asc).
      for (unsigned int c = warp; c < cand; c += kTpThreads / 32) {
        const uint2 me = list[c];
        unsigned int gt = 0;
        unsigned int before = 0;
        for (unsigned int q0 = 0; q0 < cand; q0 += 32) {
          const unsigned int q = q0 + lane;
          const uint2 o = q < cand ? list[q] : make_uint2(0u, 0u);
          gt += __popc(__ballot_sync(0xffffffffu, o.x > me.x));
          before += __popc(__ballot_sync(0xffffffffu, o.x > me.x || (o.x == me.x && o.y < me.y && q < cand)));
        }
        if (lane == 0 && before == need - 1) {  // the last one taken: T
          sh.thr = me.x;
          sh.need_eq = need - gt;
        }
      }
      __syncthreads();
      thr = sh.thr;
      need_eq = sh.need_eq;
    } else {
      // 8-bit radix rounds over the candidates' keys (hist's first 256 words as the counts).
      uint32_t prefix = 0;
      unsigned int remain = need;
#pragma unroll 1
      for (int r = 0; r < 4; ++r) {
        const int shift = 24 - 8 * r;
        if (t < 256) hist[t] = 0;
        __syncthreads();
        for (unsigned int base = 0; base < cand; base += kTpThreads) {
          const unsigned int i = base + t;
          const uint32_t kq = i < cand ? list[i].x : 0u;
          const bool counted = i < cand && (r == 0 || ((kq ^ prefix) >> (shift + 8)) == 0);
          add_to_bin(hist, (kq >> shift) & 255u, counted);
        }
        __syncthreads();
        select_bin<false>(hist, remain, &sh.bin, &sh.above);
        __syncthreads();
        prefix |= sh.bin << shift;
        remain -= sh.above;
      }
      thr = prefix;
      need_eq = remain;
    }
  }
  QGATE_TP_MARK(8);
  // Keys > T (all of bin B: bins >= B) and ties at T, counted per thread, one scan in index order.
  unsigned int gt = 0;
  unsigned int eq = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    gt += all_of_bin ? (key[j] != 0 && bin[j] >= b) : key[j] > thr;
    eq += !all_of_bin && key[j] == thr;
  }
  unsigned int total = 0;
  const unsigned int excl = tc_scan<kTpThreads>(gt | (eq << 16), sh.warp, &total);  // n <= 4096 < 2^16
  QGATE_TP_MARK(9);
  unsigned int seen = excl >> 16;
  unsigned int slot = (excl & 0xffffu) + (seen < need_eq ? seen : need_eq);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool above = all_of_bin ? (key[j] != 0 && bin[j] >= b) : key[j] > thr;
    if (above) {
      out[slot++] = i0 + j;
    } else if (!all_of_bin && key[j] == thr) {
      if (seen < need_eq) out[slot++] = i0 + j;
      ++seen;
    }
  }
  QGATE_TP_MARK(10);
}
#endif  // QGATE_TC_SM90

template <int ITEMS>
__global__ void __launch_bounds__(kTpThreads, 1) qsa_topk_push_kernel(TopkRows in, int k, int csize,
                                                                       int* __restrict__ indices) {
#ifdef QGATE_TC_SM90
  constexpr int kNT = kTpThreads;
  constexpr int64_t kTile = static_cast<int64_t>(kNT) * ITEMS;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  __shared__ TcShared sh;
  unsigned int* striped = reinterpret_cast<unsigned int*>(tc_smem);
  unsigned int* hist = reinterpret_cast<unsigned int*>(tc_smem + kTcUnionBytes);  // [256] this block, one pass
  unsigned int* tot = hist + 256;                                               // [4][256] row totals
  unsigned int* recv = tot + 4 * 256;                                           // [4][16][256] pushed counts
  uint2* all = reinterpret_cast<uint2*>(recv);                                  // [k] after the offsets
  uint2* cand = reinterpret_cast<uint2*>(recv + kTpRecvWords);                  // [kTpCap]
  unsigned int* spec = reinterpret_cast<unsigned int*>(cand + kTpCap);  // [256][8] (*) second histogram
  const uint32_t rank = tc_rank();
  const int row = blockIdx.x / csize;
  const float* __restrict__ s = in.scores + static_cast<int64_t>(row) * in.stride;
  const int64_t mine = threadIdx.x * ITEMS;
  // Launched with programmatic dependent launch (PDL, sm_90): the next kernel may start its own
  // set-up now; this one reads nothing the previous kernel may write (visible, the scores) before
  // griddepcontrol.wait, which returns when that kernel has finished and its writes are visible.
  // Without the launch attribute both instructions do nothing.
  QGATE_TP_MARK(0);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 5; ++i) tp_bar_init(tp_saddr(&sh.bar[i]));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    sh.nsel = 0;  // tp_hist_row's candidate count and key range
    sh.kmin = 0xffffffffu;
    sh.kmax = 0;
  }
  for (int i = threadIdx.x; i < 256 * 32; i += kNT) striped[i] = 0;
  for (int i = threadIdx.x; i < 256 * static_cast<int>(kTpSpecLanes); i += kNT) spec[i] = 0;
  QGATE_TP_MARK(1);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  QGATE_TP_MARK(2);
  const int64_t len = topk_row_len(in, row);
  // A short row: every block of the cluster leaves here, before any access to another's memory.
  if (topk_fill_short(len, k, static_cast<int>(rank), csize, indices + static_cast<int64_t>(row) * k)) return;
  QGATE_TP_MARK(3);
  // At most kTpBlockN eligible keys (a row of few columns, or a prefix of few visible blocks): block 0
  // selects them alone and the cluster's other blocks leave (no block has touched another's memory).
  if (len <= kTpBlockN) {
    if (rank == 0) {
      tp_hist_row(s, static_cast<int>(len), k, indices + static_cast<int64_t>(row) * k, striped, cand, sh);
    }
    return;
  }
  int64_t lo = 0;
  int64_t hi = 0;
  tc_block_range<ITEMS>(len, csize, rank, &lo, &hi);
  const bool one_tile = hi - lo <= kTile;
  uint32_t keys[ITEMS];
  if (one_tile) tc_load(keys, s, lo + mine, hi);
  // Pass counts as 16-bit pairs when no block holds more than 65535 keys (the same in every block).
  const bool packed = (len + csize - 1) / csize + ITEMS <= 65535;
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>(csize) * (packed ? 128 : 256) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) tp_expect(tp_saddr(&sh.bar[i]), bytes);
  }
  {  // this block's largest top byte
    uint32_t t = 0;
    if (one_tile) {
#pragma unroll
      for (int j = 0; j < ITEMS; ++j) t = max(t, keys[j] >> 24);
    }
    t = __reduce_max_sync(0xffffffffu, t);
    if ((threadIdx.x & 31) == 0) sh.top_warp[threadIdx.x >> 5] = t;
  }
  __syncthreads();
  // Publishes the barrier initialisation; the matching wait comes before the first push.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  const uint32_t top = __reduce_max_sync(0xffffffffu, sh.top_warp[threadIdx.x & 31]);

  // Candidates exchanged when the passes stop: at most kTpCap, and at most kTpPerK k (a longer list
  // costs more in the exchange, the local pass and the ordering than another cluster pass).
  const unsigned int list_cap = min(static_cast<unsigned int>(kTpCap), kTpPerK * static_cast<unsigned int>(k));
  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  int last = 3;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    // Pass 1 after a pass 0 with nothing above its bin (need still k): the second histogram.
    const bool from_spec = pass == 1 && one_tile && need == static_cast<unsigned int>(k);
    if (pass == 0 && one_tile) {
      tp_count0(striped, spec, keys, top);
    } else if (!from_spec) {
      tc_count_range<kNT>(striped, keys, s, lo, hi, one_tile, shift, prefix, pass == 0);
    }
    __syncthreads();
    if (from_spec) {
      tp_spec_reduce(spec, hist, top == (prefix >> 24), packed);
    } else {
      tp_reduce(striped, hist, packed);
    }
    __syncthreads();
    if (pass == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    const int lgt = packed ? 5 : 6;  // threads a destination: 64 (32 packed), 4 words each
    if (threadIdx.x < (csize << lgt)) {
      const uint32_t dst_rank = threadIdx.x >> lgt;
      const uint32_t chunk = threadIdx.x & ((1u << lgt) - 1u);
      const uint4 v = reinterpret_cast<const uint4*>(hist)[chunk];
      const uint32_t dst = tp_mapa(tp_saddr(recv + (pass * kTcMaxCluster + rank) * 256 + 4 * chunk), dst_rank);
      tp_push4(dst, v, tp_mapa(tp_saddr(&sh.bar[pass]), dst_rank));
    }
    {  // the striped histogram back to zero (every thread read its words before the barrier above)
      uint4* z = reinterpret_cast<uint4*>(striped);
      static_assert(256 * 32 == 8 * kTpThreads, "two 16-byte stores a thread");
      z[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
      z[threadIdx.x + kTpThreads] = make_uint4(0u, 0u, 0u, 0u);
    }
    tp_wait(tp_saddr(&sh.bar[pass]));
    if (threadIdx.x < 256) {
      unsigned int total = 0;
      for (int r = 0; r < csize; ++r) total += tp_count1(recv + (pass * kTcMaxCluster + r) * 256, threadIdx.x, packed);
      tot[pass * 256 + threadIdx.x] = total;
    }
    __syncthreads();
    select_bin<false>(tot + pass * 256, need, &sh.bin, &sh.above);
    __syncthreads();
    const unsigned int bin = sh.bin;
    if (threadIdx.x == 0) sh.pass_bin[pass] = bin;
    prefix |= bin << shift;
    need -= sh.above;
    if (pass == 3 || (static_cast<unsigned int>(k) - need) + tot[pass * 256 + bin] <= list_cap) {
      last = pass;
      break;
    }
  }

  tp_offsets(recv, sh, last, need, csize, rank, packed);
  const unsigned int m = sh.cand;
  const unsigned int own = last == 3 ? tp_compact<true>(keys, s, lo, hi, one_tile, sh, prefix, need, cand, rank, last)
                                     : tp_compact<false>(keys, s, lo, hi, one_tile, sh, prefix, need, cand, rank, last);
  if (threadIdx.x == 0) tp_expect(tp_saddr(&sh.bar[4]), (m - own) * static_cast<uint32_t>(sizeof(uint2)));
  __syncthreads();  // this block's candidates are in its buffer
  {
    // 64 threads a destination block (every block but this one), no integer division.
    const unsigned int base = sh.off[rank];
    const uint32_t d = threadIdx.x >> 6;
    if (d < static_cast<uint32_t>(csize) && d != rank) {
      const uint32_t dst0 = tp_mapa(tp_saddr(cand + base), d);
      const uint32_t bar = tp_mapa(tp_saddr(&sh.bar[4]), d);
      for (unsigned int e = threadIdx.x & 63; e < own; e += 64) {
        tp_push2(dst0 + e * static_cast<uint32_t>(sizeof(uint2)), cand[base + e], bar);
      }
    }
  }
  tp_wait(tp_saddr(&sh.bar[4]));
  // After pass 3 the candidates are the k selected keys, in index order. Else every block finishes
  // the passes over its copy of the candidate list (the same counts in every block) and trims it to
  // the keys > T and the first `need` ties by index: the k selected keys in index order.
  const uint2* list = cand;
  if (last < 3) {
#pragma unroll 1
    for (int pass = last + 1; pass < 4; ++pass) {
      tp_local_count(striped, tot, cand, m, pass, prefix);
      tp_select(tot, sh, pass, prefix, need);
    }
    tp_trim(cand, m, prefix, need, sh, all);  // prefix is now T, the k-th largest key
    list = all;
  }
  // Each block writes its 1/C of the k indices.
  int* __restrict__ out = indices + static_cast<int64_t>(row) * k;
  const int lg = __ffs(csize) - 1;
  const int w_lo = static_cast<int>((static_cast<unsigned int>(k) * rank) >> lg);
  const int w_hi = static_cast<int>((static_cast<unsigned int>(k) * (rank + 1)) >> lg);
  for (int p = w_lo + static_cast<int>(threadIdx.x); p < w_hi; p += kNT) out[p] = static_cast<int>(list[p].y);
#endif
}

}  // namespace
}  // namespace qgate
