"""The distribution audit's calibration: per model it was measured on, the reps of honest candidates and
of the named corruptions as (positions compared, discordant) pairs (tools/dist_audit_calibration.py
from the runs docs/speed-audit.md lists). qgate.speed.dist_audit states each verdict's power from them:
the corruptions' reps drawn (seeded) at the verdict's number of reps, the rule applied.

A verdict on a model measured here is judged against that model's entry; on any other model, against
the entries pooled, and the verdict says so (the power of a corruption depends on how sharp the model's
distributions are: the trained demo model keeps the lm_head's top 3 within its top 8 at 57 % of
positions on half of K; the random-weight production-shape checkpoint at none).
"""

from __future__ import annotations

# The named corruptions (tests/fixtures/gamed_routes.py, `qgate demo --faulty-kind`), in words.
CORRUPTIONS: dict[str, str] = {
    "defeat-lm-head": "the lm_head on half of K, timed only (the route's kernel)",
    "top1": "the top1-only lm_head (the argmax right, the other logits not computed)",
    "defeat": "every role on half of K, timed only (the route's kernel)",
    "defeat-strided": "every role on half of K, timed only (torch's matmul on strided halves)",
}

# model key -> {model_spec: the contract's `model` it was measured on, honest: {kind: reps}, corrupt:
# {kind: reps}}; a rep is [positions compared, discordant].
MODELS: dict[str, dict] = {
    # The demo model on the 2-core CPU, 2026-12-06 (1194ba1 + this change): contracts/demo-cpu.yaml with
    # audit_top_k 8, 1 launch x 4 reps an arm, 256 in / 512 out (docs/speed-audit.md).
    "demo": {
        "model_spec": "tiny-trained-wide",
        "honest": {
            "shipped": [[512, 0], [512, 0], [512, 0], [512, 0]],
            "memo-exact": [[512, 0], [512, 0], [512, 0], [512, 0]],
            "reversed": [[512, 0], [512, 0], [512, 0], [512, 0]],  # rounding_routes: summed last block first
            "f64": [[512, 0], [512, 0], [512, 0], [512, 0]],  # rounding_routes: float64 accumulation
        },
        "corrupt": {
            "defeat-lm-head": [[14, 6], [13, 6], [33, 15], [47, 19]],
            "top1": [[6, 6], [7, 7], [8, 8], [20, 20]],
            "defeat": [[2, 1], [10, 6], [1, 0], [11, 7]],
            "defeat-strided": [[6, 4], [7, 5], [4, 3], [4, 3]],
        },
    },
    # The production-shape checkpoint (48 layers, random weights, bf16) on an H100, 2026-12-06 (d9079e6,
    # docs/evidence/gpu-runs/2026-12-06-h100-s9): contracts/qwen38-prodshape-bf16.yaml, one engine start
    # an arm of 4 reps, 2,048 in / 256 out; each corruption against the honest pair's control.
    "prod-shape-bf16": {
        "model_spec": "/tmp/qgate-prodshape",
        "honest": {"shipped": [[9, 0], [51, 0], [135, 0], [19, 0]]},
        "corrupt": {
            "defeat-lm-head": [[1, 1], [1, 1], [1, 1], [2, 2]],
            "top1": [[9, 9], [51, 51], [135, 135], [19, 19]],
            "defeat": [[1, 1], [1, 1], [1, 1], [2, 2]],
            "defeat-strided": [[1, 1], [1, 1], [2, 2], [1, 1]],
        },
    },
    # The same shapes in fp16, attention without QSA (/tmp/qgate-prodshape-noqsa), on an H100,
    # 2026-12-06 (c4ea38b, docs/evidence/gpu-runs/2026-12-06-h100-s10): contracts/qwen38-prodshape-fp16.yaml;
    # the honest pair is `qgate demo --until-decided`'s (2 engine starts an arm of 4 reps), each
    # corruption one start against its control's first start.
    "prod-shape-fp16": {
        "model_spec": "/tmp/qgate-prodshape-noqsa",
        "honest": {"shipped": [[7, 0], [256, 0], [25, 0], [86, 0], [69, 0], [59, 0], [7, 0], [78, 0]]},
        "corrupt": {
            "defeat-lm-head": [[1, 1], [1, 1], [1, 1], [1, 1]],
            "top1": [[7, 7], [256, 256], [25, 25], [86, 86]],
            "defeat": [[1, 1], [1, 1], [1, 1], [1, 1]],
            "defeat-strided": [[1, 1], [1, 1], [1, 1], [1, 1]],
        },
    },
}
