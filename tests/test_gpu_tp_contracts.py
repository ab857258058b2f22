"""The tensor parallel contracts of the production shapes (contracts/qwen38-prodshape-{bf16,fp16}-tp{2,4}
.yaml, issue 62, run by tools/gpu_engine/calls with TP=2|4): each is its dtype's TP 1 contract (the same
checkpoint, workload, routes, shims and engine-side requirements) with the engine split over N ranks on
one host and the all-reduce kept off NVLink multicast, and nothing else; and the checkpoint's shapes
split evenly at that size, as vLLM requires. Fast: no engine (`qgate contract validate` of every shipped
contract is tests/test_contract_cli.py's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qgate.contract import load_contract
from qgate.ops.synthetic import engine_config

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts"
CASES = [(dt, tp) for dt in ("bf16", "fp16") for tp in (2, 4)]
# both arms alike: vLLM's custom all-reduce (NCCL past its size), never the paths through NVLink multicast
ALL_REDUCE = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}


def _tp1(dtype: str) -> Path:
    """The TP 1 production-shape contract of the dtype, whatever card its name carries."""
    named = CONTRACTS.glob(f"qwen38-prodshape-{dtype}*.yaml")
    found = [p for p in named if not re.search(r"-tp\d+\.", p.name)]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("dtype", "tp"), CASES, ids=[f"{d}-tp{t}" for d, t in CASES])
def test_a_tp_contract_is_its_tp1_contract_split_over_n_ranks(dtype: str, tp: int) -> None:
    path = CONTRACTS / f"qwen38-prodshape-{dtype}-tp{tp}.yaml"
    split = load_contract(path).contract
    assert split.name == path.stem
    assert split.engine.tensor_parallel_size == tp
    assert split.engine.distributed_executor_backend == "mp"  # vLLM's own pick on one host; Ray never
    for arm in ("control", "candidate"):
        assert {k: split.env_for(arm)[k] for k in ALL_REDUCE} == ALL_REDUCE
        assert split.engine_for(arm)["tensor_parallel_size"] == tp
    got, base = split.model_dump(mode="json"), load_contract(_tp1(dtype)).contract.model_dump(mode="json")
    for data in (got, base):
        for key in ("name", "description", "version"):
            data.pop(key)
    base["engine"] |= {"tensor_parallel_size": tp, "distributed_executor_backend": "mp"}
    for arm in ("control", "candidate"):
        base["arms"][arm]["env"] |= ALL_REDUCE
    assert got == base  # the model, the workload, the routes, the shims, the gates: the TP 1 contract's


@pytest.mark.parametrize("tp", [2, 4])
def test_the_checkpoint_splits_evenly_over_the_ranks(tp: int) -> None:
    cfg = engine_config(48)  # what `qgate model prod-shape` writes (tools/gpu_engine/calls/10-install.sh)
    for key in (
        "vocab_size",  # lm_head: 124,160 rows a rank at TP 2, 62,080 at TP 4
        "num_attention_heads",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "indexer_n_heads",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
    ):
        assert cfg[key] % tp == 0, key
    kv = cfg["num_key_value_heads"]  # 2: split at TP 2, replicated in pairs at TP 4 (vLLM's rule)
    assert kv % tp == 0 or tp % kv == 0
    assert cfg["vocab_size"] // 4 == 62_080  # the op bench's TP 4 lm_head (kernels_ext/BENCH.md)
