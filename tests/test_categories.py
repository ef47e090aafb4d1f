"""Problem categories from the data layer: derived from each problem, never part of its hash."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
from grpo_knobs import data
from grpo_knobs.data import load_split


def test_countdown_category_lists_every_solutions_operations():
    assert data.countdown_category((7, 7), 14) == "+"
    assert data.countdown_category((2, 2), 4) == "+|*"  # 2 + 2 and 2 * 2
    assert data.countdown_category((8, 2), 4) == "/"
    assert data.countdown_category((3, 9), 6) == "-"  # order of the numbers does not matter
    assert data.countdown_category((3, 5, 2), 16) == "+*"  # 2 * (3 + 5) only
    with pytest.raises(ValueError, match="reaches"):
        data.countdown_category((2, 3), 100)


def test_category_agrees_with_brute_force_on_countdown_2x10():
    for split in data.SPLITS:
        for problem in load_split("countdown-2x10", split):
            a, b = problem.numbers
            target = Fraction(int(problem.answer))
            ops = {
                op
                for op in "+-*/"
                for x, y in ((a, b), (b, a))
                if (y != 0 or op != "/") and data.combine(op, Fraction(x), Fraction(y)) == target
            }
            assert problem.category == "|".join(sorted(ops, key="+-*/".index)), problem


def test_gsm8k_category_counts_rationale_lines():
    assert data.gsm8k_steps("a = 1\nb = 2\n\nc = 3\n#### 3") == 3
    assert data.gsm8k_steps("one line\n#### 3") == 1
    with pytest.raises(ValueError, match="####"):
        data.gsm8k_steps("no marker")
    problem = load_split("gsm8k", "test")[0]
    assert problem.category == f"{problem.solution.split('####')[0].strip().count(chr(10)) + 1} steps"


def test_category_leaves_the_split_hashes_alone():
    # category is derived, not a dataclass field: the serialization the manifests hash is unchanged.
    problem = load_split("countdown-2x10", "test")[0]
    assert "category" not in dataclasses.asdict(problem)
    for task in ("countdown-2x10", "gsm8k"):
        for split in data.SPLITS:
            assert data.problems_sha256(load_split(task, split)) == data.split_hashes(task)[split]
