// The reference's GEMM (qgate_kernels/reference.py gemv) in ATen, for the CPU ops' paths outside the
// kernels: y = x W^T in float32, one rounding to `out`. Row by row when x has several rows, as the
// reference: torch's CPU GEMM sums an M > 1 batch in another order than one row, and token t of a
// batch must get the bits of the single-token call.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace qgate::cpu {

// x: [K] or [M, K]; w: [N, K] -> [N] or [M, N] in `out`.
inline at::Tensor reference_matmul(const at::Tensor& x, const at::Tensor& w, at::ScalarType out) {
  const at::Tensor wt = w.to(at::kFloat).t();  // [K, N]
  if (x.dim() != 2 || x.size(0) <= 1) return at::matmul(x.to(at::kFloat), wt).to(out);
  std::vector<at::Tensor> rows;
  rows.reserve(x.size(0));
  for (int64_t i = 0; i < x.size(0); ++i) rows.push_back(at::matmul(x.narrow(0, i, 1).to(at::kFloat), wt));
  return at::cat(rows).to(out);
}

}  // namespace qgate::cpu
