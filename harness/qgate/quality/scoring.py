"""Answer extractors, output health metrics and structural checks of one generated output. Pure functions.

Thinking block: the output's thinking ends at its last `</think>`; the answer part is what follows. When
the prompt already closed the thinking (a template with thinking switched off writes
`<think>\\n\\n</think>` into the prompt), the whole output is the answer part. When the thinking is
never closed there is no answer part: both extractors give None and the output is structurally invalid.

Numbers: an optional `-`, an optional `$`, digits with optional thousands groups (`1,000`, only groups of
exactly three digits: `3,4,5` is three numbers) and an optional decimal part. Normalised by dropping
`$` and `,`; compared as decimals, so `13`, `13.0` and `13.00` are equal.
"""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REPLACEMENT_CHAR = "\ufffd"

_NUM = r"(?:-?\$\s?-?|-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
NUMBER = re.compile(rf"(?<![\w.]){_NUM}")
# The strict formats a contract may list, each capturing the number it ends with.
STRICT_FORMATS: dict[str, re.Pattern[str]] = {
    "hash": re.compile(rf"####\s*({_NUM})"),
    "boxed": re.compile(rf"\\boxed\{{\s*({_NUM})\s*\}}"),
    "final_answer": re.compile(rf"[Tt]he final answer is:?\s*\**\s*({_NUM})"),
}


def normalize_number(text: str) -> str | None:
    """`$1,000.50` -> `1000.50`; None when the text is not a number."""
    cleaned = text.replace("$", "").replace(",", "").replace(" ", "")
    try:
        Decimal(cleaned)
    except InvalidOperation:
        return None
    return cleaned


def same_number(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def prompt_closes_thinking(prompt_text: str) -> bool:
    """True when the prompt's last `<think>` is already closed (thinking switched off by the template)."""
    opened = prompt_text.rfind(THINK_OPEN)
    return opened >= 0 and prompt_text.find(THINK_CLOSE, opened) >= 0


def split_thinking(text: str, closed_in_prompt: bool = False) -> tuple[str, str | None]:
    """(thinking, answer part); the answer part is None when the thinking is never closed."""
    if closed_in_prompt:
        return "", text
    cut = text.rfind(THINK_CLOSE)
    if cut < 0:
        return text, None
    return text[:cut], text[cut + len(THINK_CLOSE) :]


def raw_answer(answer_part: str | None) -> str | None:
    """The last number of the answer part, normalised; None without one."""
    if answer_part is None:
        return None
    found = NUMBER.findall(answer_part)
    return normalize_number(found[-1]) if found else None


def strict_answer(answer_part: str | None, formats: list[str]) -> str | None:
    """The number of the last match of any listed format in the answer part; None without one."""
    if answer_part is None:
        return None
    best: tuple[int, str] | None = None
    for name in formats:
        for m in STRICT_FORMATS[name].finditer(answer_part):
            if best is None or m.start() >= best[0]:
                best = (m.start(), m.group(1))
    return normalize_number(best[1]) if best else None


def fffd_count(text: str) -> int:
    """U+FFFD replacement characters: bytes that did not decode, a sign of broken token ids."""
    return text.count(REPLACEMENT_CHAR)


def longest_token_run(token_ids: list[int]) -> int:
    """Length of the longest run of one token id repeated back to back (0 for no tokens)."""
    best = run = 0
    prev = None
    for tok in token_ids:
        run = run + 1 if tok == prev else 1
        prev = tok
        best = max(best, run)
    return best


def max_window_repeats(text: str, width: int = 50) -> int:
    """Highest count of one `width`-character window among all (overlapping) windows of the text.

    1 for a text of no repeated window, 0 for a text shorter than the window. A model stuck in a loop
    repeats the same window once per period, so the count grows with the length of the loop.
    """
    if len(text) < width:
        return 0
    counts = Counter(text[i : i + width] for i in range(len(text) - width + 1))
    return max(counts.values())


def structural_problems(text: str, answer_part: str | None) -> list[str]:
    """Why an output is structurally invalid: empty, thinking never closed, no number in the answer."""
    problems = []
    if not text.strip():
        problems.append("empty output")
    if answer_part is None:
        problems.append("thinking never closed")
    elif not answer_part.strip():
        problems.append("empty answer")
    elif raw_answer(answer_part) is None:
        problems.append("no number in the answer")
    return problems


def score_output(
    text: str,
    token_ids: list[int],
    finish_reason: str | None,
    gold: str,
    strict_formats: list[str],
    closed_in_prompt: bool = False,
    window: int = 50,
) -> dict[str, Any]:
    """Every per-item figure of the quality gate that depends on the output alone."""
    _thinking, answer_part = split_thinking(text, closed_in_prompt)
    raw = raw_answer(answer_part)
    strict = strict_answer(answer_part, strict_formats)
    problems = structural_problems(text, answer_part)
    return {
        "raw_answer": raw,
        "raw_correct": same_number(raw, gold),
        "strict_answer": strict,
        "strict_correct": same_number(strict, gold),
        "natural_stop": finish_reason == "stop",
        "length_cap": finish_reason == "length",
        "closed_thinking": answer_part is not None,
        "invalid": bool(problems),
        "invalid_reasons": problems,
        "fffd_count": fffd_count(text),
        "longest_token_run": longest_token_run(token_ids),
        "max_window_repeats": max_window_repeats(text, window),
    }
