"""The SGLang engine: its launch command under SGLang's own parser, the HTTP client against a fake server
whose shapes are checked against SGLang's source, and the faults it must survive (503 bursts, slow
replies, aborted rows, a crashed server, a failed or lost weight update)."""

import ast
import dataclasses
import importlib
import importlib.util
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
import sglang_fake
import torch
from grpo_knobs.config import RunConfig
from grpo_knobs.models import fetch_model, load_model
from grpo_knobs.records import RunDir
from grpo_knobs.rollout.sglang import (
    RetryPolicy,
    ServerSettings,
    SGLangEngine,
    default_base_gpu_id,
    engine_options,
    launch_command,
    split_server_args,
)
from grpo_knobs.trainer import Trainer

FAST = RetryPolicy(max_retries=2, backoff=0.01, backoff_max=0.05, max_restarts=1)
INSTALL = "pip install --no-deps --target .venv/sglang-api -r tests/sglang-api-requirements.txt"


def sglang_source() -> Path | None:
    """Where SGLang's package lies, without importing it; None where it is not installed."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    return Path(spec.submodule_search_locations[0]) if spec is not None else None


def sglang_module(name: str):
    """Import part of SGLang, or skip with the reason and the install line."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"SGLang's own code does not import here ({e}); to run this check: {INSTALL}")


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = load_model("tiny-random")
    return model, tokenizer


@pytest.fixture
def fake():
    state = sglang_fake.FakeState(weight_version="default")
    server = sglang_fake.serve(state)
    yield state, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def attach(url, tokenizer, **kw) -> SGLangEngine:
    return SGLangEngine(
        fetch_model("tiny-random"), url=url, launch=False, tokenizer=tokenizer, retry=kw.pop("retry", FAST), **kw
    )


# ----------------------------------------------------------------------------- launch command
def settings(**kw) -> ServerSettings:
    base = dict(
        model_path="/models/qwen",
        port=31234,
        mem_fraction=0.5,
        max_running_requests=256,
        base_gpu_id=1,
        random_seed=7,
        deterministic=True,
        weight_version="0",
        extra_args=("--log-level", "warning"),
    )
    return ServerSettings(**(base | kw))


def test_launch_command_parses_with_sglangs_parser():
    server_args = sglang_module("sglang.srt.server_args")
    parsed = server_args.prepare_server_args(launch_command(settings())[3:])
    assert (parsed.model_path, parsed.host, parsed.port) == ("/models/qwen", "127.0.0.1", 31234)
    assert (parsed.mem_fraction_static, parsed.max_running_requests) == (0.5, 256)
    assert parsed.cuda_graph_max_bs_decode == 256
    assert (parsed.base_gpu_id, parsed.random_seed, parsed.enable_deterministic_inference) == (1, 7, True)
    assert (parsed.weight_version, parsed.log_level) == ("0", "warning")
    plain = server_args.prepare_server_args(
        launch_command(settings(random_seed=None, deterministic=False, base_gpu_id=None, extra_args=()))[3:]
    )
    assert (plain.random_seed, plain.enable_deterministic_inference, plain.base_gpu_id) == (None, False, 0)
    with pytest.raises(SystemExit):  # the flag this client used to send is ambiguous in SGLang 0.5.x
        server_args.prepare_server_args(["--model-path", "/m", "--cuda-graph-max-bs", "512"])


def test_launch_command_options():
    cmd = launch_command(settings(random_seed=None, deterministic=False, extra_args="--log-level warning"))
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-2:] == ["--log-level", "warning"]
    assert "--random-seed" not in cmd and "--enable-deterministic-inference" not in cmd
    assert cmd[cmd.index("--cuda-graph-max-bs-decode") + 1] == "256"
    assert launch_command(settings(cuda_graph_max_bs=64)).count("64") == 1
    assert launch_command(settings(python="/envs/sglang/bin/python"))[0] == "/envs/sglang/bin/python"
    with pytest.raises(ValueError, match="--random-seed, which the engine sets"):
        split_server_args("--random-seed=3")
    # the fake server accepts exactly what the engine launches
    args = sglang_fake.parse_launch_args(launch_command(settings(extra_args=()))[3:])
    assert (args.port, args.weight_version, args.base_gpu_id) == (31234, "0", 1)


def test_default_gpu_is_not_the_trainers():
    assert default_base_gpu_id("cuda:0", visible=2) == 1
    assert default_base_gpu_id("cuda", visible=2) == 1
    assert default_base_gpu_id("cuda:1", visible=4) == 0
    assert default_base_gpu_id("cuda:0", visible=1) == 0  # one GPU: shared, within mem_fraction
    assert default_base_gpu_id("cpu", visible=2) == 0


def run_config(tmp_path, **kw) -> RunConfig:
    base = dict(
        task="countdown-2x10",
        model="tiny-random",
        engine="sglang",
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        global_batch_size=4,
        response_budget=8,
        eval_every_responses=8,
        eval_problems=2,
        max_new_tokens=4,
        seed=3,
        output_dir=str(tmp_path),
        run_id="sglang",
        max_tokens_per_micro_batch=64,
        device="cpu",
        max_concurrent_sequences=64,
    )
    return RunConfig(**(base | kw))


def test_run_config_reaches_the_server_flags(tmp_path):
    cfg = run_config(
        tmp_path,
        sglang_mem_fraction=0.4,
        sglang_base_gpu_id=2,
        sglang_deterministic=True,
        sglang_server_args="--log-level warning",
        sglang_max_retries=7,
        sglang_max_restarts=0,
    )
    options = engine_options(cfg)
    cmd = launch_command(dataclasses.replace(options["server"], model_path="/m", port=1))
    for flag, value in (
        ("--mem-fraction-static", "0.4"),
        ("--base-gpu-id", "2"),
        ("--random-seed", "3"),
        ("--max-running-requests", "64"),
        ("--log-level", "warning"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--enable-deterministic-inference" in cmd
    assert (options["retry"].max_retries, options["retry"].max_restarts) == (7, 0)
    for bad, message in (
        (dict(sglang_server_args="--port 5"), "--port, which the engine sets"),
        (dict(sglang_server_args="--log-level 'warn"), "balance its quotes"),
        (dict(sglang_mem_fraction=1.0), "sglang_mem_fraction must lie in"),
        (dict(sglang_base_gpu_id=-1), "sglang_base_gpu_id must be"),
        (dict(sglang_max_retries=-1), "sglang_max_retries must be"),
        (dict(sglang_request_timeout=0), "sglang_request_timeout must be"),
    ):
        with pytest.raises(ValueError, match=message):
            run_config(tmp_path, **bad)


def test_trainer_runs_on_the_fake_server(fake, tmp_path, monkeypatch):
    """A run on an attached server: one versioned update per collection, and the weights written for the
    server are deleted when the run ends (a study of many runs would otherwise fill the temporary folder)."""
    state, url = fake
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    trainer = Trainer(run_config(tmp_path, engine_url=url), progress=False)  # held: its engine is not collected
    run = RunDir(trainer.run_loop())
    assert len(run.collections()) == 2
    paths = [p for p, _ in state.requests]
    assert paths.count("/update_weights_from_disk") == 2 and "/flush_cache" not in paths
    assert state.weight_version == "2"  # one versioned update per collection
    written = {body["model_path"] for p, body in state.requests if p == "/update_weights_from_disk"}
    assert len(written) == 1 and Path(written.pop()).parent == scratch
    assert list(scratch.iterdir()) == []


# ----------------------------------------------------------------------------- the fake against SGLang
def sglang_class(relpath: str, name: str, namespace: dict):
    """Define one of SGLang's request classes from its own source (its module needs CUDA-only imports)."""
    if sglang_source() is None:
        pytest.skip(f"sglang is not installed; to run this check: {INSTALL}")
    source = (sglang_source() / relpath).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    node.decorator_list = []
    exec(compile(ast.Module([node], []), relpath, "exec"), namespace)
    return namespace[name]


def update_from_disk_type():
    import typing

    import msgspec

    class BaseReq(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):  # io_struct.BaseReq's fields
        rid: typing.Optional[str] = None
        http_worker_ipc: typing.Optional[str] = None

    namespace = {**vars(typing), "BaseReq": BaseReq}
    return sglang_class("srt/managers/io_struct.py", "UpdateWeightFromDiskReqInput", namespace)


def test_fake_speaks_sglangs_api(fake, tiny):
    api = sglang_module("sglang.api.v1.api_types")
    model, tokenizer = tiny
    state, url = fake
    engine = attach(url, tokenizer)
    engine.generate([[5, 6], [9]], n=2, max_new_tokens=4, temperature=1.0, seed=3)
    state.faults["abort_rows"] = 1
    engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=3)
    engine.update_weights(model.state_dict())
    update_type = update_from_disk_type()
    assert set(update_type.__struct_fields__) == set(sglang_fake.UPDATE_FROM_DISK_FIELDS)
    import msgspec

    finishes = set()
    for (path, body), reply in zip(state.requests, state.replies):
        if path == "/generate":
            api.GenerateRequest.from_json_value(body)  # SGLang's /generate contract check (400 on failure)
            for out in reply:
                meta = out["meta_info"]
                # keys tokenizer_manager.py emits that the contract of 0.5.20-0.5.22 does not list yet
                emitted = {"weight_version", "cached_tokens", "reasoning_tokens"}
                assert set(meta) <= set(api.GenerateMetaInfo.__struct_fields__) | emitted, set(meta)
                decoded = api.GenerateResponse.from_json_value(out).meta_info
                assert [e.token_id for e in decoded.output_token_logprobs] == out["output_ids"]
                finishes.add(type(decoded.finish_reason).__name__)
        else:
            msgspec.convert(body, update_type)  # SGLang's UpdateWeightFromDiskReqInput, unknown keys refused
            assert reply["success"] and set(reply) == {"success", "message", "num_paused_requests"}
    assert finishes == {"FinishStop", "FinishLength", "FinishAbort"}
    with pytest.raises(msgspec.ValidationError):  # the check can fail
        msgspec.convert({"model_path": "/m", "flush": True}, update_type)


# ----------------------------------------------------------------------------- client behaviour
def test_generate_and_update(fake, tiny):
    model, tokenizer = tiny
    state, url = fake
    engine = attach(url, tokenizer)
    gen = engine.generate([[5, 6], [9]], n=2, max_new_tokens=4, temperature=1.0, seed=4)
    path, body = state.requests[-1]
    assert path == "/generate" and body["input_ids"] == [[5, 6], [5, 6], [9], [9]] and body["return_logprob"]
    seeds = [sp["sampling_seed"] for sp in body["sampling_params"]]
    assert len(set(seeds)) == 4
    assert all(
        sp["top_k"] == -1 and sp["top_p"] == 1.0 and sp["stop_token_ids"] == [2] for sp in body["sampling_params"]
    )
    assert gen.prompt_index == [0, 0, 1, 1] and gen.finish_reasons == ["stop", "stop", "length", "length"]
    a, b = 100 + seeds[0] % 100, 100 + seeds[1] % 100
    assert gen.token_ids[:2] == [[a, a + 1, 2], [b, b + 1, 2]]  # EOS kept, also when only "matched"
    even = 0 if seeds[0] % 2 == 0 else 1
    assert gen.logprobs[even] == [-0.5, -1.0, -1.5] and torch.isnan(torch.tensor(gen.logprobs[1 - even][2]))
    assert engine.stats() == {"retries": 0, "restarts": 0, "weight_version": None}  # attached: not known yet
    assert engine.server_version == "fake"
    engine.update_weights(model.state_dict())
    path, body = state.requests[-1]
    assert path == "/update_weights_from_disk" and body["weight_version"] == "1"  # no separate /flush_cache
    weights = Path(body["model_path"])
    assert (weights / "model.safetensors").is_file() and (weights / "config.json").is_file()
    engine.generate([[5, 6]], n=1, max_new_tokens=4, temperature=1.0, seed=4)
    assert state.replies[-1][0]["meta_info"]["weight_version"] == "1" == engine.stats()["weight_version"]
    engine.close()
    assert not weights.exists()


def test_retries_503_bursts_with_backoff(fake, tiny):
    state, url = fake
    engine = attach(url, tiny[1])
    clean = engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
    state.faults["status_503"] = 2
    again = engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
    assert again.token_ids == clean.token_ids and engine.stats()["retries"] == 2
    state.faults["status_503"] = 3  # one more than max_retries allows
    with pytest.raises(RuntimeError, match=r"failed 3 times, last with .*HTTP 503: The request queue is full"):
        engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
    assert engine.stats()["retries"] == 4


def test_retries_a_slow_reply(fake, tiny):
    state, url = fake
    engine = attach(url, tiny[1], request_timeout=0.5)
    state.faults.update(slow=1, delay=1.5)
    gen = engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
    assert gen.finish_reasons == ["stop", "stop"] and engine.stats()["retries"] == 1
    assert [p for p, _ in state.requests].count("/generate") == 2


def test_resends_only_aborted_rows(fake, tiny):
    state, url = fake
    engine = attach(url, tiny[1])
    clean = engine.generate([[5, 6], [7]], n=2, max_new_tokens=4, temperature=1.0, seed=2)
    state.faults["abort_rows"] = 3
    again = engine.generate([[5, 6], [7]], n=2, max_new_tokens=4, temperature=1.0, seed=2)
    assert again.token_ids == clean.token_ids and engine.stats()["retries"] == 1
    first, resent = state.requests[-2][1], state.requests[-1][1]
    assert resent["input_ids"] == first["input_ids"][:3]
    assert resent["sampling_params"] == first["sampling_params"][:3]  # same seeds: same samples


def test_weight_update_failures_are_caught(fake, tiny):
    model, tokenizer = tiny
    state, url = fake
    engine = attach(url, tokenizer)
    engine.update_weights(model.state_dict())
    state.faults["reject_update"] = 1
    with pytest.raises(RuntimeError, match=r"HTTP 400\): Failed to update weights"):
        engine.update_weights(model.state_dict())
    assert engine.stats()["weight_version"] == "1" and state.weight_version == "1"
    state.faults["stale_version"] = True  # a server that kept serving older weights
    with pytest.raises(RuntimeError, match="weight_version 'stale', expected '1'"):
        engine.generate([[5, 6]], n=1, max_new_tokens=4, temperature=1.0, seed=0)
    engine.close()


# ----------------------------------------------------------------------------- a launched (fake) server
@pytest.fixture
def launched_fake(monkeypatch):
    """Launch settings that start tests/sglang_fake.py as the server process, with the engine's own argv."""
    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests_dir, *sys.path]))
    return ServerSettings(module="sglang_fake", random_seed=1)


def fake_state(engine) -> dict:
    import json

    with urllib.request.urlopen(engine.url + "/fake/state", timeout=5) as resp:
        return json.loads(resp.read())


def post_faults(engine, **faults) -> None:
    import json

    req = urllib.request.Request(engine.url + "/fake/faults", data=json.dumps(faults).encode(), method="POST")
    urllib.request.urlopen(req, timeout=5).close()


def test_watchdog_restarts_a_crashed_server(launched_fake, tiny, tmp_path):
    model, tokenizer = tiny
    with SGLangEngine(
        fetch_model("tiny-random"),
        tokenizer=tokenizer,
        server=launched_fake,
        retry=FAST,
        startup_timeout=60,
        log_path=tmp_path / "server.log",
    ) as engine:
        assert engine.stats()["weight_version"] == "0" and fake_state(engine)["weight_version"] == "0"
        engine.update_weights(model.state_dict())
        clean = engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
        first_pid = fake_state(engine)["pid"]
        post_faults(engine, crash=True)
        again = engine.generate([[5, 6]], n=2, max_new_tokens=4, temperature=1.0, seed=1)
        assert again.token_ids == clean.token_ids
        assert engine.stats() == {"retries": 1, "restarts": 1, "weight_version": "1"}
        after = fake_state(engine)  # the new server started from the latest weights, under their version
        assert after["pid"] != first_pid and after["weight_version"] == "1"
        assert after["model_path"] == str(engine.weights_dir)
    assert engine.proc is None


@pytest.fixture
def runs_launch_the_fake(launched_fake, monkeypatch):
    """A run's own server settings, started as the fake: RunConfig has no field for the server's module."""
    import grpo_knobs.rollout.sglang as sglang_mod

    monkeypatch.setattr(sglang_mod, "ServerSettings", lambda **kw: dataclasses.replace(launched_fake, **kw))


def test_a_run_keeps_its_launched_servers_log(runs_launch_the_fake, tmp_path, monkeypatch):
    """The server a run launched writes its log into the run's directory once stopped, a failed run's too,
    and the resumed run's server adds its own: nothing is left in the temporary folder."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cfg = run_config(tmp_path, sglang_startup_timeout=60, eval_every_responses=4)  # a saved state after one
    sync = Trainer.sync_weights
    calls = []

    def second_sync_fails(self):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the second weight sync failed")
        return sync(self)

    monkeypatch.setattr(Trainer, "sync_weights", second_sync_fails)
    trainer = Trainer(cfg, progress=False)
    with pytest.raises(RuntimeError, match="second weight sync"):
        trainer.run_loop()
    log = trainer.run.path / "sglang-server.log"
    assert log.read_text().count("fake SGLang on ") == 1
    assert trainer.engine.proc is None and list(scratch.iterdir()) == []
    resumed = Trainer(dataclasses.replace(cfg, resume=True), progress=False)
    resumed.run_loop()
    assert RunDir(resumed.run.path).is_complete()
    assert log.read_text().count("fake SGLang on ") == 2
    assert list(scratch.iterdir()) == []


def test_a_log_that_cannot_be_kept_does_not_fail_the_run(runs_launch_the_fake, tmp_path, monkeypatch, capsys):
    def full_disk(self, dest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SGLangEngine, "keep_log", full_disk)
    trainer = Trainer(run_config(tmp_path, sglang_startup_timeout=60), progress=False)
    assert RunDir(trainer.run_loop()).is_complete()
    err = capsys.readouterr().err
    assert f"the SGLang server's log stays at {trainer.engine.log_path}: [Errno 28] No space left" in err
    trainer.engine.log_path.unlink()


def test_watchdog_gives_up_after_max_restarts(launched_fake, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_KNOBS_FAKE_SGLANG_CRASH", "always")
    engine = SGLangEngine(
        fetch_model("tiny-random"),
        tokenizer=tiny[1],
        server=launched_fake,
        retry=FAST,
        startup_timeout=60,
        log_path=tmp_path / "server.log",
    )
    try:
        with pytest.raises(RuntimeError, match=r"exited with code 1 after 1 restart\(s\).*sglang_max_restarts"):
            engine.generate([[5, 6]], n=1, max_new_tokens=4, temperature=1.0, seed=1)
        assert engine.stats()["restarts"] == 1
    finally:
        engine.close()


# ----------------------------------------------------------------------------- the real server
SGLANG_PYTHON = os.environ.get("GRPO_KNOBS_SGLANG_PYTHON")  # an environment with SGLang and its CUDA torch


@pytest.mark.skipif(
    not torch.cuda.is_available() or not SGLANG_PYTHON,
    reason="needs a GPU and GRPO_KNOBS_SGLANG_PYTHON naming the Python of an SGLang environment",
)
@pytest.mark.gpu
def test_sglang_engine_smoke():
    model, tokenizer, _ = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    server = ServerSettings(random_seed=0, deterministic=True, python=SGLANG_PYTHON)
    with SGLangEngine(fetch_model("smollm2-135m-instruct"), tokenizer=tokenizer, server=server) as engine:
        gen = engine.generate([prompt, prompt[:-3]], n=2, max_new_tokens=16, temperature=1.0, seed=0)
        assert gen.prompt_index == [0, 0, 1, 1] and len(gen.logprobs[0]) == len(gen.token_ids[0])
        for tokens, reason in zip(gen.token_ids, gen.finish_reasons):
            assert (reason == "stop") == (tokens[-1] == tokenizer.eos_token_id)
        repeat = engine.generate([prompt, prompt[:-3]], n=2, max_new_tokens=16, temperature=1.0, seed=0)
        assert repeat.token_ids == gen.token_ids  # deterministic inference: same seeds, same samples
        greedy = engine.generate([prompt], n=1, max_new_tokens=16, temperature=0, seed=0)
        assert "5" in greedy.texts[0]
        engine.update_weights({k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()})
        assert engine.generate([prompt], n=1, max_new_tokens=16, temperature=0, seed=0).token_ids != greedy.token_ids
        assert engine.stats()["weight_version"] == "1"


def test_missing_server_python_is_one_line(tiny, tmp_path):
    server = ServerSettings(python=str(tmp_path / "no-such-python"))
    with pytest.raises(ValueError, match="set sglang_python to the Python of an environment where SGLang"):
        SGLangEngine(fetch_model("tiny-random"), tokenizer=tiny[1], server=server, log_path=tmp_path / "log")


def test_server_that_cannot_start_names_its_log(tiny, tmp_path):
    server = ServerSettings(module="no_such_sglang_module")
    with pytest.raises(
        RuntimeError, match=r"(?s)exited with code 1 before becoming healthy.*No module named no_such_sglang_module"
    ):
        SGLangEngine(
            fetch_model("tiny-random"), tokenizer=tiny[1], server=server, startup_timeout=60, log_path=tmp_path / "log"
        )
