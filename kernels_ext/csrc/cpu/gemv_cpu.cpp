// CPU kernel of qgate::gemv (schema in ../ops_def.cpp): batch-one fp16/bf16 row-GEMV on the row-dot
// engine (row_dot.h: vectorised fp16/bf16 -> fp32, FMA, float32 sums in one fixed order), rows split
// over at::parallel_for. Inputs the kernel does not take (M > 1, fp32 or mixed dtypes) run the
// reference's math in ATen (x.float() @ W.float().T, rounded once), so the op stays total on the CPU.
//
// Also declares qgate_cpu::gemv_isa(weight, x, isa) and qgate_cpu::best_isa(): the same kernel on a
// chosen ISA path (0 scalar, 1 AVX2, 2 AVX-512) for tests and benchmarks; not a route.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "../gemv_site.h"
#include "reference_matmul.h"
#include "row_dot.h"

namespace {

using qgate::cpu::Elem;
using qgate::cpu::Isa;
using qgate::cpu::reference_matmul;

bool fast_path(const at::Tensor& weight, const at::Tensor& x) {
  const auto dt = weight.scalar_type();
  return (dt == at::kHalf || dt == at::kBFloat16) && x.scalar_type() == dt &&
         (x.dim() == 1 || x.size(0) == 1);
}

void check_args(const at::Tensor& weight, const at::Tensor& x) {
  TORCH_CHECK(weight.device().is_cpu() && x.device().is_cpu(), "qgate::gemv (CPU): tensors must be on the CPU");
  TORCH_CHECK(weight.dim() == 2, "qgate::gemv: weight must be [N, K], got ", weight.sizes());
  TORCH_CHECK((x.dim() == 1 || x.dim() == 2) && x.size(-1) == weight.size(1),
              "qgate::gemv: x must be [K] or [M, K] with K = ", weight.size(1), ", got ", x.sizes());
}

at::Tensor gemv_on(const at::Tensor& weight, const at::Tensor& x, Isa isa) {
  check_args(weight, x);
  if (!fast_path(weight, x)) {
    // the reference (qgate_kernels/reference.py): float32 matmul, one rounding to x's dtype
    return reference_matmul(x, weight, x.scalar_type());
  }
  const at::Tensor w = weight.contiguous();
  const at::Tensor xc = x.contiguous();
  const int64_t n = w.size(0);
  const int64_t k = w.size(1);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  at::Tensor y = at::empty(shape, x.options());
  if (n == 0) return y;
  const Elem elem = w.scalar_type() == at::kHalf ? Elem::kHalf : Elem::kBFloat16;
  std::vector<float> xf(qgate::cpu::padded(k));
  std::vector<float> yf(n);
  qgate::cpu::to_float_padded(isa, elem, xc.data_ptr(), k, xf.data());
  const auto* wp = static_cast<const uint16_t*>(w.data_ptr());
  const int64_t grain = qgate::cpu::row_grain(k, 2, qgate::cpu::kMinTaskBytes);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    qgate::cpu::rows_dot(isa, elem, wp + begin * k, k, end - begin, k, xf.data(), yf.data() + begin);
    qgate::cpu::from_float(isa, elem, yf.data() + begin, end - begin, static_cast<uint16_t*>(y.data_ptr()) + begin);
  });
  return y;
}

// static_weight only changes how the CUDA kernel is launched.
at::Tensor gemv_cpu(const at::Tensor& weight, const at::Tensor& x, bool /*static_weight*/) {
  return gemv_on(weight, x, qgate::cpu::best_isa());
}

at::Tensor gemv_isa(const at::Tensor& weight, const at::Tensor& x, int64_t isa) {
  TORCH_CHECK(isa >= 0 && isa <= 2, "qgate_cpu::gemv_isa: isa must be 0 (scalar), 1 (avx2) or 2 (avx512)");
  const Isa want = static_cast<Isa>(isa);
  TORCH_CHECK(qgate::cpu::isa_supported(want), "qgate_cpu::gemv_isa: this CPU or build has no ",
              qgate::cpu::isa_name(want), " path");
  return gemv_on(weight, x, want);
}

int64_t best_isa() { return static_cast<int64_t>(qgate::cpu::best_isa()); }

// The plugin's fast entry (csrc/gemv_site.h): y [1, N], or an undefined tensor (None in Python) when x
// is not a row the kernel takes, counted on hits only when the kernel ran.
at::Tensor gemv_site_cpu(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& hits) {
  if (!qgate::gemv_site_takes(weight, x)) return at::Tensor();
  qgate::gemv_site_count(hits);
  return gemv_on(weight, x, qgate::cpu::best_isa());
}

}  // namespace

TORCH_LIBRARY_IMPL(qgate, CPU, m) { m.impl("gemv", &gemv_cpu); }

TORCH_LIBRARY_IMPL(qgate_plugin, CPU, m) { m.impl("gemv_site", &gemv_site_cpu); }

TORCH_LIBRARY(qgate_cpu, m) {
  m.def("gemv_isa(Tensor weight, Tensor x, int isa) -> Tensor");
  m.impl("gemv_isa", torch::dispatch(c10::DispatchKey::CPU, &gemv_isa));
  m.def("best_isa() -> int", &best_isa);
}
