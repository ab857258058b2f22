"""The plugin's recording screened per rank, without vLLM (qgate.ops.recorded): the QSA top-k site keeps
the indexer's single-row score rows and the screen judges the route's set and order on them; a
recording of the tiny Qwen4Exp per TP 2 rank screens each rank on its slice, and a rank whose shapes do
not fit its slice, or that is missing, FAILs naming both. The same recording made by a real TP 2 engine:
tests/plugin/test_plugin_qwen4exp.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("qgate_kernels.ops")

from qgate.ops.cases import indexer_scores  # noqa: E402
from qgate.ops.real import real_markdown, run_real_screen  # noqa: E402
from qgate.ops.recorded import open_recording, screen_topk, slice_inputs  # noqa: E402
from qgate.ops.weights import Checkpoint, routed_weights  # noqa: E402
from qgate_kernels import attest, ops, record, reference, registry  # noqa: E402
from qgate_kernels.sites.topk import TopkSite  # noqa: E402


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """qgate_kernels.record switched on into tmp_path/acts (what QGATE_RECORD_DIR does at import)."""
    acts = tmp_path / "acts"
    monkeypatch.setattr(record, "_DIR", str(acts))
    monkeypatch.setattr(record, "_SAVED", {})
    monkeypatch.setattr(record, "_CALLS", 4)
    yield acts


def _topk_calls(gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Single rows as a decode step's indexer gives them (relu sums: ties at 0), one with heavy ties at
    the k-th value, one with fewer visible blocks than k; garbage (NaN, inf) past the visible blocks."""
    k, width = 64, 400
    rows = [indexer_scores(gen, torch.device("cpu"), 1, width) for _ in range(2)]
    rows.append(torch.randint(0, 8, (1, width), generator=gen).float())
    rows.append(torch.randn(1, width, generator=gen))
    visible = [400, 300, 350, 40]
    out = []
    for row, n in zip(rows, visible, strict=True):
        row[0, n:] = torch.where(torch.arange(width - n) % 2 == 0, float("nan"), float("inf"))
        out.append((row, torch.tensor([n], dtype=torch.int32), k))
    return out


def test_the_topk_site_keeps_single_row_calls_and_the_screen_judges_set_and_order(
    recording: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = attest.Recorder(None, ["qsa_topk"], {})
    state = registry.State(frozenset({"qsa_topk"}), {"qsa_topk": ops.qsa_topk}, recorder, None, [])
    monkeypatch.setattr(registry, "STATE", state)

    def vllms(*args: object) -> None:
        raise AssertionError("vLLM's _topk: the route takes these calls")

    site, ratio = TopkSite(vllms), 4
    gen = torch.Generator().manual_seed(5)
    calls = _topk_calls(gen)
    for logits, visible, k in calls:
        out = torch.full((1, k), -7, dtype=torch.int32)
        site.run(logits, visible, k * ratio, ratio, out, torch.empty(0))
        assert torch.equal(out, reference.qsa_topk(logits, visible, k))
    three = torch.randn(3, 400, generator=gen)  # a prefill's rows: routed, not kept
    site.run(
        three, torch.full((3,), 400, dtype=torch.int32), 64 * ratio, ratio, torch.empty(3, 64).int(), None
    )
    assert recorder.counters.hits == {"qsa_topk": 5}
    kept = torch.load(recording / "rank0" / "qsa_topk" / "_topk.pt", weights_only=True)
    assert len(kept) == 4 and all(len(c) == 3 and c[2] == 64 for c in kept)
    for (lg, vis, k), (lg0, vis0, k0) in zip(kept, calls, strict=True):
        assert torch.equal(lg.nan_to_num(-5.0), lg0.nan_to_num(-5.0)) and torch.equal(vis, vis0) and k == k0
    assert json.loads((recording / "rank0" / "rank.json").read_text()) == {
        "rank": 0,
        "tensor_parallel_size": 1,
    }

    rec = open_recording(recording, 1)
    section = screen_topk(rec, torch.device("cpu"))
    assert section is not None and section["passed"], section
    assert (section["calls"], section["rows"], section["exact_set"], section["reference_order"]) == (
        4,
        4,
        4,
        4,
    )

    def reversed_top(lg: torch.Tensor, vis: torch.Tensor, k: int) -> torch.Tensor:  # the set, another order
        out = reference.qsa_topk(lg, vis, k)
        n = min(int(vis[0]), k)
        out[0, :n] = out[0, :n].flip(0)
        return out

    def one_lost(lg: torch.Tensor, vis: torch.Tensor, k: int) -> torch.Tensor:  # the k-th index replaced
        out = reference.qsa_topk(lg, vis, k)
        if int(vis[0]) > k:
            out[0, -1] = int(vis[0]) - 1 if int(out[0, -1]) != int(vis[0]) - 1 else 0
        return out

    order = screen_topk(rec, torch.device("cpu"), route=reversed_top)
    assert not order["passed"] and (order["exact_set"], order["reference_order"]) == (4, 0)
    assert (
        "row 0 (" in order["failure_lines"][0]
        and "the reference's set in another order" in order["failure_lines"][0]
    )
    lost = screen_topk(rec, torch.device("cpu"), route=one_lost)
    assert not lost["passed"] and (lost["exact_set"], lost["reference_order"]) == (1, 1)  # row 4: 40 <= k
    assert all("another set (visible" in line for line in lost["failure_lines"])


@pytest.fixture(scope="module")
def tiny() -> Path:
    from qgate.tiny.qwen4exp import ensure_tiny_qwen4exp

    try:
        return ensure_tiny_qwen4exp()
    except Exception as exc:  # noqa: BLE001  (the H200 image: transformers 5.17 has no `indexed_attention`)
        if "indexed_attention" not in str(exc):
            raise
        pytest.skip(f"this transformers cannot build the tiny Qwen4Exp: {exc}")


def _record_tp2(tiny: Path, monkeypatch: pytest.MonkeyPatch, acts: Path) -> None:
    """What the plugin writes in a TP 2 engine, per rank: two calls of inputs of the slice's shapes at
    every routed site, the slice's weight shapes beside them (record.save, with each rank's rank)."""
    gen = torch.Generator().manual_seed(1)
    ck = Checkpoint(tiny)
    for rank in (0, 1):
        monkeypatch.setattr(record, "_rank", lambda r=rank: (r, 2))
        monkeypatch.setattr(record, "_SAVED", {})  # one process a rank
        for site in routed_weights(ck, 2, rank, "fp16"):
            for _ in range(2):
                args = [torch.randn(*w[-1], generator=gen).half() for w in slice_inputs(site)]
                if site.role == "final":
                    args[2] = None  # the final mixer takes no injection
                record.save(site.route, site.name, *args, weights=site.tensors)


def test_a_tp2_recording_screens_each_rank_on_its_slice_and_a_mismatch_fails_naming_both(
    recording: Path, monkeypatch: pytest.MonkeyPatch, tiny: Path
) -> None:
    _record_tp2(tiny, monkeypatch, recording)
    ok = run_real_screen(tiny, 2, "fp16", recording, 1, "cpu", seed=0)
    assert ok["passed"] and ok["recording"]["passed"] and ok["topk"] is None
    assert {(s["rank"], s["inputs"]) for s in ok["sites"]} == {(0, "recorded"), (1, "recorded")}
    assert all(s["calls"] == 2 for s in ok["sites"])
    assert "**Recording** " in real_markdown(ok) and "ranks 0, 1 (screened at TP 2)" in real_markdown(ok)

    # rank 1's o_proj fed an input of the full width (what a TP 1 worker would take), its weights' file gone
    o_proj = recording / "rank1" / "fp16_gemv" / "model.layers.1.self_attn.o_proj.pt"
    o_proj.with_suffix(".json").unlink()
    torch.save([(torch.randn(1, 128).half(),)], o_proj)
    bad = run_real_screen(tiny, 2, "fp16", recording, 1, "cpu", seed=0)
    assert not bad["passed"] and not bad["recording"]["passed"] and bad["recording"]["failures"] == 1
    (line,) = bad["recording"]["failure_lines"]
    assert line == (
        f"rank 1 model.layers.1.self_attn.o_proj: recorded call 0 inputs [[1, 128]] ({o_proj}), "
        "rank 1's slice (weights [[128, 64]]) takes [[1, 64]]"
    )
    # the worker held other weights than the slice (a layout the slicing gets wrong): both named
    gate_up = recording / "rank0" / "fp16_gemv" / "model.layers.0.mlp.shared_expert.gate_up_proj.json"
    gate_up.write_text(json.dumps({"weights": [[128, 128]]}))
    lines = run_real_screen(tiny, 2, "fp16", recording, 1, "cpu", seed=0)["recording"]["failure_lines"]
    assert (
        "rank 0 model.layers.0.mlp.shared_expert.gate_up_proj: the engine's worker held weights "
        f"[[128, 128]] ({gate_up}), rank 0's slice of the checkpoint is [[64, 128]]"
    ) in lines

    # a rank with nothing recorded, and the recording screened at another TP size
    for p in sorted((recording / "rank1").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (recording / "rank1").rmdir()
    gone = run_real_screen(tiny, 2, "fp16", recording, 1, "cpu", seed=0)
    assert not gone["passed"]
    assert (
        f"rank 1: nothing recorded in {recording} (recorded ranks: 0)" in gone["recording"]["failure_lines"]
    )
    tp1 = open_recording(recording, 1)
    assert tp1.failures == (
        f"rank 0 was recorded at TP 2 ({recording / 'rank0' / 'rank.json'}), the screen slices for TP 1",
    )


def test_a_corrupt_recording_file_is_one_line_naming_it(tmp_path: Path, tiny: Path) -> None:
    from typer.testing import CliRunner

    from qgate.cli.ops import app

    acts = tmp_path / "acts"
    (acts / "rank0").mkdir(parents=True)
    (acts / "rank0" / "rank.json").write_text("{")
    contract = str(Path(__file__).resolve().parents[2] / "contracts" / "qwen4exp-cpu.yaml")
    args = ["run", "-c", contract, "-o", str(tmp_path / "o"), "--real", "--model", str(tiny)]
    res = CliRunner().invoke(app, [*args, "--activations", str(acts), "--device", "cpu"])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.endswith(
        f"{acts / 'rank0' / 'rank.json'}: not a recording's file (JSONDecodeError: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    )
