"""The checks every arm result (speed, quality) passes before anything is computed from it.

A result is evidence only while it is what a run wrote: a key of the wrong type, a non-finite timing
or a header that is not a record (a control whose `contract` is null) is refused here as bad input
(ResultError: exit 2, one line naming the file and the key), never read into a PASS, FAIL or
INCONCLUSIVE. The kind's own checks (qgate.speed.record, qgate.quality.record) build on these.

`Check` names the key of every problem with its dotted path (`reps[3].token_ids`), so the one line says
where the file is wrong.
"""

from __future__ import annotations

import builtins  # Check's methods named str, int, ... hide the builtins in its signatures
import math
import re
from datetime import datetime
from typing import Any

from qgate.errors import cut
from qgate.results import ResultError, ids_sha256

HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_TOKEN_ID = 2**31 - 1  # a vocabulary index; vLLM's token ids are int32
MAX_HITS = 2**63 - 1  # a route's count fits a 64-bit counter
MAX_INDEX = 10**9  # launches, segments: far above any run


class Check:
    """Refuse a record's key in one line: `<file>: <key> = <value>: <why>`."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, value: Any, why: str) -> ResultError:
        return ResultError(f"{self.where}: {key} = {cut(_show(value), 60)}: {why}")

    def dict(self, value: Any, key: builtins.str) -> builtins.dict[builtins.str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, value, "expected a mapping")
        return value

    def list(self, value: Any, key: builtins.str) -> builtins.list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, value, "expected a list")
        return value

    def str(self, value: Any, key: builtins.str, empty: builtins.bool = False) -> builtins.str:
        if not isinstance(value, str) or (not empty and not value):
            raise self.fail(key, value, "expected a non-empty string" if not empty else "expected a string")
        return value

    def scalar(self, value: Any, key: builtins.str) -> Any:
        """A fingerprint's value: text, a number, true / false or null (never a list or mapping)."""
        if value is not None and not isinstance(value, (str, int, float)):
            raise self.fail(key, value, "expected text, a number or null")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, value, "expected a finite number")
        return value

    def bool(self, value: Any, key: builtins.str) -> builtins.bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "expected true or false")
        return value

    def int(
        self, value: Any, key: builtins.str, low: builtins.int = 0, high: builtins.int | None = None
    ) -> builtins.int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, value, "expected an integer")
        if value < low or (high is not None and value > high):
            span = f"{low} to {high}" if high is not None else f"at least {low}"
            raise self.fail(key, value, f"expected an integer {span}")
        return value

    def num(
        self, value: Any, key: builtins.str, low: float, high: float, low_open: builtins.bool = False
    ) -> float:
        """A finite number in [low, high] ((low, high] with low_open): a timing a machine can measure."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, value, "expected a number")
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            finite = False
        if not finite:
            raise self.fail(key, value, "expected a finite number")
        if value < low or (low_open and value == low) or value > high:
            left = "(" if low_open else "["
            raise self.fail(key, value, f"outside {left}{low:g}, {high:g}]: not a physical measurement")
        return float(value)

    def sha(self, value: Any, key: builtins.str) -> builtins.str:
        if not isinstance(value, str) or not HEX64.fullmatch(value):
            raise self.fail(key, value, "expected a sha256 (64 lowercase hex digits)")
        return value

    def time(self, value: Any, key: builtins.str) -> datetime:
        """An ISO 8601 timestamp with its UTC offset (what results.utc_now writes)."""
        if isinstance(value, str):
            try:
                stamp = datetime.fromisoformat(value)
            except ValueError:
                stamp = None
            if stamp is not None and stamp.tzinfo is not None:
                return stamp
        raise self.fail(key, value, "expected an ISO 8601 time with its UTC offset")

    def token_ids(
        self,
        rec: builtins.dict[builtins.str, Any],
        key: builtins.str,
        ids_key: builtins.str,
        sha_key: builtins.str,
        count_key: builtins.str | None,
    ) -> None:
        """A list of token ids (ints), its recorded sha256 and (count_key) its recorded length."""
        ids = self.list(rec.get(ids_key), f"{key}.{ids_key}")
        for i, tok in enumerate(ids):
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= MAX_TOKEN_ID:
                raise self.fail(f"{key}.{ids_key}[{i}]", tok, "expected a token id (an integer >= 0)")
        sha = self.sha(rec.get(sha_key), f"{key}.{sha_key}")
        if sha != ids_sha256(ids):
            raise self.fail(f"{key}.{sha_key}", sha, f"not the sha256 of its {ids_key}")
        if count_key is not None:
            count = self.int(rec.get(count_key), f"{key}.{count_key}")
            if count != len(ids):
                raise self.fail(f"{key}.{count_key}", count, f"but {ids_key} holds {len(ids)} ids")


def _show(value: Any) -> str:
    """A value as the one line shows it (a long string or list cut by the caller)."""
    if isinstance(value, (dict, list)):
        return f"<{type(value).__name__} of {len(value)}>"
    return repr(value)


def check_header(data: dict[str, Any], where: str, run_id: bool) -> Check:
    """The keys every arm result starts with (engine.arms.result_header); run_id: the schema records
    one (a non-empty string). Returns the Check for the kind's own checks."""
    c = Check(where)
    c.str(data.get("arm"), "arm")
    contract = c.dict(data.get("contract"), "contract")
    c.sha(contract.get("sha256"), "contract.sha256")
    c.str(contract.get("name"), "contract.name")
    if contract.get("path") is not None:
        c.str(contract.get("path"), "contract.path")
    env = c.dict(data.get("env"), "env")
    for name, value in env.items():
        c.str(value, f"env.{name}", empty=True)
    if contract.get("version") is not None:
        c.int(contract["version"], "contract.version")
    c.dict(data.get("engine_args"), "engine_args")
    model = c.dict(data.get("model"), "model")
    for key in ("spec", "path", "config_sha256"):
        if model.get(key) is not None:
            c.str(model[key], f"model.{key}")
    if data.get("fingerprint") is not None:
        for key, value in c.dict(data["fingerprint"], "fingerprint").items():
            c.scalar(value, f"fingerprint.{key}")
    check_routes(c, data.get("routes"))
    c.bool(data.get("complete"), "complete")
    for key, kind in (("inherited_env", dict), ("dropped_env", list), ("shims", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise c.fail(key, data[key], f"expected a {'mapping' if kind is dict else 'list'}")
    for i, name in enumerate(data.get("dropped_env") or []):
        c.str(name, f"dropped_env[{i}]")
    for name, value in (data.get("inherited_env") or {}).items():
        c.str(value, f"inherited_env.{name}", empty=True)
    if run_id:
        c.str(data.get("run_id"), "run_id")
    return c


def check_routes(c: Check, routes: Any) -> None:
    """The route attestation (qgate.routes.collect): {route: {hits, fallbacks: {reason: n}, roles: {role:
    n}, captures: {role: n}, ranks: {rank: {hits, roles, starts}}, starts}}, every count an integer >= 0
    (the attestation gates count them), every rank a number."""
    for route, counts in c.dict(routes, "routes").items():
        counts = c.dict(counts, f"routes.{route}")
        if "hits" in counts:
            c.int(counts["hits"], f"routes.{route}.hits", 0, MAX_HITS)
        if "starts" in counts:
            c.int(counts["starts"], f"routes.{route}.starts", 0, MAX_HITS)
        for part in ("fallbacks", "roles", "captures"):
            if part in counts:
                for name, n in c.dict(counts[part], f"routes.{route}.{part}").items():
                    c.int(n, f"routes.{route}.{part}.{name}", 0, MAX_HITS)
        for rank, per_rank in c.dict(counts.get("ranks", {}), f"routes.{route}.ranks").items():
            key = f"routes.{route}.ranks.{rank}"
            if not (rank.isascii() and rank.isdigit()):
                raise c.fail(f"routes.{route}.ranks", rank, "expected a tensor parallel rank (0, 1, ...)")
            per_rank = c.dict(per_rank, key)
            c.int(per_rank.get("hits"), f"{key}.hits", 0, MAX_HITS)
            c.int(per_rank.get("starts"), f"{key}.starts", 0, MAX_HITS)
            for name, n in c.dict(per_rank.get("roles"), f"{key}.roles").items():
                c.int(n, f"{key}.roles.{name}", 0, MAX_HITS)


def check_launches(c: Check, data: dict[str, Any], complete: bool = True) -> dict[int, datetime]:
    """The `launches` records (one per engine start: launch, segment, engine_start_s, started_at); the
    first start of each launch. complete=False: a key a record lacks is not asked for (a hand-written
    reference result), one it holds must be of its type."""
    first: dict[int, datetime] = {}
    segments: set[int] = set()
    for i, rec in enumerate(c.list(data.get("launches"), "launches")):
        key = f"launches[{i}]"
        rec = c.dict(rec, key)
        launch = c.int(rec.get("launch", 0), f"{key}.launch", 0, MAX_INDEX)
        if complete or "segment" in rec:
            segment = c.int(rec.get("segment"), f"{key}.segment", 0, MAX_INDEX)
            if segment in segments:
                raise c.fail(f"{key}.segment", segment, "appears twice: every engine start is one segment")
            segments.add(segment)
        if complete or "engine_start_s" in rec:
            c.num(rec.get("engine_start_s"), f"{key}.engine_start_s", 0.0, 1e6)
        if complete or "started_at" in rec:
            stamp = c.time(rec.get("started_at"), f"{key}.started_at")
            first[launch] = min(stamp, first.get(launch, stamp))
    return first
