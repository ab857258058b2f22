"""qgate.timeline and the ablation report's timeline section, without vLLM: the two fixture folders
(tests/fixtures/timeline: the H200 profile of 2026-12-04 and a CPU run), corrupted copies of them, the
section's lines, and the check of a timeline against the ablation's arms."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qgate import timeline
from qgate.report.timeline import TITLE, timeline_lines
from qgate.timeline import TimelineError, match_arms, read_timeline, thaw

FIXTURES = Path(__file__).parent / "fixtures" / "timeline"
H200 = FIXTURES / "h200-prodshape-bf16"
CPU = FIXTURES / "cpu-qwen4exp"
GEMV = "void qgate::gemv_one_group_kernel<1, 10, qgate::(anonymous namespace)::GemvRows<__nv_bfloat16> >"
NVJET = "nvjet_sm90_tst_512x8_64x3_2x1_v_bz_TNT"


def test_the_h200_profile_reads_as_the_run_measured_it() -> None:
    tl = read_timeline(H200)
    assert tl["kind"] == "timeline" and tl["schema_version"] == timeline.TIMELINE_SCHEMA_VERSION
    assert list(tl["arms"]) == ["control", "candidate"]
    c, t = tl["arms"]["control"], tl["arms"]["candidate"]
    assert (c["gpu_busy_us_per_step"], t["gpu_busy_us_per_step"]) == (2053.91, 1908.49)
    assert (c["host_gap_us_per_step"], t["host_gap_us_per_step"]) == (2758.88, 2726.89)
    assert c["device"] == "NVIDIA H200" and c["tokens"] == 64 and c["engine_start_s"] is None
    a = tl["against_control"]["candidate"]
    assert a["delta_gpu_busy_us_per_step"] == pytest.approx(-145.42)
    assert a["gpu_busy_change_pct"] == pytest.approx(-7.08, abs=0.01)
    rows = a["kernels"]["rows"]
    assert len(rows) == timeline.TOP_N and a["kernels"]["differing"] == 40
    assert [abs(r["delta_us_per_step"]) for r in rows] == sorted(
        (abs(r["delta_us_per_step"]) for r in rows), reverse=True
    )
    added = {r["name"] for r in rows if r["change"] == "added"}
    removed = {r["name"]: r for r in rows if r["change"] == "removed"}
    assert any(n.startswith(GEMV) for n in added)
    assert (
        removed[NVJET]["control"] == {"per_step": 1.0, "us_per_step": 304.55}
        and removed[NVJET]["arm"] is None
    )
    totals = a["kernels"]["totals"]
    assert (totals["added"]["count"], totals["removed"]["count"], totals["changed"]["count"]) == (6, 13, 21)
    assert totals["added"]["delta_us_per_step"] == pytest.approx(1130.54)
    assert a["runtime_api"]["rows"][0]["name"] == "cudaGraphLaunch"
    assert [o["name"] for o in a["qgate_ops"]][:2] == ["qgate::qsa_topk", "qgate_plugin::gemv_site"]
    for arm in ("control", "candidate"):
        f = tl["source"]["files"][arm]
        assert f["file"] == f"{arm}.json"
        assert f["sha256"] == hashlib.sha256((H200 / f"{arm}.json").read_bytes()).hexdigest()
    with pytest.raises(TypeError):
        tl["arms"]["control"]["gpu_busy_us_per_step"] = 0.0  # type: ignore[index]
    assert json.loads(json.dumps(thaw(tl))) == thaw(tl)


def test_the_cpu_profile_has_no_kernels_and_the_host_ops() -> None:
    tl = read_timeline(CPU)
    a = tl["against_control"]["candidate"]
    assert tl["arms"]["control"]["device"] == "cpu" and a["kernels"]["differing"] == 0
    assert a["gpu_busy_change_pct"] is None
    assert {o["name"] for o in a["qgate_ops"]} >= {"qgate::hc_mix", "qgate_plugin::gemv_site"}
    lines = timeline_lines(tl)
    assert "Reading: no CUDA kernels in either profile: the host side only (the qgate ops below)." in lines


def test_the_section_on_the_h200_profile() -> None:
    md = "\n".join(timeline_lines(read_timeline(H200)))
    assert md.startswith(TITLE + "\n")
    for want in (
        "Reading: GPU busy -145 us a step (-7.1 %), host gap -32 us: the candidate's kernels are faster "
        "under the profiler.",
        "makes every profiled arm host-bound (host gap of the kernel span, us a step: control 2759 of 4813, "
        "candidate 2727 of 4635): these microseconds are not the speed gate's figures",
        "| control | NVIDIA H200 | 64 | 2053.91 | 4812.79 | 2758.88 | 0.98 | 37.23 | 34 |",
        "| candidate | NVIDIA H200 | 64 | 1908.49 | 4635.38 | 2726.89 | 0.98 | 37.75 | 27 |",
        "Kernels against the control: 6 added (+1130.54 us/step), 13 removed (-1236.99 us/step), "
        "21 changed (-96.99 us/step); the 12 of 40 largest by |change|:",
        f"| removed | `{NVJET}` | 1.00 -> - | 304.55 -> - | -304.55 |",
        "| cudaGraphLaunch | 0.98 -> 0.98 | 546.7 -> 318.3 | -228.4 |",
        "qgate ops on the host in candidate: `qgate::qsa_topk` 0.05/step (0.8 us CPU)",
    ):
        assert want in md, want
    assert "| added | `void qgate::gemv_one_group_kernel<1, 10," in md
    assert timeline_lines(None) == []


# --- bad input: one line naming the file and the key -----------------------------------------------------


def _edit(key: str, value: Any) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        d[key] = value

    return edit


def _kernel(field: str, value: Any) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        d["kernels"][NVJET][field] = value

    return edit


CORRUPT = {
    "nan": (_edit("gpu_busy_us_per_step", float("nan")), "gpu_busy_us_per_step = nan"),
    "negative": (_edit("graph_launches_per_step", -1), "graph_launches_per_step = -1"),
    "string": (_edit("kernel_span_us_per_step", "4812"), "kernel_span_us_per_step = '4812'"),
    "bool": (_edit("eager_kernel_launches_per_step", True), "eager_kernel_launches_per_step = True"),
    "tokens": (_edit("tokens", 0), "tokens = 0"),
    "missing": (lambda d: d.pop("host_gap_us_per_step"), "no 'host_gap_us_per_step'"),
    "kernels list": (_edit("kernels", []), "kernels = []"),
    "kernel inf": (_kernel("us_per_step", float("inf")), f"kernels.{NVJET}.us_per_step = inf"),
    "kernel row": (lambda d: d["kernels"].__setitem__(NVJET, 3), f"kernels.{NVJET}"),
    "empty name": (
        lambda d: d["kernels"].__setitem__(" ", {"per_step": 1, "us_per_step": 1}),
        "kernels name ' '",
    ),
    "api": (lambda d: d["runtime_api"]["cudaGraphLaunch"].pop("per_step"), "runtime_api.cudaGraphLaunch"),
    "device": (_edit("device", 7), "device = 7"),
    "gap": (_edit("host_gap_us_per_step", 100.0), "host_gap_us_per_step = 100.0 is not kernel_span"),
}


def _copy(tmp: Path, src: Path = H200) -> Path:
    dst = tmp / "profiles"
    shutil.copytree(src, dst)
    return dst


def _one_line(folder: Path, *wants: str) -> str:
    with pytest.raises(TimelineError) as err:
        read_timeline(folder)
    msg = str(err.value)
    assert "\n" not in msg
    for want in wants:
        assert want in msg, msg
    return msg


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupted_profile_is_refused_in_one_line_naming_file_and_key(tmp_path: Path, case: str) -> None:
    edit, want = CORRUPT[case]
    folder = _copy(tmp_path)
    path = folder / "control.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))  # json writes NaN / Infinity as the profiler's json.dumps would
    _one_line(folder, str(path), want)


@pytest.mark.parametrize(
    "raw, want",
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"tokens": 64,', "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"a": 1}', "no 'gpu_busy_us_per_step': not a profile_decode.py record"),
    ],
)
def test_a_file_that_is_not_a_profile_is_refused(tmp_path: Path, raw: bytes, want: str) -> None:
    folder = _copy(tmp_path)
    (folder / "control.json").write_bytes(raw)
    _one_line(folder, str(folder / "control.json"), want)


def test_the_folder_itself_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _one_line(tmp_path / "absent", "no such timeline folder")
    folder = _copy(tmp_path)
    _one_line(folder / "control.json", "not a folder")
    (folder / "bad name.json").write_text("{}")
    _one_line(folder, "cannot be an arm's name")
    (folder / "bad name.json").unlink()
    (folder / "only-x.json").mkdir()
    _one_line(folder, "only-x.json: not a regular file (a directory)")
    (folder / "only-x.json").rmdir()
    monkeypatch.setattr(timeline, "MAX_PROFILE_BYTES", 100)
    _one_line(folder, "candidate.json", "more than a result can be (100)")
    monkeypatch.undo()
    (folder / "candidate.json").unlink()
    _one_line(folder, "control.json only: no arm to compare with it")
    (folder / "control.json").rename(folder / "candidate.json")
    _one_line(folder, "no control.json")
    # the profiler's inputs and hidden files beside the profiles are not profiles
    folder = _copy(tmp_path / "b")
    (folder / "control.args.json").write_text('{"engine": {}}')
    (folder / ".candidate.json.tmp.json").write_text("")
    assert list(read_timeline(folder)["arms"]) == ["control", "candidate"]
    if hasattr(os, "mkfifo"):  # a FIFO must not hang the read
        os.mkfifo(folder / "only-y.json")
        _one_line(folder, "only-y.json: not a regular file (a FIFO)")


def test_the_profiles_are_matched_with_the_ablation_arms_and_the_report_says_how() -> None:
    tl = read_timeline(CPU)
    assert tl["ablation_arms"] is None and not any("ablation" in line for line in timeline_lines(tl))
    env = {a: dict(tl["arms"][a]["arm_env_routes"]) for a in ("control", "candidate")}
    same = match_arms(tl, env)
    assert same["ablation_arms"] == {
        "control": {"in_ablation": True, "env_differs": {}},
        "candidate": {"in_ablation": True, "env_differs": {}},
    }
    assert same["arms"] == tl["arms"] and not any(
        "Note" in line or "no arm" in line for line in timeline_lines(same)
    )
    # a probe's folder: variants that are no arm of the ablation are shown, said so, not refused
    other = match_arms(tl, {"control": env["control"], "only-fp16_gemv": env["candidate"]})
    assert other["ablation_arms"]["candidate"] == {"in_ablation": False, "env_differs": None}
    assert "Profiles of variants that are no arm of this ablation: candidate." in timeline_lines(other)
    env["candidate"]["VLLM_SM70_QWEN38_FP16_GEMV"] = "0"
    moved = match_arms(tl, env)
    assert moved["ablation_arms"]["candidate"]["env_differs"] == {
        "VLLM_SM70_QWEN38_FP16_GEMV": {"profile": "1", "arm": "0"}
    }
    assert (
        "**candidate: the profile ran VLLM_SM70_QWEN38_FP16_GEMV = '1', the ablation's arm '0': a profile of "
        "other code than this arm's.**" in timeline_lines(moved)
    )
    h200 = match_arms(read_timeline(H200), {"control": {}, "candidate": {}})  # no route env recorded
    assert (
        "No route env recorded in control, candidate: the file names alone tie them to the arms."
        in timeline_lines(h200)
    )


HC_TMA = "void qgate::hc_tma_kernel<__nv_bfloat16>(qgate::HcArgs, qgate::HcTmaPlan)"
GDN = "void qgate::gemv_one_group_kernel<1, 10, qgate::(anonymous namespace)::GdnFlatRows<__nv_bfloat16> >"


def _replay(kernels: list[tuple[str, float, float]]) -> dict[str, Any]:
    """A graph_step as profile_decode.py writes it, from (name, start us, duration us) in order."""
    names = sorted({k[0] for k in kernels})
    return {"kernels": len(kernels), "names": names, "seq": [[names.index(n), a, d] for n, a, d in kernels]}


def _with_step(src: Path, dst: Path, steps: dict[str, dict[str, Any]]) -> Path:
    dst.mkdir()
    for arm in ("control", "candidate"):
        data = json.loads((src / f"{arm}.json").read_text())
        data["graph_step"] = steps[arm]
        (dst / f"{arm}.json").write_text(json.dumps(data))
    return dst


def test_one_replay_aligned_with_the_controls_gives_each_routes_stretch_with_its_gaps(tmp_path: Path) -> None:
    """vLLM's HC as three kernels with 2 us between them (9 + 4 us gaps = 13 us of span) against one fused
    kernel of 11 us; cuBLAS's projection against the route's GEMV; the same GDN core and MoE kernels in
    both: the HC stretch saves its gaps although its kernel is slower than the three busy together."""
    control = _replay(
        [
            ("_hc_combine_norm_kernel", 0.0, 3.0),
            ("kernel_cutlass_hc_down_silu", 5.0, 4.0),  # 2 us gap before each of vLLM's HC kernels
            ("_hc_gate_mix_kernel", 11.0, 2.0),
            ("fused_recurrent_gated_delta_rule_fwd_kernel", 14.0, 6.0),
            (NVJET, 21.0, 5.0),
            ("fused_moe_kernel", 27.0, 10.0),
        ]
    )
    candidate = _replay(
        [
            (HC_TMA, 0.0, 11.0),
            ("fused_recurrent_gated_delta_rule_fwd_kernel", 12.0, 6.0),
            (GEMV + "(int)", 19.0, 3.0),
            ("fused_moe_kernel", 23.0, 10.0),
        ]
    )
    folder = _with_step(H200, tmp_path / "tl", {"control": control, "candidate": candidate})
    tl = read_timeline(folder)
    assert tl["arms"]["control"]["graph_kernels"] == 6 and tl["arms"]["control"]["graph_span_us"] == 37.0
    g = tl["against_control"]["candidate"]["graph_stretches"]
    assert g["aligned_kernels"] == 2 and g["arm"]["span_us"] == 33.0
    hc, gemv = g["by_route"]["fused_hc_fp16"], g["by_route"]["fp16_gemv"]
    assert hc["control"] == {"kernels": 3, "span_us": 13.0, "busy_us": 9.0}
    assert hc["arm"] == {"kernels": 1, "span_us": 11.0, "busy_us": 11.0} and hc["delta_span_us"] == -2.0
    assert gemv["control"]["span_us"] == 5.0 and gemv["delta_span_us"] == -2.0
    md = "\n".join(timeline_lines(tl))
    assert "control 6 kernels in 37.0 us, candidate 4 in 33.0 us (-4.0), 2 kernels alike" in md
    assert "| fused_hc_fp16 | 1 | 3 | 13.0 (9.0) | 1 | 11.0 (11.0) | -2.0 |" in md
    # a route next to another in the step (HC then the GDN input) is one stretch named by both
    both = _replay([(HC_TMA, 0.0, 11.0), (GDN + "(int)", 11.5, 4.0), ("fused_moe_kernel", 16.0, 10.0)])
    ctrl = _replay([("_hc_gate_mix_kernel", 0.0, 12.0), (NVJET, 13.0, 5.0), ("fused_moe_kernel", 19.0, 10.0)])
    tl = read_timeline(_with_step(H200, tmp_path / "tl2", {"control": ctrl, "candidate": both}))
    assert list(tl["against_control"]["candidate"]["graph_stretches"]["by_route"]) == [
        "fused_gdn_input_fp16+fused_hc_fp16"
    ]


def test_profiles_without_a_replay_keep_the_section_as_it_was() -> None:
    tl = read_timeline(H200)  # the 2026-12-04 profile: no graph_step
    assert tl["against_control"]["candidate"]["graph_stretches"] is None
    assert tl["arms"]["candidate"]["graph_kernels"] is None
    assert "graph replay" not in "\n".join(timeline_lines(tl))


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"names": ["k"], "seq": []}, r"graph_step.seq = \[\]: expected 1 to"),
        ({"names": ["k"], "seq": [[1, 0.0, 1.0]]}, r"graph_step.seq\[0\] = \[1, 0.0, 1.0\]: expected"),
        ({"names": ["k"], "seq": [[0, -1.0, 1.0]]}, r"graph_step.seq\[0\]\[1\] = -1.0: expected a finite"),
        ({"names": ["k\x00"], "seq": [[0, 0.0, 1.0]]}, "graph_step.names .*: expected a printable"),
        ([1, 2], "graph_step = \\[1, 2\\]: expected"),
    ],
)
def test_a_bad_replay_is_one_line(tmp_path: Path, step: Any, message: str) -> None:
    folder = _with_step(H200, tmp_path / "tl", {"control": step, "candidate": _replay([("k", 0.0, 1.0)])})
    with pytest.raises(TimelineError, match=message) as err:
        read_timeline(folder)
    assert "\n" not in str(err.value) and "control.json" in str(err.value)


def test_a_kernel_that_starts_before_its_predecessor_ends_has_its_wait_counted_apart(tmp_path: Path) -> None:
    """PDL: vLLM's combine-norm (launched with launch_pdl, gdc_wait first) behind the route's GEMV,
    which allows its dependents at its start, starts 3 us before the GEMV ends: 5 us of profiled time,
    3 of them the wait. Behind cuBLAS it starts when cuBLAS ends. A kernel on the aux stream (the shared
    expert) overlaps in both arms alike and is no change."""
    control = _replay(
        [
            (NVJET, 0.0, 6.0),
            ("_hc_combine_norm_kernel", 6.5, 2.0),
            ("fused_moe_kernel", 9.0, 10.0),
            ("shared_expert_on_aux", 10.0, 4.0),  # 4 us inside the MoE kernel, another stream
        ]
    )
    candidate = _replay(
        [
            (GEMV + "(int)", 0.0, 5.0),
            ("_hc_combine_norm_kernel", 2.0, 5.0),  # 3 us of it before the GEMV ends
            ("fused_moe_kernel", 7.5, 10.0),
            ("shared_expert_on_aux", 8.5, 4.0),
        ]
    )
    early = timeline.early_starts(timeline._graph_step(Path("candidate.json"), candidate))  # as read
    assert early["_hc_combine_norm_kernel"] == {"calls": 1.0, "early": 1.0, "early_us": 3.0}
    assert early["shared_expert_on_aux"] == {"calls": 1.0, "early": 1.0, "early_us": 4.0}
    assert early["fused_moe_kernel"]["early"] == 0.0
    tl = read_timeline(_with_step(H200, tmp_path / "tl", {"control": control, "candidate": candidate}))
    e = tl["against_control"]["candidate"]["graph_early_starts"]
    assert e["early_us"] == {"control": 4.0, "arm": 7.0}
    assert [(r["name"], r["delta_early_us"]) for r in e["rows"]] == [("_hc_combine_norm_kernel", 3.0)]
    md = "\n".join(timeline_lines(tl))
    assert "4.0 us of overlap in the control's replay, 7.0 in the candidate's (+3.0)" in md
    assert "| `_hc_combine_norm_kernel` | 0 -> 1 | 0.0 -> 3.0 | +3.0 |" in md
    # no replay in the profiles (the 2026-12-04 H200 files): no such table
    assert read_timeline(H200)["against_control"]["candidate"]["graph_early_starts"] is None


H100_PROBE = Path(__file__).parents[1] / "docs" / "evidence" / "gpu-runs" / "2026-12-05-h100" / "timeline"


def test_the_h100_probes_plus_120_us_on_the_combine_norm_is_the_gemvs_pdl_overlap() -> None:
    """Session 6's only-GEMV profile (48 layers, H100): vLLM's `_hc_combine_norm_kernel` took ~120 us a
    step more than in the control with no more work to do. It is the wait: behind the route's GEMV it
    starts early, and the overlap grew by about the same 120 us."""
    tl = read_timeline(H100_PROBE)
    a = tl["against_control"]["only-fp16_gemv"]
    kernel = next(r for r in a["kernels"]["rows"] if r["name"] == "_hc_combine_norm_kernel")
    early = next(r for r in a["graph_early_starts"]["rows"] if r["name"] == "_hc_combine_norm_kernel")
    assert 110.0 < kernel["delta_us_per_step"] < 135.0  # what BENCH.md left unexplained
    assert 110.0 < early["delta_early_us"] < 135.0
    assert abs(kernel["delta_us_per_step"] - early["delta_early_us"]) < 15.0  # its own work: about equal
