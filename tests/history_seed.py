"""A seeded nightly history for the published site's tests: run folders as the nightly leaves them, judged
by qgate's own verdict (compare.build_verdict: the gates and the decision; the report's PNG, which
costs ~0.8 s a night, is not drawn) and appended through qgate.history.append, the real path.

Two fleet entries (two contracts; the first's name holds markup, the second has speed only), 32 nights
each from SEED_START, on runner bench-1 then, from night RUNNER_CHANGE, on bench-2 (another host and
CPU, faster): 2 contracts x 2 runners. Entry "alpha" has a FAIL night (FAIL_NIGHT: the candidate slowed
below the margin), a control drift night (DRIFT_NIGHT) and a lost night (LOST_NIGHT: no folder, no
record); entry "beta" one INCONCLUSIVE-prone night of noise. Numbers are seeded, never measured.
"""

from __future__ import annotations

import json
import shutil
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from golden import support
from test_history import quality_result, quality_verdict

from qgate import history
from qgate.compare import build_verdict, load_pairs
from qgate.contract import LoadedContract, load_contract
from qgate.results import atomic_write_json, utc_now

SEED_START = date(2026, 11, 1)
NIGHTS = 30  # calendar days per entry
RUNNER_CHANGE = 17  # the night index from which the entries run on bench-2
FAIL_NIGHT = "2026-11-24"  # entry alpha: the candidate slowed to a ratio ~0.86
DRIFT_NIGHT = "2026-11-09"  # entry alpha: both arms 8 % slower (the runner, not the code)
LOST_NIGHT = "2026-11-12"  # entry alpha: the entry did not finish, nothing recorded
ALPHA_NAME = "alpha <script>alert('x')</script> & co"
BETA_NAME = "beta-decode"
RUNNERS = (
    {"hostname": "bench-1", "cpu": "Example CPU @ 2.0GHz", "cpu_count": "2"},
    {"hostname": "bench-2", "cpu": "Other CPU @ 3.1GHz", "cpu_count": "8"},
)


def write_contract(path: Path, name: str) -> Path:
    """The golden fixture contract under another name: no improvement asked, a 5 % margin, a floor of 30
    tok/s, a small bootstrap (the verdict's significance tests, not its Welch-t bound, use it)."""
    text = support.FIXTURE_CONTRACT.read_text(encoding="utf-8")
    text = text.replace("name: golden-speed", f"name: {json.dumps(name)}")
    text = text.replace("    min_decode_improvement_pct: 5\n", "").replace(
        "min_decode_tok_s: 55", "min_decode_tok_s: 30"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "    bootstrap_resamples: 200\n", encoding="utf-8")
    return path


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def judge(run: Path, contract: LoadedContract) -> str:
    """The speed verdict of a night's folder, as `qgate compare` decides it, into compare-speed/."""
    pairs, one_sided = load_pairs(run / "speed" / "control.json", run / "speed" / "candidate.json")
    record = build_verdict(pairs, one_sided, contract, None, None)
    atomic_write_json(run / "compare-speed" / "verdict.json", {**record, "created_at": utc_now()})
    return str(record["verdict"])


def _night_results(
    contract: LoadedContract,
    night: str,
    commit: str,
    runner: dict[str, str],
    scales: tuple[float, float],
    noise: Any,
) -> list[tuple[str, dict[str, Any]]]:
    control, candidate = support.load_pair()
    out = []
    for (arm, res), scale in zip((("control", control), ("candidate", candidate)), scales, strict=True):
        res["contract"].update(name=contract.contract.name, sha256=contract.sha256, path=contract.path)
        res["fingerprint"].update(runner, git_sha=commit)
        for launch in res["launches"]:
            launch["started_at"] = f"{night}T02:00:00+00:00"
        for i, rep in enumerate(res["reps"]):
            rep["started_at"] = f"{night}T02:01:{i:02d}+00:00"
            rep["decode_tok_s"] = round(rep["decode_tok_s"] * scale * float(noise[i]), 3)
            rep["tpot_ms"] = 1000.0 / rep["decode_tok_s"]
        out.append((arm, res))
    return out


def make_entry(
    root: Path, store: Path, entry: str, name: str, with_quality: bool, seed: int, incidents: bool = False
) -> list[str]:
    """The entry's nights appended to its history in the store; returns each night's verdict.
    incidents: the FAIL, drift and lost nights happen to this entry."""
    contract = load_contract(write_contract(root / f"{entry}.yaml", name))
    rng = np.random.default_rng(seed)
    verdicts = []
    for k in range(NIGHTS):
        night = (SEED_START + timedelta(days=k)).isoformat()
        level = 1.0 + 0.02 * np.sin(k / 3.0)  # the runner's slow wander
        runner = RUNNERS[int(k >= RUNNER_CHANGE)]
        speed = 1.35 if k >= RUNNER_CHANGE else 1.0
        cand = 0.72 if (incidents and night == FAIL_NIGHT) else 1.0 + 0.01 * rng.standard_normal()
        drift = 0.92 if (incidents and night == DRIFT_NIGHT) else 1.0
        noise = 1.0 + 0.004 * rng.standard_normal(20)
        if incidents and night == LOST_NIGHT:
            continue
        run = root / entry / night
        commit = f"{k + 1:02d}{entry}".ljust(40, "c")
        results = _night_results(
            contract, night, commit, runner, (level * speed * drift, level * speed * drift * cand), noise
        )
        for arm, res in results:
            _write(run / "speed" / f"{arm}.json", res)
        verdict = judge(run, contract)
        if with_quality:
            misses = 5 if night == FAIL_NIGHT else 1 + k % 2
            for arm, m in (("control", 1), ("candidate", misses)):
                q = quality_result(arm, night, commit, m)
                q["fingerprint"].update(runner)
                _write(run / "quality" / f"{arm}.json", q)
            _write(
                run / "compare-quality" / "verdict.json", quality_verdict("PASS" if misses <= 2 else "FAIL")
            )
        history.append(store, run, entry=entry)
        verdicts.append(verdict)
    return verdicts


def seed_store(root: Path) -> dict[str, Any]:
    """The store at ROOT/history.sqlite with entries alpha and beta; {store, entries, verdicts}."""
    shutil.rmtree(root / "runs", ignore_errors=True)
    for old in root.glob("history*.sqlite"):  # a store is append-only: a fresh seed starts a fresh one
        old.unlink()
    store = root / "history.sqlite"
    verdicts = {
        "alpha": make_entry(root / "runs", store, "alpha", ALPHA_NAME, True, 1, incidents=True),
        "beta": make_entry(root / "runs", store, "beta", BETA_NAME, False, 2),
    }
    return {"store": store, "entries": ["alpha", "beta"], "verdicts": verdicts, "contracts": root / "runs"}
