// CPU kernels of qgate::hc_mix and qgate::hc_combine_mix (schemas in ../ops_def.cpp): Qwen4Exp's
// GatedResidual mix (and its pending combine) token by token, with the two projections on the row-dot
// engine (row_dot.h) and the element-wise steps fused around them, rounding to the activation dtype
// where qgate_kernels/reference.py does (which is where vLLM's kernels do):
//   [combine: h'_s = round(fma(block_output, 2 sigmoid(injection_s / HC), h_s)), or round(h_s + bo)]
//   xn    = round(fma(y, w, y)), y = h_s rsqrt(sum(h_s^2) / HS + eps)     per stream s
//   down  = round(xn w_down^T)                 row-dot engine, float32 sums
//   lora  = round(silu(down[:R] / HC))
//   gate  = round(lora w_up^T)                 row-dot engine
//   block_input = round((sum_s fma(sigmoid(gate_s), xn_s, acc)) / HC)   streams in order
//   injection   = down[R : R + HC]             (none for the final mixer, w_down [R, D])
// Sums of squares (double here, float32 in the reference), exp and rsqrt differ from torch's by float32
// roundings, so results agree with the reference within a few ULP of the output dtype (tested).
// Tensors must be fp16 or bf16, one dtype; any T (tokens are independent).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "row_dot.h"

namespace {

using qgate::cpu::Elem;

constexpr int64_t kMinMixElems = 4096;  // gate mix: elements per task

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

struct Hc {
  int64_t d, hs, hc, r, rows;
  bool combine;  // w_down is the merged [R + HC + pad, D] weight
  bool per_stream_norm;
  float eps;
};

Hc check_args(const at::Tensor& h, const at::Tensor& norm_weight, const at::Tensor& w_down, const at::Tensor& w_up,
              int64_t hc_count, int64_t lora_rank, double eps, const char* op) {
  TORCH_CHECK(h.device().is_cpu() && norm_weight.device().is_cpu() && w_down.device().is_cpu() &&
                  w_up.device().is_cpu(),
              op, " (CPU): tensors must be on the CPU");
  TORCH_CHECK(hc_count >= 1 && lora_rank >= 1 && h.dim() == 2 && h.size(1) % hc_count == 0, op, ": h ", h.sizes(),
              " with hc_count=", hc_count, ", lora_rank=", lora_rank, " do not fit");
  const int64_t d = h.size(1);
  const int64_t hs = d / hc_count;
  const int64_t merged = lora_rank + hc_count + ((-(lora_rank + hc_count)) % 16 + 16) % 16;
  TORCH_CHECK(w_down.dim() == 2 && w_down.size(1) == d && (w_down.size(0) == merged || w_down.size(0) == lora_rank),
              op, ": w_down must be [", merged, ", ", d, "] or [", lora_rank, ", ", d, "], got ", w_down.sizes());
  TORCH_CHECK(w_up.dim() == 2 && w_up.size(0) == d && w_up.size(1) == lora_rank, op, ": w_up must be [", d, ", ",
              lora_rank, "], got ", w_up.sizes());
  TORCH_CHECK(norm_weight.dim() == 1 && (norm_weight.numel() == hs || norm_weight.numel() == d), op,
              ": norm_weight must be [", hs, "] or [", d, "], got ", norm_weight.sizes());
  const auto dt = h.scalar_type();
  TORCH_CHECK(dt == at::kHalf || dt == at::kBFloat16, op, " (CPU): fp16 or bf16 tensors, got ", dt,
              " (qgate_kernels.reference has the math for other dtypes)");
  for (const at::Tensor* t : {&norm_weight, &w_down, &w_up}) {
    TORCH_CHECK(t->scalar_type() == dt, op, " (CPU): every tensor must be ", dt, ", got ", t->scalar_type());
  }
  const bool combine = w_down.size(0) == merged && merged != lora_rank;
  return {d, hs, hc_count, lora_rank, w_down.size(0), combine, norm_weight.numel() == d, static_cast<float>(eps)};
}

template <typename T>
struct Token {
  const Hc& p;
  const T* norm_w;
  const uint16_t* w_down;
  const uint16_t* w_up;
  Elem elem;
  qgate::cpu::Isa isa;
  std::vector<float> xn, down, lora, gate;  // float32 copies of the rounded intermediates

  Token(const Hc& p_, const at::Tensor& nw, const at::Tensor& wd, const at::Tensor& wu)
      : p(p_),
        norm_w(nw.data_ptr<T>()),
        w_down(static_cast<const uint16_t*>(wd.data_ptr())),
        w_up(static_cast<const uint16_t*>(wu.data_ptr())),
        elem(std::is_same_v<T, at::Half> ? Elem::kHalf : Elem::kBFloat16),
        isa(qgate::cpu::best_isa()),
        xn(qgate::cpu::padded(p_.d)),
        down(p_.rows),
        lora(qgate::cpu::padded(p_.r)),
        gate(p_.d) {}

  static float rnd(float v) { return static_cast<float>(T(v)); }

  // xn = grouped Gemma RMSNorm of the streams h (already rounded to T)
  void norm(const T* h) {
    for (int64_t s = 0; s < p.hc; ++s) {
      const T* g = h + s * p.hs;
      double ss = 0.0;
      for (int64_t j = 0; j < p.hs; ++j) ss += static_cast<double>(static_cast<float>(g[j])) * static_cast<float>(g[j]);
      const float rrms = 1.0f / std::sqrt(static_cast<float>(ss) / static_cast<float>(p.hs) + p.eps);
      const T* w = norm_w + (p.per_stream_norm ? s * p.hs : 0);
      for (int64_t j = 0; j < p.hs; ++j) {
        const float y = static_cast<float>(g[j]) * rrms;
        xn[s * p.hs + j] = rnd(std::fma(y, static_cast<float>(w[j]), y));
      }
    }
    std::fill(xn.begin() + p.d, xn.end(), 0.0f);
  }

  void project(const uint16_t* w, int64_t rows, int64_t k, const float* x, float* y) {
    at::parallel_for(0, rows, qgate::cpu::row_grain(k, 2, qgate::cpu::kMinTaskBytes), [&](int64_t b, int64_t e) {
      qgate::cpu::rows_dot(isa, elem, w + b * k, k, e - b, k, x, y + b);
      for (int64_t i = b; i < e; ++i) y[i] = rnd(y[i]);
    });
  }

  // From xn to (block_input, injection) of one token.
  void tail(T* block_input, T* injection) {
    project(w_down, p.rows, p.d, xn.data(), down.data());
    for (int64_t i = 0; i < p.r; ++i) {
      const float v = down[i] / static_cast<float>(p.hc);
      lora[i] = rnd(v * sigmoid(v));
    }
    std::fill(lora.begin() + p.r, lora.end(), 0.0f);
    project(w_up, p.d, p.r, lora.data(), gate.data());
    at::parallel_for(0, p.hs, kMinMixElems, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        float acc = 0.0f;
        for (int64_t s = 0; s < p.hc; ++s) acc = std::fma(sigmoid(gate[s * p.hs + j]), xn[s * p.hs + j], acc);
        block_input[j] = T(acc / static_cast<float>(p.hc));
      }
    });
    if (p.combine) {
      for (int64_t s = 0; s < p.hc; ++s) injection[s] = T(down[p.r + s]);
    }
  }
};

template <typename T>
std::tuple<at::Tensor, at::Tensor> mix_impl(const Hc& p, const at::Tensor& h, const at::Tensor& nw,
                                            const at::Tensor& wd, const at::Tensor& wu) {
  const int64_t t = h.size(0);
  at::Tensor block_input = at::empty({t, p.hs}, h.options());
  at::Tensor injection = at::empty({t, p.combine ? p.hc : 0}, h.options());
  Token<T> tok(p, nw, wd, wu);
  for (int64_t i = 0; i < t; ++i) {
    tok.norm(h.data_ptr<T>() + i * p.d);
    tok.tail(block_input.data_ptr<T>() + i * p.hs, injection.data_ptr<T>() + i * injection.size(1));
  }
  return {block_input, injection};
}

std::tuple<at::Tensor, at::Tensor> hc_mix_cpu(const at::Tensor& h, const at::Tensor& norm_weight,
                                              const at::Tensor& w_down, const at::Tensor& w_up, int64_t hc_count,
                                              int64_t lora_rank, double eps) {
  const Hc p = check_args(h, norm_weight, w_down, w_up, hc_count, lora_rank, eps, "qgate::hc_mix");
  const at::Tensor hc = h.contiguous(), nw = norm_weight.contiguous(), wd = w_down.contiguous(),
                   wu = w_up.contiguous();
  if (h.scalar_type() == at::kHalf) return mix_impl<at::Half>(p, hc, nw, wd, wu);
  return mix_impl<at::BFloat16>(p, hc, nw, wd, wu);
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> combine_mix_impl(const Hc& p, const at::Tensor& h,
                                                                const at::Tensor& block_output,
                                                                const std::optional<at::Tensor>& injection,
                                                                const at::Tensor& nw, const at::Tensor& wd,
                                                                const at::Tensor& wu) {
  const int64_t t = h.size(0);
  at::Tensor h_new = at::empty({t, p.d}, h.options());
  at::Tensor block_input = at::empty({t, p.hs}, h.options());
  at::Tensor inj_out = at::empty({t, p.combine ? p.hc : 0}, h.options());
  Token<T> tok(p, nw, wd, wu);
  for (int64_t i = 0; i < t; ++i) {
    const T* hr = h.data_ptr<T>() + i * p.d;
    const T* bo = block_output.data_ptr<T>() + i * p.hs;
    T* hn = h_new.data_ptr<T>() + i * p.d;
    for (int64_t s = 0; s < p.hc; ++s) {
      if (injection.has_value()) {
        const float c = 2.0f * sigmoid(static_cast<float>(injection->data_ptr<T>()[i * p.hc + s]) /
                                       static_cast<float>(p.hc));
        for (int64_t j = 0; j < p.hs; ++j) {
          hn[s * p.hs + j] = T(std::fma(static_cast<float>(bo[j]), c, static_cast<float>(hr[s * p.hs + j])));
        }
      } else {
        for (int64_t j = 0; j < p.hs; ++j) {
          hn[s * p.hs + j] = T(static_cast<float>(hr[s * p.hs + j]) + static_cast<float>(bo[j]));
        }
      }
    }
    tok.norm(hn);
    tok.tail(block_input.data_ptr<T>() + i * p.hs, inj_out.data_ptr<T>() + i * inj_out.size(1));
  }
  return {h_new, block_input, inj_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> hc_combine_mix_cpu(
    const at::Tensor& h, const at::Tensor& block_output, const std::optional<at::Tensor>& injection,
    const at::Tensor& norm_weight, const at::Tensor& w_down, const at::Tensor& w_up, int64_t hc_count,
    int64_t lora_rank, double eps) {
  const char* op = "qgate::hc_combine_mix";
  const Hc p = check_args(h, norm_weight, w_down, w_up, hc_count, lora_rank, eps, op);
  const int64_t t = h.size(0);
  TORCH_CHECK(block_output.dim() == 2 && block_output.size(0) == t && block_output.size(1) == p.hs, op,
              ": block_output must be [", t, ", ", p.hs, "], got ", block_output.sizes());
  TORCH_CHECK(block_output.scalar_type() == h.scalar_type(), op, " (CPU): block_output must be ", h.scalar_type());
  std::optional<at::Tensor> inj;
  if (injection.has_value()) {
    TORCH_CHECK(injection->dim() == 2 && injection->size(0) == t && injection->size(1) == p.hc, op,
                ": injection must be [", t, ", ", p.hc, "] or None, got ", injection->sizes());
    TORCH_CHECK(injection->scalar_type() == h.scalar_type(), op, " (CPU): injection must be ", h.scalar_type());
    inj = injection->contiguous();
  }
  const at::Tensor hc = h.contiguous(), bo = block_output.contiguous(), nw = norm_weight.contiguous(),
                   wd = w_down.contiguous(), wu = w_up.contiguous();
  if (h.scalar_type() == at::kHalf) return combine_mix_impl<at::Half>(p, hc, bo, inj, nw, wd, wu);
  return combine_mix_impl<at::BFloat16>(p, hc, bo, inj, nw, wd, wu);
}

}  // namespace

TORCH_LIBRARY_IMPL(qgate, CPU, m) {
  m.impl("hc_mix", &hc_mix_cpu);
  m.impl("hc_combine_mix", &hc_combine_mix_cpu);
}
