"""Per-item correct rates in the nightly history when the quality run repeats seeds (hand-made results)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from test_history import contract, make_night  # noqa: F401  (the fixture and the night builder)

from qgate import history
from qgate import night as night_mod

SEEDS = [20260828, 20260829, 20260830]


def seeded_quality(arm: str, misses: dict[int, set[int]]) -> dict[str, Any]:
    """16 items x 3 seeds; misses: {seed offset: item indices missed under that seed}."""
    items = []
    for k, seed in enumerate(SEEDS):
        for i in range(8, 24):
            ok = i not in misses.get(k, set())
            items.append(
                {"index": i, "seed": seed, "raw_correct": ok, "strict_correct": ok, "natural_stop": True,
                 "closed_thinking": True, "length_cap": False, "invalid": False, "fffd_count": 0,
                 "longest_token_run": 3, "max_window_repeats": 2}
            )  # fmt: skip
    return {"arm": arm, "seeds": SEEDS, "items": items,
            "quality": {"first_index": 8, "last_index": 23, "sampling": {"seed": SEEDS[0]},
                        "gates": {"min_raw_correct": 14, "min_strict_correct": 14}}}  # fmt: skip


def _reseed(run: Path) -> None:
    """Replace a night's one-seed quality results by 3-seed ones (same contract, fingerprint, night)."""
    for arm, misses in (("control", {1: {20}}), ("candidate", {0: {12}, 1: {12, 20}, 2: {12}})):
        path = run / "quality" / f"{arm}.json"
        res = json.loads(path.read_text())
        res.update(seeded_quality(arm, misses), schema_version=2)
        path.write_text(json.dumps(res))


def test_repeated_seeds_give_per_item_rates_in_rows_and_report(
    tmp_path: Path,
    contract: Path,  # noqa: F811
) -> None:
    run, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    _reseed(run)
    rows = night_mod.collect(run)
    cand = rows[1]
    assert (cand["quality_seeds"], cand["quality_outputs"], cand["quality_scored"]) == (3, 48, 16)
    assert (cand["raw_correct"], cand["natural_stops"]) == (15, 48)  # frozen seed; every output
    rates = json.loads(cand["quality_item_rates"])
    assert rates["12"] == [0, 3] and rates["20"] == [2, 3] and rates["8"] == [3, 3]
    store = tmp_path / "h.sqlite"
    history.append(store, run)
    text = Path(history.write_report(store, tmp_path / "rep")["report"]).read_text()
    assert "## Per-item correct rates (nights with repeated seeds)" in text
    assert "| 2026-12-01 | `aaaaaaaaaaaa` | 3 | 20 2/3 | 12 0/3, 20 2/3 |" in text
    assert "stops 48/48" in text


def test_a_version_1_store_is_read_and_upgraded_on_append(
    tmp_path: Path,
    contract: Path,  # noqa: F811
) -> None:
    store = tmp_path / "h.sqlite"
    run1, _ = make_night(tmp_path, contract, "2026-12-01", "a" * 40, misses=1)
    history.append(store, run1)
    conn = sqlite3.connect(store)  # make it what schema 1 wrote: no V2 (or later) columns
    for col in (*history.V2_COLUMNS, *history.V3_COLUMNS, *history.V4_COLUMNS):
        conn.execute(f"ALTER TABLE nights DROP COLUMN {col}")
    conn.execute("UPDATE qgate_history SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    old = history.read_rows(store)
    assert len(old) == 2 and old[1]["quality_item_rates"] is None and old[1]["raw_correct"] == 15
    assert history.append(store, run1).status == "already recorded"  # one seed hashes as in schema 1
    run2, _ = make_night(tmp_path, contract, "2026-12-02", "b" * 40, misses=1)
    _reseed(run2)
    assert history.append(store, run2).status == "appended"
    rows = history.read_rows(store)
    assert [r["quality_seeds"] for r in rows] == [None, None, 3, 3]
    conn = sqlite3.connect(store)
    version = conn.execute("SELECT value FROM qgate_history WHERE key = 'schema_version'").fetchone()
    assert version == (str(history.HISTORY_SCHEMA_VERSION),)
    conn.close()
