"""tools/bench_step_sum.py: the op bench's GEMV cases summed over one decode step of the production
model (docs/evidence/kernels-in-engine.md, "The op bench on the same card"), on the H100 bench record
of session 7."""

from __future__ import annotations

import copy
import importlib.util
import json
from typing import Any

import pytest
from conftest import REPO

RECORD = REPO / "docs/evidence/gpu-runs/2026-12-05-h100-s7/bench-gemv/bench-tp1/bench.json"


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("bench_step_sum", REPO / "tools" / "bench_step_sum.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_h100_bench_summed_over_a_step_splits_the_saving_by_stream() -> None:
    """48 layers, every 4th attention: 36 out_proj, 12 qkv_proj and o_proj, 48 of each per-layer role,
    one lm_head (253 calls). The bench's -693 us a step is 392 on the main stream and 300 on the shared
    expert's aux stream: the engine's -327 us of GPU work is to be read against the 392."""
    tool = _tool()
    calls = tool.calls_a_step(tool.MODEL_CONFIG)  # qgate.ops.shapes'
    assert calls["out_proj"] == 36 and calls["qkv_proj"] == calls["o_proj"] == 12 and calls["lm_head"] == 1
    assert sum(calls[r] for r in tool.GEMV_DEFAULT_ROLES) == 253
    s = tool.step_sum(json.loads(RECORD.read_text()), tp=1)
    assert round(s["route_us_a_step"]) == 1988 and round(s["competitor_us_a_step"]) == 2681
    t = s["saving_us_a_step"]
    assert round(t["all"]) == 693 and round(t["main"]) == 392 and round(t["aux"]) == 300
    assert t["all"] == pytest.approx(t["main"] + t["aux"])
    lm = next(r for r in s["rows"] if r["role"] == "lm_head")
    assert lm["shape"] == (248320, 2560)
    assert lm["competitor_us"] / lm["route_us"] == pytest.approx(1.11, abs=0.01)  # the engine's logits: 1.11x


def test_a_role_the_bench_did_not_time_is_an_error_not_a_zero() -> None:
    tool = _tool()
    record = json.loads(RECORD.read_text())
    cut = copy.deepcopy(record)
    cut["cases"] = [c for c in cut["cases"] if c["shape"]["n"] != 248320]
    with pytest.raises(SystemExit, match=r"no bf16 GEMV case of \(248320, 2560\) \(lm_head\)"):
        tool.step_sum(cut, tp=1)
    with pytest.raises(SystemExit, match=r"case of \(2560, 1536\) \(out_proj\)"):  # TP 4 shapes: not benched
        tool.step_sum(record, tp=4)


def test_a_file_that_is_not_a_bench_record_is_one_line(tmp_path, monkeypatch) -> None:
    tool = _tool()
    bad = tmp_path / "bench.json"
    bad.write_text('{"cases": [{"route": "fp16_gemv"}]}')
    for path, why in ((bad, "KeyError"), (tmp_path / "missing.json", "FileNotFoundError")):
        monkeypatch.setattr("sys.argv", ["bench_step_sum.py", str(path)])
        with pytest.raises(SystemExit, match=f"{path.name}: not a prod_bench.py record \\({why}"):
            tool.main()
