"""`qgate compare`: two results -> one verdict record (+ report files). Core only: no Typer, no printing.

CONTROL and CANDIDATE are each a result file or a run directory. A run directory DIR stands for
DIR/<kind>/control.json when given as CONTROL and DIR/<kind>/candidate.json when given as CANDIDATE,
for every kind qgate knows (speed, quality) that is present. A file is taken as it is (so two runs of
one arm can be compared: an A/A test).

Each kind present in both is compared by its comparer (`comparers()`, the one registry; one signature:
control, candidate, loaded contract -> section with qgate.gate.Gate gates:
`qgate.speed.compare.compare_speed`, `qgate.quality.compare.compare_quality`); `build_verdict` runs the
checks every kind shares (qgate.comparable: refuse to compare, route attestation) once per kind, and
the gates of all kinds make one verdict by qgate.gate.decide. The verdict record carries every figure
the report shows, so the report can be rendered again from verdict.json alone.

With a decode-step timeline (`--timeline DIR`: qgate.timeline.read_timeline, read by the caller), the
record carries it under `timeline`, its profiles matched with the two arms (match_arms); it is no
gate: the verdict and the gates are those of the same results without it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qgate.comparable import attestation, code_env_gate, comparable_gate, differences, notes
from qgate.contract import ContractError, LoadedContract, load_contract
from qgate.contract.aa import arm_meaning
from qgate.errors import cut
from qgate.gate import SEV_ERROR, Gate, decide, gate_name
from qgate.quality.compare import compare_quality
from qgate.quality.record import check_quality_result
from qgate.redact import redact_url
from qgate.results import (
    ResultError,
    Staged,
    current_schema,
    file_mode,
    load_result,
    read_result,
    utc_now,
)
from qgate.speed.compare import SPEED_EXTRA_KEYS, compare_speed
from qgate.speed.record import check_speed_result
from qgate.timeline import match_arms, thaw
from qgate_route_env import SwitchError, routes_on

COMPUTED = gate_name(
    "{kind} comparison computed", __name__, "ERROR",
    "a result could not be read as its kind (speed, quality): no figure of it can be trusted",
    "docs/compare.md",
)  # fmt: skip
SAME_KINDS = gate_name(
    "same result kinds", __name__, "ERROR",
    "one arm has a result kind (speed, quality) the other lacks: half a comparison is not a verdict",
    "docs/compare.md",
)  # fmt: skip
RENDERED = gate_name(
    "report rendered", __name__, "ERROR",
    "the verdict's report could not be drawn from its records: the records are malformed",
    "docs/compare.md",
)  # fmt: skip

VERDICT_SCHEMA_VERSION = current_schema("verdict")
KINDS = ("speed", "quality")
REPORT_FILES = ("verdict.json", "report.md", "speed.png")  # what write_report writes
# Each kind's check of a result read from disk, before anything is computed from it (bad input: one
# line naming the file and the key, exit 2).
RECORD_CHECKS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "speed": check_speed_result,
    "quality": check_quality_result,
}


@dataclass(frozen=True)
class Pair:
    """The two results of one kind and where they came from."""

    kind: str
    control: dict[str, Any]
    candidate: dict[str, Any]
    control_path: str
    candidate_path: str
    # The sha256 of the files read (the verdict records them: history append refuses a night whose
    # results changed after its compare); None for pairs built in memory.
    control_sha256: str | None = None
    candidate_sha256: str | None = None


def read_checked(path: Path, kind: str) -> tuple[dict[str, Any], str]:
    """A result of `kind` read from disk (results.read_result) and checked (RECORD_CHECKS); its sha256."""
    read = read_result(path, kind)
    RECORD_CHECKS[kind](read.data, str(path))
    return read.data, read.sha256


def locate(path: str | Path, arm: str) -> dict[str, Path]:
    """Result files for one argument: the file itself, or DIR/<kind>/<arm>.json for each kind present."""
    p = Path(path)
    if p.is_dir():
        found = {kind: p / kind / f"{arm}.json" for kind in KINDS if (p / kind / f"{arm}.json").is_file()}
        if not found:
            names = ", ".join(f"{kind}/{arm}.json" for kind in KINDS)
            raise ResultError(f"{p}: run directory holds none of {names}")
        return found
    if not p.exists():
        raise ResultError(f"{p}: no such result file or run directory")
    kind = str(load_result(p).get("kind"))
    if kind not in KINDS:
        raise ResultError(f"{p}: kind = {kind!r}: only {' and '.join(KINDS)} results can be compared")
    return {kind: p}


def load_pairs(control_path: str | Path, candidate_path: str | Path) -> tuple[list[Pair], list[str]]:
    """Pairs of results by kind, and the kinds found for one side only (a difference).

    ResultError for a comparison that is not one: the same file as both arms, or two files of the same
    run (the same reps: a copy)."""
    ctrl, cand = locate(control_path, "control"), locate(candidate_path, "candidate")
    if len(ctrl) == 1 and len(cand) == 1 and set(ctrl) != set(cand):
        raise ResultError(f"cannot compare a {next(iter(ctrl))} result with a {next(iter(cand))} result")
    for kind in set(ctrl) & set(cand):
        if ctrl[kind].resolve() == cand[kind].resolve():
            raise ResultError(
                f"{ctrl[kind]}: the same file as control and candidate: a result compared with itself is "
                "not evidence; give the control and the candidate result"
            )
    pairs = []
    for kind in (k for k in KINDS if k in ctrl and k in cand):
        (control, control_sha), (candidate, candidate_sha) = (
            read_checked(p[kind], kind) for p in (ctrl, cand)
        )
        pairs.append(
            Pair(kind, control, candidate, str(ctrl[kind]), str(cand[kind]), control_sha, candidate_sha)
        )
    for pair in pairs:
        measured = pair.control.get("reps") or pair.control.get("items")
        if measured and measured == (pair.candidate.get("reps") or pair.candidate.get("items")):
            raise ResultError(
                f"{pair.control_path} and {pair.candidate_path}: the same run (every rep or item the same, "
                "timestamps included): a result compared with a copy of itself is not evidence"
            )
    one_sided = [
        f"{k} result only for the {'control' if k in ctrl else 'candidate'}" for k in set(ctrl) ^ set(cand)
    ]
    return pairs, sorted(one_sided)


def refuse_wrong_arms(pairs: list[Pair], aa: bool) -> None:
    """The control argument must hold the control arm's result and the candidate argument the
    candidate's: swapped files compare the wrong way round (a pair that FAILs in order PASSes swapped).
    With --aa, two results of one arm (two runs of the control) may be compared; never a swapped pair."""
    for pair in pairs:
        got = (pair.control.get("arm"), pair.candidate.get("arm"))
        if got == ("control", "candidate") or (aa and got[0] == got[1] and isinstance(got[0], str)):
            continue
        swapped = "; swapped? " if got == ("candidate", "control") else "; "
        raise ResultError(
            f"the CONTROL argument {pair.control_path} holds arm {cut(repr(got[0]))} and the CANDIDATE "
            f"argument {pair.candidate_path} arm {cut(repr(got[1]))}{swapped}give the control's result "
            "first, the candidate's second (--aa compares two results of one arm)"
        )


def refuse_unasked_aa(pairs: list[Pair], aa: bool) -> None:
    """A candidate that ran with the control's env, or one that means the same (a switch `off` where the
    control's is `0`: contract/aa.py), switched nothing on: its comparison is an A/A (useful to measure
    the noise, never evidence for a change), so it must be asked for (--aa)."""
    if aa:
        return
    for pair in pairs:
        env, other = pair.control.get("env"), pair.candidate.get("env")
        if isinstance(env, dict) and isinstance(other, dict) and _same_meaning(env, other):
            shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no variables"
            said = (
                "" if env == other else " as it means the same (a switch is read as on or off however spelt)"
            )
            raise ResultError(
                f"{pair.candidate_path}: the candidate ran with the control's env ({cut(shown)}){said}: this "
                "is an A/A comparison, not evidence for a change; pass --aa to compare them as one"
            )


def _same_meaning(env: dict[str, Any], other: dict[str, Any]) -> bool:
    if env == other:
        return True
    if not all(isinstance(v, str) for v in (*env.values(), *other.values())):
        return False  # a malformed record: its own checks say so
    return arm_meaning(env, {}) == arm_meaning(other, {})


def resolve_contract(contract_path: str | Path | None, pairs: list[Pair]) -> LoadedContract:
    """The contract given, else the one the control result names; it must have the sections compared."""
    if contract_path is not None:
        _regular_contract(contract_path)
        loaded = load_contract(contract_path)
    else:
        named = pairs[0].control.get("contract", {}).get("path") if pairs else None
        if not named:
            raise ContractError("no --contract given and the control result names no contract path")
        try:
            _regular_contract(named)
            loaded = load_contract(named)
        except ContractError as exc:
            raise ContractError(f"no --contract given; the contract the results name fails: {exc}") from None
    for pair in pairs:
        if getattr(loaded.contract, pair.kind) is None:
            raise ContractError(f"{loaded.path}: {pair.kind} = None: the contract has no {pair.kind} section")
    return loaded


def _regular_contract(path: str | Path) -> None:
    """A contract path that is a FIFO or a device would block the contract's read (open() waits for a
    writer): refused from its stat first, as a result file is (results.read_result)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the contract loader names a missing or unreadable file in its own words
    if not stat.S_ISREG(mode):
        raise ContractError(f"{path}: not a regular file: a contract is a YAML file")


def switched_routes(env: dict[str, Any]) -> list[str]:
    """Route names whose env switch is on (qgate_route_env), in route order.

    A switch value that is neither on nor off is a ResultError: the run's pre-flight refuses one, so
    such a result was edited, and reading it as on (or off) would report routes the arm never had.
    """
    try:
        return routes_on(env)
    except SwitchError as exc:
        raise ResultError(f"arm env: {exc}") from None


def _arm_info(result: dict[str, Any], path: str) -> dict[str, Any]:
    env = sub if isinstance(sub := result.get("env"), dict) else {}
    keys = (
        "arm",
        "contract",
        "engine_args",
        "model",
        "fingerprint",
        "prompt",
        "workload",
        "launches",
        "routes",
    )
    info = {k: result.get(k) for k in keys}
    info.update(path=path, env=env, switched_routes=switched_routes(env))
    if result.get("shims"):  # platform shims (qgate_kernels.shims), listed apart from the routes
        info["shims"] = result["shims"]
    return info


def _arms(pair: Pair) -> dict[str, Any]:
    return {
        "control": _arm_info(pair.control, pair.control_path),
        "candidate": _arm_info(pair.candidate, pair.candidate_path),
    }


@dataclass(frozen=True)
class Comparer:
    """What `qgate compare` knows of one result kind."""

    compare: Callable[[dict[str, Any], dict[str, Any], LoadedContract], dict[str, Any]]
    extra_keys: tuple[str, ...] = ()  # dotted keys the kind adds to the refuse-to-compare check
    prefix: str = ""  # the kind's gate names in the verdict start with it
    top_level: tuple[str, ...] = ()  # section entries the verdict record holds at its top level
    own_gates: str | None = None  # where the section keeps a copy of its own gates (the report's table)


def comparers(history_rows: list[dict[str, Any]] | None = None) -> dict[str, Comparer]:
    """The one registry of comparers, built per call (the comparer functions are the tests' seam);
    history_rows (a store's rows, or None) go to the speed comparer (one launch per arm: qgate.launch_cv)."""
    speed = (
        functools.partial(compare_speed, history_rows=history_rows)
        if history_rows is not None
        else compare_speed
    )
    return {
        "speed": Comparer(speed, SPEED_EXTRA_KEYS, top_level=("stats", "figures")),
        "quality": Comparer(compare_quality, prefix="quality: ", own_gates="quality_gates"),
    }


def compare_pair(pair: Pair, loaded: LoadedContract, comparer: Comparer) -> dict[str, Any]:
    """One kind's section: the shared checks (once), the kind's comparison, where the arms came from.

    Gates in order: comparable arms, arm env (when the arms set code-changing env apart), the kind's
    checks of each result, route attestation, the kind's gates. A comparison that cannot read its
    results is an ERROR verdict with the reason, never a pass."""
    diffs = differences(pair.control, pair.candidate, loaded, comparer.extra_keys)
    failed: list[Gate] = []
    try:
        section = dict(comparer.compare(pair.control, pair.candidate, loaded))
    except Exception as exc:  # a result that cannot be read as its kind: ERROR with the reason, never a pass
        section = {"gates": [], "error": f"The {pair.kind} comparison failed: {type(exc).__name__}: {exc}"}
        failed.append(Gate(COMPUTED(kind=pair.kind), False, f"{type(exc).__name__}: {exc}", SEV_ERROR))
    own = section.pop("gates")
    if comparer.own_gates:
        section[comparer.own_gates] = [g.to_dict() for g in own]
    env_gate = code_env_gate(pair.control, pair.candidate, loaded)
    gates = [
        comparable_gate(diffs),
        *([env_gate] if env_gate is not None else []),
        *section.pop("checks", []),
        *attestation(pair.control, pair.candidate),
        *failed,
        *own,
    ]
    return {
        "gates": [g.prefixed(comparer.prefix) for g in gates],
        **section,
        "differences": diffs,
        "notes": notes(pair.control, pair.candidate),
        "arms": _arms(pair),
    }


def _section_or_error(pair: Pair, loaded: LoadedContract, comparer: Comparer) -> dict[str, Any]:
    """compare_pair, or, when the results cannot be read as their kind at all (a malformed record that
    the shared checks trip over), a section of one ERROR gate that says why: never a traceback."""
    try:
        return compare_pair(pair, loaded, comparer)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {cut(str(exc))}"
        gate = Gate(COMPUTED(kind=pair.kind), False, detail, SEV_ERROR)
        return {
            "gates": [gate.prefixed(comparer.prefix)],
            "error": f"The {pair.kind} comparison failed: {detail}",
            "arms": {"control": {"path": pair.control_path}, "candidate": {"path": pair.candidate_path}},
        }


def build_verdict(
    pairs: list[Pair],
    one_sided: list[str],
    loaded: LoadedContract,
    history_rows: list[dict[str, Any]] | None = None,
    timeline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict record: every gate of every kind compared, the verdict and all figures; `timeline`
    (a qgate.timeline record, or None) rides along, matched with the arms, and decides nothing."""
    registry = comparers(history_rows)
    sections = {pair.kind: _section_or_error(pair, loaded, registry[pair.kind]) for pair in pairs}
    gates = [g for s in sections.values() for g in s["gates"]]
    if one_sided:
        gates.append(Gate(SAME_KINDS(), False, "; ".join(one_sided), SEV_ERROR))
    verdict, reasons = decide(gates)
    record: dict[str, Any] = {
        "kind": "verdict",
        "schema_version": VERDICT_SCHEMA_VERSION,
        "verdict": verdict,
        "reasons": reasons,
        "gates": [g.to_dict() for g in gates],
        "contract": loaded.reference(),
        "inputs": {p.kind: _inputs(p) for p in pairs},
        "kinds": [p.kind for p in pairs],
        "timeline": None if timeline is None else thaw(match_arms(timeline, _arm_envs(pairs), "comparison")),
    }
    for kind, section in sections.items():
        body = {k: v for k, v in section.items() if k != "gates"}
        for key in registry[kind].top_level:
            if key in body:
                record[key] = body.pop(key)
        record[kind] = body
    return record


def _arm_envs(pairs: list[Pair]) -> dict[str, dict[str, Any]]:
    """The control's and the candidate's env as their results recorded them (the speed pair's, else the
    first kind's), for the timeline's match: a profile is of an arm when it ran that arm's routes."""
    pair = next((p for p in pairs if p.kind == "speed"), pairs[0] if pairs else None)
    if pair is None:
        return {}
    envs = {"control": pair.control.get("env"), "candidate": pair.candidate.get("env")}
    return {arm: env if isinstance(env, dict) else {} for arm, env in envs.items()}


def _inputs(pair: Pair) -> dict[str, Any]:
    """Where a kind's results came from and (read from files) the sha256 of what was judged."""
    out: dict[str, Any] = {"control": pair.control_path, "candidate": pair.candidate_path}
    if pair.control_sha256 is not None and pair.candidate_sha256 is not None:
        out.update(control_sha256=pair.control_sha256, candidate_sha256=pair.candidate_sha256)
    return out


class OutputExists(ResultError):
    """The output folder already holds a report; str() is one line naming the folder and the way on."""


def refuse_overwrite(
    out_dir: str | Path, names: tuple[str, ...], force: bool, remedy: str = "pass --force to overwrite it"
) -> None:
    """Raise OutputExists when out_dir holds any of `names` and the caller did not pass --force: an
    earlier verdict or ablation is evidence, not scratch space."""
    found = [n for n in names if (Path(out_dir) / n).exists()]
    if found and not force:
        raise OutputExists(
            f"{out_dir}: already holds a report ({', '.join(found)}); {remedy}, or choose another --out"
        )


def write_report(
    record: dict[str, Any], out_dir: str | Path, exports: Mapping[str, Path | None] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """verdict.json, report.md and (with speed figures) speed.png in out_dir, and the exports asked for
    (`exports`: {"junit": path, "bmf": path}, report.exports), as one set; returns the record as
    written and the paths.

    Every file is written in full first (the report set in a temporary folder inside out_dir, each
    export beside its target) and only then moved into place: a write that fails (a full disk) leaves
    none of the set behind, so the rerun needs no --force; an OSError names the file. A record that
    cannot be rendered (results malformed in a way no gate named) is written as an ERROR verdict with
    the reason and a plain report of its gates: compare never ends in a traceback."""
    from qgate.report import plots, render_markdown
    from qgate.report.exports import stage_exports

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"verdict": str(out / "verdict.json"), "report": str(out / "report.md")}
    record = {**record, "created_at": utc_now()}
    stage = Path(tempfile.mkdtemp(prefix=".qgate-report.", dir=out))
    staged: list[Staged] = []
    try:
        png = None
        try:
            text = render_markdown(record)
            if "speed" in record.get("kinds", []) and "figures" in record:
                png = _staged_file(stage, out, "speed.png", lambda tmp: plots.speed_png(record, tmp))
                paths["plot"] = str(out / "speed.png")
        except OSError:
            raise  # a full disk is no verdict on the results: one line naming the file
        except Exception as exc:
            record = _unrenderable(record, exc)
            text = _plain_report(record)
            paths.pop("plot", None)
            png = None
        report = _staged_file(stage, out, "report.md", lambda tmp: Path(tmp).write_text(text, "utf-8"))
        body = json.dumps(record, indent=2) + "\n"
        verdict = _staged_file(stage, out, "verdict.json", lambda tmp: Path(tmp).write_text(body, "utf-8"))
        staged = [*stage_exports(record, exports or {}), *(s for s in (png, report, verdict) if s)]
        _commit(staged, stale=() if "plot" in paths else (out / "speed.png",))
    except BaseException:
        for s in staged:
            s.discard()
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record, paths


def _staged_file(stage: Path, out: Path, name: str, write: Callable[[str], object]) -> Staged:
    """One file of the report set written in the stage folder (flushed to disk), to go to out/name."""
    tmp = stage / name
    try:
        write(str(tmp))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
    except OSError as exc:
        exc.filename = str(out / name)  # the file the user asked for, not the stage's copy
        raise
    return Staged(out / name, tmp)


def _commit(staged: list[Staged], stale: tuple[Path, ...]) -> None:
    """Move every staged file into place (renames: no space needed), verdict.json last; one that cannot
    be moved takes back those moved before it, so no part of the set stays. `stale`: a file of an
    earlier report this set does not replace (a plot of results now unrenderable)."""
    done: list[Path] = []
    try:
        for s in staged:
            s.commit()
            done.append(s.target)
    except BaseException:
        for target in done:
            if target.is_file():
                target.unlink(missing_ok=True)
        raise
    for path in stale:
        path.unlink(missing_ok=True)


def _unrenderable(record: dict[str, Any], exc: Exception) -> dict[str, Any]:
    gate = Gate(RENDERED(), False, f"{type(exc).__name__}: {cut(str(exc))}", SEV_ERROR)
    gates = [Gate(**g) for g in record.get("gates", [])] + [gate]
    verdict, reasons = decide(gates)
    return {**record, "verdict": verdict, "reasons": reasons, "gates": [g.to_dict() for g in gates]}


def _plain_report(record: dict[str, Any]) -> str:
    """The verdict, its reasons and gates, without the figures (which the results could not give)."""
    lines = [f"# qgate verdict: {record['verdict']}", "", *[f"- {r}" for r in record["reasons"]], ""]
    lines += ["| gate | passed | detail |", "|---|---|---|"]
    for g in record["gates"]:
        detail = str(g.get("detail", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {g.get('name')} | {g.get('passed')} | {detail} |")
    inputs = record.get("inputs", {})
    lines += ["", *[f"- {kind}: {arms}" for kind, arms in inputs.items()]]
    return "\n".join(lines) + "\n"


def run_compare(
    control: str | Path,
    candidate: str | Path,
    contract: str | Path | None,
    out_dir: str | Path,
    force: bool = False,
    aa: bool = False,
    history: str | Path | None = None,
    timeline: Mapping[str, Any] | None = None,
    exports: Mapping[str, Path | None] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Load, compare, write the report; raises ResultError / ContractError for bad input (an A/A not
    asked for with `aa` included) and OutputExists when out_dir already holds a report and force is False.
    history: a history store (qgate.history), read only for speed results of one launch per arm.
    timeline: a decode-step timeline (qgate.timeline.read_timeline) for the record and the report.
    exports: {"junit": path, "bmf": path} written with the report set (write_report).
    out_dir is held for the whole compare (qgate.writer_lock): a second writer is refused."""
    from qgate.writer_lock import one_writer

    with one_writer(out_dir, "qgate compare"):
        refuse_overwrite(out_dir, REPORT_FILES, force)
        pairs, one_sided = load_pairs(control, candidate)
        refuse_wrong_arms(pairs, aa)
        refuse_unasked_aa(pairs, aa)
        loaded = resolve_contract(contract, pairs)
        rows = history_rows(history, pairs)
        record = build_verdict(pairs, one_sided, loaded, rows, timeline)
        if rows is not None:  # the store was read (a speed pair of one launch per arm)
            record["inputs"]["history"] = redact_url(str(history))  # a Postgres URL's password stays out
        if aa:
            record["aa"] = True
        return write_report(record, out_dir, exports)


def history_rows(store: str | Path | None, pairs: list[Pair]) -> list[dict[str, Any]] | None:
    """The store's rows when a speed pair ran one launch per arm (its between-launch estimate); [] for a
    store that does not exist yet (a first night: nothing to estimate from), None when not needed."""
    from qgate.speed.figures import result_launches

    speed = [p for p in pairs if p.kind == "speed" and result_launches(p.control) == 1]
    if store is None or not speed:
        return None
    from qgate.history import open_store  # the store's backend: only when a store is read
    from qgate.history.sqlite_store import SqliteStore

    backend = open_store(store)
    if isinstance(backend, SqliteStore) and not backend.path.exists():
        return []
    return backend.read_rows()
