"""The real-weight screen's error rates: false FAIL over the whole production model, and power per defect.

`simulate(seed)` runs the shipped CPU kernels (qgate_kernels.gemv: csrc/cpu, float32 in a fixed order
whose depth is within bound.depth, as the CUDA kernel's) on draws at every K the production model
judges at TP 4 (160, 1536, 2560, 10240), with realistic scales (`_draw`: Gaussian and heavy-tailed
weight rows with a mean, normed and SiLU-like activations, outlier channels; fp16), and judges every
output with the screen's own code
(bound.judge_dot). The same draws through three planted defects: the float32 sums rounded to fp16
at every step (`accumulate_in`), the last K tile of 256 dropped, and +1 ULP on a random 1 % of
outputs. Reduced sampling (SAMPLE_ROWS x SAMPLE_CALLS outputs per K), composed to a whole run:

- false FAIL of a run = P(some output of the run over its bound) + P(some route's sign test rejects):
  the first at most N_run x 2 K exp(-lambda^2 (1 - u)^2 / 2) (Higham-Mary, union over the run's outputs,
  N_run = `run_outputs()`, all 48 layers, 4 ranks, every role, the default 20 trials); the sample's
  worst err / bound says how far the shipped route stays inside. The second is the sign test's level,
  exact when the deviations from the correctly rounded result are symmetric (the sample's counts
  above / below are shown with their own sign test), 3 routes x ALPHA_BIAS.
- power for a defect = 1 - (1 - q)^n with q the sample's fraction of a call's outputs over their
  bound at the K where it is smallest and n the outputs of the run's smallest role (the
  shared_expert_gate: 1 output a call x 48 layers x 4 ranks x 20 trials); for the +1 ULP bias the
  larger of that and the sign test's power at the run's N (normal approximation of the binomial).

`python -m qgate.ops.calibration` prints the figures of docs/ops.md; tests/kernels/test_ops_calibration.py
reproduces them.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from qgate.ops import bound
from qgate.ops.shapes import GEMV_DEFAULT_ROLES, MODEL_CONFIG, calls_a_step, projections

# What simulate(seed=0) gives (docs/ops.md; tests/kernels/test_ops_calibration.py recomputes them): the
# records of the screen carry them, so a verdict states its error rates.
FIGURES = {
    "false_fail_per_run": 9.1e-4,  # whole model, TP 4, every rank and role, 20 trials
    "power_fp16_accumulation": 1.0,
    "power_last_k_tile_dropped": 1.0,
    "power_one_ulp_up_on_1pct": 1.0,  # the smallest role by the bound alone (1 - 5e-7); the sign test adds
}
SAMPLE_ROWS = 1024
SAMPLE_CALLS = 8
KS = (160, 1536, 2560, 10240)
DEFECTS = ("fp16_accumulation", "last_k_tile_dropped", "one_ulp_up_on_1pct")


def run_outputs(cfg: dict[str, Any] | None = None, tp: int = 4, trials: int = 20) -> dict[str, Any]:
    """Judged outputs of one `run ops --real` of the whole model: per route, and the smallest role's."""
    cfg = cfg or MODEL_CONFIG
    p = {x.role: x.n for x in projections(cfg, tp)}
    calls, layers = calls_a_step(cfg), int(cfg["num_hidden_layers"])
    d, hc = int(cfg["hc_count"]) * int(cfg["hidden_size"]), int(cfg["hc_count"])
    gemv = sum(calls[r] * p[r] for r in GEMV_DEFAULT_ROLES)
    gdn = sum(calls[r] * p[r] for r in ("in_proj_qkvz", "in_proj_ba"))
    hc_out = layers * 2 * (d + hc) + d  # h' and the injection of each block's two modules, the final h'
    per = {"fp16_gemv": gemv, "fused_gdn_input_fp16": gdn, "fused_hc_fp16": hc_out}
    return {"per_route": {r: n * tp * trials for r, n in per.items()}, "smallest_role": layers * tp * trials}


def _draw(gen: torch.Generator, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights: half the rows N(0, 1/K), half heavy-tailed (a normal scaled by exp(N(0, 1) / 2)) with a
    per-row mean of 0.2 of their spread; activations: half the calls N(0, 1) (a normed hidden state),
    half silu(2 N(0, 1)) (an MLP activation: mostly positive, so partial sums drift); 1 % outlier
    channels x 10 in every call. fp16."""
    half = SAMPLE_ROWS // 2
    w = torch.randn(SAMPLE_ROWS, k, generator=gen)
    w[half:] = w[half:] * torch.exp(0.5 * torch.randn(half, k, generator=gen)) + 0.2 * torch.randn(
        half, 1, generator=gen
    )
    w = (w * k**-0.5).half()
    x = torch.randn(SAMPLE_CALLS, k, generator=gen)
    x[SAMPLE_CALLS // 2 :] = torch.nn.functional.silu(2 * x[SAMPLE_CALLS // 2 :])
    x[:, torch.randperm(k, generator=gen)[: max(1, k // 100)]] *= 10  # outlier channels
    return w, x.half()


def accumulate_in(w: torch.Tensor, x: torch.Tensor, acc_dtype: torch.dtype) -> torch.Tensor:
    """The shipped order (32 lane sums, then a halving tree) with each partial sum rounded to acc_dtype."""
    n, k = w.shape
    t = torch.nn.functional.pad(w.float() * x.float(), (0, (-k) % 32)).view(n, -1, 32)  # exact products
    acc = torch.zeros(n, 32, dtype=acc_dtype)
    for c in range(t.shape[1]):
        acc = (acc.float() + t[:, c]).to(acc_dtype)
    while acc.shape[1] > 1:
        half = acc.shape[1] // 2
        acc = (acc[:, :half].float() + acc[:, half:].float()).to(acc_dtype)
    return acc[:, 0].to(w.dtype)


def _routes(w: torch.Tensor, x: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    import qgate_kernels

    shipped = qgate_kernels.gemv(w, x, static_weight=True)
    keep = (w.shape[1] - 1) // 256 * 256
    dropped = (
        qgate_kernels.gemv(w[:, :keep].contiguous(), x[:keep].contiguous())
        if keep
        else torch.zeros_like(shipped)
    )
    s64 = shipped.double()
    up = torch.rand(shipped.shape, generator=gen) < 0.01
    biased = torch.where(up, (s64 + bound.ulp(s64, shipped.dtype)).to(shipped.dtype), shipped)
    return {"shipped": shipped, "fp16_accumulation": accumulate_in(w, x, torch.float16),
            "last_k_tile_dropped": dropped, "one_ulp_up_on_1pct": biased}  # fmt: skip


def simulate(seed: int = 0) -> dict[str, Any]:
    """The sampled per-output figures at every K and the run-level rates composed from them."""
    gen = torch.Generator().manual_seed(seed)
    per_k: dict[int, dict[str, Any]] = {}
    for k in KS:
        w, xs = _draw(gen, k)
        tallies = {name: bound.Tally() for name in ("shipped", *DEFECTS)}
        for x in xs:
            for name, out in _routes(w, x, gen).items():
                tallies[name].add(bound.judge_dot(w, x, out), name)
        per_k[k] = {name: t.as_dict() for name, t in tallies.items()}
    n = run_outputs()
    n_run = sum(n["per_route"].values())
    lam_term = 2 * max(KS) * math.exp(-(bound.LAMBDA**2) * (1 - bound.U32) ** 2 / 2)
    shipped = [per_k[k]["shipped"] for k in KS]
    up, down = sum(s["above_rn"] for s in shipped), sum(s["below_rn"] for s in shipped)
    false_fail = n_run * lam_term + len(n["per_route"]) * bound.ALPHA_BIAS
    power = {}
    for d in DEFECTS:
        q = min(per_k[k][d]["over_bound"] / per_k[k][d]["outputs"] for k in KS)
        caught = 1 - (1 - q) ** n["smallest_role"]
        if d == "one_ulp_up_on_1pct":
            caught = max(caught, _sign_power(0.01, min(n["per_route"].values())))
        power[d] = {"per_output_min": q, "run": caught}
    return {
        "seed": seed,
        "sample": {"rows": SAMPLE_ROWS, "calls": SAMPLE_CALLS, "ks": list(KS)},
        "per_k": {str(k): v for k, v in per_k.items()},
        "run_outputs": n,
        "false_fail": {
            "bound_union": n_run * lam_term,
            "sign_tests": len(n["per_route"]) * bound.ALPHA_BIAS,
            "run": false_fail,
            "shipped_worst_ratio": max(s["worst_ratio"] for s in shipped),
            "shipped_over_bound": sum(s["over_bound"] for s in shipped),
            "shipped_sign_balance": bound.sign_test(up, down, alpha=0.05),
        },
        "power": power,
    }


def _sign_power(frac: float, n: int) -> float:
    """P(sign test rejects) when frac of n outputs sit one ULP above (the correct route's own +-1
    deviations ignored: they only add symmetric noise), normal approximation."""
    from scipy.stats import norm

    up = frac * n
    z_crit = norm.isf(bound.ALPHA_BIAS / 2)
    return float(norm.sf(z_crit - math.sqrt(up)))  # up of up + 0 at 1/2: z = (up - up/2) / (sqrt(up)/2)


if __name__ == "__main__":
    print(json.dumps(simulate(), indent=1))
