"""What a run depends on, recorded beside its results: package versions, the git commit, the library source."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

from .locations import checkout_root

# Set by a Ray task for the process that runs its unit (scheduling._run_unit_in_task) and inherited by a
# notebook kernel it starts, so that a run records the Ray node and task it ran in.
RAY_NODE_ENV = "GRPO_KNOBS_RAY_NODE_ID"
RAY_TASK_ENV = "GRPO_KNOBS_RAY_TASK_ID"

PACKAGES = (
    "grpo-knobs",
    "torch",
    "transformers",
    "safetensors",
    "gguf",
    "accelerate",
    "numpy",
    "pandas",
    "pyarrow",
    "scipy",
    "papermill",
    "triton",
    "liger-kernel",
    "sglang",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(root: Path | None = None) -> str | None:
    """The commit of the checkout this package is imported from (or of ``root``), with ``+dirty`` when
    tracked files differ from it; None for an installed package, whose version is recorded instead."""
    root = root or checkout_root()
    if root is None:
        return None
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def source_sha256(package_dir: Path = Path(__file__).resolve().parent) -> str:
    """One hash over the library's Python sources (relative paths and contents).

    It identifies the training code even where git metadata is missing or stale, as in a
    copy of the working tree sent to a GPU machine.
    """
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if "__pycache__" in rel:
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def placement_device(where: dict) -> str | None:
    """The device a :func:`placement` names, as one key: its GPU's UUID where CUDA gives one, else the host and
    the id ``CUDA_VISIBLE_DEVICES`` listed (or the index); off the GPU, the host and device ("host:cpu")."""
    gpu = where.get("gpu") or {}
    if gpu:
        return gpu.get("uuid") or f"{where.get('hostname')}:{gpu.get('visible_id') or gpu.get('index')}"
    return f"{where.get('hostname')}:{where.get('device')}" if where.get("hostname") else None


def placement(device) -> dict:
    """Where this process trains: the host, the GPU as ``CUDA_VISIBLE_DEVICES`` exposes it (name,
    index in this process, the id it lists, UUID, PCI bus) and, under Ray, the node and task."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu = None
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        ids = [d.strip() for d in visible.split(",")] if visible else []
        gpu = {
            "name": props.name,
            "index": index,  # within this process: CUDA numbers the visible devices from 0
            "visible_id": ids[index] if index < len(ids) else None,  # the id CUDA_VISIBLE_DEVICES gave it
            "uuid": str(props.uuid) if getattr(props, "uuid", None) is not None else None,
            "pci_bus_id": getattr(props, "pci_bus_id", None),
        }
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": str(device),
        "cuda_visible_devices": visible,
        "gpu": gpu,
        "ray_node_id": os.environ.get(RAY_NODE_ENV),
        "ray_task_id": os.environ.get(RAY_TASK_ENV),
    }
