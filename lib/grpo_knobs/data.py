"""Problems, splits and manifests for GSM8K and the Countdown variants.

Every split is a deterministic function of its source (the GSM8K files, or a
Countdown generator's parameters and seed), and every load is checked against
the committed manifest in ``grpo_knobs/data_manifests/<task>.json``. A run record stores
:func:`split_hashes`, so two runs that report the same hashes trained and
evaluated on exactly the same rows.

Tasks (see :data:`TASKS`, :func:`list_tasks`, :func:`task_info`):

* ``gsm8k``: the 7,473 training and 1,319 test problems. Seed 1729 draws 512
  validation problems from train; the remaining 6,961 form the ``train`` pool
  and the official test set is ``test``.
* ``countdown``: 3-4 numbers from 1-99 with the study's validation (512) and
  test (1,024) sizes and a 20,000-problem train pool. It is a local stand-in
  for the study's hub data (:func:`load_countdown_hub`): each target is the
  value of a random expression over the numbers, kept in 1-999, so its
  difficulty is not calibrated to the hub's.
* ``countdown-2x10``, ``countdown-2x20``, ``countdown-3x10``: small variants
  for small models. Their instance spaces are small (170, 654 and 3,130
  distinct (sorted numbers, positive integer target) pairs), so every
  instance is enumerated, shuffled with the seed and split; the train pool
  is everything not held out. ``countdown-2x10`` holds out 50 + 50 of its 170.

Every Countdown instance is solvable: ``solution`` holds one expression that
uses each number once and evaluates (exactly, over rationals) to the target.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from functools import cache, lru_cache
from pathlib import Path
from typing import Iterator, Union

from .locations import DATASETS, MANIFESTS, package_relative
from .provenance import sha256_file

MANIFEST_DIR = MANIFESTS
SPLITS = ("train", "validation", "test")
SPLIT_SEED = 1729
DATA_ENV_VAR = "GRPO_KNOBS_DATA"
MANIFEST_FORMAT = 1

GSM8K_HUB_ID = "openai/gsm8k"
GSM8K_HUB_CONFIG = "main"
GSM8K_HUB_REVISION = "740312add88f781978c0658806c59bc2815b9866"
COUNTDOWN_HUB_ID = "Jiayi-Pan/Countdown-Tasks-3to4"
COUNTDOWN_HUB_REVISION = "408f70d177020686d34a56bba5952feb45aaaee4"


@dataclass(frozen=True)
class Problem:
    """One problem, as every other module sees it (contract in docs/architecture.md)."""

    id: str
    task: str
    question: str
    answer: str
    numbers: tuple[int, ...] = ()
    solution: str = ""

    @property
    def category(self) -> str:
        """What analysis groups the problem by (:func:`problem_category`).

        Derived on access, not a field: ``asdict`` leaves it out, so the split
        hashes in the manifests and in run records do not depend on it.
        """
        return problem_category(self)


class DataHashMismatch(ValueError):
    """The rows of a split differ from the ones its committed manifest describes."""


# Task registry -----------------------------------------------------------------


@dataclass(frozen=True)
class GSM8KTask:
    """GSM8K with the study's split rule (validation drawn from train)."""

    name: str = "gsm8k"
    description: str = "GSM8K word problems; 512 validation drawn from train with seed 1729"
    validation_size: int = 512
    seed: int = SPLIT_SEED
    family: str = "gsm8k"

    def params(self) -> dict:
        """The split rule and hub pin recorded in :func:`task_info`."""
        return {
            "validation_size": self.validation_size,
            "seed": self.seed,
            "hub": {"id": GSM8K_HUB_ID, "config": GSM8K_HUB_CONFIG, "revision": GSM8K_HUB_REVISION},
        }


@dataclass(frozen=True)
class CountdownVariant:
    """A Countdown instance family and how it is split.

    ``method="sample"`` draws random instances (for spaces too large to list);
    ``method="enumerate"`` lists every instance, shuffles them with ``seed``
    and cuts validation, test and (``train_size=None``) all the rest for
    training. Either way the splits are disjoint by (sorted numbers, target).
    To add a variant, add an entry to :data:`TASKS` and run
    ``grpo-knobs data build`` to write its manifest.
    """

    name: str
    description: str
    counts: tuple[int, ...]
    number_range: tuple[int, int]
    target_range: tuple[int, int]
    validation_size: int
    test_size: int
    train_size: int | None = None
    method: str = "sample"
    operators: str = "+-*/"
    seed: int = SPLIT_SEED
    family: str = "countdown"

    def params(self) -> dict:
        """The generator parameters recorded in the manifest."""
        fields = asdict(self)
        for key in ("name", "description", "family"):
            fields.pop(key)
        return fields


TaskSpec = Union[GSM8KTask, CountdownVariant]

TASKS: dict[str, TaskSpec] = {
    "gsm8k": GSM8KTask(),
    "countdown": CountdownVariant(
        name="countdown",
        description=(
            "3-4 numbers from 1-99, target 1-999; each target is the value of a random "
            "expression over the numbers, which is kept as the reference solution"
        ),
        counts=(3, 4),
        number_range=(1, 99),
        target_range=(1, 999),
        validation_size=512,
        test_size=1024,
        train_size=20_000,
    ),
    "countdown-2x10": CountdownVariant(
        name="countdown-2x10",
        description=(
            "2 numbers from 1-10: all 170 (sorted numbers, positive integer target) "
            "instances, split 50 validation / 50 test / 70 train"
        ),
        counts=(2,),
        number_range=(1, 10),
        target_range=(1, 100),
        validation_size=50,
        test_size=50,
        method="enumerate",
    ),
    "countdown-2x20": CountdownVariant(
        name="countdown-2x20",
        description=("2 numbers from 1-20: all 654 instances, split 128 validation / 128 test / 398 train"),
        counts=(2,),
        number_range=(1, 20),
        target_range=(1, 400),
        validation_size=128,
        test_size=128,
        method="enumerate",
    ),
    "countdown-2x50": CountdownVariant(
        name="countdown-2x50",
        description=(
            "2 numbers from 1-50: every (sorted numbers, positive integer target) instance, "
            "split 512 validation / 512 test / the rest train"
        ),
        counts=(2,),
        number_range=(1, 50),
        target_range=(1, 2500),
        validation_size=512,
        test_size=512,
        method="enumerate",
    ),
    "countdown-2x99": CountdownVariant(
        name="countdown-2x99",
        description=(
            "2 numbers from 1-99: every (sorted numbers, positive integer target) instance, "
            "split 512 validation / 1,024 test / the rest train"
        ),
        counts=(2,),
        number_range=(1, 99),
        target_range=(1, 9801),
        validation_size=512,
        test_size=1024,
        method="enumerate",
    ),
    "countdown-3x10": CountdownVariant(
        name="countdown-3x10",
        description=("3 numbers from 1-10: all 3,130 instances, split 512 validation / 512 test / 2,106 train"),
        counts=(3,),
        number_range=(1, 10),
        target_range=(1, 1000),
        validation_size=512,
        test_size=512,
        method="enumerate",
    ),
}


def list_tasks() -> list[str]:
    """Names accepted by :func:`load_split`."""
    return list(TASKS)


def task_spec(task: str) -> TaskSpec:
    """The registry entry for ``task``, or a ValueError naming the valid tasks."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[task]


def task_family(task: str) -> str:
    """``"gsm8k"`` or ``"countdown"``: which prompt and verifier a task uses."""
    if task in TASKS:
        return TASKS[task].family
    if task.startswith("countdown-"):
        return "countdown"
    raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")


def task_info(task: str) -> dict:
    """Description, parameters and committed split sizes and hashes of ``task``."""
    spec = task_spec(task)
    manifest = _read_manifest(task, required=False)
    splits = manifest["splits"] if manifest else {}
    return {
        "task": task,
        "family": spec.family,
        "description": spec.description,
        "params": spec.params(),
        "rows": {split: entry["rows"] for split, entry in splits.items()},
        "sha256": {split: entry["sha256"] for split, entry in splits.items()},
    }


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


# Public loading ----------------------------------------------------------------


def load_split(task: str, split: str, data_dir: str | os.PathLike | None = None, verify: bool = True) -> list[Problem]:
    """The problems of one split, checked against the committed manifest.

    ``data_dir`` only matters for GSM8K (see :func:`resolve_gsm8k_dir`);
    Countdown splits are regenerated from their parameters. With ``verify``
    the rows' hash must match the manifest, else :class:`DataHashMismatch`.
    """
    spec = task_spec(task)
    _check_split(split)
    problems = _build_splits(spec, data_dir)[split]
    if verify:
        _verify(task, split, problems)
    return list(problems)


def split_hashes(task: str) -> dict[str, str]:
    """Committed sha256 of each split of ``task``, for run records.

    :func:`load_split` refuses rows that differ from these, so a run that
    loaded its data can record them as the hashes of what it used.
    """
    task_spec(task)
    return {split: entry["sha256"] for split, entry in _read_manifest(task)["splits"].items()}


def problems_sha256(problems: list[Problem]) -> str:
    """sha256 of the canonical serialization: one sorted-key JSON object per line."""
    digest = hashlib.sha256()
    for problem in problems:
        row = asdict(problem)
        line = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def _build_splits(spec: TaskSpec, data_dir) -> dict[str, tuple[Problem, ...]]:
    if isinstance(spec, GSM8KTask):
        return gsm8k_splits(spec, data_dir)[0]
    return countdown_splits(spec)


# GSM8K -------------------------------------------------------------------------


def _default_gsm8k_dirs() -> list[Path]:
    """The copy shipped inside the package (``grpo_knobs/datasets/gsm8k``, see its SOURCE.md)."""
    return [DATASETS / "gsm8k"]


def _gsm8k_files(directory: Path) -> tuple[Path, Path] | None:
    """``train.jsonl`` and ``test.jsonl`` in ``directory`` or its ``gsm8k/`` child."""
    for candidate in (directory, directory / "gsm8k"):
        train, test = candidate / "train.jsonl", candidate / "test.jsonl"
        if train.is_file() and test.is_file():
            return train, test
    return None


def resolve_gsm8k_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local GSM8K directory: ``data_dir``, else the shipped copy, else ``$GRPO_KNOBS_DATA``.

    An explicitly given directory must hold the files (no silent fallback); None means no
    local copy exists, and the hub is the last resort.
    """
    if data_dir is not None:
        if _gsm8k_files(Path(data_dir)) is None:
            raise FileNotFoundError(
                f"data_dir={data_dir} has no train.jsonl and test.jsonl (checked it and its gsm8k/ subdirectory)"
            )
        return Path(data_dir)
    for candidate in _default_gsm8k_dirs():
        if _gsm8k_files(candidate) is not None:
            return candidate.resolve()
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        if _gsm8k_files(Path(env)) is None:
            raise FileNotFoundError(
                f"${DATA_ENV_VAR}={env} has no train.jsonl and test.jsonl (checked it and its gsm8k/ subdirectory)"
            )
        return Path(env)
    return None


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid JSON ({error.msg} at column {error.colno}); "
                    "restore the file from its source (see grpo_knobs/datasets/gsm8k/SOURCE.md)"
                ) from None
    return rows


def _load_gsm8k_rows(data_dir) -> tuple[list[dict], list[dict], dict]:
    """Raw train and test rows plus where they came from (local paths or hub pin)."""
    directory = resolve_gsm8k_dir(data_dir)
    if directory is not None:
        train_path, test_path = _gsm8k_files(directory)
        source = {"kind": "local", "paths": {"train": train_path, "test": test_path}}
        return _read_jsonl(train_path), _read_jsonl(test_path), source
    try:
        train, test = _load_gsm8k_hub()
    except Exception as error:
        looked = [str(path) for path in _default_gsm8k_dirs()]
        raise FileNotFoundError(
            "GSM8K not found: no train.jsonl/test.jsonl in "
            f"{looked} and the hub dataset {GSM8K_HUB_ID} could not be loaded ({error}). "
            f"Set {DATA_ENV_VAR}=/path/to/gsm8k or pass data_dir=."
        ) from error
    hub = {"id": GSM8K_HUB_ID, "config": GSM8K_HUB_CONFIG, "revision": GSM8K_HUB_REVISION}
    return train, test, {"kind": "hub", **hub}


def _load_gsm8k_hub() -> tuple[list[dict], list[dict]]:
    """GSM8K from the Hugging Face hub at the pinned revision (needs ``datasets``)."""
    import datasets

    loaded = datasets.load_dataset(GSM8K_HUB_ID, GSM8K_HUB_CONFIG, revision=GSM8K_HUB_REVISION)
    return [dict(row) for row in loaded["train"]], [dict(row) for row in loaded["test"]]


def gsm8k_gold(answer_text: str) -> str:
    """The gold number after ``####``, thousands separators removed."""
    marker = answer_text.rfind("####")
    if marker == -1:
        raise ValueError(f"GSM8K answer without '####': {answer_text[-80:]!r}")
    return answer_text[marker + 4 :].strip().replace(",", "")


def normalize_question(question: str) -> str:
    """Lowercased alphanumeric words: the key for duplicate detection."""
    return " ".join(re.findall(r"[a-z0-9]+", question.lower()))


def _gsm8k_problem(row: dict, split: str, index: int) -> Problem:
    return Problem(
        id=f"gsm8k-{split}-{index:04d}",
        task="gsm8k",
        question=row["question"],
        answer=gsm8k_gold(row["answer"]),
        solution=row["answer"],
    )


def _validation_indices(train: list[dict], test: list[dict], spec: GSM8KTask) -> list[int]:
    """Train rows eligible for validation, drawn with the split seed.

    Eligible rows have a question that occurs once in train and never in
    test, so validation has no duplicates, shares nothing with test, and no
    copy of a validation question stays in the train pool.
    """
    counts: dict[str, int] = {}
    for row in train:
        key = normalize_question(row["question"])
        counts[key] = counts.get(key, 0) + 1
    test_keys = {normalize_question(row["question"]) for row in test}
    eligible = [
        index
        for index, row in enumerate(train)
        if counts[normalize_question(row["question"])] == 1 and normalize_question(row["question"]) not in test_keys
    ]
    if len(eligible) < spec.validation_size:
        raise ValueError(f"only {len(eligible)} GSM8K rows eligible for validation")
    random.Random(spec.seed).shuffle(eligible)
    return sorted(eligible[: spec.validation_size])


def gsm8k_splits(spec: GSM8KTask = TASKS["gsm8k"], data_dir=None) -> tuple[dict[str, tuple[Problem, ...]], dict]:
    """The three GSM8K splits (in source order) and their source description.

    IDs come from the row's index in its source file (``gsm8k-train-0123``),
    so validation problems keep their train IDs and no ID ever shifts.
    """
    train, test, source = _load_gsm8k_rows(data_dir)
    chosen = set(_validation_indices(train, test, spec))
    train_problems = [_gsm8k_problem(row, "train", index) for index, row in enumerate(train)]
    splits = {
        "train": tuple(p for i, p in enumerate(train_problems) if i not in chosen),
        "validation": tuple(p for i, p in enumerate(train_problems) if i in chosen),
        "test": tuple(_gsm8k_problem(row, "test", index) for index, row in enumerate(test)),
    }
    return splits, source


# Countdown ---------------------------------------------------------------------

Instance = tuple[tuple[int, ...], int, str]  # numbers, target, reference expression
MAX_SAMPLING_MISSES = 100_000


Value = Union[int, Fraction]


def combine(operator: str, left: Value, right: Value) -> Value | None:
    """Exact arithmetic that stays in ``int`` until a division needs a Fraction; None on x / 0.

    The Countdown generator and the Countdown verifier share it, so a reference solution and a
    graded answer are evaluated by the same rules."""
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if right == 0:
        return None
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    return Fraction(left) / right


def reachable(numbers: tuple[int, ...], operators: str = "+-*/") -> dict[Value, str]:
    """Every value an expression using each number exactly once can take.

    Maps each value to one expression reaching it (the first found, so the
    choice is deterministic). Exhaustive, so only for a handful of numbers.
    """
    if len(numbers) == 1:
        return {numbers[0]: str(numbers[0])}
    values: dict[Value, str] = {}
    indices = range(len(numbers))
    for mask in range(1, (1 << len(numbers)) - 1):
        left = reachable(tuple(numbers[i] for i in indices if mask >> i & 1), operators)
        right = reachable(tuple(numbers[i] for i in indices if not mask >> i & 1), operators)
        for (a, a_text), (b, b_text) in itertools.product(left.items(), right.items()):
            for operator in operators:
                value = combine(operator, a, b)
                if value is not None and value not in values:
                    values[value] = f"{_wrap(a_text)} {operator} {_wrap(b_text)}"
    return values


@cache
def _operator_sets(numbers: tuple[int, ...], operators: str) -> dict[Value, frozenset[frozenset[str]]]:
    """Every value reachable from ``numbers`` (each used once), with the operator sets of the
    expressions reaching it; ``numbers`` sorted, like :func:`reachable` without the text."""
    if len(numbers) == 1:
        return {numbers[0]: frozenset({frozenset()})}
    values: dict[Value, set[frozenset[str]]] = {}
    indices = range(len(numbers))
    for mask in range(1, (1 << len(numbers)) - 1):
        left = _operator_sets(tuple(sorted(numbers[i] for i in indices if mask >> i & 1)), operators)
        right = _operator_sets(tuple(sorted(numbers[i] for i in indices if not mask >> i & 1)), operators)
        for (a, a_sets), (b, b_sets) in itertools.product(left.items(), right.items()):
            for operator in operators:
                value = combine(operator, a, b)
                if value is not None:
                    values.setdefault(value, set()).update(x | y | {operator} for x in a_sets for y in b_sets)
    return {value: frozenset(sets) for value, sets in values.items()}


def countdown_category(numbers: tuple[int, ...], target: int, operators: str = "+-*/") -> str:
    """The operation sets of every solution of a Countdown instance, e.g. ``"+"`` or ``"+|*"``.

    Each solution (an expression using every number once that equals
    ``target``) contributes the set of operators it uses, written in the order
    ``+ - * /``; distinct sets are joined by ``|``, shorter first. ``[2, 2] ->
    4`` is ``"+|*"`` (2 + 2 and 2 * 2); ``[3, 5, 2] -> 16`` includes ``"+*"``.
    """
    sets = _operator_sets(tuple(sorted(numbers)), operators).get(target)
    if not sets:
        raise ValueError(f"no expression over {list(numbers)} reaches {target}")
    rank = {op: i for i, op in enumerate("+-*/")}
    names = sorted(("".join(sorted(s, key=rank.get)) for s in sets), key=lambda n: (len(n), [rank[c] for c in n]))
    return "|".join(names)


def gsm8k_steps(rationale: str) -> int:
    """Steps of a GSM8K gold rationale: its non-empty lines before ``####``."""
    marker = rationale.rfind("####")
    if marker == -1:
        raise ValueError(f"GSM8K rationale without '####': {rationale[-80:]!r}")
    return sum(1 for line in rationale[:marker].splitlines() if line.strip())


def problem_category(problem: Problem) -> str:
    """Countdown: :func:`countdown_category`; GSM8K: ``"<n> steps"`` (:func:`gsm8k_steps`)."""
    if problem.numbers:
        return countdown_category(problem.numbers, int(problem.answer))
    if problem.task == "gsm8k":
        steps = gsm8k_steps(problem.solution)
        return f"{steps} step{'s' if steps != 1 else ''}"
    raise ValueError(f"{problem.id}: no category for task {problem.task!r} (neither Countdown numbers nor GSM8K)")


def _wrap(expression: str) -> str:
    return expression if expression.isdigit() else f"({expression})"


def _random_expression(rng: random.Random, numbers: list[int], operators: str) -> tuple[Value, str] | None:
    """Combine random pairs with random operators until one expression is left."""
    items: list[tuple[Value, str]] = [(n, str(n)) for n in numbers]
    while len(items) > 1:
        left = items.pop(rng.randrange(len(items)))
        right = items.pop(rng.randrange(len(items)))
        operator = rng.choice(operators)
        value = combine(operator, left[0], right[0])
        if value is None:
            return None
        items.append((value, f"{_wrap(left[1])} {operator} {_wrap(right[1])}"))
    return items[0]


def _in_range(value: Value, bounds: tuple[int, int]) -> bool:
    return value.denominator == 1 and bounds[0] <= value <= bounds[1] and value > 0


def _sampled_instances(spec: CountdownVariant) -> Iterator[Instance]:
    """Distinct random instances; the target is the value of a random expression."""
    rng = random.Random(spec.seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    low, high = spec.number_range
    misses = 0
    while misses < MAX_SAMPLING_MISSES:
        numbers = [rng.randint(low, high) for _ in range(rng.choice(spec.counts))]
        result = _random_expression(rng, numbers, spec.operators)
        misses += 1
        if result is None or not _in_range(result[0], spec.target_range):
            continue
        key = (tuple(sorted(numbers)), int(result[0]))
        if key not in seen:
            seen.add(key)
            misses = 0
            yield tuple(numbers), int(result[0]), result[1]
    raise ValueError(
        f"{spec.name}: no new instance in {MAX_SAMPLING_MISSES} draws; the instance "
        "space is too small for sampling, use method='enumerate'"
    )


def _enumerated_instances(spec: CountdownVariant) -> list[Instance]:
    """Every (sorted numbers, target) instance, shuffled with the variant's seed.

    Numbers are shown in a seeded random order so position carries no signal.
    """
    low, high = spec.number_range
    instances = []
    for count in spec.counts:
        for numbers in itertools.combinations_with_replacement(range(low, high + 1), count):
            for value, expression in sorted(reachable(numbers, spec.operators).items()):
                if _in_range(value, spec.target_range):
                    instances.append((numbers, int(value), expression))
    rng = random.Random(spec.seed)
    rng.shuffle(instances)
    return [
        (tuple(rng.sample(numbers, len(numbers))), target, expression) for numbers, target, expression in instances
    ]


def _countdown_problem(spec: CountdownVariant, split: str, index: int, width: int, instance: Instance) -> Problem:
    numbers, target, expression = instance
    return Problem(
        id=f"{spec.name}-{split}-{index:0{width}d}",
        task=spec.name,
        question=f"Using the numbers {list(numbers)}, create an equation that equals {target}.",
        answer=str(target),
        numbers=numbers,
        solution=expression,
    )


@lru_cache(maxsize=None)
def countdown_splits(spec: CountdownVariant) -> dict[str, tuple[Problem, ...]]:
    """Validation, test and train problems of a variant, disjoint by instance.

    Instances are assigned in generation order: the first ``validation_size``
    to validation, the next ``test_size`` to test, then the train pool.
    IDs are zero-padded to at least four digits, wider for larger splits.
    """
    if spec.method == "enumerate":
        instances = _enumerated_instances(spec)
    elif spec.method == "sample":
        if spec.train_size is None:
            raise ValueError(f"{spec.name}: a sampled variant needs train_size")
        instances = list(itertools.islice(_sampled_instances(spec), _total(spec)))
    else:
        raise ValueError(f"{spec.name}: unknown method {spec.method!r} (sample or enumerate)")
    cuts = _split_bounds(spec, len(instances))
    splits = {}
    for split, (start, stop) in cuts.items():
        width = max(4, len(str(stop - start - 1)))
        splits[split] = tuple(
            _countdown_problem(spec, split, index, width, instance)
            for index, instance in enumerate(instances[start:stop])
        )
    return splits


def _total(spec: CountdownVariant) -> int:
    return spec.validation_size + spec.test_size + (spec.train_size or 0)


def _split_bounds(spec: CountdownVariant, available: int) -> dict[str, tuple[int, int]]:
    held_out = spec.validation_size + spec.test_size
    train_stop = available if spec.train_size is None else held_out + spec.train_size
    if train_stop > available or held_out >= available:
        raise ValueError(f"{spec.name}: {available} instances cannot fill the requested splits")
    return {
        "validation": (0, spec.validation_size),
        "test": (spec.validation_size, held_out),
        "train": (held_out, train_stop),
    }


def load_countdown_hub(
    split: str,
    revision: str = COUNTDOWN_HUB_REVISION,
    validation_size: int = 512,
    test_size: int = 1024,
    seed: int = SPLIT_SEED,
) -> list[Problem]:
    """Countdown from the hub dataset the study used (needs ``datasets`` and network).

    Untested here: the machines that build this suite have no hub access, so
    these splits have no committed manifest. Rows are deduplicated by
    (sorted numbers, target), shuffled with ``seed`` and cut into validation,
    test and the remaining train pool. The hub rows carry no reference
    solution, so ``solution`` is empty.
    """
    _check_split(split)
    import datasets

    rows = datasets.load_dataset(COUNTDOWN_HUB_ID, split="train", revision=revision)
    seen, instances = set(), []
    for row in rows:
        key = (tuple(sorted(row["nums"])), int(row["target"]))
        if key not in seen:
            seen.add(key)
            instances.append((tuple(int(n) for n in row["nums"]), int(row["target"]), ""))
    random.Random(seed).shuffle(instances)
    spec = CountdownVariant(
        name="countdown-hub",
        description=f"{COUNTDOWN_HUB_ID}@{revision}",
        counts=(3, 4),
        number_range=(1, 99),
        target_range=(1, 999),
        validation_size=validation_size,
        test_size=test_size,
        seed=seed,
    )
    start, stop = _split_bounds(spec, len(instances))[split]
    width = max(4, len(str(stop - start - 1)))
    return [
        _countdown_problem(spec, split, index, width, instance) for index, instance in enumerate(instances[start:stop])
    ]


# Manifests ---------------------------------------------------------------------


def _manifest_path(task: str, directory: str | os.PathLike | None = None) -> Path:
    return Path(directory if directory is not None else MANIFEST_DIR) / f"{task}.json"


def _read_manifest(task: str, required: bool = True) -> dict | None:
    path = _manifest_path(task)
    if not path.is_file():
        if required:
            raise FileNotFoundError(
                f"no manifest for task {task!r} at {path}; run `grpo-knobs data build` to write it"
            )
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"manifest {path} is not valid JSON (line {error.lineno}, column {error.colno}: "
            f"{error.msg}); restore it with git or rebuild it with `grpo-knobs data build`"
        ) from None
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    bad = [
        split
        for split in SPLITS
        if not isinstance(splits, dict)
        or not isinstance(entry := splits.get(split), dict)
        or not isinstance(entry.get("sha256"), str)
        or not isinstance(entry.get("rows"), int)
    ]
    if bad:
        raise ValueError(
            f"manifest {path} lacks split(s) {', '.join(bad)} (each with its rows and sha256); "
            "restore it with git or rebuild it with `grpo-knobs data build`"
        )
    return manifest


def _verify(task: str, split: str, problems: tuple[Problem, ...]) -> None:
    """Raise :class:`DataHashMismatch` unless the rows match the committed manifest."""
    expected = _read_manifest(task)["splits"][split]["sha256"]
    actual = problems_sha256(list(problems))
    if actual != expected:
        raise DataHashMismatch(
            f"task {task!r} split {split!r}: rows hash to {actual}, manifest "
            f"{_manifest_path(task)} expects {expected}. If the generator or split rule "
            "changed on purpose, run `grpo-knobs data build`; otherwise check the data "
            f"directory (data_dir or ${DATA_ENV_VAR})."
        )


def _source_entries(spec: TaskSpec, data_dir) -> tuple[dict[str, tuple[Problem, ...]], dict]:
    """Splits of a task plus the per-split provenance written to the manifest."""
    if isinstance(spec, CountdownVariant):
        source = {"kind": "generator", "params": spec.params()}
        return countdown_splits(spec), {split: source for split in SPLITS}
    splits, source = gsm8k_splits(spec, data_dir)
    rule = {"seed": spec.seed, "validation_size": spec.validation_size}
    if source["kind"] == "hub":
        return splits, {split: {**source, **rule} for split in SPLITS}
    files = {
        name: {"path": package_relative(path), "sha256": sha256_file(path)} for name, path in source["paths"].items()
    }
    return splits, {
        "train": {"kind": "local", "files": files, "rule": "train rows not in validation", **rule},
        "validation": {"kind": "local", "files": files, "rule": _VALIDATION_RULE, **rule},
        "test": {"kind": "local", "files": {"test": files["test"]}},
    }


_VALIDATION_RULE = (
    "train rows whose normalized question occurs once in train and not in test, "
    "shuffled with the seed; the first validation_size, in source order"
)


def build_manifests(
    out_dir: str | os.PathLike = MANIFEST_DIR,
    tasks: list[str] | None = None,
    data_dir: str | os.PathLike | None = None,
) -> list[Path]:
    """Write ``<task>.json`` for each task: per split its source, row count and hash."""
    written = []
    for task in tasks or list_tasks():
        spec = task_spec(task)
        splits, sources = _source_entries(spec, data_dir)
        manifest = {
            "task": task,
            "format": MANIFEST_FORMAT,
            "description": spec.description,
            "hash": "sha256 of UTF-8 JSON lines of asdict(Problem), sort_keys, "
            "separators (',', ':'), ensure_ascii=False, one per row in split order",
            "splits": {
                split: {
                    "rows": len(splits[split]),
                    "sha256": problems_sha256(list(splits[split])),
                    "first_id": splits[split][0].id,
                    "source": sources[split],
                }
                for split in SPLITS
            },
        }
        path = _manifest_path(task, out_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written
