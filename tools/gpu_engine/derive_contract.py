"""derive_contract.py CONTRACT OUT TAG --set PATH=JSON [--set ...]

A contract derived from CONTRACT for one device session's next question, e.g. the candidate with the
QSA top-k route or without the lm_head route once the probe has pointed at it: each `--set` puts a JSON
value at a dotted key path (`arms.candidate.env.VLLM_SM70_QWEN38_QSA_TOPK="1"`,
`routes.fp16_gemv.roles=[...]`; keys made as needed), the name gets `-TAG` and the description says
what was derived from what. The result is read back by qgate's own loader (strict: an unknown key or a
bad value is one line naming it, exit 2, and OUT is not left behind), so a device call never starts an
engine on a contract qgate refuses.
Prints `ok: OUT NAME vVERSION sha256 ...`. A lab tool: what a derived contract shows goes back into
contracts/ by hand, with its figures (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    if not all(keys):
        raise ValueError(f"--set {path}: an empty key in the path")
    node = data
    for i, key in enumerate(keys[:-1]):
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise ValueError(f"--set {path}: {'.'.join(keys[: i + 1])} is not a mapping")
        node = nxt
    node[keys[-1]] = value


def derive(source: Path, out: Path, tag: str, sets: list[str]) -> str:
    """Write the derived contract to `out` and return qgate's `ok:` line; ValueError (one line) for
    anything qgate would refuse, with `out` removed."""
    from qgate.contract import load_contract
    from qgate.contract.strict_yaml import load_yaml
    from qgate.errors import QgateError

    if not tag.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"tag {tag!r}: letters, digits, - and _ only (it goes into the contract's name)")
    base = load_contract(source)  # the source must be a contract qgate takes
    data = load_yaml(source.read_text(encoding="utf-8"))
    done = []
    for item in sets:
        path, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected PATH=JSON")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--set {path}: {text!r} is not JSON ({exc.msg})") from None
        _set(data, path, value)
        done.append(f"{path}={json.dumps(value)}")
    data["name"] = f"{data['name']}-{tag}"
    why = f"derived from {source.name} (sha256 {base.sha256[:12]}) by " + "; ".join(done or ["nothing"])
    data["description"] = f"{data.get('description', '')} [{why}]".strip()
    out.write_text(
        f"# {why}: tools/gpu_engine/derive_contract.py\n" + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )
    try:
        loaded = load_contract(out)
    except QgateError as exc:
        out.unlink(missing_ok=True)
        raise ValueError(str(exc)) from None
    c = loaded.contract
    return f"ok: {out} {c.name} v{c.version} sha256 {loaded.sha256}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("contract", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("tag")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=JSON")
    a = ap.parse_args()
    from qgate.errors import QgateError

    try:
        print(derive(a.contract, a.out, a.tag, a.sets))
    except (ValueError, QgateError) as exc:
        print(f"derive_contract: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
