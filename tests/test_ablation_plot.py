"""The ablation's effects panel (qgate.report.ablation): the axis is the change in %, centred on the
effects with a line at no change (a zero-based ratio axis drew +4 % and +0.4 % alike), and each effect
is coloured by its outcome, not by its arm. Fast: one matplotlib figure, no engine."""

from __future__ import annotations

from pathlib import Path

from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from qgate.report.ablation import OUTCOME_COLOURS, _effects_panel, ablation_png
from qgate.stats import IMPROVED, NO_CHANGE, REGRESSED


def _effect(ratio: float, low: float, high: float, verdict: str) -> dict:
    return {"decode": {"ratio": ratio, "ci_low": low, "ci_high": high, "verdict": verdict}}


def _record() -> dict:
    """The effects of the H100 ablation of 5 Dec 2026 (docs/evidence/gpu-runs/2026-12-05-h100-s8):
    fp16_gemv +4.0 %
    improved, fused_hc_fp16 +0.4 % no change; fused_gdn_input_fp16 made a regression here."""
    arm = {"decode_tok_s": [122.0, 122.1], "decode_tok_s_ci": [121.9, 122.2], "decode_tok_s_mean": 122.05}
    return {
        "contract": {"name": "demo"},
        "design": "one-at-a-time",
        "status": "OK",
        "arms": [{"name": n, "figures": arm} for n in ("control", "candidate")],
        "factors": [{"name": n} for n in ("fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16")],
        "effects": {
            "candidate": _effect(1.10513, 1.1035, 1.1068, IMPROVED),
            "alone": {
                "fp16_gemv": _effect(1.04038, 1.0390, 1.0418, IMPROVED),
                "fused_hc_fp16": _effect(1.00391, 0.9990, 1.0088, NO_CHANGE),
                "fused_gdn_input_fp16": _effect(0.97, 0.955, 0.985, REGRESSED),
            },
            "leave_one_out": {},
        },
    }


def test_the_effects_are_coloured_by_outcome_around_no_change(tmp_path: Path) -> None:
    record = _record()
    ax = Figure().add_subplot()
    _effects_panel(ax, record)
    points = {}  # y label -> (x of the point, its colour)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    for line in ax.lines:
        xs, ys = line.get_xdata(), line.get_ydata()
        if len(xs) == 1 and line.get_marker() == "o":
            points[labels[int(ys[0])]] = (float(xs[0]), to_hex(line.get_color()))
    colour = {v: c for v, (c, _) in OUTCOME_COLOURS.items()}
    assert points["fp16_gemv alone"] == (
        100 * (record["effects"]["alone"]["fp16_gemv"]["decode"]["ratio"] - 1),
        colour[IMPROVED],
    )
    assert points["fused_hc_fp16 alone"][1] == colour[NO_CHANGE]
    assert (
        points["fused_gdn_input_fp16 alone"][0] < 0
        and points["fused_gdn_input_fp16 alone"][1] == colour[REGRESSED]
    )
    # the no-change line at 0 inside an axis that spans the effects (-4.5 % .. +10.5 %), not from 0 ratio
    assert any(list(line.get_xdata()) == [0, 0] for line in ax.lines)
    low, high = ax.get_xlim()
    assert -10 < low < -4.5 and 10.6 < high < 20
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        OUTCOME_COLOURS[v][1] for v in (IMPROVED, NO_CHANGE, REGRESSED)
    }
    ablation_png(record, tmp_path / "a.png")  # the whole figure still renders
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_a_small_effect_is_not_drawn_on_top_of_a_large_one() -> None:
    record = _record()
    ax = Figure().add_subplot()
    _effects_panel(ax, record)
    low, high = ax.get_xlim()
    # +4.0 % and +0.4 % are 3.6 points apart on an axis ~25 points wide: a seventh of it, not 0.003 of
    # a ratio axis from 0 to 1.15
    assert 3.6 / (high - low) > 0.1
