// CUDA kernels of the qgate::* ops (schemas in ops_def.cpp). Caller errors are TORCH_CHECKs with the
// offending shape or dtype; every launch's cudaError_t is checked. The Python wrappers
// (qgate_kernels/ops.py) only call these for inputs they support and run the reference otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "gemv_site.h"
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

// The activation dtype of the GEMV, HC and GDN kernels: fp16 or bf16, the same for every tensor.
bool is_bf16(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, "expected fp16 or bf16, got ",
              t.scalar_type());
  return t.scalar_type() == at::kBFloat16;
}

at::Tensor gemv_cuda(const at::Tensor& weight, const at::Tensor& x, bool static_weight) {
  const at::Device dev = weight.device();
  const bool bf16 = is_bf16(weight);
  check_dense(weight, "weight", weight.scalar_type(), dev);
  check_dense(x, "x", weight.scalar_type(), dev);
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
  check_cuda(qgate::launch_gemv(weight.data_ptr(), x.data_ptr(), y.data_ptr(), n, k, bf16, static_weight,
                                at::cuda::getCurrentCUDAStream()),
             "gemv");
  return y;
}

// The plugin's fast entry (csrc/gemv_site.h), with static weights as the plugin launches them.
at::Tensor gemv_site_cuda(const at::Tensor& weight, const at::Tensor& x, const at::Tensor& hits) {
  if (!qgate::gemv_site_takes(weight, x)) return at::Tensor();
  qgate::gemv_site_count(hits);
  return gemv_cuda(weight, x, true);
}

// Both HC ops: block_output undefined for hc_mix. Returns (h_out or undefined, block_input, injection).
std::tuple<at::Tensor, at::Tensor, at::Tensor> hc_common(const at::Tensor& h, const at::Tensor* block_output,
                                                         const std::optional<at::Tensor>& injection,
                                                         const at::Tensor& norm_weight, const at::Tensor& w_down,
                                                         const at::Tensor& w_up, int64_t hc, int64_t rank,
                                                         double eps) {
  const at::Device dev = h.device();
  const at::ScalarType dt = h.scalar_type();
  const bool bf16 = is_bf16(h);
  TORCH_CHECK(h.dim() == 2 && h.size(0) == 1, "h must be [1, D], got ", h.sizes());
  TORCH_CHECK(hc >= 1 && hc <= qgate::kHcMaxStreams && h.size(1) % hc == 0, "hc_count ", hc, " does not fit D ",
              h.size(1));
  const int64_t d = h.size(1);
  const int64_t hs = d / hc;
  TORCH_CHECK(hs % 8 == 0 && rank % 8 == 0 && rank >= 8 && rank <= qgate::kHcMaxRank,
              "HS and R must be multiples of 8, R <= ", qgate::kHcMaxRank, ", got ", hs, ", ", rank);
  check_dense(h, "h", dt, dev);
  check_dense(norm_weight, "norm_weight", dt, dev);
  check_dense(w_down, "w_down", dt, dev);
  check_dense(w_up, "w_up", dt, dev);
  TORCH_CHECK(norm_weight.numel() == hs || norm_weight.numel() == d, "norm_weight must be [HS] or [D]");
  const int64_t merged = rank + hc + (((-(rank + hc)) % 16) + 16) % 16;
  TORCH_CHECK(w_down.dim() == 2 && w_down.size(1) == d && (w_down.size(0) == merged || w_down.size(0) == rank),
              "w_down must be [", merged, ", D] or [", rank, ", D], got ", w_down.sizes());
  TORCH_CHECK(w_up.dim() == 2 && w_up.size(0) == d && w_up.size(1) == rank, "w_up must be [D, R], got ",
              w_up.sizes());
  const bool use_combine = w_down.size(0) == merged && merged != rank;
  if (block_output != nullptr) {
    check_dense(*block_output, "block_output", dt, dev);
    TORCH_CHECK(block_output->numel() == hs, "block_output must be [1, HS]");
    if (injection.has_value()) {
      check_dense(*injection, "injection", dt, dev);
      TORCH_CHECK(injection->numel() == hc, "injection must be [1, HC]");
    }
  }
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor h_out = block_output != nullptr ? at::empty({1, d}, h.options()) : at::Tensor();
  at::Tensor xn = at::empty({d}, h.options());
  at::Tensor lora_raw = at::empty({rank}, h.options());
  at::Tensor inj_out = at::empty({1, use_combine ? hc : 0}, h.options());
  at::Tensor block_input = at::empty({1, hs}, h.options());
  qgate::HcArgs args{};
  args.h = h.data_ptr();
  args.block_output = block_output != nullptr ? block_output->data_ptr() : nullptr;
  args.injection = block_output != nullptr && injection.has_value() ? injection->data_ptr() : nullptr;
  args.norm_weight = norm_weight.data_ptr();
  args.w_down = w_down.data_ptr();
  args.w_up = w_up.data_ptr();
  args.eps = static_cast<float>(eps);
  args.hc = static_cast<int>(hc);
  args.rank = static_cast<int>(rank);
  args.hs = hs;
  args.shared_norm_weight = norm_weight.numel() == hs && hs != d;
  args.use_combine = use_combine;
  args.bf16 = bf16;
  args.h_out = block_output != nullptr ? h_out.data_ptr() : nullptr;
  args.xn = xn.data_ptr();
  args.lora_raw = lora_raw.data_ptr();
  args.injection_out = use_combine ? inj_out.data_ptr() : nullptr;
  args.block_input = block_input.data_ptr();
  check_cuda(qgate::launch_hc(args, at::cuda::getCurrentCUDAStream()), "hc");
  return {h_out, block_input, inj_out};
}

std::tuple<at::Tensor, at::Tensor> hc_mix_cuda(const at::Tensor& h, const at::Tensor& norm_weight,
                                               const at::Tensor& w_down, const at::Tensor& w_up, int64_t hc,
                                               int64_t rank, double eps) {
  auto out = hc_common(h, nullptr, std::nullopt, norm_weight, w_down, w_up, hc, rank, eps);
  return {std::get<1>(out), std::get<2>(out)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> hc_combine_mix_cuda(
    const at::Tensor& h, const at::Tensor& block_output, const std::optional<at::Tensor>& injection,
    const at::Tensor& norm_weight, const at::Tensor& w_down, const at::Tensor& w_up, int64_t hc, int64_t rank,
    double eps) {
  return hc_common(h, &block_output, injection, norm_weight, w_down, w_up, hc, rank, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gdn_input_cuda(const at::Tensor& x, const at::Tensor& w_qkvz,
                                                                          const at::Tensor& w_ba, int64_t nk,
                                                                          int64_t nv, int64_t dk, int64_t dv,
                                                                          bool interleaved, bool static_weight) {
  const at::Device dev = x.device();
  const at::ScalarType dt = x.scalar_type();
  const bool bf16 = is_bf16(x);
  check_dense(x, "x", dt, dev);
  check_dense(w_qkvz, "w_qkvz", dt, dev);
  check_dense(w_ba, "w_ba", dt, dev);
  const int64_t hidden = x.size(-1);
  TORCH_CHECK(x.dim() == 1 || (x.dim() == 2 && x.size(0) == 1), "x must be [K] or [1, K], got ", x.sizes());
  TORCH_CHECK(hidden > 0 && hidden % 8 == 0, "K must be a positive multiple of 8, got ", hidden);
  TORCH_CHECK(nk > 0 && nv > 0 && dk > 0 && dv > 0 && (!interleaved || nv % nk == 0),
              "heads do not fit the layout: nk ", nk, ", nv ", nv);
  TORCH_CHECK(w_qkvz.dim() == 2 && w_qkvz.size(0) == 2 * nk * dk + 2 * nv * dv && w_qkvz.size(1) == hidden,
              "w_qkvz must be [2nk*dk + 2nv*dv, K], got ", w_qkvz.sizes());
  TORCH_CHECK(w_ba.dim() == 2 && w_ba.size(0) == 2 * nv && w_ba.size(1) == hidden, "w_ba must be [2nv, K], got ",
              w_ba.sizes());
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor mixed = at::empty({1, 2 * nk * dk + nv * dv}, x.options());
  at::Tensor z = at::empty({1, nv, dv}, x.options());
  at::Tensor b = at::empty({1, nv}, x.options());
  at::Tensor a = at::empty({1, nv}, x.options());
  qgate::GdnArgs args{x.data_ptr(), w_qkvz.data_ptr(), w_ba.data_ptr(), mixed.data_ptr(), z.data_ptr(),
                      b.data_ptr(), a.data_ptr(), hidden, static_cast<int>(nk), static_cast<int>(nv),
                      static_cast<int>(dk), static_cast<int>(dv), interleaved, bf16, static_weight};
  check_cuda(qgate::launch_gdn_input(args, at::cuda::getCurrentCUDAStream()), "gdn_input");
  return {mixed, z, b, a};
}

void qsa_topk_cuda(const at::Tensor& logits, const at::Tensor& visible_blocks, int64_t k,
                   const at::Tensor& block_indices) {
  const at::Device dev = logits.device();
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be [rows, L] float32 on CUDA with unit inner stride");
  const int64_t rows = logits.size(0);
  const int64_t len = logits.size(1);
  TORCH_CHECK(logits.stride(0) >= len, "logits row stride ", logits.stride(0), " < L ", len);
  TORCH_CHECK(visible_blocks.device() == dev && visible_blocks.scalar_type() == at::kInt &&
                  visible_blocks.is_contiguous() && visible_blocks.numel() == rows,
              "visible_blocks must be [rows] int32 on ", dev);
  TORCH_CHECK(block_indices.device() == dev && block_indices.scalar_type() == at::kInt &&
                  block_indices.is_contiguous() && block_indices.dim() == 2 && block_indices.size(0) == rows &&
                  block_indices.size(1) == k,
              "block_indices must be [rows, k] int32 contiguous on ", dev);
  TORCH_CHECK(k >= 1 && k <= qgate::kTopkMaxK, "k must be in [1, ", qgate::kTopkMaxK, "], got ", k);
  TORCH_CHECK(len >= 1 && len < (int64_t(1) << 31), "L must be in [1, 2^31), got ", len);
  if (rows == 0) return;
  const c10::cuda::CUDAGuard guard(dev);
  qgate::TopkPlan plan{};
  check_cuda(qgate::plan_qsa_topk(rows, len, k, dev.index(), &plan), "qsa_topk (plan)");
  // Grid path: histograms and barrier counters start at zero on every call (a memset node under
  // graph capture). The cluster path (sm_90) needs no workspace: no allocation, no memset.
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = at::zeros({static_cast<int64_t>(plan.workspace_bytes)}, logits.options().dtype(at::kByte));
  }
  const qgate::TopkRows in{logits.data_ptr<float>(), logits.stride(0), len, visible_blocks.data_ptr<int>()};
  check_cuda(qgate::launch_qsa_topk(in, rows, k, plan, plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                                    block_indices.data_ptr<int>(), at::cuda::getCurrentCUDAStream()),
             "qsa_topk");
}

}  // namespace

TORCH_LIBRARY_IMPL(qgate, CUDA, m) {
  m.impl("gemv", &gemv_cuda);
  m.impl("hc_mix", &hc_mix_cuda);
  m.impl("hc_combine_mix", &hc_combine_mix_cuda);
  m.impl("gdn_input", &gdn_input_cuda);
  m.impl("qsa_topk", &qsa_topk_cuda);
}

TORCH_LIBRARY_IMPL(qgate_plugin, CUDA, m) { m.impl("gemv_site", &gemv_site_cuda); }
