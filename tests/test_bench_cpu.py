"""`qgate bench ops --device cpu`: the record's shape (figures are printed, never asserted on)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from qgate.cli import app
from qgate.ops.bench_cpu import TINY_GEMV_SHAPES, WIDE_GEMV_SHAPES, time_interleaved
from qgate.results import current_schema, load_result


def test_time_interleaved_gives_reps_per_implementation() -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1

    times = time_interleaved(
        {"a": lambda: bump("a"), "b": lambda: bump("b")}, reps=3, warmup=1, min_sample_us=50
    )
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(t > 0 for v in times.values() for t in v) and calls["a"] >= 5


def test_bench_ops_cpu_writes_a_versioned_record(tmp_path: Path) -> None:
    contract = {
        "name": "bench-cpu-test",
        "version": 1,
        "model": "tiny",
        "arms": {"control": {"env": {}}, "candidate": {"env": {}}},
        "ops": {
            "routes": ["fp16_gemv"],
            "default_shapes": False,
            "shapes": {"fp16_gemv": [{"n": 64, "k": 96}]},
        },
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(contract))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["bench", "ops", "--device", "cpu", "-c", str(path), "-o", str(out), "--reps", "2"]
    )
    assert res.exit_code == 0, res.output
    record = load_result(out / "ops" / "bench-cpu.json", "ops_bench_cpu")
    assert record["schema_version"] == current_schema("ops_bench_cpu")
    labels = [c["label"] for c in record["cases"]]
    demo_shapes = TINY_GEMV_SHAPES + WIDE_GEMV_SHAPES
    assert labels == [f"{s['n']}x{s['k']}" for s in demo_shapes] + ["64x96"]
    for case in record["cases"]:
        assert {"plugin", "route", "op", "torch_linear", "reference", "vllm_linear"} <= set(case["timing"])
        # the routed call through the plugin counted each of 100 calls (its time is never asserted on)
        assert case["plugin_counts_exact"] is True and isinstance(case["plugin_overhead_us"], float)
        assert case["demo_model_shape"] == (
            case["label"] in ("256x128", "128x128", "16384x128", "128x8192", "2048x128")
        )
        assert case["baseline"] == "vllm_linear" and case["vllm_backend"]
        assert len(case["timing"]["route"]["raw_us"]) == 2 and isinstance(case["target_met"], bool)
    assert record["cpu"]["kernel_isa"] and len(record["load_avg_before"]) == 3
    # every timed loop's last output was its own input's result when its timer stopped, vLLM's included
    assert record["audit_failures"] == [] and all(c["audit"]["passed"] for c in record["cases"])
    assert all(a["checked"] == 2 for c in record["cases"] for a in c["audit"]["implementations"].values())
    assert "vLLM-cpu linear" in res.output and (out / "ops" / "bench-cpu.md").is_file()
    again = CliRunner().invoke(app, ["bench", "ops", "--device", "cpu", "-c", str(path), "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
