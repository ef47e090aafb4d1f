"""The benchmarks run end to end on CPU with the tiny model and write their documented fields."""

import ast
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import run_args

ROOT = Path(__file__).resolve().parents[1]


def run_in_root(argv: list[str], timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """``python argv`` from the checkout's root with the library and the benchmarks on the path, ``env`` set."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        **env,
    }
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def interpreted(argv: list[str]) -> subprocess.CompletedProcess:
    """``run_in_root`` with Triton's interpreter on."""
    return run_in_root(argv, TRITON_INTERPRET="1")


def test_rollout_benchmark_cpu(tmp_path):
    out = tmp_path / "rollout-cpu.json"
    proc = run_in_root(
        [
            "-m",
            "benchmarks.rollout",
            "--model",
            "tiny-random",
            "--batches",
            "2,4",
            "--new-tokens",
            "8",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--task",
            "countdown-2x10",
            "--group",
            "2",
            "--repeats",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not measured" in proc.stdout  # CPU rows say their bandwidth is a flag value
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [2, 4]
    for r in rows:
        assert r["gpu"] == "cpu" and r["model"] == "tiny-random" and r["new_tokens"] == 8
        for field in (
            "eager_tokens_per_s",
            "fast_tokens_per_s",
            "fused_tokens_per_s",
            "bandwidth_bound_tokens_per_s",
            "eager_ms_per_step",
            "fast_ms_per_step",
            "fused_ms_per_step",
            "fused_over_fast",
        ):
            assert r[field] > 0
        for path in ("eager", "fast", "fused"):  # --repeats timed calls a path; their median counts
            calls = r[f"{path}_calls_ms_per_step"]
            assert len(calls) == 2 and r[f"{path}_ms_per_step"] == pytest.approx(statistics.median(calls))
            assert r[f"{path}_warmup_ms_per_step"] > 0
        assert r["fused_agreement"]["identical_fraction"] == 1.0  # float32 on CPU: the same greedy text
        for path in ("fast", "fused"):
            split = r[f"{path}_split"]
            assert split["decode_steps"] == 7  # the first of the 8 tokens comes from the prefill
            parts = (
                split["prefill_ms"]
                + split["decode_steps"] * split["decode_ms_per_step"]
                + split["between_steps_ms"]
                + split["after_steps_ms"]
                + split["host_ms"]
            )
            assert abs(parts - split["wall_ms"]) <= 0.02 * split["wall_ms"] + 1.0  # the parts make up the call
            assert 0 < r[f"{path}_decode_fraction_of_bound"]
            assert min(v for k, v in split.items() if k.endswith("_ms")) >= 0
            assert split["gc_ms"] <= split["wall_ms"] and split["gc_full"] >= 0
    study = json.loads((tmp_path / "rollout-cpu-countdown-2x10.json").read_text())
    assert [r["responses"] for r in study] == [2, 4]  # batch // group prompts x group samples
    for r in study:
        assert r["task"] == "countdown-2x10" and r["temperature"] == 1.0
        for path in ("fast", "compact", "fused"):
            assert r[f"{path}_tokens_per_s"] > 0 and 1 <= r[f"{path}_response_length_max"] <= 8
            assert r[f"{path}_seconds"] == pytest.approx(statistics.median(r[f"{path}_calls_seconds"]))
            assert len(r[f"{path}_calls_seconds"]) == 2


def test_rollout_benchmark_warms_every_path_at_the_timed_length(monkeypatch, tmp_path):
    """Every call of every path, the warm-up included, decodes the timed length: after a 4-token warm-up, eager's
    first timed call at 512 rows (its cache growing, the allocator taking new blocks) took 2.7-2.8x its next on two
    H100s, and one such call was what the benchmark used to report."""
    from benchmarks import rollout

    lengths, generate = [], rollout.HFEngine.generate

    def recorded(self, prompts, **kw):
        lengths.append(kw["max_new_tokens"])
        return generate(self, prompts, **kw)

    monkeypatch.setattr(rollout.HFEngine, "generate", recorded)
    argv = ["--model", "tiny-random", "--batches", "2", "--new-tokens", "8", "--device", "cpu", "--repeats", "1"]
    rows = rollout.main(argv + ["--paths", "eager,fast", "--out", str(tmp_path / "rollout.json")])
    assert len(lengths) == 5 and set(lengths) == {8}  # a warm-up and a timed call a path, and fast's split call
    assert rows[0]["eager_warmup_ms_per_step"] > 0


def test_rollout_benchmark_refuses_no_timed_calls():
    proc = run_in_root(["-m", "benchmarks.rollout", "--device", "cpu", "--repeats", "0"])
    assert proc.returncode != 0 and "--repeats must be at least 1, got 0" in proc.stderr


def test_train_benchmark_cpu(tmp_path):
    out = tmp_path / "train-cpu.json"
    proc = run_in_root(
        [
            "-m",
            "benchmarks.train",
            "--model",
            "tiny-random",
            "--budgets",
            "64,256",
            "--packed-budgets",
            "64,256",
            "--packed-paths",
            "packed,packed:unshared",
            "--group",
            "4",
            "--responses",
            "8",
            "--prompt-len",
            "8",
            "--response-len",
            "16",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["path"], r["max_tokens_per_micro_batch"]) for r in rows] == [
        ("padded", 64),
        ("padded", 256),
        ("packed", 64),
        ("packed:unshared", 64),
        ("packed", 256),
        ("packed:unshared", 256),
    ]
    assert rows[0]["micro_batches"] > rows[1]["micro_batches"]  # a smaller budget packs more micro-batches
    for r in rows:
        assert r["gpu"] == "cpu" and r["model"] == "tiny-random" and r["responses"] == 8 and r["mfu"] is None
        assert r["tokens"] <= r["padded_tokens"] and r["source"] == "synthetic"
        assert r["seconds_per_update"] > 0 and r["seconds_per_scoring"] > 0 and r["tokens_per_s"] > 0
        assert (
            r["scoring_plus_update_over_update"]
            == (r["seconds_per_scoring"] + r["seconds_per_update"]) / r["seconds_per_update"]
        )
        assert r["logprob_max_abs_diff_vs_first"] < 1e-4  # float32 on CPU: both paths score the same log-probs
    packed = [r for r in rows if r["path"].startswith("packed")]
    assert all(r["padded_tokens"] == r["tokens"] for r in packed)  # no padding
    # two prompts of 8 tokens, 4 responses each: sharing saves 3 copies of each prompt where a
    # micro-batch holds the whole group (the 256-token budget), none where it holds one sequence
    by = {(r["path"], r["max_tokens_per_micro_batch"]): r for r in packed}
    assert by[("packed:unshared", 256)]["packed_tokens"] == by[("packed:unshared", 256)]["tokens"]
    assert by[("packed", 256)]["packed_tokens"] == by[("packed", 256)]["tokens"] - 2 * 3 * 8


def test_train_benchmark_cpu_on_a_real_collection(tmp_path):
    out = tmp_path / "train-cpu.json"
    proc = run_in_root(
        [
            "-m",
            "benchmarks.train",
            "--model",
            "tiny-random",
            "--budgets",
            "256",
            "--packed-budgets",
            "256",
            "--task",
            "countdown-2x10",
            "--group",
            "2",
            "--responses",
            "4",
            "--response-len",
            "8",
            "--repeats",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["path"] for r in rows] == ["padded", "packed"]
    for r in rows:
        assert r["source"] == "collection" and r["task"] == "countdown-2x10" and r["responses"] == 4
        assert 4 <= r["response_tokens"] <= 4 * 8


def test_decode_profile_cpu(tmp_path):
    out = tmp_path / "decode-profile-cpu.json"
    args = ["--model", "tiny-random", "--batch", "4", "--steps", "4", "--paths", "fast,fused", "--device", "cpu"]
    proc = interpreted(["-m", "benchmarks.decode_profile", *args, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["path"] for r in rows] == ["fast", "fused"]
    for r in rows:
        assert r["gpu"] == "cpu" and r["batch"] == 4 and r["steps"] == 4 and r["graphed_wall_ms_per_step"] > 0
        assert r["kernel_ms_per_step"] > 0
        assert abs(sum(r["kernel_ms_per_step_by_kind"].values()) - r["kernel_ms_per_step"]) < 1e-9
        assert "gemm" in r["kernel_ms_per_step_by_kind"]  # the projections run as aten matmuls on both paths
        assert 0 < len(r["top_kernels_ms_per_step"]) <= 12


def test_decode_kernels_cpu(tmp_path):
    out = tmp_path / "decode-kernels-cpu.json"
    args = ["--model", "tiny-random", "--batch", "2", "--kv-lens", "16,32", "--sweep", "16,32:1:2", "--reps", "1"]
    args += ["--widths", "2", "--layer-kv-len", "16", "--tile-sweep", "--device", "cpu", "--out", str(out)]
    proc = interpreted(["-m", "benchmarks.decode_kernels", *args])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    (layer,) = [r for r in rows if r["kernel"] == "layer routes"]
    rows.remove(layer)
    assert layer["width"] == 2 and layer["cublas_us"] > 0 and layer["own_us"] > 0 and layer["attention_split_us"] > 0
    assert {e["BM"] for e in layer["gemm down (+x)"]["sweep"]} == {16}  # a 2-row width caps BM at 16
    kernels = [r["kernel"] for r in rows]
    assert kernels[:4] == ["add_rms_norm", "silu_mul", "sample (T > 0)", "sample (greedy)"]
    assert sum(k.startswith("gemm ") for k in kernels) == 5
    attention = [r for r in rows if r["kernel"].startswith("rotary_attention")]
    assert [r["kv_len"] for r in attention] == [16, 32]
    assert [len(r["sweep"]) for r in attention] == [1, 2]  # a 32-slot block does not fit a 16-slot cache
    for r in rows:
        assert r["gpu"] == "cpu" and r["batch"] == 2 and r["us_per_launch"] > 0
        assert ("tflops" in r) == r["kernel"].startswith("gemm ")
        assert ("fraction_of_floor" in r) != r["kernel"].startswith("gemm ")


def test_trl_peer_script_cpu(tmp_path):
    """TRL's GRPOTrainer on the study's knob mapping, end to end on CPU with the tiny model (needs trl installed)."""
    import pytest

    pytest.importorskip("trl")
    pytest.importorskip("datasets")  # GRPOTrainer's own dependency
    out = tmp_path / "trl-cpu.json"
    proc = run_in_root(
        [
            "-m",
            "benchmarks.peers.trl_grpo",
            "--model",
            "tiny-random",
            "--prompts",
            "2",
            "--group",
            "2",
            "--batch",
            "2",
            "--micro-batch",
            "1",
            "--max-new-tokens",
            "8",
            "--responses",
            "8",
            "--eval-problems",
            "4",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["knobs"] == {
        "P": 2,
        "G": 2,
        "B": 2,
        "S": 2,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 4,
        "generation_batch_size": 4,
    }
    assert r["responses"] == 8 and r["updates"] == 4 and r["completed"] and r["seconds_per_1024_responses"] > 0
    assert [c["responses"] for c in r["reward_curve"]] == [4, 8]  # one reward entry per generation of P x G
    assert r["validation_problems"] == 4


def _other_revision(tmp_path) -> Path:
    """A folder holding a copy of lib/ whose source differs from this checkout's by one comment."""
    folder = tmp_path / "other"
    shutil.copytree(ROOT / "lib", folder / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    with open(folder / "lib" / "grpo_knobs" / "__init__.py", "a") as f:
        f.write("# another revision\n")
    return folder


def _bench(module: str, *args: str) -> subprocess.CompletedProcess:
    # tiny models on shared cores: threads only wait for each other
    return run_in_root(["-m", module, *args], OMP_NUM_THREADS="1")


def test_recipe_runs_an_arm_on_another_revision_cpu(tmp_path):
    from grpo_knobs.provenance import source_sha256

    other = _other_revision(tmp_path)
    args = ["--out", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json")]
    args += run_args("--base")
    proc = _bench("benchmarks.recipe", *args, "--arm", "here", "--arm", f"there:code={other},seed=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    here, there = json.loads((tmp_path / "r.json").read_text())
    assert here["code"]["label"] == "this checkout" and there["code"]["label"].startswith(f"code={other}")
    assert there["overrides"] == {"seed": "2"}  # code= is the arm's library, not a run parameter
    expected = source_sha256(other / "lib" / "grpo_knobs")
    assert expected != source_sha256(ROOT / "lib" / "grpo_knobs")
    assert there["code"]["source_sha256"] == expected and here["code"]["ran"] and there["code"]["ran"]
    recorded = json.loads((tmp_path / "runs" / "there" / "config.json").read_text())
    assert recorded["source_sha256"] == expected and recorded["config"]["seed"] == 2  # the copy's code ran
    assert "there (code=" in proc.stdout and "x)" in proc.stdout.split("phase (s)")[1]  # ratios to the first arm

    bad = _bench("benchmarks.recipe", *args, "--arm", "here", "--arm", "gone:rev=no-such-revision-0123")
    assert bad.returncode == 1 and bad.stdout == ""  # refused before the first arm ran
    assert bad.stderr.strip().startswith("--arm gone: rev=no-such-revision-0123:") and "code=DIR" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_decode_widths_side_by_side_cpu(tmp_path):
    other = _other_revision(tmp_path)
    out = tmp_path / "widths" / "widths.json"
    proc = _bench(
        "benchmarks.decode_widths",
        *("--out", str(out), "--model", "tiny-random", "--widths", "2,4", "--new-tokens", "4", "--repeats", "1"),
        *("--device", "cpu", "--arm", f"before:code={other}", "--arm", "after", "--logs", str(tmp_path / "logs")),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["widths.json"]  # nothing else beside the JSON
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["after.log", "before.log"]
    rows = json.loads(out.read_text())
    assert [(r["arm"], r["width"], r["mode"]) for r in rows] == [
        (arm, w, mode) for arm in ("before", "after") for w in (2, 4) for mode in ("greedy", "sampled")
    ]
    for r in rows:
        assert r["ran"] and r["gpu"] == "cpu" and r["model"] == "tiny-random" and r["path"] == "eager"
        assert r["ms_per_step"] > 0 and r["text_ms_per_step"] > 0 and r["new_tokens"] == 4
        before = next(b for b in rows if b["arm"] == "before" and (b["width"], b["mode"]) == (r["width"], r["mode"]))
        assert r["over_first"] == r["ms_per_step"] / before["ms_per_step"]
    assert rows[0]["code"] == f"code={other}" and rows[-1]["code"] == "this checkout"
    table = proc.stdout.split("EOS ignored\n")[1].splitlines()
    assert table[0].split() == ["width", "mode", "before", "after", "after/before"]
    assert [line.split()[:2] for line in table[1:5]] == [[w, m] for w in ("2", "4") for m in ("greedy", "sampled")]


def test_a_git_revision_is_exported_with_what_its_library_reads(tmp_path):
    from benchmarks.revisions import code_for_arm

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        import pytest

        pytest.skip("not a git checkout")
    settings = {"rev": "HEAD", "seed": "3"}
    code = code_for_arm("head", settings, tmp_path)
    assert settings == {"seed": "3"} and code.commit == head.stdout.strip()
    assert code.lib == tmp_path / "code" / code.commit[:12] / "lib"
    for part in ("trainer.py", "data_manifests/countdown-2x10.json", "datasets/gsm8k/train.jsonl"):
        assert (code.lib / "grpo_knobs" / part).is_file()
    env = code.env({"PYTHONPATH": "lib"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(code.lib), str(ROOT), "lib"]
    assert env["GIT_CEILING_DIRECTORIES"] == str(tmp_path / "code")  # the run records no commit of ours


def test_batch_invariance_cpu(tmp_path):
    """One prompt alone and first in batches of other make-up, per path and temperature: the JSON says
    whether its response held and how far its log-probs moved (float32 on CPU: tokens hold, log-probs
    move by rounding only)."""
    out = tmp_path / "batch-invariance.json"
    proc = _bench(
        "benchmarks.batch_invariance",
        *("--model", "tiny-random", "--device", "cpu", "--steps", "6", "--rows", "6", "--out", str(out)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["gpu"] == "cpu" and "matmul" not in result  # the GEMM comparison needs CUDA
    rows = result["responses"]
    assert [(r["path"], r["temperature"]) for r in rows] == [(p, t) for p in ("eager", "fast") for t in (0.0, 1.0)]
    for r in rows:
        assert list(r["contexts"]) == ["alone", "with 3 others", "with 3 longer", "with 5 others"]
        assert r["contexts"]["alone"]["max_logprob_gap"] == 0.0  # its own reference
        for c in r["contexts"].values():
            assert c["identical"] and c["max_logprob_gap"] < 1e-4


def test_cold_start_cpu(tmp_path):
    """Two identical tiny runs after prepare: the table's phase rows are the two runs' recorded seconds."""
    out, result = tmp_path / "runs", tmp_path / "cold.json"
    args = ["--out", str(out), "--prepare", "--json", str(result)]
    proc = _bench("benchmarks.cold_start", *args, *run_args())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("grpo-knobs prepare: nothing to compile on CPU")
    assert lines[1].split() == ["phase", "(s)", "first", "second", "first-second"]
    first, second = (json.loads((out / name / "timings.json").read_text()) for name in ("first", "second"))
    rows = [line.split() for line in lines[2:10]]
    assert [r[0] for r in rows] == [
        "generation",
        "trainer",
        "init",
        "evaluation",
        "checkpoint",
        "sync",
        "other",
        "job",
    ]
    for phase, a, b, diff in rows:
        assert (float(a), float(b)) == (round(first[phase], 2), round(second[phase], 2))
        assert float(diff) == round(first[phase] - second[phase], 2)
    saved = json.loads(result.read_text())
    assert saved["runs"]["first"]["timings"] == first and saved["runs"]["second"]["timings"] == second
    assert saved["params"]["model"] == "tiny-random" and saved["params"]["lr"] == "2e-05"  # the recipe under -p
    imports = lines[lines.index("") + 1 :]
    assert imports[0].split()[:2] == ["import", "grpo_knobs.cli"] and len(imports) == 11
    assert all(m in saved["imports"]["first"] for m in ("grpo_knobs.cli", "grpo_knobs"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold.json", "runs"]  # no log files
    again = _bench("benchmarks.cold_start", "--out", str(out))
    assert again.returncode == 1 and again.stderr.strip() == f"{out} already holds run first; give --out a new folder"


def test_garbage_collections_are_timed_while_the_block_runs():
    """A full collection inside the block is counted and timed; one after it is not, and the callback is gone."""
    import gc

    from benchmarks.timeline import garbage_collections

    callbacks = list(gc.callbacks)
    with garbage_collections() as seen:
        gc.collect()
        gc.collect(0)
    assert seen["full"] == 1 and seen["ms"] > 0 and gc.callbacks == callbacks
    before = dict(seen)
    gc.collect()
    assert seen == before


def test_collection_timeline_cpu(tmp_path):
    """Whole collections split into prefill, decode steps by width and host work: the spans and the host
    part add up to each collection's wall time, and every decode step after the prefill's token is counted."""
    result = tmp_path / "timeline.json"
    args = ["--model", "tiny-random", "--prompts", "2", "--group", "3", "--max-new-tokens", "12"]
    proc = _bench(
        "benchmarks.collection_timeline", *args, "--collections", "2", "--path", "fast", "--json", str(result)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collections = json.loads(result.read_text())["collections"]
    assert len(collections) == 2  # the warm-up collection is not reported
    for c in collections:
        assert abs(sum(c["ms"].values()) + c["host_after_ms"] - c["wall_ms"]) < 0.1 * c["wall_ms"]
        assert sum(c["steps"].values()) == c["response_length_max"] - 1  # the prefill emits the first token
        assert set(c["steps"]) == {"step 6"} and c["ms"]["prefill"] > 0
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["span", "ms", "steps", "ms/step", "share"]
    assert [line.split()[0] for line in lines[2:4]] == ["prefill", "step"]


def test_collection_timeline_times_decoder_variants_in_one_run(tmp_path):
    """--arms: one table per decoder variant over the same prompts and seeds, then each one's per-width ratio
    to the first; a name it does not know is refused in one line."""
    result = tmp_path / "timeline.json"
    args = ["--model", "tiny-random", "--prompts", "2", "--group", "3", "--max-new-tokens", "8", "--path", "fast"]
    names = ["default", "own-reads", "eager-prefill"]
    proc = _bench(
        "benchmarks.collection_timeline", *args, "--collections", "1", "--arms", ",".join(names), "--json", str(result)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    arms = json.loads(result.read_text())["arms"]
    assert list(arms) == names and all(len(c) == 1 for c in arms.values())
    lengths = {arm[0]["response_length_mean"] for arm in arms.values()}
    assert len(lengths) == 1  # the variants draw the same responses
    titles = [line for line in proc.stdout.splitlines() if line.startswith("tiny-random on ")]
    assert [t.split(" path, ")[1].split(":")[0] for t in titles] == names
    ratios = [line for line in proc.stdout.splitlines() if line.startswith("ms per step, default / ")]
    assert [r.split(" / ")[1].split(":")[0] for r in ratios] == names[1:]
    assert all("step 6: " in r and "; wall " in r for r in ratios)
    bad = _bench("benchmarks.collection_timeline", *args, "--arms", "default,both")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
        "--arms takes distinct names of default, own-reads, eager-prefill, block-32, own-wide, outputs-after "
        "or attention launch shapes (k16-w1-s4), comma-separated, got 'default,both'"
    )
    bad = _bench("benchmarks.collection_timeline", *args, "--arms", "default,k16-w1")
    assert (
        bad.returncode != 0
        and "an arm is default or k<slots>-w<warps>-s<stages>" in bad.stderr.strip().splitlines()[-1]
    )


def _spying_on_attention(module: str, record: str, report: str) -> str:
    """A ``python -c`` program: ``benchmarks.<module>.main`` on the command line's arguments, every decode
    attention launch appending ``record`` (an expression of the launch's ``grid`` and keywords ``kw``) to
    ``seen``, then ``report`` (which may also read ``original``, kernels.rotary_attention before the run)."""
    return (
        f"import sys; from grpo_knobs.rollout import kernels; from benchmarks import {module} as bench\n"
        "seen = []; launch = kernels._rotary_attention_kernel; original = kernels.rotary_attention\n"
        "class Spy:\n"
        "    def __getitem__(self, grid):\n"
        "        def run(*args, **kw):\n"
        f"            seen.append({record})\n"
        "            return launch[grid](*args, **kw)\n"
        "        return run\n"
        "kernels._rotary_attention_kernel = Spy()\n"
        f"bench.main(sys.argv[1:])\n{report}\n"
    )


def test_collection_timeline_times_attention_launch_shapes(tmp_path):
    """An arm named as an attention launch shape launches the fused path's attention that way in its own
    collections only: the two arms' collections are interleaved, and each launches as many times as the other
    with its own block and stages, so the shape neither leaks into the default arm's steps nor stays set after."""
    result = tmp_path / "timeline.json"
    args = ["--model", "tiny-random", "--prompts", "2", "--group", "2", "--max-new-tokens", "5", "--device", "cpu"]
    code = _spying_on_attention(
        "collection_timeline",
        "(kw['BLOCK_K'], kw['num_stages'], grid[0] * grid[1] < 2 * kernels.sm_count(kernels.torch.device('cpu')))",
        "print('SEEN', sorted((s, seen.count(s)) for s in set(seen)))\n"
        "print('RESTORED', kernels.rotary_attention is original)",
    )
    arms = ["--path", "fused", "--collections", "1", "--arms", "default,k16-w1-s3", "--json", str(result)]
    proc = interpreted(["-c", code, *args, *arms])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(json.loads(result.read_text())["arms"]) == ["default", "k16-w1-s3"]
    from grpo_knobs.rollout import kernels as K

    seen = ast.literal_eval(proc.stdout.split("SEEN ")[1].splitlines()[0])  # [((block, stages, split), launches)]
    arm = [n for (block, stages, _), n in seen if (block, stages) == (16, 3)]
    default = [(shape, n) for shape, n in seen if shape[:2] != (16, 3)]
    assert all(shape[:2] == tuple(K.launch_shape(shape[2]).values()) for shape, _ in default), seen
    assert sum(arm) == sum(n for _, n in default) > 0, seen
    assert "RESTORED True" in proc.stdout


@pytest.mark.parametrize("group", [3, 1], ids=["prompts-repeat", "prompts-distinct"])
def test_host_after_cpu(tmp_path, group):
    """The host work before, with texts decoded per row, now, and streamed block by block, on the tiny model's
    tokenizer: the pieces are timed once all four agree, whether prompts repeat (each decoder row points at a
    distinct prompt row) or not (every decoder row is its own prompt row)."""
    result = tmp_path / "host.json"
    args = ["--model", "tiny-random", "--prompts", "4", "--group", str(group), "--steps", "16", "--mean-length", "9"]
    proc = _bench("benchmarks.host_after", *args, "--reps", "2", "--block", "5", "--json", str(result))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads(result.read_text())
    assert list(saved["ms"]) == ["before", "per row", "after", "streamed"]
    parts = {"prompt rows", "cut rows", "decode texts", "total"}
    assert all(set(saved["ms"][arm]) == parts for arm in ("before", "per row", "after"))
    streamed = saved["ms"]["streamed"]
    assert set(streamed) == {"blocks", "slowest block", "left"}
    assert 0 < streamed["slowest block"] <= streamed["blocks"] and streamed["left"] > 0
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["part", "before", "per", "row", "after", "before/after", "per", "row/after"]
    assert lines[-3].split()[0] == "total"
    assert lines[-2].startswith("streamed in 5-column blocks: ") and "ms left after the last step" in lines[-2]


def test_init_profile_cpu(tmp_path):
    """The recipe's set-up profiled in a fresh process: the init phase it reports is the set-up's, the profile
    lists the set-up, and no run directory is written (the run never trains)."""
    proc = _bench("benchmarks.init_profile", "--out", str(tmp_path / "runs"), "--model", "tiny-random", "--top", "5")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    setup_s = float(first.split("set-up ")[1].split(" s")[0])
    init_s = float(first.split("init phase ")[1].split(" s")[0])
    assert 0 < init_s <= setup_s
    assert "trainer.py" in proc.stdout and "(setup)" in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_side_by_side_trains_the_same_runs_one_and_two_at_a_time_cpu(tmp_path):
    """Two arms of the same two deterministic runs: wall time and job time as ratios to the first arm, and
    each seed's records identical across arms (a run does not depend on what runs beside it)."""
    args = ["--out", str(tmp_path / "side"), "--runs", "2", "--json", str(tmp_path / "side.json"), *run_args("--base")]
    proc = _bench("benchmarks.side_by_side", *args, "--jobs", "1,2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads((tmp_path / "side.json").read_text())
    assert saved["params"]["deterministic"] == "true" and saved["params"]["model"] == "tiny-random"
    one, two = saved["arms"]
    assert (one["jobs"], two["jobs"]) == (1, 2) and sorted(two["job_seconds"]) == ["1", "2"]
    assert one["throughput_ratio"] == 1.0 and two["throughput_ratio"] > 0 and two["identical_to_first"] is True
    names = sorted(p.name for p in (tmp_path / "side" / "jobs-2").iterdir() if not p.name.startswith("."))
    assert names == ["s1", "s1.log", "s2", "s2.log"]
    assert "runs/min" in proc.stdout and proc.stdout.rstrip().endswith("yes")
    again = _bench("benchmarks.side_by_side", *args, "--jobs", "1,2")  # never over finished runs
    assert again.returncode == 2 and "is not empty; give a new --out" in again.stderr
    bad = _bench("benchmarks.side_by_side", "--out", str(tmp_path / "new"), "--jobs", "1,zero")
    assert bad.returncode == 2 and "--jobs takes positive integers" in bad.stderr.strip().splitlines()[-1]


def test_recipe_in_process_trains_arms_one_after_another_cpu(tmp_path):
    """--in-process: the arms train in the benchmark's own process, as a study's inprocess executor trains its
    runs, so the first arm's init holds the imports and the second's does not; each run's garbage collections
    are timed, the second's with the process's objects frozen (gc=freeze, not a run parameter); another
    revision is refused."""
    args = ["--out", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json"), "--in-process", *run_args("--base")]
    proc = _bench("benchmarks.recipe", *args, "--arm", "first:seed=1", "--arm", "second:seed=2,gc=freeze")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, second = json.loads((tmp_path / "r.json").read_text())
    assert first["in_process"] and second["in_process"] and "first (this checkout, in this process)" in proc.stdout
    assert second["timings"]["init"] < first["timings"]["init"] / 2  # the imports were paid once
    assert first["trainer_ms_per_1k_tokens"] > 0 and second["trainer_ms_per_1k_tokens"] > 0
    assert "trainer ms/1k" in proc.stdout
    assert not first["gc"]["freeze"] and second["gc"]["freeze"] and second["overrides"] == {"seed": "2"}
    assert first["gc"]["ms"] > 0 and first["gc"]["ms"] < 1e3 * first["process_seconds"]
    gc_line = next(line for line in proc.stdout.splitlines() if line.startswith("gc s (full) "))
    assert len(gc_line.split()[3:]) == 4  # seconds and (full collections) for each arm
    recorded = json.loads((tmp_path / "runs" / "second" / "config.json").read_text())
    assert recorded["config"]["seed"] == 2 and recorded["config"]["model"] == "tiny-random"
    other = _other_revision(tmp_path)
    bad = _bench("benchmarks.recipe", *args, "--arm", "here", "--arm", f"there:code={other}")
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 2 and "--arm there: an arm in this process runs this checkout's library" in last


def test_recipe_interleaves_fresh_and_in_process_arms_cpu(tmp_path):
    """process=fresh / process=here per arm: one call trains the same seed in a fresh process and in this one
    (the setting is not a run parameter), and on CPU the two runs are identical; an unknown value is refused."""
    args = ["--out", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json"), *run_args("--base")]
    proc = _bench(
        "benchmarks.recipe",
        *args,
        "--arm",
        "fresh:process=fresh,seed=3",
        "--arm",
        "here:process=here,seed=3",
        "--compare",
        "fresh,here",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fresh, here = json.loads((tmp_path / "r.json").read_text())
    assert not fresh["in_process"] and here["in_process"] and "here (this checkout, in this process)" in proc.stdout
    assert fresh["overrides"] == here["overrides"] == {"seed": "3"}
    assert "compare-runs fresh here (exit 0)" in proc.stdout
    bad = _bench("benchmarks.recipe", *args, "--arm", "x:process=elsewhere")
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "--arm x: process=elsewhere: give process=here (this process) or process=fresh"
    )
    bad = _bench("benchmarks.recipe", *args, "--arm", "y:process=fresh,gc=freeze")
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "--arm y: gc=freeze acts on this process; give it with process=here"
    )


def test_launch_floor_cpu(tmp_path):
    """Graphs of empty kernels and of one GEMM: each case's time per launch, the ratio to one program's, and
    what a decode step's count of launches costs at that floor."""
    out = tmp_path / "launch-floor.json"
    proc = _bench("benchmarks.launch_floor", "--reps", "3", "--iters", "1", "--rows", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == ["one program", "4 programs (one per SM)", "torch.mm 8 x 576 x 576"]
    assert all(r["us_per_launch"] > 0 and r["reps"] == 3 for r in rows)
    assert proc.stdout.count("x one program") == 2 and "3 launches at one program's cost: " in proc.stdout


def test_gemm_layouts_cpu(tmp_path):
    """Each of a layer's four products timed per arm (CPU: F.linear and x @ W_t with cuBLAS's name only), with
    the model's shapes, and the best arm's ratio to F.linear printed per row."""
    out = tmp_path / "gemm-layouts.json"
    proc = _bench(
        "benchmarks.gemm_layouts", "--model", "tiny-random", "--rows", "4,8", "--reps", "2", "--iters", "1",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["rows"], r["product"]) for r in rows] == [
        (m, p) for m in (4, 8) for p in ("qkv", "o_proj", "gate_up", "down_proj")
    ]
    assert all(set(r["us"]) == {"linear/cublas", "x@Wt/cublas"} and min(r["us"].values()) > 0 for r in rows)
    ratio = re.compile(r"^ +[48] (qkv|o_proj|gate_up|down_proj) .* (linear|x@Wt)/cublas \d+\.\d\dx$", re.M)
    assert len(ratio.findall(proc.stdout)) == 8, proc.stdout


def test_attention_shapes_cpu(tmp_path):
    """Each arm's engine launches its attention as the arm's name says (the graphs-off CPU path runs every step
    through the patched launch), the default first, and the ratios are to the default's steps."""
    out = tmp_path / "shapes.json"
    args = ["--model", "tiny-random", "--batch", "4", "--new-tokens", "6", "--rounds", "1", "--device", "cpu"]
    code = _spying_on_attention(
        "attention_shapes",
        "(kw['BLOCK_K'], kw['num_stages'], grid[2] > 1, kw['WIDE'])",
        "print('SEEN', sorted(set(seen)))",
    )
    arms = "k16-w1-s2-split16,k16-w1-s3-wide"
    proc = interpreted(["-c", code, *args, "--arms", arms, "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["arm"] for r in rows] == ["default", *arms.split(",")]
    assert rows[0]["over_default"] == 1.0 and all(r["decode_ms_per_step"] > 0 for r in rows)
    seen = [(16, 2, True, False), (16, 3, False, True), (16, 4, False, False)]  # (block, stages, split, 64-bit)
    assert proc.stdout.split("SEEN ")[1].strip() == str(seen)


@pytest.mark.parametrize(
    "name, message",
    [
        ("k32-w1", "k<slots>-w<warps>-s<stages>"),
        ("k32-w1-s2-fast", "unknown part 'fast'"),
        ("k32-w1-s2-exp2", "unknown part 'exp2'"),
    ],
)
def test_attention_arm_names_fail_with_what_is_wrong(name, message):
    from benchmarks.attention_shapes import parse_arms

    with pytest.raises(SystemExit, match=re.escape(message)):
        parse_arms(name)


def test_kernel_resources_reads_the_sm90_build():
    """Decode attention compiled for sm_90 at SmolLM2-135M's shapes, on a machine without a GPU: a 32-slot block
    is 24 tensor-core products in the loop at 16 x 8 x 16 each (32 x 8 scores over D = 64, keys x the 3 query
    heads padded, then their 16 x 64 sums over 32 slots), a 16-slot block 12, and the programs an SM holds follow
    from registers and shared memory."""
    arms = ["--arms", "k32-w1-s2"]
    proc = run_in_root(["-m", "benchmarks.kernel_resources", *arms], TRITON_INTERPRET="0")  # the real compiler
    assert proc.returncode == 0, proc.stderr[-3000:]
    from benchmarks.kernel_resources import programs_per_sm

    rows = {}
    for line in proc.stdout.splitlines()[2:4]:
        name, regs, shared, per_sm, _, loop, *_ = line.split()
        rows[name] = (int(regs), int(shared), int(per_sm), int(loop), int(line.split()[8]))
    assert list(rows) == ["default", "k32-w1-s2"]  # the default at 512 rows: 16-slot blocks
    assert rows["default"][4] == 12 and rows["k32-w1-s2"][4] == 24
    for regs, shared, per_sm, loop, _ in rows.values():
        assert 0 < regs <= 255 and shared > 0 and loop > 0
        assert per_sm == programs_per_sm(regs, shared, 1)
    assert programs_per_sm(162, 10240, 1) == 12  # what Nsight Compute reported for 32-slot blocks on an H200


def test_step_counters_reads_an_h200_profile(capsys):
    """The table of a committed Nsight Compute profile of one 512-row fused step on an H200: every kernel of the
    step once (30 layers x 6 launches, the embedding gather, the final norm, lm_head, the sampler's two launches
    and the step count), attention's 30 launches on one row with their grid, the shares adding up to one."""
    from benchmarks.step_counters import main

    rows = main(["--from-raw", str(ROOT / "benchmarks/results/generation-h200/call-28/ncu-step.txt.gz")])
    assert sum(r["launches"] for r in rows) == 186
    attention = rows[0]
    assert (attention["kernel"], attention["grid"], attention["launches"]) == (
        "_rotary_attention_kernel",
        "(512, 3, 1)",
        30,
    )
    assert 0 < attention["DRAM %"] < 100 and 0 < attention["waves"] < 1  # 1,536 one-warp programs: one wave
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    assert "186 kernels" in capsys.readouterr().out


def test_step_counters_draws_the_step_by_part(tmp_path):
    """The committed H200 profile drawn as one bar: attention, the layers' products, SiLU-gate, lm_head, the
    sampler and the rest, adding up to the kernels' sum; PNG and SVG written; a mark without a number refused."""
    from benchmarks.step_counters import main, part_of

    raw = str(ROOT / "benchmarks/results/generation-h200/call-28/ncu-step.txt.gz")
    rows = main(["--from-raw", raw, "--plot", str(tmp_path / "step.png"), "--mark", "the graphed step=1.446"])
    assert (tmp_path / "step.png").stat().st_size > 0 and (tmp_path / "step.svg").stat().st_size > 0
    parts = {}
    for r in rows:
        parts[part_of(r)] = parts.get(part_of(r), 0) + r["launches"]
    assert parts == {
        "attention": 30,
        "layer products (cuBLAS)": 120,
        "SiLU-gate": 30,
        "lm_head": 1,
        "sampler": 2,
        "other": 3,
    }
    with pytest.raises(SystemExit, match="--mark 'graphed': write it as LABEL=MS"):
        main(["--from-raw", raw, "--mark", "graphed"])


def test_step_counters_refuses_with_what_to_do(tmp_path, monkeypatch):
    from benchmarks.step_counters import find_ncu, main

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="install Nsight Compute on the GPU machine, or .* --from-raw FILE"):
        find_ncu(places=[str(tmp_path / "ncu")])
    with pytest.raises(SystemExit, match="--step 256 is not a decode step of the call: take 1 to 255"):
        main(["--step", "256", "--from-raw", "x"])
    (tmp_path / "log.txt").write_text("==PROF== Connected\nprofiled decode step 128 of 255\n")
    with pytest.raises(SystemExit, match="holds no ncu --csv --page details table"):
        main(["--from-raw", str(tmp_path / "log.txt")])
