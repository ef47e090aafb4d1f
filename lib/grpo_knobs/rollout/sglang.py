"""Rollouts from an SGLang server, the study's inference engine (one GPU generates, one trains).

Talks to the server's native HTTP API (SGLang 0.5.x, `sglang/srt/entrypoints/http_server.py`) with urllib,
no client dependency: `/generate` with token ids in and token ids, log-probs and finish reasons out; weights
travel through disk with `/update_weights_from_disk`, which also flushes the prefix cache (its `flush_cache`
defaults to true) and sets the `weight_version` that every later `/generate` echoes in `meta_info`.

Faults are bounded: a request that meets HTTP 502/503/504, a reset or refused connection or a timeout is
sent again after an exponentially growing wait (at most `RetryPolicy.max_retries` times); responses that
SGLang aborted without an error status are re-sent alone; a launched server that died is started again
from the latest weights (at most `RetryPolicy.max_restarts` times). `SGLangEngine.stats()` counts both.
A request given up after a timeout does not keep the server busy: SGLang aborts requests whose client
disconnected (`TokenizerManager._wait_one_response`).

Reproducibility on SGLang:
- The server's own RNG is seeded with `--random-seed` (the run seed), but by default SGLang samples on the
  GPU with batch-dependent kernels and ignores each request's `sampling_seed`: which responses share a
  batch, prefill chunk and CUDA graph changes the numerics, so two runs of one seeded config differ in
  their responses (the statistics of the sampling distribution are the same).
- With `deterministic=True` (`--enable-deterministic-inference`) SGLang switches to batch-invariant kernels
  and the pytorch sampling backend and draws every token from the request's `sampling_seed` (42 where a
  request sends none): the same prompt, seed and weights give the same tokens whatever else is in the batch.
  This holds for one SGLang version, GPU model, attention backend and parallel layout; it is slower.
- Weights reach the server in bfloat16 and its log-probs come from its own kernels, so they differ slightly
  from the trainer's; the trainer records that gap (`logprob_mismatch`) instead of assuming it away.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from .base import Generation, RolloutEngine, cut_at_stop, repeat_prompts

# The SGLang releases whose launch flags and HTTP shapes this client was checked against (docs/gpu.md, "SGLang").
SGLANG_TESTED = ">=0.5.20,<=0.5.23"
# Flags `launch_command` sets from the settings; extra arguments may not repeat them.
OWN_FLAGS = (
    "--model-path",
    "--host",
    "--port",
    "--mem-fraction-static",
    "--max-running-requests",
    "--cuda-graph-max-bs-decode",
    "--base-gpu-id",
    "--random-seed",
    "--weight-version",
    "--enable-deterministic-inference",
)
RETRY_STATUS = (502, 503, 504)  # SGLang answers 503 when its queue is full or a request timed out


@dataclass
class ServerSettings:
    """Everything the launched server is started with; `launch_command` turns it into argv."""

    model_path: str = ""
    port: int = 0
    host: str = "127.0.0.1"
    mem_fraction: float = 0.65  # --mem-fraction-static: share of the GPU for weights and KV cache
    max_running_requests: int = 512  # concurrency cap (RunConfig.max_concurrent_sequences)
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs-decode; None: max_running_requests
    base_gpu_id: int | None = None  # first GPU the server uses (CUDA_VISIBLE_DEVICES order); None: SGLang's 0
    random_seed: int | None = None  # --random-seed; None lets SGLang draw one
    deterministic: bool = False  # --enable-deterministic-inference (see the module docstring)
    weight_version: str = "0"  # echoed in every response's meta_info until the first weight update
    extra_args: tuple[str, ...] = ()  # further server flags, passed through after the ones above
    module: str = "sglang.launch_server"  # entry module run with `python -m`
    python: str | None = None  # interpreter of an environment with SGLang; None: this one


def split_server_args(extra: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Extra server flags as argv, refusing the flags the engine sets itself."""
    try:
        args = tuple(shlex.split(extra)) if isinstance(extra, str) else tuple(map(str, extra))
    except ValueError as e:
        raise ValueError(
            f"sglang_server_args {extra!r} is not a shell-quoted list of flags ({e}); balance its quotes."
        ) from None
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise ValueError(
                f"sglang_server_args repeats {flag}, which the engine sets; use its RunConfig field "
                f"instead (sglang_mem_fraction, sglang_base_gpu_id, seed, sglang_deterministic, ...)."
            )
    return args


def launch_command(s: ServerSettings) -> list[str]:
    """The argv that starts the server: the one place its flags are spelled."""
    cmd = [
        s.python or sys.executable,
        "-m",
        s.module,
        "--model-path",
        str(s.model_path),
        "--host",
        s.host,
        "--port",
        str(s.port),
        "--mem-fraction-static",
        str(s.mem_fraction),
        "--max-running-requests",
        str(s.max_running_requests),
        "--cuda-graph-max-bs-decode",
        str(s.cuda_graph_max_bs or s.max_running_requests),
        "--weight-version",
        s.weight_version,
    ]
    if s.base_gpu_id is not None:
        cmd += ["--base-gpu-id", str(s.base_gpu_id)]
    if s.random_seed is not None:
        cmd += ["--random-seed", str(s.random_seed)]
    if s.deterministic:
        cmd.append("--enable-deterministic-inference")
    return cmd + list(split_server_args(s.extra_args))


def default_base_gpu_id(trainer_device: torch.device | str | None, visible: int | None = None) -> int:
    """The first GPU other than the trainer's where two or more are visible, else GPU 0 (shared)."""
    visible = torch.cuda.device_count() if visible is None else visible
    device = torch.device(trainer_device) if trainer_device is not None else torch.device("cpu")
    trainer_gpu = (device.index or 0) if device.type == "cuda" else None
    if visible < 2:
        return 0
    return next(i for i in range(visible) if i != trainer_gpu)


@dataclass
class RetryPolicy:
    """How hard the client tries before a fault ends the run."""

    max_retries: int = 5  # re-sends of one request after a transient fault or an abort
    backoff: float = 1.0  # seconds before the first re-send; doubled each time
    backoff_max: float = 30.0  # longest single wait
    max_restarts: int = 2  # restarts of a launched server that died, over the engine's life

    def delay(self, attempt: int) -> float:
        return min(self.backoff_max, self.backoff * 2**attempt)


def engine_options(cfg) -> dict:
    """SGLangEngine keyword arguments from a RunConfig's `sglang_*` fields, its seed and concurrency cap."""
    server = ServerSettings(
        mem_fraction=cfg.sglang_mem_fraction,
        max_running_requests=cfg.max_concurrent_sequences,
        base_gpu_id=cfg.sglang_base_gpu_id,
        random_seed=cfg.seed,
        deterministic=cfg.sglang_deterministic_resolved,
        extra_args=split_server_args(cfg.sglang_server_args),
        python=cfg.sglang_python,
    )
    retry = RetryPolicy(max_retries=cfg.sglang_max_retries, max_restarts=cfg.sglang_max_restarts)
    return {
        "url": cfg.engine_url,
        "server": server,
        "retry": retry,
        "request_timeout": cfg.sglang_request_timeout,
        "startup_timeout": cfg.sglang_startup_timeout,
    }


class TransientError(RuntimeError):
    """A fault that a later attempt may not meet: 502/503/504, a dropped connection, a timeout."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_message(body) -> str:
    """SGLang's error text: `{"error": {"message"}}`, `{"error": str}`, `{"detail"}` or `{"message"}`."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err or body.get("detail") or body.get("message") or body)
    return str(body)[:2000]


def _parse_body(raw: bytes):
    try:
        return json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return raw.decode(errors="replace")


def _abort_reason(out: dict) -> dict | None:
    reason = out.get("meta_info", {}).get("finish_reason")
    return reason if isinstance(reason, dict) and reason.get("type") == "abort" else None


class SGLangEngine(RolloutEngine):
    """An SGLang server: launched here (`launch=True`) or attached to at `url`.

    `server` holds the launch settings (model path and port are filled in here); `trainer_device` places
    the server on another GPU when `server.base_gpu_id` is None. Each response gets its own
    `sampling_seed` derived from the call's `seed`, so the n samples of one prompt differ and, under
    deterministic inference, a repeated call reproduces them. Log-probs are SGLang's for the sampled
    tokens; at temperature 1 (the study's) they are the sampling distribution's.
    """

    def __init__(
        self,
        model_path,
        url: str | None = None,
        launch: bool = True,
        tokenizer=None,
        *,
        server: ServerSettings | None = None,
        retry: RetryPolicy | None = None,
        trainer_device=None,
        startup_timeout: float = 900.0,
        request_timeout: float = 3600.0,
        send_seed: bool = True,
        dtype=torch.bfloat16,
        log_path=None,
    ):
        self.model_path = str(model_path)
        self.retry = retry or RetryPolicy()
        self.request_timeout, self.startup_timeout = request_timeout, startup_timeout
        self.send_seed, self.dtype = send_seed, dtype
        self.proc, self.log, self.log_path, self.weights_dir = None, None, None, None
        self._temporary_log = False
        self.retries = self.restarts = self.updates = 0
        self.weight_version: str | None = None  # what /generate must echo; None: not known (attached)
        if url is None:
            if not launch:
                raise ValueError("SGLangEngine needs url=... to attach to a running server, or launch=True")
            self.server = self._settings(server, trainer_device)
            self.weight_version = self.server.weight_version
            self._temporary_log = log_path is None
            if log_path is None:
                fd, log_path = tempfile.mkstemp(prefix="sglang-", suffix=".log")
                os.close(fd)
            self.log_path = Path(log_path)
            url = f"http://{self.server.host}:{self.server.port}"
            self._start(self.server)
        self.url = url.rstrip("/")
        self._wait_healthy(startup_timeout)
        self.tokenizer = tokenizer or self._load_tokenizer()
        self.stop_ids = self._stop_ids()
        self.server_version = self._server_version()

    def _server_version(self) -> str | None:
        """SGLang's version as the server reports it (`/server_info`), for the run's records."""
        try:
            with urllib.request.urlopen(self.url + "/server_info", timeout=30) as resp:
                return json.loads(resp.read()).get("version")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError, AttributeError):
            return None

    def _settings(self, server: ServerSettings | None, trainer_device) -> ServerSettings:
        s = server or ServerSettings()
        gpu = s.base_gpu_id if s.base_gpu_id is not None else default_base_gpu_id(trainer_device)
        return dataclasses.replace(s, model_path=self.model_path, port=s.port or _free_port(), base_gpu_id=gpu)

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    def _stop_ids(self) -> set[int]:
        stop = {self.tokenizer.eos_token_id}
        gen_config = Path(self.model_path) / "generation_config.json"
        if gen_config.is_file():
            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            stop |= {eos} if isinstance(eos, int) else set(eos or [])
        return stop

    def stats(self) -> dict:
        """Fault counters since the engine started: re-sent requests, server restarts, current weights."""
        return {"retries": self.retries, "restarts": self.restarts, "weight_version": self.weight_version}

    # -- server process --------------------------------------------------------------------------
    def _start(self, settings: ServerSettings) -> None:
        self.log = open(self.log_path, "a")
        cmd = launch_command(settings)
        try:  # own process group: stopping it ends the server and any workers it spawned, nothing else
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            self.log.close()
            self.log = None
            raise ValueError(
                f"cannot start the SGLang server with {cmd[0]} ({e.strerror}); set sglang_python to "
                f"the Python of an environment where SGLang is installed"
            ) from None

    def _stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:  # the group is gone already
            self.proc.wait()
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def _watchdog(self) -> None:
        """Start a launched server again, from the latest weights, if it has exited."""
        if self.proc is None or self.proc.poll() is None:
            return
        code = self.proc.returncode
        if self.restarts >= self.retry.max_restarts:
            raise RuntimeError(
                f"SGLang server exited with code {code} after {self.restarts} restart(s); see "
                f"{self.log_path}, or raise sglang_max_restarts{self._log_tail()}"
            )
        self._stop()  # reaps workers the dead server left behind, which may still hold GPU memory
        self.restarts += 1
        print(
            f"SGLang server exited with code {code}; restart {self.restarts}/{self.retry.max_restarts}",
            file=sys.stderr,
        )
        latest = str(self.weights_dir) if self.updates else self.model_path
        self._start(dataclasses.replace(self.server, model_path=latest, weight_version=self.weight_version))
        self._wait_healthy(self.startup_timeout)

    def _log_tail(self) -> str:
        if getattr(self, "log_path", None) is None:
            return ""
        if self.log is not None:
            self.log.flush()
        return "\n--- server log tail ---\n" + self.log_path.read_text(errors="replace")[-4000:]

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"SGLang server exited with code {self.proc.returncode} before becoming healthy; "
                    f"its log {self.log_path} says why (no SGLang for {self.proc.args[0]}? set "
                    f"sglang_python){self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, http.client.HTTPException, OSError):
                pass  # 503 while starting, or not listening yet
            time.sleep(0.2 if self.proc is None else 1.0)
        self.close()
        raise TimeoutError(
            f"SGLang server at {self.url} not healthy after {timeout:.0f} s; raise "
            f"sglang_startup_timeout or check the server{self._log_tail()}"
        )

    # -- HTTP ------------------------------------------------------------------------------------
    def _post(self, path: str, payload) -> tuple[int, object]:
        """One POST: (status, parsed body); TransientError for faults worth another attempt."""
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as resp:
                return resp.status, _parse_body(resp.read())
        except urllib.error.HTTPError as e:
            body = _parse_body(e.read())
            if e.code in RETRY_STATUS:
                raise TransientError(f"HTTP {e.code}: {_error_message(body)}") from e
            return e.code, body
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
            raise TransientError(f"{type(e).__name__}: {getattr(e, 'reason', e)}") from e

    def _request(self, path: str, payload) -> tuple[int, object]:
        """POST with bounded retries and exponential backoff; the watchdog runs before every attempt."""
        for attempt in range(self.retry.max_retries + 1):
            self._watchdog()
            try:
                return self._post(path, payload)
            except TransientError as e:
                if attempt == self.retry.max_retries:
                    raise RuntimeError(
                        f"SGLang {path} failed {attempt + 1} times, last with {e}; raise "
                        f"sglang_max_retries or sglang_request_timeout, or check the server"
                    ) from e
                self.retries += 1
                time.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")

    # -- engine interface ------------------------------------------------------------------------
    def generate(
        self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int, ignore_eos: bool = False
    ) -> Generation:
        rows, prompt_index = repeat_prompts(prompt_ids, n)
        base = {
            "temperature": float(temperature),
            "max_new_tokens": int(max_new_tokens),
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "stop_token_ids": sorted(self.stop_ids),
            "ignore_eos": ignore_eos,
            "skip_special_tokens": True,
            "no_stop_trim": True,
        }
        # distinct per response, reproducible per call (used by SGLang under deterministic inference)
        sampling = [
            {**base, "sampling_seed": (seed * 1_000_003 + i) % (2**31 - 1)} if self.send_seed else base
            for i in range(len(rows))
        ]
        token_ids, finish, logprobs = [], [], []
        for out in self._generate_rows(rows, sampling):
            self._check_version(out)
            tokens, lps = self._parse(out)
            kept, reason = cut_at_stop(tokens, self.stop_ids)
            token_ids.append(kept)
            finish.append(reason)
            logprobs.append(lps[: len(kept)])
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        return Generation(
            prompt_index=prompt_index, token_ids=token_ids, texts=texts, finish_reasons=finish, logprobs=logprobs
        )

    def _generate_rows(self, rows: list[list[int]], sampling: list[dict]) -> list[dict]:
        """One `/generate` for all rows; rows SGLang aborted without an error status are sent again."""
        outputs: list[dict] = [{}] * len(rows)
        pending = list(range(len(rows)))
        for attempt in range(self.retry.max_retries + 1):
            batch = self._generate_once([rows[i] for i in pending], [sampling[i] for i in pending])
            for i, out in zip(pending, batch):
                outputs[i] = out
            pending = [i for i in pending if _abort_reason(outputs[i]) is not None]
            if not pending:
                return outputs
            if attempt < self.retry.max_retries:
                self.retries += 1
                time.sleep(self.retry.delay(attempt))
        reason = _abort_reason(outputs[pending[0]])
        raise RuntimeError(
            f"SGLang aborted {len(pending)} request(s) {self.retry.max_retries + 1} times "
            f"({reason.get('message')}); lower max_concurrent_sequences or raise sglang_mem_fraction"
        )

    def _generate_once(self, rows: list[list[int]], sampling: list[dict]) -> list[dict]:
        status, body = self._request(
            "/generate", {"input_ids": rows, "sampling_params": sampling, "return_logprob": True}
        )
        if status != 200:
            raise RuntimeError(f"SGLang /generate rejected the request (HTTP {status}): {_error_message(body)}")
        body = body if isinstance(body, list) else [body]
        if len(body) != len(rows):
            raise RuntimeError(f"SGLang /generate returned {len(body)} responses for {len(rows)} prompts")
        return body

    def _check_version(self, out: dict) -> None:
        served = out.get("meta_info", {}).get("weight_version")
        if self.weight_version is not None and served is not None and served != self.weight_version:
            raise RuntimeError(
                f"SGLang generated with weight_version {served!r}, expected {self.weight_version!r}: "
                f"the last weight update did not reach the server; check its log"
            )

    @staticmethod
    def _parse(out) -> tuple[list[int], list[float]]:
        """Response tokens and log-probs, with the stop token kept even where SGLang reports it only as
        the finish reason's `matched` id."""
        meta = out.get("meta_info", {})
        reason = meta.get("finish_reason") or {}
        reason = reason if isinstance(reason, dict) else {"type": str(reason)}
        pairs = meta.get("output_token_logprobs")  # [[logprob, token_id, text], ...]
        if pairs:
            tokens = [int(p[1]) for p in pairs]
            lps = [float(p[0]) if p[0] is not None else math.nan for p in pairs]
        else:
            tokens = [int(t) for t in out.get("output_ids", [])]
            lps = [math.nan] * len(tokens)
        matched = reason.get("matched")
        if reason.get("type") == "stop" and isinstance(matched, int) and (not tokens or tokens[-1] != matched):
            tokens.append(matched)
            lps.append(math.nan)
        return tokens, lps

    @torch.no_grad()
    def update_weights(self, state_dict) -> None:
        """Write the trainer's weights as safetensors beside the model's config and load them under a new
        `weight_version`; SGLang flushes its prefix cache as part of the update."""
        from safetensors.torch import save_file

        if self.weights_dir is None:
            self.weights_dir = Path(tempfile.mkdtemp(prefix="grpo-knobs-sglang-weights-"))
            for f in Path(self.model_path).iterdir():
                if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name != "model.safetensors.index.json":
                    shutil.copy(f, self.weights_dir / f.name)
        # separate CPU copies: tied weights share storage, which save_file refuses
        tensors = {k: v.detach().to("cpu", self.dtype).clone().contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(self.weights_dir / "model.safetensors"), metadata={"format": "pt"})
        version = str(self.updates + 1)
        status, body = self._request(
            "/update_weights_from_disk", {"model_path": str(self.weights_dir), "weight_version": version}
        )
        if status != 200 or not (isinstance(body, dict) and body.get("success")):
            raise RuntimeError(
                f"SGLang could not load the trainer's weights (HTTP {status}): {_error_message(body)}; "
                f"the server must run the same architecture as {self.model_path}"
            )
        self.updates += 1
        self.weight_version = version

    def close(self) -> None:
        self._stop()
        if self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
            self.weights_dir = None

    def keep_log(self, dest) -> None:
        """Append a launched server's log to ``dest`` (a run's record of its engine; a resumed run's server
        adds its own after the first's), then delete the temporary one. Nothing without a launched server."""
        dest = Path(dest)
        if self.log_path is None or not self.log_path.is_file() or self.log_path == dest:
            return
        if self.log is not None:
            self.log.flush()
        with open(dest, "ab") as out, open(self.log_path, "rb") as log:
            shutil.copyfileobj(log, out)
        if self._temporary_log and self.log is None:  # stopped: nothing writes to it any more
            self.log_path.unlink(missing_ok=True)
            self.log_path = dest

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # a server it launched, or weights it wrote for an attached one, are not left behind
        if getattr(self, "proc", None) is not None or getattr(self, "weights_dir", None) is not None:
            self.close()
