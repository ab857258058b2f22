// The one declaration of the qgate::* op schemas, and the Python module that loads them.
//
// CPU kernels are C++ in cpu/ where there is one (TORCH_LIBRARY_IMPL(qgate, CPU)), else the pure-torch
// references, registered from Python (qgate_kernels/ops.py); CUDA kernels are registered in
// ops_cuda.cpp when the extension is built with CUDA.
// qgate_kernels/_library.py holds the same strings for installs without this extension; a test
// checks that they agree.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(qgate, m) {
  m.def("gemv(Tensor weight, Tensor x, bool static_weight=False) -> Tensor");
  m.def(
      "hc_mix(Tensor h, Tensor norm_weight, Tensor w_down, Tensor w_up, int hc_count, int lora_rank, "
      "float eps) -> (Tensor, Tensor)");
  m.def(
      "hc_combine_mix(Tensor h, Tensor block_output, Tensor? injection, Tensor norm_weight, Tensor w_down, "
      "Tensor w_up, int hc_count, int lora_rank, float eps) -> (Tensor, Tensor, Tensor)");
  m.def(
      "gdn_input(Tensor x, Tensor w_qkvz, Tensor w_ba, int num_k_heads, int num_v_heads, "
      "int head_k_dim, int head_v_dim, bool interleaved, bool static_weight=False) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("qsa_topk(Tensor logits, Tensor visible_blocks, int k, Tensor(a!) block_indices) -> ()");
}

// The route plugin's own entries, not route ops: no reference, no Python declaration (a pure-Python
// install has none and the plugin takes its checked Python path). gemv_site: csrc/gemv_site.h.
TORCH_LIBRARY(qgate_plugin, m) { m.def("gemv_site(Tensor weight, Tensor x, Tensor(a!) hits) -> Tensor"); }

// Importing qgate_kernels._C runs the static registrations above; WITH_CUDA says whether the CUDA
// kernels were compiled in.
static struct PyModuleDef qgate_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&qgate_module);
  if (module == nullptr) return nullptr;
#ifdef QGATE_WITH_CUDA
  PyModule_AddIntConstant(module, "WITH_CUDA", 1);
#else
  PyModule_AddIntConstant(module, "WITH_CUDA", 0);
#endif
  return module;
}
