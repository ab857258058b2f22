"""A recording of the route plugin (qgate_kernels.record) read per TP rank for `run ops --real --activations`.

A recording directory holds `rank<r>/` per tensor parallel rank of the engine that wrote it: `rank.json`
(the rank and the TP size), and per routed site `<route>/<name>.pt` (the recorded calls) beside
`<name>.json` (the shapes of the weights the site held on that rank). Here:

- `open_recording(root, tp)`: the rank directories against the screen's TP size. A rank recorded at
  another TP size, a `rank<r>` past the screen's ranks, or a screened rank with nothing recorded while
  another rank has a recording is a failure line (the record FAILs): the slices would not be the ones
  the engine's workers held.
- `site_inputs(rec, rank, site, dev)`: a site's recorded calls, after checking them against that
  rank's slice of the checkpoint: the weights' shapes the worker held against the slice's tensors, and
  each call's input shapes against what the slice takes. A mismatch gives no inputs and one failure
  line naming both (the recorded shape and file, the slice's shape).
- `screen_topk(rec, dev)`: the QSA indexer's score rows recorded at `_topk` on each rank, through the
  route (qgate_kernels.qsa_topk) and its reference (reference.qsa_topk): per row the exact index set,
  and the reference's order. `topk_agreement` is the one place the order is judged: element for element
  against the reference's output, whatever order the reference defines (today: by value descending,
  equal values by increasing index; rows of at most k visible blocks in increasing index).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from qgate.errors import QgateError
from qgate.ops.weights import Site
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_TOPK

RANK_FILE = "rank.json"  # qgate_kernels.record.RANK_FILE (the plugin is not imported here)
TOPK_NAME = "_topk"  # qgate_kernels.record.TOPK_NAME
_RANK_DIR = re.compile(r"rank(\d+)")
_MAX_LINES = 20  # failure lines kept in a section (the count is always whole)


class RecordingError(QgateError):
    """A recording file that cannot be read (bad input, exit 2); str() is one line naming the file."""


def _json(path: Path, key: str) -> Any:
    try:
        return json.loads(path.read_text())[key]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RecordingError(f"{path}: not a recording's file ({type(exc).__name__}: {exc})") from None


def _calls(path: Path) -> list[Any]:
    try:
        calls = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (torch.load raises many kinds on a corrupt file)
        raise RecordingError(f"{path}: not a recording's file ({type(exc).__name__})") from None
    if not isinstance(calls, list) or not all(isinstance(c, tuple) for c in calls):
        raise RecordingError(f"{path}: not a recording's file (want a list of calls, each a tuple)")
    return calls


@dataclass(frozen=True)
class Recording:
    root: Path
    tp: int  # the screen's TP size
    ranks: tuple[int, ...]  # the rank<r> directories found, in order
    sizes: dict[int, int | None]  # rank -> the TP size its rank.json names (None: no rank.json)
    failures: tuple[str, ...]  # the rank layout's failure lines


def open_recording(root: Path, tp: int) -> Recording:
    """The rank directories of a recording, checked against the screen's TP size (module docstring)."""
    ranks = sorted(
        int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _RANK_DIR.fullmatch(p.name))
    )
    sizes: dict[int, int | None] = {}
    failures: list[str] = []
    for r in ranks:
        f = root / f"rank{r}" / RANK_FILE
        sizes[r] = int(_json(f, "tensor_parallel_size")) if f.is_file() else None
        if sizes[r] is not None and sizes[r] != tp:
            failures.append(f"rank {r} was recorded at TP {sizes[r]} ({f}), the screen slices for TP {tp}")
        if r >= tp:
            failures.append(
                f"{root / f'rank{r}'}: a recording of rank {r}, past the screen's ranks 0-{tp - 1}"
            )
    if not ranks:
        failures.append(f"{root}: nothing recorded (no rank<r> directory)")
    for r in range(tp):
        if ranks and r not in ranks:
            failures.append(f"rank {r}: nothing recorded in {root} (recorded ranks: {_ranks(ranks)})")
    return Recording(root, tp, tuple(ranks), sizes, tuple(failures))


def _ranks(ranks: list[int] | tuple[int, ...]) -> str:
    return ", ".join(str(r) for r in ranks)


def _shape(x: Any) -> list[int] | None:
    return None if x is None else list(x.shape)


def slice_inputs(site: Site) -> list[list[list[int] | None]]:
    """The input shapes a site's slice takes, per argument (None: that argument may be None; a
    shape list: it must be a tensor of that shape)."""
    first = site.tensors[0]
    if site.route in (ROUTE_GEMV, ROUTE_GDN):
        return [[[1, int(first.shape[1])]]]  # x [1, K] (GEMV), h [1, hidden] (GDN)
    d, hc = int(first.shape[0]), int(site.meta["hc_count"])
    return [[[1, d]], [None, [1, d // hc]], [None, [1, hc]]]  # h, block output, injection (HC)


def _input_mismatch(calls: list[Any], want: list[Any]) -> str | None:
    for i, call in enumerate(calls):
        got = [_shape(x) if x is None or isinstance(x, Tensor) else type(x).__name__ for x in call]
        if len(got) != len(want) or any(g not in w for g, w in zip(got, want, strict=False)):
            return f"call {i} inputs {got}"
    return None


def site_inputs(
    rec: Recording | None, rank: int, site: Site, dev: torch.device
) -> tuple[list[tuple[Any, ...]], str | None]:
    """(the calls recorded at the site on `rank`, on dev in the slice's dtype; a failure line or None).
    No recording of the site: ([], None) (the screen draws random inputs)."""
    if rec is None:
        return [], None
    path = rec.root / f"rank{rank}" / site.route / f"{site.name}.pt"
    if not path.is_file():
        return [], None
    held = path.with_suffix(".json")
    slice_shapes = [list(t.shape) for t in site.tensors]
    if held.is_file():
        weights = _json(held, "weights")
        if weights != slice_shapes:
            return [], (
                f"rank {rank} {site.name}: the engine's worker held weights {weights} ({held}), "
                f"rank {rank}'s slice of the checkpoint is {slice_shapes}"
            )
    calls = _calls(path)
    want = slice_inputs(site)
    bad = _input_mismatch(calls, want)
    if bad is not None:
        return [], (
            f"rank {rank} {site.name}: recorded {bad} ({path}), rank {rank}'s slice "
            f"(weights {slice_shapes}) takes {[w[-1] for w in want]}"
        )
    dt = site.tensors[0].dtype
    return [tuple(None if x is None else x.to(dev).to(dt) for x in c) for c in calls], None


def recording_section(
    rec: Recording | None, sites: list[dict[str, Any]], failures: list[str]
) -> dict[str, Any] | None:
    """The record's `recording`: the rank layout, sites per input kind, every failure line (rank
    layout first, then the sites'); passed when there is none."""
    if rec is None:
        return None
    every = [*rec.failures, *failures]
    return {
        "dir": str(rec.root),
        "tp": rec.tp,
        "ranks": list(rec.ranks),
        "recorded_tp": {str(r): s for r, s in rec.sizes.items()},
        "sites_recorded": sum(s["inputs"] == "recorded" for s in sites),
        "sites_random": sum(s["inputs"] == "random" for s in sites),
        "failures": len(every),
        "failure_lines": every[:_MAX_LINES],
        "passed": not every,
    }


TopkFn = Callable[[Tensor, Tensor, int], Tensor]


def topk_agreement(out: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
    """Per row of block_indices [rows, k] (the route's, the reference's): (the same set of indices, -1
    fill included; the same indices in the same positions). The one place the route's order is judged:
    it is the reference's, whatever order reference.qsa_topk defines."""
    same_set = (out.sort(dim=1).values == ref.sort(dim=1).values).all(dim=1)  # [rows]
    same_order = (out == ref).all(dim=1)  # [rows]
    return same_set, same_order


def _topk_call_problem(call: Any) -> str | None:
    if not (isinstance(call, tuple) and len(call) == 3 and isinstance(call[2], int)):
        return "not a (logits, visible_blocks, k) call"
    logits, visible, k = call
    if logits.dim() != 2 or logits.dtype != torch.float32:
        return f"logits {list(logits.shape)} {logits.dtype}, want [rows, L] float32"
    if tuple(visible.shape) != (logits.shape[0],) or visible.dtype != torch.int32:
        return f"visible_blocks {list(visible.shape)} {visible.dtype}, want [{logits.shape[0]}] int32"
    return None if k >= 1 else f"k = {k}"


def screen_topk(
    rec: Recording | None,
    dev: torch.device,
    route: TopkFn | None = None,
    reference: TopkFn | None = None,
) -> dict[str, Any] | None:
    """The record's `topk`: every rank's recorded `_topk` rows through the route and its reference
    (defaults: qgate_kernels.qsa_topk and reference.qsa_topk on dev); per row the exact set and the
    reference's order (topk_agreement). None when no rank recorded a top-k call."""
    import qgate_kernels
    from qgate_kernels import ops
    from qgate_kernels import reference as ref_mod

    route = route or qgate_kernels.qsa_topk
    reference = reference or ref_mod.qsa_topk
    files = (
        []
        if rec is None
        else [(r, rec.root / f"rank{r}" / ROUTE_TOPK / f"{TOPK_NAME}.pt") for r in rec.ranks]
    )
    files = [(r, f) for r, f in files if f.is_file() and r < rec.tp]  # type: ignore[union-attr]
    if not files:
        return None
    calls = rows = exact_set = in_order = 0
    shapes: set[tuple[int, int, int]] = set()
    failures: list[str] = []
    for rank, path in files:
        for i, call in enumerate(_calls(path)):
            calls += 1
            problem = _topk_call_problem(call)
            if problem is not None:
                failures.append(f"rank {rank} call {i} ({path}): {problem}")
                continue
            logits, visible, k = call[0].to(dev), call[1].to(dev), call[2]
            shapes.add((int(logits.shape[0]), int(logits.shape[1]), k))
            out, want = route(logits, visible, k), reference(logits, visible, k)
            same_set, same_order = (t.cpu() for t in topk_agreement(out, want))
            rows += len(same_set)
            exact_set += int(same_set.sum())
            in_order += int(same_order.sum())
            for row in torch.nonzero(~same_order).flatten().tolist():
                what = "the reference's set in another order" if same_set[row] else "another set"
                failures.append(
                    f"rank {rank} call {i} row {row} ({path}): {what} (visible {int(visible[row])}, k {k})"
                )
    return {
        "kernel": ops.route_kernels()[ROUTE_TOPK] if dev.type == "cuda" else "the CPU op (the reference)",
        "ranks": [r for r, _ in files],
        "calls": calls,
        "shapes": [list(s) for s in sorted(shapes)],  # [rows, L, k] per distinct call shape
        "rows": rows,
        "exact_set": exact_set,
        "reference_order": in_order,
        "failures": len(failures),
        "failure_lines": failures[:_MAX_LINES],
        "passed": rows > 0 and not failures,
    }


def recorded_markdown(record: dict[str, Any]) -> str:
    """The recording's and the top-k's lines of the real screen's report ("" without a recording)."""
    lines: list[str] = []
    rec, topk = record.get("recording"), record.get("topk")
    if rec is not None:
        verdict = "ok" if rec["passed"] else f"FAIL ({rec['failures']})"
        lines += [
            f"**Recording** {rec['dir']}: ranks {_ranks(rec['ranks']) or 'none'} "
            f"(screened at TP {rec['tp']}); sites on recorded inputs {rec['sites_recorded']}, "
            f"on random {rec['sites_random']}: {verdict}",
            *(f"- {line}" for line in rec["failure_lines"]),
        ]
    if topk is not None:
        lines += [
            "",
            f"**QSA top-k on the recorded score rows** ({topk['kernel']}; ranks {_ranks(topk['ranks'])}): "
            f"{topk['calls']} calls, exact set {topk['exact_set']}/{topk['rows']} rows, the reference's "
            f"order {topk['reference_order']}/{topk['rows']}: {'ok' if topk['passed'] else 'FAIL'}",
            *(f"- {line}" for line in topk["failure_lines"]),
        ]
    return "\n" + "\n".join(lines) + "\n" if lines else ""
