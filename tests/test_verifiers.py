"""Verdicts of the GSM8K and Countdown verifiers, including hostile input."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from grpo_knobs.data import Problem
from grpo_knobs.verifiers import (
    extract_countdown_expression,
    extract_gsm8k,
    grade,
    grade_countdown,
    grade_gsm8k,
    parse_expression,
    reward_audit,
    reward_audit_rows,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

TIME_LIMIT_S = 0.05

# GSM8K: hand-written cases ---------------------------------------------------


@pytest.mark.parametrize(
    "response, answer, strict, flexible",
    [
        ("48 + 24 = 72\n#### 72", "72", 1.0, 1.0),
        ("#### 1,234", "1234", 1.0, 1.0),
        ("####1234", "1234", 1.0, 1.0),
        ("#### $18.00", "18", 1.0, 1.0),
        ("#### -5", "-5", 1.0, 1.0),
        ("#### 18\n#### 17", "17", 1.0, 1.0),
        ("#### 17\nActually \\boxed{18}", "18", 0.0, 0.0),
        ("The answer is 18.", "18", 0.0, 1.0),
        ("She earns $1,234.50 in total", "1234.5", 0.0, 1.0),
        ("So it costs 18 dollars", "18", 0.0, 1.0),
        ("\\boxed{18}", "18", 0.0, 1.0),
        ("\\boxed{\\$18 \\text{ dollars}} and 7 more words", "18", 0.0, 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 0.0, 1.0),
        ("It is 3/4 of the cake", "0.75", 0.0, 1.0),
        ("It is 0.75 of the cake", "3/4", 0.0, 1.0),
        ("10 - 5", "5", 0.0, 1.0),
        ("x=-5", "-5", 0.0, 1.0),
        ("The answer is 18.", "19", 0.0, 0.0),
        ("18 is the answer" + " and that is all" * 30, "18", 0.0, 0.0),
        ("", "18", 0.0, 0.0),
    ],
)
def test_gsm8k_cases(response, answer, strict, flexible):
    assert grade_gsm8k(response, answer, "strict") == strict
    assert grade_gsm8k(response, answer, "flexible") == flexible
    assert grade_gsm8k(response, answer) == flexible


@pytest.mark.parametrize(
    "response",
    ["#### nan", "#### NaN", "#### inf", "#### Infinity", "nan", "#### ١٨", "\\boxed{１８}"],
)
def test_gsm8k_non_numbers_are_wrong(response):
    assert grade_gsm8k(response, "18", "flexible") == 0.0
    assert grade_gsm8k(response, "18", "strict") == 0.0


def test_gsm8k_rejects_bad_mode_and_gold():
    with pytest.raises(ValueError, match="mode"):
        grade_gsm8k("#### 1", "1", mode="lenient")
    with pytest.raises(ValueError, match="gold"):
        grade_gsm8k("#### 1", "one")


def test_gsm8k_extract_returns_fractions():
    assert extract_gsm8k("#### 1,000") == Fraction(1000)
    assert extract_gsm8k("so 2.50") == Fraction(5, 2)
    assert extract_gsm8k("no number here") is None
    assert extract_gsm8k("The answer is 7", "strict") is None


# GSM8K: properties -----------------------------------------------------------

SURFACES = [
    lambda n: str(n),
    lambda n: f"{n:,}",
    lambda n: f"{n}.00",
    lambda n: f"{n}.",
    lambda n: f"{n} dollars",
    lambda n: f"${n:,}" if n >= 0 else f"-${-n:,}",
]
WRAPPERS = [
    lambda form: f"Let me think.\n#### {form}",
    lambda form: f"Adding up, the total is {form}",
    lambda form: f"So the result is \\boxed{{{form}}}.",
]


@given(
    n=st.integers(min_value=-(10**7), max_value=10**7),
    surface=st.sampled_from(SURFACES),
    wrapper=st.sampled_from(WRAPPERS),
)
def test_gsm8k_flexible_reads_surface_forms(n, surface, wrapper):
    response = wrapper(surface(n))
    assert grade_gsm8k(response, str(n), "flexible") == 1.0
    assert grade_gsm8k(response, str(n + 1), "flexible") == 0.0


@given(value=st.fractions(min_value=-1000, max_value=1000, max_denominator=50))
def test_gsm8k_fraction_answers(value):
    text = f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value)
    assert grade_gsm8k(f"The answer is {text}", str(value), "flexible") == 1.0
    assert grade_gsm8k(f"#### {text}", str(value), "strict") == 1.0


@given(n=st.integers(min_value=0, max_value=10**6), surface=st.sampled_from(SURFACES))
def test_gsm8k_strict_needs_marker(n, surface):
    assert grade_gsm8k(f"The answer is {surface(n)}", str(n), "strict") == 0.0
    assert grade_gsm8k(f"\\boxed{{{surface(n)}}}", str(n), "strict") == 0.0


@given(text=st.text())
def test_gsm8k_random_text_never_raises(text):
    assert grade_gsm8k(text, "18", "flexible") in (0.0, 1.0)
    assert grade_gsm8k(text, "18", "strict") in (0.0, 1.0)


# Countdown: hand-written cases -----------------------------------------------

NUMBERS, TARGET = [44, 19, 35], 60


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<answer>(44 - 19) + 35</answer>", 1.0),
        ("<answer>44-19+35</answer>", 1.0),
        ("<ANSWER> 35 + 44 - 19 </Answer>", 1.0),
        ("<answer>(44 - 19) + 35 = 60</answer>", 1.0),
        ("<answer>(44 - 19) + 35 = 61</answer>", 0.0),
        ("<answer>(44 - 19) + 35 = 60 = 60</answer>", 0.0),
        ("<answer>44 + 19 - 35</answer>", 0.0),
        ("<answer>44 - 19 + 35 + 35 - 35</answer>", 0.0),
        ("<answer>44 + 16</answer>", 0.0),
        ("<answer>60</answer>", 0.0),
        ("<answer>(44 - 19) + 35", 1.0),
        ("<answer>wrong</answer> then (44 - 19) + 35", 0.0),
        ("<answer>1+1</answer><answer>(44 - 19) + 35</answer>", 1.0),
        ("\\boxed{44 - 19 + 35}", 1.0),
        ("\\boxed{44 - 19 + 35} and then 44 + 19 - 35", 1.0),
        ("I think (44 - 19) + 35 = 60.", 1.0),
        ("(44 + 19) - 35\n(44 - 19) + 35", 1.0),
        ("(44 - 19) + 35\n(44 + 19) - 35", 0.0),
        ("So: 44 - 19 = 25, and 25 + 35 = 60", 0.0),
        ("Final: (44 - 19) + 35\nThat is 60.", 1.0),
        ("the answer is 60", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_cases(response, expected):
    assert grade_countdown(response, NUMBERS, TARGET) == expected


def test_countdown_unary_minus_applies_to_supplied_numbers():
    assert grade_countdown("<answer>-(3) + 5</answer>", [3, 5], 2) == 1.0
    assert grade_countdown("<answer>-3 + 5</answer>", [3, 5], 2) == 1.0
    assert grade_countdown("<answer>5 - -3</answer>", [3, 5], 8) == 1.0
    assert grade_countdown("<answer>-3 + 5</answer>", [5], 2) == 0.0
    assert grade_countdown("<answer>+3 + 5</answer>", [3, 5], 8) == 0.0


def test_countdown_numbers_are_a_multiset():
    assert grade_countdown("<answer>5 * 5 - 3</answer>", [5, 3, 5], 22) == 1.0
    assert grade_countdown("<answer>5 * 3 + 7</answer>", [5, 3, 5], 22) == 0.0
    assert grade_countdown("<answer>5 * 5 - 3</answer>", [5, 3], 22) == 0.0


def test_countdown_exact_rational_arithmetic():
    assert grade_countdown("<answer>(1 + 2) / 3</answer>", [1, 2, 3], 1) == 1.0
    assert grade_countdown("<answer>8 / (3 - 8 / 3)</answer>", [8, 3, 8, 3], 24) == 1.0
    assert grade_countdown("<answer>7 / 2</answer>", [7, 2], 3) == 0.0


@pytest.mark.parametrize(
    "expression, numbers",
    [
        ("1/0", [1, 0]),
        ("5 / (3 - 3) + 5", [5, 3, 3, 5]),
        ("(1 + 2) = 3 / 0", [1, 2]),
    ],
)
def test_countdown_division_by_zero_is_wrong(expression, numbers):
    assert grade_countdown(f"<answer>{expression}</answer>", numbers, 3) == 0.0


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('echo hi')",
        "2**100",
        "2 ** 3 - 5",
        "2^3",
        "3.0 + 1",
        "١ + ٢",
        "nan",
        "float('inf')",
        "3 × 1",
        "[2] + 1",
    ],
)
def test_countdown_rejects_non_arithmetic(expression):
    for numbers, target in ([[2, 3, 5], 3], [[1, 2], 3], [[3, 1], 3], [[2, 1], 3]):
        assert grade_countdown(f"<answer>{expression}</answer>", numbers, target) == 0.0
        assert grade_countdown(expression, numbers, target) == 0.0


def test_countdown_length_and_nesting_bounds():
    padded = "44" + " " * 180 + "- 19 + 35"
    assert grade_countdown(f"<answer>{padded}</answer>", NUMBERS, TARGET) == 1.0
    too_long = "44" + " " * 200 + "- 19 + 35"
    assert grade_countdown(f"<answer>{too_long}</answer>", NUMBERS, TARGET) == 0.0
    shallow = "(" * 5 + "44 - 19" + ")" * 5 + " + 35"
    assert grade_countdown(f"<answer>{shallow}</answer>", NUMBERS, TARGET) == 1.0
    deep = "(" * 25 + "44 - 19" + ")" * 25 + " + 35"
    assert grade_countdown(f"<answer>{deep}</answer>", NUMBERS, TARGET) == 0.0
    assert parse_expression("-" * 30 + "3") is None


def test_extract_countdown_expression_order():
    assert extract_countdown_expression("1+2 \\boxed{3+4} <answer>5+6</answer>") == "5+6"
    assert extract_countdown_expression("1+2 \\boxed{3+4} 7+8") == "3+4"
    assert extract_countdown_expression("1+2\nso 7+8 = 15 ok") == "7+8 = 15"
    assert extract_countdown_expression("nothing here 42") is None


# Countdown: properties -------------------------------------------------------

SPACES = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def expressions(draw, numbers):
    """A random expression over ``numbers`` with random spacing and extra parentheses."""
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        left = items.pop(draw(st.integers(0, len(items) - 1)))
        right = items.pop(draw(st.integers(0, len(items) - 1)))
        operator = draw(st.sampled_from("+-*/"))
        if operator == "/" and right[0] == 0:
            operator = "+"
        value = {"+": left[0] + right[0], "-": left[0] - right[0], "*": left[0] * right[0]}.get(
            operator, left[0] / right[0] if right[0] else None
        )
        s = [draw(SPACES) for _ in range(4)]
        text = f"({s[0]}{left[1]}{s[1]}{operator}{s[2]}{right[1]}{s[3]})"
        if draw(st.booleans()):
            text = f"({text})"
        items.append((value, text))
    return items[0]


NUMBER_LISTS = st.lists(st.integers(1, 99), min_size=2, max_size=4)


@settings(max_examples=200)
@given(data=st.data(), numbers=NUMBER_LISTS)
def test_countdown_correct_expressions_grade_one(data, numbers):
    value, text = data.draw(expressions(numbers))
    assume(value.denominator == 1)
    target = int(value)
    wrappers = ["<answer>{}</answer>", "\\boxed{{{}}}", "Work...\n{}"]
    wrappers.append(f"<answer>{{}} = {target}</answer>")
    wrapper = data.draw(st.sampled_from(wrappers))
    assert grade_countdown(wrapper.format(text), numbers, target) == 1.0


@settings(max_examples=200)
@given(data=st.data(), numbers=NUMBER_LISTS)
def test_countdown_reused_or_missing_number_grades_zero(data, numbers):
    value, text = data.draw(expressions(numbers[1:] or numbers))
    assume(value.denominator == 1)
    assert grade_countdown(f"<answer>{text}</answer>", numbers, int(value)) == 0.0
    full_value, full_text = data.draw(expressions(numbers))
    assume(full_value.denominator == 1)
    reused = f"{full_text} + {numbers[0]} - {numbers[0]}"
    assert grade_countdown(f"<answer>{reused}</answer>", numbers, int(full_value)) == 0.0


@given(text=st.text())
def test_countdown_random_text_never_raises(text):
    assert grade_countdown(text, [1, 2, 3], 6) in (0.0, 1.0)


@given(text=st.text(alphabet="0123456789+-*/()= \n<>answer\\boxed{}#.,$^"))
def test_countdown_random_expression_text_never_raises(text):
    assert grade_countdown(text, [1, 2, 3], 6) in (0.0, 1.0)
    assert grade_gsm8k(text, "6") in (0.0, 1.0)


# Hostile input: linear time --------------------------------------------------

MILLION = 1_000_000
HOSTILE = {
    "digits": "1" * MILLION,
    "nested answer": "<answer>" + "(" * 10_000 + "1" + ")" * 10_000 + "</answer>",
    "nested untagged": "(" * 10_000 + "1+2" + ")" * 10_000,
    "open tags": "<answer>" * (MILLION // 8),
    "hashes": "#" * MILLION,
    "markers": "#### 1" * (MILLION // 6),
    "marker then spaces": "####" + " " * MILLION,
    "boxed": "\\boxed{" * (MILLION // 7),
    "boxed braces": "\\boxed{" + "{" * MILLION,
    "junk runs": "1+)a" * (MILLION // 4),
    "numbers in prose": "1a" * (MILLION // 2),
    "hyphens": "a-" * (MILLION // 2),
    "spaces": "a " * (MILLION // 2),
    "open parens": "(" * MILLION,
    "newlines": "\n" * MILLION,
    "unicode digits": "١٢٣" * (MILLION // 3),
    "angle brackets": "<" * MILLION,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_responses_grade_zero_fast(name):
    response = HOSTILE[name]
    graders = [
        lambda: grade_countdown(response, [1, 2], 3),
        lambda: grade_gsm8k(response, "3", "flexible"),
        lambda: grade_gsm8k(response, "3", "strict"),
    ]
    for grader in graders:
        start = time.perf_counter()
        assert grader() == 0.0
        assert time.perf_counter() - start < TIME_LIMIT_S


def test_correct_answer_after_huge_prefix_is_found():
    prefix = "blah " * 200_000
    assert grade_countdown(prefix + "<answer>1 + 2</answer>", [1, 2], 3) == 1.0
    assert grade_gsm8k(prefix + "#### 3", "3", "strict") == 1.0


# Dispatch and audit ----------------------------------------------------------


def test_grade_dispatches_by_task():
    gsm = Problem("gsm8k-test-0000", "gsm8k", "q", "18")
    assert grade(gsm, "so 18") == 1.0
    assert grade(gsm, "so 18", mode="strict") == 0.0
    for task in ("countdown", "countdown-2x10"):
        problem = Problem(f"{task}-test-0000", task, "q", "3", numbers=(1, 2), solution="1 + 2")
        assert grade(problem, "<answer>1 + 2</answer>") == 1.0
        assert grade(problem, "<answer>1 + 2</answer>", mode="strict") == 1.0
        assert grade(problem, "<answer>2 - 1</answer>") == 0.0
    with pytest.raises(ValueError, match="mode"):
        grade(gsm, "18", mode="loose")
    with pytest.raises(ValueError, match="valid tasks"):
        grade(Problem("x", "math", "q", "1"), "1")


def test_reward_audit_counts_disagreements():
    answers = ["18", "18", "7", "5"]
    responses = ["#### 18", "The answer is 18.", "\\boxed{7}", "#### 4"]
    audit = reward_audit(answers, responses)
    assert audit["count"] == 4
    assert audit["strict"] == 0.25
    assert audit["flexible"] == 0.75
    assert audit["disagreements"] == 2
    assert audit["disagreement_examples"] == [1, 2]
    rows = reward_audit_rows(answers, responses)
    assert [row["extracted_flexible"] for row in rows] == ["18", "18", "7", "4"]
    assert rows[1]["extracted_strict"] is None
    with pytest.raises(ValueError, match="responses"):
        reward_audit(["1"], [])
