"""Every string from a contract or a record escaped for where it goes: one helper per target (issue 63).

A contract's name, an env value, a path, a gate's detail quoting them, a store's label: all are data,
and data must never become markup. A name with a newline and `# qgate verdict: PASS` must not forge a
heading in a FAIL report; `<script>`, `<img onerror=...>`, `</details>` and `[x](javascript:...)` must
render as the text they are; a BEL, an OSC sequence or a carriage return must not reach a terminal raw;
junit.xml must stay well-formed XML whatever a gate's detail holds.

- `md(text)`: inline markdown text (a paragraph, a list item): control characters shown escaped (`\\n`,
  `\\x07`, `\\u2028`), so nothing starts a line of its own; backslash-escaped (which CommonMark and
  GitHub render as the character itself) what would make markup: every backslash, backtick and pipe,
  a `<` that would open raw HTML or an autolink (`<script>`, `</details>`, `<javascript:...>`), a `]`
  that would close a link or image (`](`, `][`, `]:`), and a leading block marker (`#`, `>`, `-`, `+`,
  `*`, `=`, `1.`: a heading or quote inside a list item). What cannot leave its line and is no link
  or HTML is left as written (`[1.18, 1.21]`, `>= 55`, emphasis): reports stay readable as text.
- `md_cell(text)`: `md` for a table cell (`report/tables.table` escapes every cell with it): a cell
  holds no block, so a leading `-` or `+` (a signed change) stays as written.
- `Md`: a string that already is markdown (a renderer's own `**bold**`, code span or link, with its data
  passed through md / md_code): `table` leaves it as it is.
- `md_code(text)`: a code span holding the text as it is, whatever backticks it holds.
- `html_text(text)`: text or an attribute value of HTML or SVG (the history site, report/site.py and
  svg.py): `& < > " '` as entities, control characters shown escaped.
- `xml_text(text)`: a string XML 1.0 can hold (ElementTree escapes `< > & "` itself, but writes control
  characters raw, which no XML parser reads back): the characters XML forbids shown escaped.
- `plot_text(text)`: a string for a matplotlib title or label: controls shown escaped, `$` escaped
  (matplotlib reads `$...$` as mathtext: a name with two dollars would fail the plot, or draw math).
- `term(text)`: a string safe to print to a terminal: control characters (ESC, BEL, CR, C1, ...) shown
  escaped; `term_lines` keeps the line breaks of a multi-line text.

A leaf: the standard library only.
"""

from __future__ import annotations

import html
import re


class Md(str):
    """Markdown a renderer built on purpose (its data already escaped): left as it is by `table`."""

    __slots__ = ()


def _shown(ch: str) -> str:
    """A character as Python's repr writes it, without the quotes: \\n, \\x07, \\x9b, \\u2028."""
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


# C0 and C1 controls, DEL, the Unicode line and paragraph separators, the bidirectional overrides and
# isolates (text that reads otherwise than it is stored), lone surrogates (no encoder writes them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_MD_INLINE = re.compile(r"[\\`|]|<(?=[A-Za-z/!?])|\](?=[(\[:])")
_MD_LEADING = re.compile(r"^(\s*)([#>+*=-]|\d+(?=[.)]))")
# XML 1.0's Char production: tab, LF, CR, then U+0020 on, without the surrogates and U+FFFE/U+FFFF.
_XML_FORBIDDEN = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def md_cell(value: object) -> str:
    """Markdown text of a table cell that renders as the value and cannot open a link, an image, raw
    HTML, a code span or another cell."""
    text = _CONTROL.sub(lambda m: _shown(m[0]), _text(value))
    return _MD_INLINE.sub(lambda m: "\\" + m[0], text)


def md(value: object) -> str:
    """md_cell, and a leading block marker escaped: the value cannot start a heading, a quote or a list
    where it begins a list item or a line."""
    text = md_cell(value)
    return _MD_LEADING.sub(lambda m: m[1] + ("\\" + m[2] if not m[2][0].isdigit() else m[2] + "\\"), text)


def md_code(value: object) -> Md:
    """A code span of the value as it is (controls shown escaped): fenced by more backticks than any
    run of them inside, padded with a space where the value starts or ends with one."""
    text = _CONTROL.sub(lambda m: _shown(m[0]), _text(value))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return Md(f"{fence}{pad}{text}{pad}{fence}")


def html_text(value: object) -> str:
    """Text or an attribute value of HTML / SVG: controls shown escaped, then html.escape (quotes too)."""
    return html.escape(_CONTROL.sub(lambda m: _shown(m[0]), _text(value)), quote=True)


def xml_text(value: object) -> str:
    """The value with every character XML 1.0 cannot hold shown escaped (ElementTree does the rest)."""
    return _XML_FORBIDDEN.sub(lambda m: _shown(m[0]), _text(value))


def term(value: object) -> str:
    """One line safe to print to a terminal: every control character shown escaped."""
    return _CONTROL.sub(lambda m: _shown(m[0]), _text(value))


def term_lines(value: object) -> str:
    """A text safe to print to a terminal, its line breaks kept (each line through `term`)."""
    return "\n".join(term(line) for line in _text(value).split("\n"))


def plot_text(value: object) -> str:
    """The value as matplotlib draws it literally (term, and `$` escaped: no mathtext)."""
    return term(value).replace("$", "\\$")
