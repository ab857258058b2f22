// The sm_90 kernel of qsa_topk: one thread-block cluster per row, counts and candidates pushed
// (st.async into every block's shared memory, completing on that block's mbarrier) rather than
// pulled after cluster barriers (one barrier a pass fewer), and the passes finished locally once the
// candidates are few. Same definition, key (key_of), passes and tie rule as the grid path, with the
// helpers of qsa_topk_cluster.cuh: bit-identical output (the selected indices in increasing order).
//
// C blocks of 1024 threads share a row, block r owning [r per, (r + 1) per). A row of at most
// 1024 eligible keys (few visible blocks) is selected by block 0 alone; a row of at most 4096
// columns runs in one block, which does the same when the candidates of a 13-bit histogram are few
// enough (tp_block_row).
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

// The one-block path (tp_block_row): rows of at most kTpBlockN columns run in a cluster of one
// block, four keys a thread; its histogram has kTpBins bins of the top key bits.
constexpr int kTpBlockN = 4 * kTpThreads;
constexpr int kTpBinBits = 13;
constexpr int kTpBins = 1 << kTpBinBits;
constexpr int kTpBinsPerThread = kTpBins / kTpThreads;
// Ordering by counting costs about sum over the candidate bins of count^2 / 32 compares a warp
// (each key compares with its bin's keys); past this sum the bitonic sort (~5k cycles) is cheaper.
constexpr unsigned int kTpMaxSquares = 1u << 17;
static_assert(2 * kTpBins * sizeof(unsigned int) + 3 * kTpThreads * sizeof(unsigned long long) + kTpBlockN <=
                  kTpCap * sizeof(uint2),
              "bin counts, cursors, candidates, sort buffer and marks fit the candidate buffer");

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

// Bitonic sort, descending, of one composite a thread (key << 32 | ~index: unique per element, 0 for
// no element: key_of is never below 0x007fffff, -inf's key), then the first k elements (the stable
// sort's first k) marked in `sel` by index. Shuffles below a stride of 32, shared memory above (15 of
// the 55 steps; `buf` holds 2 x kTpThreads composites, a double buffer: one barrier a step).
__device__ __forceinline__ void tp_sort_mark(unsigned long long v, int k, unsigned char* sel,
                                             unsigned long long* buf) {
  const int i = threadIdx.x;
  int b = 0;
#pragma unroll
  for (int size = 2; size <= kTpThreads; size <<= 1) {
    const bool desc = (i & size) == 0;  // this run descends (the last run, size kTpThreads, does)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      unsigned long long o;
      if (stride >= 32) {
        buf[b * kTpThreads + i] = v;
        __syncthreads();
        o = buf[b * kTpThreads + (i ^ stride)];
        b ^= 1;
      } else {
        o = __shfl_xor_sync(0xffffffffu, v, stride);
      }
      v = (((i & stride) == 0) == desc) ? max(v, o) : min(v, o);
    }
  }
  if (i < k) sel[~static_cast<uint32_t>(v)] = 1;
}

__device__ __forceinline__ unsigned long long tp_composite(uint32_t key, int index) {
  return (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~index);
}

// One block selects a row of n <= kTpBlockN keys, k <= kTpThreads: four keys a thread; a histogram
// of the top kTpBinBits key bits (sign, exponent, 4 mantissa bits: bins 1/16 of a binade wide) gives
// the bin B where the count from the top reaches k; the keys in bins >= B (the candidates) hold the
// top k. When they are at most kTpThreads (always for n <= kTpThreads), each goes to its bin's
// segment of the candidate list (bins in descending order: a segment's keys are below every key of
// the segments before it) and its rank is the segment's start plus the number of keys of its
// segment with a larger composite (the stable sort's rank); when the segments are long (many ties,
// a narrow range: the sum of their squared lengths above kTpMaxSquares) the list is sorted
// (tp_sort_mark) instead. The keys ranked below k are marked by index, and one block scan over the
// marks writes their indices in increasing order. More candidates than kTpThreads: false, nothing
// written. `work` holds the bin counts, the segment cursors, the list, the sort buffer and the marks.
__device__ __forceinline__ bool tp_block_row(const float* __restrict__ s, int64_t n, int k, int* __restrict__ out,
                                             unsigned char* work, TcShared& sh) {
  unsigned int* bins = reinterpret_cast<unsigned int*>(work);                       // [kTpBins] counts
  unsigned int* cursor = bins + kTpBins;                                            // [kTpBins] segment starts
  unsigned long long* list = reinterpret_cast<unsigned long long*>(cursor + kTpBins);  // [kTpThreads]
  unsigned long long* buf = list + kTpThreads;                                      // [2][kTpThreads]
  unsigned char* sel = reinterpret_cast<unsigned char*>(buf + 2 * kTpThreads);      // [kTpBlockN] marks
  const int t = threadIdx.x;
  const int lane = t & 31;
  uint32_t key[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = t + j * kTpThreads;
    key[j] = i < n ? key_of(s[i]) : 0u;
  }
#pragma unroll
  for (int j = 0; j < kTpBinsPerThread; ++j) bins[t + j * kTpThreads] = 0;
  reinterpret_cast<uchar4*>(sel)[t] = make_uchar4(0, 0, 0, 0);  // marks of indices 4t .. 4t + 3
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (t + j * kTpThreads < n) atomicAdd(&bins[key[j] >> (32 - kTpBinBits)], 1u);
  }
  __syncthreads();
  // Thread t holds the kTpBinsPerThread bins below kTpBins - kTpBinsPerThread t (thread 0 the
  // highest); a bin is a candidate bin when fewer than k keys lie above it.
  const int top = kTpBins - kTpBinsPerThread * t - 1;
  unsigned int c[kTpBinsPerThread];
  unsigned int mine = 0;
#pragma unroll
  for (int e = 0; e < kTpBinsPerThread; ++e) {
    c[e] = bins[top - e];
    mine += c[e];
  }
  unsigned int total = 0;
  unsigned int acc = tc_scan<kTpThreads>(mine, sh.warp, &total);  // keys in the bins above this thread's
  const unsigned int kk = static_cast<unsigned int>(k);
  unsigned int squares = 0;  // sum over the candidate bins of count^2: the cost of the counting
#pragma unroll
  for (int e = 0; e < kTpBinsPerThread; ++e) {
    cursor[top - e] = acc;
    if (acc < kk) {
      squares += c[e] * c[e];
      if (acc + c[e] >= kk) {
        sh.bin = static_cast<unsigned int>(top - e);
        sh.cand = acc + c[e];
      }
    }
    acc += c[e];
  }
  squares = __reduce_add_sync(0xffffffffu, squares);
  if (lane == 0) sh.top_warp[t >> 5] = squares;
  __syncthreads();
  const unsigned int bin = sh.bin;
  const unsigned int cand = sh.cand;
  if (cand > static_cast<unsigned int>(kTpThreads)) return false;  // the same in every thread
  squares = __reduce_add_sync(0xffffffffu, sh.top_warp[lane]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = t + j * kTpThreads;
    const unsigned int b = key[j] >> (32 - kTpBinBits);
    if (i < n && b >= bin) list[atomicAdd(&cursor[b], 1u)] = tp_composite(key[j], i);
  }
  __syncthreads();
  if (squares > kTpMaxSquares) {
    tp_sort_mark(t < static_cast<int>(cand) ? list[t] : 0ull, k, sel, buf);
  } else if (t < static_cast<int>(cand)) {
    // One list entry a thread: the threads of a warp mostly share a segment (the same trip count).
    const unsigned long long me = list[t];
    const unsigned int b = static_cast<unsigned int>(me >> 32) >> (32 - kTpBinBits);
    const unsigned int end = cursor[b];  // the segment's start plus its count, after the atomics
    const unsigned int begin = end - bins[b];
    unsigned int pos = begin;
    for (unsigned int q = begin; q < end; ++q) pos += list[q] > me;
    if (pos < kk) sel[~static_cast<uint32_t>(me)] = 1;
  }
  __syncthreads();
  // The marked indices in increasing order: thread t holds the marks of 4t .. 4t + 3.
  const uchar4 f = reinterpret_cast<const uchar4*>(sel)[t];
  unsigned int at = tc_scan<kTpThreads>(static_cast<unsigned int>(f.x + f.y + f.z + f.w), sh.warp, &total);
  if (f.x) out[at++] = 4 * t;
  if (f.y) out[at++] = 4 * t + 1;
  if (f.z) out[at++] = 4 * t + 2;
  if (f.w) out[at] = 4 * t + 3;
  return true;
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
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 5; ++i) tp_bar_init(tp_saddr(&sh.bar[i]));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  for (int i = threadIdx.x; i < 256 * 32; i += kNT) striped[i] = 0;
  for (int i = threadIdx.x; i < 256 * static_cast<int>(kTpSpecLanes); i += kNT) spec[i] = 0;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t len = topk_row_len(in, row);
  // A short row: every block of the cluster leaves here, before any access to another's memory.
  if (topk_fill_short(len, k, static_cast<int>(rank), csize, indices + static_cast<int64_t>(row) * k)) return;
  // Few eligible keys (a short row, or a prefix of few visible blocks): block 0 selects and orders
  // them alone and the cluster's other blocks leave (no block has touched another's memory yet).
  // A row of at most kTpBlockN columns runs in a cluster of one block, which does the same when the
  // candidates allow it, else runs the passes below.
  if (len <= kTpThreads || (csize == 1 && len <= kTpBlockN && k <= kTpThreads)) {
    if (rank != 0) return;
    if (tp_block_row(s, len, k, indices + static_cast<int64_t>(row) * k, reinterpret_cast<unsigned char*>(cand), sh)) {
      return;
    }
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
