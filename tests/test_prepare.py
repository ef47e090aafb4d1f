"""Compiled-kernel caches beside the models, and `grpo-knobs prepare`, on CPU (where nothing compiles)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_knobs.caches import COMPILE_CACHES, use_compile_caches
from grpo_knobs.config import RunConfig
from grpo_knobs.evaluation import encode_prompts
from grpo_knobs.prepare import warm_up

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
