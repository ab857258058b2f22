"""Compact summary of topk_bench outputs (tools/topk_r3_run.sh): per file, the medians of one
implementation by shape and input kind (every version is timed twice), and the phase means by kind.

Usage: python3 kernels_ext/tools/topk_summary.py [--impl push1024x8pdl] time FILE... | phases FILE...
"""

from __future__ import annotations

import re
import sys


def timing(path: str, impl: str) -> None:
    cur, rows = "", {}
    for line in open(path, errors="replace"):
        m = re.match(r"time (\d+ x \d+) k=\d+, ([^:]+):", line)
        if m:
            cur = f"{m.group(1).replace(' ', '')} {m.group(2)[:10]}"
            continue
        m = re.match(rf"\s+{impl}\s+median\s+([\d.]+) us", line)
        if m and cur:
            rows.setdefault(cur, []).append(m.group(1))
    print(f"{path.rsplit('/', 1)[-1]:10} " + "; ".join(f"{k} {'/'.join(v)}" for k, v in rows.items()))


def phases(path: str) -> None:
    kinds, table, cur = [], {}, None
    for line in open(path, errors="replace"):
        m = re.match(r"phases on (\d+) x \d+, k = \d+, (.+) \(", line)
        if m:
            cur = f"{m.group(1)}r {m.group(2)[:8]}"
            kinds.append(cur)
            continue
        m = re.match(r"phases \S+: .*kernel span ([\d.]+) us", line)
        if m and cur:
            table.setdefault("span", {})[cur] = m.group(1)
            continue
        m = re.match(r"\s{2}(\S.*?)\s+mean\s+([\d.]+)", line)
        if m and cur and "spread" not in line:
            table.setdefault(m.group(1), {})[cur] = m.group(2)
    print(f"== {path.rsplit('/', 1)[-1]}: " + " | ".join(kinds))
    for label, vals in table.items():
        print(f"  {label[:20]:20} " + " ".join(f"{vals.get(k, '-'):>6}" for k in kinds))


def main() -> int:
    args = sys.argv[1:]
    impl = "push1024x8pdl"
    if args[:1] == ["--impl"]:
        impl, args = args[1], args[2:]
    mode, files = args[0], args[1:]
    for f in files:
        try:
            timing(f, impl) if mode == "time" else phases(f)
        except OSError as e:
            print(f, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
