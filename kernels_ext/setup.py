"""Build of qgate_kernels: the reference ops everywhere, the CUDA kernels where nvcc and a CUDA torch exist.

QGATE_KERNELS_CUDA=auto (default) builds the CUDA kernels when torch has CUDA and nvcc is found,
1 requires them (the build fails otherwise), 0 skips them. TORCH_CUDA_ARCH_LIST picks the targets
(7.0 for V100 with CUDA 12.x, 9.0 for H100/H200). Without torch at build time (pip's isolated
build) the package installs pure-Python and declares the op schemas from Python; install with
`pip install --no-build-isolation -e kernels_ext` to get the compiled extension.

CPU_SOURCES (the C++ CPU kernels) are built in both cases. They need no -m flags: their AVX2/F16C/FMA
and AVX-512 paths are compiled with function target attributes and picked at run time from what the
CPU reports (csrc/cpu/row_dot.h), with a scalar path for other CPUs and compilers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
CUDA_SOURCES = [
    "csrc/gemv.cu",
    "csrc/fused_hc.cu",
    "csrc/gdn_input.cu",
    "csrc/qsa_topk.cu",
    "csrc/ops_cuda.cpp",
]
CPU_SOURCES = [
    "csrc/cpu/row_dot.cpp",
    "csrc/cpu/gemv_cpu.cpp",
    "csrc/cpu/gdn_input_cpu.cpp",
    "csrc/cpu/hc_cpu.cpp",
]


def _shared_libstdcxx() -> list[str]:
    """The libstdc++ this process (with torch imported) runs on, named on the link line by its path.

    Some images' compilers (the H200 image's /opt/gcc/bin/g++, Python's configured CXX there) link
    libstdc++ statically into a shared object: _C.so then carried its own copy (std::locale::id,
    the facet ids, ostream::_M_insert<long>) beside the process's libstdc++.so.6, and the first
    TORCH_CHECK message that formatted an integer crashed in it (test_cpu_kernels.py). Naming the
    shared library before the driver's implicit -lstdc++ resolves every std symbol to it (NEEDED
    libstdc++.so.6, as torch's own libraries have); the static archive then supplies nothing.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            found = {line.split()[-1] for line in maps if "/libstdc++.so" in line}
    except OSError:
        return []
    return sorted(found)[:1]


def _extensions() -> dict:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return {}
    want = os.environ.get("QGATE_KERNELS_CUDA", "auto")
    have_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if want == "1" and not have_cuda:
        raise RuntimeError("QGATE_KERNELS_CUDA=1 but torch has no CUDA or nvcc was not found (CUDA_HOME)")
    # No -std flag: BuildExtension picks the C++ standard that this torch's headers need.
    cxx = ["-O3"]
    # at::parallel_for is an inline `#pragma omp parallel` in torch's headers: without -fopenmp the CPU
    # kernels (csrc/cpu) run on one thread. Linux wheels of torch ship libgomp.so.1, which the
    # extension then shares (same soname, same thread pool, torch.set_num_threads applies).
    link = ["-fopenmp"] if sys.platform.startswith("linux") else []
    cxx += link
    link += _shared_libstdcxx()
    if have_cuda and want != "0":
        nvcc = ["-O3", "-lineinfo"]
        ext = cpp_extension.CUDAExtension(
            "qgate_kernels._C",
            ["csrc/ops_def.cpp", *CPU_SOURCES, *CUDA_SOURCES],
            define_macros=[("QGATE_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            extra_link_args=link,
        )
    else:
        ext = cpp_extension.CppExtension(
            "qgate_kernels._C",
            ["csrc/ops_def.cpp", *CPU_SOURCES],
            extra_compile_args=cxx,
            extra_link_args=link,
        )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": cpp_extension.BuildExtension}}


setup(**_extensions())
