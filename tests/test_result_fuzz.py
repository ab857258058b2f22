"""A seeded fuzzer of speed result files (issue 45): every corruption is ERROR in one line, never a verdict.

Built from the golden pair (tests/golden/speed_*.json): corruptions of the file (not UTF-8, nested
200,000 deep, a FIFO, a device, a folder, cut, too big), of the header (`contract` null or a string,
`launches` null, counts of the wrong type, an arm env that is not text), and of the reps (token ids a
string, missing, cut with a matching sha256, of the wrong type; a rep copied into another launch or
grafted from another run; timings that are strings, NaN, infinite, zero, negative, 1e-308 tok/s, or a
TPOT that is not the decode rate's). Each is written to disk and given to `qgate compare`, bounded by a
timeout (a FIFO hung compare forever): exit 2 with one line `qgate: error: FILE: KEY ...`, or an ERROR
verdict (exit 3); no traceback, never PASS / FAIL / INCONCLUSIVE. The intact pair still PASSes with
the figures it had. Which rep, which arm, which bad value: drawn from a seeded generator, so a failure
names a case that reruns the same.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from golden import support
from typer.testing import CliRunner

from qgate import results
from qgate.cli.compare import app as compare_app
from qgate.cli.history import app as history_app
from qgate.results import ids_sha256

SEED = 45
TIMEOUT_S = 30.0  # one compare of a refused file takes milliseconds; a hang is what this bounds
BAD_NUMBERS = ("fast", None, True, float("nan"), float("inf"), -float("inf"), 0, -50.0, 1e-308, 1e300, [], {})
Edit = Callable[[dict[str, Any], random.Random], None]


@pytest.fixture
def contract(tmp_path: Path) -> Path:
    path = tmp_path / "contract.yaml"
    shutil.copy(support.FIXTURE_CONTRACT, path)
    path.write_text(path.read_text() + "    bootstrap_resamples: 100\n")  # the intact pair's compare: fast
    return path


def invoke(app: Any, *args: object) -> Any:
    """The CLI in a thread bounded by TIMEOUT_S: a read that blocks (a FIFO) fails the test, not the
    suite."""
    box: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: box.update(res=CliRunner().invoke(app, [str(a) for a in args])), daemon=True
    )
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive(), f"hung for {TIMEOUT_S} s: {args}"
    return box["res"]


def golden(contract: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    control, candidate = support.load_pair()
    return support.rehash(control, contract), support.rehash(candidate, contract)


def as_schema_2(result: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The golden result as qgate writes it now (speed schema 2): a run_id in the header and every rep."""
    result.update(schema_version=2, run_id=run_id)
    for rep in result["reps"]:
        rep["run_id"] = run_id
    return result


# ---- the corruptions: each a function of the result (one arm's) and the seeded generator -----------


def _rep(result: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return result["reps"][rng.randrange(len(result["reps"]))]


def _set(path: str, value: Any) -> Edit:
    def edit(result: dict[str, Any], rng: random.Random) -> None:
        *head, last = path.split(".")
        cur = result
        for k in head:
            cur = _rep(cur, rng) if k == "rep" else cur[int(k)] if k.isdigit() else cur[k]
        if value == "DEL":
            del cur[last]
        else:
            cur[last] = copy.deepcopy(value)

    return edit


def _rep_timing(key: str) -> Edit:
    def edit(result: dict[str, Any], rng: random.Random) -> None:
        _rep(result, rng)[key] = rng.choice(BAD_NUMBERS)

    return edit


def _tpot_off(result: dict[str, Any], rng: random.Random) -> None:
    rep = _rep(result, rng)
    rep["tpot_ms"] = rep["tpot_ms"] * rng.choice((0.5, 0.9, 1.01, 2.0))


def _ids(make: Callable[[list[int], random.Random], Any], rehash: bool) -> Edit:
    """token_ids replaced by make(ids); rehash: the sha256 (and count) recomputed to match, as a cut
    that kept its hash consistent would be."""

    def edit(result: dict[str, Any], rng: random.Random) -> None:
        rep = _rep(result, rng)
        rep["token_ids"] = make(list(rep["token_ids"]), rng)
        if rehash and isinstance(rep["token_ids"], list):
            rep["token_ids_sha256"] = ids_sha256(rep["token_ids"])
            if rng.random() < 0.5:
                rep["output_tokens"] = len(rep["token_ids"])

    return edit


def _copy_into_other_launch(result: dict[str, Any], rng: random.Random) -> None:
    reps = result["reps"]
    src = rng.randrange(5)  # launch 0's reps
    dst = 5 + rng.randrange(5)
    reps[dst] = dict(copy.deepcopy(reps[src]), index=reps[dst]["index"], launch=1)


def _duplicate_index(result: dict[str, Any], rng: random.Random) -> None:
    a, b = rng.sample(range(len(result["reps"])), 2)
    result["reps"][b]["index"] = result["reps"][a]["index"]


def _shuffle_started(result: dict[str, Any], rng: random.Random) -> None:
    a, b = sorted(rng.sample(range(len(result["reps"])), 2))
    reps = result["reps"]
    if reps[a]["started_at"] == reps[b]["started_at"]:
        reps[a]["started_at"] = "2026-11-29T17:00:00+00:00"
    reps[a]["started_at"], reps[b]["started_at"] = reps[b]["started_at"], reps[a]["started_at"]


CORRUPTIONS: dict[str, Edit] = {
    # the header
    "contract null": _set("contract", None),
    "contract a string": _set("contract", "tests/golden/contract.yaml"),
    "contract a list": _set("contract", ["x"]),
    "contract without sha256": _set("contract.sha256", "DEL"),
    "contract sha256 a number": _set("contract.sha256", 90),
    "arm null": _set("arm", None),
    "env null": _set("env", None),
    "env value a number": _set("env.VLLM_SM70_QWEN38_FP16_GEMV", 1),
    "engine_args a list": _set("engine_args", []),
    "model null": _set("model", None),
    "fingerprint a string": _set("fingerprint", "bench-1"),
    "routes null": _set("routes", None),
    "complete a string": _set("complete", "yes"),
    "launches null": _set("launches", None),
    "launches a string": _set("launches", "2"),
    "launches holds null": _set("launches", [None]),
    "launch id a string": _set("launches.0.launch", "0"),
    "launch started_at garbage": _set("launches.1.started_at", "yesterday"),
    "launch engine_start_s NaN": _set("launches.0.engine_start_s", float("nan")),
    "workload null": _set("workload", None),
    "workload.launches null": _set("workload.launches", None),
    "workload.launches a string": _set("workload.launches", "2"),
    "workload.launches 0": _set("workload.launches", 0),
    "workload.repetitions true": _set("workload.repetitions", True),
    "workload.repetitions null": _set("workload.repetitions", None),
    "workload.output_tokens a float": _set("workload.output_tokens", 8.5),
    "prompt null": _set("prompt", None),
    "prompt sha256 null": _set("prompt.sha256", None),
    "reps null": _set("reps", None),
    "reps a mapping": _set("reps", {"0": {}}),
    # every rep
    "rep null": lambda r, rng: r["reps"].__setitem__(rng.randrange(len(r["reps"])), None),
    "rep a list": lambda r, rng: r["reps"].__setitem__(rng.randrange(len(r["reps"])), [1, 2]),
    "rep index a string": _set("rep.index", "3"),
    "rep index negative": _set("rep.index", -1),
    "rep index true": _set("rep.index", True),
    "rep index twice": _duplicate_index,
    "rep launch a string": _set("rep.launch", "0"),
    "rep launch null": _set("rep.launch", None),
    "rep launch out of range": _set("rep.launch", 7),
    "rep copied into another launch": _copy_into_other_launch,
    "rep started_at garbage": _set("rep.started_at", "soon"),
    "rep started_at without offset": _set("rep.started_at", "2026-11-29T16:01:10"),
    "rep started_at before its launch": _set("rep.started_at", "2026-11-28T00:00:00+00:00"),
    "reps out of time order": _shuffle_started,
    "decode_tok_s bad": _rep_timing("decode_tok_s"),
    "decode_tok_s 1e-308": _set("rep.decode_tok_s", 1e-308),
    "decode_tok_s missing": _set("rep.decode_tok_s", "DEL"),
    "decode_tok_s a 400-digit integer": _set("rep.decode_tok_s", 10**400),
    "workload.repetitions a 400-digit integer": _set("workload.repetitions", 10**400),
    "launch engine_start_s a 400-digit integer": _set("launches.1.engine_start_s", 10**400),
    "tpot_ms bad": _rep_timing("tpot_ms"),
    "tpot_ms fast": _set("rep.tpot_ms", "fast"),
    "tpot_ms not the decode rate's": _tpot_off,
    "ttft_ms bad": _rep_timing("ttft_ms"),
    "ttft_ms missing": _set("rep.ttft_ms", "DEL"),
    "wall_s bad": _rep_timing("wall_s"),
    "token_ids a string": _ids(lambda ids, rng: ",".join(map(str, ids)), rehash=False),
    "token_ids missing": _set("rep.token_ids", "DEL"),
    "token_ids null": _set("rep.token_ids", None),
    "token_ids cut, sha256 matching": _ids(lambda ids, rng: ids[: rng.randrange(len(ids))], rehash=True),
    "token_ids longer, sha256 matching": _ids(lambda ids, rng: ids + ids[:3], rehash=True),
    "token_ids of strings, sha256 matching": _ids(lambda ids, rng: [str(i) for i in ids], rehash=False),
    "token_ids holding a float": _ids(lambda ids, rng: [*ids[:-1], float(ids[-1])], rehash=False),
    "token_ids holding true": _ids(lambda ids, rng: [True, *ids[1:]], rehash=False),
    "token_ids holding a negative id": _ids(lambda ids, rng: [-1, *ids[1:]], rehash=True),
    "token_ids changed, old sha256": _ids(lambda ids, rng: [i + 1 for i in ids], rehash=False),
    "token_ids_sha256 missing": _set("rep.token_ids_sha256", "DEL"),
    "output_tokens a string": _set("rep.output_tokens", "8"),
    "output_tokens off": _set("rep.output_tokens", 7),
    "prefix_cache_reset a string": _set("rep.prefix_cache_reset", "yes"),
}


def _raw_corruptions(text: str, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """Corruptions of the file's bytes."""
    raw = text.encode()
    cut = rng.randrange(1, len(raw) - 1)
    yield "cut mid-file", raw[:cut]
    yield "empty file", b""
    yield "latin-1 byte in a string", raw.replace(b'"bench-1"', b'"bench-\xe9"', 1)
    yield "invalid UTF-8 start byte", b"\xff" + raw
    yield "UTF-16", text.encode("utf-16")
    yield "nested 200,000 deep", b"[" * 200_000 + b"]" * 200_000
    yield (
        "nested 200,000 deep inside the record",
        raw[:-2] + b', "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    )
    yield "nested 100 deep", b'{"kind": "speed", "x": ' + b"[" * 100 + b"]" * 100 + b"}"
    yield "a JSON list", b"[1, 2, 3]"
    yield "a JSON string", b'"speed"'
    yield "NaN where the kind is", raw.replace(b'"kind": "speed"', b'"kind": NaN', 1)


def _cases(contract: Path) -> Iterator[tuple[str, str, dict[str, Any] | bytes]]:
    """(name, side, the corrupted result or its bytes): every corruption on both arms, two draws each."""
    rng = random.Random(SEED)
    base = dict(zip(("control", "candidate"), golden(contract), strict=True))
    for draw in range(2):
        for side in ("control", "candidate"):
            for name, edit in CORRUPTIONS.items():
                result = copy.deepcopy(base[side])
                edit(result, rng)
                yield f"{side}: {name} (draw {draw})", side, result
            text = json.dumps(base[side], indent=2)
            for name, raw in _raw_corruptions(text, rng):
                yield f"{side}: {name} (draw {draw})", side, raw


def _write(path: Path, data: dict[str, Any] | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data, indent=2).encode())
    return path


def assert_refused(res: Any, out: Path, name: str, path: Path) -> None:
    """ERROR in one line (exit 2) or an ERROR verdict (exit 3); never a traceback or another verdict."""
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{name}: {res.exception!r}"
    assert "Traceback" not in res.output, f"{name}: {res.output}"
    assert res.exit_code in (2, 3), f"{name}: exit {res.exit_code}: {res.output}"
    if res.exit_code == 2:
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("qgate: error: "), f"{name}: {res.output}"
        assert str(path) in lines[0], f"{name}: the line does not name the file: {res.output}"
    else:
        assert json.loads((out / "verdict.json").read_text())["verdict"] == "ERROR", name


def _core_outcome(control: Path, candidate: Path, contract: Path, out: Path) -> tuple[int, str]:
    """What `qgate compare` does, without the CLI's ~20 ms of option parsing a call: (2, the error's
    line) for bad input, else (the verdict's exit code, the verdict)."""
    from qgate.compare import run_compare
    from qgate.errors import QgateError

    try:
        record, _ = run_compare(control, candidate, contract, out)
    except QgateError as exc:
        return exc.exit_code, str(exc)
    return {"PASS": 0, "FAIL": 1, "ERROR": 3, "INCONCLUSIVE": 4}[record["verdict"]], record["verdict"]


def test_every_corrupted_result_is_refused_in_one_line(tmp_path: Path, contract: Path) -> None:
    """Every case through compare's core (bad input must be a QgateError of one line naming the file),
    the whole loop bounded by one timeout; the first draw of every corruption through the CLI too."""
    control, candidate = golden(contract)
    good = {
        "control": _write(tmp_path / "good" / "control.json", control),
        "candidate": _write(tmp_path / "good" / "candidate.json", candidate),
    }
    cases = list(_cases(contract))
    outcomes: list[tuple[str, Path, int, str]] = []

    def run_all() -> None:
        for n, (name, side, data) in enumerate(cases):
            bad = _write(tmp_path / f"case{n}" / f"{side}.json", data)
            args = (bad, good["candidate"]) if side == "control" else (good["control"], bad)
            outcomes.append((name, bad, *_core_outcome(*args, contract, tmp_path / f"case{n}" / "out")))

    thread = threading.Thread(target=run_all, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S * 4)
    assert not thread.is_alive(), f"hung after {len(outcomes)} cases: {cases[len(outcomes)][0]}"
    for name, bad, code, line in outcomes:
        assert code == 2 and "\n" not in line and line.startswith(f"{bad}: "), f"{name}: {code} {line}"
    # the edits and 11 byte corruptions, both arms, two draws
    assert len(outcomes) == 2 * 2 * (len(CORRUPTIONS) + 11), len(outcomes)
    for n, (name, side, _) in enumerate(cases[: len(cases) // 4]):  # the first draw's control cases
        bad = tmp_path / f"case{n}" / f"{side}.json"
        out = tmp_path / f"cli{n}"
        res = invoke(compare_app, bad, good["candidate"], "--contract", contract, "--out", out)
        assert_refused(res, out, name, bad)
        assert res.exit_code == 2, f"{name}: {res.output}"


def test_the_intact_pair_still_passes_with_its_figures(tmp_path: Path, contract: Path) -> None:
    control, candidate = golden(contract)
    for label, pair in (("schema 1", (control, candidate)), ("schema 2", (
        as_schema_2(copy.deepcopy(control), "a" * 32), as_schema_2(copy.deepcopy(candidate), "b" * 32)
    ))):  # fmt: skip
        ctrl = _write(tmp_path / label / "control.json", pair[0])
        cand = _write(tmp_path / label / "candidate.json", pair[1])
        out = tmp_path / label / "out"
        res = invoke(compare_app, ctrl, cand, "--contract", contract, "--out", out)
        assert res.exit_code == 0 and "verdict: PASS" in res.output, f"{label}: {res.output}"
        record = json.loads((out / "verdict.json").read_text())
        assert round(record["figures"]["throughput_change_pct"], 2) == 19.58, label
        judged = record["inputs"]["speed"]
        for arm, path in (("control", ctrl), ("candidate", cand)):
            assert judged[f"{arm}_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), label


def test_a_rep_grafted_from_another_run_is_refused(tmp_path: Path, contract: Path) -> None:
    """Schema 2 records the run of every rep: a rep of another run's file is refused by its run_id,
    even when its figures and times fit. Schema 1 recorded no run: a graft is caught only where its
    time breaks the file's order (here the candidate's rep k, run a minute later, put in as the control's
    rep k before the control's rep k + 1); one that fits the order (the last rep of a launch) is not."""
    rng = random.Random(SEED)
    for k in rng.sample([0, 1, 2, 3, 5, 6, 7, 8], 4):
        control, candidate = golden(contract)
        other = as_schema_2(copy.deepcopy(control), "c" * 32)
        other["reps"][k]["decode_tok_s"] *= 1.01
        other["reps"][k]["tpot_ms"] /= 1.01
        control = as_schema_2(control, "a" * 32)
        control["reps"][k] = other["reps"][k]
        ctrl = _write(tmp_path / f"g{k}" / "control.json", control)
        cand = _write(tmp_path / f"g{k}" / "candidate.json", as_schema_2(candidate, "b" * 32))
        out = tmp_path / f"g{k}" / "out"
        res = invoke(compare_app, ctrl, cand, "--contract", contract, "--out", out)
        assert_refused(res, out, f"graft {k}", ctrl)
        assert f"reps[{k}].run_id" in res.output, res.output
        control, candidate = golden(contract)
        control["reps"][k] = dict(candidate["reps"][k], launch=control["reps"][k]["launch"])
        ctrl = _write(tmp_path / f"v1-{k}" / "control.json", control)
        cand = _write(tmp_path / f"v1-{k}" / "candidate.json", candidate)
        res = invoke(compare_app, ctrl, cand, "--contract", contract, "--out", tmp_path / f"v1-{k}" / "out")
        assert_refused(res, tmp_path / f"v1-{k}" / "out", f"v1 graft {k}", ctrl)
        assert "started_at" in res.output, res.output


@pytest.mark.parametrize("what", ["fifo", "device", "folder", "fifo behind a link"])
def test_a_result_that_is_not_a_regular_file_is_refused_without_blocking(
    tmp_path: Path, contract: Path, what: str
) -> None:
    control, candidate = golden(contract)
    cand = _write(tmp_path / "candidate.json", candidate)
    if what == "device":
        bad = Path("/dev/zero")  # read as a file it never ends
    elif what == "folder":
        bad = tmp_path / "dir.json"
        bad.mkdir()
        (bad / "speed").mkdir()
        (bad / "speed" / "control.json").mkdir()  # a run directory whose result is a folder
    else:
        fifo = tmp_path / "control.fifo"
        os.mkfifo(fifo)
        bad = fifo
        if what == "fifo behind a link":
            bad = tmp_path / "control.json"
            bad.symlink_to(fifo)
    out = tmp_path / "out"
    res = invoke(compare_app, bad, cand, "--contract", contract, "--out", out)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and str(bad) in res.output, res.output


def test_a_result_over_the_size_cap_is_refused(
    tmp_path: Path, contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, candidate = golden(contract)
    ctrl = _write(tmp_path / "control.json", control)
    cand = _write(tmp_path / "candidate.json", candidate)
    monkeypatch.setattr(results, "MAX_RESULT_BYTES", ctrl.stat().st_size - 1)
    res = invoke(compare_app, ctrl, cand, "--contract", contract, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "more than a result can be" in res.output, res.output


# ---- the history: a night is stored from the files its compare judged -------------------------------


def _judged_night(tmp_path: Path, contract: Path) -> tuple[Path, Path]:
    control, candidate = golden(contract)
    run = tmp_path / "2026-12-01"
    for arm, result in (("control", control), ("candidate", candidate)):
        for launch in result["launches"]:
            launch["started_at"] = "2026-12-01T02:00:00+00:00"
        for i, rep in enumerate(result["reps"]):
            rep["started_at"] = f"2026-12-01T02:01:{i:02d}+00:00"
        _write(run / "speed" / f"{arm}.json", result)
    speed = run / "speed"
    res = invoke(compare_app, speed / "control.json", speed / "candidate.json", "--contract", contract,
                 "--out", run / "compare-speed")  # fmt: skip
    assert res.exit_code == 0, res.output
    return run, tmp_path / "history.sqlite"


@pytest.mark.parametrize("change", ["a NaN rep added", "a figure changed", "a key added"])
def test_history_refuses_results_changed_after_their_compare(
    tmp_path: Path, contract: Path, change: str
) -> None:
    run, store = _judged_night(tmp_path, contract)
    path = run / "speed" / "candidate.json"
    data = json.loads(path.read_text())
    if change == "a NaN rep added":
        data["reps"].append(dict(data["reps"][-1], index=10, decode_tok_s=float("nan")))
    elif change == "a figure changed":
        data["reps"][2]["decode_tok_s"] *= 1.5
        data["reps"][2]["tpot_ms"] /= 1.5
    else:
        data["note"] = "edited"
    path.write_text(json.dumps(data, indent=2))
    res = invoke(history_app, "append", run, "--store", store)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    if change != "a NaN rep added":  # that one the rep check refuses first, naming the rep
        assert "candidate.json changed after its compare" in res.output, res.output
    assert not store.exists()  # nothing was appended: the store was not even created


def test_history_appends_the_judged_night_and_refuses_a_verdict_not_utf8(
    tmp_path: Path, contract: Path
) -> None:
    run, store = _judged_night(tmp_path, contract)
    verdict = run / "compare-speed" / "verdict.json"
    good = verdict.read_bytes()
    verdict.write_bytes(good.replace(b'"PASS"', b'"P\xc1SS"', 1))
    res = invoke(history_app, "append", run, "--store", store)
    assert res.exit_code == 2 and "not UTF-8" in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    verdict.write_bytes(good)
    res = invoke(history_app, "append", run, "--store", store)
    assert res.exit_code == 0 and res.output.startswith("appended: night 2026-12-01"), res.output


# ---- quality results: the same treatment where it applies -------------------------------------------


def _quality_result(arm: str) -> dict[str, Any]:
    """A quality result shaped as `qgate run quality` writes one (schema 3; two seeds of four items)."""
    from qgate.quality.scoring import score_output

    items = []
    for seed in (0, 1):
        for index in range(8, 12):
            ids, prompt = [5 + index, 7, 9, 2], [1, 2, 3, index]
            text = f"<think>\nSo {index}.\n</think>\n\n#### {index}"
            items.append({
                "index": index, "seed": seed, "gold": str(index), "prompt_token_ids": prompt,
                "prompt_sha256": ids_sha256(prompt), "output": text, "token_ids": ids,
                "token_ids_sha256": ids_sha256(ids), "output_tokens": len(ids), "finish_reason": "stop",
                "first_token_ts": 100.0, "last_token_ts": 100.03, "decode_s": 0.03, "decode_tok_s": 100.0,
                "prefix_cache_reset": True, "run_id": "q" * 32,
                **score_output(text, ids, "stop", str(index), ["hash"]),
            })  # fmt: skip
    return {
        "kind": "quality", "schema_version": 3, "arm": arm, "run_id": "q" * 32,
        "contract": {"name": "q", "version": 1, "sha256": "0" * 64, "path": "q.yaml"},
        "env": {}, "engine_args": {}, "model": {"spec": "tiny"}, "fingerprint": {"git_sha": "abc"},
        "launches": [{"segment": 0, "engine_start_s": 20.0, "started_at": "2026-12-01T02:00:00+00:00"}],
        "routes": {}, "dropped_env": [], "inherited_env": None, "complete": True, "seeds": [0, 1],
        "items": items,
    }  # fmt: skip


QUALITY_CORRUPTIONS: dict[str, Edit] = {
    "contract null": _set("contract", None),
    "contract a string": _set("contract", "q.yaml"),
    "items null": _set("items", None),
    "launches null": _set("launches", None),
    "complete a string": _set("complete", "true"),
    "seeds holding a string": _set("seeds", [0, "1"]),
    "item null": lambda r, rng: r["items"].__setitem__(rng.randrange(len(r["items"])), None),
    "item index a string": lambda r, rng: rng.choice(r["items"]).__setitem__("index", "9"),
    "item seed a float": lambda r, rng: rng.choice(r["items"]).__setitem__("seed", 0.5),
    "item twice": lambda r, rng: r["items"].__setitem__(1, dict(r["items"][0])),
    "item of another run": lambda r, rng: rng.choice(r["items"]).__setitem__("run_id", "r" * 32),
    "run_id null": _set("run_id", None),
    "raw_correct a string": lambda r, rng: rng.choice(r["items"]).__setitem__("raw_correct", "yes"),
    "output_tokens negative": lambda r, rng: rng.choice(r["items"]).__setitem__("output_tokens", -4),
    "token_ids a string": lambda r, rng: rng.choice(r["items"]).__setitem__("token_ids", "13,7,9,2"),
    "token_ids cut, sha256 matching": lambda r, rng: rng.choice(r["items"]).update(
        token_ids=[13], token_ids_sha256=ids_sha256([13])
    ),
    "prompt ids changed, old sha256": lambda r, rng: rng.choice(r["items"]).__setitem__(
        "prompt_token_ids", [1, 2, 3]
    ),
    "decode_tok_s NaN": lambda r, rng: rng.choice(r["items"]).__setitem__("decode_tok_s", float("nan")),
    "decode_tok_s 1e-308": lambda r, rng: rng.choice(r["items"]).__setitem__("decode_tok_s", 1e-308),
    "decode_s a string": lambda r, rng: rng.choice(r["items"]).__setitem__("decode_s", "fast"),
    "decode_tok_s not the decode rate": lambda r, rng: rng.choice(r["items"]).__setitem__(
        "decode_tok_s", 150.0
    ),
    "decode_s not the timestamps' span": lambda r, rng: rng.choice(r["items"]).__setitem__("decode_s", 0.06),
}


def test_corrupted_quality_results_are_refused_in_one_line(tmp_path: Path, contract: Path) -> None:
    from qgate.quality.record import check_quality_result

    rng = random.Random(SEED)
    check_quality_result(_quality_result("control"), "intact")  # the intact record passes
    good = _write(tmp_path / "candidate.json", _quality_result("candidate"))
    for n, (name, edit) in enumerate(QUALITY_CORRUPTIONS.items()):
        result = _quality_result("control")
        edit(result, rng)
        bad = _write(tmp_path / f"q{n}" / "control.json", result)
        res = invoke(compare_app, bad, good, "--contract", contract, "--out", tmp_path / f"q{n}" / "out")
        assert_refused(res, tmp_path / f"q{n}" / "out", f"quality: {name}", bad)
        assert res.exit_code == 2, f"quality: {name}: {res.output}"
    raw = json.dumps(_quality_result("control")).encode()
    for n, data in enumerate((raw.replace(b'"tiny"', b'"t\xffny"'), b"{" * 100_000)):
        bad = _write(tmp_path / f"qraw{n}" / "control.json", data)
        res = invoke(compare_app, bad, good, "--contract", contract, "--out", tmp_path / f"qraw{n}" / "out")
        assert_refused(res, tmp_path / f"qraw{n}" / "out", f"quality bytes {n}", bad)


@pytest.mark.parametrize("what", ["fifo", "folder"])
def test_history_refuses_a_result_that_is_not_a_regular_file(
    tmp_path: Path, contract: Path, what: str
) -> None:
    """A night folder whose result is a FIFO or a folder: refused in one line (a FIFO must not block, and
    the arm must not be left out of the night as if it had not run)."""
    run, store = _judged_night(tmp_path, contract)
    path = run / "speed" / "candidate.json"
    path.unlink()
    os.mkfifo(path) if what == "fifo" else path.mkdir()
    res = invoke(history_app, "append", run, "--store", store)
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not store.exists(), res.output


def test_a_sequential_record_cannot_lower_its_boundary(tmp_path: Path, contract: Path) -> None:
    """A --until-decided result is judged at its last look's z boundary: one edited below the design's
    (or a design of another alpha than the contract's) is refused, never judged."""
    from qgate.contract import load_contract
    from qgate.speed import sequential

    alpha = load_contract(contract).contract.speed.stats.alpha
    look = sequential.Look(0, 2, 1.2, 1.1, 1.3, 2.0, 8.0, 0.3, 0.3, "PASS", "shown")

    def with_seq(design_alpha: float, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
        control, candidate = golden(contract)
        rec = sequential.record(sequential.Design.plan(design_alpha, 2, 4), [look])
        if edit is not None:
            edit(rec)
        for result in (control, candidate):
            result["sequential"] = copy.deepcopy(rec)
        run = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        _write(run / "candidate.json", candidate)
        return _write(run / "control.json", control)

    cases = {
        "as designed": with_seq(alpha),
        "z lowered": with_seq(alpha, lambda r: r["design"].update(z_boundaries=[1.0, 1.0, 1.0])),
        "z NaN": with_seq(alpha, lambda r: r["design"]["z_boundaries"].__setitem__(0, float("nan"))),
        "z huge int": with_seq(alpha, lambda r: r["design"]["z_boundaries"].__setitem__(0, 10**400)),
        "looks a string": with_seq(alpha, lambda r: r.update(looks="PASS")),
        "look at an unplanned launch": with_seq(alpha, lambda r: r["looks"][0].update(launches=3)),
        "another alpha": with_seq(0.5),
    }
    for name, ctrl in cases.items():
        out = ctrl.parent / "out"
        res = invoke(compare_app, ctrl, ctrl.parent / "candidate.json", "--contract", contract, "--out", out)
        if name == "as designed":
            assert res.exit_code in (0, 4) and "Traceback" not in res.output, res.output
        else:
            assert_refused(res, out, name, ctrl)


@pytest.mark.parametrize("given", ["--contract", "named by the results"])
def test_a_contract_that_is_a_fifo_does_not_block_compare(tmp_path: Path, contract: Path, given: str) -> None:
    control, candidate = golden(contract)
    fifo = tmp_path / "contract.fifo"
    os.mkfifo(fifo)
    control["contract"]["path"] = str(fifo)
    ctrl = _write(tmp_path / "a" / "control.json", control)
    cand = _write(tmp_path / "b" / "candidate.json", candidate)
    args = ("--contract", fifo) if given == "--contract" else ()
    res = invoke(compare_app, ctrl, cand, *args, "--out", tmp_path / "out")
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
