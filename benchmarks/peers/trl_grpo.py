"""The study's batch-256 recipe trained with TRL's GRPOTrainer, for a job-time comparison.

Same model (loaded by ``grpo_knobs.models.load_model``), task and prompts (``render_prompt``),
reward (``grpo_knobs.verifiers.grade``), knob shape, response cap, sampling, optimizer and
loss as a ``grpo-knobs train`` run of 64/8/256/2 at LR 2e-5. TRL's names for the knobs
(trl 1.16, ``GRPOConfig``):

- G -> ``num_generations``; P x G -> ``per_device_train_batch_size x steps_per_generation``
  (TRL's ``generation_batch_size``; the two are mutually exclusive, so the script sets
  steps_per_generation); B -> ``per_device_train_batch_size x gradient_accumulation_steps``;
  S = steps_per_generation / gradient_accumulation_steps optimizer steps per generation;
  ``num_iterations=1`` (each response used once).
- clip 0.2 / 0.28 -> ``epsilon`` / ``epsilon_high``; sequence-mean loss -> ``loss_type="grpo"``
  (each response's token mean, averaged over the micro-batch and divided by the
  accumulation steps: the mean over B); group std scaling -> ``scale_rewards="group"``;
  no KL -> ``beta=0``; AdamW (0.9, 0.98), weight decay 0.1, clip 1.0, constant LR.

Where TRL differs from the study's trainer (it cannot be told otherwise):
- the generation batch is shuffled response by response before it is cut into updates
  (``shuffle_sequence_dict``), so a group's responses can land in different updates; the
  study shuffles whole groups and keeps each group inside one update;
- advantages divide by (std + 1e-4) where the study uses (std + 1e-6); zero-variance
  groups get zero advantage on both;
- responses come from ``model.generate`` (transformers), not the study's fused decoder;
- prompt order comes from TRL's seeded sampler, not the study's PromptSampler.

Prints and writes job seconds per 1,024 responses and the reward curve; ``--time-limit``
stops training at an optimizer-step boundary and records how far it got.

    python -m benchmarks.peers.trl_grpo --responses 16384 --out benchmarks/results/trl-peer-h200.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def build_config(a, out_dir: str, cuda: bool):
    from trl import GRPOConfig

    p, g, b, s = a.prompts, a.group, a.batch, (a.prompts * a.group) // a.batch
    if p * g != b * s:
        raise SystemExit(f"P x G = {p * g} must equal B x S; B={b} does not divide it.")
    micro = min(a.micro_batch, b)
    if b % micro:
        raise SystemExit(f"--micro-batch {micro} must divide B={b}.")
    accum = b // micro
    return GRPOConfig(
        output_dir=out_dir,
        seed=a.seed,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-8,
        weight_decay=0.1,
        max_grad_norm=1.0,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum * s,
        num_generations=g,
        num_iterations=1,
        max_completion_length=a.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        max_steps=a.responses // b,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=cuda,
        use_cpu=not cuda,
        disable_dropout=True,
        remove_unused_columns=False,
        log_completions=False,
        shuffle_dataset=True,
        dataloader_num_workers=0,
    ), {
        "P": p,
        "G": g,
        "B": b,
        "S": s,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accum,
        "steps_per_generation": accum * s,
        "generation_batch_size": p * g,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="countdown-2x10")
    ap.add_argument("--prompts", type=int, default=64, help="P")
    ap.add_argument("--group", type=int, default=8, help="G")
    ap.add_argument("--batch", type=int, default=256, help="B")
    ap.add_argument("--micro-batch", type=int, default=64, help="responses per forward/backward (memory only)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--responses", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=None, help="validation problems scored after training")
    ap.add_argument("--time-limit", type=float, default=None, help="stop at the first optimizer step past this many s")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    t0 = time.perf_counter()  # job time starts before the model loads, as a run's init phase does
    import transformers
    import trl
    from datasets import Dataset
    from grpo_knobs.data import load_split
    from grpo_knobs.models import load_model
    from grpo_knobs.prompts import render_prompt
    from grpo_knobs.trainer import resolve_device
    from grpo_knobs.verifiers import grade
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    device = resolve_device(a.device)
    cuda = device.type == "cuda"
    model, tok, info = load_model(a.model, device=device, dtype=torch.float32)
    train_pool = load_split(a.task, "train")
    prompts = [render_prompt(p, tok) for p in train_pool]
    ours = tok(prompts[0], add_special_tokens=False)["input_ids"]
    theirs = tok(text=[prompts[0]])["input_ids"][0]  # how GRPOTrainer tokenizes a plain-text prompt
    if ours != theirs:
        raise SystemExit("TRL would tokenize the prompts differently from the study (special tokens added).")
    dataset = Dataset.from_dict({"prompt": prompts, "problem": list(range(len(train_pool)))})

    def countdown_reward(prompts, completions, problem, **kwargs):
        return [float(grade(train_pool[i], c)) for i, c in zip(problem, completions)]

    curve: list[dict] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:  # logged once per generation, at its first update
                s = (a.prompts * a.group) // a.batch
                curve.append(
                    {
                        "update": state.global_step,
                        "responses": ((state.global_step - 1) // s + 1) * a.prompts * a.group,
                        "reward_mean": logs["reward"],
                        "job_seconds": time.perf_counter() - t0,
                        "completion_length_mean": logs.get("completions/mean_length"),
                    }
                )

        def on_step_end(self, args, state, control, **kw):
            # Stop only where a generation's S updates are complete, so every counted response was trained on.
            s = (a.prompts * a.group) // a.batch
            if a.time_limit and time.perf_counter() - t0 > a.time_limit and state.global_step % s == 0:
                control.should_training_stop = True

    with tempfile.TemporaryDirectory() as tmp:
        cfg, mapping = build_config(a, tmp, cuda)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=countdown_reward,
            args=cfg,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[Record()],
        )
        trainer.train()
    if cuda:
        torch.cuda.synchronize()
    job = time.perf_counter() - t0
    updates = trainer.state.global_step
    responses = updates * a.batch

    # Validation accuracy of the trained policy with the study's greedy evaluation (outside the job time).
    from grpo_knobs.evaluation import evaluate
    from grpo_knobs.rollout import make_engine

    model.eval()
    validation = load_split(a.task, "validation")
    validation = validation[: a.eval_problems] if a.eval_problems else validation
    engine = make_engine("hf", model, tok, device=device, max_batch_size=512)
    rows = evaluate(engine, tok, validation, a.max_new_tokens, batch_size=512)
    accuracy = sum(r["correct"] for r in rows) / max(len(rows), 1)

    result = {
        "peer": "trl",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "model": info.name,
        "task": a.task,
        "seed": a.seed,
        "lr": a.lr,
        "max_new_tokens": a.max_new_tokens,
        "knobs": mapping,
        "responses_planned": a.responses,
        "responses": responses,
        "updates": updates,
        "completed": responses >= a.responses,
        "time_limit": a.time_limit,
        "job_seconds": job,
        "seconds_per_1024_responses": job / responses * 1024 if responses else None,
        "validation_accuracy_final": accuracy,
        "validation_problems": len(rows),
        "reward_curve": curve,
        "argv": [str(x) for x in (argv or [])],
    }
    print(
        f"TRL {trl.__version__}: {responses} responses ({updates} updates) in {job:.1f} s "
        f"= {result['seconds_per_1024_responses'] or float('nan'):.2f} s per 1,024 responses; "
        f"final validation {accuracy:.3f} on {len(rows)} problems"
    )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
