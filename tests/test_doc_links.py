"""Every relative link of the docs leads somewhere: README.md, ARCHITECTURE.md, docs/**/*.md and
kernels_ext/*.md, each link to a file of the repository and, where it names a heading (`page.md#x`,
`#x`), to a heading of that page as GitHub spells its anchor. Pages move (docs/evidence/); a link they
leave behind fails here, not in a reader's browser. The run records under docs/evidence/gpu-runs/ are
kept as they were written and are not checked. Also the docs' own budget: a top-level page of docs/
holds at most 300 lines, the README at most 120; docs/reference/ holds only the generated references."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "evidence" / "gpu-runs"
# docs/reference/: what `qgate contract doc` and `qgate gates` write (tests/test_contract_doc.py,
# tests/test_gate_reference.py keep them equal to the code); only they may pass 300 lines.
GENERATED = {"contract.md", "gates.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")  # the generated reference's


def _pages() -> list[Path]:
    pages = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "kernels_ext").glob("*.md"))]
    pages += [p for p in sorted((REPO / "docs").rglob("*.md")) if RECORDS not in p.parents]
    return pages


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation out, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    kept = [c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN"]
    return "".join(kept).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text(encoding="utf-8")):
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = _slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _broken(page: Path, repo: Path = REPO) -> list[str]:
    problems = []
    for lineno, line in enumerate(_prose(page.read_text(encoding="utf-8")), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(repo)}:{lineno}: {target}"
            if repo not in (dest, *dest.parents) or not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{where}: no heading '#{anchor}' in {dest.relative_to(repo)}")
    return problems


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert _broken(page) == []


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    """A checker that passes everything proves nothing: a page with two good links (a heading of its
    own, with markup and punctuation; a file beside it), one to a missing file, one to a missing
    heading, one out of the repository, and a link inside a code block, which is not checked."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# A `code` heading, here\n"
        "[ok](#a-code-heading-here) [ok](other.md#other) [x](gone.md) [y](other.md#nope) [z](../../x.md)\n"
        "```\n[not checked](gone-too.md)\n```\n"
    )
    assert [p.split(": ", 1)[1] for p in _broken(page, tmp_path)] == [
        "gone.md: no such file",
        "other.md#nope: no heading '#nope' in docs/other.md",
        "../../x.md: no such file",
    ]


def test_user_pages_keep_their_size() -> None:
    """docs/ top level holds user pages of at most 300 lines each, every one of them; a generated
    reference lives in docs/reference/, which holds nothing else; the README is a front door."""
    pages = sorted((REPO / "docs").glob("*.md"))
    assert len(pages) >= 10
    long = [
        f"{p.name}: {n} lines" for p in pages if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300
    ]
    assert long == []
    assert {p.name for p in (REPO / "docs" / "reference").iterdir()} == GENERATED
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 120
