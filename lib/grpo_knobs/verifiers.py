"""Binary, deterministic reward functions for GSM8K and Countdown.

The verifiers never execute model text: Countdown expressions go through a
hand-written tokenizer and recursive-descent parser over exact
``fractions.Fraction`` values, and GSM8K answers are read with a few
linear-time regular expressions. Every scan over a response is linear in its
length and every parse is bounded, so hostile responses (megabytes of text,
thousands of nested parentheses) grade 0.0 in milliseconds instead of
raising or hanging a training run.

Extraction rules follow the study (see ``STUDY_FACTS.md``):

* GSM8K, ``flexible``: the last ``#### N``; else the last ``\\boxed{N}``; else
  the last number in the final 300 characters. ``strict``: ``#### N`` only.
  The study's initial model scored 60.9% strict against 82.0% flexible, so
  :func:`reward_audit` reports both.
* Countdown: the last ``<answer>...</answer>``; else the last ``\\boxed{...}``;
  else the last untagged arithmetic expression, scanning from the end
  (newlines separate attempts). ``expr = target`` is accepted when the
  right-hand side equals the target.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

from grpo_knobs.data import Problem, combine, task_family

GRADING_MODES = ("flexible", "strict")

# GSM8K -----------------------------------------------------------------------

FLEXIBLE_TAIL_CHARS = 300
"""The flexible fallback reads only the final 300 characters, as the study did."""

MAX_NUMBER_CHARS = 64
"""Longer numeric tokens are not answers; this also keeps ``int()`` cheap."""

MAX_MARKERS = 16
"""At most the last 16 ``####`` markers are examined, so runs of ``#`` stay cheap."""

MAX_BOXED_CHARS = 256
MAX_BOXED_CANDIDATES = 16
"""A ``\\boxed{`` whose closing brace is further away than 256 characters is
ignored, and at most 16 are examined, so repeated ``\\boxed{`` stays cheap."""

# A number: optional sign (not right after a digit or letter, so ``5-3`` reads
# as 5 and 3), optional ``$``, digits with optional thousands separators, an
# optional decimal part and an optional ``/denominator``. ASCII digits only.
_NUMBER = (
    r"(?:(?<![0-9A-Za-z])[-\u2212])?(?:\$\s?)?[-\u2212]?"
    r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+|(?=\.[0-9]))(?:\.[0-9]+)?"
    r"(?:/[0-9]+)?"
)
_NUMBER_RE = re.compile(_NUMBER)
_AFTER_MARKER_RE = re.compile(r"[ \t]{0,16}(" + _NUMBER + ")")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def parse_number(token: str) -> Fraction | None:
    """Read one number token (``$1,234.50``, ``-3/4``, ``18.``) as a Fraction.

    Returns None for anything that is not a plain number, including NaN and
    infinity spellings, so the caller can treat it as "no answer".
    """
    text = token.strip().replace("\u2212", "-").replace("$", "").replace(",", "")
    text = text.replace(" ", "").rstrip(".")
    if not text or len(text) > MAX_NUMBER_CHARS:
        return None
    negative = text.count("-") % 2 == 1
    text = text.replace("-", "")
    if not re.fullmatch(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:/[0-9]+)?", text):
        return None
    numerator, _, denominator = text.partition("/")
    if denominator and int(denominator) == 0:
        return None
    value = Fraction(numerator) / (int(denominator) if denominator else 1)
    return -value if negative else value


def _last_number(text: str) -> Fraction | None:
    """The last parseable number in ``text`` (linear scan)."""
    last = None
    for match in _NUMBER_RE.finditer(text):
        last = match.group()
    return parse_number(last) if last is not None else None


def _marker_answer(response: str) -> Fraction | None:
    """The number after the last ``####`` marker that is followed by one."""
    end = len(response)
    for _ in range(MAX_MARKERS):
        start = response.rfind("####", 0, end)
        if start == -1:
            return None
        match = _AFTER_MARKER_RE.match(response, start + 4)
        if match:
            return parse_number(match.group(1))
        end = start
    return None


def _boxed_contents(response: str) -> Iterable[str]:
    """Contents of ``\\boxed{...}`` from last to first, braces balanced.

    Each candidate looks at most ``MAX_BOXED_CHARS`` ahead and at most
    ``MAX_BOXED_CANDIDATES`` are tried, so the work is bounded however many
    ``\\boxed{`` a response repeats.
    """
    end = len(response)
    for _ in range(MAX_BOXED_CANDIDATES):
        start = response.rfind("\\boxed{", 0, end)
        if start == -1:
            return
        end = start
        depth, body_start = 1, start + len("\\boxed{")
        limit = min(len(response), body_start + MAX_BOXED_CHARS)
        for index in range(body_start, limit):
            char = response[index]
            depth += (char == "{") - (char == "}")
            if depth == 0:
                yield response[body_start:index]
                break


def _boxed_answer(response: str) -> Fraction | None:
    """The number in the last ``\\boxed{}`` that holds one (LaTeX fractions read)."""
    for content in _boxed_contents(response):
        content = _LATEX_FRAC_RE.sub(r"\1/\2", content)
        value = _last_number(content.replace("\\!", "").replace("\\,", ""))
        if value is not None:
            return value
    return None


def extract_gsm8k(response: str, mode: str = "flexible") -> Fraction | None:
    """The answer a response commits to under ``mode``, or None."""
    _check_mode(mode)
    marked = _marker_answer(response)
    if marked is not None or mode == "strict":
        return marked
    boxed = _boxed_answer(response)
    if boxed is not None:
        return boxed
    return _last_number(response[-FLEXIBLE_TAIL_CHARS:])


def grade_gsm8k(response: str, answer: str, mode: str = "flexible") -> float:
    """1.0 when the response's answer equals the gold ``answer`` exactly.

    Values are compared as Fractions, so ``18``, ``18.00``, ``$18`` and
    ``18 dollars`` all match a gold ``18``; strings are never compared.
    """
    predicted = extract_gsm8k(response, mode)
    gold = parse_number(answer)
    if gold is None:
        raise ValueError(f"gold answer {answer!r} is not a number")
    return float(predicted is not None and predicted == gold)


def _check_mode(mode: str) -> None:
    if mode not in GRADING_MODES:
        raise ValueError(f"unknown grading mode {mode!r}; use one of {GRADING_MODES}")


# Countdown -------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200
"""The study's bound on an answer expression."""

MAX_NESTING = 20
"""Parentheses plus unary minus deeper than this are rejected, not recursed."""

MAX_UNTAGGED_CHARS = 20_000
MAX_UNTAGGED_RUNS = 1000
MAX_UNTAGGED_PARSES = 64
"""Untagged scanning reads the final 20,000 characters (a 1,024-token response
is far shorter) and stops after 1,000 candidate runs or 64 parse attempts,
which bounds the work on hostile text while covering any real response."""

_LAST_ANSWER_OPEN_RE = re.compile(r".*<answer>", re.IGNORECASE | re.DOTALL)
_ANSWER_CLOSE_RE = re.compile(r"</answer>", re.IGNORECASE)
# Runs of expression characters, matched on the reversed text so the last run
# comes first; a run must end (in reading order) with a digit or ")".
_REVERSED_RUN_RE = re.compile(r"[0-9)][0-9+\-*/() \t=]*")
_TOKEN_RE = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")


@dataclass(frozen=True)
class Expression:
    """A parsed Countdown answer: value (None on division by zero), literals, RHS."""

    value: Fraction | None
    literals: tuple[int, ...]
    rhs: Fraction | None = None


class _ParseError(Exception):
    pass


class _Parser:
    """Recursive descent over ``+ - * /``, parentheses and unary minus.

    Unary minus is an operator applied to a supplied number: ``-3 + 5`` and
    ``-(3) + 5`` both use the supplied 3 (there are no negative literals).
    Division by zero does not raise; the value becomes None.
    """

    def __init__(self, text: str) -> None:
        self.tokens = self._tokenize(text)
        self.position = 0
        self.depth = 0
        self.literals: list[int] = []

    @staticmethod
    def _tokenize(text: str) -> list[str]:
        tokens, position, stripped_end = [], 0, len(text.rstrip())
        while position < stripped_end:
            match = _TOKEN_RE.match(text, position)
            if match is None:
                raise _ParseError(f"unexpected character at {position}")
            tokens.append(match.group(1) or match.group(2))
            position = match.end()
        return tokens

    def parse(self) -> Fraction | None:
        value = self._sum()
        if self.position != len(self.tokens):
            raise _ParseError("trailing tokens")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise _ParseError("unexpected end")
        self.position += 1
        return token

    def _sum(self) -> Fraction | None:
        value = self._product()
        while self._peek() in ("+", "-"):
            operator, right = self._take(), self._product()
            value = _apply(operator, value, right)
        return value

    def _product(self) -> Fraction | None:
        value = self._unary()
        while self._peek() in ("*", "/"):
            operator, right = self._take(), self._unary()
            value = _apply(operator, value, right)
        return value

    def _unary(self) -> Fraction | None:
        if self._peek() != "-":
            return self._primary()
        self._take()
        value = self._nested(self._unary)
        return None if value is None else -value

    def _primary(self) -> Fraction | None:
        token = self._take()
        if token.isdigit():
            self.literals.append(int(token))
            return Fraction(int(token))
        if token != "(":
            raise _ParseError(f"unexpected {token!r}")
        value = self._nested(self._sum)
        if self._take() != ")":
            raise _ParseError("missing )")
        return value

    def _nested(self, rule) -> Fraction | None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _ParseError("nested too deeply")
        value = rule()
        self.depth -= 1
        return value


def _apply(operator: str, left: Fraction | None, right: Fraction | None) -> Fraction | None:
    if left is None or right is None:
        return None
    return combine(operator, left, right)


def parse_expression(text: str) -> Expression | None:
    """Parse ``expr`` or ``expr = rhs`` (at most 200 characters), else None.

    Only ASCII integers, ``+ - * /``, parentheses and whitespace are allowed;
    ``**``, ``^``, decimals and any other character make it unparseable. A
    trailing period is dropped, and ``expr =`` with nothing after the sign
    reads as ``expr``.
    """
    text = text.strip().rstrip(".").rstrip()
    if not text or len(text) > MAX_EXPRESSION_CHARS or text.count("=") > 1:
        return None
    left, _, right = text.partition("=")
    try:
        parser = _Parser(left)
        value = parser.parse()
        rhs = _Parser(right).parse() if right.strip() else None
    except _ParseError:
        return None
    if right.strip() and rhs is None:
        value = None  # the right-hand side divides by zero
    return Expression(value, tuple(parser.literals), rhs)


def _tagged(response: str) -> str | None:
    """Content of the last ``<answer>`` tag, up to its ``</answer>`` or the end."""
    last_open = _LAST_ANSWER_OPEN_RE.match(response)
    if last_open is None:
        return None
    close = _ANSWER_CLOSE_RE.search(response, last_open.end())
    return response[last_open.end() : close.start() if close else len(response)]


def _untagged(response: str) -> str | None:
    """The last run of expression characters that parses with two or more numbers."""
    reversed_text, parses = response[: -MAX_UNTAGGED_CHARS - 1 : -1], 0
    for runs, match in enumerate(_REVERSED_RUN_RE.finditer(reversed_text)):
        if runs >= MAX_UNTAGGED_RUNS or parses >= MAX_UNTAGGED_PARSES:
            return None
        candidate = match.group()[::-1].strip().lstrip("=").strip()
        if len(candidate) > MAX_EXPRESSION_CHARS or not any(c in "+-*/" for c in candidate):
            continue
        parses += 1
        parsed = parse_expression(candidate)
        if parsed is not None and len(parsed.literals) >= 2:
            return candidate
    return None


def extract_countdown_expression(response: str) -> str | None:
    """The expression a response commits to: tagged, else boxed, else untagged."""
    tagged = _tagged(response)
    if tagged is not None:
        return tagged
    for boxed in _boxed_contents(response):
        return boxed
    return _untagged(response)


def grade_countdown(response: str, numbers: Sequence[int], target: int) -> float:
    """1.0 when the committed expression uses ``numbers`` exactly once and equals ``target``.

    Numbers are compared as a multiset; arithmetic is exact; division by zero,
    an unparseable expression or a right-hand side other than the target
    grade 0.0.
    """
    expression = extract_countdown_expression(response)
    parsed = parse_expression(expression) if expression is not None else None
    if parsed is None or parsed.value is None:
        return 0.0
    if Counter(parsed.literals) != Counter(int(n) for n in numbers):
        return 0.0
    if parsed.rhs is not None and parsed.rhs != target:
        return 0.0
    return float(parsed.value == target)


# Dispatch and audit ----------------------------------------------------------


def grade(problem: Problem, response: str, mode: str = "flexible") -> float:
    """Grade a response to ``problem`` with its task's verifier.

    Countdown has a single rule, so ``mode`` only matters for GSM8K (strict
    Countdown grading equals flexible, as run records expect).
    """
    _check_mode(mode)
    if task_family(problem.task) == "gsm8k":
        return grade_gsm8k(response, problem.answer, mode)
    return grade_countdown(response, problem.numbers, int(problem.answer))


def reward_audit_rows(answers: Sequence[str], responses: Sequence[str]) -> list[dict]:
    """One row per GSM8K response with both verdicts and extracted answers.

    The rows feed ``pandas.DataFrame`` directly; extracted values are strings
    (or None) so they serialize cleanly.
    """
    if len(answers) != len(responses):
        raise ValueError(f"{len(answers)} answers but {len(responses)} responses")
    rows = []
    for index, (answer, response) in enumerate(zip(answers, responses)):
        strict, flexible = (extract_gsm8k(response, mode) for mode in ("strict", "flexible"))
        rows.append(
            {
                "index": index,
                "answer": answer,
                "extracted_strict": None if strict is None else str(strict),
                "extracted_flexible": None if flexible is None else str(flexible),
                "strict": grade_gsm8k(response, answer, "strict"),
                "flexible": grade_gsm8k(response, answer, "flexible"),
            }
        )
    return rows


def reward_audit(answers: Sequence[str], responses: Sequence[str], examples: int = 5) -> dict:
    """Strict versus flexible GSM8K acceptance over a set of responses.

    A large gap means the apparent accuracy depends on answer formatting, as
    in the study's audit (60.9% strict against 82.0% flexible).
    """
    rows = reward_audit_rows(answers, responses)
    count = len(rows)
    disagree = [row["index"] for row in rows if row["strict"] != row["flexible"]]
    return {
        "count": count,
        "strict": sum(row["strict"] for row in rows) / count if count else 0.0,
        "flexible": sum(row["flexible"] for row in rows) / count if count else 0.0,
        "disagreements": len(disagree),
        "disagreement_examples": disagree[:examples],
    }
