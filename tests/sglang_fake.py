"""A stand-in for SGLang's native HTTP server (release 0.5.x) with injectable faults, for tests without a GPU.

Every shape below is taken from SGLang's source (python/sglang/...), and tests/test_sglang.py checks the
requests it receives and the replies it sends against SGLang's own types wherever `sglang` imports:
- `/health`: `srt/entrypoints/http_server.py::health_generate`: 503 while the server is starting, then 200.
- `/server_info`: `http_server.py::server_info`, of which only `version` is read.
- `/generate`: request `srt/managers/io_struct.py::GenerateReqInput` (contract: `api/v1/api_types.py::
  GenerateRequest`); a batch gets a list of `{"text", "output_ids", "meta_info"}`
  (`srt/managers/tokenizer_manager.py`, the `out_dict` and `meta_info` built per finished request, and
  `api/v1/api_types.py::GenerateResponse` / `GenerateMetaInfo`); `output_token_logprobs` rows are
  `[logprob, token_id, text]` (`LogprobEntry`); finish reasons are `FINISH_MATCHED_TOKEN` / `FINISH_LENGTH` /
  `FINISH_ABORT.to_json()` (`srt/managers/schedule_batch.py`).
- A full queue: `srt/managers/scheduler.py::_abort_on_queued_limit` aborts with status 503, which
  `TokenizerManager._handle_abort_finish_reason` turns into FastAPI's `HTTPException` body `{"detail": ...}`.
- `/update_weights_from_disk`: request `io_struct.py::UpdateWeightFromDiskReqInput` (fields in
  `UPDATE_FROM_DISK_FIELDS`); reply `{"success", "message", "num_paused_requests"}` with HTTP 200 on success
  and 400 on failure (`http_server.py::update_weights_from_disk`); a `weight_version` is adopted on success
  (`tokenizer_manager.py::update_weights_from_disk`) and echoed in later `meta_info`.
- Launch flags: the subset of `srt/server_args.py` that `grpo_knobs.rollout.sglang.launch_command` emits.

Faults (POST /fake/faults, or `FakeState.faults` in-process): `status_503` replies 503 to the next N
generate requests, `slow` delays the next N by `delay` seconds, `abort_rows` aborts the first N rows of the
next generate (SGLang's plain `FINISH_ABORT()`, no status code), `crash` exits the process on the next
generate, `reject_update` fails the next weight update, `stale_version` reports an old weight version.
With GRPO_KNOBS_FAKE_SGLANG_CRASH=always every process crashes on its first generate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# io_struct.py::UpdateWeightFromDiskReqInput, including BaseReq's rid and http_worker_ipc
UPDATE_FROM_DISK_FIELDS = (
    "rid",
    "http_worker_ipc",
    "model_path",
    "load_format",
    "abort_all_requests",
    "weight_version",
    "is_async",
    "torch_empty_cache",
    "keep_pause",
    "recapture_cuda_graph",
    "token_step",
    "flush_cache",
    "manifest",
)
EOS = 2  # the tiny-random test model's eos_token_id


class FakeState:
    """What the fake server knows: its weights, the requests it saw, the faults still to inject."""

    def __init__(self, model_path: str = "", weight_version: str = "default", starting: int = 2):
        self.model_path, self.weight_version, self.starting = model_path, weight_version, starting
        self.requests: list[tuple[str, object]] = []
        self.replies: list[object] = []
        self.faults: dict = {}
        self.lock = threading.Lock()

    def take(self, name: str) -> bool:
        """Consume one unit of a counted fault."""
        with self.lock:
            left = self.faults.get(name, 0)
            if left:
                self.faults[name] = left - 1
            return bool(left)


def completion(ids: list[int], params: dict, weight_version: str) -> dict:
    """One response: tokens a, a+1 from the request's seed, then EOS; an even seed lists EOS in the
    log-probs, an odd one reports it only as the finish reason's `matched` (as with trimmed stops);
    input [9] or a cap under 3 tokens runs to the length cap."""
    seed = params.get("sampling_seed") or 0
    cap = params.get("max_new_tokens", 128)
    tokens = [100 + seed % 100, 101 + seed % 100, EOS][:cap]
    if ids == [9] or cap < 3:
        tokens, reason = tokens[:2], {"type": "length", "length": min(cap, 2)}
    elif seed % 2 == 0:
        reason = {"type": "stop", "matched": EOS}
    else:
        tokens, reason = tokens[:2], {"type": "stop", "matched": EOS}
    meta = {
        "id": uuid.uuid4().hex,
        "finish_reason": reason,
        "prompt_tokens": len(ids),
        "weight_version": weight_version,
        "completion_tokens": len(tokens),
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "output_token_logprobs": [[-0.5 * (j + 1), t, None] for j, t in enumerate(tokens)],
    }
    return {"text": "", "output_ids": tokens, "meta_info": meta}


def aborted(ids: list[int], weight_version: str) -> dict:
    """schedule_batch.py::FINISH_ABORT().to_json(): the request was dropped, with no error status."""
    reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    meta = {
        "id": uuid.uuid4().hex,
        "finish_reason": reason,
        "prompt_tokens": len(ids),
        "weight_version": weight_version,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "output_token_logprobs": [],
    }
    return {"text": "", "output_ids": [], "meta_info": meta}


def generate(state: FakeState, body: dict) -> tuple[int, object]:
    rows, params = body.get("input_ids"), body.get("sampling_params")
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], list):
        return 400, {"error": {"message": "input_ids must be a list of token-id lists"}}
    params = params if isinstance(params, list) else [params or {}] * len(rows)
    if len(params) != len(rows):
        return 400, {"error": {"message": "sampling_params and input_ids differ in length"}}
    version = "stale" if state.faults.get("stale_version") else state.weight_version
    n_abort = state.faults.pop("abort_rows", 0)
    return 200, [
        aborted(ids, version) if i < n_abort else completion(ids, p, version)
        for i, (ids, p) in enumerate(zip(rows, params))
    ]


def update_from_disk(state: FakeState, body: dict) -> tuple[int, object]:
    unknown = sorted(set(body) - set(UPDATE_FROM_DISK_FIELDS))
    path = Path(str(body.get("model_path", "")))
    if unknown or state.take("reject_update") or not list(path.glob("*.safetensors")):
        why = f"unknown fields {unknown}" if unknown else f"no safetensors in {path}"
        return 400, {"success": False, "message": f"Failed to update weights: {why}.", "num_paused_requests": 0}
    state.model_path = str(path)
    message = "Succeeded to update model weights."
    if body.get("weight_version") is not None:
        state.weight_version = body["weight_version"]
        message += f" Weight version updated to {state.weight_version}."
    return 200, {"success": True, "message": message, "num_paused_requests": 0}


def make_handler(state: FakeState):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                self._reply(503 if state.take("starting_left") else 200, None)
            elif self.path == "/server_info":  # http_server.py::server_info: the launch settings plus these
                self._reply(200, {"version": "fake", "frontend": "python", "weight_version": state.weight_version})
            elif self.path == "/fake/state":
                self._reply(
                    200,
                    {
                        "model_path": state.model_path,
                        "weight_version": state.weight_version,
                        "requests": state.requests,
                        "pid": os.getpid(),
                    },
                )
            else:
                self._reply(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
            if self.path == "/fake/faults":
                state.faults.update(body)
                return self._reply(200, state.faults)
            state.requests.append((self.path, body))
            if self.path == "/generate":
                if state.faults.get("crash") or os.environ.get("GRPO_KNOBS_FAKE_SGLANG_CRASH") == "always":
                    os._exit(1)  # like a scheduler process dying: the connection drops mid-request
                if state.take("slow"):
                    time.sleep(state.faults.get("delay", 2.0))
                if state.take("status_503"):
                    return self._reply(503, {"detail": "The request queue is full."})
                status, reply = generate(state, body)
            elif self.path == "/update_weights_from_disk":
                status, reply = update_from_disk(state, body)
            else:
                status, reply = 404, {"detail": "Not Found"}
            state.replies.append(reply)
            self._reply(status, reply)

        def _reply(self, status: int, payload) -> None:
            data = b"" if payload is None else json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, *args):
            pass

    return Handler


def serve(state: FakeState, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the fake in a background thread; `server.server_port` is its port, `shutdown()` stops it."""
    state.faults.setdefault("starting_left", state.starting)
    server = ThreadingHTTPServer((host, port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def parse_launch_args(argv: list[str]) -> argparse.Namespace:
    """The launch flags `launch_command` emits, with SGLang's names and defaults (srt/server_args.py)."""
    p = argparse.ArgumentParser(prog="sglang_fake", allow_abbrev=False)
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--weight-version", default="default")
    for flag, kind in (
        ("--mem-fraction-static", float),
        ("--max-running-requests", int),
        ("--cuda-graph-max-bs-decode", int),
        ("--base-gpu-id", int),
        ("--random-seed", int),
    ):
        p.add_argument(flag, type=kind)
    p.add_argument("--enable-deterministic-inference", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_launch_args(sys.argv[1:] if argv is None else argv)
    state = FakeState(model_path=args.model_path, weight_version=args.weight_version)
    server = serve(state, args.host, args.port)
    print(f"fake SGLang on {args.host}:{server.server_port}, weights {args.model_path}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
