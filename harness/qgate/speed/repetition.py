"""No speed from repetition (MLPerf's TEST04): does the candidate gain from inputs it has seen before?

A route that remembers its results by input (a memo: exact, so no output check can see it) is faster
wherever inputs recur, and decoding repeats them: every occurrence of a token feeds the first layer the
same bytes. With `speed.repeat_reps` set, each launch of both arms decodes its first rep's prompt again
after its timed reps (qgate.speed.workload.run_reps): the same route inputs at every step. An honest
route costs the same the second time; a memo costs almost nothing. The gate compares each arm's cost of
a repeat with the cost of the rep it repeats (the repetition gain: original / repeat) and FAILs when
the candidate's median gain exceeds the control's by more than MAX_EXCESS_GAIN, where it can: on a CPU
the repeat's cost is too noisy (CPU_NOISE) and the gate reports without failing.

The cost is the engine's CPU seconds over the rep (`cpu_s`, the engine child's process time) where the
engine runs inside that process on a CPU (VLLM_ENABLE_V1_MULTIPROCESSING=0 in both arms, no GPU: the
CPU demo), since other processes' load stretches a CPU machine's wall clock by tens of percent between
reps; elsewhere (a GPU, whose work no host clock of CPU time sees) the decode seconds.
docs/speed-audit.md gives the measurements behind MAX_EXCESS_GAIN; tests/test_dist_audit.py its rule.

Pure: plain data in, Gate and plain data out.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from qgate.gate import SEV_ERROR, SEV_FAIL, Gate, gate_name

NAME = gate_name(
    "no speed from repeated inputs (TEST04)", __name__, "FAIL or ERROR",
    "the candidate decodes a prompt it has decoded before cheaper than the control does: a result cache's "
    "speed (MLPerf TEST04)", "docs/speed-audit.md",
)()  # fmt: skip
# The candidate's median repetition gain over the control's above which the gate FAILs (a ratio - 1).
MAX_EXCESS_GAIN = 0.5
# Why the gate does not fail on a CPU (docs/speed-audit.md section 5): there the excess ranged -11 % to
# +48 % over honest candidates and the memo alike, under load; the screen's seen-input probe is the check.
CPU_NOISE = (
    "a repeat's CPU cost there varies by tens of percent (honest candidates measured up to +48 %); the "
    "operator screen's seen-input probe is what catches a result cache"
)


def cpu_work(result: dict[str, Any]) -> bool:
    """Whether the arm's decode work is the engine child's CPU time: its engine core ran inside that
    process, and on no GPU (there the host's CPU time is launches and waits, the work the GPU's)."""
    env = e if isinstance(e := result.get("env"), dict) else {}
    fp = f if isinstance(f := result.get("fingerprint"), dict) else {}
    return str(env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "")).strip() == "0" and not fp.get("gpu")


def _cost(rep: dict[str, Any], cpu: bool) -> float | None:
    if cpu:
        v = rep.get("cpu_s")
    else:
        tok_s, n = rep.get("decode_tok_s"), rep.get("output_tokens")
        v = (n - 1) / tok_s if isinstance(tok_s, (int, float)) and isinstance(n, int) and tok_s > 0 else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def gains(result: dict[str, Any], cpu: bool) -> tuple[list[float], list[str]]:
    """Each repeat's gain (the cost of the rep it repeats / its own) and the problems found (a repeat of
    no recorded rep, a cost that is not a positive number, tokens that are not the original's)."""
    reps = {(r.get("launch"), r.get("index")): r for r in result.get("reps") or [] if isinstance(r, dict)}
    out, problems = [], []
    for again in result.get("repeats") or []:
        if not isinstance(again, dict):
            problems.append("a repeat that is not a record")
            continue
        key = (again.get("launch"), again.get("index"))
        orig = reps.get(key)
        if orig is None:
            problems.append(f"repeat of launch {key[0]} rep {key[1]}: no such rep")
            continue
        a, b = _cost(orig, cpu), _cost(again, cpu)
        if a is None or b is None:
            what = "cpu_s" if cpu else "decode"
            problems.append(f"repeat of rep {key[1]}: its cost ({what}) is not a number")
            continue
        if again.get("token_ids_sha256") != orig.get("token_ids_sha256"):
            problems.append(f"repeat of rep {key[1]} decoded other tokens than the rep")
        out.append(a / b)
    return out, problems


def summary(control: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    cpu = cpu_work(control) and cpu_work(candidate)
    (c, cp), (t, tp) = gains(control, cpu), gains(candidate, cpu)
    excess = median(t) / median(c) - 1.0 if c and t else None
    return {
        "cost": "cpu_s" if cpu else "decode_s",
        "control_gains": c,
        "candidate_gains": t,
        "control_problems": cp,
        "candidate_problems": tp,
        "excess_gain": excess,
        "max_excess_gain": MAX_EXCESS_GAIN,
    }


def repetition_gate(
    control: dict[str, Any], candidate: dict[str, Any], repeat_reps: int | None
) -> tuple[Gate, dict[str, Any] | None]:
    """Not asked: a passed gate that says so. ERROR: asked, and an arm records no usable repeat.
    FAIL: the candidate's median repetition gain exceeds the control's by more than MAX_EXCESS_GAIN,
    where the cost is the decode's seconds (a GPU); on a CPU (cpu_s) reported, never failing."""
    if not repeat_reps:
        return Gate(NAME, True, "not run: speed.repeat_reps is unset (a result cache's gain from "
                    "repeated inputs is not looked for)"), None  # fmt: skip
    s = summary(control, candidate)
    broken = [p for p in (*s["control_problems"], *s["candidate_problems"]) if "tokens" not in p]
    if broken or s["excess_gain"] is None:
        why = broken[0] if broken else "an arm records no repeated rep"
        return Gate(NAME, False, f"{why}: the repetition check cannot be computed", SEV_ERROR), s
    fact = (
        f"repeating a rep's prompt made it {median(s['candidate_gains']):.2f}x cheaper for the candidate, "
        f"{median(s['control_gains']):.2f}x for the control ({len(s['candidate_gains'])} and "
        f"{len(s['control_gains'])} repeats, cost {s['cost']}): excess {100 * s['excess_gain']:+.1f} % "
        f"(fails above {100 * MAX_EXCESS_GAIN:+g} %)"
    )
    notes = [p for p in s["candidate_problems"] if "tokens" in p]
    if notes:
        fact += f"; {notes[0]}"
    if s["excess_gain"] > MAX_EXCESS_GAIN and s["cost"] == "cpu_s":
        return Gate(NAME, True, f"{fact}; not gated on a CPU: {CPU_NOISE}"), s
    if s["excess_gain"] > MAX_EXCESS_GAIN:
        return Gate(NAME, False, f"{fact}: the candidate is faster on inputs it has seen (a result cache)",
                    SEV_FAIL), s  # fmt: skip
    return Gate(NAME, True, fact), s
