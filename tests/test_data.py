"""Splits, IDs, generators, manifests and prompts."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from grpo_knobs import data, prompts
from grpo_knobs.data import DataHashMismatch, load_split
from grpo_knobs.verifiers import grade_countdown, grade_gsm8k

COUNTDOWN_TASKS = [task for task in data.list_tasks() if task.startswith("countdown")]


@pytest.fixture(scope="module")
def gsm8k():
    return {split: load_split("gsm8k", split) for split in data.SPLITS}


@pytest.fixture(scope="module")
def gsm8k_dir():
    directory = data.resolve_gsm8k_dir()
    # The package ships GSM8K (grpo_knobs/datasets/gsm8k), so a clone or an install alone is enough.
    assert directory == Path(data.__file__).resolve().parent / "datasets" / "gsm8k"
    return directory


@pytest.fixture
def gsm8k_copy(tmp_path, gsm8k_dir):
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(gsm8k_dir / name, tmp_path / name)
    return tmp_path


def _instance_key(problem):
    return tuple(sorted(problem.numbers)), problem.answer


# GSM8K -----------------------------------------------------------------------


def test_gsm8k_split_sizes(gsm8k):
    assert {split: len(rows) for split, rows in gsm8k.items()} == {
        "train": 6961,
        "validation": 512,
        "test": 1319,
    }


def test_gsm8k_ids_are_stable_and_unique(gsm8k, gsm8k_dir):
    ids = [p.id for rows in gsm8k.values() for p in rows]
    assert len(ids) == len(set(ids))
    train_ids = {p.id for p in gsm8k["train"] + gsm8k["validation"]}
    assert train_ids == {f"gsm8k-train-{i:04d}" for i in range(7473)}
    assert [p.id for p in gsm8k["test"]] == [f"gsm8k-test-{i:04d}" for i in range(1319)]
    for split, rows in (("train", gsm8k["train"] + gsm8k["validation"]), ("test", gsm8k["test"])):
        lines = (gsm8k_dir / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        for problem in rows[::97]:
            row = json.loads(lines[int(problem.id.rsplit("-", 1)[1])])
            assert problem.question == row["question"]
            assert problem.solution == row["answer"]


def test_gsm8k_validation_is_deduplicated(gsm8k):
    validation = [data.normalize_question(p.question) for p in gsm8k["validation"]]
    assert len(set(validation)) == len(validation)
    assert not set(validation) & {data.normalize_question(p.question) for p in gsm8k["test"]}
    assert not set(validation) & {data.normalize_question(p.question) for p in gsm8k["train"]}
    assert all(re.fullmatch(r"gsm8k-train-\d{4}", p.id) for p in gsm8k["validation"])


def test_gsm8k_gold_answers_are_numbers_and_grade(gsm8k):
    for problem in gsm8k["test"]:
        assert re.fullmatch(r"-?\d+", problem.answer), problem
        assert grade_gsm8k(problem.solution, problem.answer, "strict") == 1.0
    assert data.gsm8k_gold("so 1000\n#### 1,000") == "1000"


def test_gsm8k_dedup_rule_drops_duplicates(gsm8k_copy):
    rows = [json.loads(line) for line in (gsm8k_copy / "train.jsonl").read_text().splitlines()]
    test_rows = [json.loads(line) for line in (gsm8k_copy / "test.jsonl").read_text().splitlines()]
    rows[1]["question"] = rows[0]["question"].upper()
    rows[2]["question"] = test_rows[0]["question"] + "  "
    spec = data.TASKS["gsm8k"]
    spec = dataclasses.replace(spec, validation_size=7470)
    eligible = data._validation_indices(rows, test_rows, spec)
    assert {0, 1, 2}.isdisjoint(eligible) and len(eligible) == 7470


def test_lookup_order_data_dir_then_repository_then_env_var(monkeypatch, gsm8k_copy, gsm8k_dir, tmp_path):
    monkeypatch.setenv(data.DATA_ENV_VAR, str(tmp_path / "elsewhere"))
    assert data.resolve_gsm8k_dir(gsm8k_copy) == gsm8k_copy
    assert data.resolve_gsm8k_dir() == gsm8k_dir


def test_env_var_used_when_the_repository_copy_is_absent(monkeypatch, gsm8k_copy, tmp_path):
    monkeypatch.setattr(data, "_default_gsm8k_dirs", lambda: [tmp_path / "absent"])
    monkeypatch.setenv(data.DATA_ENV_VAR, str(gsm8k_copy))
    assert data.resolve_gsm8k_dir() == gsm8k_copy
    assert len(load_split("gsm8k", "test")) == 1319
    _tamper(gsm8k_copy / "test.jsonl")
    with pytest.raises(DataHashMismatch):
        load_split("gsm8k", "test")


def test_missing_explicit_dir_is_an_error(monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir"):
        load_split("gsm8k", "test", data_dir=tmp_path / "nowhere")
    monkeypatch.setattr(data, "_default_gsm8k_dirs", lambda: [tmp_path / "absent"])
    monkeypatch.setenv(data.DATA_ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=data.DATA_ENV_VAR):
        load_split("gsm8k", "test")


def test_no_data_anywhere_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv(data.DATA_ENV_VAR, raising=False)
    monkeypatch.setattr(data, "_default_gsm8k_dirs", lambda: [tmp_path / "absent"])
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)
    with pytest.raises(FileNotFoundError) as error:
        load_split("gsm8k", "test")
    message = str(error.value)
    assert str(tmp_path / "absent") in message
    assert data.DATA_ENV_VAR in message and "data_dir" in message


def _tamper(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[5])
    row["answer"] = row["answer"].rsplit("####", 1)[0] + "#### 999999"
    lines[5] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_tampered_row_raises_with_both_hashes(gsm8k_copy):
    _tamper(gsm8k_copy / "test.jsonl")
    expected = data.split_hashes("gsm8k")["test"]
    with pytest.raises(DataHashMismatch) as error:
        load_split("gsm8k", "test", data_dir=gsm8k_copy)
    message = str(error.value)
    assert "'test'" in message and "'gsm8k'" in message
    assert expected in message
    actual = data.problems_sha256(load_split("gsm8k", "test", data_dir=gsm8k_copy, verify=False))
    assert actual != expected and actual in message
    assert "grpo-knobs data build" in message
    assert isinstance(error.value, ValueError)


def test_wrong_manifest_hash_raises(monkeypatch, tmp_path):
    manifest = json.loads((data.MANIFEST_DIR / "countdown-2x10.json").read_text())
    manifest["splits"]["validation"]["sha256"] = "0" * 64
    (tmp_path / "countdown-2x10.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(data, "MANIFEST_DIR", tmp_path)
    with pytest.raises(DataHashMismatch, match="'validation'.*" + "0" * 64):
        load_split("countdown-2x10", "validation")
    assert len(load_split("countdown-2x10", "validation", verify=False)) == 50
    assert len(load_split("countdown-2x10", "test")) == 50


# Countdown -------------------------------------------------------------------


@pytest.mark.parametrize("task", COUNTDOWN_TASKS)
def test_countdown_splits_disjoint_and_solvable(task):
    spec = data.TASKS[task]
    splits = {split: load_split(task, split) for split in data.SPLITS}
    keys = {split: [_instance_key(p) for p in rows] for split, rows in splits.items()}
    for split, split_keys in keys.items():
        assert len(set(split_keys)) == len(split_keys), split
    for first, second in itertools.combinations(data.SPLITS, 2):
        assert not set(keys[first]) & set(keys[second]), (first, second)
    assert len(splits["validation"]) == spec.validation_size
    assert len(splits["test"]) == spec.test_size
    low, high = spec.number_range
    for rows in splits.values():
        for problem in rows:
            assert problem.task == task
            assert len(problem.numbers) in spec.counts
            assert all(low <= n <= high for n in problem.numbers)
            target = int(problem.answer)
            assert spec.target_range[0] <= target <= spec.target_range[1] and target > 0
            answer = f"<answer>{problem.solution}</answer>"
            assert grade_countdown(answer, problem.numbers, target) == 1.0, problem


def _two_number_instances(high):
    """Closed-form count of (pair, positive integer target) for two numbers."""
    instances = set()
    for a, b in itertools.combinations_with_replacement(range(1, high + 1), 2):
        for value in (a + b, b - a, a * b, Fraction(b, a), Fraction(a, b)):
            if value > 0 and value.denominator == 1:
                instances.add((a, b, int(value)))
    return len(instances)


@pytest.mark.parametrize("task, high, total", [("countdown-2x10", 10, 170), ("countdown-2x20", 20, 654)])
def test_enumerated_variants_cover_the_space(task, high, total):
    assert _two_number_instances(high) == total
    rows = data.task_info(task)["rows"]
    assert sum(rows.values()) == total


def test_countdown_3x10_size():
    rows = data.task_info("countdown-3x10")["rows"]
    assert rows == {"train": 2106, "validation": 512, "test": 512}


def test_countdown_ids():
    validation = load_split("countdown-2x10", "validation")
    assert validation[7].id == "countdown-2x10-validation-0007"
    assert load_split("countdown", "train")[12].id == "countdown-train-00012"
    assert load_split("countdown", "test")[-1].id == "countdown-test-1023"


def test_countdown_generation_is_seeded():
    spec = data.TASKS["countdown"]
    first = list(itertools.islice(data._sampled_instances(spec), 300))
    assert first == list(itertools.islice(data._sampled_instances(spec), 300))
    other = dataclasses.replace(spec, seed=spec.seed + 1)
    assert first != list(itertools.islice(data._sampled_instances(other), 300))
    small = data.TASKS["countdown-2x10"]
    assert data._enumerated_instances(small) == data._enumerated_instances(small)
    assert data._enumerated_instances(small) != data._enumerated_instances(dataclasses.replace(small, seed=1))


def test_sampling_a_tiny_space_fails_clearly(monkeypatch):
    monkeypatch.setattr(data, "MAX_SAMPLING_MISSES", 2_000)
    spec = dataclasses.replace(data.TASKS["countdown-2x10"], name="tiny", method="sample", train_size=500)
    with pytest.raises(ValueError, match="enumerate"):
        data.countdown_splits.__wrapped__(spec)


def test_reachable_finds_fraction_routes():
    values = data.reachable((8, 3, 8, 3))
    assert 24 in values
    assert grade_countdown(f"<answer>{values[24]}</answer>", [8, 3, 8, 3], 24) == 1.0


# Manifests and registry --------------------------------------------------------


def test_committed_manifests_match_rebuild(tmp_path):
    written = data.build_manifests(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{t}.json" for t in data.list_tasks())
    for path in written:
        assert path.read_text() == (data.MANIFEST_DIR / path.name).read_text(), path.name


@pytest.mark.parametrize("task", data.list_tasks())
def test_manifest_rows_and_hashes(task):
    manifest = json.loads((data.MANIFEST_DIR / f"{task}.json").read_text())
    for split in data.SPLITS:
        rows = load_split(task, split, verify=False)
        entry = manifest["splits"][split]
        assert entry["rows"] == len(rows)
        assert entry["sha256"] == data.problems_sha256(rows)
        assert entry["source"]
    assert data.split_hashes(task) == {s: manifest["splits"][s]["sha256"] for s in data.SPLITS}


def test_gsm8k_manifest_records_source_files(gsm8k_dir):
    source = json.loads((data.MANIFEST_DIR / "gsm8k.json").read_text())["splits"]["test"]["source"]
    assert source["files"]["test"]["path"] == "grpo_knobs/datasets/gsm8k/test.jsonl"
    assert source["files"]["test"]["sha256"] == data.sha256_file(gsm8k_dir / "test.jsonl")


def test_unknown_task_and_split():
    with pytest.raises(ValueError, match="valid tasks: gsm8k, countdown"):
        load_split("math", "test")
    with pytest.raises(ValueError, match="valid splits: train, validation, test"):
        load_split("gsm8k", "dev")
    with pytest.raises(ValueError, match="valid tasks"):
        data.task_info("math")


def test_task_info():
    info = data.task_info("countdown")
    assert info["family"] == "countdown"
    assert info["params"]["seed"] == 1729
    assert info["rows"] == {"train": 20000, "validation": 512, "test": 1024}
    assert data.task_info("gsm8k")["params"]["hub"]["id"] == "openai/gsm8k"


# Prompts -----------------------------------------------------------------------


class RecordingTokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        self.call = (messages, tokenize, add_generation_prompt)
        return "<|im_start|>user\n" + messages[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"


def test_prompts_per_task(gsm8k):
    problem = gsm8k["test"][0]
    messages = prompts.build_messages(problem)
    assert messages[0]["role"] == "user" and len(messages) == 1
    assert problem.question in messages[0]["content"] and "####" in messages[0]["content"]
    assert prompts.prompt_version("gsm8k") == "gsm8k-v1"
    countdown = load_split("countdown-2x10", "test")[0]
    text = prompts.prompt_text(countdown)
    assert str(list(countdown.numbers)) in text and f"equals {countdown.answer}." in text
    assert "<answer>" in text
    for task in COUNTDOWN_TASKS:
        assert prompts.prompt_version(task) == "countdown-v1"


def test_render_prompt_uses_chat_template():
    problem = load_split("countdown-2x10", "test")[0]
    tokenizer = RecordingTokenizer()
    rendered = prompts.render_prompt(problem, tokenizer)
    assert tokenizer.call == (prompts.build_messages(problem), False, True)
    assert rendered.endswith("<|im_start|>assistant\n")


def test_broken_row_names_file_and_line(gsm8k_copy):
    path = gsm8k_copy / "train.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[100] = lines[100][:50]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.jsonl, line 101: not valid JSON"):
        load_split("gsm8k", "train", data_dir=gsm8k_copy)


def test_invalid_manifest_names_its_file(monkeypatch, tmp_path):
    (tmp_path / "countdown-2x10.json").write_text("{not json")
    monkeypatch.setattr(data, "MANIFEST_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"countdown-2x10\.json is not valid JSON"):
        load_split("countdown-2x10", "test")
