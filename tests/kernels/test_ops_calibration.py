"""The real-weight screen's error rates (qgate.ops.calibration, docs/ops.md): the seeded simulation on the
shipped CPU kernels at the production K, composed to a whole-model run (48 layers, TP 4, every rank and
role, 20 trials): false FAIL <= 0.1 % of runs, power >= 99 % for each planted defect."""

from __future__ import annotations

from qgate.ops.calibration import DEFECTS, FIGURES, run_outputs, simulate


def test_whole_model_output_count() -> None:
    n = run_outputs()
    # per rank and trial: 36 GDN + 12 attention layers, lm_head 62080; x 4 ranks x 20 trials
    assert n["per_route"]["fp16_gemv"] == 31_880_960 and n["smallest_role"] == 48 * 4 * 20


def test_false_fail_and_power_of_the_docs() -> None:
    r = simulate(seed=0)
    ff = r["false_fail"]
    assert ff["shipped_over_bound"] == 0 and ff["shipped_worst_ratio"] < 1.0
    assert ff["shipped_sign_balance"]["passed"]  # the shipped route's deviations are symmetric
    assert ff["run"] <= 1e-3 and ff["bound_union"] < 1e-4
    for d in DEFECTS:
        assert r["power"][d]["run"] >= 0.99, (d, r["power"][d])
    # the figures docs/ops.md quotes and the records carry (calibration.FIGURES)
    assert round(ff["run"], 5) == FIGURES["false_fail_per_run"]
    q = r["power"]["one_ulp_up_on_1pct"]["per_output_min"]
    assert round(1 - (1 - q) ** r["run_outputs"]["smallest_role"], 5) == FIGURES["power_one_ulp_up_on_1pct"]
    assert FIGURES["power_fp16_accumulation"] == round(r["power"]["fp16_accumulation"]["run"], 5)
    assert FIGURES["power_last_k_tile_dropped"] == round(r["power"]["last_k_tile_dropped"]["run"], 5)
    assert round(ff["shipped_worst_ratio"], 2) == 0.98
    assert (ff["shipped_sign_balance"]["above_rn"], ff["shipped_sign_balance"]["below_rn"]) == (28, 17)
    assert {d: round(r["power"][d]["per_output_min"], 4) for d in DEFECTS} == {
        "fp16_accumulation": 0.6403,
        "last_k_tile_dropped": 0.9954,
        "one_ulp_up_on_1pct": 0.0038,
    }
