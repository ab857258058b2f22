// CUDA kernels of the qgate::* ops (schemas in ops_def.cpp). Caller errors are TORCH_CHECKs with the
// offending shape or dtype; every launch's cudaError_t is checked. The Python wrappers
// (qgate_kernels/ops.py) only call these for inputs they support and run the reference otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "launchers.h"

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "qgate::", what, ": CUDA error: ", cudaGetErrorString(err));
}

void check_dense(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& device) {
  TORCH_CHECK(t.is_cuda() && t.device() == device, name, " must be on ", device, ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
}

at::Tensor gemv_cuda(const at::Tensor& weight, const at::Tensor& x, bool static_weight) {
  const at::Device dev = weight.device();
  check_dense(weight, "weight", at::kHalf, dev);
  check_dense(x, "x", at::kHalf, dev);
  TORCH_CHECK(weight.dim() == 2, "weight must be [N, K], got ", weight.sizes());
  const int64_t n = weight.size(0);
  const int64_t k = weight.size(1);
  TORCH_CHECK((x.dim() == 1 || (x.dim() == 2 && x.size(0) == 1)) && x.size(-1) == k,
              "x must be [K] or [1, K] with K = ", k, ", got ", x.sizes());
  TORCH_CHECK(k > 0 && k % 8 == 0, "K must be a positive multiple of 8, got ", k);
  const c10::cuda::CUDAGuard guard(dev);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  at::Tensor y = at::empty(shape, x.options());
  check_cuda(qgate::launch_gemv(weight.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, static_weight,
                                at::cuda::getCurrentCUDAStream()),
             "gemv");
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_hc_cuda(const at::Tensor& h, const at::Tensor& norm_weight,
                                                             const at::Tensor& w_a, const at::Tensor& a_static,
                                                             const at::Tensor& scale_a, const at::Tensor& w_b,
                                                             const at::Tensor& b_static, const at::Tensor& scale_b,
                                                             double eps) {
  const at::Device dev = h.device();
  TORCH_CHECK(h.dim() == 2, "h must be [n, d], got ", h.sizes());
  const int64_t n = h.size(0);
  const int64_t d = h.size(1);
  TORCH_CHECK(n >= 1 && n <= qgate::kHcMaxStreams, "n must be in [1, ", qgate::kHcMaxStreams, "], got ", n);
  TORCH_CHECK(d > 0 && d % 8 == 0, "d must be a positive multiple of 8, got ", d);
  check_dense(h, "h", at::kHalf, dev);
  check_dense(norm_weight, "norm_weight", at::kHalf, dev);
  check_dense(w_a, "w_a", at::kHalf, dev);
  check_dense(w_b, "w_b", at::kHalf, dev);
  check_dense(a_static, "a_static", at::kFloat, dev);
  check_dense(b_static, "b_static", at::kFloat, dev);
  check_dense(scale_a, "scale_a", at::kFloat, dev);
  check_dense(scale_b, "scale_b", at::kFloat, dev);
  TORCH_CHECK(norm_weight.numel() == d && w_b.numel() == d, "norm_weight and w_b must be [d]");
  TORCH_CHECK(w_a.dim() == 2 && w_a.size(0) == n + 1 && w_a.size(1) == d, "w_a must be [n+1, d], got ", w_a.sizes());
  TORCH_CHECK(a_static.numel() == n * (n + 1) && b_static.numel() == n, "a_static must be [n, n+1], b_static [n]");
  TORCH_CHECK(scale_a.numel() == 1 && scale_b.numel() == 1, "scale_a and scale_b must have one element");
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor layer_input = at::empty({d}, h.options());
  at::Tensor mixed = at::empty({n, d}, h.options());
  at::Tensor b = at::empty({n}, h.options().dtype(at::kFloat));
  qgate::HcArgs args{h.data_ptr(), norm_weight.data_ptr(), w_a.data_ptr(), a_static.data_ptr<float>(),
                     scale_a.data_ptr<float>(), w_b.data_ptr(), b_static.data_ptr<float>(),
                     scale_b.data_ptr<float>(), static_cast<float>(eps), static_cast<int>(n), d,
                     layer_input.data_ptr(), mixed.data_ptr(), b.data_ptr<float>()};
  check_cuda(qgate::launch_fused_hc(args, at::cuda::getCurrentCUDAStream()), "fused_hc");
  return {layer_input, mixed, b};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gdn_input_cuda(const at::Tensor& x, const at::Tensor& w_qkvz,
                                                                          const at::Tensor& w_ba, int64_t nk,
                                                                          int64_t nv, int64_t dk, int64_t dv,
                                                                          bool static_weight) {
  const at::Device dev = x.device();
  check_dense(x, "x", at::kHalf, dev);
  check_dense(w_qkvz, "w_qkvz", at::kHalf, dev);
  check_dense(w_ba, "w_ba", at::kHalf, dev);
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(x.dim() == 1 || (x.dim() == 2 && x.size(0) == 1), "x must be [K] or [1, K], got ", x.sizes());
  TORCH_CHECK(hidden > 0 && hidden % 8 == 0, "K must be a positive multiple of 8, got ", hidden);
  TORCH_CHECK(nk > 0 && nv > 0 && dk > 0 && dv > 0 && nv % nk == 0, "need nv a multiple of nk, got ", nk, ", ", nv);
  TORCH_CHECK(w_qkvz.dim() == 2 && w_qkvz.size(0) == 2 * nk * dk + 2 * nv * dv && w_qkvz.size(1) == hidden,
              "w_qkvz must be [nk*(2dk) + 2nv*dv, K], got ", w_qkvz.sizes());
  TORCH_CHECK(w_ba.dim() == 2 && w_ba.size(0) == 2 * nv && w_ba.size(1) == hidden, "w_ba must be [2nv, K], got ",
              w_ba.sizes());
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor mixed = at::empty({1, 2 * nk * dk + nv * dv}, x.options());
  at::Tensor z = at::empty({1, nv, dv}, x.options());
  at::Tensor b = at::empty({1, nv}, x.options());
  at::Tensor a = at::empty({1, nv}, x.options());
  qgate::GdnArgs args{x.data_ptr(),        w_qkvz.data_ptr(), w_ba.data_ptr(),       mixed.data_ptr(),
                      z.data_ptr(),        b.data_ptr(),      a.data_ptr(),          hidden,
                      static_cast<int>(nk), static_cast<int>(nv), static_cast<int>(dk), static_cast<int>(dv),
                      static_weight};
  check_cuda(qgate::launch_gdn_input(args, at::cuda::getCurrentCUDAStream()), "gdn_input");
  return {mixed, z, b, a};
}

std::tuple<at::Tensor, at::Tensor> qsa_topk_cuda(const at::Tensor& scores, int64_t k) {
  const at::Device dev = scores.device();
  check_dense(scores, "scores", at::kFloat, dev);
  TORCH_CHECK(scores.dim() == 2, "scores must be [B, L], got ", scores.sizes());
  const int64_t rows = scores.size(0);
  const int64_t len = scores.size(1);
  TORCH_CHECK(k >= 1 && k <= len && k <= qgate::kTopkMaxK, "k must be in [1, min(L, ", qgate::kTopkMaxK, ")], got ", k);
  TORCH_CHECK(len < (int64_t(1) << 31), "L must be < 2^31, got ", len);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor values = at::empty({rows, k}, scores.options());
  at::Tensor indices = at::empty({rows, k}, scores.options().dtype(at::kLong));
  if (rows == 0) return {values, indices};
  qgate::TopkPlan plan{};
  check_cuda(qgate::plan_qsa_topk(rows, len, k, dev.index(), &plan), "qsa_topk (plan)");
  // Grid path: histograms and barrier counters start at zero on every call (a memset node under
  // graph capture). The cluster path (sm_90) needs no workspace: no allocation, no memset.
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = at::zeros({static_cast<int64_t>(plan.workspace_bytes)}, scores.options().dtype(at::kByte));
  }
  check_cuda(qgate::launch_qsa_topk(scores.data_ptr<float>(), rows, len, k, plan,
                                    plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                                    values.data_ptr<float>(), indices.data_ptr<int64_t>(),
                                    at::cuda::getCurrentCUDAStream()),
             "qsa_topk");
  return {values, indices};
}

}  // namespace

TORCH_LIBRARY_IMPL(qgate, CUDA, m) {
  m.impl("gemv", &gemv_cuda);
  m.impl("fused_hc", &fused_hc_cuda);
  m.impl("gdn_input", &gdn_input_cuda);
  m.impl("qsa_topk", &qsa_topk_cuda);
}
