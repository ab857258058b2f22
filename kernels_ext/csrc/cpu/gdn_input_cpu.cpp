// CPU kernel of qgate::gdn_input (schema in ../ops_def.cpp): both input projections of a Gated-DeltaNet
// layer for one token on the row-dot engine (row_dot.h: the same per-row arithmetic as qgate::gemv's
// CPU kernel, so each output equals gemv's bits for its row), written straight into the four outputs
// vLLM's GDN core takes, in the flat (Qwen3.5 / Qwen4Exp) or interleaved (Qwen3-Next) row layout.
// Inputs the kernel does not take (T > 1, fp32 or mixed dtypes) run the reference's math in ATen.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "reference_matmul.h"
#include "row_dot.h"

namespace {

using qgate::cpu::Elem;
using qgate::cpu::reference_matmul;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

struct Heads {
  int64_t nk, nv, dk, dv;
  int64_t mixed() const { return 2 * nk * dk + nv * dv; }
  int64_t qkvz_rows() const { return 2 * nk * dk + 2 * nv * dv; }
};

void check_args(const at::Tensor& x, const at::Tensor& w_qkvz, const at::Tensor& w_ba, const Heads& h,
                bool interleaved) {
  TORCH_CHECK(x.device().is_cpu() && w_qkvz.device().is_cpu() && w_ba.device().is_cpu(),
              "qgate::gdn_input (CPU): tensors must be on the CPU");
  TORCH_CHECK(h.nk > 0 && h.nv > 0 && h.dk > 0 && h.dv > 0 && (!interleaved || h.nv % h.nk == 0),
              "qgate::gdn_input: heads nk=", h.nk, " nv=", h.nv, " dk=", h.dk, " dv=", h.dv, " do not fit the ",
              interleaved ? "interleaved" : "flat", " layout");
  TORCH_CHECK(x.dim() == 1 || x.dim() == 2, "qgate::gdn_input: x must be [K] or [T, K], got ", x.sizes());
  const int64_t k = x.size(-1);
  TORCH_CHECK(w_qkvz.dim() == 2 && w_qkvz.size(0) == h.qkvz_rows() && w_qkvz.size(1) == k,
              "qgate::gdn_input: w_qkvz must be [", h.qkvz_rows(), ", ", k, "], got ", w_qkvz.sizes());
  TORCH_CHECK(w_ba.dim() == 2 && w_ba.size(0) == 2 * h.nv && w_ba.size(1) == k, "qgate::gdn_input: w_ba must be [",
              2 * h.nv, ", ", k, "], got ", w_ba.sizes());
}

// The reference (qgate_kernels/reference.py gdn_input) in ATen, for any T and dtype.
Outputs reference_math(const at::Tensor& x, const at::Tensor& w_qkvz, const at::Tensor& w_ba, const Heads& h,
                       bool interleaved) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  const int64_t t = x2.size(0);
  const auto dt = x.scalar_type();
  at::Tensor qkvz = reference_matmul(x2, w_qkvz, dt);  // [T, rows]
  at::Tensor ba = reference_matmul(x2, w_ba, dt);      // [T, 2 nv]
  if (!interleaved) {
    auto parts = qkvz.split_with_sizes({h.mixed(), h.nv * h.dv}, -1);
    auto halves = ba.chunk(2, -1);
    return {parts[0].contiguous(), parts[1].reshape({t, h.nv, h.dv}).contiguous(), halves[0].contiguous(),
            halves[1].contiguous()};
  }
  const int64_t r = h.nv / h.nk;
  auto g = qkvz.view({t, h.nk, 2 * h.dk + 2 * r * h.dv}).split_with_sizes({h.dk, h.dk, r * h.dv, r * h.dv}, 2);
  auto gb = ba.view({t, h.nk, 2 * r}).split_with_sizes({r, r}, 2);
  at::Tensor mixed = at::cat({g[0].reshape({t, -1}), g[1].reshape({t, -1}), g[2].reshape({t, -1})}, -1);
  return {mixed, g[3].reshape({t, h.nv, h.dv}).clone(), gb[0].reshape({t, h.nv}).clone(),
          gb[1].reshape({t, h.nv}).clone()};
}

// Where row `row` of w_qkvz lands: (output 0 = mixed or 1 = z, element index).
std::pair<int, int64_t> qkvz_dest(int64_t row, const Heads& h, bool interleaved) {
  if (!interleaved) return row < h.mixed() ? std::make_pair(0, row) : std::make_pair(1, row - h.mixed());
  const int64_t r = h.nv / h.nk;
  const int64_t per = 2 * h.dk + 2 * r * h.dv;
  const int64_t g = row / per;
  const int64_t o = row % per;
  if (o < h.dk) return {0, g * h.dk + o};
  if (o < 2 * h.dk) return {0, h.nk * h.dk + g * h.dk + (o - h.dk)};
  if (o < 2 * h.dk + r * h.dv) return {0, 2 * h.nk * h.dk + g * r * h.dv + (o - 2 * h.dk)};
  return {1, g * r * h.dv + (o - 2 * h.dk - r * h.dv)};
}

// Where row `row` of w_ba lands: (output 2 = b or 3 = a, element index).
std::pair<int, int64_t> ba_dest(int64_t row, const Heads& h, bool interleaved) {
  if (!interleaved) return row < h.nv ? std::make_pair(2, row) : std::make_pair(3, row - h.nv);
  const int64_t r = h.nv / h.nk;
  const int64_t g = row / (2 * r);
  const int64_t o = row % (2 * r);
  return o < r ? std::make_pair(2, g * r + o) : std::make_pair(3, g * r + (o - r));
}

template <typename T>
void scatter(const std::vector<float>& y, int64_t rows_qkvz, const Heads& h, bool interleaved, Outputs& out) {
  T* dst[4] = {std::get<0>(out).data_ptr<T>(), std::get<1>(out).data_ptr<T>(), std::get<2>(out).data_ptr<T>(),
               std::get<3>(out).data_ptr<T>()};
  for (int64_t row = 0; row < static_cast<int64_t>(y.size()); ++row) {
    const auto [which, idx] =
        row < rows_qkvz ? qkvz_dest(row, h, interleaved) : ba_dest(row - rows_qkvz, h, interleaved);
    dst[which][idx] = T(y[row]);
  }
}

Outputs gdn_input_cpu(const at::Tensor& x, const at::Tensor& w_qkvz, const at::Tensor& w_ba, int64_t nk, int64_t nv,
                      int64_t dk, int64_t dv, bool interleaved, bool /*static_weight*/) {
  const Heads h{nk, nv, dk, dv};
  check_args(x, w_qkvz, w_ba, h, interleaved);
  const auto dt = x.scalar_type();
  const bool fast = (dt == at::kHalf || dt == at::kBFloat16) && w_qkvz.scalar_type() == dt &&
                    w_ba.scalar_type() == dt && (x.dim() == 1 || x.size(0) == 1);
  if (!fast) return reference_math(x, w_qkvz, w_ba, h, interleaved);
  const at::Tensor xc = x.contiguous(), wq = w_qkvz.contiguous(), wb = w_ba.contiguous();
  const int64_t k = xc.size(-1);
  const int64_t rows_qkvz = h.qkvz_rows();
  const int64_t rows = rows_qkvz + 2 * nv;
  const Elem elem = dt == at::kHalf ? Elem::kHalf : Elem::kBFloat16;
  const qgate::cpu::Isa isa = qgate::cpu::best_isa();
  std::vector<float> xf(qgate::cpu::padded(k));
  std::vector<float> y(rows);
  qgate::cpu::to_float_padded(isa, elem, xc.data_ptr(), k, xf.data());
  const auto* pq = static_cast<const uint16_t*>(wq.data_ptr());
  const auto* pb = static_cast<const uint16_t*>(wb.data_ptr());
  at::parallel_for(0, rows, qgate::cpu::row_grain(k, 2, qgate::cpu::kMinTaskBytes), [&](int64_t begin, int64_t end) {
    // rows [0, rows_qkvz) are w_qkvz's, the rest w_ba's; a task may straddle the two
    const int64_t split = std::min(std::max(begin, rows_qkvz), end);
    if (split > begin) qgate::cpu::rows_dot(isa, elem, pq + begin * k, k, split - begin, k, xf.data(), &y[begin]);
    if (end > split) {
      qgate::cpu::rows_dot(isa, elem, pb + (split - rows_qkvz) * k, k, end - split, k, xf.data(), &y[split]);
    }
  });
  const auto opts = x.options();
  Outputs out{at::empty({1, h.mixed()}, opts), at::empty({1, nv, dv}, opts), at::empty({1, nv}, opts),
              at::empty({1, nv}, opts)};
  if (elem == Elem::kHalf) {
    scatter<at::Half>(y, rows_qkvz, h, interleaved, out);
  } else {
    scatter<at::BFloat16>(y, rows_qkvz, h, interleaved, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(qgate, CPU, m) { m.impl("gdn_input", &gdn_input_cpu); }
