"""Build vLLM's own QSA top-k kernel standalone where vLLM's compiled `_C` is not installed (the
H200 image), so that `qgate bench ops` times it beside the route.

On Hopper, vLLM 0.32's Qwen4Exp indexer (`_topk` in models/qwen4_exp/nvidia/ops/qsa_indexer.py)
runs `torch.ops._C.cooperative_topk` for batches of <= 64 rows (persistent_topk only past that), so
a decode step's top-k is cooperative_topk. This tool compiles vLLM 0.32's kernels from its csrc,
unmodified (cooperative_topk.cuh and topk_histogram_4096.cuh, included from VLLM_CSRC), with
tools/vllm_coop_topk_launch.cu (the host side of vLLM's csrc/cooperative_topk.cu, which it repeats:
the pinned sha256 below makes sure the source's host side is the one it repeats), and writes
DEST/vllm/_C.py: a stand-in for vLLM's `_C` that registers `torch.ops._C.cooperative_topk` with
vLLM's schema over that library. With DEST on PYTHONPATH, harness/qgate/ops/competitors.py calls
the op as vLLM does. Prints one JSON object: the sha256 of each vLLM file used, the library, and
with --check, agreement of its selected sets with the reference on the bench's shapes.

Usage (CUDA GPU with nvcc; VLLM_CSRC = the csrc folder of vLLM 0.32's sdist, vllm-0.32.0.tar.gz,
sha256 d2c957d5...):
    python kernels_ext/tools/vllm_topk_build.py VLLM_CSRC DEST [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL_FILES = ["cooperative_topk.cuh", "topk_histogram_4096.cuh"]
# vLLM 0.32.0's csrc/cooperative_topk.cu: the host code vllm_coop_topk_launch.cu repeats.
HOST_FILE = "cooperative_topk.cu"
HOST_SHA256 = "9224b4e281ff5ab91e56701d716f2525799a5e4deb41aa4dff20499dd7daec33"

STAND_IN = '''"""Stand-in for vLLM's compiled _C, written by qgate's kernels_ext/tools/vllm_topk_build.py:
registers torch.ops._C.cooperative_topk (vLLM's schema) over vLLM 0.32's cooperative_topk kernels
built standalone. SOURCE_SHA256 names the vLLM files they were built from."""

import ctypes
import json
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
SOURCE_SHA256 = json.loads((_HERE / "_vllm_topk_source.json").read_text())
_lib = ctypes.CDLL(str(_HERE / "_vllm_coop_topk.so"))
_launch = _lib.vllm_cooperative_topk
_launch.restype = ctypes.c_int
_launch.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4 + [ctypes.c_void_p]

_ops = torch.library.Library("_C", "FRAGMENT")
_ops.define(
    "cooperative_topk(Tensor logits, Tensor lengths, Tensor(a!) output, Tensor workspace, int k, "
    "int max_seq_len) -> ()"
)


def _cooperative_topk(logits, lengths, output, workspace, k, max_seq_len):
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise RuntimeError("cooperative_topk: logits must be float32 [rows, L] with unit column stride")
    if lengths.dtype != torch.int32 or not lengths.is_contiguous() or lengths.numel() != logits.shape[0]:
        raise RuntimeError("cooperative_topk: lengths must be contiguous int32 [rows]")
    if output.dtype != torch.int32 or tuple(output.shape) != (logits.shape[0], k):
        raise RuntimeError("cooperative_topk: output must be int32 [rows, k]")
    if not output.is_contiguous():
        raise RuntimeError("cooperative_topk: output must be contiguous int32 [rows, k]")
    if workspace.dtype != torch.uint8:
        raise RuntimeError("cooperative_topk: workspace must be uint8")
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    rc = _launch(
        logits.data_ptr(), lengths.data_ptr(), output.data_ptr(), workspace.data_ptr(),
        workspace.numel(), logits.shape[0], logits.stride(0), k, stream,
    )
    if rc != 0:
        raise RuntimeError(f"cooperative_topk: launcher returned {rc}")


_ops.impl("cooperative_topk", _cooperative_topk, "CUDA")
'''


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(csrc: Path, dest: Path) -> dict:
    missing = [f for f in [HOST_FILE, *KERNEL_FILES] if not (csrc / f).is_file()]
    if missing:
        print(f"vllm_topk_build: {csrc / missing[0]} not found (need vLLM 0.32's csrc)", file=sys.stderr)
        raise SystemExit(2)
    host = sha256(csrc / HOST_FILE)
    if host != HOST_SHA256:
        print(
            f"vllm_topk_build: {csrc / HOST_FILE} sha256 {host[:16]}... is not vLLM 0.32.0's "
            f"({HOST_SHA256[:16]}...): its host side may differ from the one the launcher repeats",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}{'a' if major >= 9 else ''}"
    pkg = dest / "vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").touch(exist_ok=True)
    lib = pkg / "_vllm_coop_topk.so"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, "-std=c++17", "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
           "-I", str(csrc), "-o", str(lib), str(HERE / "vllm_coop_topk_launch.cu")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"vllm_topk_build: nvcc failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(1)
    source = {"vllm": "0.32.0", "csrc": {f: sha256(csrc / f) for f in [HOST_FILE, *KERNEL_FILES]}}
    (pkg / "_vllm_topk_source.json").write_text(json.dumps(source, indent=1) + "\n")
    (pkg / "_C.py").write_text(STAND_IN)
    return {"library": str(lib), "arch": arch, "source": source}


def check(dest: Path) -> dict:
    """The set vLLM's kernel selects against the reference's (the bench's shapes, every input kind):
    vLLM returns the k indices unordered, so sets are compared; a set may differ only where values
    tie at the k-th (vLLM breaks such ties its own way) or where NaN is involved."""
    sys.path.insert(0, str(dest))
    import torch
    import vllm._C  # noqa: F401  (registers torch.ops._C.cooperative_topk)

    from qgate.ops.cases import topk_case
    from qgate_kernels import reference

    gen = torch.Generator(device="cuda")
    gen.manual_seed(27)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    out: dict[str, list[str]] = {}
    for rows, length, k, vis in [(1, 65536, 512, None), (1, 4096, 512, None), (1, 65536, 512, 513),
                                 (1, 131072, 2048, None), (4, 65536, 512, None)]:  # fmt: skip
        case = topk_case(rows, length, k, vis)
        label = f"{rows}x{length}x{k}" + (f" vis {vis}" if vis else "")
        for _ in range(5):
            s, v, kk = case.make(gen, torch.device("cuda"))
            got = torch.empty(rows, kk, dtype=torch.int32, device="cuda")
            torch.ops._C.cooperative_topk(s, v, got, ws, kk, s.shape[1])
            want = reference.qsa_topk(s, v, kk)
            kind = case.meta["input_kind"](s, v, kk)
            same = all(set(got[r].tolist()) == set(want[r].tolist()) for r in range(rows))
            out.setdefault(label, []).append(f"{kind}:{'same set' if same else 'differs'}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csrc", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    result = build(a.csrc, a.dest)
    if a.check:
        result["agreement"] = check(a.dest)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
