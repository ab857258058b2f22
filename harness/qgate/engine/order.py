"""The order of the arms' engine starts within each launch: a seeded random first order, alternated.

Which arm starts first matters: the first engine start of a run is often slower (cold page cache,
compile cache, clocks), and a machine drifts. Always starting the control first put that start in the
control arm on every run: a first start 3 % slow passed a candidate slower by the margin 4.1 % of the
time at the production limits (`--until-decided` 3..5 launches), where the target is alpha/2 = 2.5 %
(docs/compare.md, "Launch order"). So:

* the first launch's order is a random permutation of the arms, drawn from a seed chosen per run
  (`secrets`, so that no contract or night always puts one arm first) and recorded in every arm's
  result (`launch_order`), so the order is known and reproducible;
* every launch runs the arms in that order (scheme "alternate": A B | A B | ...), so the starts of one
  arm are never adjacent. ABBA (A B | B A) cancels a linear drift at even launch counts, but puts an
  arm's two middle starts side by side, where one burst of load on a shared machine shifts both and the
  between-launch variance does not see it (a real A/A at 2 launches FAILed that way, 2026-12-04); a
  drift's bias here has the random sign of the first arm;
* a resumed run (`--resume`, and each look of `--until-decided`, which resumes its own run) keeps the
  order its results recorded; results written before orders were recorded ran the control first,
  and go on that way (scheme "control first").

Plain data: names in, an immutable record out; the spine (engine/arms.py) asks it for each launch.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ORDER_SCHEMA_VERSION = 1
ALTERNATE = "alternate"
FIXED = "control first"  # results from before the order was recorded: every launch in the plan's order


@dataclass(frozen=True)
class LaunchOrder:
    """The arms' order for every launch of a run: `first`, every launch."""

    scheme: str
    first: tuple[str, ...]
    seed: int | None = None
    schema_version: int = ORDER_SCHEMA_VERSION

    def arms(self, launch: int) -> tuple[str, ...]:
        """The arm names in the order their engines start in launch `launch` (0-based)."""
        return self.first

    def position(self, arm: str, launch: int) -> int:
        """The engine start's index within the run (0: the run's first engine start)."""
        return launch * len(self.first) + self.arms(launch).index(arm)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "first": list(self.first),
            "seed": self.seed,
            "schema_version": self.schema_version,
        }


def draw_seed() -> int:
    """A run's own seed (tests whose subject needs one arm first set theirs: tests/test_launch_order.py)."""
    return secrets.randbits(32)


def new_order(names: Sequence[str], seed: int | None = None) -> LaunchOrder:
    """A random first order, alternated; `seed` None draws one (a run's own), else it is reproduced."""
    seed = draw_seed() if seed is None else seed
    first = list(names)
    random.Random(seed).shuffle(first)
    return LaunchOrder(ALTERNATE, tuple(first), seed)


def from_record(record: Any, names: Sequence[str]) -> LaunchOrder | None:
    """A result's recorded `launch_order` for these arms, or None when it records none usable."""
    if not isinstance(record, dict) or record.get("scheme") not in (ALTERNATE, FIXED):
        return None
    first = record.get("first")
    if not isinstance(first, list) or sorted(map(str, first)) != sorted(names):
        return None
    seed = record.get("seed")
    return LaunchOrder(
        str(record["scheme"]), tuple(str(x) for x in first), seed if isinstance(seed, int) else None
    )


def plan_order(names: Sequence[str], results: Iterable[dict[str, Any]]) -> LaunchOrder:
    """The order of a run whose arm results (fresh or resumed) are `results`: the one they recorded,
    "control first" for resumed results of before the order was recorded, else a new one."""
    results = list(results)
    for result in results:
        found = from_record(result.get("launch_order"), names)
        if found is not None:
            return found
    if any(result.get("launches") for result in results):  # resumed, written before orders were kept
        return LaunchOrder(FIXED, tuple(names))
    return new_order(names)
