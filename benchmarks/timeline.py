"""Marks on the CUDA stream around the pieces of ``StaticDecoder.run``: prefill, each decode step by live width,
the checks and compactions between steps, and gathering the outputs. Used by ``collection_timeline`` and by
``rollout``'s split of its fixed-length rows. No host syncs are added, so a span is GPU time including any gap
in which the GPU waited for the host; on CPU every span is wall time."""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class Timeline:
    """Labelled marks in stream order; the time between two marks is charged to the later mark's label."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []
        self.run_seconds = 0.0  # wall time of the last instrumented StaticDecoder.run

    def mark(self, label: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((label, event))
        else:
            self.marks.append((label, time.perf_counter()))

    def spans(self) -> list[tuple[str, float]]:
        """(label, milliseconds) for each interval between consecutive marks; the marks are then cleared."""
        if self.cuda:
            torch.cuda.synchronize()
        pairs = zip(self.marks, self.marks[1:])
        spans = [(label, a.elapsed_time(b) if self.cuda else (b - a) * 1e3) for (_, a), (label, b) in pairs]
        self.marks = []
        return spans

    def by_label(self) -> tuple[dict[str, float], dict[str, int]]:
        """The spans (:meth:`spans`) summed by label: milliseconds, and how many decode steps each step label
        holds."""
        ms, steps = defaultdict(float), defaultdict(int)
        for label, span in self.spans():
            ms[label] += span
            steps[label] += label.startswith("step ")
        return dict(ms), {k: v for k, v in steps.items() if v}


def instrument(decoder, timeline: Timeline):
    """Wrap the decoder's run, step and compaction (on this instance only) with timeline marks; returns a
    function that takes the wrappers off again."""
    run, step, keep = decoder.run, decoder._step, decoder._keep_rows
    state = {"steps": 0}

    def timed_run(*args, **kwargs):
        state["steps"] = 0
        timeline.mark("start")
        start = time.perf_counter()
        out = run(*args, **kwargs)
        timeline.mark("after the steps")  # outputs gathered and copied to the host
        timeline.run_seconds = time.perf_counter() - start  # run() ends copying to the host: the GPU is done
        return out

    def timed_step(width, *args):
        timeline.mark("prefill" if state["steps"] == 0 else "between steps")  # checks, Python between launches
        state["steps"] += 1
        step(width, *args)
        timeline.mark(f"step {width}")

    def timed_keep(*args):
        timeline.mark("between steps")
        out = keep(*args)
        timeline.mark("compaction")
        return out

    decoder.run, decoder._step, decoder._keep_rows = timed_run, timed_step, timed_keep

    def restore() -> None:
        for name in ("run", "_step", "_keep_rows"):
            vars(decoder).pop(name)  # the class's methods show through again

    return restore


@contextmanager
def garbage_collections():
    """Time Python's garbage collections while the block runs: yields a dict whose "ms" (total wall time of the
    collections) and "full" (how many were of the oldest generation, which walk every tracked object) are
    filled in as they happen."""
    seen = {"ms": 0.0, "full": 0}
    started = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            seen["ms"] += (time.perf_counter() - started.pop()) * 1e3
            seen["full"] += info["generation"] == 2

    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)
