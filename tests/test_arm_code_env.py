"""An arm env beyond the route switches is a finding in every verdict (issue 63): a candidate that sets
LD_PRELOAD, PYTHONPATH, VLLM_ATTENTION_BACKEND, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ... runs code no
gate measured for what it is, so the speed and quality verdicts cannot PASS unless the contract declares
the name (`code_env`); a FAIL stays a FAIL. On the hand-made fixture pair (no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from golden import support

from qgate import comparable
from qgate.compare import Pair, build_verdict
from qgate.contract import ContractError, LoadedContract, parse_contract
from qgate.contract.aa import code_env_differences, is_code_env
from qgate.report import render_markdown


@pytest.fixture(autouse=True)
def routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comparable, "routes", support.standin_routes())


def _contract(candidate_env: dict[str, str], code_env: list[str]) -> LoadedContract:
    data = support.pinned_contract().contract.model_dump(mode="json")
    data["arms"]["candidate"]["env"].update(candidate_env)
    data["code_env"] = code_env
    return LoadedContract(
        path="c.yaml", sha256=support.FIXTURE_SHA, contract=parse_contract(data, Path("c.yaml"))
    )


def _verdict(candidate_env: dict[str, str], loaded: LoadedContract, slow: float = 1.0) -> dict[str, Any]:
    control, candidate = support.load_pair()
    candidate["env"].update(candidate_env)
    for rep in candidate["reps"]:
        rep["decode_tok_s"] *= slow
        rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
    return build_verdict([Pair("speed", control, candidate, "c.json", "t.json")], [], loaded)


@pytest.mark.parametrize(
    "extra",
    [
        {"LD_PRELOAD": "/tmp/libfast.so"},
        {"PYTHONPATH": "/tmp/mine"},
        {"PYTHONHOME": "/opt/py"},
        {"VLLM_ATTENTION_BACKEND": "TORCH_SDPA"},
        {"CUDA_VISIBLE_DEVICES": "1"},
        {"OMP_NUM_THREADS": "64"},
        {"QGATE_HC_IMPL": "fast"},
    ],
)
def test_undeclared_code_env_makes_a_pass_inconclusive(extra: dict[str, str]) -> None:
    (name,) = extra
    assert support.load_pair()[1]["env"].keys().isdisjoint(extra)
    record = _verdict(extra, support.pinned_contract())
    gate = next(g for g in record["gates"] if g["name"] == "arm env")
    assert not gate["passed"] and gate["severity"] == "inconclusive"
    assert f"{name} (candidate only)" in gate["detail"] and "code_env" in gate["detail"]
    assert record["verdict"] == "INCONCLUSIVE", record["reasons"]
    assert any(
        r.startswith(f"arm env: the arms differ beyond their route switches in {name}")
        for r in record["reasons"]
    )
    assert (
        f"| arm env | FAIL | INCONCLUSIVE | the arms differ beyond their route switches in {name}"
        in render_markdown(record)
    )


def test_declared_code_env_passes_and_is_said() -> None:
    extra = {"PYTHONPATH": "/tmp/mine", "OMP_NUM_THREADS": "64"}
    record = _verdict(extra, _contract(extra, ["PYTHONPATH", "OMP_NUM_THREADS"]))
    gate = next(g for g in record["gates"] if g["name"] == "arm env")
    assert gate["passed"] and gate["detail"] == (
        "the arms differ in OMP_NUM_THREADS (candidate only), PYTHONPATH (candidate only): "
        "declared in code_env"
    )
    assert record["verdict"] == "PASS", record["reasons"]
    # One declared, one not: still INCONCLUSIVE, naming only the undeclared one.
    record = _verdict(extra, _contract(extra, ["PYTHONPATH"]))
    assert record["verdict"] == "INCONCLUSIVE"
    gate = next(g for g in record["gates"] if g["name"] == "arm env")
    assert "OMP_NUM_THREADS (candidate only)" in gate["detail"] and "PYTHONPATH" not in gate["detail"]


def test_a_fail_stays_a_fail_and_no_finding_without_code_env() -> None:
    record = _verdict({"PYTHONPATH": "/tmp/mine"}, support.pinned_contract(), slow=0.5)
    assert record["verdict"] == "FAIL"
    assert any(r.startswith("arm env: ") for r in record["reasons"])
    plain = _verdict({}, support.pinned_contract())
    assert plain["verdict"] == "PASS" and not any(g["name"] == "arm env" for g in plain["gates"])


def test_what_counts_as_code_env() -> None:
    for name in (
        "LD_PRELOAD",
        "LD_AUDIT",
        "PYTHONSTARTUP",
        "VLLM_USE_V1",
        "TRITON_CACHE_DIR",
        "MKL_NUM_THREADS",
    ):
        assert is_code_env(name), name
    # The route switches and overrides are what the contract compares; any other name is not qgate's to read.
    for name in ("VLLM_SM70_QWEN38_FP16_GEMV", "QGATE_ROUTE_IMPL_FP16_GEMV", "MY_FLAG", "HOME"):
        assert not is_code_env(name), name
    assert code_env_differences({"OMP_NUM_THREADS": "4", "A": "1"}, {"OMP_NUM_THREADS": "8", "A": "2"}) == [
        "OMP_NUM_THREADS"
    ]


def test_code_env_must_name_what_an_arm_sets() -> None:
    with pytest.raises(ContractError, match=r"code_env\[0\]: 'LD_PRELOAD' is set by neither arm's env"):
        _contract({}, ["LD_PRELOAD"])
    with pytest.raises(ContractError, match=r"code_env\[1\]: PYTHONPATH is declared twice"):
        _contract({"PYTHONPATH": "/x"}, ["PYTHONPATH", "PYTHONPATH"])
