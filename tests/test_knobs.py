"""Exact batch accounting: P x G = B x S, never floored or trimmed."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from grpo_knobs.knobs import LR_FOLLOWUP_ARM, STUDY_ARMS, BatchPlan, update_slices
from hypothesis import given, settings
from hypothesis import strategies as st

STUDY_TABLE = {  # arm: (P, G, B, S, lr multiplier), as the study lists them
    "onpolicy-small": (16, 8, 128, 1, 1.0),
    "split-2": (32, 8, 128, 2, 1.0),
    "split-4": (64, 8, 128, 4, 1.0),
    "split-8": (128, 8, 128, 8, 1.0),
    "batch-256": (64, 8, 256, 2, 1.0),
    "batch-256-sqrt": (64, 8, 256, 2, math.sqrt(2)),
    "onpolicy-large": (64, 8, 512, 1, 1.0),
    "onpolicy-large-sqrt": (64, 8, 512, 1, 2.0),
    "group-4": (128, 4, 128, 4, 1.0),
    "group-16": (32, 16, 128, 4, 1.0),
    "group-32": (16, 32, 128, 4, 1.0),
}


@pytest.mark.parametrize("name", sorted(STUDY_TABLE))
def test_every_study_arm_validates_and_derives_its_steps(name):
    p, g, b, s, mult = STUDY_TABLE[name]
    arm = STUDY_ARMS[name]
    assert (arm.rollout_batch_size, arm.n_samples_per_prompt, arm.global_batch_size, arm.num_steps_per_rollout) == (
        p,
        g,
        b,
        s,
    )
    assert arm.lr_multiplier == pytest.approx(mult)
    derived = BatchPlan(p, g, b)
    assert derived.num_steps_per_rollout == s
    assert derived.responses_per_collection == b * s
    # 16,384 screening responses: exact collections and updates
    assert derived.collections_for_budget(16384) * p * g == 16384
    assert derived.updates_for_budget(16384) == 16384 // b


def test_study_grid_has_eleven_arms_and_the_lr_followup():
    assert len(STUDY_ARMS) == 11
    assert LR_FOLLOWUP_ARM.plan.num_steps_per_rollout == 1
    assert 3e-6 * LR_FOLLOWUP_ARM.lr_multiplier == pytest.approx(1e-6)


def test_group_sizes_expose_the_studys_prompt_counts():
    exposed = {
        g: STUDY_ARMS[n].plan.prompts_exposed(16384)
        for n, g in [("group-4", 4), ("split-4", 8), ("group-16", 16), ("group-32", 32)]
    }
    assert exposed == {4: 4096, 8: 2048, 16: 1024, 32: 512}


def test_inconsistent_shape_names_the_knob_and_valid_values():
    with pytest.raises(ValueError) as e:
        BatchPlan(64, 8, 128, 2)
    msg = str(e.value)
    assert "64 x 8 = 512" in msg and "128 x 2 = 256" in msg and "num_steps_per_rollout=4" in msg


def test_nondividing_batch_is_refused_with_nearest_divisors():
    with pytest.raises(ValueError) as e:
        BatchPlan(16, 8, 100)
    assert "global_batch_size=100" in str(e.value) and "64, 128" in str(e.value)


@pytest.mark.parametrize(
    "kw",
    [
        dict(rollout_batch_size=0),
        dict(n_samples_per_prompt=1),
        dict(global_batch_size=-8),
        dict(rollout_batch_size=16.0),
        dict(n_samples_per_prompt=True),
        dict(global_batch_size="128"),
    ],
)
def test_bad_values_are_refused(kw):
    args = dict(rollout_batch_size=16, n_samples_per_prompt=8, global_batch_size=128) | kw
    with pytest.raises(ValueError):
        BatchPlan(**args)


def test_group_of_one_is_rejected_with_reason():
    with pytest.raises(ValueError, match="at least 2"):
        BatchPlan(16, 1, 16)


def test_budget_must_be_whole_collections():
    plan = BatchPlan(16, 8, 128)
    with pytest.raises(ValueError, match="multiple of 128"):
        plan.collections_for_budget(1000)


def test_eval_schedule_includes_zero_every_n_and_end():
    plan = BatchPlan(64, 8, 512)
    assert plan.eval_points(16384, 4096) == [0, 4096, 8192, 12288, 16384]
    assert plan.eval_points(2560, 1024) == [0, 1024, 2048, 2560]
    with pytest.raises(ValueError, match="whole number of collections"):
        plan.eval_points(16384, 1000)


@given(p=st.integers(1, 256), g=st.integers(2, 64), b=st.integers(1, 4096))
def test_accounting_is_exact_or_refused(p, g, b):
    try:
        plan = BatchPlan(p, g, b)
    except ValueError:
        assert (p * g) % b != 0
        return
    assert plan.global_batch_size * plan.num_steps_per_rollout == p * g


def test_cli_prints_the_derived_plan_and_errors():
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_knobs.cli",
            "knobs",
            "--rollout-batch-size",
            "64",
            "--n-samples-per-prompt",
            "8",
            "--global-batch-size",
            "512",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(ok.stdout)["num_steps_per_rollout"] == 1
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_knobs.cli",
            "knobs",
            "--rollout-batch-size",
            "64",
            "--n-samples-per-prompt",
            "8",
            "--global-batch-size",
            "500",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "global_batch_size=500" in bad.stderr


# --- update_slices: which responses each update uses ---------------------------------------


@st.composite
def plans(draw):
    """Valid shapes: B divides P x G (every response used once)."""
    p, g = draw(st.integers(1, 40)), draw(st.integers(2, 16))
    divisors = [d for d in range(1, p * g + 1) if (p * g) % d == 0]
    return BatchPlan(p, g, draw(st.sampled_from(divisors)))


@settings(max_examples=300, deadline=None)
@given(plans(), st.integers(0, 2**31), st.integers(0, 1000))
def test_update_slices_use_every_response_exactly_once(plan, seed, collection):
    slices = update_slices(plan, seed, collection)
    assert len(slices) == plan.num_steps_per_rollout
    assert all(s.shape == (plan.global_batch_size,) for s in slices)
    flat = np.concatenate(slices)
    assert sorted(flat.tolist()) == list(range(plan.responses_per_collection))  # disjoint and covering


@settings(max_examples=300, deadline=None)
@given(plans(), st.integers(0, 2**31), st.integers(0, 1000))
def test_update_slices_hold_whole_groups_when_g_divides_b(plan, seed, collection):
    g = plan.n_samples_per_prompt
    for s in update_slices(plan, seed, collection):
        groups = s // g
        if plan.global_batch_size % g == 0:
            assert all((groups == k).sum() == g for k in np.unique(groups))  # every member of each group
        # Members of a group are contiguous in the shuffled order, so a slice splits at most two groups.
        assert len(np.unique(groups)) <= plan.global_batch_size // g + 2


@given(plans(), st.integers(0, 2**31), st.integers(0, 1000))
def test_update_slices_are_fixed_by_seed_and_collection(plan, seed, collection):
    a, b = update_slices(plan, seed, collection), update_slices(plan, seed, collection)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_update_slices_differ_between_collections_and_seeds():
    plan = BatchPlan(64, 8, 128)
    base = np.concatenate(update_slices(plan, 1, 0))
    assert not np.array_equal(base, np.concatenate(update_slices(plan, 1, 1)))
    assert not np.array_equal(base, np.concatenate(update_slices(plan, 2, 0)))


def test_update_slices_match_the_recorded_rule():
    """The rule the committed runs used: groups permuted by default_rng([seed, 11, collection])."""
    plan = BatchPlan(4, 2, 4)
    order = np.random.default_rng([3, 11, 5]).permutation(4)
    expected = [g * 2 + k for g in order for k in range(2)]
    assert np.concatenate(update_slices(plan, 3, 5)).tolist() == expected
