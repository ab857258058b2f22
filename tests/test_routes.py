"""qgate.routes without vLLM: switches, the pre-flight override check, collect, gates, route table."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

import qgate_route_env as route_env
from qgate import routes
from qgate.engine import preflight
from qgate.routes import RouteError

FIXTURES = str(REPO / "tests" / "fixtures")
GEMV = "VLLM_SM70_QWEN38_FP16_GEMV"
IMPL = "QGATE_ROUTE_IMPL_FP16_GEMV"


def test_routes_match_the_plugin_switches() -> None:
    # One vocabulary (qgate_route_env), the same objects on both sides, spelled as the docs say.
    overrides = pytest.importorskip("qgate_kernels.overrides")
    assert routes.ROUTES is route_env.ROUTES and overrides.ROUTES is route_env.ROUTES
    assert routes.override_var is overrides.override_var is route_env.override_var
    assert routes.ROUTES["fp16_gemv"] == GEMV and routes.override_var("fp16_gemv") == IMPL


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("true", True), (" ON ", True), ("yes", True), ("0", False), ("", False)]
)
def test_switched_on_parses_values(value: str, on: bool) -> None:
    assert routes.switched_on({GEMV: value}) == ({"fp16_gemv"} if on else set())


def test_switched_on_lists_every_route() -> None:
    env = {var: "1" for var in routes.ROUTES.values()} | {"OTHER": "1"}
    assert routes.switched_on(env) == set(routes.ROUTES)
    assert routes.switched_on({}) == set()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({GEMV: "2"}, f"{GEMV}='2': expected 1 or 0"),
        ({GEMV: "1", "QGATE_ROUTE_IMPL_FP16_GEMM": "a:b"}, "QGATE_ROUTE_IMPL_FP16_GEMM: unknown route"),
        ({GEMV: "0", IMPL: "slow_routes:slow_gemv"}, f"{IMPL} is set but the route is off"),
        ({GEMV: "1", IMPL: "slow_routes.slow_gemv"}, f"{IMPL}='slow_routes.slow_gemv': expected 'package."),
    ],
)  # fmt: skip
def test_check_overrides_refuses_bad_env_without_importing(env: dict, message: str) -> None:
    with pytest.raises(RouteError) as err:
        preflight.check_overrides(env)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_check_overrides_accepts_plain_switches() -> None:
    preflight.check_overrides({GEMV: "1", "VLLM_SM70_QWEN38_FUSED_HC_FP16": "0"})
    preflight.check_overrides({})


@pytest.fixture()
def impl_dir(tmp_path: Path) -> Path:
    """A module of override candidates, importable through the arm's PYTHONPATH only."""
    (tmp_path / "my_impls.py").write_text(
        textwrap.dedent(
            """
            def good(w, x):
                return x @ w.t()
            def defaulted(weight, x, scale=1.0):
                return x @ weight.t()
            def one_arg(weight):
                return weight
            def three_args(weight, x, extra):
                return x
            def needs_keyword(weight, x, *, mode):
                return x
            not_callable = 3
            """
        )
    )
    (tmp_path / "broken_impl.py").write_text("import no_such_module_qgate\n")
    return tmp_path


@pytest.fixture()
def importable(impl_dir: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """The check the pre-flight's child interpreter runs (qgate_kernels.overrides.env_problems), here,
    with impl_dir on this process's path: one spec per case without a torch import per case (the
    child's own path, one interpreter per check, is tested below once each way)."""
    overrides = pytest.importorskip("qgate_kernels.overrides")
    monkeypatch.syspath_prepend(str(impl_dir))
    yield overrides
    for name in ("my_impls", "broken_impl"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("func", ["good", "defaulted"])
def test_a_matching_signature_is_accepted(importable: object, func: str) -> None:
    assert importable.env_problems({GEMV: "1", IMPL: f"my_impls:{func}"}) == []


BROKEN_SPECS = [
    ("no_such_pkg_qgate.mod:f", "cannot import 'no_such_pkg_qgate.mod' (ModuleNotFoundError"),
    ("broken_impl:f", "cannot import 'broken_impl' (ModuleNotFoundError"),
    ("my_impls:missing", "module 'my_impls' has no attribute 'missing'"),
    ("my_impls:not_callable", "'not_callable' is not callable"),
    ("my_impls:one_arg", "signature one_arg(weight) does not match the route op gemv("),
    ("my_impls:three_args", "signature three_args(weight, x, extra) does not match"),
    ("my_impls:needs_keyword", "does not match the route op"),
]


@pytest.mark.parametrize(("spec", "message"), BROKEN_SPECS)
def test_a_broken_spec_is_one_problem_line(importable: object, spec: str, message: str) -> None:
    (text,) = importable.env_problems({GEMV: "1", IMPL: spec})
    assert text.startswith(f"{IMPL}={spec!r}: ") and message in text, text
    assert "\n" not in text


def test_check_overrides_takes_a_matching_override_through_the_child(impl_dir: Path) -> None:
    pytest.importorskip("qgate_kernels.overrides")
    preflight.check_overrides({GEMV: "1", IMPL: "my_impls:good", "PYTHONPATH": str(impl_dir)})


def test_check_overrides_refuses_a_broken_spec_before_any_engine_in_one_line(impl_dir: Path) -> None:
    pytest.importorskip("qgate_kernels.overrides")
    spec, message = BROKEN_SPECS[4]
    with pytest.raises(RouteError) as err:
        preflight.check_overrides({GEMV: "1", IMPL: spec, "PYTHONPATH": str(impl_dir)})
    text = str(err.value)
    assert text.startswith(f"{IMPL}={spec!r}: ") and message in text, text
    assert "\n" not in text


def test_check_overrides_imports_with_the_arms_env_not_the_callers(impl_dir: Path) -> None:
    pytest.importorskip("qgate_kernels.overrides")
    # The module is importable here only through the arm's PYTHONPATH: without it, the check fails.
    with pytest.raises(RouteError, match="cannot import 'my_impls'"):
        preflight.check_overrides({GEMV: "1", IMPL: "my_impls:good"})


def test_the_test_fixture_overrides_pass_the_check() -> None:
    pytest.importorskip("qgate_kernels.overrides")
    for func in ("slow_gemv", "perturbed_gemv"):
        preflight.check_overrides({GEMV: "1", IMPL: f"slow_routes:{func}", "PYTHONPATH": FIXTURES})


CHILD = """
import json, os, pathlib, time
pathlib.Path(os.environ["PIDS"], str(os.getpid())).write_text("")
time.sleep(float(os.environ["SLEEP"]))
print(json.dumps({"problems": [os.environ["FAIL"] + " arm"] if os.environ.get("FAIL") else []}))
"""


def _child_arms(tmp_path: Path, *arms: tuple[str, float, str]) -> list:
    """Arms whose checks run CHILD (an override set: each needs a child): name, seconds, failure."""
    return [
        (name, {GEMV: "1", IMPL: "x_impl:f", "PIDS": str(tmp_path), "SLEEP": str(s), "FAIL": fail})
        for name, s, fail in arms
    ]


def test_the_arms_children_run_side_by_side_and_the_first_arms_problem_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_arm_envs starts the arms' children at once (each is an import of vLLM: 15-20 s on the H200)
    and raises the problem of the first arm in plan order, whichever child ends first; a failing arm
    leaves no child running."""
    import os
    import time

    monkeypatch.setattr(preflight, "CHECK_COMMAND", (sys.executable, "-c", CHILD))
    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 4)
    t0 = time.monotonic()
    arms = _child_arms(tmp_path, ("a", 1.5, ""), ("b", 1.5, ""), ("c", 1.5, ""))
    assert [e.name for e in preflight.arm_envs(arms, {})] == ["a", "b", "c"]
    assert time.monotonic() - t0 < 4.0  # one after another: 4.5 s and more
    arms = _child_arms(tmp_path, ("a", 0.5, "first"), ("b", 0.0, "second"), ("c", 60.0, ""))
    t0 = time.monotonic()
    with pytest.raises(RouteError, match="^first arm$"):
        preflight.arm_envs(arms, {})
    assert time.monotonic() - t0 < 30.0  # c's child (60 s) was killed, not waited for
    for pid in (int(p.name) for p in tmp_path.iterdir()):
        with pytest.raises(ProcessLookupError):  # killed and reaped
            os.kill(pid, 0)


def _write(path: Path, routes_on: list[str], counts: dict, errors: list[str] | None = None) -> None:
    path.write_text(json.dumps({"routes_on": routes_on, "routes": counts, "errors": errors or []}))


def test_collect_merges_processes(tmp_path: Path) -> None:
    worker = {
        "fp16_gemv": {
            "hits": 10,
            "fallbacks": {"batch_not_1": 4},
            "roles": {"qkv_proj": 6, "lm_head": 4},
            "sites": {"qkv_proj": 2},
        }
    }
    worker2 = {
        "fp16_gemv": {"hits": 5, "fallbacks": {"batch_not_1": 1, "dtype": 2}, "roles": {"qkv_proj": 5}}
    }
    front = {"fp16_gemv": {"hits": 0, "fallbacks": {}, "roles": {}, "sites": {}}}
    worker2["fp16_gemv"]["captures"] = {"qkv_proj": 1}  # a worker under CUDA graphs (schema 2)
    _write(tmp_path / "VllmWorker-0-11.json", ["fp16_gemv"], worker)
    _write(tmp_path / "VllmWorker-1-12.json", ["fp16_gemv"], worker2)
    _write(tmp_path / "MainProcess-10.json", ["fp16_gemv"], front)
    (tmp_path / ".VllmWorker-0-11.json.tmp").write_text("{half a fi")  # an interrupted write: ignored
    merged = routes.collect(tmp_path)
    assert merged["fp16_gemv"] == {
        "hits": 15,
        "fallbacks": {"batch_not_1": 5, "dtype": 2},
        "roles": {"qkv_proj": 11, "lm_head": 4},
        "captures": {"qkv_proj": 1},
    }
    assert set(merged) == set(routes.ROUTES)
    assert merged["qsa_topk"] == {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}}


def test_collect_of_no_files_is_all_zero(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "missing"):
        merged = routes.collect(folder)
        assert all(v == {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}} for v in merged.values())


def test_collect_refuses_an_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "VllmWorker-0-11.json").write_text("{not json")
    with pytest.raises(RouteError, match="VllmWorker-0-11.json: unreadable route attestation"):
        routes.collect(tmp_path)


def test_collect_counts_a_plugin_error(tmp_path: Path) -> None:
    counts = {"fp16_gemv": {"hits": 0, "fallbacks": {}, "roles": {}}}
    _write(tmp_path / "VllmWorker-0-11.json", ["fp16_gemv"], counts, errors=["plugin setup failed: boom"])
    assert routes.collect(tmp_path)["fp16_gemv"]["fallbacks"] == {"plugin_error": 1}


def _result(env: dict, **counts: dict) -> dict:
    r = {k: {"hits": 0, "fallbacks": {}, "roles": {}} for k in routes.ROUTES}
    r.update(counts)
    return {"env": env, "routes": r}


def _gates(control: dict, candidate: dict) -> dict[str, dict]:
    return {g["name"]: g for g in routes.attestation_gates(control, candidate)}


HIT = {"hits": 9, "fallbacks": {"batch_not_1": 2}, "roles": {"qkv_proj": 9}}


def test_gates_pass_when_candidate_routes_ran_and_control_is_clean() -> None:
    gates = _gates(_result({GEMV: "0"}), _result({GEMV: "1"}, fp16_gemv=HIT))
    assert set(gates) == {"routes.control_clean", "routes.fp16_gemv.ran"}
    assert all(g["passed"] for g in gates.values())
    assert "9 hits (qkv_proj: 9)" in gates["routes.fp16_gemv.ran"]["detail"]


def test_gate_fails_when_a_switched_route_never_ran() -> None:
    gates = _gates(_result({}), _result({GEMV: "1"}))
    gate = gates["routes.fp16_gemv.ran"]
    assert not gate["passed"] and "the route plugin did not run" in gate["detail"]


def test_gate_fails_when_every_call_fell_back_or_the_model_has_no_site() -> None:
    fell = {"hits": 0, "fallbacks": {"batch_not_1": 7}, "roles": {}}
    gate = _gates(_result({}), _result({GEMV: "1"}, fp16_gemv=fell))["routes.fp16_gemv.ran"]
    assert not gate["passed"] and "every call fell back: batch_not_1: 7" in gate["detail"]
    hc = "VLLM_SM70_QWEN38_FUSED_HC_FP16"
    none = {"hits": 0, "fallbacks": {"no_site_in_model": 1}, "roles": {}}
    gate = _gates(_result({}), _result({hc: "1"}, fused_hc_fp16=none))["routes.fused_hc_fp16.ran"]
    assert not gate["passed"] and "no layer of the model can take it" in gate["detail"]


def test_gate_fails_when_the_control_ran_a_route() -> None:
    gates = _gates(_result({GEMV: "0"}, fp16_gemv=HIT), _result({GEMV: "1"}, fp16_gemv=HIT))
    assert not gates["routes.control_clean"]["passed"]
    assert gates["routes.control_clean"]["detail"] == "control hits: fp16_gemv: 9"


def test_gates_fail_without_attestation() -> None:
    gates = _gates({"env": {}}, {"env": {GEMV: "1"}})
    assert not gates["routes.control_clean"]["passed"] and not gates["routes.fp16_gemv.ran"]["passed"]


def test_route_summary_rows_are_data() -> None:
    rows = routes.route_summary(_result({GEMV: "1"}, fp16_gemv=HIT))
    assert [r["route"] for r in rows] == list(routes.ROUTES)
    assert rows[0] == {
        "route": "fp16_gemv",
        "env": GEMV,
        "switched_on": True,
        "hits": 9,
        "fallbacks": 2,
        "roles": {"qkv_proj": 9},
        "fallback_reasons": {"batch_not_1": 2},
        "captures": 0,
        "captures_by_role": {},
    }
    assert rows[1]["switched_on"] is False and rows[1]["roles"] == {}


def test_captured_calls_are_reported_beside_the_executions() -> None:
    # Under CUDA graphs the plugin writes executions (captured calls x replays) and the captures.
    graphed = {"hits": 120, "fallbacks": {}, "roles": {"qkv_proj": 120}, "captures": {"qkv_proj": 2}}
    row = routes.route_summary(_result({GEMV: "1"}, fp16_gemv=graphed))[0]
    assert row["hits"] == 120 and row["captures"] == 2 and row["captures_by_role"] == {"qkv_proj": 2}
    never = {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {"qkv_proj": 2}}
    gate = routes.ran_gates(_result({GEMV: "1"}, fp16_gemv=never))[0]
    assert not gate.passed and "2 calls were captured into CUDA graphs" in gate.detail
    assert "no replay ran them" in gate.detail


def test_route_rows_render_in_the_report() -> None:
    from qgate.report.markdown import counts_text

    assert counts_text({"qkv_proj": 9, "o_proj": 1}) == "o_proj: 1, qkv_proj: 9"
    assert counts_text({}) == "none" and counts_text({}, empty="-") == "-"


def test_platform_env_carries_shims_and_sites_and_refuses_unknown_ones() -> None:
    sites = {"fused_hc_fp16.mix": "my_fork.hc:MyResidual.mix"}
    env = route_env.platform_env(["qwen4exp_fp16_cpu"], sites)
    assert env == {
        "QGATE_SHIMS": "qwen4exp_fp16_cpu",
        "QGATE_SITES": json.dumps(sites, separators=(",", ":")),
    }
    assert route_env.platform_env([], {}) == {}
    assert route_env.platform_env_problem(["qwen4exp_fp16_cpu"], sites) is None
    assert "not a known shim" in route_env.platform_env_problem(["nope"], {})
    assert "not a known site" in route_env.platform_env_problem([], {"fused_hc_fp16.mixx": "a:b"})
    assert "expected 'module:Class.method'" in route_env.platform_env_problem(
        [], {"qsa_topk.topk": "a:b.c.d"}
    )


def test_collect_shims_sums_calls_and_never_touches_the_routes(tmp_path: Path) -> None:
    def record(name: str, calls: int) -> dict:
        return {
            "kind": "route_attestation",
            "schema_version": 1,
            "routes_on": [],
            "errors": [],
            "routes": {},
            "shims": {"qwen4exp_fp16_cpu": {"applied": "fp16 GDN core", "calls": calls}},
        }

    (tmp_path / "MainProcess-1.json").write_text(json.dumps(record("MainProcess", 0)))
    (tmp_path / "VllmWorker-0-2.json").write_text(json.dumps(record("VllmWorker-0", 29)))
    assert routes.collect_shims(tmp_path) == {"qwen4exp_fp16_cpu": {"applied": "fp16 GDN core", "calls": 29}}
    zero = {"hits": 0, "fallbacks": {}, "roles": {}, "captures": {}}
    assert all(v == zero for v in routes.collect(tmp_path).values())
    merged = routes.merge_shims(routes.collect_shims(tmp_path), routes.collect_shims(tmp_path))
    assert merged["qwen4exp_fp16_cpu"]["calls"] == 58


def test_the_verdict_report_shows_captured_calls_only_for_graphed_runs() -> None:
    from qgate.report import markdown

    def record(cand: dict) -> dict:
        arms = {
            "control": {"routes": {"fp16_gemv": {"hits": 0, "fallbacks": {}, "roles": {}}}},
            "candidate": {"routes": {"fp16_gemv": cand}, "switched_routes": ["fp16_gemv"]},
        }
        return {"speed": {"arms": arms}}

    plain = "\n".join(markdown._routes(record(HIT)))
    assert "captured" not in plain and "qkv_proj: 9" in plain  # the CPU: executions are the calls
    graphed = {"hits": 120, "fallbacks": {}, "roles": {"qkv_proj": 120}, "captures": {"qkv_proj": 2}}
    text = "\n".join(markdown._routes(record(graphed)))
    assert "candidate captured calls by role" in text and "qkv_proj: 2" in text and "qkv_proj: 120" in text
