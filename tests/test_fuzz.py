"""Property-based: no bad parameter value and no corrupted record line gets past the command line.

For every generated case: a non-zero exit, at most four lines on stderr, no traceback, nothing
written anywhere in the sandbox (the output directory included), the records byte for byte as
they were. Most cases call the CLI's ``main`` in this process (milliseconds each); a few run the
real command in a subprocess.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_knobs.cli import main
from grpo_knobs.config import (
    DEPRECATED_NAMES,
    ENGINES,
    FAST_ROLLOUT,
    LOSS_AGGREGATIONS,
    PHASES,
    TRACKERS,
    TRAINER_PATHS,
    RunConfig,
    field_types,
)
from grpo_knobs.records import COLLECTION_SCHEMA
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
RECORDED_RUN = ROOT / "results" / "h200-mini" / "screening-countdown-2x10-onpolicy-small-s0"
# A valid tiny run: each case changes one parameter to a value that must be refused.
BASE = {
    "model": "tiny-random",
    "device": "cpu",
    "rollout_batch_size": "2",
    "n_samples_per_prompt": "4",
    "global_batch_size": "8",
    "response_budget": "16",
    "eval_every_responses": "16",
    "max_new_tokens": "8",
    "eval_problems": "2",
}
TYPES = field_types()
CHOICES = {
    "loss_aggregation": LOSS_AGGREGATIONS,
    "engine": ENGINES,
    "fast_rollout": FAST_ROLLOUT,
    "phase": PHASES,
    "tracker": TRACKERS,
    "trainer_path": TRAINER_PATHS,
}
# Paths and free text are the user's to choose; everything else has a type, a range or a choice.
FREE = {
    "output_dir",
    "data_dir",
    "tracking_dir",
    "model",
    "engine_url",
    "sglang_python",
    "sglang_server_args",
    "recipe",
    "task",
}
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# No example database: a test run writes nothing into the checkout.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _kind(name: str) -> type:
    declared = TYPES[name]
    return next(t for t in getattr(declared, "__args__", (declared,)) if t is not type(None))


def _optional(name: str) -> bool:
    return type(None) in getattr(TYPES[name], "__args__", ())


# ----------------------------------------------------------------------------- what every case must satisfy
def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _run_in_process(argv: list[str], cwd: Path) -> tuple[int, str]:
    err = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)  # relative defaults (runs/adhoc) would land here, inside the sandbox
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        os.chdir(here)
    return code, err.getvalue()


def _run_in_subprocess(argv: list[str], cwd: Path) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, proc.stderr


def _check_refused(argv: list[str], sandbox: Path, expect: str, subprocess_run: bool = False) -> None:
    """``grpo-knobs ARGV`` is refused in one short message and leaves ``sandbox`` as it was."""
    before = _tree(sandbox)
    code, err = (_run_in_subprocess if subprocess_run else _run_in_process)(argv, sandbox)
    assert code != 0, (argv, err)
    assert len(err.splitlines()) <= 4, (argv, err)
    assert "Traceback" not in err and "unexpected error" not in err, (argv, err)
    assert expect in err, (argv, expect, err)
    assert _tree(sandbox) == before, argv  # nothing written, in the output directory or elsewhere


@contextlib.contextmanager
def _sandbox():
    with tempfile.TemporaryDirectory(prefix="grpo-knobs-fuzz-") as tmp:
        yield Path(tmp)


# ----------------------------------------------------------------------------- bad parameter values
def _parses(text: str, kind: type) -> bool:
    """Whether ``kind(text)`` (int or float) reads ``text``."""
    try:
        kind(text.strip())
    except ValueError:
        return False
    return True


NON_FINITE = st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e999", "+inf"])
NULLS = {"null", "none", "~"}


@st.composite
def bad_value(draw, name: str) -> str:
    """A value the field ``name`` must refuse, by construction."""
    kind = _kind(name)
    junk = st.text(min_size=0, max_size=20).filter(
        lambda t: not (_optional(name) and t.strip().lower() in NULLS) and "\x00" not in t
    )
    if kind is float:
        return draw(st.one_of(NON_FINITE, junk.filter(lambda t: not _parses(t, float))))
    if kind is int:
        huge = st.integers(min_value=2**63, max_value=10**30).map(str) | st.integers(max_value=-(2**63)).map(str)
        fraction = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()).map(repr)
        return draw(
            st.one_of(huge, fraction, NON_FINITE, junk.filter(lambda t: not _parses(t, int) and not _parses(t, float)))
        )
    if kind is bool:
        words = {"true", "yes", "on", "1", "false", "no", "off", "0"}
        return draw(junk.filter(lambda t: t.strip().lower() not in words))
    if name in CHOICES:
        return draw(junk.filter(lambda t: t.strip() not in CHOICES[name]))
    if name == "device":
        return draw(junk.filter(lambda t: not DEVICE.fullmatch(t.strip())))
    # run_id and study name a directory: separators, dots, spaces and the like
    return draw(
        st.one_of(
            st.sampled_from(["../escape", "..", ".", "a/b", "/abs", ".hidden", "x\\y", "a b", "-dash"]),
            st.text(min_size=1, max_size=20).filter(lambda t: not t[0].isalnum() or not t.isascii() or "/" in t),
        ).filter(lambda t: "\x00" not in t)
    )


FIELDS = sorted(n for n in RunConfig.field_names() if n not in FREE and n not in ("arm",))


@st.composite
def bad_parameter(draw) -> tuple[list[str], str]:
    """``-p key=value`` arguments (one of them bad) and the word the message must contain."""
    choice = draw(st.sampled_from(["field", "field", "field", "unknown", "arm", "range"]))
    if choice == "unknown":
        known = set(RunConfig.field_names()) | set(DEPRECATED_NAMES)
        key = draw(st.from_regex(r"[a-z_]{1,20}", fullmatch=True).filter(lambda k: k not in known))
        return [f"{key}=1"], key
    if choice == "arm":  # an arm that makes the run directory name when run_id is empty
        arm = draw(st.sampled_from(["x/../../../escape", "../up", "a/b", "sp ace", "ünï", "a\\b"]))
        return ["run_id=", f"arm={arm}"], "run directory name"
    if choice == "range":  # well-typed, out of range
        return draw(
            st.sampled_from(
                [
                    (["lr=-1e-3"], "lr"),
                    (["lr=0"], "lr"),
                    (["temperature=0"], "temperature"),
                    (["adam_beta2=1"], "adam_beta2"),
                    (["clip_low=1.5"], "clip_low"),
                    (["grad_clip=0"], "grad_clip"),
                    (["max_new_tokens=0"], "max_new_tokens"),
                    (["rollout_batch_size=-4"], "rollout_batch_size"),
                    (["response_budget=17"], "response_budget"),
                    (["sglang_mem_fraction=1"], "sglang_mem_fraction"),
                    (["resume_every_collections=-1"], "resume_every_collections"),
                ]
            )
        )
    name = draw(st.sampled_from(FIELDS))
    return [f"{name}={draw(bad_value(name))}"], name


def _train_argv(params: list[str], out: Path) -> list[str]:
    pairs = [f"{k}={v}" for k, v in BASE.items()] + [f"output_dir={out}"] + params
    return ["train", "--no-progress", *[a for p in pairs for a in ("-p", p)]]


@FUZZ
@given(case=bad_parameter())
@example(case=(["lr=inf"], "lr"))
@example(case=(["temperature=nan"], "temperature"))
@example(case=(["run_id=", "arm=x/../../../escape"], "run directory name"))
@example(case=(["run_id=../escape"], "run_id"))
@example(case=(["seed=" + "9" * 5000], "seed"))
def test_no_bad_parameter_value_gets_through(case):
    params, expect = case
    with _sandbox() as sandbox:
        _check_refused(_train_argv(params, sandbox / "out"), sandbox, expect)


def test_every_parameter_kind_is_fuzzed():
    """The generator covers every field that is not free text or a path, on a base config that is valid."""
    RunConfig.from_dict(BASE | {"output_dir": "out"})
    kinds = {_kind(n) for n in FIELDS}
    assert kinds == {int, float, bool, str} and {"run_id", "study", "lr", "seed", "resume", "device"} <= set(FIELDS)
    strings = {n for n in FIELDS if _kind(n) is str}
    assert strings == set(CHOICES) | {"run_id", "study", "device"}


# ----------------------------------------------------------------------------- corrupted records
LINES = RECORDED_RUN.joinpath("collections.jsonl").read_text().splitlines()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
HUGE = st.integers(min_value=2**63, max_value=10**500).map(str)


def _wrong(kind: str):
    """Raw JSON text of a value that is not of ``kind`` (a COLLECTION_SCHEMA kind)."""
    numbers = st.integers(min_value=-(2**62), max_value=2**62) | st.floats(allow_nan=False, allow_infinity=False)
    not_number = st.one_of(st.text(max_size=8), st.booleans(), st.lists(numbers, max_size=2), st.just({}))
    raw_bad = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400"]) | HUGE
    dumped = not_number.map(json.dumps)
    if kind == "count":
        negative = st.integers(max_value=-1).map(str)
        fraction = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()).map(repr)
        return st.one_of(dumped, raw_bad, negative, fraction, st.just("null"))
    if kind == "number":
        return st.one_of(dumped, raw_bad, st.just("null"))
    if kind == "number or null":
        return st.one_of(dumped, raw_bad)
    if kind == "object of numbers":  # (an empty object is one)
        return st.one_of(dumped.filter(lambda t: t != "{}"), st.just('{"trainer": "x"}'), st.just('{"a": null}'))
    # a list of objects of numbers (an empty list is one)
    return st.one_of(dumped.filter(lambda t: t != "[]"), st.just('[{"loss": "x"}]'), st.just('[{"loss": NaN}]'))


@st.composite
def corrupted_line(draw) -> tuple[int, bytes]:
    """(line number, the bad line that replaces it): each kind of damage a record file can take."""
    number = draw(st.integers(min_value=1, max_value=len(LINES)))
    original = LINES[number - 1]
    damage = draw(st.sampled_from(["value", "value", "value", "missing", "json", "cut", "bytes", "renumber"]))
    if damage == "value":
        key = draw(st.sampled_from(sorted(COLLECTION_SCHEMA)))
        row = json.loads(original)
        row[key] = "@@"
        bad = json.dumps(row).replace('"@@"', draw(_wrong(COLLECTION_SCHEMA[key])))
    elif damage == "missing":
        row = json.loads(original)
        del row[draw(st.sampled_from(sorted(COLLECTION_SCHEMA)))]
        bad = json.dumps(row)
    elif damage == "json":  # any JSON that is not a row: a number, a list, null, a small object
        bad = json.dumps(draw(JSON_VALUES))
    elif damage == "cut":  # a write cut short, in the middle of the file
        bad = original[: draw(st.integers(min_value=1, max_value=len(original) - 1))]
    elif damage == "renumber":  # a row moved, repeated or left out
        row = json.loads(original)
        row["collection"] = draw(st.integers(min_value=0, max_value=400).filter(lambda c: c != number - 1))
        bad = json.dumps(row)
    else:
        return number, draw(st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b.strip()))
    return number, bad.encode()


def _with_raw(number: int, key: str, raw: str) -> bytes:
    """Line ``number`` of the recorded file with ``key`` set to the raw JSON text ``raw``."""
    row = json.loads(LINES[number - 1])
    return json.dumps(row | {key: "@@"}).replace('"@@"', raw).encode()


def _recorded_study(sandbox: Path) -> Path:
    run = sandbox / "study" / RECORDED_RUN.name
    shutil.copytree(RECORDED_RUN, run)
    return run


def _check_export_refused(number: int, bad: bytes, sandbox: Path, subprocess_run: bool = False) -> None:
    run = _recorded_study(sandbox)
    lines = run.joinpath("collections.jsonl").read_bytes().split(b"\n")
    lines[number - 1] = bad
    run.joinpath("collections.jsonl").write_bytes(b"\n".join(lines))  # the file still ends in a newline
    target = run.parent if number % 2 else run  # a study directory or the run directory itself
    argv = ["export", str(target), "--to", "tensorboard"]
    _check_refused(argv, sandbox, f"collections.jsonl line {number}: ", subprocess_run)


@FUZZ
@given(case=corrupted_line())
@example(case=(4, b"this is not json"))
@example(case=(4, b"42"))
@example(case=(5, b"[1,2]"))
@example(case=(6, b"null"))
@example(case=(7, _with_raw(7, "reward_mean", "Infinity")))
@example(case=(8, _with_raw(8, "updates", "1" + "0" * 400)))
def test_no_corrupted_record_line_gets_through(case):
    number, bad = case
    with _sandbox() as sandbox:
        _check_export_refused(number, bad, sandbox)


# ----------------------------------------------------------------------------- the real command, a few times
@settings(max_examples=3, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=bad_parameter().filter(lambda c: all(p.isprintable() for p in c[0])), record=corrupted_line())
def test_the_real_command_refuses_them_too(case, record):
    params, expect = case
    with _sandbox() as sandbox:
        _check_refused(_train_argv(params, sandbox / "out"), sandbox, expect, subprocess_run=True)
    with _sandbox() as sandbox:
        _check_export_refused(*record, sandbox, subprocess_run=True)
