// Ordering of the sm_90 top-k kernel (qsa_topk_push.cuh): included by
// qsa_topk_cluster.cuh inside its namespace and its sm_90 guard, after tc_scan.
//
// The radix passes split the keys into cells whose order is known (tc_cell); a key's output position
// is its cell's offset plus the number of larger composites (key << 32 | ~index, unique) in its
// cell. Every block places the listed keys of small cells into their cells (one shared atomic each)
// and ranks its 1/C of the list: a thread counts for a key of a cell of up to kTcSerialCell keys; a
// key of a large cell of one key (ties) is ranked from the list order, and one of a large cell of
// several keys by a warp (cell / 32 steps a key).

// Cells of up to this many keys are ranked a thread a key; larger ones are "large" (below). 128 was
// measured faster than 32.
constexpr unsigned int kTcSerialCell = 128;

// The composite of a listed key (key, index): larger for a larger key, then for a smaller index
// (unique: the stable sort's order).
__device__ __forceinline__ unsigned long long tc_composite(uint2 e) {
  return (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
}

// Writes a ranked key's index (int32, the QSA block index) to the output if its position is below k.
__device__ __forceinline__ void tc_put(unsigned int at, int k, uint2 e, int* __restrict__ indices) {
  if (at < static_cast<unsigned int>(k)) indices[at] = static_cast<int>(e.y);
}

// Cell of a selected key: the radix passes split the selected keys into cells whose order is known:
// level p holds the keys that match T in the bytes above byte p and exceed it in byte p, one cell per
// value b of that byte (cells of level 0 above those of level 1, ..., higher b first); the keys equal
// to T are the last cell (level 3, b = byte 0 of T). Cell id lvl * 256 + 255 - b increases with order.
// depth < 3 or a shallow order (push kernel): the passes stopped after level depth - 1, thr holds the
// bytes chosen so far, and every candidate that matches them goes to level depth by its byte there.
__device__ __forceinline__ int tc_cell(uint32_t key, uint32_t thr, int depth = 3) {
  const uint32_t x = key ^ thr;
  int lvl = x == 0 ? 3 : __clz(x) >> 3;
  lvl = lvl < depth ? lvl : depth;
  return lvl * 256 + 255 - static_cast<int>((key >> (24 - 8 * lvl)) & 255u);
}

// Large cells (over kTcSerialCell keys: ties on a coarse grid, or a cell the passes left unsplit)
// are not placed during the bucketing: many keys of one warp would add on their fill counter (the
// adds collide), and counting a rank there costs cell / 32 warp steps a key. If a large cell holds
// one key (ties), a key's rank in it is the number of the cell's keys before it in the list, which
// is in increasing index order in every caller (the stable sort's order). The keys of a large cell
// of several keys are placed afterwards and ranked by warp counting. Large cells are numbered in
// output order and at most 32 of them start below k (the 31 before the last one hold over 128
// keys each, all below k <= 4096); one numbered beyond kTcLarge (it starts at k or later) is
// placed and counted, never listed.
constexpr unsigned int kTcLarge = 32;
static_assert(kTopkMaxK < 65536, "cell offsets are packed into 16 bits");

// Ordering, in every block: the n listed keys (in increasing index order) go to their cells (counts
// from the pass totals, so the cell offsets are exact), then this block ranks the keys in its 1/C of
// the list within their cell, and writes those ranked below k.
// Full order (depth 4): the list is the k selected keys; cell counts tot[lvl][b] for b above the
// chosen byte, `need` for the keys equal to T. Shallow order (depth 1..3, push kernel): the list is
// every candidate above the prefix of passes 0..depth-1; level depth counts all bins of tot[depth],
// and only the cells that start below k are placed and ranked (cell_items holds k + largest cell).
// n < 65536 (k <= kTopkMaxK, or the push kernel's candidate cap); csize is a power of two.
template <int NT>
__device__ __forceinline__ void tc_order(unsigned int* scratch, const unsigned int* tot, TcShared& sh,
                                         const uint2* list, int n, int depth, unsigned long long* cell_items, int k,
                                         unsigned int need, uint32_t thr, uint32_t rank, int csize,
                                         int* __restrict__ indices) {
  constexpr int kPer = kTcCells / NT;  // cells a thread counts
  constexpr int kWarps = NT / 32;
  constexpr unsigned int kNone = kTcLarge << 16;          // cell word: offset | large cell's number << 16
  unsigned int* cell_word = scratch;                      // [kTcCells + 1]
  unsigned int* cell_fill = cell_word + kTcCells + 1;     // [kTcCells], then the queue of large-cell keys
  unsigned int* large_before = cell_fill + kTcCells;      // [kTcLarge][32] lane-striped: cell L before lo (*)
  unsigned int* large_min = large_before + kTcLarge * 32;  // [kTcLarge][32] lane-striped: least key
  unsigned int* large_max = large_min + kTcLarge * 32;     // [kTcLarge][32] lane-striped: largest key
  unsigned int* large_warp = large_max + kTcLarge * 32;    // [kWarps][kTcLarge] cell L in a warp's chunk share
  unsigned int* large_run = large_warp + kWarps * kTcLarge;  // [kTcLarge] cell L in list[0, chunk start)
  unsigned int* large_mixed = large_run + kTcLarge;          // [kTcLarge] nonzero: cell L holds several keys
  unsigned int* large_cnt = large_mixed + kTcLarge;          // [kTcLarge] keys of cell L
  static_assert(kTcCells % NT == 0 && (2 * kTcCells + 1 + (3 * 32 + kWarps + 3) * kTcLarge) * sizeof(unsigned int) <=
                                          kTcUnionBytes,
                "cells");
  const bool shallow = depth < 4;  // full order: depth 4 (the cells cap at level 3)
  if (!shallow) depth = 3;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int lg = __ffs(csize) - 1;  // this block's share of the list: [lo, hi)
  const int lo = static_cast<int>((static_cast<unsigned int>(n) * rank) >> lg);
  const int hi = static_cast<int>((static_cast<unsigned int>(n) * (rank + 1)) >> lg);
  unsigned int cnt[kPer];
  unsigned int mine = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int cid = threadIdx.x * kPer + i;
    const int lvl = cid >> 8;
    const unsigned int b = 255u - static_cast<unsigned int>(cid & 255);
    const unsigned int pb = sh.pass_bin[lvl];
    if (!shallow) {
      cnt[i] = b > pb ? tot[lvl * 256 + b] : (lvl == 3 && b == pb ? need : 0u);
    } else if (lvl < depth) {
      cnt[i] = b > pb ? tot[lvl * 256 + b] : 0u;
    } else {
      cnt[i] = lvl == depth ? tot[lvl * 256 + b] : 0u;
    }
    mine += cnt[i] | (cnt[i] > kTcSerialCell ? 0x10000u : 0u);  // keys | large cells << 16
  }
  unsigned int total = 0;
  unsigned int off = tc_scan<NT>(mine, sh.warp, &total);  // total & 0xffff == n
  unsigned int num = off >> 16;                          // large cells before this thread's
  off &= 0xffffu;
  const unsigned int nlarge = min(total >> 16, kTcLarge);  // the same in every thread
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int cid = threadIdx.x * kPer + i;
    const bool large = cnt[i] > kTcSerialCell && num < kTcLarge;
    cell_word[cid] = off | (large ? num << 16 : kNone);
    cell_fill[cid] = 0;
    if (large) large_cnt[num] = cnt[i];
    num += cnt[i] > kTcSerialCell ? 1u : 0u;
    off += cnt[i];
  }
  if (threadIdx.x == 0) {
    cell_word[kTcCells] = (total & 0xffffu) | kNone;
    sh.mixed = 0;
  }
  for (unsigned int i = threadIdx.x; i < nlarge * 32; i += NT) {
    large_before[i] = 0;
    large_min[i] = 0xffffffffu;
    large_max[i] = 0;
  }
  for (unsigned int i = threadIdx.x; i < kWarps * kTcLarge; i += NT) large_warp[i] = 0;
  __syncthreads();
  // Bucketing of the cells that start below k (the others rank at k or below), but for the large
  // ones their least and largest key and (*) how many of their keys lie before this block's share
  // (counted over the shorter side of lo), lane-striped: a warp's adds never collide.
  const bool from_end = lo > n / 2;
  for (int p = threadIdx.x; p < n; p += NT) {
    const uint2 e = list[p];
    const int cid = tc_cell(e.x, thr, depth);
    const unsigned int w = cell_word[cid];
    const unsigned int first = w & 0xffffu;
    if (first < static_cast<unsigned int>(k)) {
      const unsigned int num = w >> 16;
      if (num == kTcLarge) {
        const unsigned int slot = first + atomicAdd(cell_fill + cid, 1u);
        cell_items[slot] = tc_composite(e);
      } else {
        if ((p < lo) != from_end) atomicAdd(large_before + num * 32 + lane, 1u);
        atomicMin(large_min + num * 32 + lane, e.x);
        atomicMax(large_max + num * 32 + lane, e.x);
      }
    }
  }
  __syncthreads();
  if (nlarge > 0) {
    if (warp < static_cast<int>(nlarge)) {
      const unsigned int c = __reduce_add_sync(0xffffffffu, large_before[warp * 32 + lane]);
      const unsigned int lo_key = __reduce_min_sync(0xffffffffu, large_min[warp * 32 + lane]);
      const unsigned int hi_key = __reduce_max_sync(0xffffffffu, large_max[warp * 32 + lane]);
      if (lane == 0) {
        large_run[warp] = from_end ? large_cnt[warp] - c : c;
        large_mixed[warp] = lo_key != hi_key;  // (a cell that starts at k or later: no keys, 1)
        if (lo_key != hi_key && lo_key != 0xffffffffu) sh.mixed = 1;
      }
    }
    __syncthreads();
    if (sh.mixed) {  // the keys of large cells of several keys to their cells (ranked by counting)
      for (int p = threadIdx.x; p < n; p += NT) {
        const uint2 e = list[p];
        const int cid = tc_cell(e.x, thr, depth);
        const unsigned int w = cell_word[cid];
        const unsigned int num = w >> 16;
        if ((w & 0xffffu) < static_cast<unsigned int>(k) && num < kTcLarge && large_mixed[num] != 0) {
          const unsigned int slot = (w & 0xffffu) + atomicAdd(cell_fill + cid, 1u);
          cell_items[slot] = tc_composite(e);
        }
      }
      __syncthreads();
    }
  }
  // Ranking of this block's share of the list (the same order in every block): a key's position is
  // its cell's offset plus its rank in the cell. Cells of up to kTcSerialCell keys: a thread counts
  // the larger composites (key << 32 | ~index, unique). Large cells of one key: the cell's keys
  // before it in the list (large_run: earlier chunks and blocks; large_warp: earlier warps of this
  // chunk; peer lanes of its warp). Other large cells: queued, a warp counts for each key (cell / 32
  // steps). Only the index is written, so no load waits on memory.
  unsigned int* queue = cell_fill;  // reused: [kTcCells] positions of queued keys
  if (threadIdx.x == 0) sh.queued = 0;
  __syncthreads();
  for (int p0 = lo; p0 < hi; p0 += NT) {
    const int p = p0 + static_cast<int>(threadIdx.x);
    bool queued = false;
    bool listed = false;  // in a large cell of one key
    unsigned int num = kTcLarge;
    unsigned int first = 0;
    unsigned int peers = 0;
    uint2 e = make_uint2(0u, 0u);
    if (p < hi) {
      e = list[p];
      const int cid = tc_cell(e.x, thr, depth);
      const unsigned int w = cell_word[cid];
      first = w & 0xffffu;
      const unsigned int last = cell_word[cid + 1] & 0xffffu;
      if (first < static_cast<unsigned int>(k)) {
        if (last - first > kTcSerialCell) {
          num = w >> 16;
          listed = num < kTcLarge && large_mixed[num] == 0;
          queued = !listed;
        } else {
          const unsigned long long c = tc_composite(e);
          unsigned int at = first;
          for (unsigned int q = first; q < last; ++q) at += cell_items[q] > c ? 1u : 0u;
          tc_put(at, k, e, indices);
        }
      }
    }
    if (nlarge > 0) {  // peer lanes (same large cell): one ballot a large cell present in the warp
      for (unsigned int left = __ballot_sync(0xffffffffu, listed); left != 0;) {
        const unsigned int ln = __shfl_sync(0xffffffffu, num, __ffs(left) - 1);
        const unsigned int same = __ballot_sync(0xffffffffu, listed && num == ln);
        if (listed && num == ln) peers = same;
        left &= ~same;
      }
      if (listed && lane == 31 - __clz(peers)) large_warp[warp * kTcLarge + num] = __popc(peers);
    }
    const unsigned int qmask = __ballot_sync(0xffffffffu, queued);
    if (qmask != 0) {
      unsigned int base = 0;
      if (lane == 0) base = atomicAdd(&sh.queued, static_cast<unsigned int>(__popc(qmask)));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (queued) queue[base + __popc(qmask & ((1u << lane) - 1u))] = static_cast<unsigned int>(p);
    }
    __syncthreads();
    if (listed) {
      unsigned int at = first + large_run[num] + __popc(peers & ((1u << lane) - 1u));
#pragma unroll 1
      for (int w = 0; w < warp; ++w) at += large_warp[w * kTcLarge + num];
      tc_put(at, k, e, indices);
    }
    const unsigned int nq = sh.queued;
    for (unsigned int q = warp; q < nq; q += kWarps) {
      const uint2 eq = list[queue[q]];
      const int cid = tc_cell(eq.x, thr, depth);
      const int qfirst = static_cast<int>(cell_word[cid] & 0xffffu);
      const int qlast = static_cast<int>(cell_word[cid + 1] & 0xffffu);
      const unsigned long long c = tc_composite(eq);
      unsigned int larger = 0;
      for (int i = qfirst + lane; i < qlast; i += 32) larger += cell_items[i] > c ? 1u : 0u;
      larger = __reduce_add_sync(0xffffffffu, larger);
      if (lane == 0) tc_put(qfirst + larger, k, eq, indices);
    }
    __syncthreads();
    if (p0 + NT < hi) {  // another chunk: the large cells' keys of this one move into large_run
      if (nlarge > 0) {
        if (threadIdx.x < nlarge) {
          unsigned int c = 0;
#pragma unroll 1
          for (int w = 0; w < kWarps; ++w) c += large_warp[w * kTcLarge + threadIdx.x];
          large_run[threadIdx.x] += c;
        }
        __syncthreads();
        for (unsigned int i = threadIdx.x; i < kWarps * kTcLarge; i += NT) large_warp[i] = 0;
      }
      if (threadIdx.x == 0) sh.queued = 0;
      __syncthreads();
    }
  }
}
