"""Extractors, health metrics and structural checks of the quality gate, on hand-made strings."""

from __future__ import annotations

import pytest

from qgate.quality.scoring import (
    fffd_count,
    longest_token_run,
    max_window_repeats,
    normalize_number,
    prompt_closes_thinking,
    raw_answer,
    same_number,
    score_output,
    split_thinking,
    strict_answer,
    structural_problems,
)

ALL = ["hash", "boxed", "final_answer"]


def _raw(text: str, closed_in_prompt: bool = False) -> str | None:
    return raw_answer(split_thinking(text, closed_in_prompt)[1])


def _strict(text: str, formats: list[str] = ALL) -> str | None:
    return strict_answer(split_thinking(text)[1], formats)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>7 + 6 = 13, maybe 99</think>\n\nSo he needs 13 years.", "13"),
        ("<think>The total is 5000</think> It costs $1,000.", "1000"),
        ("<think>x</think> The change is -3 degrees", "-3"),
        ("<think>x</think> She pays $2.50 each, so $12.75.", "12.75"),
        ("<think>x</think> A loss of -$5.", "-5"),
        ("<think>x</think> 1,234,567 people", "1234567"),
        ("<think>x</think> items 3,4,5", "5"),  # not a thousands group: three numbers
        ("<think>x</think> 20 - 5", "5"),  # a spaced minus is subtraction, not a sign
        ("<think>x</think> from 3-5", "5"),
        ("<think>x</think> version v1.2 gives 7", "7"),
        ("<think>x</think> #### 18.", "18"),
        ("<think>x</think> no digits here", None),
        ("<think>a</think>b</think> answer 4", "4"),  # the last </think> ends the thinking
    ],
)
def test_raw_is_last_number_after_thinking(text: str, expected: str | None) -> None:
    assert _raw(text) == expected


def test_numbers_inside_thinking_are_ignored() -> None:
    assert _raw("<think>so the answer is 42</think>\n\nI do not know.") is None
    assert _strict("<think>#### 42 and \\boxed{42}</think> The final answer is 7") == "7"


def test_missing_think_close_gives_no_answer_unless_the_prompt_closed_it() -> None:
    text = "<think>12 apples, so #### 12"
    assert _raw(text) is None and _strict(text) is None
    assert split_thinking(text) == (text, None)
    # With thinking switched off the template closes the block in the prompt: the output is the answer.
    assert _raw("The answer is #### 12", closed_in_prompt=True) == "12"
    assert prompt_closes_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_closes_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_closes_thinking("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("text", "formats", "expected"),
    [
        ("<think>x</think> #### 1,000", ALL, "1000"),
        ("<think>x</think> so \\boxed{-3.5}", ALL, "-3.5"),
        ("<think>x</think> \\boxed{ $45 }", ALL, "45"),
        ("<think>x</think> The final answer is $460.", ALL, "460"),
        ("<think>x</think> the final answer is: 13", ALL, "13"),
        ("<think>x</think> #### 5 then The final answer is 6", ALL, "6"),  # the last match wins
        ("<think>x</think> \\boxed{7} #### 8", ["boxed"], "7"),  # only the listed formats count
        ("<think>x</think> The answer is 13", ALL, None),  # a bare number is not strict
        ("<think>x</think> \\boxed{x+1}", ALL, None),
        ("<think>x</think> ####13", ["hash"], "13"),
    ],
)
def test_strict_formats(text: str, formats: list[str], expected: str | None) -> None:
    assert _strict(text, formats) == expected


def test_number_comparison() -> None:
    assert normalize_number("$1,000.50") == "1000.50"
    assert normalize_number("abc") is None
    assert same_number("13", "13.00") and same_number("-0.5", "-.5")
    assert not same_number("13", "14") and not same_number(None, "13")


def test_fffd_count() -> None:
    assert fffd_count("clean text") == 0
    assert fffd_count("bro\ufffdken \ufffd\ufffd") == 3


def test_longest_token_run() -> None:
    assert longest_token_run([]) == 0
    assert longest_token_run([5]) == 1
    assert longest_token_run([1, 2, 3, 4]) == 1
    assert longest_token_run([7, 7, 1, 7, 7, 7, 2, 2]) == 3
    assert longest_token_run([9] * 100 + [1]) == 100


def test_max_window_repeats() -> None:
    assert max_window_repeats("short", 50) == 0
    assert max_window_repeats("x" * 50, 50) == 1
    assert max_window_repeats("".join(chr(65 + i % 26) + str(i) for i in range(60)), 50) == 1
    loop = "I will count the apples again. " * 40  # period 31 chars
    assert max_window_repeats(loop, 50) == len(loop) // 31 - 1
    assert max_window_repeats("a" * 100, 50) == 51  # every window is the same
    assert max_window_repeats("abcabc", 3) == 2


def test_structural_problems() -> None:
    assert structural_problems("", None) == ["empty output", "thinking never closed"]
    assert structural_problems("<think>x", None) == ["thinking never closed"]
    assert structural_problems("<think>x</think>  ", "  ") == ["empty answer"]
    assert structural_problems("<think>x</think> none", " none") == ["no number in the answer"]
    assert structural_problems("<think>x</think> 4", " 4") == []


def test_score_output_good_and_bad() -> None:
    good = score_output("<think>\n13\n</think>\n\n#### 13", [1, 2, 3], "stop", "13", ALL)
    assert good["raw_correct"] and good["strict_correct"] and good["natural_stop"]
    assert good["closed_thinking"] and not good["invalid"] and not good["length_cap"]
    assert good["fffd_count"] == 0 and good["longest_token_run"] == 1
    bad = score_output("<think>\ufffd 13 13 13", [4, 4, 4, 4], "length", "13", ALL)
    assert not bad["raw_correct"] and bad["length_cap"] and not bad["natural_stop"]
    assert bad["invalid_reasons"] == ["thinking never closed"] and bad["fffd_count"] == 1
    assert bad["longest_token_run"] == 4
    wrong = score_output("<think>x</think> The final answer is 12", [1], "stop", "13", ALL)
    assert wrong["raw_answer"] == "12" and not wrong["raw_correct"] and not wrong["strict_correct"]
