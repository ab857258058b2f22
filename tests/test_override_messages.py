"""An override that returns the wrong dtype or shape is named as such, in qgate's own line (issue 30,
defect 7): the plugin's check in the vLLM process, and the launcher carrying its line out of the log,
where the engine child only saw vLLM's EngineDeadError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qgate.engine.launcher import cause_in_log
from qgate_kernels.sites.hc import HcSite


def _site() -> HcSite:
    site = HcSite.__new__(HcSite)  # the check needs only the layer's sizes
    site.hc, site.hs, site.use_combine = 4, 128, True
    return site


def test_a_wrong_dtype_is_named_a_dtype_not_a_shape() -> None:
    h = torch.zeros(1, 512, dtype=torch.float16)
    out = (torch.zeros(1, 512), torch.zeros(1, 128), torch.zeros(1, 4))  # float32, the right shapes
    with pytest.raises(RuntimeError) as info:
        _site()._checked(out, h, None)
    msg = str(info.value)
    assert "dtypes ['float32', 'float32']" in msg and "expected float16" in msg and "shapes" not in msg


def test_a_wrong_shape_is_named_a_shape() -> None:
    h = torch.zeros(1, 512, dtype=torch.float16)
    out = (
        torch.zeros(1, 512, dtype=torch.float16),
        torch.zeros(1, 64, dtype=torch.float16),
        torch.zeros(1, 4),
    )
    with pytest.raises(RuntimeError, match=r"returned shapes \[\(1, 512\), \(1, 64\), \(1, 4\)\]"):
        _site()._checked(out, h, None)


def test_the_cause_in_an_engine_process_is_read_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "speed-candidate.log"
    log.write_text(
        "(EngineCore pid=7) ERROR 12-01 [core.py:1] EngineCore encountered a fatal error.\n"
        "(EngineCore pid=7) Traceback (most recent call last):\n"
        '(EngineCore pid=7)   File "route_sites.py", line 132, in _checked\n'
        "(EngineCore pid=7) RuntimeError: qgate fused_hc_fp16 implementation returned dtypes "
        "['float32', 'float32'] for (h, block input), expected float16 (the input's)\n"
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace\n"
    )
    assert cause_in_log(log) == (
        "RuntimeError: qgate fused_hc_fp16 implementation returned dtypes ['float32', 'float32'] for "
        "(h, block input), expected float16 (the input's) (in EngineCore)"
    )
    assert cause_in_log(tmp_path / "missing.log") is None


def test_the_report_says_which_routes_hits_went_to_an_override() -> None:
    from qgate.routes import ran_gates

    counts = {"hits": 12, "fallbacks": {}, "roles": {"mix": 12}}
    env = {"VLLM_SM70_QWEN38_FUSED_HC_FP16": "1"}
    plain = ran_gates({"env": env, "routes": {"fused_hc_fp16": counts}})
    assert plain[0].passed and "override" not in plain[0].detail
    env["QGATE_ROUTE_IMPL_FUSED_HC_FP16"] = "my_hc:mix"
    (gate,) = ran_gates({"env": env, "routes": {"fused_hc_fp16": counts}})
    assert (
        gate.passed and "every hit ran the override QGATE_ROUTE_IMPL_FUSED_HC_FP16=my_hc:mix" in gate.detail
    )
