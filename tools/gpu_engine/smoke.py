"""Tiny generation check of vLLM 0.32.0 from the payload: one engine start, greedy tokens, one RESULT line.

    source STAGE_DIR/env.sh
    python3 smoke.py MODEL_DIR [--dtype bfloat16|float16|auto] [--eager] [--gdn-prefill-backend triton]
                     [--max-tokens 256] [--kv-cache-gib 1] [--capture 1,2,4] [--json PATH]

MODEL_DIR is a local model folder (config, tokenizer, safetensors); nothing is downloaded.
Without --eager: enforce_eager=False (vLLM's default compilation and CUDA graphs, capture sizes --capture).
For Qwen4Exp vLLM 0.32 does not torch.compile: it turns on breakable CUDA graphs and compilation mode NONE;
the DECIDED line records what it chose. Defaults follow the device run:
- dtype bfloat16: stock Qwen4Exp keeps its HyperConnection parameters in bf16, so float16 fails in
  `_down_and_inject` (Half != BFloat16) unless a plugin puts them in the model dtype (see README).
- gdn_prefill_backend triton: on SM90 'auto' picks FlashInfer, which the payload does not carry. Pass
  --gdn-prefill-backend none to leave vLLM's choice (models without GDN layers).
Prints `DECIDED {json}` and `RESULT {json}`; also writes the result to --json, or to
$OUT/smoke_<mode>_<dtype>.json when OUT is set. Exit 0 on success.
"""

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eager", action="store_true", help="enforce_eager=True")
    ap.add_argument("--gdn-prefill-backend", default="triton")
    ap.add_argument("--max-tokens", type=int, default=256, help="length of the single-sequence decode")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0)
    ap.add_argument("--capture", default="1,2,4", help="CUDA graph capture sizes (not with --eager)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    mode = "eager" if a.eager else "compiled"

    t0 = time.time()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t_import = time.time() - t0
    kw = dict(
        model=a.model,
        dtype=a.dtype,
        seed=0,
        max_model_len=a.max_model_len,
        max_num_seqs=4,
        max_num_batched_tokens=a.max_model_len,
        kv_cache_memory_bytes=int(a.kv_cache_gib * (1 << 30)),
        enable_prefix_caching=True,
        disable_log_stats=False,
        enforce_eager=a.eager,
    )
    if a.gdn_prefill_backend != "none":
        kw["gdn_prefill_backend"] = a.gdn_prefill_backend
    if not a.eager:
        kw["compilation_config"] = {"cudagraph_capture_sizes": [int(x) for x in a.capture.split(",") if x]}
    t1 = time.time()
    llm = LLM(**kw)
    t_start = time.time() - t1
    try:
        cc = llm.llm_engine.vllm_config.compilation_config
        decided = {
            "compilation_mode": str(getattr(cc, "mode", None)),
            "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
            "cudagraph_capture_sizes": list(getattr(cc, "cudagraph_capture_sizes", None) or []),
        }
    except Exception as exc:  # information only
        decided = {"error": repr(exc)}
    decided["VLLM_USE_BREAKABLE_CUDAGRAPH"] = os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH")
    print("DECIDED", json.dumps(decided), flush=True)

    prompts = ["The quick brown fox", "1 2 3 4 5", "Hello, my name is", "GPU engine smoke test"]
    t2 = time.time()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    t_gen = time.time() - t2
    t3 = time.time()
    (one,) = llm.generate(
        [prompts[0]], SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    )
    t_dec = time.time() - t3
    n = len(one.outputs[0].token_ids)
    decode = None
    m = one.metrics  # vLLM's own timestamps: decode rate without prefill and scheduling start-up
    if m is not None and getattr(m, "last_token_ts", None) and getattr(m, "first_token_ts", None):
        span = m.last_token_ts - m.first_token_ts
        decode = round((n - 1) / span, 1) if span > 0 else None
    res = dict(
        mode=mode,
        dtype=a.dtype,
        model=os.path.basename(os.path.normpath(a.model)),
        torch=torch.__version__,
        vllm=vllm.__version__,
        device=torch.cuda.get_device_name(0),
        import_s=round(t_import, 1),
        engine_start_s=round(t_start, 1),
        gen_4x32_s=round(t_gen, 2),
        one_seq_wall_tok_per_s=round(n / t_dec, 1),
        one_seq_decode_tok_per_s=decode,
        decided=decided,
        token_ids=[list(o.outputs[0].token_ids) for o in outs],
    )
    print("RESULT", json.dumps(res), flush=True)
    path = a.json or (
        os.path.join(os.environ["OUT"], f"smoke_{mode}_{a.dtype}.json") if os.environ.get("OUT") else None
    )
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
