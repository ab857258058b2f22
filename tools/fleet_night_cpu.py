"""One fleet night simulated on the CPU: three entries as parallel processes, then the gather step.

What .github/workflows/fleet.yml does, on this machine: a fleet list of three entries (the smoke
contract on the tiny model, shrunk as the tests shrink it, each with its own output length and runner
label), each entry run as its own process (`qgate fleet contracts`, `qgate run speed`, `qgate compare
--junit --bmf`: the entry job's steps), the run folders laid out as download-artifact lays them, then
`qgate fleet gather` appending the three nights to a Postgres store started here (pgserver, no root)
and writing the night's report. Prints each step's outcome and the report.

    flock /tmp/qgate-engine.lock python tools/fleet_night_cpu.py [--keep DIR] [--kill ENTRY ...]

--kill ENTRY: that entry's job is killed (SIGKILL to its process group) once its first rep is on disk,
as a runner lost mid-run: its artifact is the partial run folder. The night must then say so: gather
exits 3, fleet.md's first lines and junit.xml's "qgate fleet entries" suite name the entry (checked
here; the tool exits 1 when they do not).

Engine runs: run it under the shared engine lock, from a checkout nobody commits to meanwhile (the
results record its HEAD: a commit made while it runs gives the arms two commits, which the history
refuses to guess between). Not part of the test suite (three engine runs, ~3.5 min on 2 cores);
tests/test_fleet.py tests the gather step on run folders the suite makes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ENTRIES = {"tiny-out48": 48, "tiny-out64": 64, "tiny-out32": 32}  # entry -> output_tokens
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}


def contracts_and_fleet(root: Path) -> Path:
    """ROOT/contracts/<entry>.yaml and ROOT/fleet.yaml (contract paths relative to ROOT)."""
    (root / "contracts").mkdir(parents=True)
    entries = []
    for name, out_tokens in ENTRIES.items():
        data = yaml.safe_load((REPO / "contracts" / "smoke-cpu.yaml").read_text())
        data["name"] = f"smoke-cpu-{name}"
        small = {
            "input_tokens": 256,
            "output_tokens": out_tokens,
            "warmup": 1,
            "repetitions": 4,
            "launches": 1,
        }
        data["speed"].update(small)
        for arm in ("control", "candidate"):
            data["arms"][arm]["env"].update(IN_PROCESS_ENGINE)
        (root / "contracts" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        entries.append(
            {
                "name": name,
                "runs-on": ["self-hosted", "cpu", name],
                "speed_contract": f"contracts/{name}.yaml",
            }
        )
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"schema_version": 1, "entries": entries}, sort_keys=False))
    return fleet


def entry_script(name: str) -> str:
    """The entry job's steps (fleet.yml), as one shell script run in ROOT."""
    run = f"runs/{name}"
    return f"""set -euo pipefail
eval "$(qgate fleet contracts fleet.yaml --entry {name} --out {run}/contracts | sed 's/^/export /')"
qgate run speed --contract "$SPEED_CONTRACT" --out {run}
status=0
qgate compare {run}/speed/control.json {run}/speed/candidate.json --contract "$SPEED_CONTRACT" \\
  --out {run}/compare-speed --junit {run}/compare-speed/junit.xml --bmf {run}/compare-speed/benchmark.json \\
  || status=$?
echo "compare exit $status"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temporary dir)")
    parser.add_argument(
        "--kill", action="append", default=[], choices=list(ENTRIES), help="kill this entry mid-run"
    )
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="qgate-fleet-night-"))
    root.mkdir(parents=True, exist_ok=True)
    # qgate of this interpreter's environment first on PATH (the entry jobs' venv)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    fleet = contracts_and_fleet(root)
    subprocess.run(["qgate", "fleet", "check", str(fleet.name)], cwd=root, env=env, check=True)
    t0 = time.monotonic()
    procs = {}
    for name in ENTRIES:  # the matrix: every entry at once, each its own process
        log = open(root / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        procs[name] = (
            subprocess.Popen(
                ["bash", "-c", entry_script(name)], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: --kill ends the whole job, engine too
            ),
            log,
        )  # fmt: skip
    for name in args.kill:
        kill_after_first_rep(root / "runs" / name, procs[name][0])
    for name, (proc, log) in procs.items():
        proc.wait()
        log.close()
        tail = (root / f"{name}.log").read_text().strip().splitlines()[-3:]
        print(f"entry {name}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s: {' | '.join(tail)}")
    artifacts = root / "artifacts"  # what download-artifact lays out: one folder per artifact
    for name in ENTRIES:
        shutil.copytree(root / "runs" / name, artifacts / f"qgate-entry-{name}")
    import pgserver

    server = pgserver.get_server(root / "pgdata", cleanup_mode="stop")
    url = server.get_uri("postgres")
    # As the workflow's gather: the night's commit named (the results record the checkout's HEAD).
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    try:
        gather = subprocess.run(
            ["qgate", "fleet", "gather", "fleet.yaml", "artifacts", "--out", "report", "--store", url,
             "--commit", head.stdout.strip()],
            cwd=root, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        print(f"gather: exit {gather.returncode}\n{gather.stdout}{gather.stderr}")
        from qgate import history

        print("rows in the store:")
        for name in ENTRIES:
            try:
                rows = history.read_rows(url, entry=name)
            except history.HistoryError as exc:  # a killed entry's history was never made
                print(name, f"none: {exc}")
                continue
            print(
                name, [(r["night"], r["arm"], r["verdict"], round(r["decode_tok_s_mean"], 1)) for r in rows]
            )
        print((root / "report" / "fleet.md").read_text())
        ok = check_lost(root / "report", gather.returncode, args.kill)
    finally:
        server.cleanup()
    print(f"work dir: {root}")
    return 0 if ok else 1


def kill_after_first_rep(run: Path, proc: subprocess.Popen) -> None:
    """SIGKILL the entry's process group once a rep of it is on disk (or its job ended first)."""
    while proc.poll() is None:
        for arm in ("control", "candidate"):
            try:
                reps = json.loads((run / "speed" / f"{arm}.json").read_text())["reps"]
            except (OSError, ValueError, KeyError):
                continue
            if reps:
                os.killpg(proc.pid, signal.SIGKILL)
                print(f"killed entry {run.name} with {len(reps)} {arm} rep(s) on disk")
                return
        time.sleep(0.5)


def check_lost(report: Path, code: int, killed: list[str]) -> bool:
    """The night says what it lost: gather's exit code, fleet.md's first lines, junit.xml's entries."""
    import xml.etree.ElementTree as ET

    text = (report / "fleet.md").read_text()
    suite = ET.parse(report / "junit.xml").getroot().find("testsuite[@name='qgate fleet entries']")
    errors = {
        c.get("name").removesuffix(" finished")
        for c in suite.findall("testcase")
        if c.find("error") is not None
    }
    head = "\n".join(text.splitlines()[: 3 + len(killed)])
    ok = code == (3 if killed else 0) and errors == set(killed) and all(f"- {n}: " in head for n in killed)
    print(f"lost entries: exit {code}, junit errors {sorted(errors)}, fleet.md head names them: {ok}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
