"""summarize.py RUN_DIR...: a few lines per qgate run folder for a device call's log (the tool brings
back the log whole; the run folders come back packed): the verdict and its reasons, each arm's decode
figures, and each arm's route counts as the result records them (every key the attestation wrote:
hits, and under CUDA graphs the captures and replays; at TP > 1 each rank's hits). Reads files only;
prints what it finds and says what it does not."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"  {path}: not read ({type(exc).__name__})")
        return None


def _routes(result: dict) -> str:
    parts = []
    for route, c in sorted((result.get("routes") or {}).items()):
        if not isinstance(c, dict):
            continue
        nums = {k: v for k, v in c.items() if isinstance(v, int) and v}
        # under CUDA graphs: captures / replayed / captured_fallbacks per role, summed here
        nums |= {
            k: sum(int(n) for n in v.values())
            for k, v in c.items()
            if isinstance(v, dict) and k not in ("roles", "fallbacks", "sites", "ranks") and v
        }
        falls = sum(int(n) for n in (c.get("fallbacks") or {}).values())
        if nums or falls:
            roles = ",".join(f"{r}={n}" for r, n in sorted((c.get("roles") or {}).items()))
            # at TP > 1 each worker's own hits (qgate.routes: every rank must show them)
            per_rank = sorted((c.get("ranks") or {}).items())
            ranks = ",".join(f"{r}={v.get('hits')}" for r, v in per_rank if isinstance(v, dict))
            ranks = f" ranks[{ranks}]" if ranks else ""
            parts.append(f"{route} {nums} fallbacks={falls} roles[{roles}]{ranks}")
    return "; ".join(parts) or "no route counts"


def summarize(run: Path) -> None:
    print(f"--- {run}")
    for kind in ("speed", "quality"):
        for arm_file in sorted((run / kind).glob("*.json")) if (run / kind).is_dir() else []:
            r = _load(arm_file)
            if r is None:
                continue
            reps = [x for x in r.get("reps", []) if isinstance(x, dict)]
            dec = [x.get("decode_tok_s") for x in reps if x.get("decode_tok_s") is not None]
            fig = f"decode tok/s {min(dec):.1f}..{max(dec):.1f} over {len(dec)} reps" if dec else ""
            print(f"  {kind}/{arm_file.name}: complete={r.get('complete')} {fig}")
            print(f"    routes: {_routes(r)}")
    for sub in ("compare", "report-speed", "report-quality"):
        v = run / sub / "verdict.json"
        if v.exists() and (rec := _load(v)) is not None:
            figs = rec.get("figures") or {}
            print(f"  {sub}: verdict {rec.get('verdict')}; change {figs.get('throughput_change_pct')} %")
            for reason in (rec.get("reasons") or [])[:6]:
                print(f"    - {reason}")
    for name in ("summary.json", "ablation.json"):
        if (run / name).exists() and (rec := _load(run / name)) is not None:
            print(f"  {name}: verdict/status {rec.get('verdict') or rec.get('status')}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        summarize(Path(arg))
