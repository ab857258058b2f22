"""What the HC and GDN sites hand back: the kernels' own outputs without a copy, a copy only of an output
that shares memory with an input or another output (torch.library refuses those for a custom op), and
the same values either way. On the H200 the HC site's unconditional copy of the injection was a copy
kernel a call, 25 us of a production-shape decode step (docs/evidence/gpu-sessions.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("qgate_kernels.ops")
from hc_module import HC, HS, D, gated_residual  # noqa: E402

from qgate_kernels.sites.fresh import unaliased  # noqa: E402


def _shares(a: object, b: object) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # type: ignore[attr-defined]


def test_fresh_outputs_pass_as_they_are_and_shared_ones_are_copied() -> None:
    x = torch.arange(12.0)
    own = torch.ones(3)
    base = torch.arange(8.0)
    first, second = base[:4], base[4:]  # two views of one tensor
    empty = x.new_empty((1, 0))
    out = unaliased((x,), (own, x[2:5], first, second, empty))
    assert out[0] is own and out[2] is first and out[4] is empty
    assert not _shares(out[1], x) and torch.equal(out[1], x[2:5])
    assert not _shares(out[3], base) and torch.equal(out[3], second)
    # contiguous=True: a dense copy of a strided output that shares nothing, none of a dense one
    strided = torch.arange(16.0).reshape(4, 4)[:, 1]
    dense, made = unaliased((x,), (own, strided), contiguous=True)
    assert dense is own and made.is_contiguous() and torch.equal(made, strided)


def test_outputs_that_shared_memory_pass_torch_librarys_alias_check() -> None:
    """The reason for the copies: a custom op returning its input or two views of one tensor is refused
    at the call; the same outputs through unaliased are accepted."""

    @torch.library.custom_op("qgate_test::views", mutates_args=())
    def views(h: torch.Tensor, fix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        base = h * 2
        outs = (h[:2], base[2:]) if not fix else unaliased((h,), (h[:2], base[2:]))
        return outs

    @views.register_fake
    def _(h: torch.Tensor, fix: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return h.new_empty(2), h.new_empty(h.shape[0] - 2)

    h = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="alias"):
        torch.ops.qgate_test.views(h, False)
    a, b = torch.ops.qgate_test.views(h, True)
    assert torch.equal(a, h[:2]) and torch.equal(b, (h * 2)[2:])


def _hc_site(monkeypatch: pytest.MonkeyPatch, impl: object, orig: dict) -> object:
    from qgate_kernels import attest, ops, registry
    from qgate_kernels.sites import hc
    from qgate_route_env import ROUTE_HC, SITE_HC_MIX

    state = registry.State(
        frozenset({ROUTE_HC}),
        {ROUTE_HC: impl, SITE_HC_MIX: ops.hc_mix},
        attest.Recorder(None, [ROUTE_HC], {}),
        None,
        [],
        ops.fallback_counts,
    )
    monkeypatch.setattr(registry, "STATE", state)
    module, w_down, w_up = gated_residual(torch.Generator().manual_seed(7))
    site = hc.HcSite(module, "moe", w_down, w_up, orig)
    site.keep = module  # the site holds its module weakly, as vLLM's model holds it
    return site


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    h = torch.randn(1, D, generator=g).half()  # [1, D]
    block_output = torch.randn(1, HS, generator=g).half()  # [1, HS]
    injection = torch.randn(1, HC, generator=g).half()  # [1, HC]
    return h, block_output, injection


def test_routed_hc_call_returns_the_kernels_outputs_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from qgate_kernels import ops

    made: list = []

    def kernel(*args: object, **kw: object) -> object:
        out = ops.hc_combine_and_mix(*args, **kw)
        made.append(out)
        return out

    site = _hc_site(monkeypatch, kernel, {})
    h, block_output, injection = _inputs()
    h_new, block_input, inj = site.combine_and_mix(h, block_output, injection)
    (want,) = made
    assert h_new is want[0] and inj is want[2]  # no copy of the injection (one kernel a call on CUDA)
    assert torch.equal(block_input, want[1])


def test_an_hc_output_that_shares_memory_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """An implementation (an override, vLLM's fallback) that hands back its input or views of one
    buffer: the site copies exactly those, with their values, so the op's alias check holds."""

    def sharing(
        h: torch.Tensor, block_output: torch.Tensor, injection: torch.Tensor, *rest: object, **kw: object
    ):
        buf = torch.cat([block_output, injection], dim=-1)  # [1, HS + HC]
        return h, buf[:, :HS], buf[:, HS:]  # the input itself, two views of one tensor

    site = _hc_site(monkeypatch, sharing, {})
    h, block_output, injection = _inputs()
    h_new, block_input, inj = site.combine_and_mix(h, block_output, injection)
    assert not _shares(h_new, h) and torch.equal(h_new, h)
    assert torch.equal(block_input, block_output) and torch.equal(inj, injection)
    assert not _shares(block_input, inj)

    def vllm_mix(module: object, hh: torch.Tensor) -> tuple:
        return hh, hh[:, :HS], hh[:, HS : HS + HC]  # views of the input

    site = _hc_site(monkeypatch, sharing, {"mix": vllm_mix})
    hb = h.expand(2, D).contiguous()  # batch 2: vLLM's path (batch_not_1)
    block_input, inj = site.mix(hb)
    assert not _shares(block_input, hb) and not _shares(inj, hb) and not _shares(block_input, inj)
    assert torch.equal(block_input, hb[:, :HS]) and torch.equal(inj, hb[:, HS : HS + HC])
