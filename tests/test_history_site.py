"""`qgate history publish`: the static site of a seeded history (tests/history_seed.py: 2 contracts x
2 runners, 30 days each, a FAIL night, a drift, a lost night, a runner change, appended through the real
path), checked as files and then as a person sees it in headless Chromium (tests/site_browser.py): the
FAIL flagged, the band drawn, links that open, no console error, no network request, the front page
loaded in under a second. Screenshots go to the test's tmp folder (printed). Without a browser the
browser test skips, or fails when QGATE_REQUIRE_BROWSER=1 (.ci/run).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from history_seed import DRIFT_NIGHT, FAIL_NIGHT, LOST_NIGHT, seed_store, support
from typer.testing import CliRunner

from qgate import comparable, history
from qgate.cli.history import app
from qgate.history_view import build_series
from qgate.report.site import render_site

runner = CliRunner()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("history-site")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(comparable, "routes", support.standin_routes())
        seeded = seed_store(root)
    out = root / "site"
    args = [
        "publish",
        "--store",
        str(seeded["store"]),
        "--out",
        str(out),
        "--entry",
        "alpha",
        "--entry",
        "beta",
    ]
    done = runner.invoke(app, [*args, "--contracts", str(seeded["contracts"])])
    assert done.exit_code == 0, done.output
    return {**seeded, "out": out, "output": done.output, "root": root}


def _pages(out: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(out.glob("*.html"))}


def _series_page(pages: dict[str, str], runner_host: str, contract: str = "alpha") -> str:
    found = [n for n, t in pages.items() if n.startswith(contract) and f"runner {runner_host}" in t]
    assert len(found) == 1, (runner_host, list(pages))
    return found[0]


def test_the_site_holds_every_series_escaped_and_offline(site: dict[str, Any]) -> None:
    assert "4 contract x runner series, 59 nights, 5 pages" in site["output"]
    assert site["verdicts"]["alpha"].count("FAIL") == 1 and len(site["verdicts"]["alpha"]) == 29
    pages = _pages(site["out"])
    assert len(pages) == 5
    for name, text in pages.items():
        # The contract's name is shown as text: never markup, in the pages or in the plots.
        assert "<script" not in text.lower(), name
        assert not re.search(r"""\s(src|srcset|href)=["'](?!#|[\w.-]+\.html)|@import|url\(""", text), name
        assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= {"http://www.w3.org/2000/svg"}, name
    index = pages["index.html"]
    assert index.count('<tr class="series') == 4
    assert "alpha &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in index
    bench2 = pages[_series_page(pages, "bench-2")]
    assert 'class="night flag-fail"' in bench2 and f'id="n-{FAIL_NIGHT}"' in bench2
    assert bench2.count('class="flag-fail"') == 2  # the stripe in the ratio and the quality plot
    bench1 = pages[_series_page(pages, "bench-1")]
    assert f"No record (a lost night or no run) on 1 day(s): {LOST_NIGHT}" in bench1
    assert f'<a href="#n-{DRIFT_NIGHT}">{DRIFT_NIGHT}</a> (drift)' in bench1
    assert "5 % (floor 0.950)" in bench1  # the contract's margin, found by its sha256


def test_bad_store_is_one_line_exit_2(tmp_path: Path) -> None:
    done = runner.invoke(
        app, ["publish", "--store", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "o")]
    )
    assert done.exit_code == 2 and "no such history store" in done.output
    assert "Traceback" not in done.output


def test_a_person_sees_the_fail_the_band_and_working_links(site: dict[str, Any]) -> None:
    from site_browser import Unavailable, browser, console_errors, load_ms, requests, screenshot

    shots = site["root"] / "screenshots"
    try:
        ctx = browser()
        driver = ctx.__enter__()
    except Unavailable as exc:
        if os.environ.get("QGATE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"QGATE_REQUIRE_BROWSER=1 and no browser: {exc}")
        pytest.skip(f"no browser: {exc}")
    try:
        from selenium.webdriver.common.by import By

        index = (site["out"] / "index.html").resolve()
        driver.get("about:blank")  # the renderer started: what is timed is the page, not the browser
        driver.get(index.as_uri())
        assert load_ms(driver) < 1000, load_ms(driver)  # navigation start to the end of load
        assert driver.title == "qgate nightly history"
        rows = driver.find_elements(By.CSS_SELECTOR, "table.index tr.series")
        assert len(rows) == 4
        assert driver.execute_script("return document.scripts.length") == 0
        assert any("alpha <script>alert('x')</script> & co" in r.text for r in rows)  # shown as text
        bench2 = next(r for r in rows if "bench-2" in r.text and "alpha" in r.text)
        flag = bench2.find_element(By.CSS_SELECTOR, "span.flag")
        assert flag.is_displayed() and flag.text == "1 FAIL/ERROR"
        screenshot(driver, shots / "index.png")

        bench2.find_element(By.CSS_SELECTOR, "td a").click()  # the series' page opens
        assert driver.title.startswith("qgate history: alpha <script>")
        assert "bench-2" in driver.find_element(By.CSS_SELECTOR, "p.meta").text
        stripes = driver.find_elements(By.CSS_SELECTOR, "svg g.flag-fail rect")
        assert stripes and all(s.is_displayed() and s.rect["height"] > 50 for s in stripes)
        label = driver.find_element(By.CSS_SELECTOR, "svg g.flag-fail text")
        assert label.text == "FAIL"
        bands = driver.find_elements(By.CSS_SELECTOR, "svg polygon.band")
        assert bands and all(b.rect["width"] > 100 and b.rect["height"] > 3 for b in bands)
        fill = driver.execute_script("return getComputedStyle(arguments[0]).fillOpacity", bands[0])
        assert float(fill) > 0
        flagged = driver.find_element(By.CSS_SELECTOR, "p.flagged")
        assert f"{FAIL_NIGHT} (FAIL)" in flagged.text and flagged.is_displayed()
        row = driver.find_element(By.ID, f"n-{FAIL_NIGHT}")
        background = driver.execute_script(
            "return getComputedStyle(arguments[0].querySelector('td')).backgroundColor", row
        )
        assert background == "rgb(253, 236, 234)", background  # the FAIL night's line is red
        screenshot(driver, shots / "contract.png", max_height=1700)

        marker = driver.find_element(By.CSS_SELECTOR, "svg a.marker-fail")
        driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", marker)
        assert driver.execute_script("return location.hash") == f"#n-{FAIL_NIGHT}"
        assert driver.execute_script("return document.querySelector(':target').id") == f"n-{FAIL_NIGHT}"
        assert "FAIL" in driver.find_element(By.ID, f"n-{FAIL_NIGHT}").text

        driver.find_element(By.ID, "back").click()  # and back to the front page
        assert driver.title == "qgate nightly history"
        for page in sorted(site["out"].glob("*.html")):  # every page: no error, nothing fetched
            driver.get(page.resolve().as_uri())
        assert console_errors(driver) == []
        asked = requests(driver)
        ours = [url for doc, url in asked if doc.startswith("file://")]
        assert len(ours) >= 5 and all(url.startswith("file://") for url in ours), ours
        network = [url for _, url in asked if not url.startswith(("file:", "chrome:", "about:", "data:"))]
        assert network == [], network  # nothing at all went to a network
    finally:
        ctx.__exit__(None, None, None)
    print(f"screenshots: {shots}")


def _rows(site: dict[str, Any], entry: str = "alpha") -> list[dict[str, Any]]:
    return [dict(r) for r in history.read_rows(site["store"], entry)]


def test_every_string_of_a_record_is_escaped(site: dict[str, Any]) -> None:
    hostile = "<img src=x onerror=alert(1)>\"'&"
    rows = _rows(site)
    for row in rows:
        fp = json.loads(row["fingerprint"])
        fp.update(hostname=hostile, torch=hostile)
        row.update(
            fingerprint=json.dumps(fp), commit_sha=hostile, source=hostile, speed_contract_sha256=hostile
        )
        row["verdicts"] = json.dumps({"speed": {"verdict": "FAIL", "reasons": [hostile]}})
    pages = render_site(build_series(rows, hostile), [hostile], hostile, note=hostile)
    for name, text in pages.items():
        assert "<img" not in text and "onerror=alert(1)>" not in text, name
        assert "&lt;img src=x onerror=alert(1)&gt;&quot;&#x27;&amp;" in text, name


def test_one_launch_nights_take_the_history_bound_once_there_is_one(site: dict[str, Any]) -> None:
    rows = _rows(site, "beta")
    for row in rows:  # each night as a run of one engine start (the first launch's reps) had left it
        reps, ids = json.loads(row["decode_tok_s_reps"]), json.loads(row["decode_launch_ids"])
        row["decode_tok_s_reps"] = json.dumps([v for v, i in zip(reps, ids, strict=True) if i == 0])
        row["decode_launch_ids"] = None
    first = build_series(rows, "beta")[0]
    basis = [n.band_basis for n in first.nights]
    # launch_cv needs 5 earlier nights of the contract on this runner: then the history's bound is used
    assert basis[:5] == ["reps only"] * 5 and set(basis[5:]) == {"history"}
    widths = [n.ci_high - n.ci_low for n in first.nights]
    assert min(widths[5:]) > max(widths[:5])  # the engine starts' variance widens the band
    launches = build_series(_rows(site, "beta"), "beta")[0]
    assert {n.band_basis for n in launches.nights} == {"launches"}


def test_an_error_night_is_flagged_and_the_last_change_is_found(site: dict[str, Any]) -> None:
    rows = _rows(site, "beta")
    last = max(r["night"] for r in rows)
    for row in rows:
        if row["night"] == last:
            row["verdict"] = "ERROR"
            row["decode_tok_s_reps"] = json.dumps([])
    series = build_series(rows, "beta")[-1]
    assert series.last.flags == ("ERROR",) and series.last.band_basis == "no decode reps of both arms"
    assert series.last_change() == (last, "PASS", "ERROR")
    page = render_site([series], ["s"], "now")[f"{series.slug}.html"]
    assert 'class="flag-error"' in page and f'id="n-{last}" class="night flag-error"' in page
