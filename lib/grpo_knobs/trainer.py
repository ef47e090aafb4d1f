"""One GRPO run: collect -> grade -> advantages -> old log-probs -> S updates -> sync -> evaluate -> record.

The phases are timed as the study times them. Active phase time is generation + trainer
(old-policy scoring included) + weight sync; job time also covers initialisation,
evaluation and checkpoint saving.

Which responses each update uses is :func:`grpo_knobs.knobs.update_slices`; the loss pieces are
in :mod:`grpo_knobs.grpo`; the files a run writes are :class:`grpo_knobs.records.RunDir`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
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
from .config import RunConfig, config_drift, inside
from .determinism import DIGEST_FILE, weights_sha256, write_digest
from .evaluation import encode_prompts, evaluate
from .grpo import (
    STAT_NAMES,
    UPDATE_VALUES,
    Sequence,
    clipped_surrogate_loss,
    collate,
    group_advantages,
    mixed_group_fraction,
    pack_micro_batches,
    token_logprobs,
    update_record,
)
from .knobs import update_slices
from .locks import exclusive, run_lock_path
from .packing import (
    PACKED_BACKENDS,
    check_backend,
    liger_available,
    logprobs_to_host,
    memory_token_budget,
    score_packed,
    shared_prompt_tokens,
    supports_packed,
    token_budget_micro_batches,
    update_packed,
)
from .prompts import prompt_version
from .provenance import git_commit, package_versions, placement, source_sha256
from .records import RunDir, atomic_write_json, fsync_tree, read_json, writing_folder
from .rollout.base import Generation
from .runtime import (
    DIE_WITH_PARENT_ENV,
    check_interrupted,
    deterministic_mode,
    die_with_parent,
    interrupts,
    resolve_device,
    seed_everything,
    sync_cuda,
)
from .tracking import NullTracker, open_tracker
from .verifiers import grade

# Sampled responses kept per reward value and collection, so a run's drift can be read afterwards.
SAMPLES_PER_OUTCOME = 2


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
            out.extend(int(i) for i in self._perm[self.cursor : self.cursor + take])
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

    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("generation", "trainer", "sync", "evaluation", "checkpoint", "init"), 0.0
        )
    )
    job_start: float = field(default_factory=time.perf_counter)
    offset: float = 0.0  # job seconds carried over from before a resume

    @contextlib.contextmanager
    def phase(self, name: str):
        sync_cuda()
        t = time.perf_counter()
        try:
            yield
        finally:
            sync_cuda()
            self.seconds[name] += time.perf_counter() - t

    @property
    def active(self) -> float:
        return self.seconds["generation"] + self.seconds["trainer"] + self.seconds["sync"]

    @property
    def job(self) -> float:
        return self.offset + time.perf_counter() - self.job_start

    def restore(self, seconds: dict[str, float], job_seconds: float) -> None:
        """Continue a resumed run's clock. This process's own start-up (model load, state load)
        stays in ``init``, added to the init of the process that saved the state."""
        init_now = self.seconds["init"]
        self.seconds.update(seconds)
        self.seconds["init"] += init_now
        self.offset = job_seconds

    def summary(self) -> dict[str, float]:
        job = self.job
        out = dict(self.seconds)
        out["job"] = job
        out["active_phase"] = self.active
        out["other"] = job - sum(self.seconds.values())
        return out


@dataclass
class Collection:
    """One collection: P prompts x G responses, group-major (prompt k's G responses are k*G..k*G+G-1)."""

    index: int  # which collection of the run (0-based)
    prompts: list[int]  # [P] indices into the train pool
    generation: Generation  # the engine's responses, token ids and log-probs
    rewards: torch.Tensor  # [P*G] float32, one per response
    seqs: list[Sequence]  # [P*G] prompt + response token ids, as the trainer scores them


def _stack_padded(rows: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
    """Per-response vectors [len_i] -> [m, width], zero-padded on the right."""
    return torch.stack([torch.nn.functional.pad(t, (0, width - t.numel())) for t in rows]).to(device)


class Trainer:
    """Holds a run's model, optimizer, engine and records; ``run_loop()`` executes the run."""

    def __init__(self, cfg: RunConfig, progress: bool = True):
        self.cfg = cfg
        self.progress = progress
        self.clock = PhaseClock()
        self.run = RunDir(cfg.run_dir)
        self.plan = cfg.plan
        self.device = resolve_device(cfg.device)
        self.tracker = NullTracker()  # opened once the run directory exists (tracker=tensorboard|trackio)
        self.determinism: dict = {}  # what deterministic mode set (recorded in config.json)

    # ----------------------------------------------------------------- the loop
    def run_loop(self) -> Path:
        """Run (or resume, or finish) the run under its one-writer lock; returns the run directory."""
        cfg = self.cfg
        inside(cfg.output_dir, cfg.resolved_run_id)  # a planted symbolic link does not lead the run elsewhere
        lock = exclusive(run_lock_path(cfg.output_dir, cfg.resolved_run_id), f"run {self.run.path}")
        with lock, deterministic_mode(cfg.deterministic) as self.determinism:
            resuming = self.run.check_new(cfg.resume)  # refuses to overwrite, before any slow set-up
            if resuming:
                # A complete run too: one run never answers for two configs.
                self._check_recorded_config()
                self.run.collections()  # a bad record line stops the resume here, naming it
            if resuming and self.run.is_complete():
                self.run.prune_resume_states(keep=None)  # left by a kill between "complete" and the pruning
                return self.run.path
            # Model, data, engine, an explicit tracking_dir: a failure here leaves no run directory behind,
            # so the corrected command runs as a new run.
            self.setup()
            # However the run ends, the engine is closed (a launched SGLang server stops now, not when the engine
            # is collected, and the weights written for any server are deleted), then the server's log is kept.
            with contextlib.ExitStack() as ending:
                ending.callback(self._keep_server_log)
                ending.enter_context(contextlib.closing(self.engine))
                self.tracker = open_tracker(cfg)
                self.run.path.mkdir(parents=True, exist_ok=True)
                try:
                    self._train_and_finish(resuming)
                except BaseException as exc:
                    self._record_failure(exc)
                    raise
                finally:
                    self.tracker.close()
        return self.run.path

    def _keep_server_log(self) -> None:
        """A launched SGLang server's log joins the run's records (sglang-server.log), its server stopped."""
        keep = getattr(self.engine, "keep_log", None)
        if keep is not None and self.run.path.is_dir():
            try:
                keep(self.run.path / "sglang-server.log")
            except OSError as e:  # a log, not a record: the run's outcome stands
                print(f"the SGLang server's log stays at {self.engine.log_path}: {e}", file=sys.stderr)

    def _train_and_finish(self, resuming: bool) -> None:
        cfg = self.cfg
        n_coll = cfg.collections
        if resuming and self.run.final_path.exists():
            # final/ is written only after every collection is recorded: only finishing is left.
            self._restore_clock_from_state()
            return self._finish(n_coll)
        start, counters = self._start_or_resume(resuming)
        bar = tqdm(total=n_coll, initial=start, desc=cfg.resolved_run_id, disable=not self.progress, unit="coll")
        try:
            if start == 0:  # the initial model's accuracy is the curve's first point
                bar.set_postfix(val=f"{self.evaluate(0, counters):.3f}")
            for c in range(start, n_coll):
                check_interrupted()  # a Ctrl-C whose KeyboardInterrupt was lost still stops the run here
                before = {k: self.clock.seconds[k] for k in ("generation", "trainer", "sync")}
                # 1. Generate P x G responses with the current weights and grade them.
                batch = self.collect(c)
                # 2-4. Advantages, old-policy log-probs, then S updates on disjoint slices of B.
                updates, diagnostics = self.train_on_collection(batch)
                # 5. Only now does the generator see the new weights: every slice was on-policy data.
                self.sync_weights()
                self._record_collection(batch, updates, diagnostics, counters, before)
                postfix = {"reward": f"{float(batch.rewards.mean()):.3f}"}
                # 6. Evaluate between collections, on the schedule fixed by the plan.
                if counters["responses"] in cfg.eval_points:
                    postfix["val"] = f"{self.evaluate(c + 1, counters):.3f}"
                # 7. Save what a resume needs, then mark progress (in that order: a state never runs ahead).
                if self._resume_point(c + 1, counters["responses"]):
                    self.save_resume_state(c + 1, counters)
                self.run.write_state("running", c + 1, **self._clock_state())
                bar.set_postfix(postfix)
                bar.update(1)
        finally:
            bar.close()
        self._finish(n_coll)

    # ----------------------------------------------------------------- set-up
    def setup(self) -> None:
        from .models import load_model
        from .rollout import make_engine

        cfg = self.cfg
        with self.clock.phase("init"):
            if cfg.trainer_path in PACKED_BACKENDS:  # before the slow loads: a path this device cannot run
                check_backend(PACKED_BACKENDS[cfg.trainer_path], self.device)
            seed_everything(cfg.seed)
            self.train_pool = data_mod.load_split(cfg.task, "train", data_dir=cfg.data_dir)
            validation = data_mod.load_split(cfg.task, "validation", data_dir=cfg.data_dir)
            self.val_problems = validation[: cfg.eval_problems] if cfg.eval_problems else validation
            self.model, self.tokenizer, self.model_info = load_model(
                cfg.model, device=self.device, dtype=torch.float32
            )
            # eval(): these models have no dropout, and scoring and updates must see the same function.
            self.model.eval()
            self.model.config.use_cache = False
            self.pad_id = self.tokenizer.pad_token_id
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=cfg.lr,
                betas=(cfg.adam_beta1, cfg.adam_beta2),
                weight_decay=cfg.weight_decay,
                eps=1e-8,
                fused=self.device.type == "cuda",  # one kernel for all parameters
            )
            engine_kw: dict[str, Any] = {"device": self.device}
            if cfg.engine == "hf":
                fast = {"auto": "auto", "on": True, "off": False, "fused": "fused"}[cfg.fast_rollout]
                engine_kw.update(
                    max_batch_size=cfg.max_concurrent_sequences, fast=fast, keyed_sampling=cfg.deterministic
                )
            else:
                from .rollout.sglang import engine_options

                engine_kw.update(engine_options(cfg))
            self.engine = make_engine(cfg.engine, self.model, self.tokenizer, **engine_kw)
            self.sampler = PromptSampler(len(self.train_pool), cfg.seed)
            self._prompt_cache: dict[int, list[int]] = {}
            self.trainer_path = resolve_trainer_path(cfg.trainer_path, self.model, self.device)
            self.packed_backend = PACKED_BACKENDS.get(self.trainer_path)  # None: the padded path
            self._token_budget: int | None = None
            if cfg.deterministic and self.packed_backend and cfg.micro_batch_size is None:
                # Fixed now, from the GPU's total memory: the split into micro-batches (the order gradients
                # are summed in) must not depend on what else holds memory when the first update runs.
                self._token_budget = self._packed_token_budget(fixed=True)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _prompt_ids(self, indices: list[int]) -> list[list[int]]:
        missing = [i for i in indices if i not in self._prompt_cache]
        for i, ids in zip(missing, encode_prompts([self.train_pool[i] for i in missing], self.tokenizer)):
            self._prompt_cache[i] = ids
        return [self._prompt_cache[i] for i in indices]

    # ----------------------------------------------------------------- phases
    def collect(self, collection: int) -> Collection:
        """Draw P prompts, sample G responses each at the run's temperature, grade every response."""
        cfg = self.cfg
        indices = self.sampler.draw(self.plan.rollout_batch_size)
        prompt_ids = self._prompt_ids(indices)
        with self.clock.phase("generation"):
            gen = self.engine.generate(
                prompt_ids,
                n=self.plan.n_samples_per_prompt,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                seed=cfg.seed * 1_000_003 + collection,
            )
        problems = [self.train_pool[indices[k]] for k in gen.prompt_index]
        rewards = torch.tensor([grade(p, t) for p, t in zip(problems, gen.texts)], dtype=torch.float32)  # [P*G]
        seqs = [Sequence(prompt_ids[k], list(ids)) for k, ids in zip(gen.prompt_index, gen.token_ids)]
        return Collection(collection, indices, gen, rewards, seqs)

    def _packed_token_budget(self, fixed: bool) -> int:
        """Tokens per packed micro-batch: the configured budget, else sized to the GPU's memory (its free
        memory, or with ``fixed`` its total), else ``max_tokens_per_micro_batch`` off the GPU."""
        cfg = self.cfg
        if cfg.packed_tokens_per_micro_batch:
            return cfg.packed_tokens_per_micro_batch
        if self.device.type == "cuda":
            return memory_token_budget(self.model, self.device, fixed=fixed)
        return cfg.max_tokens_per_micro_batch

    def _micro_batches(self, idx: list[int], seqs: list[Sequence]) -> list[list[int]]:
        cfg = self.cfg
        if self.packed_backend and cfg.micro_batch_size is None:
            if self._token_budget is None:  # sized on first use, once the engine holds its memory
                self._token_budget = self._packed_token_budget(fixed=False)
            chosen = [seqs[i] for i in idx]  # group-major: a group's shared prompt counts once
            local = token_budget_micro_batches(
                [len(s) for s in chosen], self._token_budget, shared_prompt_tokens(chosen)
            )
            return [[idx[j] for j in mb] for mb in local]
        local = pack_micro_batches([len(seqs[i]) for i in idx], cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
        return [[idx[j] for j in mb] for mb in local]

    @torch.no_grad()
    def _score(self, model: torch.nn.Module, seqs: list[Sequence]) -> list[torch.Tensor]:
        """Per-response token log-probs ([len_i] each) under ``model``, without gradients."""
        if self.packed_backend:
            return score_packed(
                model,
                seqs,
                self._micro_batches(list(range(len(seqs))), seqs),
                self.device,
                self.cfg.temperature,
                self._autocast,
                self.packed_backend,
            )
        out: list[torch.Tensor | None] = [None] * len(seqs)
        for mb_idx in self._micro_batches(list(range(len(seqs))), seqs):
            mb = collate([seqs[i] for i in mb_idx], self.pad_id, self.device)
            with self._autocast():
                logp = token_logprobs(model, mb, self.cfg.temperature)  # [m, R]
            for row, i in enumerate(mb_idx):
                out[i] = logp[row, : len(seqs[i].response_ids)].float().cpu()
        return out  # type: ignore[return-value]

    def train_on_collection(self, batch: Collection) -> tuple[list[dict], dict]:
        """Advantages, old-policy log-probs and the S updates of one collection.

        Returns the per-update records and the collection's diagnostics (log-prob mismatch
        between engine and trainer, entropy estimate, share of zero-advantage groups).
        """
        cfg, plan = self.cfg, self.plan
        g = plan.n_samples_per_prompt
        # Group-relative advantages: the only learning signal; a group with equal rewards gives none.
        adv = group_advantages(batch.rewards, g, cfg.std_normalize_advantages)  # [P*G]
        with self.clock.phase("trainer"):
            # S optimizer steps on disjoint slices of B: every response is used exactly once.
            slices = [s.tolist() for s in update_slices(plan, cfg.seed, batch.index)]
            # The PPO ratio needs the policy that generated the data: score it before any update.
            # The first slice is trained on exactly those weights, so with reuse_on_policy_logprobs
            # its own forward pass fills its entries in instead (detached).
            old_logp: list[torch.Tensor | None] = [None] * len(batch.seqs)
            scored = [i for s in (slices[1:] if cfg.reuse_on_policy_logprobs else slices) for i in s]
            for i, lp in zip(scored, self._score(self.model, [batch.seqs[i] for i in scored])):
                old_logp[i] = lp
            ref_logp = self._score(self.ref_model, batch.seqs) if self.ref_model is not None else None
            steps = [self._update(s, batch.seqs, adv, old_logp, ref_logp) for s in slices]
            # The one wait for the device in this phase: every update's statistics, then the
            # log-probs for the diagnostics, come back together.
            values = torch.stack([v for v, _ in steps]).tolist()  # [S, len(UPDATE_VALUES) + 1]
            # Nothing non-finite is recorded or trained on: stop before this collection counts.
            check_finite(values, batch.index, len(slices))
            updates = [update_record(v[:-1], micro) for v, (_, micro) in zip(values, steps)]
            old_logp = logprobs_to_host(old_logp)
        return updates, _collection_diagnostics(batch, adv, old_logp, g)

    def _update(
        self,
        idx: list[int],
        seqs: list[Sequence],
        adv: torch.Tensor,
        old_logp: list[torch.Tensor | None],
        ref_logp: list[torch.Tensor] | None,
    ) -> tuple[torch.Tensor, int]:
        """One optimizer step on the responses ``idx`` (one slice of B).

        Entries of ``old_logp`` that are None are taken from this step's own forward pass
        (detached) and stored back. Micro-batches only bound memory: each adds its share of the
        loss over the whole slice, so the gradient is the same for any packing. Returns the
        step's ``UPDATE_VALUES`` and the largest absolute weight after it (on the device for the
        packed path, which never waits for it) and its number of micro-batches.
        """
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        micro = self._micro_batches(idx, seqs)
        if self.packed_backend:  # sequences back to back, no padding (grpo_knobs.packing)
            values = update_packed(
                self.model,
                seqs,
                idx,
                micro,
                adv,
                old_logp,
                ref_logp,
                cfg,
                self.device,
                self._autocast,
                self.packed_backend,
            )  # [8]
        else:
            values = self._update_padded(idx, seqs, micro, adv, old_logp, ref_logp)  # [8]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)  # stays on the device
        self.optimizer.step()
        # The largest weight after the step (one fused pass, read back with the statistics): a step
        # that overflows a weight shows here even when its loss and gradient norm were finite.
        weight_max = torch.nn.utils.get_total_norm([p.detach() for p in self.model.parameters()], float("inf"))
        return torch.cat([values, grad_norm.to(values)[None], weight_max.to(values)[None]]), len(micro)

    def _update_padded(self, idx, seqs, micro, adv, old_logp, ref_logp) -> torch.Tensor:
        """Forward, loss and backward over right-padded micro-batches; returns the loss and
        ``STAT_NAMES`` sums, [8] float64 on the host (each micro-batch's were read as it finished)."""
        cfg = self.cfg
        global_batch_tokens = float(sum(len(seqs[i].response_ids) for i in idx))
        totals = dict.fromkeys(STAT_NAMES, 0.0)
        loss_total = 0.0
        for mb_idx in micro:
            mb = collate([seqs[i] for i in mb_idx], self.pad_id, self.device)
            r = mb.response_ids.size(1)
            with self._autocast():
                logp = token_logprobs(self.model, mb, cfg.temperature)  # [m, R]
            for row, i in enumerate(mb_idx):
                if old_logp[i] is None:
                    old_logp[i] = logp[row, : len(seqs[i].response_ids)].detach().float().cpu()
            ref = _stack_padded([ref_logp[i] for i in mb_idx], r, self.device) if ref_logp is not None else None
            terms = clipped_surrogate_loss(
                logp,
                _stack_padded([old_logp[i] for i in mb_idx], r, self.device),  # [m, R]
                adv[mb_idx].to(self.device),  # [m]
                mb.response_mask,  # [m, R]
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.loss_aggregation,
                global_batch_size=len(idx),
                global_batch_tokens=global_batch_tokens,
                ref_logp=ref,
                kl_coef=cfg.kl_coef,
            )
            terms.loss.backward()
            loss_total += float(terms.loss.detach())
            for k in STAT_NAMES:
                v = getattr(terms, k)
                totals[k] = max(totals[k], v) if k == "ratio_max" else totals[k] + v
        return torch.tensor([loss_total, *totals.values()], dtype=torch.float64)

    def sync_weights(self) -> None:
        with self.clock.phase("sync"):
            self.engine.update_weights(self.model.state_dict())

    def evaluate(self, collections: int, counters: dict) -> float:
        """Greedy validation accuracy now; one row per problem goes to evals.parquet."""
        cfg = self.cfg
        with self.clock.phase("evaluation"):
            rows = evaluate(
                self.engine,
                self.tokenizer,
                self.val_problems,
                cfg.eval_max_new_tokens or cfg.max_new_tokens,
                batch_size=cfg.max_concurrent_sequences,
            )
        meta = {
            "run_id": cfg.resolved_run_id,
            "split": "validation",
            "collections": collections,
            "updates": counters["updates"],
            "responses": counters["responses"],
            "output_tokens": counters["output_tokens"],
            "active_seconds": self.clock.active,
            "job_seconds": self.clock.job,
        }
        records = [meta | r for r in rows]
        self.run.add_evals(records)
        self.tracker.log_eval(records)
        return float(np.mean([r["correct"] for r in rows])) if rows else float("nan")

    # ----------------------------------------------------------------- records
    def _record_collection(
        self, batch: Collection, updates: list[dict], diagnostics: dict, counters: dict, before: dict[str, float]
    ) -> None:
        """Append the collection's row to collections.jsonl and a few of its responses to samples."""
        counters["responses"] += len(batch.seqs)
        counters["updates"] += len(updates)
        counters["output_tokens"] += sum(batch.generation.response_lengths)
        row = collection_record(batch, updates, diagnostics, counters, self.plan.n_samples_per_prompt)
        row |= {
            "distinct_prompts": len(self.sampler.seen),
            "seconds": {k: self.clock.seconds[k] - v for k, v in before.items()},  # this collection's phases
            "active_seconds": self.clock.active,
            "job_seconds": self.clock.job,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
            "engine": self.engine.stats(),  # SGLang: re-sent requests, server restarts, weight version (cumulative)
        }
        self.run.append_collection(row)
        self.tracker.log_collection(row)
        self.run.append_samples(sample_rows(batch, self.train_pool, counters["responses"]))

    def _config_record(self) -> dict:
        cfg = self.cfg
        return {
            "run_id": cfg.resolved_run_id,
            "study": cfg.study,
            "config": cfg.to_dict(),
            "plan": self.plan.summary(cfg.response_budget, cfg.eval_every_responses),
            "data": {
                "task": cfg.task,
                "splits": data_mod.split_hashes(cfg.task),
                "prompt_version": prompt_version(cfg.task),
                "train_pool": len(self.train_pool),
                "validation_evaluated": len(self.val_problems),
            },
            "model": {
                "name": self.model_info.name,
                "source": self.model_info.source,
                "sha256": self.model_info.sha256,
                "path": str(self.model_info.path),
            },
            "device": str(self.device),
            "gpu": torch.cuda.get_device_name(0) if self.device.type == "cuda" else None,
            "placements": self._placements(),
            "rollout_path": getattr(self.engine, "path", cfg.engine),
            "trainer_path": self.trainer_path,
            # the packed paths lay a group's prompt out once (packing.pack); older records copied it per response
            "packed_prompts": "shared" if self.packed_backend else None,
            "determinism": self._determinism_record(),
            "engine_version": getattr(self.engine, "server_version", None),
            "packages": package_versions(),
            "git_commit": git_commit(),
            "source_sha256": source_sha256(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv,
        }

    def _placements(self) -> list[dict]:
        """Where each process that trained this run ran: its first start, then every resume."""
        path = self.run.config_path
        earlier = read_json(path).get("placements", []) if path.exists() else []
        return [*earlier, placement(self.device)]

    def _determinism_record(self) -> dict:
        """What fixes this run's arithmetic and noise, beside the deterministic flag in ``config``."""
        cfg = self.cfg
        if cfg.engine == "sglang":
            sampling = "sglang deterministic inference" if cfg.sglang_deterministic_resolved else "sglang default"
        else:
            keyed = cfg.deterministic or getattr(self.engine, "path", "") == "fused"
            sampling = "keyed per response" if keyed else "torch stream by batch row"
        return {
            "deterministic": cfg.deterministic,
            "settings": self.determinism,
            "sampling_noise": sampling,
            "packed_tokens_per_micro_batch": self._token_budget if cfg.deterministic else None,
        }

    def _check_recorded_config(self) -> None:
        """A resumed run continues the recorded config: one run never mixes two."""
        if not self.run.config_path.exists():
            return
        drift = config_drift(read_json(self.run.config_path).get("config", {}), self.cfg)
        if drift:
            raise ValueError(
                f"resume of {self.run.path} refused: the parameters differ from the recorded ones "
                f"({'; '.join(drift)}). "
                "Resume with the recorded values, or start a new run_id."
            )

    def _clock_state(self) -> dict:
        return {"seconds": dict(self.clock.seconds), "job_seconds": self.clock.job}

    def _restore_clock_from_state(self) -> None:
        state = self.run.state() or {}
        if "seconds" in state:
            self.clock.restore(state["seconds"], state["job_seconds"])

    def _record_failure(self, exc: BaseException) -> None:
        """Best effort: the original error must surface even when the disk is full."""
        with contextlib.suppress(OSError, ValueError):
            self._write_timings()
            interrupted = isinstance(exc, KeyboardInterrupt)
            self.run.write_state(
                "failed",
                len(self.run.collections()),
                error="interrupted" if interrupted else f"{type(exc).__name__}: {exc}",
                traceback="" if interrupted else traceback.format_exc(limit=20),
            )

    # ----------------------------------------------------------------- resume
    def _start_or_resume(self, resuming: bool) -> tuple[int, dict]:
        """Where the loop starts: collection 0, or the newest intact saved state."""
        start, counters = 0, {"responses": 0, "updates": 0, "output_tokens": 0}
        if resuming:
            with self.clock.phase("init"):  # a resumed process's load is part of its start-up
                start, saved = self.load_resume_state()
            counters = saved or counters
        # Records past the last resumable state belong to work that will be redone.
        self.run.truncate_collections(start)
        self.run.truncate_evals(counters["responses"] if start else -1)
        self.run.truncate_samples(start)
        atomic_write_json(self.run.config_path, self._config_record())
        self.run.write_state("running", start)
        return start, counters

    def _resume_point(self, done: int, responses: int) -> bool:
        """Save resumable state every ``resume_every_collections``, or at each evaluation (not after the last)."""
        every = self.cfg.resume_every_collections
        if done >= self.cfg.collections:
            return False
        return done % every == 0 if every else responses in self.cfg.eval_points

    def save_resume_state(self, collections_done: int, counters: dict) -> None:
        """Write ``resume-<N>/`` in a temporary folder, then rename it into place.

        Names never collide, so any crash leaves the previous state or the new one intact; older
        states are removed only after the new one is in place.
        """
        from safetensors.torch import save_model

        with self.clock.phase("checkpoint"):
            final = self.run.resume_dir(collections_done)
            tmp = final.with_name(f".{final.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            with writing_folder(tmp):  # a full disk is one OSError, and the partial folder is removed
                save_model(self.model, str(tmp / "model.safetensors"))  # handles tied embeddings
                torch.save(
                    {
                        "optimizer": self.optimizer.state_dict(),
                        "torch_rng": torch.get_rng_state(),
                        "numpy_rng": np.random.get_state(),
                    },
                    tmp / "optimizer.pt",
                )
                fsync_tree(tmp)
                # state.json last: its presence marks the folder complete.
                atomic_write_json(
                    tmp / "state.json",
                    {
                        "collections_done": collections_done,
                        "counters": counters,
                        "sampler": self.sampler.state(),
                        "seconds": self.clock.seconds,
                        "job_seconds": self.clock.job,
                    },
                )
            shutil.rmtree(final, ignore_errors=True)  # a same-N state from an earlier attempt
            os.replace(tmp, final)
            self.run.prune_resume_states(keep=final)

    def load_resume_state(self) -> tuple[int, dict]:
        """Load the newest intact state; (0, {}) when there is none."""
        from safetensors.torch import load_model

        self.run.remove_partial_resume_states()
        path = self.run.latest_resume_state()
        if path is None:
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
        self.clock.restore(state["seconds"], state["job_seconds"])
        self.engine.update_weights(self.model.state_dict())
        return state["collections_done"], state["counters"]

    # ----------------------------------------------------------------- finish
    def _finish(self, n_coll: int) -> None:
        """Each step can be repeated, so a run killed while finishing finishes on resume."""
        check_interrupted()
        if not self.run.final_path.exists():  # the weights in memory are the run's final weights
            with self.clock.phase("checkpoint"):
                write_digest(self.run, self.cfg.deterministic, weights_sha256(self.model))
                if self.cfg.save_checkpoint:
                    save_checkpoint(self.model, self.tokenizer, self.run.final_path)
        elif not (self.run.path / DIGEST_FILE).exists():  # finished by older code: no weights hash to give
            write_digest(self.run, self.cfg.deterministic, None)
        self._write_timings()
        check_interrupted()  # not "complete" after a Ctrl-C, however late
        self.run.write_state("complete", n_coll)
        self.run.prune_resume_states(keep=None)

    def _write_timings(self) -> None:
        atomic_write_json(self.run.timings_path, self.clock.summary())


def resolve_trainer_path(trainer_path: str, model: torch.nn.Module, device: torch.device) -> str:
    """The path the trainer runs: ``trainer_path`` itself, checked, or for ``auto`` the fastest
    this model, device and environment support (packed-liger on CUDA with liger-kernel
    installed, else packed; padded for models the packed forward does not reproduce)."""
    supported = supports_packed(model)
    if trainer_path == "padded":
        return trainer_path
    if trainer_path == "auto":
        if not supported:
            return "padded"
        return "packed-liger" if device.type == "cuda" and liger_available() else "packed"
    if not supported:
        raise ValueError(f"trainer_path={trainer_path} does not support {type(model).__name__}; use auto or padded.")
    check_backend(PACKED_BACKENDS[trainer_path], device)
    return trainer_path


class NonFiniteError(RuntimeError):
    """A loss, gradient norm, update statistic or weight turned NaN or infinite; the run stops there."""


def check_finite(values: list[list[float]], collection: int, steps: int) -> None:
    """Raise :class:`NonFiniteError` at the first update whose ``UPDATE_VALUES`` or largest weight (the
    last entry) is not finite, naming the collection and update."""
    names = (*UPDATE_VALUES, "largest weight")
    for k, row in enumerate(values):
        bad = [name for name, value in zip(names, row) if not math.isfinite(value)]
        if bad:
            shown = ", ".join(f"{name} {row[names.index(name)]}" for name in bad)
            raise NonFiniteError(
                f"training stopped at collection {collection}, update {collection * steps + k + 1} "
                f"(update {k + 1} of its {steps}): non-finite {shown}. The run is marked failed and keeps nothing "
                "of this collection; resume=true continues from its last saved state (or use a lower lr, new run_id)."
            )


def _finite_or_none(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _collection_diagnostics(batch: Collection, adv: torch.Tensor, old_logp: list[torch.Tensor], g: int) -> dict:
    """Engine/trainer log-prob mismatch, the entropy estimate and the zero-advantage share."""
    gen = batch.generation
    mismatch = None
    if gen.logprobs is not None:
        diffs = [torch.tensor(e[: len(o)]) - o for e, o in zip(gen.logprobs, old_logp)]
        mismatch = float(torch.cat(diffs).abs().mean()) if diffs else None
    sampled = torch.cat(old_logp) if old_logp else torch.zeros(0)  # [tokens]
    return {
        # None where undefined, or where an engine reported a log-prob of -inf (records hold finite numbers)
        "logprob_mismatch": _finite_or_none(mismatch),
        # -log p of tokens sampled from the policy at this temperature: an unbiased estimate of the
        # mean token entropy, with no pass over the vocabulary.
        "entropy_mean": _finite_or_none(float(-sampled.mean())) if sampled.numel() else None,
        "zero_advantage_fraction": float((adv.view(-1, g) == 0).all(dim=1).float().mean()),
    }


def collection_record(batch: Collection, updates: list[dict], diagnostics: dict, counters: dict, g: int) -> dict:
    """The learning-side fields of a collections.jsonl row (the trainer adds phase times and memory)."""
    gen, rewards = batch.generation, batch.rewards
    lengths = gen.response_lengths
    first_update = counters["updates"] - len(updates) + 1
    return {
        "collection": batch.index,
        "responses": counters["responses"],
        "updates": counters["updates"],
        "prompts": len(batch.prompts),
        "reward_mean": float(rewards.mean()),
        "mixed_group_fraction": mixed_group_fraction(rewards, g),
        "group_reward_means": [round(float(m), 6) for m in rewards.view(-1, g).mean(dim=1)],  # [P]
        "truncation_fraction": float(np.mean([f == "length" for f in gen.finish_reasons])),
        "response_length_mean": float(np.mean(lengths)),
        "response_length_max": int(max(lengths)),
        "output_tokens": int(sum(lengths)),
        "output_tokens_cum": counters["output_tokens"],
        "per_update": [{"update": first_update + k} | u for k, u in enumerate(updates)],
        **diagnostics,
    }


def sample_rows(batch: Collection, pool: list, responses: int, per_outcome: int = SAMPLES_PER_OUTCOME) -> list[dict]:
    """The first ``per_outcome`` responses of each reward value in the collection, as text."""
    gen, kept, rows = batch.generation, {}, []
    for k, reward in enumerate(batch.rewards.tolist()):
        if kept.get(reward, 0) >= per_outcome:
            continue
        kept[reward] = kept.get(reward, 0) + 1
        rows.append(
            {
                "collection": batch.index,
                "responses": responses,
                "prompt_id": pool[batch.prompts[gen.prompt_index[k]]].id,
                "reward": reward,
                "finish_reason": gen.finish_reasons[k],
                "length": len(gen.token_ids[k]),
                "text": gen.texts[k],
            }
        )
    return rows


def save_checkpoint(model: torch.nn.Module, tokenizer, path: Path) -> None:
    """Write a safetensors checkpoint folder atomically (temporary folder, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing_folder(tmp):
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        fsync_tree(tmp)
    if path.exists():
        raise FileExistsError(f"{path} already exists; checkpoints are never overwritten.")
    os.replace(tmp, path)


def train(cfg: RunConfig | dict, progress: bool = True) -> Path:
    """Run one training run and return its run directory."""
    if isinstance(cfg, dict):
        cfg = RunConfig.from_dict(cfg)
    if os.environ.get(DIE_WITH_PARENT_ENV):
        die_with_parent()
    # Ctrl-C and SIGTERM (a study stopped, a scheduler's kill) end the run recorded as interrupted and
    # resumable; the loop checks for one whose KeyboardInterrupt Python dropped (runtime.interrupts).
    with interrupts():
        return Trainer(cfg, progress=progress).run_loop()
