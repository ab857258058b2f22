"""Route sites: the built-in Qwen4Exp sites against the installed vLLM, sites a contract names, the
pre-flight check and the engine-start refusal of a missing site, and the production contracts' route
sets against vLLM's own Qwen4Exp classes (without the checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import qgate_route_env as route_env
from qgate import routes
from qgate.contract import ContractError, load_contract
from qgate.engine import preflight

pytest.importorskip("vllm")
sites = pytest.importorskip("qgate_kernels.sites")

SITED = {"fused_hc_fp16", "fused_gdn_input_fp16", "qsa_topk"}
HC_MIX = "vllm.models.qwen4_exp.nvidia.hyperconnection:GatedResidual.mix"


def test_harness_and_plugin_know_the_same_sites_and_shims() -> None:
    from qgate_kernels import shims

    assert tuple(sites.DEFAULT_SITES) == route_env.SITE_KEYS
    assert tuple(shims.SHIMS) == route_env.SHIMS


def test_builtin_sites_are_in_the_installed_vllm() -> None:
    assert sites.problems({}, SITED) == []


@pytest.mark.parametrize(
    ("named", "message"),
    [
        ({"fused_hc_fp16.mix": HC_MIX + "x"}, "hyperconnection.GatedResidual' has no attribute 'mixx'"),
        ({"fused_hc_fp16.mix": HC_MIX.replace(":Gated", ":XGated")}, "no attribute 'XGatedResidual'"),
        ({"fused_hc_fp16.mix": "no_such_pkg.mod:C.mix"}, "cannot import 'no_such_pkg.mod'"),
        ({"fused_hc_fp16.mixx": HC_MIX}, "site 'fused_hc_fp16.mixx': unknown"),
        ({"qsa_topk.topk": "vllm:a.b.c"}, "expected 'module:Class.method' or 'module:function'"),
    ],
)  # fmt: skip
def test_a_bad_site_is_one_line(named: dict, message: str) -> None:
    (problem,) = sites.problems({sites.SITES_ENV: json.dumps(named)}, SITED)
    assert message in problem and "\n" not in problem


def test_a_named_site_replaces_the_builtin_one() -> None:
    spec = "vllm.models.qwen4_exp.common.hyperconnection:GatedResidual.mix"  # another class, same name
    got = sites.sites_in({sites.SITES_ENV: json.dumps({"fused_hc_fp16.mix": spec})})
    assert got["fused_hc_fp16.mix"] == spec and got["fused_hc_fp16.combine_and_mix"].endswith(
        "combine_and_mix"
    )
    assert sites.problems({sites.SITES_ENV: json.dumps({"fused_hc_fp16.mix": spec})}, SITED) == []


def test_contract_sites_and_shims_reach_both_arms_and_are_checked(tmp_path: Path) -> None:
    base = (REPO / "contracts" / "qwen4exp-cpu.yaml").read_text()
    good = tmp_path / "good.yaml"
    good.write_text(
        base
        + "sites:\n  fused_hc_fp16.mix: 'vllm.models.qwen4_exp.common.hyperconnection:GatedResidual.mix'\n"
    )
    c = load_contract(good).contract
    for arm in ("control", "candidate"):
        env = c.env_for(arm)
        assert env["QGATE_SHIMS"] == "qwen2vl_pil_image_processor,qwen4exp_hc_torch_cpu,qwen4exp_fp16_cpu"
        assert json.loads(env["QGATE_SITES"]) == {"fused_hc_fp16.mix": c.sites["fused_hc_fp16.mix"]}
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "sites:\n  fused_hc_fp16.mixx: 'a:b'\n")
    with pytest.raises(ContractError, match=r"sites\.fused_hc_fp16\.mixx: not a known site"):
        load_contract(bad)
    bad.write_text(base.replace("qwen4exp_fp16_cpu]", "qwen4exp_fp16_cpux]"))
    with pytest.raises(ContractError, match="'qwen4exp_fp16_cpux' is not a known shim"):
        load_contract(bad)


def test_preflight_refuses_a_missing_site_in_one_line() -> None:
    env = {
        "VLLM_SM70_QWEN38_FUSED_HC_FP16": "1",
        sites.SITES_ENV: json.dumps({"fused_hc_fp16.mix": HC_MIX + "x"}),
    }
    with pytest.raises(routes.RouteError, match="GatedResidual' has no attribute 'mixx'") as err:
        preflight.check_overrides(env)
    assert "\n" not in str(err.value)


PLUGIN_MISSING_SITE = """
import json
from qgate_kernels import plugin
plugin.register()
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
try:
    DefaultModelLoader.load_model(object(), None, None)
    print(json.dumps({"raised": None}))
except RuntimeError as exc:
    print(json.dumps({"raised": str(exc)}))
"""


def test_a_site_missing_from_vllm_fails_the_engine_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_SM70_", "QGATE_"))}
    env |= {
        "VLLM_SM70_QWEN38_QSA_TOPK": "1",
        sites.SITES_ENV: json.dumps(
            {"qsa_topk.topk": "vllm.models.qwen4_exp.nvidia.ops.qsa_indexer:_topk_v2"}
        ),
        "QGATE_ATTEST_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PLUGIN_MISSING_SITE], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raised = json.loads(proc.stdout.strip().splitlines()[-1])["raised"]
    assert raised == (
        "qgate routes: site qsa_topk.topk = 'vllm.models.qwen4_exp.nvidia.ops.qsa_indexer:_topk_v2': "
        "'vllm.models.qwen4_exp.nvidia.ops.qsa_indexer' has no attribute '_topk_v2'"
    )
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["errors"] and "_topk_v2" in record["errors"][0]


MODEL_WIRING = """
import importlib.util, inspect, json
from qgate_kernels import shims, sites
torchvision = importlib.util.find_spec("torchvision") is not None
applied = shims.apply(["qwen2vl_pil_image_processor"])  # vLLM's Qwen4Exp module imports qwen3_vl
import vllm.model_executor.models.qwen3_vl as q3vl
import vllm.models.qwen4_exp.nvidia.model as m
import vllm.models.qwen4_exp.nvidia.hyperconnection as hcm
import vllm.models.qwen4_exp.nvidia.qsa as qsa
import vllm.models.qwen4_exp.nvidia.indexer_qsa as iq
import vllm.models.qwen4_exp.nvidia.ops.qsa_indexer as qi
import vllm.model_executor.models.qwen3_next as q3n
import vllm.model_executor.models.qwen2_moe as q2moe
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as gdn
import re
own = lambda key: sites.resolve(key, sites.DEFAULT_SITES[key])[0]
layer_src = inspect.getsource(m.Qwen4ExpDecoderLayer.__init__)
model_src = inspect.getsource(m.Qwen4ExpModel.__init__)
hc_src = inspect.getsource(hcm.GatedResidual.__init__)
fwd_src = inspect.getsource(m.Qwen4ExpDecoderLayer.forward) + inspect.getsource(m.Qwen4ExpModel.forward)
print(json.dumps({
    "torchvision": torchvision,
    "pil_alias_applied": bool(applied["qwen2vl_pil_image_processor"]),
    "qwen3_vl_image_processor": q3vl.Qwen2VLImageProcessor.__name__,
    "fused_hc_fp16": m.GatedResidual is own("fused_hc_fp16.mix") is own("fused_hc_fp16.combine_and_mix")
        and "GatedResidual(" in layer_src and "use_combine=False" in model_src
        and ".mix(" in fwd_src and ".combine_and_mix(" in fwd_src,
    "hc_projections_unquantized": hc_src.count("quant_config=None") == 3,
    "fused_gdn_input_fp16": issubclass(m.QwenGatedDeltaNetAttention, own("fused_gdn_input_fp16.forward_cpu"))
        and "gqa_interleaved_layout=False" in layer_src,
    "qsa_topk": own("qsa_topk.topk") is qi and "QSAIndexer(" in inspect.getsource(qsa)
        and "qsa_select_paged_decode" in inspect.getsource(iq)
        and "_topk" in qi.qsa_select_paged_decode.__code__.co_names
        and "_topk" in qi.qsa_select_paged_prefill.__code__.co_names,
    "fp16_gemv": "ParallelLMHead(" in inspect.getsource(m.Qwen4ExpForCausalLM.__init__),
    # the last names of the modules vLLM's Qwen4Exp classes build (prefix=f"{prefix}.<name>")
    "module_names": sorted(
        set(re.findall(r'prefix[}][.]([a-z_]+)"', "".join(map(inspect.getsource, (m, qsa, iq, q3n, q2moe,
                                                                                  gdn)))))
        | set(re.findall(r'maybe_prefix[(]prefix, "([a-z_]+)"[)]', inspect.getsource(m)))
    ),
}))
"""


@pytest.fixture(scope="module")
def qwen4exp_wiring() -> dict:
    proc = subprocess.run([sys.executable, "-c", MODEL_WIRING], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["qwen38-sm70-tp4-decode.yaml", "qwen38-sm70-tp4-quality.yaml"])
def test_production_route_set_has_a_site_in_vllms_qwen4exp(name: str, qwen4exp_wiring: dict) -> None:
    """Every route the production candidate switches on has its site in the installed vLLM, and vLLM's
    Qwen4Exp model builds and calls that site: compare can no longer ERROR for lack of a site class.
    (Whether a projection is NVFP4-quantized, and so not taken, is the checkpoint's: see docs/routes.md.)"""
    c = load_contract(REPO / "contracts" / name).contract
    on = routes.switched_on(c.env_for("candidate"))
    assert on == {"fp16_gemv", "fused_hc_fp16", "fused_gdn_input_fp16", "qsa_topk"}
    assert not routes.switched_on(c.env_for("control"))
    assert sites.problems(c.env_for("candidate"), on) == []
    assert {route: qwen4exp_wiring[route] for route in on} == dict.fromkeys(on, True)
    assert qwen4exp_wiring["hc_projections_unquantized"]  # GEMV / HC can take them in an NVFP4 model
    # every GEMV role the contract lists is a module vLLM's Qwen4Exp builds (its engine start would fail)
    listed = routes.listed_roles(c.env_for("candidate"))["fp16_gemv"]
    assert set(listed) <= set(qwen4exp_wiring["module_names"]), qwen4exp_wiring["module_names"]


def test_pil_alias_lets_qwen3_vl_import_without_torchvision(qwen4exp_wiring: dict) -> None:
    """The probe above imports vLLM's qwen3_vl (Qwen4Exp's module imports it) after the shim: without
    torchvision, vLLM's Qwen3-VL takes transformers' PIL image processor (tests/plugin/test_shims.py
    has the shim's own tests)."""
    if qwen4exp_wiring["torchvision"]:
        pytest.skip("torchvision is installed here: the shim is not needed")
    assert qwen4exp_wiring["pil_alias_applied"]
    assert qwen4exp_wiring["qwen3_vl_image_processor"] == "Qwen2VLImageProcessorPil"
