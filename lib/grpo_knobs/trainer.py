"""One GRPO run: collect -> grade -> advantages -> S updates -> weight sync -> evaluate -> record.

The phases are timed as the study times them. Active phase time is generation + trainer
(old-policy scoring included) + weight sync; job time also covers initialisation,
evaluation and checkpoint saving.

Slicing rule: a collection is laid out group-major (P groups of G responses). Groups are
shuffled with the run's seed, then the sequence of P x G responses is cut into S
contiguous slices of B. When G divides B every slice holds whole groups, which is the case
for every arm of the study; otherwise a group may straddle two slices (its advantages were
already computed on the whole group).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import data as data_mod
from .config import RunConfig
from .evaluation import encode_prompts, evaluate
from .grpo import (Sequence, clipped_surrogate_loss, collate, group_advantages, mixed_group_fraction,
                   pack_micro_batches, token_logprobs)
from .packing import memory_token_budget, score_packed, supports_packed, token_budget_micro_batches, update_packed
from .prompts import prompt_version
from .provenance import git_commit, package_versions, source_sha256
from .records import RunDir, atomic_write_json
from .verifiers import grade


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was requested but CUDA is not available here; use device=cpu or auto.")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class PromptSampler:
    """Seeded draws without replacement; a fresh permutation each time the pool runs out."""

    def __init__(self, pool_size: int, seed: int):
        self.pool_size, self.seed = pool_size, seed
        self.epoch, self.cursor = 0, 0
        self.seen: set[int] = set()
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, 7, epoch]).permutation(self.pool_size)

    def draw(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if self.cursor == self.pool_size:
                self.epoch, self.cursor = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            take = min(k - len(out), self.pool_size - self.cursor)
            out.extend(int(i) for i in self._perm[self.cursor:self.cursor + take])
            self.cursor += take
        self.seen.update(out)
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seen": sorted(self.seen)}

    def load_state(self, s: dict) -> None:
        self.epoch, self.cursor, self.seen = s["epoch"], s["cursor"], set(s["seen"])
        self._perm = self._permutation(self.epoch)


@dataclass
class PhaseClock:
    """Accumulates seconds per phase; CUDA work is synchronised before each reading."""

    seconds: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in (
        "generation", "trainer", "sync", "evaluation", "checkpoint", "init")})
    job_start: float = field(default_factory=time.perf_counter)
    offset: float = 0.0  # job seconds carried over from before a resume

    @contextlib.contextmanager
    def phase(self, name: str):
        _sync_cuda()
        t = time.perf_counter()
        try:
            yield
        finally:
            _sync_cuda()
            self.seconds[name] += time.perf_counter() - t

    @property
    def active(self) -> float:
        return self.seconds["generation"] + self.seconds["trainer"] + self.seconds["sync"]

    @property
    def job(self) -> float:
        return self.offset + time.perf_counter() - self.job_start

    def summary(self) -> dict[str, float]:
        job = self.job
        out = dict(self.seconds)
        out["job"] = job
        out["active_phase"] = self.active
        out["other"] = job - sum(self.seconds.values())
        return out


def _stack_padded(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """Per-response vectors [len_i] -> [m, width], zero-padded on the right."""
    return torch.stack([torch.nn.functional.pad(t, (0, width - t.numel())) for t in rows]).to(device)


def _sync_cuda() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Trainer:
    """Holds a run's model, optimizer, engine and records; ``run()`` executes the loop."""

    def __init__(self, cfg: RunConfig, progress: bool = True):
        self.cfg = cfg
        self.progress = progress
        self.clock = PhaseClock()
        self.run = RunDir(cfg.run_dir)
        self.plan = cfg.plan
        self.device = resolve_device(cfg.device)

    # ----------------------------------------------------------------- set-up
    def setup(self) -> None:
        from .models import load_model
        from .rollout import make_engine

        cfg = self.cfg
        with self.clock.phase("init"):
            seed_everything(cfg.seed)
            self.train_pool = data_mod.load_split(cfg.task, "train", data_dir=cfg.data_dir)
            validation = data_mod.load_split(cfg.task, "validation", data_dir=cfg.data_dir)
            self.val_problems = validation[: cfg.eval_problems] if cfg.eval_problems else validation
            self.model, self.tokenizer, self.model_info = load_model(cfg.model, device=self.device, dtype=torch.float32)
            # eval(): these models have no dropout, and scoring and updates must see the same function.
            self.model.eval()
            self.model.config.use_cache = False
            self.pad_id = self.tokenizer.pad_token_id
            self.ref_model = None
            if cfg.kl_coef > 0:
                import copy
                self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                               weight_decay=cfg.weight_decay, eps=1e-8,
                                               fused=self.device.type == "cuda")
            engine_kw: dict[str, Any] = {"device": self.device}
            if cfg.engine == "hf":
                engine_kw.update(max_batch_size=cfg.generation_batch_size,
                                 fast={"auto": "auto", "on": True, "off": False, "fused": "fused"}[cfg.fast_rollout])
            else:
                engine_kw.update(url=cfg.engine_url)
            self.engine = make_engine(cfg.engine, self.model, self.tokenizer, **engine_kw)
            self.sampler = PromptSampler(len(self.train_pool), cfg.seed)
            self._prompt_cache: dict[int, list[int]] = {}

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _prompt_ids(self, indices: list[int]) -> list[list[int]]:
        missing = [i for i in indices if i not in self._prompt_cache]
        for i, ids in zip(missing, encode_prompts([self.train_pool[i] for i in missing], self.tokenizer)):
            self._prompt_cache[i] = ids
        return [self._prompt_cache[i] for i in indices]

    # ----------------------------------------------------------------- records
    def _config_record(self) -> dict:
        cfg = self.cfg
        return {
            "run_id": cfg.resolved_run_id, "study": cfg.study, "config": cfg.to_dict(),
            "plan": self.plan.summary(cfg.response_budget, cfg.eval_every_responses),
            "data": {"task": cfg.task, "splits": data_mod.split_hashes(cfg.task), "prompt_version": prompt_version(cfg.task),
                     "train_pool": len(self.train_pool), "validation_evaluated": len(self.val_problems)},
            "model": {"name": self.model_info.name, "source": self.model_info.source, "sha256": self.model_info.sha256,
                      "path": str(self.model_info.path)},
            "device": str(self.device), "gpu": torch.cuda.get_device_name(0) if self.device.type == "cuda" else None,
            "rollout_path": getattr(self.engine, "path", cfg.engine),
            "packages": package_versions(), "git_commit": git_commit(), "source_sha256": source_sha256(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv,
        }

    # ----------------------------------------------------------------- phases
    def collect(self, collection: int) -> dict:
        cfg = self.cfg
        p, g = self.plan.rollout_batch_size, self.plan.n_samples_per_prompt
        indices = self.sampler.draw(p)
        prompt_ids = self._prompt_ids(indices)
        with self.clock.phase("generation"):
            gen = self.engine.generate(prompt_ids, n=g, max_new_tokens=cfg.max_new_tokens,
                                       temperature=cfg.temperature, seed=cfg.seed * 1_000_003 + collection)
        rewards = torch.tensor([grade(self.train_pool[indices[gen.prompt_index[k]]], text)
                                for k, text in enumerate(gen.texts)], dtype=torch.float32)  # [P*G]
        seqs = [Sequence(prompt_ids[gen.prompt_index[k]], list(gen.token_ids[k])) for k in range(len(gen.texts))]
        return {"indices": indices, "gen": gen, "rewards": rewards, "seqs": seqs}

    @property
    def packed(self) -> bool:
        """Whether the trainer runs the packed path (``cfg.trainer_path``; auto: where the model allows)."""
        if not hasattr(self, "_packed"):
            path = self.cfg.trainer_path
            if path in ("packed", "packed-compiled") and not supports_packed(self.model):
                raise ValueError(f"trainer_path=packed does not support {type(self.model).__name__}; use auto or padded.")
            self._packed = path in ("packed", "packed-compiled") or (path == "auto" and supports_packed(self.model))
        return self._packed

    def _micro_batches(self, idx: list[int], seqs: list[Sequence]) -> list[list[int]]:
        cfg = self.cfg
        if self.packed and cfg.micro_batch_size is None:
            if not hasattr(self, "_token_budget"):
                self._token_budget = cfg.packed_tokens_per_micro_batch or (
                    memory_token_budget(self.model, self.device) if self.device.type == "cuda"
                    else cfg.max_tokens_per_micro_batch)
            local = token_budget_micro_batches([len(seqs[i]) for i in idx], self._token_budget)
            return [[idx[j] for j in mb] for mb in local]
        local = pack_micro_batches([len(seqs[i]) for i in idx], cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
        return [[idx[j] for j in mb] for mb in local]

    @torch.no_grad()
    def _score(self, model: torch.nn.Module, seqs: list[Sequence]) -> list[torch.Tensor]:
        """Per-response token log-probs ([len_i] each) under ``model``, without gradients."""
        if self.packed:
            return score_packed(model, seqs, self._micro_batches(list(range(len(seqs))), seqs), self.device,
                                self.cfg.temperature, self._autocast, self.cfg.trainer_path == "packed-compiled")
        out: list[torch.Tensor | None] = [None] * len(seqs)
        for mb_idx in self._micro_batches(list(range(len(seqs))), seqs):
            mb = collate([seqs[i] for i in mb_idx], self.pad_id, self.device)
            with self._autocast():
                logp = token_logprobs(model, mb, self.cfg.temperature)  # [m, R]
            for row, i in enumerate(mb_idx):
                out[i] = logp[row, : len(seqs[i].response_ids)].float().cpu()
        return out  # type: ignore[return-value]

    def train_on_collection(self, collection: int, batch: dict) -> tuple[list[dict], float | None]:
        cfg, plan = self.cfg, self.plan
        seqs, rewards = batch["seqs"], batch["rewards"]
        g, b, s = plan.n_samples_per_prompt, plan.global_batch_size, plan.num_steps_per_rollout
        adv = group_advantages(rewards, g, cfg.std_normalize_advantages)  # [P*G]
        with self.clock.phase("trainer"):
            # With S=1 nothing changes the weights between scoring and the update, so the update's
            # forward pass can stand in for the scoring pass (it fills old_logp as it goes).
            on_policy = cfg.reuse_on_policy_logprobs and s == 1
            old_logp = [None] * len(seqs) if on_policy else self._score(self.model, seqs)
            ref_logp = self._score(self.ref_model, seqs) if self.ref_model is not None else None
            order = np.random.default_rng([cfg.seed, 11, collection]).permutation(len(seqs) // g)
            flat = [int(grp) * g + k for grp in order for k in range(g)]  # groups shuffled, members kept together
            updates = []
            for step in range(s):
                idx = flat[step * b:(step + 1) * b]
                updates.append(self._update(idx, seqs, adv, old_logp, ref_logp))
            mismatch = None
            if batch["gen"].logprobs is not None:
                diffs = [torch.tensor(e[: len(o)]) - o for e, o in zip(batch["gen"].logprobs, old_logp)]
                mismatch = float(torch.cat(diffs).abs().mean()) if diffs else None
        return updates, mismatch

    def _update(self, idx: list[int], seqs: list[Sequence], adv: torch.Tensor,
                old_logp: list[torch.Tensor | None], ref_logp: list[torch.Tensor] | None) -> dict:
        """One optimizer step on responses ``idx``; entries of ``old_logp`` that are None are
        taken from this step's own forward pass (detached) and stored back."""
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        if self.packed:
            out = update_packed(self.model, seqs, idx, self._micro_batches(idx, seqs), adv, old_logp, ref_logp, cfg,
                                self.device, self._autocast, cfg.trainer_path == "packed-compiled")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip))
            self.optimizer.step()
            return out | {"grad_norm": grad_norm}
        update_tokens = float(sum(len(seqs[i].response_ids) for i in idx))
        totals = {"tokens": 0.0, "clipped_low": 0.0, "clipped_high": 0.0, "ratio_sum": 0.0, "approx_kl_sum": 0.0}
        loss_total, ratio_max = 0.0, 0.0
        micro = self._micro_batches(idx, seqs)
        for mb_idx in micro:
            mb = collate([seqs[i] for i in mb_idx], self.pad_id, self.device)
            r = mb.response_ids.size(1)
            with self._autocast():
                logp = token_logprobs(self.model, mb, cfg.temperature)  # [m, R]
            for row, i in enumerate(mb_idx):
                if old_logp[i] is None:
                    old_logp[i] = logp[row, : len(seqs[i].response_ids)].detach().float().cpu()
            terms = clipped_surrogate_loss(
                logp, _stack_padded([old_logp[i] for i in mb_idx], r, self.device), adv[mb_idx].to(self.device), mb.response_mask,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, aggregation=cfg.loss_aggregation,
                global_batch_size=len(idx), global_batch_tokens=update_tokens,
                ref_logp=_stack_padded([ref_logp[i] for i in mb_idx], r, self.device) if ref_logp is not None else None, kl_coef=cfg.kl_coef)
            terms.loss.backward()
            loss_total += float(terms.loss.detach())
            ratio_max = max(ratio_max, terms.ratio_max)
            for k in totals:
                totals[k] += getattr(terms, k)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip))
        self.optimizer.step()
        n = max(totals["tokens"], 1.0)
        return {
            "loss": loss_total, "clip_fraction": (totals["clipped_low"] + totals["clipped_high"]) / n,
            "clip_low_fraction": totals["clipped_low"] / n, "clip_high_fraction": totals["clipped_high"] / n,
            "approx_kl": totals["approx_kl_sum"] / n, "ratio_mean": totals["ratio_sum"] / n, "ratio_max": ratio_max,
            "grad_norm": grad_norm, "tokens": int(totals["tokens"]), "micro_batches": len(micro),
        }

    def sync_weights(self) -> None:
        with self.clock.phase("sync"):
            self.engine.update_weights(self.model.state_dict())

    def evaluate(self, collections: int, responses: int, updates: int, output_tokens: int) -> float:
        cfg = self.cfg
        with self.clock.phase("evaluation"):
            rows = evaluate(self.engine, self.tokenizer, self.val_problems, cfg.eval_max_new_tokens or cfg.max_new_tokens,
                            batch_size=cfg.generation_batch_size)
        meta = {"run_id": cfg.resolved_run_id, "split": "validation", "collections": collections, "updates": updates,
                "responses": responses, "output_tokens": output_tokens, "active_seconds": self.clock.active,
                "job_seconds": self.clock.job}
        self.run.add_evals([meta | {k: v for k, v in r.items() if k != "response"} for r in rows])
        return float(np.mean([r["correct"] for r in rows])) if rows else float("nan")

    # ----------------------------------------------------------------- resume
    def save_resume_state(self, collections_done: int, counters: dict) -> None:
        from safetensors.torch import save_model
        with self.clock.phase("checkpoint"):
            tmp = self.run.path / ".resume.tmp"
            tmp.mkdir(exist_ok=True)
            save_model(self.model, str(tmp / "model.safetensors"))  # handles tied embeddings
            torch.save({"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                        "numpy_rng": np.random.get_state()}, tmp / "optimizer.pt")
            atomic_write_json(tmp / "state.json", {"collections_done": collections_done, "counters": counters,
                                                   "sampler": self.sampler.state(), "seconds": self.clock.seconds,
                                                   "job_seconds": self.clock.job})
            old = self.run.path / ".resume.old"
            if self.run.resume_path.exists():
                os.replace(self.run.resume_path, old)
            os.replace(tmp, self.run.resume_path)
            if old.exists():
                import shutil
                shutil.rmtree(old)

    def load_resume_state(self) -> tuple[int, dict]:
        from safetensors.torch import load_model
        from .records import read_json
        path = self.run.resume_path
        if not (path / "state.json").exists():
            return 0, {}
        state = read_json(path / "state.json")
        load_model(self.model, str(path / "model.safetensors"), device=str(self.device))
        # On CPU: the RNG state must stay a CPU ByteTensor, and load_state_dict moves the
        # optimizer state onto its parameters' device itself.
        extra = torch.load(path / "optimizer.pt", weights_only=False, map_location="cpu")
        self.optimizer.load_state_dict(extra["optimizer"])
        torch.set_rng_state(extra["torch_rng"])
        np.random.set_state(extra["numpy_rng"])
        self.sampler.load_state(state["sampler"])
        self.clock.seconds.update(state["seconds"])
        self.clock.offset = state["job_seconds"]
        self.engine.update_weights(self.model.state_dict())
        return state["collections_done"], state["counters"]

    # ----------------------------------------------------------------- loop
    def run_loop(self) -> Path:
        cfg, plan = self.cfg, self.plan
        resuming = self.run.create(cfg.resume)
        if resuming and self.run.is_complete():
            return self.run.path
        bar = None
        try:
            self.setup()
            start, counters = (self.load_resume_state() if resuming else (0, {}))
            counters = counters or {"responses": 0, "updates": 0, "output_tokens": 0}
            # Records past the last resumable state belong to work that will be redone.
            self.run.truncate_collections(start)
            self.run.truncate_evals(counters["responses"] if start else -1)
            atomic_write_json(self.run.config_path, self._config_record())
            self.run.write_state("running", start)
            n_coll = cfg.collections
            eval_points = set(cfg.eval_points)
            save_every = cfg.resume_every_collections
            bar = tqdm(total=n_coll, initial=start, desc=cfg.resolved_run_id, disable=not self.progress, unit="coll")
            if start == 0:
                acc = self.evaluate(0, 0, 0, 0)
                bar.set_postfix(val=f"{acc:.3f}")
            for c in range(start, n_coll):
                before = {k: self.clock.seconds[k] for k in ("generation", "trainer", "sync")}
                batch = self.collect(c)
                updates, mismatch = self.train_on_collection(c, batch)
                self.sync_weights()
                gen = batch["gen"]
                lengths = [len(t) for t in gen.token_ids]
                counters["responses"] += len(lengths)
                counters["updates"] += len(updates)
                counters["output_tokens"] += sum(lengths)
                rewards = batch["rewards"]
                peak = torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None
                self.run.append_collection({
                    "collection": c, "responses": counters["responses"], "updates": counters["updates"],
                    "prompts": len(batch["indices"]), "distinct_prompts": len(self.sampler.seen),
                    "reward_mean": float(rewards.mean()),
                    "mixed_group_fraction": mixed_group_fraction(rewards, plan.n_samples_per_prompt),
                    "truncation_fraction": float(np.mean([f == "length" for f in gen.finish_reasons])),
                    "response_length_mean": float(np.mean(lengths)), "response_length_max": int(max(lengths)),
                    "output_tokens": int(sum(lengths)), "output_tokens_cum": counters["output_tokens"],
                    "logprob_mismatch": mismatch, "per_update": [{"update": counters["updates"] - len(updates) + k + 1} | u
                                                                for k, u in enumerate(updates)],
                    "seconds": {k: self.clock.seconds[k] - v for k, v in before.items()},  # this collection's phases
                    "active_seconds": self.clock.active, "job_seconds": self.clock.job, "peak_memory_gib": peak,
                })
                postfix = {"reward": f"{float(rewards.mean()):.3f}"}
                if counters["responses"] in eval_points:
                    postfix["val"] = f"{self.evaluate(c + 1, counters['responses'], counters['updates'], counters['output_tokens']):.3f}"
                done = c + 1
                at_eval = counters["responses"] in eval_points
                if done < n_coll and ((save_every and done % save_every == 0) or (not save_every and at_eval)):
                    self.save_resume_state(done, counters)
                self.run.write_state("running", done)
                bar.set_postfix(postfix)
                bar.update(1)
            bar.close()
            if cfg.save_checkpoint:
                self.save_final()
            self._write_timings()
            self.run.write_state("complete", n_coll)
            if self.run.resume_path.exists():
                import shutil
                shutil.rmtree(self.run.resume_path)
        except BaseException as exc:
            if bar is not None:
                bar.close()
            self._write_timings()
            done = len(self.run.collections())
            self.run.write_state("failed", done, error=f"{type(exc).__name__}: {exc}",
                                 traceback=traceback.format_exc(limit=20))
            raise
        return self.run.path

    def save_final(self) -> None:
        with self.clock.phase("checkpoint"):
            save_checkpoint(self.model, self.tokenizer, self.run.final_path)

    def _write_timings(self) -> None:
        atomic_write_json(self.run.timings_path, self.clock.summary())


def save_checkpoint(model: torch.nn.Module, tokenizer, path: Path) -> None:
    """Write a safetensors checkpoint folder atomically (temporary folder, then rename)."""
    import shutil
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if path.exists():
        raise FileExistsError(f"{path} already exists; checkpoints are never overwritten.")
    os.replace(tmp, path)


def train(cfg: RunConfig | dict, progress: bool = True) -> Path:
    """Run one training run and return its run directory."""
    if isinstance(cfg, dict):
        cfg = RunConfig.from_dict(cfg)
    return Trainer(cfg, progress=progress).run_loop()
