"""The forward-error bound of a route's dot products, and the bias statistic over many of them.

A route computes y = sum_k w_k x_k (fp16 / bf16 w and x) in float32 and rounds once to the activation
dtype. Each product is exact in float32 (11 + 11 or 8 + 8 significand bits fit in 24), so the error
comes from the float32 additions, then the one output rounding. Every term passes through at most
d(K) = ceil(K / 32) + 12 additions in both shipped kernels (csrc/cpu/row_dot.h: 32 lane sums of K/32
terms, then a 5-level tree; csrc/gemv_rows.cuh: lane sums of K/256 chunks of 8, a 5-level xor
butterfly, then up to 7 warp partials in slot order). The judged bound of each output is

    |y_route - y_exact| <= gamma(K) * sum_k |w_k x_k|  +  1/2 ulp_dtype(max(|y_exact|, |y_route|))

with y_exact and sum |w x| in float64 (the reference: fp64 rounding ~2^-53 K relative, far below),
u = 2^-24 (float32's unit roundoff) and gamma(K) = expm1(LAMBDA sqrt(d) u + d u^2 / (1 - u)) ~ c u
with c = LAMBDA sqrt(d(K)): Higham and Mary's probabilistic bound (SIAM J. Sci. Comput. 41(5), 2019,
Thm 3.1 / 4.1): with rounding errors independent and of mean zero it holds with probability at least
1 - 2 K exp(-LAMBDA^2 (1 - u)^2 / 2) per output. LAMBDA = 9 makes that <= 2.6e-18 K per output: over
the whole production model (about 5e7 judged outputs per run at TP 4, K <= 10240) the bound
false-FAILs a run with probability <= 1.4e-6 even under the union bound. The deterministic worst case
(c = d, tens to hundreds of u) would hide an fp16 accumulation and a one-ULP bias; the simulation
(ops/calibration.py, docs/ops.md) measures the error rates of this choice.

The bias statistic: a bound that holds cannot see a small systematic shift. Per output, the signed
distance of the route's result to the correctly rounded exact result, in ULPs of the result:
delta = (y_route - RN(y_exact)) / ulp. A correct route has delta = 0 except where y_exact lies
within its float32 error of a rounding midpoint, and there the sign is that of its float32 error:
+1 and -1 equally likely. The test: the exact two-sided binomial sign test of #(delta > 0) against
#(delta != 0) at p = 1/2, at ALPHA_BIAS per route. (The raw errors over their bounds are not mean
zero even for a correct route: inside an ULP cell the density of y slopes, so rounding to nearest is
biased by ~1e-4 of a bound, which 5e7 outputs would detect.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

U32 = 2.0**-24  # float32 unit roundoff: the routes accumulate in float32
LAMBDA = 9.0  # the probabilistic bound's lambda (module docstring)
ALPHA_BIAS = 3e-4  # the sign test's level, per route (three routes judged: 9e-4 of the 0.1 % budget)
_MANT = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}
_EMIN = {torch.float16: -14, torch.bfloat16: -126, torch.float32: -126}
_MAX = {torch.float16: 65504.0, torch.bfloat16: 3.3895313892515355e38, torch.float32: 3.4028234663852886e38}


def depth(k: int) -> int:
    """The most float32 additions a term passes through in the shipped row-dot engines (CPU, CUDA)."""
    return math.ceil(k / 32) + 12


def gamma(k: int, lam: float = LAMBDA) -> float:
    """Higham-Mary's gamma~_d(lambda) at d = depth(k): the relative bound of the float32 sum."""
    d = depth(k)
    return math.expm1(lam * math.sqrt(d) * U32 + d * U32 * U32 / (1 - U32))


def c_of(k: int, lam: float = LAMBDA) -> float:
    """The constant c of |err| <= c u sum|w x| (= gamma / u)."""
    return gamma(k, lam) / U32


def ulp(v: Tensor, dtype: torch.dtype) -> Tensor:
    """The spacing of dtype at |v| (float64 in, float64 out; subnormal spacing below the normal range)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0 ** _EMIN[dtype]))).clamp_min(_EMIN[dtype])
    return torch.exp2(e - _MANT[dtype])


def round_nearest(v: Tensor, dtype: torch.dtype) -> Tensor:
    """float64 v correctly rounded to dtype (ties to even), as float64; +-inf past dtype's range.
    (v.to(float16) goes through float32 and can round twice.)"""
    q = ulp(v, dtype)
    r = torch.round(v / q) * q  # v / q is exact (a power of two); round() is half-to-even
    return torch.where(r.abs() > _MAX[dtype], torch.sign(r) * math.inf, r)


@dataclass
class Judged:
    """Per output of one call: ratio |err| / bound, and delta (y_route - RN(y_exact)) / ulp."""

    ratio: Tensor  # float64 [N]; inf where the route is non-finite and the exact result is not
    delta: Tensor  # float64 [N]
    exact: Tensor
    bound: Tensor


def judge(out: Tensor, exact: Tensor, slack: Tensor, dtype: torch.dtype) -> Judged:
    """out (the route's, in dtype) against exact (float64) with slack (the float32 part of the bound,
    float64), plus half an ULP of dtype at the larger of the two."""
    o, y = out.double().reshape(-1), exact.reshape(-1)
    both = torch.maximum(o.abs().nan_to_num(posinf=0.0), y.abs())
    bound = slack.reshape(-1) + 0.5 * ulp(both, dtype)
    err = (o - y).abs()
    ratio = torch.where(torch.isfinite(o), err / bound, torch.full_like(err, math.inf))
    rn = round_nearest(y, dtype)
    overflow = torch.isinf(o) & torch.isinf(rn) & (torch.sign(o) == torch.sign(rn))
    ratio = torch.where(overflow, torch.zeros_like(ratio), ratio)  # both past the range, same sign
    delta = torch.where(overflow | ~torch.isfinite(o), torch.zeros_like(o), (o - rn) / ulp(rn, dtype))
    return Judged(ratio=ratio.nan_to_num(nan=math.inf), delta=delta, exact=y, bound=bound)


ROWS_PER_BLOCK = 4096  # weight rows converted to float64 at a time (lm_head: 62080 x 2560 at TP 4)


def judge_dot(w: Tensor, x: Tensor, out: Tensor, extra: Tensor | None = None) -> Judged:
    """Rows of w [N, K] dotted with x [K] or [T, K] (calls; the route's dtype) against the route's
    out [N] or [T, N]; flattened call-major. extra: float64 [N] added to the bound (an input the route
    rounds itself). The float64 copies are made ROWS_PER_BLOCK rows at a time."""
    x64 = x.double().reshape(-1, w.shape[1])  # [T, K]
    exact, total = [], []
    for r in range(0, w.shape[0], ROWS_PER_BLOCK):
        w64 = w[r : r + ROWS_PER_BLOCK].double()  # [n, K]
        exact.append(x64 @ w64.t())  # [T, n]
        total.append(x64.abs() @ w64.abs().t())
    slack = gamma(w.shape[1]) * torch.cat(total, dim=1)  # [T, N]
    if extra is not None:
        slack = slack + extra
    return judge(out.reshape(x64.shape[0], -1), torch.cat(exact, dim=1), slack, w.dtype)


def judge_gdn(
    x: Tensor, wq: Tensor, wb: Tensor, heads: tuple[int, int, int, int], layout: str, outs: tuple[Tensor, ...]
) -> Judged:
    """GDN input: every element of (mixed_qkv, z, b, a) is one row of w_qkvz or w_ba dotted with x; the
    exact values and sums |w x| go through the layout's split as the outputs did (reference.gdn_input)."""
    x64 = x.double().reshape(-1)
    k = x64.numel()
    exact = _gdn_split(wq.double() @ x64, wb.double() @ x64, heads, layout)
    slack = gamma(k) * _gdn_split(wq.double().abs() @ x64.abs(), wb.double().abs() @ x64.abs(), heads, layout)
    out = torch.cat([t.reshape(-1) for t in outs])
    return judge(out, exact, slack, x.dtype)


def _gdn_split(qkvz: Tensor, ba: Tensor, heads: tuple[int, int, int, int], layout: str) -> Tensor:
    """[mixed_qkv | z | b | a] flattened, from the rows of w_qkvz x and w_ba x (reference.gdn_input)."""
    nk, nv, dk, dv = heads
    if layout == "flat":
        return torch.cat([qkvz, ba])  # [q | k | v | z], [b | a]: the outputs in row order
    r = nv // nk
    q, k, v, z = torch.split(qkvz.view(nk, 2 * dk + 2 * r * dv), [dk, dk, r * dv, r * dv], dim=1)
    b, a = torch.split(ba.view(nk, 2 * r), [r, r], dim=1)
    return torch.cat([t.reshape(-1) for t in (q, k, v, z, b, a)])


def judge_hc(
    h: Tensor,
    o: Tensor | None,
    inj: Tensor | None,
    outs: tuple[Tensor, ...],
    norm: Tensor,
    down: Tensor,
    hc: int,
    rank: int,
    eps: float,
) -> list[tuple[str, Judged]]:
    """HC's judged quantities: h' (a combine_and_mix's pending combine: h + 2 sigmoid(inj / HC) o per
    stream, one float32 fma rounded; slack 16 u (|h| + |o c|) for the float32 sigmoid and fma) and the
    injection logits (rows R..R+HC of the down projection: a dot product of xn, the route's own norm
    of its h', with one ULP of xn allowed where the float32 norm may round the other way: _hc_xn).
    outs: the op's (h', block_input, injection) or, for a mix (o None), (block_input, injection); the
    final mixer (down [R, D]) has no injection. block_input (norm -> down -> silu -> up -> sigmoid mix)
    is no single dot product: the screen judges it by the route's ULP tolerance."""
    judged = []
    h_route = h
    if o is not None:
        hs = h.shape[-1] // hc
        ones = torch.ones(1, hc, 1, dtype=torch.float64, device=h.device)
        c = ones if inj is None else 2 * torch.sigmoid(inj.double() / hc).view(1, hc, 1)
        bo = o.double().view(1, 1, hs) * c  # [1, HC, HS]
        hh = h.double().view(1, hc, hs)
        judged.append(("h", judge(outs[0], hh + bo, 16 * U32 * (hh.abs() + bo.abs()), h.dtype)))
        h_route = outs[0]
    if down.shape[0] != rank:  # the final mixer has no injection
        xn, unsure = _hc_xn(h_route, norm, hc, eps)  # [D] rounded as the route rounds it
        w_inj = down[rank : rank + hc].double()  # [HC, D]
        slack = gamma(xn.numel()) * (w_inj.abs() @ xn.abs()) + w_inj.abs() @ unsure
        judged.append(("injection", judge(outs[-1].reshape(-1), w_inj @ xn, slack, h.dtype)))
    return judged


def _hc_xn(h: Tensor, norm: Tensor, hc: int, eps: float) -> tuple[Tensor, Tensor]:
    """The grouped Gemma RMSNorm of h [1, D] in float64, correctly rounded to h's dtype ([D]), and per
    element one ULP where the route's float32 norm may round the other way (the float64 value within
    2^-18 relative of a rounding midpoint: the float32 norm's error is below ~50 u = 2^-18.4), else 0."""
    d = h.shape[-1]
    g = h.double().view(hc, d // hc)
    y = g / torch.sqrt(g.square().mean(dim=-1, keepdim=True) + eps)
    y = (y + y * norm.double().reshape(-1, d // hc)).reshape(-1)  # norm [D] or shared [HS]
    r = round_nearest(y, h.dtype)
    q = ulp(r, h.dtype)
    unsure = (0.5 * q - (y - r).abs()) <= 2.0**-18 * y.abs()
    return r, torch.where(unsure, q, torch.zeros_like(q))


@dataclass
class Tally:
    """The judged outputs of many calls, summed: what a role's row and the bias test read."""

    outputs: int = 0
    exceeded: int = 0
    worst_ratio: float = 0.0
    up: int = 0  # delta > 0: above the correctly rounded exact result
    down: int = 0
    first: dict[str, Any] | None = None  # the first output over its bound
    where: list[str] = field(default_factory=list)

    def add(self, j: Judged, what: str) -> None:
        self.outputs += j.ratio.numel()
        over = j.ratio > 1.0
        n_over = int(over.sum())
        if n_over and self.first is None:
            i = int(torch.nonzero(over)[0])
            self.first = {"at": what, "index": i, "ratio": float(j.ratio[i]), "exact": float(j.exact[i]),
                          "bound": float(j.bound[i])}  # fmt: skip
        self.exceeded += n_over
        if j.ratio.numel():
            self.worst_ratio = max(self.worst_ratio, float(j.ratio.max()))
        self.up += int((j.delta > 0).sum())
        self.down += int((j.delta < 0).sum())

    def merge(self, other: Tally) -> None:
        self.outputs += other.outputs
        self.exceeded += other.exceeded
        self.worst_ratio = max(self.worst_ratio, other.worst_ratio)
        self.up += other.up
        self.down += other.down
        if self.first is None:
            self.first = other.first

    def as_dict(self) -> dict[str, Any]:
        return {"outputs": self.outputs, "over_bound": self.exceeded, "worst_ratio": self.worst_ratio,
                "above_rn": self.up, "below_rn": self.down, "first_over": self.first}  # fmt: skip


def sign_test(up: int, down: int, alpha: float = ALPHA_BIAS) -> dict[str, Any]:
    """Exact two-sided binomial test of up against up + down at 1/2; passed when p >= alpha.
    (No scipy: the device image may lack it. At 1/2 the two-sided p is twice the upper tail of the
    larger count, capped at 1: scipy's binomtest gives the same.)"""
    n, m = up + down, max(up, down)
    if n == 0 or 2 * m == n:
        p = 1.0
    else:
        i = torch.arange(m, n + 1, dtype=torch.float64)
        log_terms = (
            torch.lgamma(torch.tensor(n + 1.0, dtype=torch.float64))
            - torch.lgamma(i + 1)
            - torch.lgamma(n - i + 1)
        )
        p = min(1.0, 2.0 * float(torch.exp(torch.logsumexp(log_terms, 0) - n * math.log(2.0))))
    return {"above_rn": up, "below_rn": down, "p_value": p, "alpha": alpha, "passed": p >= alpha}
