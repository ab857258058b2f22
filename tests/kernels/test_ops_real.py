"""Real-weight operator bounds without vLLM: the synthetic production-shape checkpoint read and sliced
for TP 1 and 4 as vLLM shards it, `qgate run ops --real` on it, and bad model directories (one line,
exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from qgate.cli.ops import app
from qgate.ops.synthetic import write_synthetic_checkpoint
from qgate.ops.weights import Checkpoint, routed_weights
from qgate.tiny.qwen4exp import ensure_tiny_qwen4exp
from qgate_route_env import GEMV_DEFAULT_ROLES

REPO = Path(__file__).resolve().parents[2]
CONTRACT = str(REPO / "contracts" / "qwen4exp-cpu.yaml")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("syn") / "model")


def _by_name(ck: Checkpoint, tp: int, rank: int) -> dict[str, tuple[torch.Tensor, ...]]:
    return {s.name: s.tensors for s in routed_weights(ck, tp, rank, "fp16")}


def test_every_routed_tensor_is_read_and_sliced_as_vllm_shards_it(synthetic: Path) -> None:
    ck = Checkpoint(synthetic)
    full = _by_name(ck, 1, 0)
    ranks = [_by_name(ck, 4, r) for r in range(4)]
    # TP=4 per-GPU shapes: vLLM's SM90 plan table for this model
    r0 = ranks[0]
    assert r0["model.layers.0.linear_attn.in_proj_qkvz+in_proj_ba"][0].shape == (4096, 2560)
    assert r0["model.layers.0.linear_attn.in_proj_qkvz+in_proj_ba"][1].shape == (24, 2560)
    assert r0["model.layers.0.linear_attn.out_proj"][0].shape == (2560, 1536)
    assert r0["model.layers.1.self_attn.qkv_proj"][0].shape == (4224, 2560)
    assert r0["model.layers.1.self_attn.o_proj"][0].shape == (2560, 1536)
    assert r0["model.layers.1.mlp.shared_expert.gate_up_proj"][0].shape == (320, 2560)
    assert r0["model.hyper_connection_mixer"][1].shape == (320, 10240)
    assert set(full) == set(r0) and len(full) == 18  # 2 layers: every routed site, no expert
    raw = load_file(str(synthetic / "model.safetensors"))
    m = "model.language_model.layers"

    def cat(name: str, i: int, dim: int = 0, rows: slice = slice(None)) -> torch.Tensor:
        return torch.cat([r[name][i][rows] for r in ranks], dim=dim)

    # row-parallel: K split; column-parallel: each packed part's rows split, then concatenated per rank
    assert torch.equal(
        cat("model.layers.0.linear_attn.out_proj", 0, dim=1), raw[f"{m}.0.linear_attn.out_proj.weight"]
    )
    gu = "model.layers.0.mlp.shared_expert.gate_up_proj"
    assert torch.equal(cat(gu, 0, rows=slice(0, 160)), raw[f"{m}.0.mlp.shared_expert.gate_proj.weight"])
    assert torch.equal(cat(gu, 0, rows=slice(160, 320)), raw[f"{m}.0.mlp.shared_expert.up_proj.weight"])
    gdn = "model.layers.0.linear_attn.in_proj_qkvz+in_proj_ba"
    qkv = raw[f"{m}.0.linear_attn.in_proj_qkv.weight"]  # [q 2048 | k 2048 | v 6144]
    assert torch.equal(cat(gdn, 0, rows=slice(0, 512)), qkv[:2048])
    assert torch.equal(cat(gdn, 0, rows=slice(1024, 2560)), qkv[4096:])
    assert torch.equal(cat(gdn, 0, rows=slice(2560, 4096)), raw[f"{m}.0.linear_attn.in_proj_z.weight"])
    assert torch.equal(cat(gdn, 1, rows=slice(0, 12)), raw[f"{m}.0.linear_attn.in_proj_b.weight"])
    # QKV: Q + gate split, the 2 KV heads replicated (ranks 0, 1: head 0; 2, 3: head 1), indexer replicated
    q = "model.layers.1.self_attn.qkv_proj"
    k_full = raw[f"{m}.1.self_attn.k_proj.weight"]
    assert torch.equal(cat(q, 0, rows=slice(0, 3072)), raw[f"{m}.1.self_attn.q_proj.weight"])
    for r in range(4):
        assert torch.equal(ranks[r][q][0][3072:3328], k_full[(r // 2) * 256 : (r // 2 + 1) * 256])
        assert torch.equal(ranks[r][q][0][3584:], raw[f"{m}.1.self_attn.indexer.index_qk_proj.weight"])
        assert torch.equal(ranks[r]["model.layers.0.mlp.gate"][0], raw[f"{m}.0.mlp.gate.weight"])
    assert torch.equal(cat("lm_head", 0), raw["lm_head.weight"])
    # HC: down + inject + zero pad rows, as vLLM merges them
    down = full["model.layers.0.attn_hyper_connection"][1]
    assert torch.equal(down[:320], raw[f"{m}.0.attn_hyper_connection.input_mix_weight_down.weight"])
    assert torch.equal(down[320:324], raw[f"{m}.0.attn_hyper_connection.block_inject_weight.weight"])
    assert not down[324:].any()


def test_run_ops_real_screens_every_rank_of_the_synthetic_checkpoint(synthetic: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "-c", CONTRACT, "-o", str(out), "--real", "--model", str(synthetic), "--tp", "4"]
    res = CliRunner().invoke(app, [*args, "--trials", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    record = json.loads((out / "ops" / "real.json").read_text())
    assert record["kind"] == "ops_real" and record["tp"] == 4 and record["passed"]
    assert {s["rank"] for s in record["sites"]} == {0, 1, 2, 3} and len(record["sites"]) == 4 * 18
    roles = {r["role"]: r for r in record["roles"]}
    assert set(roles) == {
        "out_proj", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "gate", "shared_expert_gate",
        "lm_head", "in_proj_qkvz+in_proj_ba", "attn", "moe", "final",
    }  # fmt: skip
    assert (
        roles["qkv_proj"]["calls"] == 4
        and roles["attn"]["calls"] == 8
        and roles["qkv_proj"]["inputs"] == "random"
    )
    assert "| fp16_gemv | qkv_proj | 4 | random | " in (out / "ops" / "real.md").read_text()


def _bad_copy(tmp_path: Path, edit: str) -> Path:
    try:
        src = ensure_tiny_qwen4exp()
    except Exception as exc:  # noqa: BLE001  (the H200 image: transformers 5.17 has no `indexed_attention`)
        if "indexed_attention" not in str(exc):
            raise
        pytest.skip(f"this transformers cannot build the tiny Qwen4Exp: {exc}")
    tensors = load_file(str(src / "model.safetensors"))
    name = "model.layers.0.linear_attn.out_proj.weight"
    if edit == "missing":
        del tensors[name]
    elif edit == "shape":
        tensors[name] = tensors[name][:, :-1].contiguous()
    elif edit == "dtype":
        tensors[name] = tensors[name].to(torch.uint8)
    elif edit == "bf16":  # every tensor stored in bf16 (how NVFP4 exports keep the unquantized ones)
        tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
    elif edit == "nan":
        tensors[name][3, 7] = float("nan")
    elif edit == "big":  # a bf16 value past fp16's 65504: the fp16 engine's cast makes it inf
        tensors[name] = tensors[name].to(torch.bfloat16)
        tensors[name][5, 2] = 1.0e5
    dst = tmp_path / edit
    dst.mkdir()
    if edit != "no_safetensors":
        save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("no_safetensors", "no *.safetensors file"),
        ("missing", "tensor model.layers.0.linear_attn.out_proj.weight is missing"),
        ("shape", "tensor model.layers.0.linear_attn.out_proj.weight: shape [128, 255], expected [128, 256]"),
        ("dtype", "tensor model.layers.0.linear_attn.out_proj.weight: dtype U8, the routes read F16, BF16"),
    ],
)
def test_a_bad_model_directory_is_one_line_naming_the_tensor(tmp_path: Path, edit: str, message: str) -> None:
    model = _bad_copy(tmp_path, edit)
    res = CliRunner().invoke(app, ["run", "-c", CONTRACT, "-o", str(tmp_path / "o"), "--model", str(model)])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert message in line


def test_a_bf16_stored_model_screens_with_an_fp16_engine_casts_reported(tmp_path: Path) -> None:
    model = _bad_copy(tmp_path, "bf16")
    out = tmp_path / "o"
    res = CliRunner().invoke(
        app, ["run", "-c", CONTRACT, "-o", str(out), "--model", str(model), "--trials", "2"]
    )
    assert res.exit_code == 0, res.output
    record = json.loads((out / "ops" / "real.json").read_text())
    assert (
        record["passed"] and record["dtype"] == "fp16" and record["hc_dtype"] == "fp16"
    )  # the fp16 CPU shim
    assert record["casts"] and all(c["stored"] == "BF16" and c["engine"] == "F16" for c in record["casts"])
    assert not record["weight_failures"] and {r["route"] for r in record["roles"]} == {
        "fp16_gemv", "fused_gdn_input_fp16", "fused_hc_fp16"
    }  # fmt: skip
    assert all(r["bound"]["outputs"] > 0 and r["bound"]["over_bound"] == 0 for r in record["roles"])
    assert "tensors cast to the engine dtype (BF16 -> F16)" in (out / "ops" / "real.md").read_text()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("nan", "FAIL tensor model.layers.0.linear_attn.out_proj.weight: 1 NaN; first at index [3, 7]"),
        (
            "big",
            "FAIL tensor model.layers.0.linear_attn.out_proj.weight: 1 overflow to inf in the cast "
            "BF16 -> F16; first at index [5, 2]",
        ),
    ],
)
def test_a_non_finite_routed_weight_fails_naming_the_tensor(tmp_path: Path, edit: str, message: str) -> None:
    model = _bad_copy(tmp_path, edit)
    out = tmp_path / "o"
    res = CliRunner().invoke(
        app, ["run", "-c", CONTRACT, "-o", str(out), "--model", str(model), "--trials", "1"]
    )
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and message in res.output
    record = json.loads((out / "ops" / "real.json").read_text())
    assert not record["passed"] and record["weight_failures"] == [message.removeprefix("FAIL ")]


def test_a_dtype_the_routes_op_does_not_take_on_the_device_is_one_line(
    synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dtypes come from the op's dispatch (qgate_kernels.dtypes); a device whose GEMV kernel took fp16
    only would refuse --dtype bf16 in one line, before anything is read."""
    import qgate.ops.real as real

    takes = {
        "fp16_gemv": ("fp16",),
        "fused_gdn_input_fp16": ("fp16", "bf16"),
        "fused_hc_fp16": ("fp16", "bf16"),
    }
    monkeypatch.setattr(real, "route_dtypes", lambda device: takes)
    # the synthetic checkpoint, not the contract's tiny Qwen4Exp: transformers builds that one only from 5.18
    args = ["run", "-c", CONTRACT, "-o", str(tmp_path / "o"), "--real", "--model", str(synthetic)]
    args += ["--dtype", "bf16", "--device", "cpu"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert "--dtype bf16: route fp16_gemv's op on cpu runs its kernel for fp16" in line
    bad = CliRunner().invoke(
        app,
        [
            "run",
            "-c",
            CONTRACT,
            "-o",
            str(tmp_path / "p"),
            "--real",
            "--model",
            str(synthetic),
            "--dtype",
            "fp32",
        ],
    )
    assert bad.exit_code == 2 and "'fp32' is not one of" in bad.output


def test_the_candidates_own_code_is_screened_on_the_real_weights(tmp_path: Path) -> None:
    """`qgate demo` on a contract without an ops section: the candidate's override runs in place of the
    kernel on the checkpoint's own weights (a sign-flipping GEMV FAILs where the kernels PASS), and what
    the screen did not run of its code is listed."""
    from qgate.contract import load_contract
    from qgate.ops.run import run_real_ops
    from qgate.shipped import faulty_routes_dir

    loaded = load_contract(Path(CONTRACT))
    cand, ctrl = loaded.contract.env_for("candidate"), loaded.contract.env_for("control")
    honest = run_real_ops(loaded, tmp_path / "h", device="cpu", trials=2, arm="candidate", control_env=ctrl)
    assert honest["passed"] and honest["arm"] == "candidate" and honest["overrides"] == {}
    assert honest["unseen"] == []
    faulty = cand | {
        "QGATE_ROUTE_IMPL_FP16_GEMV": "slow_routes:perturbed_gemv",
        "PYTHONPATH": str(faulty_routes_dir()),
    }
    record = run_real_ops(
        loaded, tmp_path / "f", device="cpu", trials=2, arm="candidate", env=faulty, control_env=ctrl
    )
    assert not record["passed"] and record["overrides"] == {"fp16_gemv": "slow_routes:perturbed_gemv"}
    failed = {r["role"] for r in record["roles"] if not r["passed"]}
    assert "lm_head" in failed and failed <= set(GEMV_DEFAULT_ROLES)
    assert (
        "its overrides ran (fp16_gemv: slow_routes:perturbed_gemv)"
        in (tmp_path / "f" / "ops" / "real.md").read_text()
    )
    unscreened = cand | {"VLLM_SM70_QWEN38_QSA_TOPK": "1"}  # a route the real screen has no site for
    spots = run_real_ops(
        loaded, tmp_path / "u", device="cpu", trials=1, arm="candidate", env=unscreened, control_env=ctrl
    )
    assert spots["unseen"] == [
        "route qsa_topk is switched on but the real-weight screen has no site for it: it was not screened"
    ]
    # without the fp16 HC shim vLLM keeps the HC parameters in bf16 and runs its own path: the screen
    # skips the HC site, and a candidate that switches HC on is told so, not passed
    data = yaml.safe_load(Path(CONTRACT).read_text())
    data["shims"] = [s for s in data["shims"] if s != "qwen4exp_fp16_cpu"]
    (tmp_path / "no-shim.yaml").write_text(yaml.safe_dump(data))
    no_shim = load_contract(tmp_path / "no-shim.yaml")
    skipped = run_real_ops(no_shim, tmp_path / "s", device="cpu", trials=1, arm="candidate")
    (line,) = skipped["unseen"]
    assert line.startswith("route fused_hc_fp16 is switched on but the real-weight screen did not run it: ")


def test_a_model_that_is_not_a_qwen4exp_is_one_line(tmp_path: Path) -> None:
    model = _bad_copy(tmp_path, "bf16")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"architectures": ["Qwen3ForCausalLM"]}))
    res = CliRunner().invoke(
        app, ["run", "-c", CONTRACT, "-o", str(tmp_path / "o"), "--real", "--model", str(model)]
    )
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert "architectures ['Qwen3ForCausalLM']: the real-weight screen reads Qwen4ExpForCausalLM" in line
