"""The route plugin's pieces that need no vLLM engine: the attestation writer and override resolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("qgate_kernels")
from qgate_kernels import attest, overrides  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def test_recorder_writes_counts_per_process(tmp_path: Path) -> None:
    rec = attest.Recorder(str(tmp_path), ["fp16_gemv"], {})
    rec.site("fp16_gemv", "qkv_proj")
    for _ in range(3):
        rec.hit("fp16_gemv", "qkv_proj")
    rec.hit("fp16_gemv", "lm_head")
    rec.fallback("fp16_gemv", "batch_not_1", 2)
    rec.flush(True)
    (path,) = _files(tmp_path)
    assert path.name == f"{attest.process_label()}.json" and path.name.endswith(f"-{os.getpid()}.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "route_attestation" and data["schema_version"] == 3
    assert data["routes"]["fp16_gemv"] == {
        "hits": 4,
        "fallbacks": {"batch_not_1": 2},
        "roles": {"qkv_proj": 3, "lm_head": 1},
        "sites": {"qkv_proj": 1},
        "captures": {},  # no CUDA graph on the CPU: executions are the calls
        "captured_fallbacks": {},
        "replayed": {},
    }
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temp file, then renamed


def test_recorder_flushes_while_counting_without_exit(tmp_path: Path) -> None:
    rec = attest.Recorder(str(tmp_path), ["fp16_gemv"], {})
    rec.hit("fp16_gemv", "o_proj")  # the first count writes at once (nothing written yet)
    rec.hit("fp16_gemv", "o_proj")  # within the interval: pending, left to the flusher thread
    deadline = time.monotonic() + 5 * attest.FLUSH_INTERVAL_S
    hits = 0
    while time.monotonic() < deadline and hits < 2:
        time.sleep(0.05)
        hits = json.loads(_files(tmp_path)[0].read_text())["routes"]["fp16_gemv"]["hits"]
    assert hits == 2


def test_recorder_in_a_killed_process_leaves_its_counts(tmp_path: Path) -> None:
    # A worker that is SIGKILLed runs no exit handler: the counts must be on disk already.
    code = (
        "import os, signal, time\n"
        "from qgate_kernels import attest\n"
        f"rec = attest.Recorder({str(tmp_path)!r}, ['fp16_gemv'], {{}})\n"
        "for _ in range(1000): rec.hit('fp16_gemv', 'down_proj')\n"
        f"time.sleep({3 * attest.FLUSH_INTERVAL_S})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, timeout=60)
    assert proc.returncode == -9
    (path,) = _files(tmp_path)
    assert json.loads(path.read_text())["routes"]["fp16_gemv"]["hits"] == 1000


def test_recorder_without_a_directory_writes_nothing(tmp_path: Path) -> None:
    rec = attest.Recorder(None, ["fp16_gemv"], {})
    rec.hit("fp16_gemv", "qkv_proj")
    rec.flush(True)
    assert rec.counters.hits == {"fp16_gemv": 1}


def test_override_resolves_the_fixture_and_it_computes_the_reference() -> None:
    import torch

    from qgate_kernels import reference

    sys.path.insert(0, str(FIXTURES))
    try:
        slow = overrides.resolve("fp16_gemv", "slow_routes:slow_gemv")
        bad = overrides.resolve("fp16_gemv", "slow_routes:perturbed_gemv")
    finally:
        sys.path.remove(str(FIXTURES))
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(64, 32, generator=gen).half()  # [N, K]
    x = torch.randn(1, 32, generator=gen).half()  # [1, K]
    ref = reference.gemv(w, x)  # [1, N]
    t0 = time.perf_counter()
    assert torch.equal(slow(w, x), ref)
    assert time.perf_counter() - t0 >= 0.0009  # the default 1 ms delay
    assert not torch.equal(bad(w, x), ref)
    assert torch.equal(bad(w, x)[..., 1::7], ref[..., 1::7])


def test_env_problems_reports_in_one_line_each() -> None:
    env = {"VLLM_SM70_QWEN38_FP16_GEMV": "1", "QGATE_ROUTE_IMPL_FP16_GEMV": "qgate_nope_module:f"}
    (problem,) = overrides.env_problems(env)
    assert problem.startswith("QGATE_ROUTE_IMPL_FP16_GEMV='qgate_nope_module:f': cannot import")
    assert overrides.env_problems({"VLLM_SM70_QWEN38_FP16_GEMV": "1"}) == []


def test_gdn_route_output_is_what_vllms_gdn_core_gets() -> None:
    """The fused GDN input op returns, bit for bit, what vLLM 0.32's Qwen3-Next Part 1 hands its core."""
    import types

    import torch

    gdn = pytest.importorskip("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
    from qgate_kernels import ops, reference

    nk, nv, dk, dv, hidden = 2, 4, 16, 8, 64
    layer = types.SimpleNamespace(num_k_heads=nk, num_v_heads=nv, head_k_dim=dk, head_v_dim=dv, tp_size=1)
    gen = torch.Generator().manual_seed(11)
    w_qkvz = (torch.randn(nk * (2 * dk) + 2 * nv * dv, hidden, generator=gen) / 8).half()  # [Nqkvz, K]
    w_ba = (torch.randn(2 * nv, hidden, generator=gen) / 8).half()  # [2 nv, K]
    h = torch.randn(1, hidden, generator=gen).half()  # [1, K]
    # vLLM's path: the two projections, then its own de-interleaving (forward_cpu, interleaved layout).
    mixed_qkvz, ba = reference.gemv(w_qkvz, h), reference.gemv(w_ba, h)
    q, k, v, z, b, a = gdn.QwenGatedDeltaNetAttention.fix_query_key_value_ordering(layer, mixed_qkvz, ba)
    want = (torch.cat((q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)), dim=-1), z, b, a)
    got = ops.gdn_input(h, w_qkvz, w_ba, nk, nv, dk, dv, layout="interleaved")
    for name, g, w in zip(("mixed_qkv", "z", "b", "a"), got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w), name


def test_flat_gdn_route_output_is_what_vllms_flat_part1_gives() -> None:
    """Qwen4Exp / Qwen3.5 (gqa_interleaved_layout=False): the op's outputs equal the plugin's fallback,
    which is vLLM 0.32's flat Part 1 (split [q|k|v | z], z reshaped, vLLM's own split_ba), bit for bit."""
    import types

    import torch

    gdn = pytest.importorskip("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
    from qgate_kernels import ops, reference
    from qgate_kernels.sites import gdn as gdn_site

    nk, nv, dk, dv, hidden = 2, 4, 16, 8, 64
    gen = torch.Generator().manual_seed(12)
    w_qkvz = (torch.randn(2 * nk * dk + 2 * nv * dv, hidden, generator=gen) / 8).half()
    w_ba = (torch.randn(2 * nv, hidden, generator=gen) / 8).half()
    h = torch.randn(1, hidden, generator=gen).half()
    layer = types.SimpleNamespace(
        num_k_heads=nk, num_v_heads=nv, head_k_dim=dk, head_v_dim=dv, tp_size=1, tp_rank=0,
        key_dim=nk * dk, value_dim=nv * dv, gqa_interleaved_layout=False, disable_tp_for_ba_proj=False,
        in_proj_qkvz=lambda x: (reference.gemv(w_qkvz, x), None),
        in_proj_ba=lambda x: (reference.gemv(w_ba, x), None),
    )  # fmt: skip
    layer.split_ba = types.MethodType(gdn.QwenGatedDeltaNetAttention.split_ba, layer)
    want = gdn_site.gdn_vllm_input(layer, h)
    got = ops.gdn_input(h, w_qkvz, w_ba, nk, nv, dk, dv, layout="flat")
    for name, g, w in zip(("mixed_qkv", "z", "b", "a"), got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w), name


PROBE = """
import json, os, sys
import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod as L
import vllm.envs as envs
from qgate_kernels import plugin
plugin.register()
plugin.register()  # vLLM may load a plugin several times in one process
apply = L.__dict__["apply"]
depth = 0
while hasattr(apply, "_qgate_orig"):
    apply, depth = apply._qgate_orig, depth + 1
print(json.dumps({
    "apply_wrappers": depth,
    "op_defined": hasattr(torch.ops.qgate_routes, "linear"),
    "factor": envs.compile_factors().get("QGATE_ROUTES"),
    "files": sorted(os.listdir(sys.argv[1])),
}))
"""


@pytest.mark.parametrize("switch", ["0", "1"])
def test_register_is_idempotent_and_does_nothing_when_no_route_is_on(tmp_path: Path, switch: str) -> None:
    pytest.importorskip("vllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_SM70_", "QGATE_ROUTE_IMPL_"))}
    env |= {"VLLM_SM70_QWEN38_FP16_GEMV": switch, "QGATE_ATTEST_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if switch == "0":
        assert got == {"apply_wrappers": 0, "op_defined": False, "factor": None, "files": []}
    else:
        assert got["apply_wrappers"] == 1 and got["op_defined"] and got["factor"] == "fp16_gemv"
        assert len(got["files"]) == 1 and got["files"][0].startswith("MainProcess-")


def test_a_vllm_subclass_with_its_own_apply_is_routed_and_falls_back_to_its_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.32 swaps planned bf16 layers on Hopper to Qwen4ExpLowLatencyLinearMethod, an
    UnquantizedLinearMethod subclass whose apply serves bias-free calls and sends the rest to
    super().apply. The plugin routes that subclass too; a fallback runs the subclass's apply, and its
    super() call reaches vLLM's base apply, never the route again (no recursion)."""
    import torch

    from qgate_kernels import plugin, registry
    from qgate_kernels.sites import gemv

    class Base:  # stands for UnquantizedLinearMethod
        def apply(self, layer: object, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return x * 2

    class LowLatency(Base):  # stands for Qwen4ExpLowLatencyLinearMethod
        def apply(self, layer: object, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return x * 3 if bias is None else super().apply(layer, x, bias)

    monkeypatch.setattr(Base, "apply", gemv.routed_apply(Base.__dict__["apply"]))
    own = gemv.take_apply(LowLatency)
    assert own is LowLatency.__dict__["apply"]._qgate_orig and gemv.take_apply(LowLatency) is own  # once

    class Site:  # a site whose every call falls back (as a bf16 call does: `dtype`)
        route, role, n_out, calls = "fp16_gemv", "qkv_proj", 4, 0

        def run(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            Site.calls += 1
            return own(method, layer, x, bias)

    recorder = attest.Recorder(None, ["fp16_gemv"], {})
    state = registry.State(frozenset({"fp16_gemv"}), {}, recorder, None, [Site()])
    monkeypatch.setattr(registry, "STATE", state)
    plugin._define_ops()
    method, layer, x = LowLatency(), type("Layer", (), {"_qgate_site": 0})(), torch.ones(1, 4)
    assert torch.equal(method.apply(layer, x), x * 3) and Site.calls == 1  # routed, then vLLM's fast path
    assert torch.equal(method.apply(layer, x, torch.zeros(4)), x * 2) and Site.calls == 2  # via super()


@pytest.fixture
def plugin_alone(monkeypatch: pytest.MonkeyPatch) -> object:
    """qgate_kernels.plugin with a fresh GEMV-only state (standalone_linear installs one), restored after."""
    pytest.importorskip("qgate_kernels.ops")
    from qgate_kernels import ops, plugin, registry

    monkeypatch.setattr(registry, "STATE", None)
    ops.reset_fallback_counts()
    return plugin


def test_routed_call_counts_every_hit_and_fallback_exactly(plugin_alone: object) -> None:
    """The fast path (checks made at wiring, one tally increment) and the checked path count exactly:
    batch-one calls are hits of their role, a batch of 2 keeps vLLM's path (batch_not_1), a misaligned
    x runs ops.gemv's counted reference (op_layout); every result is the linear's."""
    import torch

    from qgate_kernels import registry

    plugin = plugin_alone
    w = (torch.randn(64, 32) * 0.2).half()  # [N, K]
    call, tally = plugin.standalone_linear(w)  # type: ignore[attr-defined]
    x = torch.randn(1, 32).half()  # [1, K]
    want = torch.nn.functional.linear(x.float(), w.float())
    for _ in range(7):
        torch.testing.assert_close(call(x).float(), want, rtol=2e-3, atol=2e-3)
    xs = torch.randn(2, 32).half()  # [2, K]: prefill-like
    torch.testing.assert_close(call(xs), torch.nn.functional.linear(xs, w))
    buf = torch.randn(33).half()
    odd = buf[1:].view(1, 32)  # contiguous, 2 bytes past a 16-byte boundary
    assert odd.data_ptr() % 16 != 0
    torch.testing.assert_close(
        call(odd).float(), torch.nn.functional.linear(odd.float(), w.float()), rtol=2e-3, atol=2e-3
    )
    counts = registry.STATE.recorder.counters.routes(["fp16_gemv"])["fp16_gemv"]  # type: ignore[attr-defined]
    assert tally.n == 7
    assert (
        counts["hits"] == 7 and counts["roles"] == {"standalone": 7} and counts["sites"] == {"standalone": 1}
    )
    assert counts["fallbacks"] == {"batch_not_1": 1, "op_layout": 1}


def test_tallies_reach_the_attestation_file(tmp_path: Path) -> None:
    rec = attest.Recorder(str(tmp_path), ["fp16_gemv"], {})
    qkv, down = rec.tally("fp16_gemv", "qkv_proj"), rec.tally("fp16_gemv", "down_proj")
    rec.hit("fp16_gemv", "down_proj")  # a hit counted one by one (e.g. an override) adds to the tally's
    qkv.n += 5
    down.n += 2
    deadline = time.monotonic() + 10 * attest.FLUSH_INTERVAL_S
    data: dict = {}
    while time.monotonic() < deadline:  # the flusher thread writes the tallies' changes by itself
        files = _files(tmp_path)
        data = json.loads(files[0].read_text())["routes"]["fp16_gemv"] if files else {}
        if data.get("hits") == 8:
            break
        time.sleep(attest.FLUSH_INTERVAL_S / 5)
    assert data["hits"] == 8 and data["roles"] == {"qkv_proj": 5, "down_proj": 3}


def test_a_traced_call_keeps_the_routed_op_and_its_per_call_decision(plugin_alone: object) -> None:
    """Under torch.compile (vLLM's trace) the routed call stays the opaque op qgate_routes::linear, so
    the compiled graph still decides and counts per call: a batch-one call is a hit, a batch of 2
    keeps the fallback path, whichever shape the trace saw."""
    import torch

    from qgate_kernels import registry

    plugin = plugin_alone
    w = (torch.randn(64, 32) * 0.2).half()  # [N, K]
    call, tally = plugin.standalone_linear(w)  # type: ignore[attr-defined]
    ops_seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> object:
        ops_seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    compiled = torch.compile(call, backend=backend, fullgraph=True, dynamic=True)
    x = torch.randn(1, 32).half()  # [1, K]
    torch.testing.assert_close(compiled(x), call(x))
    assert any("qgate_routes.linear" in t for t in ops_seen), ops_seen
    assert tally.n == 2  # the compiled call and the eager one
    xs = torch.randn(2, 32).half()  # [2, K]
    torch.testing.assert_close(compiled(xs), torch.nn.functional.linear(xs, w))
    fallbacks = registry.STATE.recorder.counters.fallbacks["fp16_gemv"]  # type: ignore[attr-defined]
    assert tally.n == 2 and fallbacks == {"batch_not_1": 1}


class _Graph:
    """torch.cuda.CUDAGraph's three methods as the graph accounting wraps them (no CUDA here): what
    vLLM's capture paths call, in the order they call them. `ran` counts the real replays."""

    def __init__(self) -> None:
        self.ran = 0

    def capture_begin(self, pool: object = None, capture_error_mode: str = "global") -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        self.ran += 1


def test_calls_captured_into_a_graph_count_once_per_replay(plugin_alone: object) -> None:
    """Executions under CUDA graphs (issue 46): a call made while a graph is captured runs no kernel
    then and one at each replay of its graph; eager calls count once; a fallback captured likewise.
    The routed call is the real one (standalone_linear: the site, its tally, the C++ entry); only the
    graph class is a stand-in, wrapped by the same graphs.install as torch.cuda.CUDAGraph."""
    import torch

    from qgate_kernels import graphs, registry

    plugin = plugin_alone
    cls = type("Graph", (_Graph,), {})
    assert graphs.install(cls) and graphs.install(cls)  # idempotent
    w = (torch.randn(64, 32) * 0.2).half()
    call, tally = plugin.standalone_linear(w)  # type: ignore[attr-defined]
    x, xs = torch.randn(1, 32).half(), torch.randn(2, 32).half()
    call(x)  # eager (vLLM's warm-up run): one execution
    g1, g2, empty = cls(), cls(), cls()
    g1.capture_begin(pool=None)
    call(x)
    call(x)  # two routed layers of one graph
    call(xs)  # a batch of 2 inside the graph: vLLM's path, a fallback at every replay too
    g1.capture_end()
    g2.capture_begin()
    call(x)
    g2.capture_end()
    empty.capture_begin()
    empty.capture_end()
    call(x)  # eager again (e.g. a breakable graph's eager break): counted as it runs
    for _ in range(5):
        g1.replay()
    for _ in range(3):
        g2.replay()
    empty.replay()
    assert (g1.ran, g2.ran, empty.ran) == (5, 3, 1)  # the real replay still runs
    assert tally.n == 5  # Python-level calls: 2 eager + 3 at capture
    counts = registry.STATE.recorder.counters.routes(["fp16_gemv"])["fp16_gemv"]  # type: ignore[attr-defined]
    assert counts["captures"] == {"standalone": 3} and counts["captured_fallbacks"] == {"batch_not_1": 1}
    assert counts["hits"] == 2 + 2 * 5 + 1 * 3 and counts["roles"] == {"standalone": 15}
    assert counts["replayed"] == {"standalone": 13}
    assert counts["fallbacks"] == {"batch_not_1": 5}  # captured once, replayed 5 times
    assert attest.CAPTURE is None  # no capture left open


def test_a_graph_captured_but_never_replayed_ran_nothing(plugin_alone: object) -> None:
    import torch

    from qgate_kernels import graphs, registry

    plugin = plugin_alone
    cls = type("Graph", (_Graph,), {})
    graphs.install(cls)
    call, _ = plugin.standalone_linear((torch.randn(16, 32) * 0.2).half())  # type: ignore[attr-defined]
    g = cls()
    g.capture_begin()
    call(torch.randn(1, 32).half())
    g.capture_end()
    counts = registry.STATE.recorder.counters.routes(["fp16_gemv"])["fp16_gemv"]  # type: ignore[attr-defined]
    assert counts["hits"] == 0 and counts["roles"] == {} and counts["captures"] == {"standalone": 1}


def test_hits_counted_one_by_one_under_capture_count_per_replay(tmp_path: Path) -> None:
    """The recorder's own hit / fallback (sites without a tally: HC, GDN, top-k, overrides)."""
    rec = attest.Recorder(str(tmp_path), ["fused_hc_fp16"], {})
    rec.hit("fused_hc_fp16", "attn.mix")
    attest.CAPTURE = {}
    try:
        rec.hit("fused_hc_fp16", "attn.mix")
        rec.hit("fused_hc_fp16", "moe.combine_and_mix")
        rec.fallback("fused_hc_fp16", "dtype", 2)
        noted = attest.CAPTURE
    finally:
        attest.CAPTURE = None
    plan = rec.end_capture(noted)
    for _ in range(4):
        rec.replayed(plan)
    rec.flush(True)
    (path,) = _files(tmp_path)
    data = json.loads(path.read_text())["routes"]["fused_hc_fp16"]
    assert data["hits"] == 1 + 2 * 4 and data["roles"] == {"attn.mix": 5, "moe.combine_and_mix": 4}
    assert data["captures"] == {"attn.mix": 1, "moe.combine_and_mix": 1}
    assert data["fallbacks"] == {"dtype": 8} and data["captured_fallbacks"] == {"dtype": 2}


def test_bf16_weights_are_routed_and_float32_ones_keep_vllms_path(plugin_alone: object) -> None:
    """Issue 46: the sites route bf16 as they route fp16 (the ops' kernels take both); a float32 weight
    keeps vLLM's path on every call, counted `dtype`."""
    import torch

    from qgate_kernels import registry

    plugin = plugin_alone
    w = (torch.randn(64, 32) * 0.2).bfloat16()
    call, tally = plugin.standalone_linear(w)  # type: ignore[attr-defined]
    x = torch.randn(1, 32).bfloat16()
    y = call(x)
    assert y.dtype == torch.bfloat16 and tally.n == 1
    torch.testing.assert_close(
        y.float(), torch.nn.functional.linear(x.float(), w.float()), rtol=1e-2, atol=1e-2
    )
    w32 = torch.randn(8, 32)
    call32, tally32 = plugin.standalone_linear(w32)  # type: ignore[attr-defined]
    x32 = torch.randn(1, 32)
    torch.testing.assert_close(call32(x32), torch.nn.functional.linear(x32, w32))
    counts = registry.STATE.recorder.counters.routes(["fp16_gemv"])["fp16_gemv"]  # type: ignore[union-attr]
    assert tally32.n == 0 and counts["hits"] == 1 and counts["fallbacks"] == {"dtype": 1}
