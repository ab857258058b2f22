// sm_90 default path of qsa_topk: one thread-block cluster per row, counts and candidates pushed
// (st.async into every block's shared memory, completing on that block's mbarrier) instead of
// pulled after cluster barriers, and the passes finished locally once the candidates are few.
// Same definition, key (key_of), passes, tie rule and ordering (tc_order) as qsa_topk_cluster.cuh,
// whose helpers it uses, so the output is bit-identical to the other paths.
//
// C blocks of 1024 threads share a row, block r owning [r per, (r + 1) per) as in the cluster path.
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
//   local pass: every block counts the next byte over the candidate list in its own shared memory
//       (the same counts in every block). Those cells order the candidates (a shallow order:
//       tc_order ranks the candidates in the cells that start below k) unless one holds more than
//       kTpMaxCell keys; then the remaining passes run locally, the ties are trimmed by index into
//       the final list of k, and tc_order orders that. Each block writes its 1/C of the ranks.
// No block reads another block's shared memory, so no cluster barrier is needed after the one that
// publishes the mbarrier initialisation (overlapped with the loads). Launched with PDL (see below).
// BENCH.md has the phase clocks and the variants that were slower.
#pragma once

namespace qgate {
namespace {

constexpr int kTpThreads = 1024;  // the pushes and the offset sums map 64 threads to each of 16 blocks
constexpr int kTpCap = 12288;     // candidates a block holds for the local passes
#ifndef QGATE_TP_PER_K  // (tuning: tools/topk_bench.cu builds other values)
#define QGATE_TP_PER_K 4
#endif
constexpr unsigned int kTpPerK = QGATE_TP_PER_K;
// Largest cell of the first local pass for the shallow order (ranking costs cell / 32 steps a key
// of a cell of several keys, a cell of one key is ranked from the list order; the cell items,
// k + this many, must fit the 64 KiB of the receive buffers). 4096, not 2048: a row of integers
// 0..63 at 1 x 131072, k = 2048 has a tie cell of about k keys, which at 2048 half the time took
// the deep path (two more local passes, trim, full order): 15.8 -> 14.0 us, the other rows
// unchanged (BENCH.md, sixth session).
#ifndef QGATE_TP_MAX_CELL  // (tuning: NVCC_APPEND_FLAGS=-DQGATE_TP_MAX_CELL=... builds other values)
#define QGATE_TP_MAX_CELL 4096
#endif
constexpr unsigned int kTpMaxCell = QGATE_TP_MAX_CELL;
constexpr size_t kTpRecvWords = 4 * kTcMaxCluster * 256;  // [pass][source block][bin]
// Second histogram of pass 0 (tuning switch, off: BENCH.md, ninth session): each block also counts
// byte 2 of its keys whose top byte is its largest (lane-striped over 8 lanes). When pass 0 picks the
// row's largest top byte (nothing above the bin) and pass 1 is needed, a block's pass-1 counts are
// that histogram if its largest top byte is the bin, else zero: pass 1 is not counted. Measured on
// the H200 (harness, PDL, 1 x 131072, k 2048, with QGATE_TP_PACK): integers 0..63 13.56 -> 13.07 us,
// but continuous 11.51 -> 12.01 and steps of 0.25 12.53 -> 12.98 (the extra counting, the top-byte
// reduction and the larger code cost every row). With QGATE_TP_WAIT 5 it is the default since the
// tenth session (the one build whose integer rows stay under 13 us; op, H200, by input: continuous
// 11.84, steps of 0.25 12.83, integers 12.97 us, all sets 12.51 us; was 11.55 / 12.53 / 13.51).
#ifndef QGATE_TP_SPEC
#define QGATE_TP_SPEC 1
#endif
// Pass counts pushed as 16-bit pairs (half the bytes, half the st.async) when no block holds more
// than 65535 keys; else 32-bit words. Measured: 1 x 131072 k 2048 11.67 / 12.63 / 13.78 -> 11.51 /
// 12.53 / 13.56 us (continuous / steps of 0.25 / integers), 8 x 32768 k 1024 17.05 / 19.38 / 13.31 ->
// 16.97 / 19.10 / 13.24 us.
#ifndef QGATE_TP_PACK
#define QGATE_TP_PACK 1
#endif
// Tenth-session switches (BENCH.md; one device call, harness PDL, 1 x 131072 k 2048 continuous /
// steps of 0.25 / integers 0..63 and 8 x 32768 k 1024; all exact: harness --check 0 mismatches):
// QGATE_TP_UNI (off): a local pass first checks whether the candidates in the chosen bin are one key
// (least == largest, no atomics); then its counts follow from the previous pass's bin count and the
// count, its reduce and barriers are skipped. 1: only the local passes after a second cluster pass
// (pass >= 2), 2: every local pass. Measured: 1: integers 13.54 -> 13.40 us but 8 x 32768 continuous
// 16.9 -> 17.45; 2: continuous 11.49 -> 12.04. The local count phase of integer rows hardly changed
// (0.95 -> 0.90 us): what it costs there is not the counting.
#ifndef QGATE_TP_UNI
#define QGATE_TP_UNI 0
#endif
// QGATE_TP_FSEL (off): a cluster pass's sums over the C pushed rows and the bin choice in one warp
// (lane l sums bins 248 - 8 l .. 255 - 8 l, a 16-byte load a source), one block barrier less.
// Measured slower: 11.93 / 12.89 / 14.31 us (sum+select phase 0.76 -> 1.13 us a pass).
#ifndef QGATE_TP_FSEL
#define QGATE_TP_FSEL 0
#endif
// QGATE_TP_ZW (on): the cluster passes' striped histogram is zeroed while the block waits for the
// pushed counts instead of in the reduce (the reduce only reads). Measured: 11.49 / 12.51 / 13.54 ->
// 11.43 / 12.42 / 13.38 us; 8 x 32768: 16.89-17.00 / 19.01-19.14 / 13.26 -> 16.84 / 19.07 / 13.20 us.
#ifndef QGATE_TP_ZW
#define QGATE_TP_ZW 1
#endif
// QGATE_TP_WAIT (round 3 experiment): how a block waits for pushed data (the mbarrier's phase).
// 0: every thread loops on mbarrier.try_wait (may suspend the warp; the system's time limit);
// 1: every thread spins on mbarrier.test_wait (never suspends);
// 2: every thread loops on try_wait with suspendTimeHint QGATE_TP_WAIT_NS nanoseconds;
// 3: warp 0 spins on test_wait (acquire, cluster scope), then a block barrier releases the others
//    (bar.sync orders warp 0's acquire before every thread's reads of the pushed data).
// 4: every thread loops on try_wait with acquire at CTA scope (the cluster-scope acquire compiles to
//    an L1 invalidation, CCTL.IVALL, in each of the 32 warps at each wait; the pushed data is in
//    this block's shared memory and nothing read after the waits was written by another block in
//    global memory; CUTLASS's ClusterBarrier::wait waits the same way for remote arrivals).
// 5: every thread spins on test_wait with acquire at CTA scope (1 and 4 together).
// Measured (H200, one device call, harness PDL 1 x 131072 k 2048, continuous / 0.25 steps / integers,
// us): 0 11.38 / 12.35 / 13.31 (again 11.36 / 12.37 / 13.31), 1 11.38 / 12.39 / 13.31, 2 11.37 / 12.35 /
// 13.32, 3 11.29 / 12.30 / 13.29, 4 11.37 / 12.39 / 13.37, 5 11.36 / 12.37 / 13.32: the wake-up is not
// the cost after a wait. Op (bench_variants, by input): 0 11.55 / 12.53 / 13.43, 4 11.53 / 12.52 / 13.62.
// With QGATE_TP_SPEC=1: WAIT 4 11.66 / 12.64 / 12.78, WAIT 5 11.64 / 12.62 / 12.74 (harness only).
// Default 5 (with QGATE_TP_SPEC 1): see QGATE_TP_SPEC for the op's figures.
#ifndef QGATE_TP_WAIT
#define QGATE_TP_WAIT 5
#endif
#ifndef QGATE_TP_WAIT_NS
#define QGATE_TP_WAIT_NS 20
#endif
constexpr unsigned int kTpSpecLanes = 8;
constexpr size_t kTpSpecBytes = QGATE_TP_SPEC ? 256 * kTpSpecLanes * sizeof(unsigned int) : 0;
// Dynamic shared memory: striped histogram (aliased by tc_order's cell tables), this block's counts
// of a pass, the row totals [4][256], the receive buffers (aliased by the final list and the cell
// items once the offsets are known: 16 k bytes <= 64 KiB for k <= 4096), the candidate buffer.
constexpr size_t kTpSmemBytes = kTcUnionBytes + (256 + 4 * 256 + kTpRecvWords) * sizeof(unsigned int) +
                                static_cast<size_t>(kTpCap) * sizeof(uint2) + kTpSpecBytes;  // + [256][8] (*)
static_assert(kTpCap < 65536, "tc_order packs list positions into 16 bits");
static_assert(16 * kTopkMaxK <= kTpRecvWords * sizeof(unsigned int) &&
                  8 * (kTopkMaxK + kTpMaxCell) <= kTpRecvWords * sizeof(unsigned int),
              "final list and cells must fit the receive buffers");

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
#if QGATE_TP_WAIT == 1 || QGATE_TP_WAIT == 3
#if QGATE_TP_WAIT == 3
  if (threadIdx.x < 32)
#endif
    asm volatile(
        "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
        "mbarrier.test_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n\t"
        "@!done bra TP_WAIT;\n\t}" ::"r"(bar)
        : "memory");
#if QGATE_TP_WAIT == 3
  __syncthreads();
#endif
#elif QGATE_TP_WAIT == 5
  asm volatile(
      "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
      "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 done, [%0], 0;\n\t"
      "@!done bra TP_WAIT;\n\t}" ::"r"(bar)
      : "memory");
#elif QGATE_TP_WAIT == 4
  asm volatile(
      "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], 0;\n\t"
      "@!done bra TP_WAIT;\n\t}" ::"r"(bar)
      : "memory");
#elif QGATE_TP_WAIT == 2
  asm volatile(
      "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0, %1;\n\t"
      "@!done bra TP_WAIT;\n\t}" ::"r"(bar), "r"(static_cast<uint32_t>(QGATE_TP_WAIT_NS))
      : "memory");
#else
  asm volatile(
      "{\n\t.reg .pred done;\n\tTP_WAIT:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n\t"
      "@!done bra TP_WAIT;\n\t}" ::"r"(bar)
      : "memory");
#endif
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
    if (!QGATE_TP_ZW) *p = 0;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  tp_put_bin(sum, hist, packed);
}

#if QGATE_TP_FSEL
// Warp 0: the row totals of one cluster pass from the C pushed rows (src: [C][256] words as pushed)
// into tot, and the bin that holds the need-th largest key (select_bin's choice: sh.bin, sh.above).
__device__ __forceinline__ void tp_sum_select(const unsigned int* src, unsigned int* tot, int csize, bool packed,
                                              unsigned int need, TcShared& sh) {
  const int lane = threadIdx.x & 31;
  const int b0 = 248 - 8 * lane;  // this lane's bins b0 .. b0 + 7; c[e] is bin b0 + 7 - e
  unsigned int c[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) c[e] = 0;
#pragma unroll
  for (int r = 0; r < kTcMaxCluster; ++r) {
    if (r < csize) {
      const uint4* row = reinterpret_cast<const uint4*>(src + r * 256);
      if (packed) {
        const uint4 w = row[b0 / 8];  // words b0 / 2 .. b0 / 2 + 3: bins b0, b0 + 1 | b0 + 2, b0 + 3 | ...
        c[7] += w.x & 0xffffu;
        c[6] += w.x >> 16;
        c[5] += w.y & 0xffffu;
        c[4] += w.y >> 16;
        c[3] += w.z & 0xffffu;
        c[2] += w.z >> 16;
        c[1] += w.w & 0xffffu;
        c[0] += w.w >> 16;
      } else {
        const uint4 a = row[b0 / 4];
        const uint4 b = row[b0 / 4 + 1];
        c[7] += a.x;
        c[6] += a.y;
        c[5] += a.z;
        c[4] += a.w;
        c[3] += b.x;
        c[2] += b.y;
        c[1] += b.z;
        c[0] += b.w;
      }
    }
  }
  reinterpret_cast<uint4*>(tot)[b0 / 4] = make_uint4(c[7], c[6], c[5], c[4]);
  reinterpret_cast<uint4*>(tot)[b0 / 4 + 1] = make_uint4(c[3], c[2], c[1], c[0]);
  unsigned int mine = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) mine += c[e];
  select_from_counts(c, mine, lane, need, &sh.bin, &sh.above);
}
#endif

#if QGATE_TP_SPEC
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
#endif

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
// that match the prefix above byte `pass`, by that byte, into tot[pass]. Returns the largest bin.
// QGATE_TP_UNI (check): first the least and largest candidate that matches the prefix; one key ->
// its count is the previous pass's count of the chosen bin, all in one bin, nothing counted.
__device__ __forceinline__ unsigned int tp_local_count(unsigned int* striped, unsigned int* tot, TcShared& sh,
                                                       const uint2* cand, unsigned int m, int pass, uint32_t prefix,
                                                       bool check) {
  const int shift = 24 - 8 * pass;
  const unsigned int lane = threadIdx.x & 31;
#if QGATE_TP_UNI
  if (check) {
    uint32_t lo = 0xffffffffu;
    uint32_t hi = 0;
    for (unsigned int i = threadIdx.x; i < m; i += kTpThreads) {
      const uint32_t key = cand[i].x;
      if (((key ^ prefix) >> (shift + 8)) == 0) {
        lo = min(lo, key);
        hi = max(hi, key);
      }
    }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0) {
      sh.warp[threadIdx.x >> 5] = lo;
      sh.top_warp[threadIdx.x >> 5] = hi;
    }
    __syncthreads();
    static_assert(kTpThreads == 1024, "32 warps: a lane a warp");
    lo = __reduce_min_sync(0xffffffffu, sh.warp[lane]);
    hi = __reduce_max_sync(0xffffffffu, sh.top_warp[lane]);
    if (lo == hi) {  // (no match: lo > hi) every matching candidate is the key lo
      const unsigned int count = tot[(pass - 1) * 256 + sh.pass_bin[pass - 1]];
      if (threadIdx.x < 256) tot[pass * 256 + threadIdx.x] = threadIdx.x == ((lo >> shift) & 255u) ? count : 0u;
      __syncthreads();  // (also: every read of sh.warp above before its next writer)
      return count;
    }
  }
#endif
  for (unsigned int i = threadIdx.x; i < m; i += kTpThreads) {
    const uint32_t key = cand[i].x;
    if (((key ^ prefix) >> (shift + 8)) == 0) atomicAdd(striped + ((key >> shift) & 255u) * 32 + lane, 1u);
  }
  __syncthreads();
  tc_reduce<kTpThreads>(striped, tot + pass * 256);
  __syncthreads();
  if (threadIdx.x < 32) {
    unsigned int mx = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) mx = max(mx, tot[pass * 256 + 8 * threadIdx.x + e]);
    mx = __reduce_max_sync(0xffffffffu, mx);
    if (threadIdx.x == 0) sh.max_key = mx;
  }
  __syncthreads();
  return sh.max_key;
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
  unsigned long long* cell_items = reinterpret_cast<unsigned long long*>(all + k);  // [k]
  uint2* cand = reinterpret_cast<uint2*>(recv + kTpRecvWords);                  // [kTpCap]
#if QGATE_TP_SPEC
  unsigned int* spec = reinterpret_cast<unsigned int*>(cand + kTpCap);  // [256][8] (*) second histogram
#endif
  TC_GSTAMP(0);
  TC_STAMP(1);
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
#if QGATE_TP_SPEC
  for (int i = threadIdx.x; i < 256 * static_cast<int>(kTpSpecLanes); i += kNT) spec[i] = 0;
#endif
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t len = topk_row_len(in, row);
  // A short row: every block of the cluster leaves here, before any access to another's memory.
  if (topk_fill_short(len, k, static_cast<int>(rank), csize, indices + static_cast<int64_t>(row) * k)) return;
  int64_t lo = 0;
  int64_t hi = 0;
  tc_block_range<ITEMS>(len, csize, rank, &lo, &hi);
  const bool one_tile = hi - lo <= kTile;
  uint32_t keys[ITEMS];
  if (one_tile) tc_load(keys, s, lo + mine, hi);
  // Pass counts as 16-bit pairs when no block holds more than 65535 keys (the same in every block).
  const bool packed = QGATE_TP_PACK && (len + csize - 1) / csize + ITEMS <= 65535;
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>(csize) * (packed ? 128 : 256) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) tp_expect(tp_saddr(&sh.bar[i]), bytes);
  }
#if QGATE_TP_SPEC
  {  // this block's largest top byte
    uint32_t t = 0;
    if (one_tile) {
#pragma unroll
      for (int j = 0; j < ITEMS; ++j) t = max(t, keys[j] >> 24);
    }
    t = __reduce_max_sync(0xffffffffu, t);
    if ((threadIdx.x & 31) == 0) sh.top_warp[threadIdx.x >> 5] = t;
  }
#endif
  __syncthreads();
  TC_STAMP_LOADED(keys, one_tile, sh);
  // Publishes the barrier initialisation; the matching wait comes before the first push.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#if QGATE_TP_SPEC
  const uint32_t top = __reduce_max_sync(0xffffffffu, sh.top_warp[threadIdx.x & 31]);
#endif

  // Candidates exchanged when the passes stop: at most kTpCap, and at most kTpPerK k (a longer list
  // costs more in the exchange, the local pass and the ordering than another cluster pass).
  const unsigned int list_cap = min(static_cast<unsigned int>(kTpCap), kTpPerK * static_cast<unsigned int>(k));
  uint32_t prefix = 0;
  unsigned int need = static_cast<unsigned int>(k);
  int last = 3;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
#if QGATE_TP_SPEC
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
#else
    tc_count_range<kNT>(striped, keys, s, lo, hi, one_tile, shift, prefix, pass == 0);
    __syncthreads();
    tp_reduce(striped, hist, packed);
#endif
    __syncthreads();
    TC_STAMP(2 + 3 * pass);
    if (pass == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    const int lgt = packed ? 5 : 6;  // threads a destination: 64 (32 packed), 4 words each
    if (threadIdx.x < (csize << lgt)) {
      const uint32_t dst_rank = threadIdx.x >> lgt;
      const uint32_t chunk = threadIdx.x & ((1u << lgt) - 1u);
      const uint4 v = reinterpret_cast<const uint4*>(hist)[chunk];
      const uint32_t dst = tp_mapa(tp_saddr(recv + (pass * kTcMaxCluster + rank) * 256 + 4 * chunk), dst_rank);
      tp_push4(dst, v, tp_mapa(tp_saddr(&sh.bar[pass]), dst_rank));
    }
#if QGATE_TP_ZW
    {  // the striped histogram back to zero (every thread read its words before the barrier above)
      uint4* z = reinterpret_cast<uint4*>(striped);
      static_assert(256 * 32 == 8 * kTpThreads, "two 16-byte stores a thread");
      z[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
      z[threadIdx.x + kTpThreads] = make_uint4(0u, 0u, 0u, 0u);
    }
#endif
    tp_wait(tp_saddr(&sh.bar[pass]));
    TC_STAMP(3 + 3 * pass);
#if QGATE_TP_FSEL
    if (threadIdx.x < 32) tp_sum_select(recv + pass * kTcMaxCluster * 256, tot + pass * 256, csize, packed, need, sh);
    __syncthreads();
#else
    if (threadIdx.x < 256) {
      unsigned int total = 0;
      for (int r = 0; r < csize; ++r) total += tp_count1(recv + (pass * kTcMaxCluster + r) * 256, threadIdx.x, packed);
      tot[pass * 256 + threadIdx.x] = total;
    }
    __syncthreads();
    select_bin<false>(tot + pass * 256, need, &sh.bin, &sh.above);
    __syncthreads();
#endif
    const unsigned int bin = sh.bin;
    if (threadIdx.x == 0) sh.pass_bin[pass] = bin;
    prefix |= bin << shift;
    need -= sh.above;
    TC_STAMP(4 + 3 * pass);
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
  TC_STAMP(14);
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
  TC_STAMP(15);
  // The ordering runs at one call site (the kernel's code is fetched once per launch: its size costs).
  const uint2* list = cand;  // after pass 3 the candidates are the k keys already (full order)
  int n = k;
  int depth = 4;
  unsigned long long* items = cell_items;
  if (last < 3) {
#pragma unroll 1
    for (int pass = last + 1; pass < 4; ++pass) {
      const unsigned int largest = tp_local_count(striped, tot, sh, cand, m, pass, prefix,
                                                  QGATE_TP_UNI == 2 || (QGATE_TP_UNI == 1 && pass >= 2));
      if (pass == last + 1 && largest <= kTpMaxCell) {
        // Shallow order: the cells of passes 0..last and the byte of pass last + 1 order the candidates.
        n = static_cast<int>(m);
        depth = last + 1;
        items = reinterpret_cast<unsigned long long*>(recv);
        break;
      }
      tp_select(tot, sh, pass, prefix, need);  // a large cell: finish the passes
    }
    if (depth == 4) {
      tp_trim(cand, m, prefix, need, sh, all);  // prefix is now T, the k-th largest key
      list = all;
    }
  }
  TC_STAMP(16);
  tc_order<kNT>(striped, tot, sh, list, n, depth, items, k, need, prefix, rank, csize,
                indices + static_cast<int64_t>(row) * k);
  TC_STAMP(19);
  TC_GSTAMP(20);
#endif
}

}  // namespace
}  // namespace qgate
