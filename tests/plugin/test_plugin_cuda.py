"""The route plugin on a CUDA GPU (issue 46): skipped with a reason where there is no CUDA GPU, no CUDA
build of kernels_ext, or no vLLM (the CPU test machine skips it all; helper 46b runs it on the H200).

- Without vLLM: a routed GEMV site (plugin.standalone_linear, the site vLLM's linear layers get)
  captured into a real `torch.cuda.CUDAGraph` counts one execution per replay, captures apart
  (qgate_kernels.graphs), and the replays compute the linear.
- In vLLM 0.32's CUDA engine on the tiny Qwen4Exp, CUDA graphs on (vLLM's default for Qwen4Exp:
  breakable graphs, no torch.compile), the two engine shims in every arm (qwen4exp_hc_params_fp16,
  gdn_prefill_triton_fallback; no `gdn_prefill_backend` engine arg, so the shim is what keeps FlashInfer
  away): an fp16 control starts and decodes (stock vLLM 0.32 dies in its profile run), the shims are
  recorded with calls; fp16 and bf16 candidates with every route on have hits at every role, the calls
  captured into graphs counted apart, and every role executed at least once per decode step.
Three engine starts (one per arm, module fixtures): ~1-2.5 min each on the H200 (the first compiles
Triton and CuTe kernels).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, engine_outcome

torch = pytest.importorskip("torch")

import qgate_route_env as route_env  # noqa: E402
from qgate import routes  # noqa: E402
from qgate.engine import preflight  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _cuda_build() -> bool:
    from qgate_kernels import _library

    return bool(_library.EXTENSION_HAS_CUDA)


needs_cuda_build = pytest.mark.skipif(
    not torch.cuda.is_available() or not _cuda_build(), reason="needs kernels_ext built with its CUDA kernels"
)
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (CUDA build)")

GEMV = "fp16_gemv"


@pytest.fixture
def plugin_alone(monkeypatch: pytest.MonkeyPatch) -> object:
    from qgate_kernels import ops, plugin, registry

    monkeypatch.setattr(registry, "STATE", None)
    ops.reset_fallback_counts()
    return plugin


@needs_cuda_build
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_routed_call_in_a_cuda_graph_counts_every_replay(plugin_alone: object, dtype: str) -> None:
    from qgate_kernels import registry

    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(256, 512, generator=gen, device="cuda") * 0.05).to(dt)  # [N, K]
    x = torch.randn(1, 512, generator=gen, device="cuda").to(dt)  # [1, K]
    call, tally = plugin_alone.standalone_linear(w)  # type: ignore[attr-defined]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up torch.cuda.graph asks for: one eager execution
        call(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call(x)
    replays = 7
    for i in range(replays):
        x.copy_(torch.randn(1, 512, generator=gen, device="cuda").to(dt))
        graph.replay()
        torch.cuda.synchronize()
        want = torch.nn.functional.linear(x.float(), w.float())
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2, msg=f"replay {i}")
    counts = registry.STATE.recorder.counters.routes([GEMV])[GEMV]  # type: ignore[union-attr]
    assert tally.n == 2  # Python-level calls: the warm-up and the capture
    assert counts["captures"] == {"standalone": 1}
    assert counts["hits"] == 1 + replays and counts["roles"] == {"standalone": 1 + replays}
    assert counts["fallbacks"] == {}


# --- the CUDA engine --------------------------------------------------------------------------------

SW = {
    "gemv": "VLLM_SM70_QWEN38_FP16_GEMV",
    "hc": "VLLM_SM70_QWEN38_FUSED_HC_FP16",
    "gdn": "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16",
}
ENGINE_SHIMS = [route_env.SHIM_HC_PARAMS_FP16, route_env.SHIM_GDN_PREFILL_TRITON]
OUTPUT_TOKENS = 64
PROMPT = 32

RUNNER = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, out, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = LLM(model=model, dtype=dtype, max_model_len=512, max_num_seqs=1, enforce_eager=False,
              gpu_memory_utilization=0.3, seed=0)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    (res,) = llm.generate([{"prompt_token_ids": list(range(40, 40 + PROMPT))}], params, use_tqdm=False)
    with open(out, "w") as fh:
        json.dump({"token_ids": list(res.outputs[0].token_ids)}, fh)
    from qgate.engine.child import exit_without_finalizing  # as the engine child: atexit, no teardown
    exit_without_finalizing(0)
""".replace("MAX_TOKENS", str(OUTPUT_TOKENS)).replace("PROMPT", str(PROMPT))


def _run(tmp: Path, env: dict[str, str], dtype: str) -> dict:
    from qgate.tiny.qwen4exp import ensure_tiny_qwen4exp

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "runner.py").write_text(RUNNER)
    attest_dir = tmp / "attest"
    attest_dir.mkdir()
    arm = env | route_env.platform_env(ENGINE_SHIMS, {})
    # This checkout's harness and plugin ahead of the rest; the caller's PYTHONPATH kept (the staged
    # vLLM of the GPU kit is found through it).
    here = [str(REPO / d) for d in ("harness", "route_env", "kernels_ext")]
    path = os.pathsep.join([*here, os.environ.get("PYTHONPATH", "")])
    full = preflight.engine_env(arm) | {route_env.ATTEST_DIR_ENV: str(attest_dir), "PYTHONPATH": path}
    out = tmp / "out.json"
    args = [sys.executable, "runner.py", str(ensure_tiny_qwen4exp()), str(out), dtype]
    proc = subprocess.run(args, cwd=tmp, env=full, capture_output=True, text=True, timeout=1500)
    (tmp / "engine.log").write_text(proc.stdout + proc.stderr)
    return engine_outcome(proc, out, attest_dir, arm)


@pytest.fixture(scope="module")
def control_fp16(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("cuda-control-fp16"), {v: "0" for v in SW.values()}, "float16")


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def candidate(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp(f"cuda-candidate-{request.param}")
    return _run(tmp, {v: "1" for v in SW.values()}, request.param) | {"dtype": request.param}


@needs_vllm
def test_the_fp16_control_starts_with_the_engine_shims(control_fp16: dict) -> None:
    assert control_fp16["returncode"] == 0, control_fp16["log"][-4000:]
    assert len(control_fp16["tokens"]) == OUTPUT_TOKENS
    assert all(c["hits"] == 0 for c in control_fp16["routes"].values())  # shims only, no route
    shims = control_fp16["shims"]
    assert set(shims) == set(ENGINE_SHIMS), shims
    # the HC parameters took fp16: one call per GatedResidual module built (2 layers x 2 + the final)
    assert shims[route_env.SHIM_HC_PARAMS_FP16]["calls"] > 0, shims
    if importlib.util.find_spec("flashinfer") is None:
        # vLLM chose FlashInfer GDN prefill; the shim turned it into Triton (each resolver call counted)
        assert shims[route_env.SHIM_GDN_PREFILL_TRITON]["calls"] > 0, shims
        assert "Using Triton/FLA GDN prefill" in control_fp16["log"]  # the shim's one line


@needs_vllm
@needs_cuda_build
def test_every_route_runs_under_cuda_graphs_counted_per_replay(control_fp16: dict, candidate: dict) -> None:
    assert candidate["returncode"] == 0, candidate["log"][-4000:]
    assert len(candidate["tokens"]) == OUTPUT_TOKENS
    for route in ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16"):
        counts = candidate["routes"][route]
        assert counts["hits"] > 0, (candidate["dtype"], route, counts)
        # each role ran at least once per decode step (the prefill is batch > 1: vLLM's path)
        short = {r: n for r, n in counts["roles"].items() if n < OUTPUT_TOKENS - 1}
        assert not short, (candidate["dtype"], route, counts)
        assert set(counts["fallbacks"]) <= {"batch_not_1"}, (candidate["dtype"], route, counts)
        # the decode graphs captured the route's calls; replays ran them, so executions exceed captures
        assert counts["captures"], (candidate["dtype"], route, counts)
        assert all(counts["roles"].get(r, 0) > n for r, n in counts["captures"].items()), counts
    gates = routes.attestation_gates(control_fp16, candidate)
    assert all(g["passed"] for g in gates), gates
