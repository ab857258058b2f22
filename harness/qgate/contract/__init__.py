"""Strict contract schema: load, validate and hash a qgate contract YAML.

A contract fixes the workload of a gate. Every key is known: an unknown key, a
wrong type or an impossible value is a ContractError naming the file, the key
path, the value and what was expected. Nothing is defaulted with a warning.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from qgate.contract.aa import aa_problem
from qgate.contract.base import EngineSeed, Strict
from qgate.contract.messages import ContractError, first_error, format_loc
from qgate.contract.ops import Ops
from qgate.contract.quality import Quality
from qgate.contract.speed import Speed
from qgate.contract.strict_yaml import MAX_BYTES, StrictYamlError, describe_yaml_error, load_yaml
from qgate.launch_env import LAUNCHER_ENV
from qgate.models import spec_problem
from qgate.route_roles import Routes, roles_env
from qgate_route_env import (
    OVERRIDE_PREFIX,
    ROLES_ENV,
    ROUTES,
    SHIMS_ENV,
    SITES_ENV,
    SWITCH_PREFIX,
    override_var,
    static_problems,
)

CONTRACT_SCHEMA_VERSION = 1
# Far above an engine start (8-200 s measured on the CPU test machine, compiled GPU starts take minutes)
# and far below a nightly's 90-minute step limit, which a hung engine would otherwise run into.
STALL_TIMEOUT_S = 1800.0
# The engine start counts as silence (no record until the engine is ready): below the shortest start
# measured (8 s in process on the CPU test machine, with room for a loaded machine) every run would
# "stall" before its first record.
MIN_STALL_TIMEOUT_S = 30.0
# Keys that change how a run is policed, not what it measures: not hashed, so results of a contract
# that differs only in them stay comparable (`aa: true` added to the contract of an A/A run recorded
# before the key existed keeps its sha256: the env, which is what ran, is hashed).
UNHASHED_KEYS = ("stall_timeout_s", "aa", "code_env")


# Engine args added after contracts were recorded: hashed only when set, so every earlier contract keeps
# its sha256 (its results and history rows stay its own).
ENGINE_KEYS_HASHED_WHEN_SET = ("gdn_prefill_backend", "additional_config")
# The same for the speed section's keys added later (the distribution audit, TEST04's repeats).
SPEED_KEYS_HASHED_WHEN_SET = ("audit_top_k", "repeat_reps")
# The keys of vLLM 0.32's `additional_config` that vLLM itself reads, and the values it takes there
# (qwen_gdn_linear_attn._resolve_gdn_prefill_backend: 'auto' or a backend; the EngineArg writes it).
ADDITIONAL_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "gdn_prefill_backend": ("auto", "flashinfer", "triton", "cutedsl", "aiter_flydsl"),
}


class Engine(Strict):
    """vLLM engine args under their vLLM names, passed through to vllm.LLM unchanged.

    Only args listed here are accepted so that a typo is an error, not a silently ignored key.
    """

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    dtype: Literal["auto", "float16", "bfloat16", "float32", "half"] | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    swap_space: float | None = Field(None, ge=0)
    block_size: int | None = Field(None, ge=1)
    seed: EngineSeed | None = None
    trust_remote_code: bool | None = None
    tokenizer: str | None = None
    revision: str | None = None
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = None
    compilation_config: dict[str, Any] | None = None
    speculative_config: dict[str, Any] | None = None
    hf_overrides: dict[str, Any] | None = None
    # vLLM 0.32 EngineArgs: the GDN prefill kernels (Qwen3-Next / Qwen3.5 / Qwen4Exp). On SM90 'auto'
    # picks FlashInfer without checking that it is installed; a GPU image without it says `triton`.
    gdn_prefill_backend: Literal["flashinfer", "triton", "cutedsl", "aiter_flydsl"] | None = None
    additional_config: dict[str, Any] | None = Field(
        None,
        description="vLLM's free-form `additional_config` (platform plugins read it; vLLM 0.32's GDN "
        "prefill resolver reads `gdn_prefill_backend` from it): string keys, JSON values; the keys vLLM "
        "0.32 itself reads (ADDITIONAL_CONFIG_KEYS) are checked, every other key goes to vLLM unchecked "
        "and is recorded with the contract (docs/routes.md)",
    )

    @model_validator(mode="after")
    def _additional_config_checked(self) -> Engine:
        extra = self.additional_config
        if extra is None:
            return self
        for key, value in extra.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"additional_config: key {key!r} is not a name")
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise ValueError(f"additional_config.{key}: {value!r} is not a JSON value") from None
            allowed = ADDITIONAL_CONFIG_KEYS.get(key)
            if allowed is not None and value not in allowed:
                raise ValueError(f"additional_config.{key} = {value!r}: expected one of {', '.join(allowed)}")
        both = extra.get("gdn_prefill_backend"), self.gdn_prefill_backend
        if None not in both and both[0] != both[1]:
            # vLLM would silently let the engine arg win; a contract says one thing.
            raise ValueError(
                f"gdn_prefill_backend = {both[1]!r} and additional_config.gdn_prefill_backend = {both[0]!r} "
                "differ: set one"
            )
        return self

    def vllm_kwargs(self) -> dict[str, Any]:
        """The args that were set, as keyword arguments for vllm.LLM."""
        return self.model_dump(exclude_none=True)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_values_are_strings(env: Any) -> dict[str, str]:
    if not isinstance(env, dict):  # `env:` left empty, or a list or a string
        raise ValueError(f'expected a mapping of NAME: "value" (write `env: {{}}` for none), got {env!r}')
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ValueError(f"env name {key!r}: expected letters, digits and _ (no '=', spaces or NUL)")
        if key in LAUNCHER_ENV:
            raise ValueError(f"env name {key}: set by qgate's launcher for every engine, not by an arm")
        if not isinstance(value, str):
            raise ValueError(f"env value for {key} must be a string (quote it in YAML), got {value!r}")
        if "\0" in value:
            raise ValueError(f"env value for {key} contains a NUL byte, which no environment can hold")
    return env


def _overrides_model() -> type[Strict]:
    """Engine's fields, each optional (unset: the shared value), with Engine's types and bounds: an arm's
    override is checked as the shared arg is; the merged args go through Engine again (engine_for)."""
    fields: dict[str, Any] = {}
    for name, info in Engine.model_fields.items():
        field = copy.copy(info)
        field.default, field.default_factory = None, None
        assert info.annotation is not None  # every Engine field is annotated
        fields[name] = (info.annotation | None, field)
    return create_model("EngineOverrides", __base__=Strict, __doc__=_OVERRIDES_DOC, **fields)


_OVERRIDES_DOC = """One arm's engine args on top of the shared `engine:` (same keys, types and bounds); `null`
unsets the shared value (vLLM's default). The merged args are checked as the shared section is."""
EngineOverrides = _overrides_model()


class Arm(Strict):
    env: dict[str, str] = Field(default_factory=dict)
    engine: EngineOverrides = Field(default_factory=EngineOverrides)  # type: ignore[valid-type]

    _check_env = field_validator("env", mode="before")(_env_values_are_strings)

    @field_serializer("engine")
    def _as_written(self, engine: Strict) -> dict[str, Any]:
        """Only the keys the arm sets (what the contract's sha256 has always hashed)."""
        return engine.model_dump(mode="json", exclude_unset=True)


class Arms(Strict):
    control: Arm
    candidate: Arm


class Contract(Strict):
    schema_version: Literal[1] = 1
    name: str = Field(min_length=1)
    version: int | str
    description: str = ""
    model: str = Field(
        min_length=1,
        description="a local model directory (a path: ~, relative or absolute; a hub id's org/name form is "
        "read as a relative path), or a built-in: tiny, tiny-trained, tiny-trained-wide, tiny-qwen4exp; "
        "a URL (file://, s3://, https://), any scheme: and a name of many lines are refused",
    )
    engine: Engine = Field(default_factory=Engine)
    arms: Arms
    speed: Speed | None = None
    quality: Quality | None = None
    ops: Ops | None = None
    shims: list[str] = Field(
        default_factory=list,
        description="platform shims (qgate_kernels.shims, e.g. qwen4exp_fp16_cpu) applied in every vLLM "
        "process of both arms alike (env QGATE_SHIMS); listed in the result and report, never route hits",
    )
    stall_timeout_s: float | None = Field(
        STALL_TIMEOUT_S,
        ge=MIN_STALL_TIMEOUT_S,
        description="a run whose engine sends no record (engine ready, a rep, an item) for this many seconds "
        "has stalled: it ends like a dead engine (one line, exit 1, the records kept, --resume continues); "
        "null: never. Run policy, not workload: left out of the contract's sha256",
    )
    sites: dict[str, str] = Field(
        default_factory=dict,
        description="route sites for a vLLM fork, the same for both arms (env QGATE_SITES): "
        "'<route>.<kind>' -> 'module:Class.method' or 'module:function'; unset keys keep vLLM 0.32's "
        "Qwen4Exp sites (docs/routes.md); checked before the engine starts",
    )
    routes: Routes | None = Field(
        None,
        description="the roles (vLLM module names) each route takes, both arms alike "
        "(env QGATE_ROUTE_ROLES); "
        "unset: the GEMV route's default roles, unchecked (docs/routes.md)",
    )
    aa: bool = Field(
        False,
        description="the arms are meant to run the same thing: an A/A (the noise of one configuration "
        "against itself; `qgate compare --aa` compares its results). Unset: arms that mean the same "
        "(routes on, read as on/off however spelt, their overrides, the other env and the engine args) "
        "are refused as an unannounced A/A (a contract with speed or quality); set: arms that differ are "
        "refused. Policy, not workload: left out of the contract's sha256 (the env that ran is in it)",
    )
    code_env: list[str] = Field(
        default_factory=list,
        description="env names the arms set apart (in one arm only, or to other values) that change what "
        "code runs beyond the route switches and overrides: the loader (LD_*), Python's path and start-up "
        "(PYTHON*), engine and library settings (VLLM_*, CUDA_*, OMP_*, TORCH*, TRITON_*, ...), qgate's "
        "own knobs (QGATE_*). Undeclared, such a difference fails the comparison's `arm env` gate: the "
        "speed and quality verdicts are INCONCLUSIVE at best. Each name must be set by an arm. Policy, "
        "not workload: left out of the contract's sha256",
    )

    @field_validator("model")
    @classmethod
    def _loadable_model(cls, model: str) -> str:
        problem = spec_problem(model)
        if problem is not None:
            raise ValueError(problem)
        return model

    @model_validator(mode="after")
    def _code_env_is_set(self) -> Contract:
        names = set(self.arms.control.env) | set(self.arms.candidate.env)
        for i, key in enumerate(self.code_env):
            if key not in names:
                raise ValueError(
                    f"code_env[{i}]: {key!r} is set by neither arm's env: declare only what an arm sets"
                )
            if key in self.code_env[:i]:
                raise ValueError(f"code_env[{i}]: {key} is declared twice")
        return self

    @model_validator(mode="after")
    def _something_to_gate(self) -> Contract:
        if self.speed is None and self.quality is None and self.ops is None:
            raise ValueError("nothing to gate: the contract has no speed, quality or ops section")
        return self

    @model_validator(mode="after")
    def _reps_can_reach_alpha(self) -> Contract:
        if self.speed is not None:
            n = self.speed.repetitions * self.speed.launches
            alpha = self.speed.stats.alpha
            # In log space: C(2n, n) overflows a float at n >= 515.
            log_comb = math.lgamma(2 * n + 1) - 2 * math.lgamma(n + 1)
            smallest = min(1.0, 2.0 * math.exp(-log_comb))
            if smallest >= alpha:
                raise ValueError(
                    f"speed.repetitions x speed.launches = {self.speed.repetitions} x {self.speed.launches} "
                    f"= {n} reps per arm: the smallest exact Mann-Whitney p of {n} v {n} is {smallest:.3g}, "
                    f"which can never reach speed.stats.alpha = {alpha:g}; expected at least "
                    f"{_min_reps(alpha)} reps per arm"
                )
        return self

    @model_validator(mode="after")
    def _known_route_env(self) -> Contract:
        for arm_name in ("control", "candidate"):
            env = getattr(self.arms, arm_name).env
            for key in env:
                problem = route_env_typo(key)
                if problem:
                    raise ValueError(f"arms.{arm_name}.env.{key}: {problem}")
            # What the run's pre-flight refuses without importing anything (switch values such as
            # `ture` or `2`, overrides of routes that are off, specs that are no module:function).
            problems = static_problems(env)
            if problems:
                raise ValueError(f"arms.{arm_name}.env: {problems[0]}")
        return self

    @model_validator(mode="after")
    def _known_shims_and_sites(self) -> Contract:
        from qgate_route_env import platform_env_problem

        problem = platform_env_problem(self.shims, self.sites)
        if problem:
            raise ValueError(problem)
        for arm_name in ("control", "candidate"):
            for key in getattr(self.arms, arm_name).env:
                if key in (SHIMS_ENV, SITES_ENV):
                    field = "shims" if key == SHIMS_ENV else "sites"
                    raise ValueError(
                        f"arms.{arm_name}.env.{key}: set the contract's `{field}:` instead (both arms)"
                    )
        return self

    @model_validator(mode="after")
    def _input_fits(self) -> Contract:
        if self.speed is not None:
            for arm_name in ("control", "candidate"):
                limit = self.engine_for(arm_name).get("max_model_len")
                need = self.speed.input_tokens + self.speed.output_tokens
                if limit is not None and need > limit:
                    raise ValueError(
                        f"speed.input_tokens + speed.output_tokens = {need}: exceeds "
                        f"engine.max_model_len = {limit} (arm {arm_name}); expected at most {limit}"
                    )
        return self

    def engine_for(self, arm: str) -> dict[str, Any]:
        """Engine kwargs for one arm: the shared engine args with the arm's overrides on top (an
        override of null unsets the shared arg), checked as the shared section is."""
        merged = self.engine.vllm_kwargs() | getattr(self.arms, arm).engine.model_dump(exclude_unset=True)
        return Engine.model_validate({k: v for k, v in merged.items() if v is not None}).vllm_kwargs()

    @model_validator(mode="after")
    def _arm_engines_valid(self) -> Contract:
        for arm_name in ("control", "candidate"):
            try:
                self.engine_for(arm_name)
            except ValidationError as exc:
                err = exc.errors()[0]
                key, msg = format_loc(tuple(err["loc"])), err["msg"].removeprefix("Value error, ")
                raise ValueError(f"arms.{arm_name}.engine merged with engine: {key}: {msg}") from None
        return self

    def env_for(self, arm: str) -> dict[str, str]:
        """The arm's env, plus the contract's shims and sites (the same in both arms)."""
        from qgate_route_env import platform_env

        return (
            dict(getattr(self.arms, arm).env) | platform_env(self.shims, self.sites) | roles_env(self.routes)
        )

    @model_validator(mode="after")
    def _roles_not_in_arm_env(self) -> Contract:
        for arm_name in ("control", "candidate"):
            if ROLES_ENV in getattr(self.arms, arm_name).env:
                raise ValueError(
                    f"arms.{arm_name}.env.{ROLES_ENV}: set the contract's `routes:` instead (both arms)"
                )
        return self

    @model_validator(mode="after")
    def _aa_announced(self) -> Contract:
        """Arms that mean the same (the routes on, a switch read as on or off however it is spelt; their
        overrides; the other env; the engine args) are an A/A, refused unless `aa: true`; with `aa: true`,
        arms that differ are refused. A contract with only `ops:` never runs its arms against each
        other: its arms may be equal.

        contract/aa.py says why."""
        if not self.aa and self.speed is None and self.quality is None:
            return self
        arms = [(getattr(self.arms, a).env, self.engine_for(a)) for a in ("control", "candidate")]
        problem = aa_problem(arms[0], arms[1], self.aa)
        if problem:
            raise ValueError(problem)
        return self


def _min_reps(alpha: float) -> int:
    n = 1
    while 2.0 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def route_env_typo(key: str) -> str | None:
    """Why an arm env key looks like a route switch or route override but is none qgate knows; else None.

    The known names come from qgate_route_env (route switches ROUTES, overrides OVERRIDE_PREFIX + route):
    a key with their prefix (in any case) that is not one of them, or a key within a few edits of one.
    """
    switches = sorted(ROUTES.values())
    overrides = sorted(override_var(r) for r in ROUTES)
    known = switches + overrides
    if key in known:
        return None
    upper = key.upper()
    hint = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
    did_you_mean = f"; did you mean {hint[0]}?" if hint else ""
    if upper.startswith(SWITCH_PREFIX):
        return f"not a known route switch (known: {', '.join(switches)}){did_you_mean}"
    if upper.startswith(OVERRIDE_PREFIX):
        return f"not a known route override (known: {', '.join(overrides)}){did_you_mean}"
    if hint:
        return f"looks like a route switch or override but is not a known one{did_you_mean}"
    return None


class LoadedContract(BaseModel):
    """A validated contract with where it came from and its canonical hash."""

    model_config = ConfigDict(frozen=True)
    path: str
    sha256: str
    contract: Contract

    def reference(self) -> dict[str, Any]:
        """What every record says of the contract it ran or was judged under."""
        c = self.contract
        return {"name": c.name, "version": c.version, "sha256": self.sha256, "path": self.path}


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def parse_contract(data: Any, path: Path) -> Contract:
    if not isinstance(data, dict):
        raise ContractError(f"{path}: <top> = {type(data).__name__}: expected a mapping")
    try:
        return Contract.model_validate(data)
    except ValidationError as exc:
        raise first_error(path, data, exc, Contract) from None


# Contracts renamed to card-neutral names (the *-h200.yaml ones run on H100s too): a path under an old
# name that is not there is refused in one line naming the new one, so an old command line finds its way.
RENAMED = {
    "demo-h200.yaml": "demo-gpu.yaml",
    "qwen38-prodshape-bf16-h200.yaml": "qwen38-prodshape-bf16.yaml",
    "qwen38-prodshape-fp16-h200.yaml": "qwen38-prodshape-fp16.yaml",
    "qwen4exp-bf16-h200.yaml": "qwen4exp-bf16-gpu.yaml",
    "qwen4exp-fp16-h200.yaml": "qwen4exp-fp16-gpu.yaml",
}


def load_contract(path: str | Path) -> LoadedContract:
    """Read, validate and hash a contract; raise ContractError with one clear line.

    The YAML is read strictly (contract/strict_yaml.py): at most MAX_BYTES, UTF-8, no duplicate keys, no alias
    expansion beyond a small bound, no NaN or infinity."""
    p = Path(path)
    try:
        # A FIFO or a device given as a contract must not block the read (open() waits for a writer):
        # its type is checked before opening, and again on the descriptor, opened non-blocking.
        if not stat.S_ISREG(os.stat(p).st_mode):
            raise ContractError(f"{p}: not a regular file: a contract is a YAML file")
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ContractError(f"{p}: not a regular file: a contract is a YAML file")
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        if p.name in RENAMED:
            new = p.with_name(RENAMED[p.name])
            raise ContractError(f"{p}: renamed to {new} (card-neutral: it runs on H100s too)") from None
        raise ContractError(f"{p}: cannot read contract: No such file or directory") from None
    except OSError as exc:
        raise ContractError(f"{p}: cannot read contract: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise ContractError(f"{p}: larger than {MAX_BYTES // 1024} KiB: not a contract")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError(f"{p}: not UTF-8 text (byte {exc.start}): not a contract") from None
    try:
        data = load_yaml(text)
    except StrictYamlError as exc:
        raise ContractError(f"{p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ContractError(f"{p}: {describe_yaml_error(exc, text)}") from None
    contract = parse_contract(data, p)
    resolved = contract.model_dump(mode="json", exclude=set(UNHASHED_KEYS))
    for key in ENGINE_KEYS_HASHED_WHEN_SET:
        if resolved["engine"].get(key, 0) is None:
            del resolved["engine"][key]  # unset: the hash a contract had before the key existed
    for key in SPEED_KEYS_HASHED_WHEN_SET:
        if isinstance(resolved.get("speed"), dict) and resolved["speed"].get(key, 0) is None:
            del resolved["speed"][key]
    digest = hashlib.sha256(canonical_json(resolved).encode()).hexdigest()
    return LoadedContract(path=str(p), sha256=digest, contract=contract)
