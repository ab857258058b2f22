"""The contract's `ops:` section: which routes to screen at which shapes, with which tolerances.

Every key is known (extra="forbid"): a typo is an error naming the key path. Without an `ops:`
section, or with `default_shapes: true` (the default), the screen and the benchmark use the
production model's shapes of qgate.ops.cases.DEFAULT_SHAPES, plus the shapes listed here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qgate.contract.base import SamplingSeed, Strict
from qgate_route_env import ROUTE_GDN, ROUTE_GEMV, ROUTE_HC, ROUTE_TOPK, ROUTES

# The route names are route_env's (one home); Literal of them so a contract naming another is refused.
RouteName = Literal[ROUTE_GEMV, ROUTE_HC, ROUTE_GDN, ROUTE_TOPK]  # type: ignore[valid-type]
ALL_ROUTES: tuple[str, ...] = tuple(ROUTES)


class Tolerance(Strict):
    """Per route, over every trial. The dot products (GEMV's and GDN input's outputs, HC's h' and
    injection) are judged by their forward-error bound (docs/ops.md); max_ulp judges HC's block_input
    and the top-k.

    max_ulp: distance to the reference in units in the last place of the output dtype, at the
    element's magnitude but never below 1/1024 of the output's largest magnitude (so cancellation
    to near zero, where float32 summation order alone moves many ULPs, is not an error).
    max_abs_diff: absolute difference (None: not gated, still reported).
    min_bitwise_fraction: the fraction of trials whose outputs equal the reference bit for bit.
    """

    max_ulp: int = Field(ge=0)
    max_abs_diff: float | None = Field(None, ge=0)
    min_bitwise_fraction: float = Field(0.0, ge=0, le=1)


# The kernels accumulate in float32 in another order than the reference (cuBLAS / CPU BLAS in
# float32): a rounding apart, so a few ULPs. The HC route rounds three intermediates to the
# activation dtype (down, lora, gate) as vLLM does: one gate element a rounding apart moves
# block_input by up to |xn| ulp(gate) / (4 HC), which where the streams cancel (block_input near
# the floor max / 1024 of the ULP measure) reads as up to ~17 ULPs, and a lora element a rounding
# apart moves many gate elements at once. The bound is set from the spread of a valid implementation
# of the same math, the unfused torch sequence, against the reference (tools/hc_ulp_spread.py, CPU,
# 1500 draws per dtype and op at the production shape): fp16 mix median 1, p99 24, max 66 ULP;
# 11 of 9000 draws over 32, one over 64, none over 128. At 32 (the bound until the tenth session)
# that sequence fails a 20-trial screen case about one time in ten (the route did once on the H200:
# fp16 final, 33). The top-k is exact by definition.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    ROUTE_GEMV: Tolerance(max_ulp=2),
    ROUTE_HC: Tolerance(max_ulp=128),
    ROUTE_GDN: Tolerance(max_ulp=2),
    ROUTE_TOPK: Tolerance(max_ulp=0, max_abs_diff=0.0, min_bitwise_fraction=1.0),
}


class GemvShape(Strict):
    n: int = Field(ge=1, description="output rows (weight [n, k])")
    k: int = Field(ge=1)
    dtype: Literal["fp16", "bf16"] = "fp16"


class HcShape(Strict):
    """One Qwen4Exp GatedResidual module: hc_count streams of `hidden`, low rank lora_rank."""

    hc_count: int = Field(ge=1, le=64)
    hidden: int = Field(ge=1, description="HS, the hidden size of one stream")
    lora_rank: int = Field(ge=1)
    dtype: Literal["fp16", "bf16"] = "bf16"
    op: Literal["mix", "combine_and_mix", "final"] = Field(
        "mix", description="mix; combine_and_mix (pending combine with injection); final (the final mixer)"
    )


class GdnShape(Strict):
    hidden: int = Field(ge=1)
    num_k_heads: int = Field(ge=1)
    num_v_heads: int = Field(ge=1)
    head_k_dim: int = Field(ge=1)
    head_v_dim: int = Field(ge=1)
    layout: Literal["flat", "interleaved"] = Field(
        "flat", description="flat: gqa_interleaved_layout=False (Qwen4Exp); interleaved: Qwen3-Next"
    )
    dtype: Literal["fp16", "bf16"] = "fp16"

    @model_validator(mode="after")
    def _heads_divide(self) -> GdnShape:
        if self.layout == "interleaved" and self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"num_v_heads {self.num_v_heads} is not a multiple of num_k_heads {self.num_k_heads}"
            )
        return self


class TopkShape(Strict):
    rows: int = Field(ge=1)
    length: int = Field(ge=1, description="L, the logits columns")
    k: int = Field(ge=1, le=4096, description="block_topk")
    visible: int | None = Field(
        default=None, ge=1, description="row 0's visible columns (default: all L; the timed row)"
    )

    @model_validator(mode="after")
    def _k_fits(self) -> TopkShape:
        if self.k > self.length:
            raise ValueError(f"k {self.k} exceeds length {self.length}")
        if self.visible is not None and self.visible > self.length:
            raise ValueError(f"visible {self.visible} exceeds length {self.length}")
        return self


class Shapes(Strict):
    fp16_gemv: list[GemvShape] = Field(default_factory=list)
    fused_hc_fp16: list[HcShape] = Field(default_factory=list)
    fused_gdn_input_fp16: list[GdnShape] = Field(default_factory=list)
    qsa_topk: list[TopkShape] = Field(default_factory=list)


class Bench(Strict):
    warmup: int = Field(3, ge=0, description="graph replays before timing")
    reps: int = Field(30, ge=1, description="timed graph replays; the median is reported")
    rotate_bytes: int = Field(256 * 2**20, ge=0, description="distinct input bytes cycled per timed graph")
    max_sets: int = Field(512, ge=1, description="at most this many input sets per graph")


class Ops(Strict):
    routes: list[RouteName] = Field(default_factory=lambda: list(ALL_ROUTES))
    trials: int = Field(20, ge=1, description="fresh random inputs per route and shape")
    seed: SamplingSeed | None = Field(None, description="None: a fresh seed per run (recorded)")
    default_shapes: bool = True
    shapes: Shapes = Field(default_factory=Shapes)
    tolerances: dict[RouteName, Tolerance] = Field(default_factory=dict)
    bench: Bench = Field(default_factory=Bench)

    def tolerance(self, route: str) -> Tolerance:
        return self.tolerances.get(route, DEFAULT_TOLERANCES[route])
