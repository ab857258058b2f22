"""Refuse to compare: the checks every result kind shares before its own comparison (qgate.compare's
build_verdict runs them once per kind), as qgate.gate.Gate.

The two results must agree on everything but the arm env: contract sha256, model,
prompt, workload, CPU/GPU model, driver, Python/torch/vLLM/qgate versions and engine args.
Engine args rule (the contract may give an arm its own engine overrides under `arms.<arm>.engine`):
a differing engine arg is accepted only when both results carry the sha256 of the contract in hand and
each arm's recorded engine args are exactly `contract.engine_for(arm)`, i.e. the difference is the
one the contract declares. Without the contract in hand, or with any other difference, each differing
key is listed and the verdict is ERROR. Host name and git commit are only noted: the same machine
model and versions on another host, or a later commit, are still comparable. The route attestation
gates (qgate.routes) are shared too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from qgate import routes
from qgate.contract import LoadedContract
from qgate.contract.aa import code_env_differences
from qgate.gate import SEV_ERROR, SEV_INCONCLUSIVE, Gate, gate_name

COMPARABLE = gate_name(
    "comparable arms", __name__, "ERROR",
    "the two results differ in more than the arm env (contract, model, prompt, machine, versions, engine "
    "args the contract does not declare): the comparison would measure something else", "docs/compare.md",
)  # fmt: skip
ARM_ENV = gate_name(
    "arm env", __name__, "INCONCLUSIVE",
    "the arms set env apart that changes what code runs beyond the route switches (LD_PRELOAD, PYTHONPATH, "
    "VLLM_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ...) and the contract's code_env does not declare it: "
    "code no gate measured for what it is", "docs/compare.md",
)  # fmt: skip
ATTESTATION = gate_name(
    "route attestation", __name__, "ERROR",
    "a result's route counts could not be read: nothing proves which code ran", "docs/routes.md",
)  # fmt: skip
FINGERPRINT_KEYS = ("cpu", "cpu_count", "memory_gib", "gpu", "driver", "python", "torch", "vllm", "qgate")
NOTE_KEYS = ("hostname", "git_sha")


def _get(record: dict[str, Any], dotted: str) -> Any:
    cur: Any = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return "<missing>"
        cur = cur[part]
    return cur


def canon(value: Any) -> str:
    """A value as canonical JSON text (sorted keys): what two records are compared by."""
    return json.dumps(value, sort_keys=True, default=str)


def _engine_differences(
    control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract | None
) -> list[str]:
    ce, te = control.get("engine_args"), candidate.get("engine_args")
    if not isinstance(ce, dict) or not isinstance(te, dict):
        return [] if canon(ce) == canon(te) else [f"engine_args: control {ce!r} vs candidate {te!r}"]
    keys = sorted(k for k in set(ce) | set(te) if canon(ce.get(k)) != canon(te.get(k)))
    if not keys:
        return []
    if loaded is not None and _declared_override(control, candidate, loaded):
        return []
    return [
        f"engine_args.{k}: control {ce.get(k, '<missing>')!r} vs candidate {te.get(k, '<missing>')!r}"
        for k in keys
    ]


def _declared_override(control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract) -> bool:
    """True when both arms ran the contract in hand and recorded exactly its per-arm engine args."""
    for result in (control, candidate):
        arm = result.get("arm")
        if _get(result, "contract.sha256") != loaded.sha256 or arm not in ("control", "candidate"):
            return False
        if canon(result.get("engine_args")) != canon(loaded.contract.engine_for(arm)):
            return False
    return True


def differences(
    control: dict[str, Any],
    candidate: dict[str, Any],
    loaded: LoadedContract | None = None,
    extra_keys: Sequence[str] = (),
) -> list[str]:
    """Everything but the arm env in which the two results differ; empty when they may be compared.

    extra_keys: dotted keys a result kind adds (speed: prompt and workload).
    """
    found = []
    keys = ["contract.sha256", "model.spec", "model.config_sha256"]
    keys += [f"fingerprint.{k}" for k in FINGERPRINT_KEYS]
    for key in (*keys, *extra_keys):
        a, b = _get(control, key), _get(candidate, key)
        if canon(a) != canon(b):
            found.append(f"{key}: control {a!r} vs candidate {b!r}")
    if loaded is not None:
        for name, result in (("control", control), ("candidate", candidate)):
            sha = _get(result, "contract.sha256")
            if sha != loaded.sha256:
                found.append(f"contract.sha256: {name} result {sha} vs contract in hand {loaded.sha256}")
    found += _engine_differences(control, candidate, loaded)
    found += _env_not_declared(control, candidate, loaded)
    found += _inherited_env_differences(control, candidate)
    return found


def _inherited_env_differences(control: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """Variables from the shell that can change what vLLM does (the launcher records them under
    `inherited_env`) must agree between the arms, except those an arm's own env sets."""
    a, b = control.get("inherited_env"), candidate.get("inherited_env")
    if a is None and b is None:  # results of a qgate before the record: nothing to check
        return []
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [f"inherited_env: control {a!r} vs candidate {b!r}: one result does not record it"]
    declared = set()
    for result in (control, candidate):
        if isinstance(result.get("env"), dict):
            declared |= set(result["env"])
    keys = sorted(k for k in (set(a) | set(b)) - declared if a.get(k) != b.get(k))
    return [
        f"inherited_env.{k}: control {a.get(k, '<unset>')!r} vs candidate {b.get(k, '<unset>')!r} "
        "(set in the shell, not by the contract: run both arms from the same environment)"
        for k in keys
    ]


def _env_not_declared(
    control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract | None
) -> list[str]:
    """The contract's arm env must be in the result's env (the launcher may add its own variables)."""
    if loaded is None:
        return []
    found = []
    for name, result in (("control", control), ("candidate", candidate)):
        arm = result.get("arm")
        if arm not in ("control", "candidate"):
            continue
        env = sub if isinstance(sub := result.get("env"), dict) else {}
        for key, value in loaded.contract.env_for(arm).items():
            if env.get(key) != value:
                found.append(f"env.{key}: {name} result {env.get(key, '<unset>')!r}, contract says {value!r}")
    return found


def notes(control: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """Differences that do not block the comparison but belong in the report."""
    found = []
    for key in NOTE_KEYS:
        a, b = _get(control, f"fingerprint.{key}"), _get(candidate, f"fingerprint.{key}")
        if a != b:
            found.append(f"fingerprint.{key}: control {a!r} vs candidate {b!r}")
    if control.get("arm") != "control" or candidate.get("arm") != "candidate":
        found.append(
            f"arm labels: control argument is {control.get('arm')!r}, candidate is {candidate.get('arm')!r}"
        )
    return found


def comparable_gate(diffs: Sequence[str]) -> Gate:
    if diffs:
        return Gate(COMPARABLE(), False, "refuse to compare: " + "; ".join(diffs), SEV_ERROR)
    return Gate(COMPARABLE(), True, "the results differ only in the arm env", SEV_ERROR)


def code_env_gate(
    control: dict[str, Any], candidate: dict[str, Any], loaded: LoadedContract | None
) -> Gate | None:
    """The `arm env` gate: the arms' recorded env set apart in a name that changes what code runs beyond
    the route switches and overrides (contract.aa.is_code_env: LD_PRELOAD, PYTHONPATH,
    VLLM_ATTENTION_BACKEND, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS, ...). Code that ran for no route no
    gate measured for what it is, so an undeclared one makes the verdict INCONCLUSIVE (a FAIL stays a
    FAIL: gate.decide); the contract's `code_env` declares it on purpose. None when the arms differ in
    no such name."""
    envs: list[dict[str, Any]] = [
        env if isinstance(env := r.get("env"), dict) else {} for r in (control, candidate)
    ]
    names = code_env_differences(*envs)
    if not names:
        return None
    declared = set(loaded.contract.code_env) if loaded is not None else set()
    said = [f"{k} ({_set_by(k, *envs)})" for k in names]
    undeclared = [s for k, s in zip(names, said, strict=True) if k not in declared]
    if not undeclared:
        return Gate(
            ARM_ENV(), True, f"the arms differ in {', '.join(said)}: declared in code_env", SEV_INCONCLUSIVE
        )
    return Gate(
        ARM_ENV(),
        False,
        f"the arms differ beyond their route switches in {', '.join(undeclared)}, which change what code "
        "runs: no gate measured that code for what it is, so the verdict cannot PASS; declare the names in "
        "the contract's code_env when they are meant",
        SEV_INCONCLUSIVE,
    )


def _set_by(name: str, control: dict[str, Any], candidate: dict[str, Any]) -> str:
    if name not in control:
        return "candidate only"
    if name not in candidate:
        return "control only"
    return "set to other values"


def attestation(control: dict[str, Any], candidate: dict[str, Any], prefix: str = "") -> list[Gate]:
    """Route attestation gates (qgate.routes); every one is ERROR-class. A result the routes module
    cannot read proves nothing ran: ERROR with the reason."""
    try:
        return [g.prefixed(prefix) for g in routes.attestation_gates(control, candidate)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"cannot attest the routes: {type(exc).__name__}: {exc}"
        return [Gate(prefix + ATTESTATION(), False, detail, SEV_ERROR)]
