"""The device call scripts' shared library (tools/gpu_engine/calls/lib.sh) on the CPU: a call script
that another one runs gives qgate the same PYTHONPATH as when it runs alone. On 2026-12-05 10-install.sh
ran 70-decide.sh, which sourced the payload's env.sh a second time; PYTHONPATH held every entry twice,
and the next call's `qgate run speed --resume` was refused (the environment changed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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
