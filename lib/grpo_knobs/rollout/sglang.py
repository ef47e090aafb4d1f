"""Rollouts from an SGLang server, the study's inference engine (one GPU generates, one trains).

Talks to the server's native HTTP API with urllib (no client dependency): `/generate` with token ids
in and token ids, log-probs and finish reasons out; weights travel through disk with
`/update_weights_from_disk`, then `/flush_cache` so no prefix cached under old weights is reused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from .base import Generation, RolloutEngine, cut_at_stop, repeat_prompts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SGLangEngine(RolloutEngine):
    """An SGLang server: launched here (`launch=True`) or attached to at `url`.

    Server settings default to the study's: memory fraction 0.65, at most 512 running requests, CUDA
    graphs up to batch 512. Each response gets its own sampling seed derived from `seed`, so the n
    samples of one prompt differ while a repeated call reproduces them (where SGLang supports
    `sampling_seed`; set send_seed=False for versions that reject it).
    Log-probs are SGLang's for the sampled tokens; at temperature 1 (the study's) they are the sampling
    distribution's.
    """

    def __init__(self, model_path, url: str | None = None, launch: bool = True, tokenizer=None,
                 port: int | None = None, mem_fraction: float = 0.65, max_running_requests: int = 512,
                 cuda_graph_max_bs: int = 512, extra_args=(), startup_timeout: float = 900.0,
                 request_timeout: float = 3600.0, send_seed: bool = True, dtype=torch.bfloat16, log_path=None):
        self.model_path = str(model_path)
        self.request_timeout, self.send_seed, self.dtype = request_timeout, send_seed, dtype
        self.proc, self.log = None, None
        if url is None:
            if not launch:
                raise ValueError("SGLangEngine needs url=... to attach to a running server, or launch=True")
            port = port or _free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
                   "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", str(mem_fraction),
                   "--max-running-requests", str(max_running_requests), "--cuda-graph-max-bs", str(cuda_graph_max_bs),
                   *map(str, extra_args)]
            self.log_path = Path(log_path or tempfile.mkstemp(prefix="sglang-", suffix=".log")[1])
            self.log = open(self.log_path, "w")
            # own process group: close() stops the server and any workers it spawned, nothing else
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = url.rstrip("/")
        self._wait_healthy(startup_timeout)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer = tokenizer
        self.stop_ids = {tokenizer.eos_token_id}
        gen_config = Path(self.model_path) / "generation_config.json"
        if gen_config.is_file():
            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            self.stop_ids |= {eos} if isinstance(eos, int) else set(eos or [])
        self.weights_dir = None

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, path: str, payload, timeout: float | None = None):
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"SGLang {path} returned HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}")
        try:
            return json.loads(body) if body else None
        except json.JSONDecodeError:
            return body.decode(errors="replace")

    def _log_tail(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        return "\n--- server log tail ---\n" + self.log_path.read_text(errors="replace")[-4000:]

    def _wait_healthy(self, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {self.proc.returncode} "
                                   f"before becoming healthy{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.close()
        raise TimeoutError(f"SGLang server at {self.url} not healthy after {timeout:.0f} s{self._log_tail()}")

    # -- engine interface ----------------------------------------------------------------------
    def generate(self, prompt_ids, n: int, max_new_tokens: int, temperature: float, seed: int,
                 ignore_eos: bool = False) -> Generation:
        rows, prompt_index = repeat_prompts(prompt_ids, n)
        base = {"temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "top_p": 1.0,
                "top_k": -1, "min_p": 0.0, "stop_token_ids": sorted(self.stop_ids), "ignore_eos": ignore_eos,
                "skip_special_tokens": True, "no_stop_trim": True}
        if self.send_seed:  # distinct per response, reproducible per call
            sampling = [{**base, "sampling_seed": (seed * 1_000_003 + i) % (2**31 - 1)} for i in range(len(rows))]
        else:
            sampling = base
        outputs = self._request("/generate", {"input_ids": rows, "sampling_params": sampling, "return_logprob": True})
        outputs = outputs if isinstance(outputs, list) else [outputs]
        token_ids, finish, logprobs = [], [], []
        for out in outputs:
            tokens, lps = self._parse(out)
            kept, reason = cut_at_stop(tokens, self.stop_ids)
            token_ids.append(kept)
            finish.append(reason)
            logprobs.append(lps[:len(kept)])
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        return Generation(prompt_index=prompt_index, token_ids=token_ids, texts=texts, finish_reasons=finish,
                          logprobs=logprobs)

    @staticmethod
    def _parse(out) -> tuple[list[int], list[float]]:
        """Response tokens and log-probs, with the stop token kept even where SGLang reports it only as
        the finish reason's `matched` id."""
        meta = out.get("meta_info", {})
        reason = meta.get("finish_reason") or {}
        reason = reason if isinstance(reason, dict) else {"type": str(reason)}
        if reason.get("type") == "abort":
            raise RuntimeError(f"SGLang aborted a request: {reason.get('message', reason)}")
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
        """Write the trainer's weights as safetensors beside the model's config, load them, flush the cache."""
        from safetensors.torch import save_file

        if self.weights_dir is None:
            self.weights_dir = Path(tempfile.mkdtemp(prefix="grpo-knobs-sglang-weights-"))
            for f in Path(self.model_path).iterdir():
                if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name != "model.safetensors.index.json":
                    shutil.copy(f, self.weights_dir / f.name)
        # separate CPU copies: tied weights share storage, which save_file refuses
        tensors = {k: v.detach().to("cpu", self.dtype).clone().contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(self.weights_dir / "model.safetensors"), metadata={"format": "pt"})
        result = self._request("/update_weights_from_disk", {"model_path": str(self.weights_dir)})
        if isinstance(result, dict) and not result.get("success", False):
            raise RuntimeError(f"SGLang update_weights_from_disk failed: {result.get('message', result)}")
        self._request("/flush_cache", {})

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)
            self.weights_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "proc", None) is not None:
            self.close()
