// The routed GEMV site's per-call decision and count, in C++ (op qgate_plugin::gemv_site).
//
// The vLLM route plugin calls this for every batch-one projection of a routed layer. Checking x and
// counting the hit here instead of in Python keeps the plugin's cost over the op itself within ~2 us
// on the CPU (issue 28; `qgate bench ops --device cpu` measures it). What holds for the layer's whole
// life (the weight's dtype, shape, layout, device, and that a kernel takes it) the plugin checks once,
// when it wires the site.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace qgate {

// True when x is the batch-one row [1, K] the kernel takes as it is: the weight's dtype and device,
// dense, 16-byte aligned (the kernels' vector loads). Anything else keeps vLLM's path.
inline bool gemv_site_takes(const at::Tensor& weight, const at::Tensor& x) {
  return x.dim() == 2 && x.size(0) == 1 && x.size(1) == weight.size(1) &&
         x.scalar_type() == weight.scalar_type() && x.device() == weight.device() && x.is_contiguous() &&
         reinterpret_cast<std::uintptr_t>(x.data_ptr()) % 16 == 0;
}

// hits: int64 [1] on the CPU, the site's tally (qgate_kernels.attest.Tally.cell). A host-side count
// of Python-level calls: under CUDA graphs a capture counts once, a replay not at all.
inline void gemv_site_count(const at::Tensor& hits) { ++*hits.data_ptr<int64_t>(); }

}  // namespace qgate
