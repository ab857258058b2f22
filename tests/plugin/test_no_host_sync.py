"""A routed call never makes the host wait for the device.

On CUDA a scalar read of a device tensor (`.item()`, `int()`, `bool()`, `.tolist()`:
aten._local_scalar_dense), a data-dependent shape (`nonzero`, `masked_select`, `unique`), `equal`
or a copy to the host each block the host until the GPU has caught up. One such call a decode step
outside the CUDA graph (the eager lm_head) or a call at prefill would serialise the host with the GPU:
the kind of cost the H200 probe looks for (docs/evidence/decode-step-analysis.md, H5). Here, on the CPU, a
dispatch mode watches the ops that each site's own Python calls (not what runs inside the kernels or
inside vLLM's path), at decode (the routed path) and at prefill (vLLM's path through the site). The
sites' hit counters are CPU tensors by design (attest.Tally.cell) and may be read.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("qgate_kernels.ops")
from hc_module import HC, HS, D, Module, gated_residual  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

aten = torch.ops.aten
# Ops that synchronise with the device when their input lives on it.
SYNCING = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.equal.default,
    aten.is_nonzero.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
    aten.repeat_interleave.Tensor,
}


class _HostSyncs(TorchDispatchMode):
    """Records (op, innermost qgate_kernels frame) for every op that would synchronise on CUDA, but a
    scalar read of a tensor whose storage is in `allowed` (CPU counters)."""

    def __init__(self, allowed: set[int]) -> None:
        super().__init__()
        self.allowed = allowed
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        to_host = func is aten._to_copy.default and str(kwargs.get("device", "")) == "cpu"
        if func in SYNCING or to_host:
            first = args[0] if args else None
            counter = isinstance(first, torch.Tensor) and first.untyped_storage().data_ptr() in self.allowed
            if not (func is aten._local_scalar_dense.default and counter):
                where = [f for f in traceback.extract_stack() if "qgate_kernels" in f.filename]
                frame = f"{where[-1].filename.rsplit('/', 1)[-1]}:{where[-1].lineno}" if where else "?"
                self.seen.append(f"{func} at {frame}")
        return func(*args, **kwargs)


@contextmanager
def host_syncs() -> Iterator[_HostSyncs]:
    from qgate_kernels import registry

    tallies = registry.STATE.recorder.counters.tallies if registry.STATE is not None else []
    cells = {t.cell.untyped_storage().data_ptr() for t in tallies if t.cell is not None}
    with _HostSyncs(cells) as mode:
        yield mode


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """A plugin state with the given routes on and their shipped implementations (no attestation file)."""
    from qgate_kernels import attest, ops, registry
    from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK, SITE_HC_MIX

    impls = {
        ROUTE_GEMV: functools.partial(ops.gemv, static_weight=True),
        ROUTE_HC: ops.hc_combine_and_mix,
        SITE_HC_MIX: ops.hc_mix,
        ROUTE_GDN: functools.partial(ops.gdn_input, static_weight=True),
        ROUTE_TOPK: ops.qsa_topk,
    }

    def make(*routes: str, override: Any = None) -> Any:
        chosen = {k: v for k, v in impls.items() if k in routes or (k == SITE_HC_MIX and ROUTE_HC in routes)}
        if override is not None:
            chosen[routes[0]] = override
        st = registry.State(
            frozenset(routes),
            chosen,
            attest.Recorder(None, list(routes), {}),
            None,
            [],
            None if override is not None else ops.fallback_counts,
            overridden=frozenset(routes[:1]) if override is not None else frozenset(),
        )
        monkeypatch.setattr(registry, "STATE", st)
        ops.reset_fallback_counts()
        return st

    return make


def _gen(seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def test_the_watch_sees_a_sync_in_a_routed_call(state: Callable[..., Any]) -> None:
    """The detector itself: an implementation that reads a value of its input back is seen, with its
    frame, and the site's own counter reads are not."""
    from qgate_kernels import registry
    from qgate_route_env import ROUTE_GEMV

    def peeking(weight: Any, x: Any) -> Any:
        if float(x.abs().max()) > 0:  # a data-dependent branch: a host sync on CUDA
            return torch.nn.functional.linear(x, weight)
        return x.new_zeros((1, weight.shape[0]))

    state(ROUTE_GEMV, override=peeking)
    w, x = torch.randn(16, 8, generator=_gen(1)).half(), torch.randn(1, 8, generator=_gen(2)).half()
    tally = registry.STATE.recorder.tally(ROUTE_GEMV, "peek")
    tally.cell = torch.zeros(1, dtype=torch.int64)
    with host_syncs() as watch:
        registry.invoke(ROUTE_GEMV, "peek", w, x, tally=tally)
        assert tally.n == 1  # the counter read through the cell: allowed
    assert len(watch.seen) == 1 and "_local_scalar_dense" in watch.seen[0], watch.seen


def test_gemv_site_decode_and_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    from qgate_kernels import ops, plugin, registry

    monkeypatch.setattr(registry, "STATE", None)
    ops.reset_fallback_counts()
    w = (torch.randn(64, 32, generator=_gen(3)) * 0.2).half()  # [N, K]
    call, tally = plugin.standalone_linear(w)
    x = torch.randn(1, 32, generator=_gen(4)).half()  # [1, K]: a decode step's row
    xs = torch.randn(5, 32, generator=_gen(5)).half()  # [T, K]: prefill keeps vLLM's path
    with host_syncs() as watch:
        for _ in range(3):
            call(x)
        call(xs)
    assert watch.seen == [] and tally.n == 3


def _counts(st: Any, route: str) -> tuple[int, dict[str, int]]:
    c = st.recorder.counters.routes([route])[route]
    return c["hits"], c["fallbacks"]


def test_hc_site_decode_and_prefill(state: Callable[..., Any]) -> None:
    from qgate_kernels.sites import hc
    from qgate_route_env import ROUTE_HC

    st = state(ROUTE_HC)
    g = _gen(6)
    module, w_down, w_up = gated_residual(g)

    def vllm_mix(mod: Any, h: Any) -> tuple:  # vLLM's path at prefill: fresh outputs, no sync
        return h, h[:, :HS] * 2, h[:, :HC] * 3

    def vllm_combine(mod: Any, h: Any, block_output: Any, injection: Any) -> tuple:
        return h + 1, block_output * 2, h[:, :HC] * 3

    site = hc.HcSite(module, "moe", w_down, w_up, {"mix": vllm_mix, "combine_and_mix": vllm_combine})
    for t in (1, 5):  # decode, prefill
        h = torch.randn(t, D, generator=g).half()
        block_output, injection = (
            torch.randn(t, HS, generator=g).half(),
            torch.randn(t, HC, generator=g).half(),
        )
        with host_syncs() as watch:
            site.mix(h)
            site.combine_and_mix(h, block_output, injection)
        assert watch.seen == [], (t, watch.seen)
    assert _counts(st, ROUTE_HC) == (2, {"batch_not_1": 2})  # both paths ran


def test_gdn_site_decode_and_prefill(state: Callable[..., Any]) -> None:
    from qgate_kernels.sites import gdn
    from qgate_route_env import ROUTE_GDN

    st = state(ROUTE_GDN)
    nk, nv, dk, dv, k = 2, 4, 8, 8, 32
    g = _gen(7)
    w_qkvz = (0.2 * torch.randn(2 * nk * dk + 2 * nv * dv, k, generator=g)).half()
    w_ba = (0.2 * torch.randn(2 * nv, k, generator=g)).half()

    def proj(w: Any) -> Callable[[Any], tuple]:
        return lambda h: (torch.nn.functional.linear(h, w), None)

    layer = Module(
        gqa_interleaved_layout=False,
        num_k_heads=nk,
        num_v_heads=nv,
        tp_size=1,
        head_k_dim=dk,
        head_v_dim=dv,
        key_dim=nk * dk,
        value_dim=nv * dv,
        in_proj_qkvz=proj(w_qkvz),
        in_proj_ba=proj(w_ba),
        split_ba=lambda ba: ba.split([nv, nv], dim=-1),
    )
    site = gdn.GdnSite(layer, w_qkvz, w_ba)
    for t in (1, 5):
        with host_syncs() as watch:
            site.run(torch.randn(t, k, generator=g).half())
        assert watch.seen == [], (t, watch.seen)
    assert _counts(st, ROUTE_GDN) == (1, {"batch_not_1": 1})


def test_topk_site_decode_and_prefill(state: Callable[..., Any]) -> None:
    from qgate_kernels.sites import topk
    from qgate_route_env import ROUTE_TOPK

    st = state(ROUTE_TOPK)
    site = topk.TopkSite(lambda *a: None)
    g = _gen(8)
    ratio, token_topk, width = 4, 64, 96  # k = 16 blocks of 96
    for rows in (1, 7):
        logits = torch.randn(rows, width + 32, generator=g)[:, :width]  # vLLM's wider row buffer
        visible = torch.randint(1, width + 1, (rows,), generator=g).to(torch.int32)
        out = torch.empty(rows, token_topk // ratio, dtype=torch.int32)
        with host_syncs() as watch:
            site.run(logits, visible, token_topk, ratio, out, None)
        assert watch.seen == [], (rows, watch.seen)
    assert _counts(st, ROUTE_TOPK) == (2, {})  # the route takes a prefill's rows too
