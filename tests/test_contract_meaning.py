"""Contract values that used to change meaning without a word (issue 39): each is refused by `qgate
contract validate` in one line that names the key, what is there and what to write, exit 2.

- YAML 1.1 forms PyYAML reads differently from YAML 1.2 (`yes`, `off`, `1:30`, `0100`, `1_000`);
- a bool, a string or a float where the field takes a number or an int; inf written any way;
- bounds where a value can only be a mistake (a stall timeout below an engine start);
- an arm's engine override typed and checked as the shared engine args are (it was a traceback);
- quality templates that fill a field other than {question} (the answer), seeds outside the range of
  what takes them;
- messages that name what is there: the line and column of a control character, a key with a
  look-alike or invisible character next to the missing key it resembles, long values cut.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qgate.cli import app
from qgate.contract import load_contract

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
SMOKE = (CONTRACTS / "smoke-cpu.yaml").read_text()
QUALITY = (CONTRACTS / "quality-cpu.yaml").read_text()
runner = CliRunner()


def _validate(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    res = runner.invoke(app, ["contract", "validate", str(path)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qgate: error: {path}: "), res.output
    return lines[0].removeprefix(f"qgate: error: {path}: ")


def _sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (case, base, old, new, what the line must say)
CASES = [
    # YAML 1.1 forms: each read as another value by PyYAML before, accepted without a word.
    (
        "launches yes",
        SMOKE,
        "launches: 3",
        "launches: yes",
        ["speed.launches = yes", "write true", "1 for a number"],
    ),
    (
        "warmup off",
        SMOKE,
        "warmup: 1",
        "warmup: off",
        ["speed.warmup = off", "write false", "0 for a number"],
    ),
    (
        "margin yes",
        SMOKE,
        "max_decode_regression_pct: 10",
        "max_decode_regression_pct: yes",
        ["speed.gates.max_decode_regression_pct = yes"],
    ),
    ("sexagesimal", SMOKE, "repetitions: 4", "repetitions: 1:30", ["speed.repetitions = 1:30", "90"]),
    ("octal", SMOKE, "input_tokens: 8192", "input_tokens: 0100", ["speed.input_tokens = 0100", "64", "100"]),
    ("underscore", SMOKE, "input_tokens: 8192", "input_tokens: 8_192", ["speed.input_tokens = 8_192"]),
    ("yes as a key", SMOKE, "  greedy: true", "  greedy: true\n  yes: 1", ["the key", "yes"]),
    # A value of the wrong kind, coerced before.
    (
        "enforce_eager n",
        SMOKE,
        "enforce_eager: true",
        "enforce_eager: n",
        ["engine.enforce_eager = 'n'", "bool"],
    ),
    (
        "string for a number",
        SMOKE,
        "repetitions: 4",
        "repetitions: '5'",
        ["speed.repetitions = '5'", "integer"],
    ),
    ("bool for a number", SMOKE, "launches: 3", "launches: true", ["speed.launches = True", "integer"]),
    ("bool for a float", SMOKE, "alpha: 0.05", "alpha: true", ["speed.stats.alpha = True", "number"]),
    (
        "float for an int",
        SMOKE,
        "  max_num_seqs: 1",
        "  max_num_seqs: 1\n  tensor_parallel_size: 4.0",
        ["engine.tensor_parallel_size = 4.0", "integer"],
    ),
    # No inf, however written; bounds where a value can only be a mistake.
    ("1e999", SMOKE, "max_cv_pct: 25.0", "max_cv_pct: 1e999", ["speed.stats.max_cv_pct = inf", "finite"]),
    ("inf as text", SMOKE, "min_decode_tok_s: 100", "min_decode_tok_s: 'inf'", ["min_decode_tok_s = 'inf'"]),
    (
        "stall 1e-9",
        SMOKE,
        "model: tiny",
        "model: tiny\nstall_timeout_s: 1e-9",
        ["stall_timeout_s = 1e-09", "30"],
    ),
    (
        "margin 100",
        SMOKE,
        "max_decode_regression_pct: 10",
        "max_decode_regression_pct: 100",
        ["less than 100"],
    ),
    # An arm's engine override: the same types and the same cross-field checks as the shared args.
    (
        "arm override a string",
        SMOKE,
        "  control:\n    env:",
        "  control:\n    engine: {max_model_len: '9216'}\n    env:",
        ["arms.control.engine.max_model_len = '9216'", "integer"],
    ),
    (
        "arm override too short",
        SMOKE,
        "  control:\n    env:",
        "  control:\n    engine: {max_model_len: 512}\n    env:",
        ["engine.max_model_len = 512 (arm control)"],
    ),
    (
        "arm override unset too short",
        SMOKE,
        "max_model_len: 9216",
        "max_model_len: 512",
        ["engine.max_model_len = 512"],
    ),
    # Templates fill {question} only; the answer never reaches the prompt. Seeds in range.
    (
        "answer in template",
        QUALITY,
        'user_template: "{question}"',
        'user_template: "{question} {answer}"',
        ["quality.user_template", "{answer}", "reference answer"],
    ),
    (
        "field in system prompt",
        QUALITY,
        'user_template: "{question}"',
        'user_template: "{question}"\n  system_prompt: "The answer is {answer}"',
        ["quality.system_prompt", "{answer}"],
    ),
    (
        "negative seed",
        QUALITY,
        "seed: 20260828",
        "seed: -1",
        ["quality.sampling.seed = -1", "greater than or equal to 0"],
    ),
    (
        "seed past 2**63",
        QUALITY,
        "seed: 20260828",
        f"seed: {2**64}",
        ["quality.sampling.seed", "less than or equal to 9223372036854775807"],
    ),
    (
        "repeats past the range",
        QUALITY,
        "seed: 20260828",
        f"seed: {2**63 - 2}",
        ["repeats = 3", "largest seed"],
    ),
    ("stats seed -1", SMOKE, "alpha: 0.05", "alpha: 0.05\n    seed: -1", ["speed.stats.seed = -1"]),
    (
        "engine seed past numpy",
        SMOKE,
        "max_num_seqs: 1",
        f"max_num_seqs: 1\n  seed: {2**32}",
        ["engine.seed"],
    ),
    ("prompt seed -1", SMOKE, "greedy: true", "greedy: true\n  prompt_seed: -3", ["speed.prompt_seed = -3"]),
    # Messages that name what is there.
    ("control character", SMOKE, "name: smoke-cpu", "name: smo\x01ke-cpu", ["line 4 column 10", "U+0001"]),
    (
        "cyrillic a",
        SMOKE,
        "\narms:",
        "\n\u0430rms:",
        ["'\\u0430rms': unknown key", "CYRILLIC SMALL LETTER A", "did you mean 'arms'"],
    ),
    (
        "zero-width space",
        SMOKE,
        "\narms:",
        "\narms\u200b:",
        ["'arms\\u200b': unknown key", "ZERO WIDTH SPACE", "did you mean 'arms'"],
    ),
    (
        "look-alike in a known section",
        SMOKE,
        "  greedy: true",
        "  gr\u0435edy: true",
        ["speed.'gr\\u0435edy'", "CYRILLIC SMALL LETTER IE", "did you mean 'greedy'"],
    ),
    (
        "null key",
        SMOKE,
        "model: tiny",
        "model: tiny\nnull: 1",
        ["line 8 column 1", "the key 'null' is not a name"],
    ),
]


@pytest.mark.parametrize(("case", "base", "old", "new", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_value_that_changes_meaning_is_refused_in_one_line(
    tmp_path: Path, case: str, base: str, old: str, new: str, says: list[str]
) -> None:
    line = _validate(tmp_path, _sub(base, old, new))
    for text in says:
        assert text in line, (case, line)
    assert "Traceback" not in line and len(line) < 500, line


def test_a_long_value_is_cut_with_a_count(tmp_path: Path) -> None:
    # A role list of thousands of characters used to print whole, on one line.
    roles = ", ".join(f"model.layers.{i}.mlp.down_proj_nope" for i in range(600))
    line = _validate(tmp_path, SMOKE + f"routes:\n  fp16_gemv: [{roles}]\n")
    assert len(line) < 700 and "more characters)" in line, line[:800]
    line = _validate(tmp_path, _sub(SMOKE, "name: smoke-cpu", "name: [" + ", ".join(["x" * 50] * 100) + "]"))
    assert len(line) < 700 and "more characters)" in line, line[:800]


def test_the_yaml_12_forms_keep_their_meaning(tmp_path: Path) -> None:
    """What YAML 1.2 reads as a number stays one (1e4 was a string to PyYAML, then coerced)."""
    path = tmp_path / "c.yaml"
    path.write_text(
        _sub(
            _sub(SMOKE, "input_tokens: 8192", "input_tokens: 0x2000"), "max_cv_pct: 25.0", "max_cv_pct: 2.5e1"
        )
    )
    speed = load_contract(path).contract.speed
    assert speed.input_tokens == 8192 and speed.stats.max_cv_pct == 25.0
    desc = SMOKE.splitlines()[5]
    assert desc.startswith("description: ")
    path.write_text(_sub(SMOKE, desc, "description: 'yes'"))  # quoted: text in both versions
    assert load_contract(path).contract.description == "yes"


def test_an_arm_override_is_merged_and_null_unsets_the_shared_arg(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        _sub(
            SMOKE,
            "  control:\n    env:",
            "  control:\n    engine: {max_num_seqs: 2, max_model_len: null}\n    env:",
        )
    )
    c = load_contract(path).contract
    assert c.engine_for("control")["max_num_seqs"] == 2 and "max_model_len" not in c.engine_for("control")
    assert c.engine_for("candidate")["max_model_len"] == 9216


def test_shipped_contract_hashes_are_unchanged_by_the_override_model() -> None:
    """The override model dumps only the keys an arm sets: the sha256 every recorded result carries.
    (smoke-cpu's changed from 7c254218bcb4 when speed.prompt_seed's default became unset, drawn per run:
    a new workload, every rep on its own prompt, so nights before it are not the same contract's.)"""
    assert load_contract(CONTRACTS / "smoke-cpu.yaml").sha256.startswith("747243c9245c")
    assert load_contract(CONTRACTS / "quality-cpu.yaml").sha256.startswith("6d525818f52c")


def test_gpu_engine_options_pass_to_vllm_and_additional_config_is_checked(tmp_path: Path) -> None:
    """Issue 46: a contract chooses the GDN prefill backend (vLLM 0.32's EngineArg) or sets vLLM's free-form
    `additional_config`: the keys vLLM itself reads are checked, the others pass to vLLM as written."""
    path = tmp_path / "c.yaml"
    extra = "  gdn_prefill_backend: triton\n  additional_config: {my_platform_plugin: {level: 2}}\n"
    path.write_text(_sub(SMOKE, "engine:\n", "engine:\n" + extra))
    kwargs = load_contract(path).contract.engine_for("candidate")
    assert kwargs["gdn_prefill_backend"] == "triton"
    assert kwargs["additional_config"] == {"my_platform_plugin": {"level": 2}}
    bad = "  additional_config: {gdn_prefill_backend: fi}\n"
    line = _validate(tmp_path, _sub(SMOKE, "engine:\n", "engine:\n" + bad))
    assert "additional_config.gdn_prefill_backend = 'fi': expected one of auto, flashinfer, triton" in line
    both = "  gdn_prefill_backend: triton\n  additional_config: {gdn_prefill_backend: flashinfer}\n"
    assert "differ: set one" in _validate(tmp_path, _sub(SMOKE, "engine:\n", "engine:\n" + both))
    line = _validate(tmp_path, _sub(SMOKE, "engine:\n", "engine:\n  gdn_prefill_backend: flashinfer2\n"))
    assert "engine.gdn_prefill_backend" in line


def test_an_aa_declared_keeps_the_sha256_its_run_was_recorded_under(tmp_path: Path) -> None:
    """An A/A contract (the candidate's env is the control's) is refused without `aa: true` since issue
    45; with it, its sha256 is the one the code before the key gave (206f56ece34a at 3ca942b; 4861c2b0428c
    since speed.prompt_seed's default became unset, drawn per run: results recorded before decoded one
    prompt in every rep, which compare refuses anyway), so the results of an A/A run still compare
    under it."""
    data = yaml.safe_load(SMOKE)
    data["arms"]["candidate"]["env"] = dict(data["arms"]["control"]["env"])
    path = tmp_path / "aa.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    line = _validate(tmp_path, path.read_text())
    assert "an A/A" in line and "aa: true" in line, line
    path.write_text(yaml.safe_dump({**data, "aa": True}, sort_keys=False))
    assert load_contract(path).sha256.startswith("4861c2b0428c")
