"""`qgate ablate` core: which factor of a candidate earned the speed-up, and which one moved the answers.

Factors come from the difference between the contract's control and candidate envs:
- a route factor per kernel route whose switch or implementation override differs (the switch and its
  `QGATE_ROUTE_IMPL_<ROUTE>` travel together: an override of a route that is off is refused anyway);
- a plain env factor per other variable that differs (e.g. a library knob the candidate also sets).
Variables equal in both arms are the base every arm shares. An arm is the control env with a set of
factors moved to their candidate values; its name says which: `control`, `candidate`, `only-<f>`,
`without-<f>`, `with-<f>+<g>`.

Designs (arms are deduplicated by their factor set; for k factors):
- both (default): control, candidate, each factor alone on top of the control, and each factor left
  out of the candidate: 2k + 2 arms at most (k = 2: 4 arms; k = 3: 8, which is also the full factorial).
  The issue asks for both marginal effects, and each design alone answers only one of the two questions
  (alone: "what does this route do by itself", leave-one-out: "what would the candidate lose without it").
- one-at-a-time: control, candidate, each factor alone (k + 2).
- leave-one-out: control, candidate, each factor left out (k + 2).
- full: the 2^k factorial (k <= MAX_FULL_FACTORS).

All arms run the speed gate through `qgate.speed.run.run_speed(plans=...)`: same prompt, same engine
args, one engine start per arm per launch, arms interleaved launch by launch, resumable per arm.

Effects (statistics from qgate.stats; a statistic that cannot be computed is an ERROR of the ablation):
- alone effect of f: arm `only-f` against the control; leave-one-out effect: the candidate against
  `without-f`. Each: the ratio of mean decode tok/s with its bootstrap CI, Welch / Mann-Whitney p and the
  per-metric verdict of `qgate.stats.compare_samples`, plus the change of mean TPOT in ms with a bootstrap
  CI (arms resampled independently: they are independent engine starts).
- interaction: the candidate's effect minus the sum of the alone effects (or, from leave-one-out arms,
  the sum of the effects added last minus the candidate's effect: the same quantity for pairwise
  interactions), on the TPOT scale (ms per token: independent routes each add or save time per token,
  so their effects add up there) and on the % tok/s scale the issue states it in (not additive even for
  independent routes: two -10 % routes give -19 %, shown as +1 point). Bootstrap CI over the arms used.
- Launches: with speed.launches = 1 each arm is one engine start, so what differs between engine starts
  (machine load, drift) is not in the CIs; the record says so in `notes`. launches >= 4 puts it there.

Nothing here prints; the CLI (qgate.cli.ablate) shows progress and exits by `status`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import qgate_route_env as route_env
from qgate import comparable, records, routes
from qgate.compare import read_checked, refuse_overwrite
from qgate.contract import LoadedContract
from qgate.engine.arms import ArmPlan, Progress
from qgate.errors import QgateError, cut
from qgate.gate import PASS, SEV_ERROR, Gate, decide, gate_name
from qgate.quality.run import run_quality
from qgate.results import (
    ResultError,
    atomic_write_json,
    atomic_write_text,
    current_schema,
    load_result,
    utc_now,
)
from qgate.speed import gates as vd
from qgate.speed.audit import audit_gate
from qgate.speed.compare import SPEED_EXTRA_KEYS
from qgate.speed.figures import arm_figures as stats_arm_figures
from qgate.speed.figures import arm_units, launch_problem
from qgate.speed.run import arm_path, run_speed, run_speed_until_decided
from qgate.stats import ERROR as STAT_ERROR
from qgate.stats import StatsConfig, bootstrap_estimate, compare_samples, error_record
from qgate.timeline import match_arms as match_timeline_arms
from qgate.timeline import thaw

ABLATION_SCHEMA_VERSION = current_schema("ablation")
_DOC = "docs/ablate.md"
ARM_ATTESTATION = gate_name(
    "{arm}: route attestation", __name__, "ERROR",
    "the arm's result has no route counts: nothing proves which routes it ran", _DOC,
)  # fmt: skip
ENV_AS_PLANNED = gate_name(
    "{arm}: env as planned", __name__, "ERROR",
    "the arm's result ran another env than the ablation planned for it: its effect is not the factor's", _DOC,
)  # fmt: skip
COMPARABLE_WITH_CONTROL = gate_name(
    "{arm}: comparable with control", __name__, "ERROR",
    "the arm differs from the control in more than its env (qgate.comparable): its effect is not the "
    "factor's", _DOC,
)  # fmt: skip
EFFECT_COMPUTED = gate_name(
    "effect {effect} computed", __name__, "ERROR",
    "an effect's statistics (candidate, a factor alone, leave-one-out) could not be computed", _DOC,
)  # fmt: skip
INTERACTION_COMPUTED = gate_name(
    "interaction ({basis}) computed", __name__, "ERROR",
    "the factors' interaction could not be computed: no claim that their effects add up", _DOC,
)  # fmt: skip
DESIGNS = ("both", "one-at-a-time", "leave-one-out", "full")
DEFAULT_DESIGN = "both"
MAX_FULL_FACTORS = 5  # 2^5 = 32 engine starts per launch: beyond that, a factorial is not "small k"
OK = "OK"
ERROR = "ERROR"
REPORT_FILES = ("ablation.json", "ablation.md", "ablation.png")  # what write_ablation writes
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class AblationError(QgateError, ValueError):
    """The contract cannot be ablated as asked; str() is one line naming the key and value."""


@dataclass(frozen=True)
class Factor:
    """One thing the candidate changes: a route (switch + override) or one plain env variable.

    values: (var, control value, candidate value); None means the variable is unset in that arm.
    """

    name: str
    kind: str  # "route" | "env"
    values: tuple[tuple[str, str | None, str | None], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "vars": {var: {"control": c, "candidate": t} for var, c, t in self.values},
        }


@dataclass(frozen=True)
class Arm:
    """One derived arm: its name (result file stem), the factors it moves and its full env."""

    name: str
    factors_on: tuple[str, ...]
    env: dict[str, str]
    roles: tuple[str, ...]  # why it is in the design: control, candidate, alone:<f>, leave-one-out:<f>


def _route_vars(route: str) -> tuple[str, str]:
    return route_env.ROUTES[route], route_env.override_var(route)


def derive_factors(control: Mapping[str, str], candidate: Mapping[str, str]) -> list[Factor]:
    """The factors in which candidate differs from control: routes first (in ROUTES order), then env vars."""
    differing = {k for k in set(control) | set(candidate) if control.get(k) != candidate.get(k)}
    factors: list[Factor] = []
    grouped: set[str] = set()
    for route in route_env.ROUTES:
        names = _route_vars(route)
        grouped.update(names)
        if differing & set(names):
            values = tuple((v, control.get(v), candidate.get(v)) for v in names if v in differing)
            factors.append(Factor(route, "route", values))
    for var in sorted(differing - grouped):
        if not _SAFE_NAME.match(var):
            raise AblationError(f"arms.candidate.env.{var}: cannot name an arm after this variable")
        factors.append(Factor(var, "env", ((var, control.get(var), candidate.get(var)),)))
    return factors


def arm_env(control: Mapping[str, str], factors: Sequence[Factor], on: Sequence[str]) -> dict[str, str]:
    """The control env with the factors named in `on` moved to their candidate values."""
    env = dict(control)
    for f in factors:
        if f.name not in on:
            continue
        for var, _, value in f.values:
            if value is None:
                env.pop(var, None)
            else:
                env[var] = value
    return env


def arm_name(on: Sequence[str], names: Sequence[str]) -> str:
    s = set(on)
    if not s:
        return "control"
    if s == set(names):
        return "candidate"
    if len(s) == 1:
        return f"only-{next(iter(s))}"
    if len(s) == len(names) - 1:
        return f"without-{next(n for n in names if n not in s)}"
    return "with-" + "+".join(n for n in names if n in s)


def _design_sets(names: list[str], design: str) -> list[frozenset[str]]:
    """The factor sets of a design, deduplicated, in run order: control first, then single factors,
    then leave-one-out sets, then the rest of a factorial, candidate last."""
    k = len(names)
    wanted: list[frozenset[str]] = [frozenset()]
    if design in ("both", "one-at-a-time", "full"):
        wanted += [frozenset([n]) for n in names]
    if design in ("both", "leave-one-out", "full"):
        wanted += [frozenset(names) - {n} for n in names]
    if design == "full":
        wanted += [frozenset(c) for size in range(2, k - 1) for c in itertools.combinations(names, size)]
    wanted.append(frozenset(names))
    out: list[frozenset[str]] = []
    for s in wanted:
        if s not in out:
            out.append(s)
    return out


def arm_roles(on: frozenset[str], names: Sequence[str]) -> tuple[str, ...]:
    """What an arm's factor set stands for in the analysis (one set can stand for several)."""
    roles = []
    if not on:
        roles.append("control")
    if on == set(names):
        roles.append("candidate")
    if len(on) == 1 and len(names) > 1:
        roles.append(f"alone:{next(iter(on))}")
    if len(on) == len(names) - 1 and len(names) > 1:
        roles.append(f"leave-one-out:{next(n for n in names if n not in on)}")
    return tuple(roles) or ("factorial",)


def plan_arms(loaded: LoadedContract, design: str = DEFAULT_DESIGN) -> tuple[list[Factor], list[Arm]]:
    """The factors of the contract's candidate and the arms of the design (deduplicated, run order)."""
    if design not in DESIGNS:
        raise AblationError(f"--design {design!r}: expected one of {', '.join(DESIGNS)}")
    c = loaded.contract
    if c.speed is None:
        raise AblationError(f"{loaded.path}: speed = None: an ablation runs the speed gate per arm")
    ce, te = c.engine_for("control"), c.engine_for("candidate")
    if ce != te:
        keys = sorted(k for k in set(ce) | set(te) if ce.get(k) != te.get(k))
        raise AblationError(
            f"{loaded.path}: arms.*.engine differ in {', '.join(keys)}: an ablation varies the env only"
        )
    control, candidate = c.env_for("control"), c.env_for("candidate")
    factors = derive_factors(control, candidate)
    if not factors:
        raise AblationError(f"{loaded.path}: arms.control.env equals arms.candidate.env: nothing to ablate")
    if design == "full" and len(factors) > MAX_FULL_FACTORS:
        raise AblationError(
            f"--design full with {len(factors)} factors is {2 ** len(factors)} arms; "
            f"at most {MAX_FULL_FACTORS} factors (use --design both)"
        )
    names = [f.name for f in factors]
    arms = []
    for on in _design_sets(names, design):
        ordered = tuple(n for n in names if n in on)
        env = arm_env(control, factors, ordered)
        arms.append(Arm(arm_name(ordered, names), ordered, env, arm_roles(on, names)))
    return factors, arms


# --- running ----------------------------------------------------------------------------------------


def run_quality_arms(
    loaded: LoadedContract, out_dir: Path, arms: Sequence[Arm], resume: bool, progress: Progress | None
) -> dict[str, Any]:
    """The quality gate per arm where the contract asks for it.

    Returns {"ran": bool, "detail": str}: a quality section that was not run is said so, never hidden.
    """
    c = loaded.contract
    if c.quality is None:
        return {"ran": False, "detail": "the contract has no quality section"}
    engine = c.engine_for("control")
    plans = [ArmPlan(a.name, a.env, engine) for a in arms]
    run_quality(loaded, out_dir, resume=resume, progress=progress, plans=plans)
    return {"ran": True, "detail": f"quality gate run on {len(plans)} arms"}


def run_ablation(
    loaded: LoadedContract,
    out_dir: Path,
    design: str = DEFAULT_DESIGN,
    resume: bool = False,
    progress: Progress | None = None,
    force: bool = False,
    max_launches: int | None = None,
    timeline: Mapping[str, Any] | None = None,
    report_only: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Plan, run every arm's speed gate (and quality where possible), analyse, write the report.

    report_only (`--report-only`): no engine starts; the report is built from the arms' results already
    in out_dir (a run its time limit cut, read on a machine without the GPU): an arm missing is a
    one-line ResultError, an arm incomplete an ERROR in the record, as after any run.

    An earlier ablation report in out_dir is refused (OutputExists, a ResultError) unless resume (which
    continues that ablation and writes its report again) or force (which rewrites the report; the arms'
    results are still refused without resume, by the speed run).

    max_launches (`--until-decided`): every arm gets one launch at a time, and after each round the
    candidate's whole change is looked at against the control as `qgate run speed --until-decided`
    does (qgate.speed.sequential): the ablation stops once that verdict is PASS or FAIL, or at
    max_launches. That is the question with a stopping rule; the factors' effects are estimates, read
    at the size that decided it (their CIs in the report), not tested for a stop of their own.

    timeline (`--timeline DIR`, qgate.timeline.read_timeline, read before this is called): the
    decode-step timeline of the arms or of a probe's variants, matched with the plan (which of its
    profiles are arms of the design, and whether their route env is the arm's: said in the report) and
    carried into the record and the report (not a gate)."""
    remedy = "pass --resume to continue that ablation or --force to overwrite its report"
    refuse_overwrite(out_dir, REPORT_FILES, force or resume, remedy)
    factors, arms = plan_arms(loaded, design)
    if timeline is not None:
        timeline = match_timeline_arms(timeline, {a.name: a.env for a in arms})
    engine = loaded.contract.engine_for("control")
    plans = [ArmPlan(a.name, a.env, engine) for a in arms]
    if report_only:
        quality = {"ran": False, "detail": "--report-only: the results on disk, no engine started"}
    else:
        if max_launches is None:
            run_speed(loaded, out_dir, resume=resume, progress=progress, plans=plans)
        else:
            run_speed_until_decided(
                loaded, out_dir, max_launches, resume=resume, progress=progress, plans=plans
            )
        quality = run_quality_arms(loaded, out_dir, arms, resume, progress)
    record = analyse(loaded, out_dir, design, factors, arms, quality, timeline)
    return record, write_ablation(record, out_dir)


def analyse(
    loaded: LoadedContract,
    out_dir: Path,
    design: str,
    factors: Sequence[Factor],
    arms: Sequence[Arm],
    quality: Mapping[str, Any],
    timeline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Read the arms' results from out_dir and build the ablation record."""
    # Checked as compare checks a result (a --resume continues files on disk: a broken one is refused)
    speed = {a.name: _checked(arm_path(out_dir, a.name), "speed") for a in arms}
    qual = {}
    for a in arms:
        path = out_dir / "quality" / f"{a.name}.json"
        if path.is_file():
            qual[a.name] = _checked(path, "quality")
    paths = {a.name: str(arm_path(out_dir, a.name)) for a in arms}
    return build_record(loaded, design, factors, arms, speed, qual, dict(quality), paths, timeline)


def _checked(path: Path, kind: str) -> dict[str, Any]:
    return read_checked(path, kind)[0]


def write_ablation(record: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """DIR/ablation.json, DIR/ablation.md and DIR/ablation.png, each written atomically."""
    from qgate.report.ablation import ablation_png, render_ablation

    out = Path(out_dir)
    paths = {k: str(out / name) for k, name in zip(("record", "report", "plot"), REPORT_FILES, strict=True)}
    ablation_png(record, paths["plot"])
    atomic_write_text(paths["report"], render_ablation(record))
    atomic_write_json(paths["record"], record)
    return paths


# --- analysis ---------------------------------------------------------------------------------------


def arm_figures(result: Mapping[str, Any], cfg: StatsConfig) -> dict[str, Any]:
    """Per-arm decode tok/s (per rep, the unit's mean and its bootstrap CI), TPOT and TTFT."""
    unit, tok = arm_units(result, "decode_tok_s")
    mean = bootstrap_estimate({"arm": tok}, lambda m: m["arm"], cfg)
    figs = stats_arm_figures(result)
    return {
        "unit": unit,
        "reps": figs["reps"],
        "decode_tok_s": figs["decode_tok_s"],
        "decode_tok_s_mean": mean["estimate"],
        "decode_tok_s_ci": [mean["ci_low"], mean["ci_high"]],
        "decode_tok_s_ci_error": mean["error"],
        "tpot_ms_mean": figs["tpot_ms_mean"],
        "ttft_ms_median": figs["ttft_ms_median"],
        "engine_start_s": [la.get("engine_start_s") for la in result.get("launches") or []],
    }


def _launch_problem(results: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> str | None:
    """The first arm whose reps do not group into their launches (a run cut between two), named as such
    rather than as the NaN units arm_units gives it, or None."""
    return next((f"{n} reps: {w}" for n in names if (w := launch_problem(results[n])) is not None), None)


def effect(ref: str, arm: str, results: Mapping[str, Mapping[str, Any]], cfg: StatsConfig) -> dict[str, Any]:
    """arm against ref: decode tok/s statistics (qgate.stats) and the TPOT change in ms with its CI."""
    unit, a = arm_units(results[ref], "decode_tok_s")
    _, b = arm_units(results[arm], "decode_tok_s")
    why = _launch_problem(results, (ref, arm))
    if why is not None:
        decode = error_record("decode_tok_s", why, True, unit)
    else:
        decode = compare_samples(a, b, cfg, "decode_tok_s", higher_is_better=True, unit=unit)
    _, ta = arm_units(results[ref], "tpot_ms")
    _, tb = arm_units(results[arm], "tpot_ms")
    tpot = bootstrap_estimate({"ref": ta, "arm": tb}, lambda m: m["arm"] - m["ref"], cfg)
    return {"reference": ref, "arm": arm, "decode": decode.to_dict(), "tpot_delta_ms": tpot}


def _interaction(
    total: tuple[str, str], parts: Sequence[tuple[str, str]], results: Mapping, cfg: StatsConfig, basis: str
) -> dict[str, Any]:
    """The interaction from the total and the parts' effects, each (reference arm, arm), on both scales.

    alone basis: total - sum(alone effects); leave-one-out basis: sum(effects added last) - total. Both
    estimate the sum of the pairwise interactions (for two factors both are T(both) - T(a) - T(b) + T(none)
    in TPOT), so the two bases agree in sign and size when the effects are pairwise.
    """
    sign = 1.0 if basis == "alone" else -1.0
    names = sorted({n for pair in (total, *parts) for n in pair})
    out = {
        "basis": basis,
        "total": {"reference": total[0], "arm": total[1]},
        "parts": [{"reference": a, "arm": b} for a, b in parts],
    }
    why = _launch_problem(results, names)
    if why is not None:
        err = {"estimate": None, "ci_low": None, "ci_high": None, "error": why}
        return {**out, "tpot_ms": err, "decode_pct": dict(err)}
    tpot = {n: arm_units(results[n], "tpot_ms")[1] for n in names}
    tok = {n: arm_units(results[n], "decode_tok_s")[1] for n in names}

    def ms(m: Mapping[str, Any]) -> Any:
        return sign * ((m[total[1]] - m[total[0]]) - sum((m[b] - m[a] for a, b in parts), 0.0))

    def pct(m: Mapping[str, Any]) -> Any:
        change = [100.0 * (m[b] / m[a] - 1.0) for a, b in parts]
        return sign * (100.0 * (m[total[1]] / m[total[0]] - 1.0) - sum(change, 0.0))

    out["tpot_ms"], out["decode_pct"] = bootstrap_estimate(tpot, ms, cfg), bootstrap_estimate(tok, pct, cfg)
    return out


def effects(
    factors: Sequence[Factor], arms: Sequence[Arm], results: Mapping, cfg: StatsConfig
) -> dict[str, Any]:
    """The candidate's effect, each factor's alone and leave-one-out effects, and the interactions."""
    by_set = {frozenset(a.factors_on): a.name for a in arms}
    names = [f.name for f in factors]
    alone, loo = {}, {}
    for n in names:
        if frozenset([n]) in by_set:
            alone[n] = effect("control", by_set[frozenset([n])], results, cfg)
        rest = frozenset(m for m in names if m != n)
        if rest in by_set:
            loo[n] = effect(by_set[rest], "candidate", results, cfg)
    out: dict[str, Any] = {
        "candidate": effect("control", "candidate", results, cfg),
        "alone": alone,
        "leave_one_out": loo,
        "interaction": {},
    }
    if len(names) < 2:
        return out  # one factor: its effect is the candidate's, there is nothing to add up
    total = ("control", "candidate")
    if len(alone) == len(names):
        parts = [("control", alone[n]["arm"]) for n in names]
        out["interaction"]["alone"] = _interaction(total, parts, results, cfg, "alone")
    if len(loo) == len(names):
        parts = [(loo[n]["reference"], "candidate") for n in names]
        out["interaction"]["leave_one_out"] = _interaction(total, parts, results, cfg, "leave-one-out")
    return out


def attestation_gates(name: str, result: Mapping[str, Any]) -> list[Gate]:
    """Every route switched on in this arm shows hits; every route off shows none. ERROR-class."""
    res = dict(result)
    if not isinstance(res.get("routes"), dict):
        return [Gate(ARM_ATTESTATION(arm=name), False, "the result has no routes", SEV_ERROR)]
    return [g.prefixed(f"{name}: ") for g in (*routes.ran_gates(res), routes.off_clean_gate(res))]


def arm_gates(
    loaded: LoadedContract, arm: Arm, result: Mapping[str, Any], control: Mapping[str, Any]
) -> list[Gate]:
    """ERROR-class gates of one arm: complete, ran its planned env, comparable with the control, attested."""
    res = dict(result)
    gates = [vd.completeness_gate(res, arm.name)]
    env = sub if isinstance(sub := res.get("env"), dict) else {}
    ok = env == arm.env
    detail = "the result ran the planned env" if ok else f"result env {env} is not the planned {arm.env}"
    gates.append(Gate(ENV_AS_PLANNED(arm=arm.name), ok, detail, SEV_ERROR))
    if arm.name != "control":
        diffs = comparable.differences(dict(control), res, loaded, SPEED_EXTRA_KEYS)
        g = comparable.comparable_gate(diffs)
        gates.append(Gate(COMPARABLE_WITH_CONTROL(arm=arm.name), g.passed, g.detail, g.severity))
    gates += attestation_gates(arm.name, res)
    return gates


def quality_summary(arm: str, result: Mapping[str, Any] | None, control: Mapping[str, Any] | None) -> Any:
    """Misses per arm, and the misses the control did not have; None when the arm has no quality result."""
    if result is None:
        return None
    from qgate.quality.gates import new_misses

    s = result.get("summary") or {}
    new = new_misses(dict(control), dict(result)) if control is not None and arm != "control" else []
    return {
        "n_done": s.get("n_done"),
        "raw_correct": s.get("raw_correct"),
        "strict_correct": s.get("strict_correct"),
        "raw_misses": s.get("raw_misses"),
        "strict_misses": s.get("strict_misses"),
        "new_misses_vs_control": new,
        "complete": bool(result.get("complete")),
    }


def _effect_gates(eff: Mapping[str, Any]) -> list[Gate]:
    pairs = [("candidate", eff["candidate"])]
    pairs += [(f"alone {k}", v) for k, v in eff["alone"].items()]
    pairs += [(f"leave-one-out {k}", v) for k, v in eff["leave_one_out"].items()]
    gates = []
    for label, e in pairs:
        d = e["decode"]
        bad = d["verdict"] == STAT_ERROR or e["tpot_delta_ms"]["error"] is not None
        detail = d.get("error") or e["tpot_delta_ms"]["error"] or f"{d['verdict']}: {d['reason']}"
        gates.append(Gate(EFFECT_COMPUTED(effect=label), not bad, str(detail), SEV_ERROR))
    for basis, inter in eff["interaction"].items():
        err = inter["tpot_ms"]["error"] or inter["decode_pct"]["error"]
        gates.append(Gate(INTERACTION_COMPUTED(basis=basis), err is None, err or "computed", SEV_ERROR))
    return gates


def _notes(launches: int, planned: int) -> list[str]:
    """launches: the engine starts the control's reps come from; planned: the contract's."""
    if launches > 1:
        return []
    if planned > 1:  # a run cut before its second launch: the incomplete arms are ERROR reasons already
        return [f"only 1 of speed.launches = {planned} engine starts an arm has run: resume it (--resume)"]
    return [
        "speed.launches = 1: each arm is one engine start, so differences between engine starts "
        "(machine load, drift) are not in the CIs; use launches >= 4 to test over engine starts"
    ]


def _audit_notes(
    control: Mapping[str, Any], candidate: Mapping[str, Any], gated: bool, same: bool
) -> list[str]:
    """What the audit of the candidate's timed output (MLPerf's TEST01, qgate.speed.audit) found; none
    where the candidate's tokens are the control's (`same`: its arm row's). The ablation gates no speed,
    but an effect of a candidate whose output nobody checked is no evidence: the note says so (a device
    call cut before the audit's engine start, say)."""
    if same:
        return []
    gate = audit_gate(dict(control), dict(candidate), gated)
    if gate.passed:
        return [f"the candidate's timed output, audited (MLPerf TEST01): {gate.detail}"]
    return [
        f"the candidate's timed output is not cleared by the audit ({gate.severity.upper()}): {gate.detail}; "
        "these effects are speed figures: `qgate ablate --resume` runs a missing audit, and `qgate compare` "
        "of speed/control.json and speed/candidate.json gives the verdict"
    ]


def _launches_run(result: Mapping[str, Any], planned: int) -> int:
    """The launches an arm's reps come from (more than the contract's after --until-decided)."""
    launches = {r.get("launch", 0) for r in result.get("reps", []) if isinstance(r, dict)}
    return len(launches) or planned


def _sequential_notes(seq: Any) -> list[str]:
    if not isinstance(seq, dict):
        return []
    if seq.get("decision") is None:
        return ["--until-decided: the sequence was stopped before a look decided (resume it with --resume)"]
    return [
        f"--until-decided: stopped at {seq['stopped_at_launches']} launches per arm, the candidate against "
        f"the control {seq['decision']} ({seq['reason']}); the factors' effects are estimates at that size, "
        "not tested for a stop of their own"
    ]


def build_record(
    loaded: LoadedContract,
    design: str,
    factors: Sequence[Factor],
    arms: Sequence[Arm],
    speed: Mapping[str, Mapping[str, Any]],
    quality_results: Mapping[str, Mapping[str, Any]],
    quality: dict[str, Any],
    paths: Mapping[str, str],
    timeline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ablation record from the arms' speed (and quality) results, with the decode-step timeline
    (qgate.timeline's record) where one was read. Pure: no file access."""
    c = loaded.contract
    assert c.speed is not None
    cfg = StatsConfig.from_contract(c.speed.stats)
    control = speed["control"]
    gates: list[Gate] = []
    arm_rows = []
    for arm in arms:
        res = speed[arm.name]
        arm_g = arm_gates(loaded, arm, res, control)
        gates += arm_g
        arm_rows.append(_arm_row(arm, res, control, cfg, arm_g, paths.get(arm.name, "")))
        arm_rows[-1]["quality"] = quality_summary(
            arm.name, quality_results.get(arm.name), quality_results.get("control")
        )
    eff = effects(factors, arms, speed, cfg)
    gates += _effect_gates(eff)
    status, reasons = decide(gates)
    seq = control.get("sequential") if isinstance(control.get("sequential"), dict) else None
    cand = next(r for r in arm_rows if "candidate" in r["roles"])
    audit = _audit_notes(
        control, speed[cand["name"]], c.speed.gates.identical_tokens, cand["tokens"]["identical_to_control"]
    )
    return {
        "kind": "ablation",
        "schema_version": ABLATION_SCHEMA_VERSION,
        "status": OK if status == PASS else ERROR,
        "reasons": reasons,
        "notes": _notes(_launches_run(control, c.speed.launches), c.speed.launches)
        + _sequential_notes(seq)
        + audit,
        "sequential": seq,
        "created_at": utc_now(),
        "contract": loaded.reference(),
        "design": design,
        "stats": {
            "alpha": cfg.alpha,
            "min_effect_pct": cfg.min_effect_pct,
            "max_cv_pct": cfg.max_cv_pct,
            "bootstrap_resamples": cfg.bootstrap_resamples,
            "seed": cfg.seed,
        },
        "factors": [f.to_dict() for f in factors],
        "arms": arm_rows,
        "effects": eff,
        "quality": quality,
        "gates": [g.to_dict() for g in gates],
        "timeline": None if timeline is None else thaw(timeline),
    }


def _arm_row(
    arm: Arm, res: Mapping[str, Any], control: Mapping[str, Any], cfg: StatsConfig, gates: list, path: str
) -> dict[str, Any]:
    tokens = vd.token_summary(dict(control), dict(res))
    return {
        "name": arm.name,
        "roles": list(arm.roles),
        "factors_on": list(arm.factors_on),
        "env": dict(arm.env),
        "path": path,
        "figures": arm_figures(res, cfg),
        "tokens": {
            "identical_across_reps": tokens["candidate_identical_across_reps"],
            "identical_to_control": tokens["control_vs_candidate_identical"],
            "first_diverging_index": tokens["first_diverging_index"],
            "tokens": tokens["candidate_tokens"],
        },
        "routes": routes.route_summary(dict(res)),
        "attested": all(g.passed for g in gates if ": routes." in g.name or "route attestation" in g.name),
        "gates_passed": all(g.passed for g in gates),
    }


def load_ablation(path: str | Path) -> dict[str, Any]:
    """Read an ablation record back (kind and schema_version checked)."""
    data = load_result(path, "ablation")
    if "arms" not in data or "effects" not in data:
        raise ResultError(f"{path}: an ablation record needs 'arms' and 'effects'")
    tl = data.get("timeline")  # schema 4 (null without --timeline); 2 and 3 have none
    if tl is not None and not (isinstance(tl, dict) and tl.get("kind") == "timeline"):
        raise ResultError(f"{path}: timeline = {cut(repr(tl))}: expected a timeline record or null")
    records.validate("ablation", data, str(path))  # then the typed model (qgate.records.ablation)
    return data
