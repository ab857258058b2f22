"""check-runner: torch's kernels for every GPU it will use, nvcc of torch's CUDA major; the GPU query
and nvcc are stand-ins (scripts on PATH), torch's facts plain data (this machine's torch is a CPU build,
which the real command refuses in one line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qgate.runner_check import Gpu, gpus_from_smi, has_kernels, nvcc_release, problems

# What torch 2.13.0 (CUDA 13, vllm==0.32.0's pin) was built for: no sm_70; and a CUDA 12.x build with it.
CU13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
CU12 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
V100S = [Gpu(i, "Tesla V100-SXM2-32GB", (7, 0)) for i in range(4)]


def test_kernels_for_a_capability() -> None:
    assert has_kernels(CU12, (7, 0)) and not has_kernels(CU13, (7, 0))
    assert has_kernels(["sm_80"], (8, 6))  # a cubin runs on later minors of its major
    assert not has_kernels(["sm_86"], (8, 0)) and not has_kernels(["sm_90"], (10, 0))
    assert has_kernels(["compute_70"], (7, 5)) and not has_kernels(["compute_80"], (7, 5))  # PTX: JIT upward
    assert not has_kernels([], (7, 0))


def test_the_default_spec_on_a_v100_is_refused_in_one_line() -> None:
    found = problems("2.13.0+cu130", "13.0", CU13, V100S, "12.4")
    assert len(found) == 2
    assert found[0].startswith(
        "torch 2.13.0+cu130 (CUDA 13.0) has no kernels for GPU 0 Tesla V100-SXM2-32GB (sm_70)"
    )
    assert "set QGATE_VLLM_SPEC to a vLLM + torch build with kernels for sm_70" in found[0]
    assert found[1].startswith("nvcc is CUDA 12.4 but torch 2.13.0+cu130 was built with CUDA 13.0")
    assert all("\n" not in line for line in found)


def test_a_matching_runner_passes_and_each_fault_is_named() -> None:
    assert problems("2.8.0+cu128", "12.8", CU12, V100S, "12.4") == []
    assert "no nvcc on PATH: install the CUDA 12.x toolkit" in problems("2.8.0", "12.8", CU12, V100S, None)[0]
    assert "a CPU build" in problems("2.13.0+cpu", None, [], V100S, "12.4")[0]
    assert "lists no GPU" in problems("2.8.0", "12.8", CU12, [], "12.4")[0]
    mixed = [*V100S[:1], Gpu(1, "H100", (9, 0))]
    assert "GPU 0" in problems("2.13.0", "13.0", CU13, mixed, "13.0")[0]
    assert "GPU 1" not in problems("2.13.0", "13.0", CU13, mixed, "13.0")[0]


def test_gpu_query_and_nvcc_parsing() -> None:
    smi = "0, Tesla V100-SXM2-32GB, 7.0\n1, Tesla V100-SXM2-32GB, 7.0\n2, NVIDIA H100 80GB HBM3, 9.0\n"
    assert [g.sm for g in gpus_from_smi(smi)] == ["sm_70", "sm_70", "sm_90"]
    assert [g.index for g in gpus_from_smi(smi, "2")] == [2]  # only the GPUs it will use
    with pytest.raises(ValueError, match="cannot read the line"):
        gpus_from_smi("0, GPU, [N/A]")
    out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\n"
    assert nvcc_release(out) == "12.4" and nvcc_release("nothing") is None


def _standins(tmp_path: Path, smi: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", smi), ("nvcc", "Cuda compilation tools, release 12.4, V12.4.131")):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\n")
        path.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_the_command_with_a_stand_in_gpu_query(tmp_path: Path) -> None:
    env = _standins(tmp_path, "0, Tesla V100-SXM2-32GB, 7.0")
    proc = subprocess.run(
        [sys.executable, "-m", "qgate", "check-runner"], capture_output=True, text=True, env=env, timeout=300
    )
    # This machine's torch is the CPU build: refused in one line that says what to install.
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "a CPU build (no CUDA)" in lines[0] and "QGATE_VLLM_SPEC" in lines[0]
    assert "sm_70" in lines[0]
