// Ordering of the sm_90 top-k kernels (qsa_topk_cluster.cuh, qsa_topk_push.cuh): included by
// qsa_topk_cluster.cuh inside its namespace and its sm_90 guard, after tc_scan.
//
// The radix passes split the keys into cells whose order is known (tc_cell); a key's output position
// is its cell's offset plus the number of larger composites (key << 32 | ~index, unique) in its
// cell. Every block places the listed keys into their cells (one shared atomic each) and ranks its
// 1/C of the list: a thread counts for a key of a cell of up to kTcSerialCell keys, a warp for a key
// of a larger cell (ties: one cell per value; cell / 32 steps a key). BENCH.md has the variants
// that were slower (stable placement of large cells, ranking by output range).

#ifndef QGATE_TC_SERIAL_CELL  // (tuning: tools/topk_bench.cu builds other values)
#define QGATE_TC_SERIAL_CELL 128
#endif
// Keys of larger cells are ranked a warp a key (128 measured faster than 32: BENCH.md).
constexpr unsigned int kTcSerialCell = QGATE_TC_SERIAL_CELL;

// The input element of a listed key (key, index): the key's float where the key determines its bits
// (key_of is one to one except that all NaNs map to one key and -0.0, +0.0 to another).
__device__ __forceinline__ float tc_value(uint2 e, const float* __restrict__ s) {
  if (e.x == 0xffffffffu || e.x == 0x80000000u) return __ldg(s + e.y);
  return __uint_as_float((e.x & 0x80000000u) ? (e.x & 0x7fffffffu) : ~e.x);
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

// Ordering, in every block: the n listed keys go to their cells (counts from the pass totals, so the
// cell offsets are exact), then this block ranks the keys in its 1/C of the list by counting larger
// composites (key << 32 | ~index, unique) within the cell, and writes those ranked below k.
// Full order (depth 4): the list is the k selected keys; cell counts tot[lvl][b] for b above the
// chosen byte, `need` for the keys equal to T. Shallow order (depth 1..3, push kernel): the list is
// every candidate above the prefix of passes 0..depth-1; level depth counts all bins of tot[depth],
// and only the cells that start below k are placed and ranked (cell_items holds k + largest cell).
template <int NT>
__device__ __forceinline__ void tc_order(unsigned int* scratch, const unsigned int* tot, TcShared& sh,
                                         const uint2* list, int n, int depth, unsigned long long* cell_items, int k,
                                         unsigned int need, uint32_t thr, uint32_t rank, int csize,
                                         const float* __restrict__ s, float* __restrict__ values,
                                         int64_t* __restrict__ indices) {
  constexpr int kPer = kTcCells / NT;  // cells a thread counts
  static_assert(kTcCells % NT == 0 && (kTcCells + 1) * 2 * sizeof(unsigned int) <= kTcUnionBytes, "cells");
  unsigned int* cell_off = scratch;                // [kTcCells + 1]
  unsigned int* cell_fill = scratch + kTcCells + 1;  // [kTcCells]
  const bool shallow = depth < 4;                  // full order: depth 4 (the cells cap at level 3)
  if (!shallow) depth = 3;
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
    mine += cnt[i];
  }
  unsigned int total = 0;
  unsigned int off = tc_scan<NT>(mine, sh.warp, &total);  // total == n
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    cell_off[threadIdx.x * kPer + i] = off;
    cell_fill[threadIdx.x * kPer + i] = 0;
    off += cnt[i];
  }
  if (threadIdx.x == 0) cell_off[kTcCells] = total;
  __syncthreads();
  // Bucketing (only the cells that start below k: the others rank at k or below).
  for (int p = threadIdx.x; p < n; p += NT) {
    const uint2 e = list[p];
    const int cid = tc_cell(e.x, thr, depth);
    const unsigned int first = cell_off[cid];
    if (first < static_cast<unsigned int>(k)) {
      const unsigned int slot = first + atomicAdd(cell_fill + cid, 1u);
      cell_items[slot] = (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
    }
  }
  __syncthreads();
  TC_STAMP(17);
  // Ranking of this block's 1/C of the list (the same order in every block): a key's position is its
  // cell's offset plus the larger composites in its cell. A thread counts for a key of a cell of up
  // to kTcSerialCell keys; the keys of larger cells (ties: one cell per value) are queued and a warp
  // counts for each (cell / 32 steps a key). The value is the key's float (tc_value), so no load
  // waits on memory, except for NaN and zero keys, whose payload or sign only the input holds.
  const int lane = threadIdx.x & 31;
  const int lo = static_cast<int>((static_cast<int64_t>(n) * rank) / csize);
  const int hi = static_cast<int>((static_cast<int64_t>(n) * (rank + 1)) / csize);
  unsigned int* queue = cell_fill;  // reused: [kTcCells] positions of keys of large cells (see below)
  if (threadIdx.x == 0) sh.queued = 0;
  __syncthreads();
  for (int p0 = lo; p0 < hi; p0 += NT) {
    const int p = p0 + static_cast<int>(threadIdx.x);
    bool queued = false;
    if (p < hi) {
      const uint2 e = list[p];
      const int cid = tc_cell(e.x, thr, depth);
      const unsigned int first = cell_off[cid];
      const unsigned int last = cell_off[cid + 1];
      if (first < static_cast<unsigned int>(k)) {
        if (last - first > kTcSerialCell) {
          queued = true;
        } else {
          const unsigned long long c = (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
          unsigned int at = first;
          for (unsigned int j = first; j < last; ++j) at += cell_items[j] > c ? 1u : 0u;
          if (at < static_cast<unsigned int>(k)) {
            values[at] = tc_value(e, s);
            indices[at] = static_cast<int64_t>(e.y);
          }
        }
      }
    }
    const unsigned int qmask = __ballot_sync(0xffffffffu, queued);
    if (qmask != 0) {
      unsigned int base = 0;
      if (lane == 0) base = atomicAdd(&sh.queued, static_cast<unsigned int>(__popc(qmask)));
      base = __shfl_sync(0xffffffffu, base, 0);
      if (queued) queue[base + __popc(qmask & ((1u << lane) - 1u))] = static_cast<unsigned int>(p);
    }
    __syncthreads();
    const unsigned int nq = sh.queued;
    for (unsigned int q = threadIdx.x >> 5; q < nq; q += NT / 32) {
      const uint2 e = list[queue[q]];
      const int cid = tc_cell(e.x, thr, depth);
      const int first = static_cast<int>(cell_off[cid]);
      const int last = static_cast<int>(cell_off[cid + 1]);
      const unsigned long long c = (static_cast<unsigned long long>(e.x) << 32) | (0xffffffffu - e.y);
      unsigned int larger = 0;
      for (int j = first + lane; j < last; j += 32) larger += cell_items[j] > c ? 1u : 0u;
      larger = __reduce_add_sync(0xffffffffu, larger);
      if (lane == 0 && first + static_cast<int>(larger) < k) {
        values[first + larger] = tc_value(e, s);
        indices[first + larger] = static_cast<int64_t>(e.y);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) sh.queued = 0;
    __syncthreads();
  }
}
