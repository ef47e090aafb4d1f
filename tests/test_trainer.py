"""End-to-end training runs with tiny budgets: records, accounting, resume and refusal to overwrite."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from grpo_knobs.config import RunConfig
from grpo_knobs.grpo import token_logprobs
from grpo_knobs.provenance import source_sha256
from grpo_knobs.records import COLLECTION_FIELDS, EVAL_COLUMNS, TIMING_FIELDS, RunDir, RunExistsError
from grpo_knobs.trainer import Trainer, train

ROOT = Path(__file__).resolve().parents[1]


def tiny_cfg(tmp_path, **kw) -> RunConfig:
    base = dict(
        task="countdown-2x10",
        model="tiny-random",
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        global_batch_size=8,
        response_budget=48,
        eval_every_responses=32,
        eval_problems=4,
        max_new_tokens=8,
        lr=1e-3,
        seed=3,
        output_dir=str(tmp_path / "study"),
        run_id="tiny",
        max_tokens_per_micro_batch=64,
        device="cpu",
    )
    return RunConfig(**(base | kw))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    cfg = tiny_cfg(tmp_path_factory.mktemp("run"))
    return cfg, RunDir(train(cfg, progress=False))


def test_run_records_follow_the_schema_and_the_plan(tiny_run):
    cfg, run = tiny_run
    assert run.state()["status"] == "complete" and run.state()["collections_done"] == 3
    rows = run.collections()
    assert [r["collection"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert set(COLLECTION_FIELDS) <= set(r)
        assert r["prompts"] == 4 and len(r["per_update"]) == 2  # S = 4 x 4 / 8
        assert 0.0 <= r["mixed_group_fraction"] <= 1.0 and 0.0 <= r["truncation_fraction"] <= 1.0
        assert r["response_length_max"] <= cfg.max_new_tokens
        for u in r["per_update"]:
            assert u["micro_batches"] >= 1 and u["grad_norm"] >= 0
    assert [r["responses"] for r in rows] == [16, 32, 48]
    assert [r["updates"] for r in rows] == [2, 4, 6]
    assert rows[-1]["output_tokens_cum"] == sum(r["output_tokens"] for r in rows)
    assert rows[-1]["distinct_prompts"] <= 12

    ev = run.evals()
    assert list(ev.columns) == list(EVAL_COLUMNS)
    assert ev["response"].notna().all()  # the model's own words, kept for reading afterwards
    assert sorted(ev["responses"].unique()) == cfg.eval_points == [0, 32, 48]
    assert (ev.groupby("responses").size() == 4).all()
    assert set(ev["split"]) == {"validation"}
    assert ev.loc[ev.responses == 48, "updates"].iloc[0] == 6

    t = json.loads(run.timings_path.read_text())
    assert set(TIMING_FIELDS) <= set(t)
    assert t["active_phase"] == pytest.approx(t["generation"] + t["trainer"] + t["sync"])
    assert t["other"] == pytest.approx(
        t["job"] - sum(t[k] for k in ("generation", "trainer", "sync", "evaluation", "checkpoint", "init"))
    )
    assert t["generation"] > 0 and t["trainer"] > 0
    for phase in ("generation", "trainer", "sync"):  # per-collection phase seconds add up to the run's
        assert sum(r["seconds"][phase] for r in rows) == pytest.approx(t[phase], rel=1e-6, abs=1e-9)

    conf = json.loads(run.config_path.read_text())
    assert conf["plan"]["num_steps_per_rollout"] == 2 and conf["plan"]["collections"] == 3
    assert conf["config"]["seed"] == 3
    assert set(conf["data"]["splits"]) >= {"train", "validation", "test"}
    assert len(conf["model"]["sha256"]) == 64
    assert conf["packages"]["torch"] and "git_commit" in conf
    assert (
        conf["rollout_path"] == {"auto": "eager", "off": "eager", "on": "fast", "fused": "fused"}[cfg.fast_rollout]
    )  # CPU
    assert conf["source_sha256"] == source_sha256()
    assert (run.final_path / "model.safetensors").exists()

    for r in rows:  # collapse diagnostics
        assert len(r["group_reward_means"]) == 4 and 0.0 <= r["zero_advantage_fraction"] <= 1.0
        assert r["zero_advantage_fraction"] == pytest.approx(1.0 - r["mixed_group_fraction"])  # 0/1 rewards
        assert r["entropy_mean"] > 0
    samples = run.samples()
    assert samples and {s["collection"] for s in samples} == {0, 1, 2}
    per_outcome = pd.DataFrame(samples).groupby(["collection", "reward"]).size()
    assert (per_outcome <= 2).all()


def test_a_rerun_never_overwrites(tiny_run):
    cfg, run = tiny_run
    before = run.collections_path.read_bytes()
    with pytest.raises(RunExistsError, match="resume=True"):
        train(cfg, progress=False)
    resumed = RunConfig(**(cfg.to_dict() | {"resume": True}))
    train(resumed, progress=False)  # already complete: nothing to do
    assert run.collections_path.read_bytes() == before


def test_one_seed_fixes_the_run(tiny_run, tmp_path):
    cfg, run = tiny_run
    again = RunDir(train(RunConfig(**(cfg.to_dict() | {"output_dir": str(tmp_path)})), progress=False))

    def strip(rows):
        clock = ("seconds", "active_seconds", "job_seconds", "per_update")
        return [{k: v for k, v in r.items() if k not in clock} for r in rows]

    assert strip(again.collections()) == strip(run.collections())
    cols = ["responses", "problem_id", "correct", "response_length"]
    pd.testing.assert_frame_equal(again.evals()[cols], run.evals()[cols])


class _Crash(RuntimeError):
    pass


class CrashingTrainer(Trainer):
    """Fails during collection 2, as a killed or crashed job would."""

    def collect(self, collection):
        if collection == 2:
            raise _Crash("injected failure")
        return super().collect(collection)


def crashed_run(cfg: RunConfig, tmp_path) -> tuple[RunConfig, RunDir]:
    """The tiny run, saving resume state every collection, killed by an injected failure."""
    crash_cfg = RunConfig(**(cfg.to_dict() | {"output_dir": str(tmp_path), "resume_every_collections": 1}))
    with pytest.raises(_Crash):
        CrashingTrainer(crash_cfg, progress=False).run_loop()
    return crash_cfg, RunDir(crash_cfg.run_dir)


def test_resume_continues_from_the_last_saved_collection_and_matches(tiny_run, tmp_path):
    cfg, run = tiny_run
    crash_cfg, partial = crashed_run(cfg, tmp_path)
    assert partial.state()["status"] == "failed" and "injected failure" in partial.state()["error"]
    assert len(partial.collections()) == 2  # finished collections survive the crash
    train(RunConfig(**(crash_cfg.to_dict() | {"resume": True})), progress=False)
    assert partial.state()["status"] == "complete"
    keys = ("collection", "responses", "updates", "reward_mean", "output_tokens")
    assert [[r[k] for k in keys] for r in partial.collections()] == [[r[k] for k in keys] for r in run.collections()]
    assert sorted(partial.evals()["responses"].unique()) == [0, 32, 48]
    assert partial.resume_states() == []  # removed once the run is complete


def test_a_resume_that_cannot_load_its_state_marks_the_run_failed(tiny_run, tmp_path):
    crash_cfg, partial = crashed_run(tiny_run[0], tmp_path)
    (partial.latest_resume_state() / "optimizer.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(Exception):
        train(RunConfig(**(crash_cfg.to_dict() | {"resume": True})), progress=False)
    state = partial.state()
    assert state["status"] == "failed" and "optimizer.pt" in state["traceback"]
    assert len(partial.collections()) == 2  # the records already written are kept


@pytest.mark.slow
def test_smollm2_run_through_papermill(tmp_path):
    import papermill as pm

    out = tmp_path / "10_train.ipynb"
    params = dict(
        task="countdown-2x10",
        model="smollm2-135m-instruct",
        rollout_batch_size=2,
        n_samples_per_prompt=4,
        global_batch_size=4,
        response_budget=16,
        eval_every_responses=8,
        eval_problems=4,
        max_new_tokens=24,
        lr=1e-5,
        seed=1,
        output_dir=str(tmp_path / "study"),
        run_id="smol",
        device="cpu",
    )
    pm.execute_notebook(
        str(ROOT / "lib" / "grpo_knobs" / "notebooks" / "10_train.ipynb"),
        str(out),
        parameters=params,
        cwd=str(ROOT),
        progress_bar=False,
        kernel_name="python3",
    )
    run = RunDir(tmp_path / "study" / "smol")
    assert run.is_complete()
    rows = run.collections()
    assert [r["responses"] for r in rows] == [8, 16] and [r["updates"] for r in rows] == [2, 4]
    assert sorted(run.evals()["responses"].unique()) == [0, 8, 16]
    assert json.loads(run.config_path.read_text())["model"]["name"] == "smollm2-135m-instruct"
    executed = json.loads(out.read_text())
    assert any(
        "consumed as S=2 updates of B=4" in "".join(o.get("text", ""))
        for c in executed["cells"]
        for o in c.get("outputs", [])
    )


def test_terminal_test_job_writes_test_rows(tiny_run):
    from grpo_knobs.evaluation import run_test_job

    cfg, run = tiny_run
    path = run_test_job(
        run.path.parent,
        {
            "run_id": cfg.resolved_run_id,
            "task": cfg.task,
            "model": str(run.final_path),
            "max_new_tokens": 8,
            "problems": 5,
            "device": "cpu",
        },
    )
    df = pd.read_parquet(path)
    assert list(df.columns) == list(EVAL_COLUMNS) and len(df) == 5 and set(df.split) == {"test"}
    assert df.problem_id.str.contains("-test-").all()
    with pytest.raises(FileExistsError):
        run_test_job(
            run.path.parent,
            {
                "run_id": cfg.resolved_run_id,
                "task": cfg.task,
                "model": str(run.final_path),
                "max_new_tokens": 8,
                "problems": 5,
                "device": "cpu",
            },
        )


def test_options_run_end_to_end(tmp_path):
    """Dr. GRPO advantages, token-mean loss, a k3 KL penalty and fixed-size micro-batches."""
    cfg = tiny_cfg(
        tmp_path,
        std_normalize_advantages=False,
        loss_aggregation="token-mean",
        kl_coef=0.05,
        micro_batch_size=3,
        max_tokens_per_micro_batch=None,
        response_budget=16,
        eval_every_responses=16,
    )
    run = RunDir(train(cfg, progress=False))
    (row,) = run.collections()
    assert [u["micro_batches"] for u in row["per_update"]] == [3, 3]  # 8 responses in slices of 3, 3, 2
    assert json.loads(run.config_path.read_text())["config"]["kl_coef"] == 0.05


def test_source_hash_follows_the_code_and_nothing_else(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    first = source_sha256(pkg)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-312.py").write_text("cache")
    (pkg / "notes.txt").write_text("not code")
    assert source_sha256(pkg) == first
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    assert source_sha256(pkg) != first
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "sub" / "b.py").rename(pkg / "b.py")  # same contents, another module
    assert source_sha256(pkg) != first


@pytest.mark.parametrize(("trainer_path", "global_batch_size"), [("padded", 16), ("packed", 16), ("packed", 8)])
def test_on_policy_logprob_reuse_drops_the_first_slices_scoring_and_keeps_the_updates(
    tmp_path, monkeypatch, trainer_path, global_batch_size
):
    """P x G = 16 responses in S = 16 / B updates: with reuse, only slices 2..S are scored before the
    updates, and the run's statistics and final weights are those of the run that scores all."""
    import grpo_knobs.packing as packing_mod
    import grpo_knobs.trainer as trainer_mod
    from safetensors.torch import load_file

    calls = []

    def counted(model, mb, temperature=1.0):
        calls.append(mb.response_ids.size(0))  # rows scored in this forward pass
        return token_logprobs(model, mb, temperature)

    packed_logprobs = packing_mod.packed_token_logprobs

    def counted_packed(model, pb, temperature=1.0, **kw):
        calls.append(len(pb.response_split))  # sequences scored in this forward pass
        return packed_logprobs(model, pb, temperature, **kw)

    monkeypatch.setattr(trainer_mod, "token_logprobs", counted)
    monkeypatch.setattr(packing_mod, "packed_token_logprobs", counted_packed)
    finals, rows = {}, {}
    for reuse in (False, True):  # one collection of 4 x 4 responses
        cfg = tiny_cfg(
            tmp_path / str(reuse),
            global_batch_size=global_batch_size,
            response_budget=16,
            eval_every_responses=16,
            reuse_on_policy_logprobs=reuse,
            trainer_path=trainer_path,
        )
        calls.clear()
        run = RunDir(train(cfg, progress=False))
        rows[reuse] = run.collections()[0]
        # the updates' forward passes (16), plus a scoring pass over all 16 or, with reuse, over slices 2..S
        assert sum(calls) == 16 + (16 - global_batch_size if reuse else 16)
        finals[reuse] = load_file(str(run.final_path / "model.safetensors"))
    assert rows[True]["per_update"][0]["ratio_max"] == 1.0 and rows[True]["per_update"][0]["clip_fraction"] == 0.0
    assert len(rows[True]["per_update"]) == 16 // global_batch_size
    for a, b in zip(rows[True]["per_update"], rows[False]["per_update"]):
        for key in ("loss", "grad_norm", "ratio_mean", "approx_kl"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    assert rows[True]["entropy_mean"] == pytest.approx(rows[False]["entropy_mean"], rel=1e-5)  # from the old log-probs
    for name, tensor in finals[False].items():
        torch.testing.assert_close(finals[True][name], tensor, rtol=1e-5, atol=1e-6)
