"""Compiled-kernel caches beside the models, and `grpo-knobs prepare`, on CPU (where nothing compiles)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_knobs.caches import COMPILE_CACHES, use_compile_caches
from grpo_knobs.cli import main
from grpo_knobs.config import RunConfig
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.prepare import run_modules, warm_up, warm_up_configs, warm_up_widths
from tiny import run_args

ROOT = Path(__file__).resolve().parents[1]
# What Triton and Inductor themselves resolve their cache folders to, after an entry point was imported.
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
import triton
from torch._inductor.runtime.cache_dir_utils import cache_dir
print(json.dumps({"TRITON_CACHE_DIR": triton.knobs.cache.dir, "TORCHINDUCTOR_CACHE_DIR": cache_dir()}))
"""


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_CACHES}
    pythonpath = [str(ROOT / "lib"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return env | {"GRPO_KNOBS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(pythonpath)} | extra


@pytest.mark.parametrize(
    "entry_point",
    [
        "grpo_knobs.cli",  # grpo-knobs ...
        "grpo_knobs.study.__main__",  # a study's worker process
        "grpo_knobs.config",  # the papermill training kernel's first import
        "benchmarks.rollout",
    ],
)
def test_entry_points_cache_compiled_kernels_beside_the_models(tmp_path, entry_point):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, entry_point], env=_env(tmp_path), capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {
        "TRITON_CACHE_DIR": str(tmp_path / "cache" / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"),
    }


COMPILE = """
import json, sys
import grpo_knobs  # what every entry point imports first
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

source = ASTSource(_double, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, constexprs={"BLOCK": 64})
print("cubin" in triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm)
"""


def test_a_kernel_compiled_once_is_read_from_the_cache_by_the_next_process(tmp_path):
    """Triton compiles ahead of time for a named GPU without one (tests/test_kernels_compile.py)."""
    pytest.importorskip("triton")
    script = tmp_path / "compile.py"  # a file: triton.jit reads the kernel's source
    script.write_text(COMPILE)
    env = {k: v for k, v in _env(tmp_path).items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr[-2000:]
        files = sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file())
        runs.append([(p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in files])
    assert any(p.suffix == ".cubin" for p, _ in runs[0])
    assert all(p.parts[:2] == ("cache", "triton") for p, _ in runs[0])
    assert runs[1] == runs[0]  # the second process wrote nothing (a compile rewrites its files): it read them


def test_a_cache_folder_the_user_chose_is_kept(tmp_path):
    env = _env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "mine"))
    proc = subprocess.run([sys.executable, "-c", PROBE, "grpo_knobs.cli"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {
        "TRITON_CACHE_DIR": str(tmp_path / "mine"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"),
    }


def test_compile_caches_follow_the_cache_variable_and_skip_an_unwritable_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = {"GRPO_KNOBS_CACHE": "rel/cache"}  # relative: children started elsewhere must find the same folder
    assert use_compile_caches(env) == {
        "TRITON_CACHE_DIR": str(tmp_path / "rel/cache/triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "rel/cache/inductor"),
    }
    assert use_compile_caches(env) == {}  # already set: unchanged
    (tmp_path / "file").write_text("")
    unwritable = {"GRPO_KNOBS_CACHE": str(tmp_path / "file" / "cache")}  # under a file: cannot be created
    assert use_compile_caches(unwritable) == {} and set(unwritable) == {"GRPO_KNOBS_CACHE"}


def test_prepare_on_cpu_says_there_is_nothing_to_compile(tmp_path):
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", "prepare", "tiny-random", "--max-new-tokens", "16"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        "grpo-knobs prepare: nothing to compile on CPU (runs there use no compiled kernels)"
    ]
    assert not (tmp_path / "cache").exists()  # no model fetched, nothing written
    bad = subprocess.run(
        [sys.executable, "-m", "grpo_knobs.cli", "prepare", "-p", "max_new_token=8"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "did you mean 'max_new_tokens'" in bad.stderr and bad.stdout == ""


def test_warm_up_runs_a_run_piece_through_the_public_entry_points(tmp_path):
    """The work prepare does on a GPU, on CPU: the static decoder's structure, run eagerly."""
    cfg = RunConfig(
        model="tiny-random",
        device="cpu",
        fast_rollout="on",
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        global_batch_size=2,
        eval_problems=3,
        max_new_tokens=4,
        eval_max_new_tokens=6,
        output_dir=str(tmp_path / "never-written"),
    )
    said = []
    done = warm_up(cfg, said.append)
    from grpo_knobs.data import load_split
    from grpo_knobs.models import load_model

    _, tokenizer, _ = load_model("tiny-random")
    problems = load_split(cfg.task, "train") + load_split(cfg.task, "validation")[:3]  # the problems a run sees
    longest = max(len(p) for p in encode_prompts(problems, tokenizer))
    assert done == {
        "model": "tiny-random",
        "rollout_path": "fast",
        "trainer_path": "packed",
        "longest_prompt": longest,
        "decode_steps": longest + 6 - 1,  # the longer of the training and evaluation caps
    }
    assert [line.split(":")[0] for line in said] == [
        f"  greedy decode, 3 rows x {longest + 5} tokens",  # an evaluation's width: one row per problem
        f"  sampled (T=1) decode, 4 rows x {longest + 5} tokens",
        "  one collection (4 responses), updates, weight sync",
    ]
    assert not (tmp_path / "never-written").exists()


def test_prepare_warms_both_trainer_modes_unless_the_run_pins_one(tmp_path, capsys):
    both = warm_up_configs({"model": "tiny-random", "max_new_tokens": "8"})
    assert [(c.deterministic, c.model, c.max_new_tokens) for c in both] == [
        (False, "tiny-random", 8),
        (True, "tiny-random", 8),
    ]
    assert [c.deterministic for c in warm_up_configs({"deterministic": "true"})] == [True]
    assert [c.deterministic for c in warm_up_configs({"deterministic": False})] == [False]
    # the arguments train takes: a --config file, -p over it, and prepare's own MODEL and --max-new-tokens
    config = tmp_path / "run.yaml"
    config.write_text("deterministic: true\nmax_new_tokens: 16\n")
    args = ["prepare", "tiny-random", "--config", str(config), "-p", "device=cpu"]
    assert main(args) == 0 and "nothing to compile on CPU" in capsys.readouterr().out
    assert main([*args, "--max-new-tokens", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "grpo-knobs prepare: error: max_new_tokens is given twice (16 and 8); give it once."
    )
    assert main([*args, "-p", "deterministic=maybe"]) == 2 and "deterministic" in capsys.readouterr().err


def test_warm_up_widths_are_a_runs_first_evaluation_and_collection_widths():
    cfg = RunConfig(rollout_batch_size=64, n_samples_per_prompt=8, global_batch_size=256, temperature=0.7)
    assert warm_up_widths(cfg, validation_problems=50) == {0.0: 50, 0.7: 512}
    narrow = RunConfig(
        rollout_batch_size=64, n_samples_per_prompt=8, global_batch_size=256, max_concurrent_sequences=128
    )
    assert warm_up_widths(narrow, validation_problems=500) == {0.0: 128, 1.0: 128}


# What prepare does on a GPU (each trainer mode's warm-up, then the run's imports), then a run in the
# same process: the modules it imports that prepare did not.
RUN_AFTER_PREPARE = """
import sys
from grpo_knobs.cli import _prepare_values, build_parser, main
from grpo_knobs.prepare import import_run_modules, warm_up, warm_up_configs
for cfg in warm_up_configs(_prepare_values(build_parser().parse_args(["prepare", *sys.argv[1:]]))):
    warm_up(cfg, lambda line: None)
import_run_modules()
before = set(sys.modules)
assert main(["train", "--no-progress", *sys.argv[1:]]) == 0
print(" ".join(sorted(set(sys.modules) - before)))
"""


def test_prepare_imports_what_a_train_run_imports(tmp_path):
    """Bytecode is written on import: what prepare imported, the first run finds compiled."""
    modules = run_modules()
    # the train command's own, and what Trainer.setup and the evaluation import only when called
    assert {"grpo_knobs.trainer", "grpo_knobs.models", "grpo_knobs.rollout.hf", "grpo_knobs.records"} <= set(modules)
    assert not {"grpo_knobs.study", "grpo_knobs.analysis", "grpo_knobs.plots"} & set(modules)  # not on a run's path
    args = run_args(resume_every_collections=1, output_dir=tmp_path / "runs")  # the resume state's writers too
    env = _env(tmp_path, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AFTER_PREPARE, *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1].split() == []  # the run imported nothing prepare had not
