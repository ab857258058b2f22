"""A contract's `routes:` roles without vLLM: parsing, the env both arms get, the route gate on roles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

import qgate_route_env as route_env
from qgate import routes
from qgate.contract import ContractError, load_contract
from qgate.engine import preflight

GEMV = "VLLM_SM70_QWEN38_FP16_GEMV"
ROLES = [
    "out_proj",
    "qkv_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "gate",
    "shared_expert_gate",
    "lm_head",
]


def _contract(tmp_path: Path, block: str) -> Path:
    base = (REPO / "contracts" / "qwen4exp-cpu.yaml").read_text()
    start = base.index("\nroutes:\n") + 1
    end = base.index("\narms:\n") + 1
    path = tmp_path / "c.yaml"
    path.write_text(base[:start] + block + base[end:])
    return path


def test_both_arms_carry_the_listed_roles() -> None:
    c = load_contract(REPO / "contracts" / "qwen38-sm70-tp4-decode.yaml").contract
    for arm in ("control", "candidate"):
        assert route_env.listed_roles(c.env_for(arm)) == {"fp16_gemv": ROLES}
    assert list(route_env.GEMV_DEFAULT_ROLES) == ROLES  # the production list is the plugin's default


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("routes:\n  fp16_gemv:\n    roles: []\n", "routes.fp16_gemv.roles"),
        ("routes:\n  fp16_gemv:\n    roles: [o_proj, o_proj]\n", "lists a role twice"),
        ("routes:\n  fp16_gemv:\n    roles: [model.o_proj]\n", "'model.o_proj' is not a module name"),
        ("routes:\n  fused_hc_fp16:\n    roles: [attn]\n", "routes.fused_hc_fp16"),
        ("routes:\n  fp16_gemv:\n    role: [o_proj]\n", "routes.fp16_gemv.role"),
    ],
)
def test_bad_roles_are_one_line_naming_the_key(tmp_path: Path, block: str, message: str) -> None:
    with pytest.raises(ContractError) as err:
        load_contract(_contract(tmp_path, block))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_arm_cannot_set_the_roles_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _contract(tmp_path, "")
    text = path.read_text().replace(
        '      VLLM_SM70_QWEN38_FP16_GEMV: "1"\n',
        '      VLLM_SM70_QWEN38_FP16_GEMV: "1"\n      QGATE_ROUTE_ROLES: \'{"fp16_gemv": ["o_proj"]}\'\n',
    )
    path.write_text(text)
    with pytest.raises(
        ContractError, match="arms.candidate.env.QGATE_ROUTE_ROLES: set the contract's `routes:`"
    ):
        load_contract(path)
    # and an inherited one is dropped by the launcher, like the other route variables
    monkeypatch.setenv(route_env.ROLES_ENV, '{"fp16_gemv": ["o_proj"]}')
    assert route_env.ROLES_ENV not in preflight.engine_env({})


def _result(roles: dict[str, int], listed: list[str] | None) -> dict:
    env = {GEMV: "1"}
    if listed is not None:
        env[route_env.ROLES_ENV] = json.dumps({"fp16_gemv": listed})
    hits = sum(roles.values())
    return {"env": env, "routes": {"fp16_gemv": {"hits": hits, "fallbacks": {}, "roles": roles}}}


def test_a_listed_role_without_hits_fails_the_route_gate() -> None:
    (ok,) = routes.ran_gates(_result({"o_proj": 3, "lm_head": 4}, ["o_proj", "lm_head"]))
    assert ok["passed"]
    (bad,) = routes.ran_gates(_result({"o_proj": 3}, ["o_proj", "lm_head", "gate"]))
    assert not bad["passed"] and bad["detail"].startswith("listed roles without hits: lm_head, gate;")
    (unlisted,) = routes.ran_gates(_result({"o_proj": 3}, None))  # no list: any hit proves the route
    assert unlisted["passed"]
    broken = _result({"o_proj": 3}, None)
    broken["env"][route_env.ROLES_ENV] = "[o_proj"
    (err,) = routes.ran_gates(broken)
    assert not err["passed"] and "not a JSON object" in err["detail"]
