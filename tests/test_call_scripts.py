"""The device call scripts' shared library (tools/gpu_engine/calls/lib.sh) on the CPU: a call script
that another one runs gives qgate the same PYTHONPATH as when it runs alone. On 2026-12-05 10-install.sh
ran 70-decide.sh, which sourced the payload's env.sh a second time; PYTHONPATH held every entry twice,
and the next call's `qgate run speed --resume` was refused (the environment changed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "tools" / "gpu_engine" / "calls" / "lib.sh"
# as device_install.sh writes it (.gpu-engine/call-0K/device_install.sh)
ENV_SH = "export PYTHONPATH=$GE/site:$GE/site/dsl${PYTHONPATH:+:$PYTHONPATH}\n"
SCRIPT = 'source tools/gpu_engine/calls/lib.sh\nuse_engine\necho "$PYTHONPATH" >> "$GE/paths"\n{next}\n'


def _tree(tmp: Path, env_sh: str = ENV_SH) -> tuple[Path, dict[str, str]]:
    repo = tmp / "repo"
    (repo / "tools" / "gpu_engine" / "calls").mkdir(parents=True)
    (repo / "kernels_ext" / "qgate_kernels").mkdir(parents=True)
    shutil.copy(LIB, repo / "tools" / "gpu_engine" / "calls" / "lib.sh")
    ge = tmp / "ge"
    ge.mkdir()
    (ge / "env.sh").write_text(env_sh)
    (ge / "build.rc").write_text("rc=0 seconds=1\n")
    (tmp / "fake.so").write_bytes(b"")
    (ge / "so.path").write_text(str(tmp / "fake.so"))
    (repo / "inner.sh").write_text(SCRIPT.format(next=""))
    (repo / "outer.sh").write_text(SCRIPT.format(next="bash inner.sh"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GE_BASE_PYTHONPATH")}
    env.update(GE=str(ge), OUT=str(tmp / "out"), RUNS=str(tmp / "runs"))
    return repo, env


def test_a_nested_call_script_keeps_the_outer_ones_pythonpath(tmp_path: Path) -> None:
    repo, env = _tree(tmp_path)
    for start in (None, "/mine"):
        (tmp_path / "ge" / "paths").unlink(missing_ok=True)
        run_env = dict(env) if start is None else {**env, "PYTHONPATH": start}
        subprocess.run(["bash", "outer.sh"], cwd=repo, env=run_env, check=True, capture_output=True)
        outer, inner = (tmp_path / "ge" / "paths").read_text().splitlines()
        ge = tmp_path / "ge"
        want = [f"{repo}/harness", f"{repo}/route_env", f"{repo}/kernels_ext", f"{ge}/site", f"{ge}/site/dsl"]
        assert outer.split(":") == want + ([] if start is None else [start])
        assert inner == outer  # the nested script: the same PYTHONPATH, no entry twice
        # a script run alone (the next device call) gives the same again: its resume is accepted
        (tmp_path / "ge" / "paths").unlink()
        subprocess.run(["bash", "inner.sh"], cwd=repo, env=run_env, check=True, capture_output=True)
        assert (tmp_path / "ge" / "paths").read_text().splitlines() == [outer]


def test_a_payload_env_that_sets_no_pythonpath_leaves_the_checkouts_entries_alone(tmp_path: Path) -> None:
    # lib.sh runs under `set -u`: an unset PYTHONPATH must not stop the call (a CPU dry run's env.sh)
    repo, env = _tree(tmp_path, env_sh="true\n")
    subprocess.run(["bash", "outer.sh"], cwd=repo, env=env, check=True, capture_output=True)
    want = f"{repo}/harness:{repo}/route_env:{repo}/kernels_ext"
    assert (tmp_path / "ge" / "paths").read_text().splitlines() == [want, want]


# ---- the calls without a GPU: bash -n, and DRY_RUN=1 (lib.sh), which prints every qgate command that
# would start an engine, write a checkpoint or read a run's results, and runs the rest (issue 62: the
# TP 2 / TP 4 calls, written while no machine of several GPUs was lent)
CALLS = LIB.parent
CONTRACTS = ROOT / "contracts"
DRY = "DRY_RUN: python3 -m qgate "


def _tp1(dtype: str) -> str:
    """The TP 1 production-shape contract of the dtype, whatever card its name carries."""
    (path,) = (p for p in CONTRACTS.glob(f"qwen38-prodshape-{dtype}*.yaml") if "-tp" not in p.name)
    return f"contracts/{path.name}"


def _call(tmp: Path, script: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a call script from the checkout root (DRY_RUN unless env says otherwise), in a clean env:
    nothing of the caller's TP, DERIVE & co. The qgate commands it printed, in order, without $RUNS."""
    base = {k: os.environ[k] for k in ("HOME", "LANG") if k in os.environ}
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    runs = tmp / "runs"
    full = base | {"PATH": path, "OUT": str(tmp / "out"), "RUNS": str(runs), "DRY_RUN": "1"} | env
    proc = subprocess.run(
        ["bash", str(CALLS / script), *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )
    log = (tmp / "out" / "log.txt").read_text() if (tmp / "out" / "log.txt").exists() else ""
    said = [line[len(DRY) :].replace(str(runs), "RUNS") for line in log.splitlines() if line.startswith(DRY)]
    return proc, list(dict.fromkeys(said))  # a command's line is logged again by the call's tail


def test_every_call_script_parses() -> None:
    scripts = [*sorted(CALLS.glob("*.sh")), CALLS.parent / "prepare.sh"]
    assert len(scripts) > 10
    for script in scripts:
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, (script.name, res.stderr)


@pytest.mark.parametrize(("dtype", "tp"), [("bf16", "2"), ("fp16", "4")])
def test_decide_at_tp_n_runs_its_tp_contract_until_decided_then_compares(
    tmp_path: Path, dtype: str, tp: str
) -> None:
    proc, said = _call(tmp_path, "70-decide.sh", dtype, "6", TP=tp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c, d = f"contracts/qwen38-prodshape-{dtype}-tp{tp}.yaml", f"RUNS/decide-{dtype}-tp{tp}"
    assert said == [
        f"run speed -c {c} -o {d} --until-decided --max-launches 6",  # the audit is run speed's own
        f"compare {d}/speed/control.json {d}/speed/candidate.json -c {c} --force -o {d}/compare",
    ]
    assert f"TP={tp}" in proc.stdout.splitlines()[0]


def test_decide_at_tp1_keeps_the_tp1_contract(tmp_path: Path) -> None:
    proc, said = _call(tmp_path, "70-decide.sh", "bf16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert said[0] == f"run speed -c {_tp1('bf16')} -o RUNS/decide-bf16 --until-decided --max-launches 6"


def test_the_ablation_at_tp4_derives_from_the_tp4_contract_and_leaves_the_tp1_timeline_out(
    tmp_path: Path,
) -> None:
    from qgate.contract import load_contract

    proc, said = _call(
        tmp_path, "50-prod-ablate.sh", "bf16", TP="4", DERIVE="l2 speed.launches=2", TIMELINE=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert said == ["ablate -c RUNS/contract-l2.yaml -o RUNS/ablate-bf16-tp4-l2 --design one-at-a-time"]
    derived = load_contract(tmp_path / "runs" / "contract-l2.yaml").contract
    assert derived.name == "qwen38-prodshape-bf16-tp4-l2" and derived.speed.launches == 2
    assert derived.engine.tensor_parallel_size == 4
    assert "timeline left out: the probe's profiles are of the TP 1 contract's arms" in proc.stdout


def test_the_screen_records_every_ranks_inputs_eagerly_then_screens_every_ranks_slice(tmp_path: Path) -> None:
    from qgate.contract import load_contract

    proc, said = _call(tmp_path, "75-screen.sh", "fp16", TP="4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s, c = "RUNS/screen-fp16-tp4", "contracts/qwen38-prodshape-fp16-tp4.yaml"
    assert said == [
        f"run speed -c {s}/contract-record.yaml -o {s}/record --arm candidate",
        f"run ops -c {c} --real --device cuda -o {s} --force --activations {s}/acts",
    ]
    rec = load_contract(tmp_path / "runs" / "screen-fp16-tp4" / "contract-record.yaml").contract
    # recorded without CUDA graphs (their replays never reach Python), at the contract's TP size
    assert rec.engine.enforce_eager is True and rec.engine.tensor_parallel_size == 4
    assert rec.env_for("candidate")["QGATE_RECORD_DIR"] == str(tmp_path / "runs" / "screen-fp16-tp4" / "acts")
    # RECORD=0: random inputs on every rank's slice, no engine start
    proc, said = _call(tmp_path / "random", "75-screen.sh", "bf16", TP="2", RECORD="0")
    c = "contracts/qwen38-prodshape-bf16-tp2.yaml"
    assert said == [f"run ops -c {c} --real --device cuda -o RUNS/screen-bf16-tp2 --force"]


def test_a_tp_the_contracts_lack_or_a_machine_short_of_gpus_stops_the_call_first(tmp_path: Path) -> None:
    proc, said = _call(tmp_path, "70-decide.sh", "bf16", TP="3")
    assert proc.returncode == 2 and "TP=3: expected 1, 2 or 4" in proc.stdout and not said
    if shutil.which("nvidia-smi"):
        pytest.skip("a machine with GPUs: the count check is the device's")
    for script, args in (("10-install.sh", ["04"]), ("stage.sh", ["01"]), ("70-decide.sh", ["bf16"])):
        proc, _ = _call(tmp_path / script, script, *args, TP="4", DRY_RUN="0")
        assert proc.returncode == 3, (script, proc.stdout + proc.stderr)
        assert "TP=4 needs 4 GPUs; this machine has 0" in proc.stdout


def test_the_production_gate_is_one_demo_command_and_the_zoo_runs_against_its_control(tmp_path: Path) -> None:
    proc, said = _call(tmp_path, "78-demo.sh", "fp16", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    c = _tp1("fp16")
    assert said == [f"demo -c {c} -o RUNS/demo-fp16 --until-decided --max-launches 3 --device cuda"]
    control = tmp_path / "runs" / "demo-fp16" / "speed" / "control.json"
    control.parent.mkdir(parents=True)
    control.write_text("{}")
    proc, said = _call(tmp_path, "77-zoo.sh", "fp16", "top1", ZOO_CONTROL=str(control))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert said[-1].startswith(
        f"compare RUNS/zoo-fp16-top1/speed/control.json RUNS/zoo-fp16-top1/speed/candidate.json -c {c}"
    )
    # a demo folder already there is not run over (a demo cannot resume)
    proc, _ = _call(tmp_path, "78-demo.sh", "fp16", "3")
    assert proc.returncode == 5 and "does not resume" in proc.stdout
