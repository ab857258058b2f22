"""`qgate contract validate|show`: every shipped contract is valid; every bad one is one line + exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qgate.cli import app
from qgate.contract import load_contract
from qgate.contract.messages import ContractError

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
SMOKE = CONTRACTS / "smoke-cpu.yaml"
runner = CliRunner()


@pytest.mark.parametrize("path", sorted(CONTRACTS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_contracts_validate(path: Path) -> None:
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert load_contract(path).sha256 in result.output


def test_show_prints_resolved_contract_and_hash() -> None:
    result = runner.invoke(app, ["contract", "show", str(SMOKE)])
    assert result.exit_code == 0
    shown = json.loads(result.output)
    assert shown["sha256"] == load_contract(SMOKE).sha256
    # defaults are resolved: the stats section exists although the file only sets part of it
    assert shown["contract"]["speed"]["stats"]["bootstrap_resamples"] == 10000


def _mutate(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(SMOKE.read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _set(keys: str, value):
    def edit(data):
        *parents, last = keys.split(".")
        cur = data
        for k in parents:
            cur = cur.setdefault(k, {})
        cur[last] = value

    return edit


BAD = [
    ("unknown key", _set("engine.enforce_eagr", True), "engine.enforce_eagr", "unknown key"),
    ("unknown top key", _set("speeed", {}), "speeed", "unknown key"),
    ("wrong type", _set("engine.max_num_seqs", "one"), "engine.max_num_seqs", "integer"),
    ("output 1", _set("speed.output_tokens", 1), "speed.output_tokens = 1", "greater than or equal to 2"),
    ("reps 0", _set("speed.repetitions", 0), "speed.repetitions = 0", "greater than or equal to 1"),
    (
        "negative gate",
        _set("speed.gates.min_decode_tok_s", -5),
        "min_decode_tok_s = -5",
        "greater than or equal to 0",
    ),
    ("too long", _set("speed.input_tokens", 9000), "speed.input_tokens", "max_model_len = 9216"),
    ("env int", _set("arms.candidate.env.VLLM_SM70_QWEN38_FP16_GEMV", 1), "arms.candidate.env", "string"),
    ("arm engine typo", _set("arms.control.engine", {"dtyp": "float16"}), "arms.control.engine", "unknown"),
    ("bad dtype", _set("engine.dtype", "fp8"), "engine.dtype = 'fp8'", "float16"),
    ("missing arms", lambda d: d.pop("arms"), "arms", "required"),
    # issue 16: the margin is required, reps must be able to reach alpha, route env keys are known ones
    (
        "no margin",
        lambda d: d["speed"]["gates"].pop("max_decode_regression_pct"),
        "speed.gates.max_decode_regression_pct",
        "required",
    ),
    (
        "margin 0",
        _set("speed.gates.max_decode_regression_pct", 0),
        "max_decode_regression_pct = 0",
        "greater",
    ),
    (
        "reps cannot reach alpha",
        lambda d: d["speed"].update(repetitions=1, launches=3),
        "speed.repetitions x speed.launches = 1 x 3",
        "can never reach speed.stats.alpha = 0.05; expected at least 4 reps per arm",
    ),
    (
        "typo'd route switch",
        _set("arms.candidate.env.VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16x", "1"),
        "arms.candidate.env.VLLM_SM70_QWEN38_FUSED_GDN_INPUT_FP16x",
        "not a known route switch",
    ),
    (
        "lower-case route switch",
        _set("arms.control.env.vllm_sm70_qwen38_fp16_gemv", "0"),
        "arms.control.env.vllm_sm70_qwen38_fp16_gemv",
        "did you mean VLLM_SM70_QWEN38_FP16_GEMV",
    ),
    (
        "typo'd override",
        _set("arms.candidate.env.QGATE_ROUTE_IMPL_FP16_GEM", "m:f"),
        "arms.candidate.env.QGATE_ROUTE_IMPL_FP16_GEM",
        "not a known route override",
    ),
    (
        "switch without its prefix",
        _set("arms.candidate.env.VLLM_SM70_QWEN_38_FP16_GEMV", "1"),
        "arms.candidate.env.VLLM_SM70_QWEN_38_FP16_GEMV",
        "did you mean VLLM_SM70_QWEN38_FP16_GEMV",
    ),
    ("nothing to gate", lambda d: d.pop("speed"), "nothing to gate", "no speed, quality or ops section"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_contract_is_one_line_and_exit_2(tmp_path: Path, case) -> None:
    _, edit, where, expected = case
    path = _mutate(tmp_path, edit)
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 2
    out = result.output.strip()
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out
    assert str(path) in out and where in out, out
    assert expected.lower() in out.lower(), out


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    for target in (bad, tmp_path / "absent.yaml"):
        result = runner.invoke(app, ["contract", "validate", str(target)])
        assert result.exit_code == 2
        assert str(target) in result.output and len(result.output.strip().splitlines()) == 1


def test_other_env_keys_and_known_route_keys_are_accepted(tmp_path: Path) -> None:
    env = {
        "VLLM_SM70_QWEN38_FP16_GEMV": "1",
        "QGATE_ROUTE_IMPL_FP16_GEMV": "slow_routes:slow_gemv",
        "QGATE_SLOW_GEMV_DELAY_MS": "0.1",
        "QGATE_ABLATE_PLACEBO": "1",
        "PYTHONPATH": "tests/fixtures",
        "OMP_NUM_THREADS": "2",
    }
    path = _mutate(tmp_path, _set("arms.candidate.env", env))
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 0, result.output
    # An override that `run` would refuse (no such function) is refused by validate too (issue 30).
    env["QGATE_ROUTE_IMPL_FP16_GEMV"] = "slow_routes:spin_gemv"
    path = _mutate(tmp_path, _set("arms.candidate.env", env))
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 2 and "has no attribute 'spin_gemv'" in result.output, result.output


QUALITY = CONTRACTS / "quality-cpu.yaml"


@pytest.mark.parametrize(
    ("base", "old", "new", "says"),
    [
        (SMOKE, "version: 1", "version: [1]", "version = [1]: expected a valid integer or a valid string"),
        (
            SMOKE,
            "max_decode_regression_pct: 10",
            "max_decode_regression_pct: .nan",
            "speed.gates.max_decode_regression_pct = nan: expected a finite number",
        ),
        (SMOKE, 'FP16_GEMV: "1"', 'FP16_GEMV: "ture"', "VLLM_SM70_QWEN38_FP16_GEMV='ture': expected 1 or 0"),
        (SMOKE, "  candidate:\n    env:\n", "  candidate:\n    env: {}\n    env:\n", "duplicate key 'env'"),
        (QUALITY, "  repeats:", "  seeds: [1, 2]\n  repeats:", "quality: give seeds or repeats, not both"),
    ],
)
def test_messages_say_what_is_wrong_in_the_users_terms(
    tmp_path: Path, base: Path, old: str, new: str, says: str
) -> None:
    # Issue 30, defect 8: `version: [1]` read `version.int = '<missing>'`, NaN "should be less than 100",
    # a cross-field rule dumped its whole section; a duplicate key or `ture` passed silently.
    text = base.read_text()
    assert old in text
    path = tmp_path / "c.yaml"
    path.write_text(text.replace(old, new, 1))
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 2 and says in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "{" not in result.output, result.output


def test_a_fifo_given_as_a_contract_is_refused_without_blocking(tmp_path: Path) -> None:
    # open() of a FIFO waits for a writer: `qgate run` and `contract validate` hung on one.
    fifo = tmp_path / "contract.yaml"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["contract", "validate", str(fifo)])
    assert result.exit_code == 2, result.output
    assert "not a regular file" in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(ContractError, match="not a regular file"):
        load_contract(tmp_path)  # a folder, past the CLI's own path check


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("speed", "repetitions", 10**19), ("speed", "launches", 101), ("speed", "warmup", 10**6)],
)
def test_counts_that_would_run_for_ever_are_refused(
    tmp_path: Path, section: str, key: str, value: int
) -> None:
    # 20 digits pass the YAML reader's integer cap; the schema's own bound names the key.
    data = yaml.safe_load(SMOKE.read_text())
    data[section][key] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["contract", "validate", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{section}.{key} = {value}" in result.output and "less than or equal" in result.output
