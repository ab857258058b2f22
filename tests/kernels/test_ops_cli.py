"""`qgate run ops` / `qgate bench ops` on the CPU through the Typer app: files, exit codes, messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from qgate.cli.ops import app

REPO = Path(__file__).resolve().parents[2]
SMALL_OPS = {
    "trials": 3,
    "default_shapes": False,
    "shapes": {
        "fp16_gemv": [{"n": 48, "k": 128}],
        "fused_hc_fp16": [{"hc_count": 4, "hidden": 64, "lora_rank": 24, "op": "combine_and_mix"}],
        "fused_gdn_input_fp16": [
            {
                "hidden": 64,
                "num_k_heads": 2,
                "num_v_heads": 4,
                "head_k_dim": 16,
                "head_v_dim": 8,
                "layout": "flat",
            }
        ],
        "qsa_topk": [{"rows": 2, "length": 300, "k": 17}],
    },
    "bench": {"reps": 2, "warmup": 1, "rotate_bytes": 10000, "max_sets": 2},
}


def _contract(tmp_path: Path, ops: dict | None = SMALL_OPS) -> Path:
    data = yaml.safe_load((REPO / "contracts" / "smoke-cpu.yaml").read_text())
    data["ops"] = ops
    path = tmp_path / "ops.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_run_ops_screens_every_route_and_writes_records(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", "-c", str(_contract(tmp_path)), "-o", str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    record = json.loads((out / "ops" / "ops.json").read_text())
    assert record["kind"] == "ops" and record["schema_version"] == 4 and record["passed"]
    assert [c["route"] for c in record["cases"]] == [
        "fp16_gemv",
        "fused_hc_fp16",
        "fused_gdn_input_fp16",
        "qsa_topk",
    ]
    for case in record["cases"]:
        assert case["passed"] and case["fallback_probe"]["counted"], case
        # the C++ CPU kernels (csrc/cpu) sum in their own order: within the tolerance, not always bitwise;
        # the top-k's CPU kernel is its reference
        assert case["route"] != "qsa_topk" or case["bitwise_equal"] == 3, case
    assert "| fp16_gemv | 48x128 | " in (out / "ops" / "ops.md").read_text()
    # an existing record is not replaced without --force
    again = CliRunner().invoke(
        app, ["run", "-c", str(_contract(tmp_path)), "-o", str(out), "--device", "cpu"]
    )
    assert again.exit_code == 2 and "use --force" in again.output


def test_run_ops_fails_when_the_route_differs_from_its_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import qgate_kernels

    true_gemv = qgate_kernels.gemv
    # The cases look the op up on the package per call: the route moves 1 % off the exact result.
    monkeypatch.setattr(qgate_kernels, "gemv", lambda w, x, **kw: true_gemv(w, x, **kw) * 1.01)
    ops = {**SMALL_OPS, "routes": ["fp16_gemv"]}
    res = CliRunner().invoke(app, ["run", "-c", str(_contract(tmp_path, ops)), "-o", str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    record = json.loads((tmp_path / "o" / "ops" / "ops.json").read_text())
    assert not record["passed"] and "over the forward-error bound" in record["cases"][0]["failures"][0]


def test_bad_ops_key_is_one_line_and_exit_2(tmp_path: Path) -> None:
    ops = {**SMALL_OPS, "trails": 3}
    res = CliRunner().invoke(app, ["run", "-c", str(_contract(tmp_path, ops)), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "ops.trails" in res.output and "unknown key" in res.output and "Traceback" not in res.output


def test_cuda_device_without_gpu_is_a_user_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    res = CliRunner().invoke(
        app, ["run", "-c", str(_contract(tmp_path)), "-o", str(tmp_path / "o"), "--device", "cuda"]
    )
    assert res.exit_code == 2 and "no CUDA device" in res.output


def test_bench_ops_writes_figures_for_every_case(tmp_path: Path) -> None:
    # The graph-replay benchmark's code path, run on the CPU through its core: on the CPU the command
    # runs the CPU-kernel benchmark instead (qgate.ops.bench_cpu, tests/test_bench_cpu.py).
    from types import SimpleNamespace

    from qgate.contract import load_contract
    from qgate.ops.run import bench_ops
    from qgate.report.ops import bench_markdown

    out = tmp_path / "out"
    res = SimpleNamespace(
        output=bench_markdown(bench_ops(load_contract(_contract(tmp_path)), out, device="cpu"))
    )
    from qgate.results import load_result

    record = load_result(out / "ops" / "bench.json", "ops_bench")  # the schema it writes is one it reads
    assert record["copy_gb_s"] > 0
    for case in record["cases"]:
        assert case["route_timing"]["median_us"] > 0 and case["baseline_timing"]["median_us"] > 0
        assert len(case["raw_us"]["route"]) == 2 and case["target_met"] is None  # targets are the H200's
    assert "| qsa_topk | 2x300x17 |" in res.output
    # top-k draws cycle through continuous rows, steps of 0.25, the indexer's scores, exp(3 N(0,1)) and
    # integers: each kind is timed alone too
    (topk,) = [c for c in record["cases"] if c["route"] == "qsa_topk"]
    assert {k: v["sets"] for k, v in topk["by_input"].items()} == {"continuous": 1, "ties": 1}
    assert all("by_input" not in c for c in record["cases"] if c["route"] != "qsa_topk")
    assert "| qsa_topk | 2x300x17 | ties | 1 |" in res.output


def test_run_ops_arm_screens_the_override_the_arm_runs(tmp_path: Path) -> None:
    """A candidate that swaps a route for a perturbing override (every 7th output's sign flipped) is
    caught by the screen of that arm; the control arm, without an override, screens the kernels."""
    data = yaml.safe_load(_contract(tmp_path, {**SMALL_OPS, "routes": ["fp16_gemv"]}).read_text())
    data["arms"]["candidate"]["env"].update(
        {
            "QGATE_ROUTE_IMPL_FP16_GEMV": "slow_routes:perturbed_gemv",
            "PYTHONPATH": str(REPO / "tests" / "fixtures"),
        }
    )
    contract = tmp_path / "override.yaml"
    contract.write_text(yaml.safe_dump(data, sort_keys=False))
    runner = CliRunner()
    bad = runner.invoke(app, ["run", "-c", str(contract), "-o", str(tmp_path / "c"), "--arm", "candidate"])
    assert bad.exit_code == 1, bad.output
    record = json.loads((tmp_path / "c" / "ops" / "ops.json").read_text())
    assert record["schema_version"] == 4 and record["arm"] == "candidate" and record["unseen"] == []
    assert record["overrides"] == {"fp16_gemv": "slow_routes:perturbed_gemv"}
    (case,) = record["cases"]
    assert not case["passed"] and case["override"] == "slow_routes:perturbed_gemv"
    assert case["fallback_probe"] is None and "over the forward-error bound" in " ".join(case["failures"])
    assert "overridden routes screened on the override" in bad.output
    good = runner.invoke(app, ["run", "-c", str(contract), "-o", str(tmp_path / "k"), "--arm", "control"])
    assert good.exit_code == 0, good.output
    assert json.loads((tmp_path / "k" / "ops" / "ops.json").read_text())["overrides"] == {}
    typo = runner.invoke(app, ["run", "-c", str(contract), "-o", str(tmp_path / "t"), "--arm", "cand"])
    assert typo.exit_code == 2 and "'cand' is not one of" in typo.output
