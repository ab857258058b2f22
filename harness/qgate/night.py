"""Collecting one night: the rows of the history from a night's run directory (what the nightly
workflow leaves); qgate.history is the store they are appended to.

`collect(result_dir)` reads:

    RESULT_DIR/speed/<arm>.json       speed results (qgate run speed --out RESULT_DIR)
    RESULT_DIR/quality/<arm>.json     quality results (qgate run quality --out RESULT_DIR)
    RESULT_DIR/verdict.json and RESULT_DIR/*/verdict.json   the verdicts of `qgate compare`

and returns one row per arm found: contract names + sha256, commit, night, decode tok/s (mean, min and
every rep, with 2+ launches the launch of every rep: qgate.speed.figures.arm_figures), quality counts
(raw/strict correct and accuracy over the selected items, health counts), the gate lines the trend
report draws, and the night's verdict (the worst of the verdicts found: ERROR > FAIL > INCONCLUSIVE >
PASS; each kind's verdict and reasons are kept too).
COLUMNS is the row (and the store's table); content_sha256 is a night's idempotency key.
"""

from __future__ import annotations

import hashlib
import json
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from qgate import records
from qgate.errors import QgateError, cut
from qgate.gate import VERDICT_RANK
from qgate.quality.record import check_quality_result
from qgate.records.verdict import Inputs, Verdict
from qgate.results import ResultError, load_result, read_result
from qgate.speed.figures import arm_figures
from qgate.speed.record import check_speed_result

ARMS = ("control", "candidate")
KINDS = ("speed", "quality")

# (column, SQL type); the order is the table's and the row dict's.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("night", "TEXT NOT NULL"),
    ("arm", "TEXT NOT NULL"),
    ("commit_sha", "TEXT NOT NULL"),
    ("appended_at", "TEXT NOT NULL"),
    ("source", "TEXT"),
    ("speed_contract", "TEXT"),
    ("speed_contract_sha256", "TEXT"),
    ("quality_contract", "TEXT"),
    ("quality_contract_sha256", "TEXT"),
    ("decode_reps", "INTEGER"),
    ("decode_tok_s_mean", "REAL"),
    ("decode_tok_s_min", "REAL"),
    ("decode_tok_s_reps", "TEXT"),  # JSON list, every rep in index order
    ("tpot_ms_mean", "REAL"),
    ("ttft_ms_median", "REAL"),
    ("speed_complete", "INTEGER"),
    ("gate_min_decode_tok_s", "REAL"),
    ("quality_selected", "INTEGER"),
    ("quality_scored", "INTEGER"),
    ("raw_correct", "INTEGER"),
    ("strict_correct", "INTEGER"),
    ("raw_accuracy", "REAL"),
    ("strict_accuracy", "REAL"),
    ("natural_stops", "INTEGER"),
    ("closed_thinking", "INTEGER"),
    ("length_caps", "INTEGER"),
    ("invalid_outputs", "INTEGER"),
    ("fffd_chars", "INTEGER"),
    ("max_token_run", "INTEGER"),
    ("max_window_repeats", "INTEGER"),
    ("quality_complete", "INTEGER"),
    ("gate_min_raw_correct", "INTEGER"),
    ("gate_min_strict_correct", "INTEGER"),
    ("verdict", "TEXT"),
    ("verdicts", "TEXT"),  # JSON {kind: {verdict, reasons, contract_sha256}}
    ("fingerprint", "TEXT"),  # JSON {gpu, driver, torch, vllm, qgate, hostname, cpu, cpu_count, memory_gib}
    ("content_sha256", "TEXT NOT NULL"),
    # schema 2, last: an upgraded version-1 store gets them appended (ALTER TABLE ADD COLUMN)
    ("quality_seeds", "INTEGER"),
    ("quality_outputs", "INTEGER"),
    ("quality_item_rates", "TEXT"),  # JSON {index: [correct, runs]} (raw and strict right); 2+ seeds only
    # schema 3, last: JSON list, the launch of every rep of decode_tok_s_reps; 2+ launches only
    ("decode_launch_ids", "TEXT"),
    # schema 4, last: the speed run's prompt seed (drawn when the run started unless the contract pinned
    # it: MLPerf's TEST05) and whether it was pinned (1) or drawn (0)
    ("prompt_seed", "INTEGER"),
    ("prompt_seed_pinned", "INTEGER"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
# Columns added by schema 2 (absent from a version-1 store) and 3; unset schema-2 ones and the schema-3
# one stay out of content_sha256, so a night hashes as it did under schema 1.
V2_COLUMNS = ("quality_seeds", "quality_outputs", "quality_item_rates")
V3_COLUMNS = ("decode_launch_ids",)
V4_COLUMNS = ("prompt_seed", "prompt_seed_pinned")
ADDED_COLUMNS = V2_COLUMNS + V3_COLUMNS + V4_COLUMNS
V1_COLUMN_NAMES = tuple(name for name in COLUMN_NAMES if name not in ADDED_COLUMNS)
V2_COLUMN_NAMES = tuple(name for name in COLUMN_NAMES if name not in V3_COLUMNS + V4_COLUMNS)
# Not part of a night's content: where and when it was appended.
_NOT_CONTENT = ("appended_at", "source", "content_sha256")
_FINGERPRINT_KEYS = (
    "gpu", "driver", "torch", "vllm", "qgate", "hostname", "cpu", "cpu_count", "memory_gib", "git_sha"
)  # fmt: skip
# The machine's CPU model, count and memory: kept since 2026-12 (qgate.launch_cv's runner key: one
# hostname may name two machines), left out of content_sha256 so that a night recorded before is
# "already recorded" when it is appended again.
_FINGERPRINT_NOT_CONTENT = ("cpu", "cpu_count", "memory_gib")
_CHECKS = {"speed": check_speed_result, "quality": check_quality_result}


class HistoryError(QgateError):
    """A store or result directory that cannot be used; str() is one line for the user."""


def _num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and value == value else None  # NaN -> None


def speed_figures(result: dict[str, Any]) -> dict[str, Any]:
    """Decode figures of one speed result (qgate.speed.figures.arm_figures, reps in index order): a rep
    without a finite number is None in the list and makes the figures over it None."""
    reps = sorted(result.get("reps") or [], key=lambda r: r.get("index", 0))
    figs = arm_figures({**result, "reps": reps})
    several = len({json.dumps(x) for x in figs["launch_ids"]}) > 1
    return {
        "speed_contract": (result.get("contract") or {}).get("name"),
        "speed_contract_sha256": (result.get("contract") or {}).get("sha256"),
        "decode_reps": figs["reps"],
        "decode_tok_s_mean": figs["decode_tok_s_mean"],
        "decode_tok_s_min": figs["decode_tok_s_min"],
        "decode_tok_s_reps": json.dumps(figs["decode_tok_s"]),
        "tpot_ms_mean": figs["tpot_ms_mean"],
        "ttft_ms_median": figs["ttft_ms_median"],
        "speed_complete": int(result.get("complete") is True),
        "decode_launch_ids": json.dumps(figs["launch_ids"]) if several else None,
        **_prompt_seed(result),
    }


def _prompt_seed(result: dict[str, Any]) -> dict[str, Any]:
    """The run's prompt seed and whether the contract pinned it (a schema-1 result: the contract's
    seed, always pinned then)."""
    prompt = sub if isinstance(sub := result.get("prompt"), dict) else {}
    seed = prompt.get("seed")
    ok = isinstance(seed, int) and not isinstance(seed, bool)
    pinned = prompt.get("seed_pinned", True if ok else None)
    return {
        "prompt_seed": seed if ok else None,
        "prompt_seed_pinned": None if pinned is None else int(pinned is True),
    }


def quality_figures(result: dict[str, Any]) -> dict[str, Any]:
    """Quality counts recomputed from the per-item records (the raw data, not a summary).

    Accuracy is over the items the contract selects, on the frozen seed's run (the contract's
    sampling.seed): an item that was never scored counts as a miss. Health counts are over every
    output of every seed. With two or more seeds, per-item correct rates (raw and strict right).
    """
    items = result.get("items") or []
    section = result.get("quality") or {}
    gates = section.get("gates") or {}
    first, last = section.get("first_index"), section.get("last_index")
    selected = last - first + 1 if isinstance(first, int) and isinstance(last, int) else len(items)
    seeds = [int(x) for x in result.get("seeds") or []]
    frozen = seeds[0] if seeds else (section.get("sampling") or {}).get("seed")
    scored = [it for it in items if it.get("seed", frozen) == frozen]
    rates: dict[str, list[int]] = {}
    for it in items:
        rate = rates.setdefault(str(it.get("index")), [0, 0])
        rate[0] += int(it.get("raw_correct") is True and it.get("strict_correct") is True)
        rate[1] += 1

    def count(key: str, rows: list[dict[str, Any]] = items) -> int:
        return sum(1 for it in rows if it.get(key) is True)

    def worst(key: str) -> int | None:
        values = [it[key] for it in items if isinstance(it.get(key), int)]
        return max(values) if values else None

    raw, strict = count("raw_correct", scored), count("strict_correct", scored)
    several = len(seeds) > 1
    return {
        "quality_contract": (result.get("contract") or {}).get("name"),
        "quality_contract_sha256": (result.get("contract") or {}).get("sha256"),
        "quality_selected": selected,
        "quality_scored": len(scored),
        "raw_correct": raw,
        "strict_correct": strict,
        "raw_accuracy": raw / selected if selected else None,
        "strict_accuracy": strict / selected if selected else None,
        "natural_stops": count("natural_stop"),
        "closed_thinking": count("closed_thinking"),
        "length_caps": count("length_cap"),
        "invalid_outputs": count("invalid"),
        "fffd_chars": sum(int(it.get("fffd_count") or 0) for it in items),
        "max_token_run": worst("longest_token_run"),
        "max_window_repeats": worst("max_window_repeats"),
        "quality_complete": int(result.get("complete") is True),
        "gate_min_raw_correct": gates.get("min_raw_correct"),
        "gate_min_strict_correct": gates.get("min_strict_correct"),
        "quality_seeds": len(seeds) if several else None,
        "quality_outputs": len(items) if several else None,
        "quality_item_rates": json.dumps(rates, sort_keys=True) if several else None,
    }


def _load_results(result_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{kind: {arm: result}} for every DIR/<kind>/<arm>.json present."""
    return {
        kind: {arm: read[0] for arm, read in arms.items()} for kind, arms in _read_results(result_dir).items()
    }


def _read_results(result_dir: Path) -> dict[str, dict[str, tuple[dict[str, Any], str]]]:
    """{kind: {arm: (result, sha256 of its file)}} for every DIR/<kind>/<arm>.json present, each checked
    as compare checks it (qgate.speed.record, qgate.quality.record): a night is stored from what a
    compare could have judged, never from a record it would refuse."""
    found: dict[str, dict[str, tuple[dict[str, Any], str]]] = {}
    for kind in KINDS:
        for arm in ARMS:
            path = result_dir / kind / f"{arm}.json"
            if path.exists() or path.is_symlink():  # read_result refuses what is not a regular file
                try:
                    read = read_result(path, kind)
                    _CHECKS[kind](read.data, str(path))
                except ResultError as exc:
                    raise HistoryError(str(exc)) from None
                found.setdefault(kind, {})[arm] = (read.data, read.sha256)
    return found


def load_verdicts(result_dir: Path) -> dict[str, dict[str, Any]]:
    """{kind: {verdict, reasons, contract_sha256, path}} from RESULT_DIR/verdict.json and */verdict.json."""
    out: dict[str, dict[str, Any]] = {}
    for path in [result_dir / "verdict.json", *sorted(result_dir.glob("*/verdict.json"))]:
        if not (path.exists() or path.is_symlink()):  # a FIFO or folder named verdict.json: refused
            continue
        try:
            record = load_result(path, "verdict")
        except ResultError as exc:
            raise HistoryError(str(exc)) from None
        if record.get("verdict") not in VERDICT_RANK:
            raise HistoryError(
                f"{path}: verdict = {record.get('verdict')!r}: expected PASS, FAIL, INCONCLUSIVE or ERROR"
            )
        for key, want in (("kinds", list), ("reasons", list), ("contract", dict), ("figures", dict)):
            if record.get(key) is not None and not isinstance(record[key], want):
                raise HistoryError(f"{path}: {key} = {cut(repr(record[key]))}: expected a {want.__name__}")
        kinds = record.get("kinds") or []
        if not all(isinstance(k, str) for k in kinds):
            raise HistoryError(f"{path}: kinds = {cut(repr(kinds))}: expected a list of result kinds")
        try:  # then the typed model (qgate.records.verdict), in the same one line
            verdict = records.parse(Verdict, record, str(path))
        except ResultError as exc:
            raise HistoryError(str(exc)) from None
        for kind in verdict.kinds:
            if kind in out:
                raise HistoryError(f"{path}: a second verdict for {kind} (first: {out[kind]['path']})")
            out[kind] = {
                "verdict": verdict.verdict,
                "reasons": list(verdict.reasons),
                "contract_sha256": verdict.contract.sha256,
                "min_decode_tok_s": (verdict.figures or {}).get("min_decode_tok_s"),
                "path": str(path),
                "judged": _judged(getattr(verdict.inputs, kind, None), path, verdict.schema_version),
            }
    return out


def _judged(inputs: Inputs | None, path: Path, version: int) -> dict[str, str] | None:
    """{arm: sha256} of the result files a verdict judged (verdict schema 3); None for an older verdict,
    which did not record them (read as it is: it cannot be checked)."""
    if version < 3:
        return None
    shas = {arm: getattr(inputs, f"{arm}_sha256") for arm in ARMS} if inputs is not None else {}
    if not all(isinstance(v, str) for v in shas.values()) or not shas:
        raise HistoryError(
            f"{path}: a verdict of schema {version} without the sha256 of the results it judged"
        )
    return shas


def _check_unchanged(
    read: dict[str, dict[str, tuple[dict[str, Any], str]]], verdicts: dict[str, dict[str, Any]]
) -> None:
    """A night's results must be the files its verdicts judged: a result edited after its compare (a rep
    added, a figure changed) would be stored under a verdict it never had."""
    for kind, v in verdicts.items():
        if v["judged"] is None:
            continue
        for arm, (_, sha) in read.get(kind, {}).items():
            if sha != v["judged"].get(arm):
                raise HistoryError(
                    f"{v['path']}: {kind}/{arm}.json changed after its compare (sha256 {sha[:12]}, the "
                    f"verdict judged {str(v['judged'].get(arm))[:12]}): run `qgate compare` again; nothing "
                    "was changed"
                )


def _night_of(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The UTC date of the first engine start among the results (today when none is recorded)."""
    starts = [
        str(launch["started_at"])
        for arms in results.values()
        for res in arms.values()
        for launch in res.get("launches") or []
        if isinstance(launch, dict) and launch.get("started_at")
    ]
    for stamp in sorted(starts):
        try:
            return datetime.fromisoformat(stamp).astimezone(timezone.utc).date().isoformat()
        except ValueError:
            continue
    return datetime.now(timezone.utc).date().isoformat()


def check_night(night: str) -> str:
    try:
        if len(night) != 10:
            raise ValueError(night)
        return date.fromisoformat(night).isoformat()
    except ValueError:
        raise HistoryError(f"--night = {night!r}: expected a date YYYY-MM-DD") from None


def _commit_of(results: dict[str, dict[str, dict[str, Any]]], given: str | None, where: Path) -> str:
    """The night's commit: the one given (it must be one the results record, when they record any),
    else the one git SHA all the results record. Each row's fingerprint keeps what its results recorded."""
    recorded = sorted(
        {
            str(res["fingerprint"]["git_sha"])
            for arms in results.values()
            for res in arms.values()
            if isinstance(res.get("fingerprint"), dict) and res["fingerprint"].get("git_sha")
        }
    )
    if given is not None:
        given = given.strip()
        if not given:
            raise HistoryError("--commit = '': expected a git commit SHA")
        if recorded and not any(r.startswith(given) or given.startswith(r) for r in recorded):
            raise HistoryError(f"--commit = {given!r}: the results record git_sha {', '.join(recorded)}")
        return given
    if len(recorded) > 1:
        raise HistoryError(
            f"{where}: the results were made at different commits ({', '.join(recorded)}): "
            "pass --commit SHA to name the night's commit"
        )
    if not recorded:
        raise HistoryError(f"{where}: the results record no fingerprint.git_sha: pass --commit SHA")
    return recorded[0]


def _check_verdict_contracts(
    results: dict[str, dict[str, dict[str, Any]]], verdicts: dict[str, dict[str, Any]]
) -> None:
    """A verdict must be of these results: same contract sha256 as the results of its kind."""
    for kind, v in verdicts.items():
        for arm, res in results.get(kind, {}).items():
            sha = (res.get("contract") or {}).get("sha256")
            if v["contract_sha256"] != sha:
                raise HistoryError(
                    f"{v['path']}: verdict for contract sha256 {str(v['contract_sha256'])[:12]}, but "
                    f"{kind}/{arm}.json was run under {str(sha)[:12]}: not the verdict of these results"
                )


def _fingerprint(arm_results: dict[str, dict[str, Any]]) -> str:
    """The arm's machine and versions (from its first result), and every result's recorded git SHA."""
    fps = {kind: fp for kind, res in arm_results.items() if isinstance(fp := res.get("fingerprint"), dict)}
    if not fps:
        return json.dumps(None)
    first = next(iter(fps.values()))
    out: dict[str, Any] = {k: first.get(k) for k in _FINGERPRINT_KEYS if k != "git_sha"}
    out["git_sha"] = {kind: fp.get("git_sha") for kind, fp in fps.items()}
    return json.dumps(out, sort_keys=True)


def content_sha256(row: dict[str, Any]) -> str:
    """Hash of what a night says (not where or when it was appended): the idempotency key. The launch
    ids (schema 3) and the prompt seed (schema 4) are left out: they come from the same result files as
    the reps, and a night recorded before them must still be appended again as "already recorded"."""
    later = V3_COLUMNS + V4_COLUMNS
    content = {
        k: row.get(k)
        for k in COLUMN_NAMES
        if k not in _NOT_CONTENT and k not in later and not (k in V2_COLUMNS and row.get(k) is None)
    }
    if isinstance(text := content.get("fingerprint"), str):
        fp = json.loads(text)
        if isinstance(fp, dict):
            kept = {k: v for k, v in fp.items() if k not in _FINGERPRINT_NOT_CONTENT}
            content["fingerprint"] = json.dumps(kept, sort_keys=True)
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def unjudged_kinds(result_dir: str | Path) -> list[str]:
    """The result kinds in a night's directory that no verdict.json judges (compare has not run)."""
    where = Path(result_dir)
    return sorted(set(_load_results(where)) - set(load_verdicts(where)))


def collect(
    result_dir: str | Path, night: str | None = None, commit: str | None = None
) -> list[dict[str, Any]]:
    """The rows of one night, one per arm with a speed or quality result, in control/candidate order."""
    where = Path(result_dir)
    if not where.is_dir():
        raise HistoryError(f"{where}: no such result directory")
    read = _read_results(where)
    results = {kind: {arm: r[0] for arm, r in arms.items()} for kind, arms in read.items()}
    if not results:
        raise HistoryError(f"{where}: holds no speed/<arm>.json or quality/<arm>.json")
    verdicts = load_verdicts(where)
    _check_verdict_contracts(results, verdicts)
    _check_unchanged(read, verdicts)
    the_night = check_night(night) if night is not None else _night_of(results)
    the_commit = _commit_of(results, commit, where)
    worst = max((v["verdict"] for v in verdicts.values()), key=VERDICT_RANK.__getitem__, default=None)
    kept = {k: {x: v[x] for x in ("verdict", "reasons", "contract_sha256")} for k, v in verdicts.items()}
    gate = (verdicts.get("speed") or {}).get("min_decode_tok_s")
    rows = []
    for arm in ARMS:
        arm_results = {kind: results[kind][arm] for kind in KINDS if arm in results.get(kind, {})}
        if not arm_results:
            continue
        row: dict[str, Any] = dict.fromkeys(COLUMN_NAMES)
        row.update(night=the_night, arm=arm, commit_sha=the_commit, source=str(where.resolve()))
        if "speed" in arm_results:
            row.update(speed_figures(arm_results["speed"]), gate_min_decode_tok_s=_num(gate))
        if "quality" in arm_results:
            row.update(quality_figures(arm_results["quality"]))
        row.update(verdict=worst, verdicts=json.dumps(kept, sort_keys=True))
        row["fingerprint"] = _fingerprint(arm_results)
        row["content_sha256"] = content_sha256(row)
        rows.append(row)
    return rows
