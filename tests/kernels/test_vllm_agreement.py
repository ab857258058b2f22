"""The references (qgate_kernels.reference: the definitions the CUDA kernels are tested against)
against vLLM 0.32's own Qwen4Exp code, on the CPU.

HyperConnection: vLLM's pure-torch GatedResidual (models/qwen4_exp/common/hyperconnection.py) at the
production shape read from transformers' Qwen4ExpTextConfig, fp16 and bf16. That reference rounds
at more points than vLLM's nvidia kernels, which the op follows (sigmoid, products and the mean each
rounded to the dtype; (1 + w) rounded in float32 where the nvidia kernel fuses y + y w): stage by
stage the op agrees bit for bit or within 1-2 ULP (GEMM summation order), and end to end within a
few units of rounding of the terms' magnitude, as bounded below.
GDN: vLLM's own split functions of Part 1 (QwenGatedDeltaNetAttention.prepare_gdn_attention_core_inputs
and split_ba for the flat layout, fix_query_key_value_ordering for the interleaved one) on the op's
GEMM outputs: bit for bit; and the GEMMs against torch's F.linear in the dtype.
Top-k: vLLM's debug top-k (SparseIndexerTopk backend "torch": masked torch.topk, -1 fill) as a set;
and, on a CUDA GPU where vLLM's nvidia QSA ops import, vLLM's consumer expand_qsa_block_indices
(Triton) gives the same tokens per row on the route's index order as on the value order.
Skipped where vLLM or transformers' Qwen4Exp is not importable.
"""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from kernel_oracles import fresh_generator, randn

from qgate.ops.screen import ulp_distance
from qgate.ops.shapes import MODEL_CONFIG
from qgate_kernels import reference

hcmod = pytest.importorskip("vllm.models.qwen4_exp.common.hyperconnection")
gdnmod = pytest.importorskip("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn")
topkmod = pytest.importorskip("vllm.model_executor.layers.indexer_topk")
qcfg = pytest.importorskip("transformers.models.qwen4_exp.configuration_qwen4_exp")

CFG = qcfg.Qwen4ExpTextConfig()
DTYPES = [torch.float16, torch.bfloat16]


def _unit(dtype: torch.dtype) -> float:
    """Unit roundoff of the dtype: half its spacing at 1."""
    return 2.0**-11 if dtype == torch.float16 else 2.0**-8


def _ulp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ia, ib = a.contiguous().view(torch.int16).int(), b.contiguous().view(torch.int16).int()
    ia, ib = torch.where(ia < 0, -(ia & 0x7FFF), ia), torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return (ia - ib).abs()


def _vllm_hc(dtype: torch.dtype, gen: torch.Generator, per_branch: bool = True) -> tuple:
    hc, hs, rank = CFG.hc_count, CFG.hidden_size, CFG.hc_lowrank
    d = hc * hs
    hcfg = hcmod.HyperConnectionConfig(
        hc_count=hc,
        hidden_size=hs,
        params_dtype=dtype,
        hc_lowrank=rank,
        rms_norm_eps=CFG.rms_norm_eps,
        hc_per_branch_norm=per_branch,
    )
    m = hcmod.GatedResidual(hcfg)
    with torch.no_grad():
        m.hc_norm.weight.copy_(randn(gen, m.hc_norm.weight.numel(), dtype=dtype, scale=0.1))
        m.input_mix_weight_down.weight.copy_(randn(gen, rank, d, dtype=dtype, scale=d**-0.5))
        m.input_mix_weight_up.weight.copy_(randn(gen, d, rank, dtype=dtype, scale=rank**-0.5))
        m.block_inject_weight.weight.copy_(randn(gen, hc, d, dtype=dtype, scale=d**-0.5))
    pad = torch.zeros(reference.hc_pad(rank, hc), d, dtype=dtype)
    # vLLM's nvidia GatedResidual merges down and inject (+ pad rows) into one weight
    w_down = torch.cat([m.input_mix_weight_down.weight, m.block_inject_weight.weight, pad]).detach()
    return m, m.hc_norm.weight.detach(), w_down, m.input_mix_weight_up.weight.detach()


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_stages_agree_with_vllm_common(dtype: torch.dtype) -> None:
    gen, seed = fresh_generator()
    m, nw, wd, wu = _vllm_hc(dtype, gen)
    hc, rank, eps = CFG.hc_count, CFG.hc_lowrank, CFG.rms_norm_eps
    h = randn(gen, 1, nw.numel(), dtype=dtype)
    with torch.no_grad():
        xn_v = m._normalize(h)
        xn = reference._hc_norm(h, nw, hc, eps)
        assert _ulp(xn, xn_v).max() <= 1, f"norm, seed {seed}"  # fma vs (1 + w); sum order
        down_v = F.linear(xn_v, m.input_mix_weight_down.weight)
        # The GEMMs: ULPs at max(|ref|, max|ref| / 1024), as the screen measures (ulp_distance): the
        # summation order moves an element that cancels to near zero by several of its own ULPs (one
        # seed of 8192-long fp16 rows: 5), by at most a couple at the terms' magnitude.
        assert ulp_distance(reference.gemv(wd, xn_v)[:, :rank], down_v) <= 2, f"down, seed {seed}"
        lora_v = F.silu(down_v / hc)
        x = down_v.float() / hc
        assert torch.equal((x * torch.sigmoid(x)).to(dtype), lora_v), f"silu, seed {seed}"
        gate_v = F.linear(lora_v, m.input_mix_weight_up.weight)
        assert ulp_distance(reference.gemv(wu, lora_v), gate_v) <= 2, f"up, seed {seed}"


@pytest.mark.parametrize("per_branch", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_mix_and_combine_agree_with_vllm_common(dtype: torch.dtype, per_branch: bool) -> None:
    """End to end: |op - vLLM| <= 4 u (S + |vLLM|), S the magnitude of the terms (mix: sum_s |xn_s| / HC;
    combine: |h_s| + |c_s o|). vLLM's reference rounds sigmoid, the product and the mean (mix), c_s,
    the product and the sum (combine) to the dtype; the op once: about 3 u S apart at most."""
    gen, seed = fresh_generator()
    m, nw, wd, wu = _vllm_hc(dtype, gen, per_branch)
    hc, hs, rank, eps = CFG.hc_count, CFG.hidden_size, CFG.hc_lowrank, CFG.rms_norm_eps
    u = _unit(dtype)
    h = randn(gen, 1, hc * hs, dtype=dtype)
    o = randn(gen, 1, hs, dtype=dtype)
    with torch.no_grad():
        bi_v, (_, xn_v) = m.mix(h)
        bi, inj = reference.hc_mix(h, nw, wd, wu, hc, rank, eps)
        assert bi.shape == (1, hs) and inj.shape == (1, hc)
        s_mix = xn_v.float().view(hc, hs).abs().sum(0) / hc
        assert (
            (bi.float() - bi_v.float()).abs().view(-1) <= 4 * u * (s_mix + bi_v.float().abs().view(-1))
        ).all(), f"mix, seed {seed}"
        inj_v = F.linear(xn_v, m.block_inject_weight.weight)
        assert _ulp(inj, inj_v).max() <= 2, f"injection logits, seed {seed}"

        h2_v = m.combine(o, (h, xn_v))  # vLLM's combine with this module's injection
        bi2_v, _ = m.mix(h2_v)
        h2, bi2, inj2 = reference.hc_combine_mix(h, o, inj, nw, wd, wu, hc, rank, eps)
        c = 2 * torch.sigmoid(inj.float() / hc).view(hc, 1)
        terms = h.float().view(hc, hs).abs() + o.float().abs() * c
        assert ((h2.float() - h2_v.float()).abs().view(hc, hs) <= 4 * u * terms).all(), (
            f"combine, seed {seed}"
        )
        assert inj2.shape == (1, hc)
        # the mix after the combine, from the op's combined streams (isolates the mix's bound)
        bi3_v, (_, xn3_v) = m.mix(h2)
        s3 = xn3_v.float().view(hc, hs).abs().sum(0) / hc
        assert (
            (bi2.float() - bi3_v.float()).abs().view(-1) <= 4 * u * (s3 + bi3_v.float().abs().view(-1))
        ).all()
        assert bi2_v.shape == bi2.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_final_mixer_and_unit_combine(dtype: torch.dtype) -> None:
    """The final mixer (use_combine=False: w_down [R, D], no injection out) and a combine without
    injection (unit weight: h_s + o, one rounding, as vLLM's HyperConnectionBase.combine)."""
    gen, seed = fresh_generator()
    m, nw, wd, wu = _vllm_hc(dtype, gen)
    hc, hs, rank, eps = CFG.hc_count, CFG.hidden_size, CFG.hc_lowrank, CFG.rms_norm_eps
    h = randn(gen, 1, hc * hs, dtype=dtype)
    o = randn(gen, 1, hs, dtype=dtype)
    h2, bi, inj = reference.hc_combine_mix(h, o, None, nw, wd[:rank], wu, hc, rank, eps)
    assert inj.shape == (1, 0) and bi.shape == (1, hs)
    base = hcmod.HyperConnectionBase(m.config)
    assert torch.equal(h2, base.combine(o, h)), f"seed {seed}"  # both: one float32 add, one rounding
    _, bi_merged, _ = reference.hc_combine_mix(h, o, None, nw, wd, wu, hc, rank, eps)
    assert torch.equal(bi, bi_merged)  # the inject rows change nothing else


def _gdn_layer(nk: int, nv: int, dk: int, dv: int, interleaved: bool) -> types.SimpleNamespace:
    """The attributes vLLM's Part 1 split functions read (tp 1)."""
    return types.SimpleNamespace(
        gqa_interleaved_layout=interleaved,
        num_k_heads=nk,
        num_v_heads=nv,
        head_k_dim=dk,
        head_v_dim=dv,
        key_dim=nk * dk,
        value_dim=nv * dv,
        tp_size=1,
        tp_rank=0,
        disable_tp_for_ba_proj=False,
    )


GDN = [  # (nk, nv, dk, dv): TP4 and TP1 of Qwen4ExpTextConfig
    (
        CFG.linear_num_key_heads // 4,
        CFG.linear_num_value_heads // 4,
        CFG.linear_key_head_dim,
        CFG.linear_value_head_dim,
    ),
    (
        CFG.linear_num_key_heads,
        CFG.linear_num_value_heads,
        CFG.linear_key_head_dim,
        CFG.linear_value_head_dim,
    ),
]


@pytest.mark.parametrize("heads", GDN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_flat_is_vllms_part1(dtype: torch.dtype, heads: tuple[int, int, int, int]) -> None:
    gen, seed = fresh_generator()
    nk, nv, dk, dv = heads
    hidden = CFG.hidden_size
    x = randn(gen, 1, hidden, dtype=dtype)
    wq = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=dtype, scale=hidden**-0.5)
    wb = randn(gen, 2 * nv, hidden, dtype=dtype, scale=hidden**-0.5)
    got = reference.gdn_input(x, wq, wb, nk, nv, dk, dv, "flat")
    qkvz, ba = reference.gemv(wq, x), reference.gemv(wb, x)  # the op's GEMMs
    layer = _gdn_layer(nk, nv, dk, dv, interleaved=False)
    cls = gdnmod.QwenGatedDeltaNetAttention
    prepare = getattr(cls.prepare_gdn_attention_core_inputs, "_torchdynamo_orig_callable", None)
    prepare = prepare or cls.prepare_gdn_attention_core_inputs.__wrapped__
    mixed_v, z_v, b_v, a_v = prepare(layer, qkvz, ba, 1)  # vLLM's flat split (forward_cpu's too)
    b_c, a_c = cls.split_ba(layer, ba)  # forward_cuda's b / a, then .contiguous()
    want = (mixed_v, z_v, b_c.contiguous(), a_c.contiguous())
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w), f"seed {seed}"
    assert torch.equal(b_v, b_c) and torch.equal(a_v, a_c)
    # The GEMMs (float32 accumulation, one rounding) against torch's F.linear in the dtype: another
    # summation order, so within 2 ULPs at the output's magnitude (floor: max |y| / 1024)
    for mine, theirs in ((qkvz, F.linear(x, wq)), (ba, F.linear(x, wb))):
        assert ulp_distance(mine, theirs) <= 2, f"seed {seed}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_interleaved_is_vllms_part1(dtype: torch.dtype) -> None:
    gen, seed = fresh_generator()
    nk, nv, dk, dv = GDN[0]
    hidden = CFG.hidden_size
    x = randn(gen, 1, hidden, dtype=dtype)
    wq = randn(gen, 2 * nk * dk + 2 * nv * dv, hidden, dtype=dtype, scale=hidden**-0.5)
    wb = randn(gen, 2 * nv, hidden, dtype=dtype, scale=hidden**-0.5)
    got = reference.gdn_input(x, wq, wb, nk, nv, dk, dv, "interleaved")
    layer = _gdn_layer(nk, nv, dk, dv, interleaved=True)
    q, k, v, z, b, a = gdnmod.QwenGatedDeltaNetAttention.fix_query_key_value_ordering(
        layer, reference.gemv(wq, x), reference.gemv(wb, x)
    )
    mixed = torch.cat((q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)), dim=-1)
    for g, w in zip(got, (mixed, z, b, a), strict=True):
        assert torch.equal(g, w.reshape(g.shape)), f"seed {seed}"


@pytest.mark.parametrize(("rows", "length", "k"), [(1, 131072, 2048), (4, 8192, 1024), (3, 3000, 512)])
def test_topk_is_vllms_debug_topk_as_a_set(rows: int, length: int, k: int) -> None:
    gen, seed = fresh_generator()
    logits = torch.randn(rows, length + 64, generator=gen)[:, :length]  # continuous: no ties
    visible = torch.randint(1, length + 1, (rows,), generator=gen, dtype=torch.int32)
    visible[0] = length
    visible[-1] = min(visible[-1].item(), k - 5) if rows > 1 else visible[-1]  # a short row
    logits[torch.arange(length).unsqueeze(0) >= visible.unsqueeze(1)] = float("nan")  # garbage
    got = reference.qsa_topk(logits, visible, k)
    want = torch.full((rows, k), -1, dtype=torch.int32)
    sel = topkmod.SparseIndexerTopk(backend="torch")
    sel(logits.contiguous(), visible, 1, want, k, length)
    for r in range(rows):
        assert sorted(got[r].tolist()) == sorted(want[r].tolist()), f"row {r}, seed {seed}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="expand_qsa_block_indices is a Triton kernel")
@pytest.mark.parametrize(("rows", "length", "k"), [(1, 65536, 512), (3, 131072, 2048), (2, 3000, 512)])
def test_vllms_expansion_takes_the_index_order(rows: int, length: int, k: int) -> None:
    """vLLM 0.32's qsa_indexer expands each row's first min(visible, k) blocks by position: the route's
    increasing index order and the stable sort's value order give the same tokens (as a set per row)
    and the same count column."""
    qsa = pytest.importorskip("vllm.models.qwen4_exp.nvidia.ops.qsa_indexer")
    import qgate_kernels

    gen, seed = fresh_generator("cuda")
    ratio = int(MODEL_CONFIG["indexer_compress_ratio"])  # 4: blocks of 4 tokens
    logits = torch.randint(0, 64, (rows, length), generator=gen, device="cuda").float()  # ties at the k-th
    visible = torch.randint(k // 2, length + 1, (rows,), generator=gen, device="cuda", dtype=torch.int32)
    positions = visible.long() * ratio + torch.randint(0, ratio, (rows,), generator=gen, device="cuda")
    outs = []
    for idx in (
        qgate_kernels.qsa_topk(logits, visible, k),
        reference.qsa_topk_by_value(logits.cpu(), visible.cpu(), k).cuda(),
    ):
        out = torch.full((rows, k * ratio + ratio), -7, dtype=torch.int32, device="cuda")  # [rows, width + 1]
        qsa.expand_qsa_block_indices(idx, positions, visible, ratio, k * ratio, out)
        outs.append(out.cpu())
    assert torch.equal(outs[0][:, -1], outs[1][:, -1]), f"seed {seed}"  # the count column
    assert torch.equal(torch.sort(outs[0][:, :-1]).values, torch.sort(outs[1][:, :-1]).values), f"seed {seed}"
