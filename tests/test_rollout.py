"""Rollout engines on CPU: the eager generate path, the static-cache fast path, and their agreement."""

import copy
import os

import pytest
import torch
from grpo_knobs.models import load_model
from grpo_knobs.rollout import Generation, cut_at_stop, make_engine
from grpo_knobs.rollout.base import ResponseStream, byte_table, cleans_up_spaces, cut_rows, decode_texts
from grpo_knobs.rollout.hf import HFEngine, left_pad, response_keys, sample_tokens
from tokenizers import decoders

# The tiny model lives on the CPU, where the fused kernels run in Triton's interpreter; a GPU host
# compiles them instead (tests/test_kernels.py runs them there, benchmarks.rollout times them).
FUSED = pytest.param(
    "fused",
    marks=pytest.mark.skipif(
        torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
        reason="the CPU model's fused path needs Triton's interpreter, which a GPU host does not select",
    ),
)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer, _ = load_model("tiny-random")
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(tiny):
    """Three plain-text prompts of different lengths (left padding matters), no special tokens."""
    _, tokenizer = tiny
    texts = ["The cat sat", "Seven plus five equals twelve, and eight", "A"]
    return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


@pytest.fixture(scope="module")
def staggered(tiny):
    """Eight prompts and weights under which their greedy responses stop after 3 to 12 tokens."""
    model, tokenizer = tiny
    texts = [
        "The cat sat",
        "Seven plus five equals twelve, and eight",
        "A",
        "Dogs bark at night",
        "one two three four five",
        "Rain",
        "Blue sky over the hills",
        "Numbers: 3 9 27",
    ]
    prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    first = HFEngine(model, tokenizer, fast=False).generate(prompts[:1], n=1, max_new_tokens=12, temperature=0, seed=0)
    return prompts, eos_likely(model, tokenizer, first.token_ids[0][5])


def eos_likely(model, tokenizer, token):
    """A state dict in which EOS's output row is twice `token`'s, so EOS wins wherever `token` would."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    head = state["lm_head.weight"]
    head[tokenizer.eos_token_id] = 2 * head[token]
    return state


def scored_logprobs(model, prompt, response, temperature):
    """Teacher-forced log-probs of `response` after `prompt` under softmax(logits / T) (T = 0: at T = 1)."""
    ids = torch.tensor([prompt + response])  # [1, P + R]
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [R, V]
    logits = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]  # [R]


def test_shapes_and_prompt_major_order(tiny, prompts):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=False)
    gen = engine.generate(prompts, n=3, max_new_tokens=6, temperature=0, seed=0)
    assert isinstance(gen, Generation) and gen.num_responses == 9
    assert gen.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(gen.texts) == len(gen.finish_reasons) == 9 and gen.logprobs is None
    assert all(1 <= n <= 6 for n in gen.response_lengths)
    # greedy: the n copies agree, and each block is what that prompt alone produces
    for i, prompt in enumerate(prompts):
        block = gen.token_ids[3 * i : 3 * i + 3]
        assert block[0] == block[1] == block[2]
        assert engine.generate([prompt], n=1, max_new_tokens=6, temperature=0, seed=0).token_ids[0] == block[0]


@pytest.mark.parametrize("fast", [False, True])
def test_eos_included_and_nothing_after(tiny, prompts, fast):
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id
    assert tokenizer.pad_token_id == eos  # the SmolLM2 tokenizer: masks must come from the first EOS
    engine = HFEngine(model, tokenizer, fast=fast, return_logprobs=True)
    first = engine.generate(prompts, n=1, max_new_tokens=12, temperature=0, seed=0)
    engine.update_weights(eos_likely(model, tokenizer, first.token_ids[0][3]))
    for temperature in (0, 0.5):  # at T = 0.5 samples stay close enough to the greedy path to meet EOS
        gen = engine.generate(prompts, n=3, max_new_tokens=12, temperature=temperature, seed=1)
        assert "stop" in gen.finish_reasons
        for tokens, reason, lps in zip(gen.token_ids, gen.finish_reasons, gen.logprobs):
            assert len(lps) == len(tokens)
            assert eos not in tokens[:-1]
            if reason == "stop":
                assert tokens[-1] == eos
            else:
                assert reason == "length" and len(tokens) == 12 and tokens[-1] != eos
    assert gen.token_ids[0][-1] == eos and not gen.texts[0].endswith(tokenizer.eos_token)


@pytest.mark.parametrize("fast", [False, True, FUSED])
def test_seeded_determinism(tiny, prompts, fast):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=fast)
    torch.manual_seed(123)
    a = engine.generate(prompts, n=2, max_new_tokens=8, temperature=1.0, seed=7)
    after_a = torch.rand(1)
    torch.manual_seed(123)
    b = engine.generate(prompts, n=2, max_new_tokens=8, temperature=1.0, seed=7)
    assert a.token_ids == b.token_ids
    assert torch.equal(after_a, torch.rand(1))  # the caller's random stream is untouched
    c = engine.generate(prompts, n=2, max_new_tokens=8, temperature=1.0, seed=8)
    assert a.token_ids != c.token_ids
    assert a.token_ids[0] != a.token_ids[1]  # copies of one prompt are independent samples


@pytest.mark.parametrize("fast", [False, True, FUSED])
def test_greedy_is_argmax(tiny, prompts, fast):
    model, tokenizer = tiny
    gen = HFEngine(model, tokenizer, fast=fast).generate(prompts, n=1, max_new_tokens=8, temperature=0, seed=0)
    for prompt, response in zip(prompts, gen.token_ids):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            argmax = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1)  # [R]
        assert argmax.tolist() == response


@pytest.mark.parametrize("fast", [False, True, FUSED])
def test_update_weights_in_place(tiny, prompts, fast):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=fast)
    ptrs = {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    before = engine.generate(prompts, n=1, max_new_tokens=8, temperature=0, seed=0).token_ids
    g = torch.Generator().manual_seed(0)
    state = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    engine.update_weights(state)
    after = engine.generate(prompts, n=1, max_new_tokens=8, temperature=0, seed=0).token_ids
    assert after != before
    assert ptrs == {n: p.data_ptr() for n, p in engine.model.named_parameters()}
    assert torch.equal(engine.model.lm_head.weight, state["lm_head.weight"])
    with pytest.raises(KeyError, match="unexpected"):
        engine.update_weights({"not.a.weight": torch.zeros(1)})


def test_fused_on_a_cpu_model_needs_the_interpreter(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        HFEngine(model, tokenizer, fast="fused")


def test_engine_owns_its_weights(tiny, prompts):
    """The trainer's optimizer steps must not leak into generation before weight sync."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=False)
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(model.parameters(), engine.model.parameters()))


@pytest.mark.parametrize("fast", [True, FUSED])
def test_fast_matches_eager(tiny, prompts, fast):
    model, tokenizer = tiny
    kw = dict(n=3, max_new_tokens=12, temperature=0, seed=0)
    eager = HFEngine(model, tokenizer, fast=False, return_logprobs=True, max_batch_size=4).generate(prompts, **kw)
    fast = HFEngine(model, tokenizer, fast=fast, return_logprobs=True, max_batch_size=4).generate(prompts, **kw)
    assert fast.token_ids == eager.token_ids
    assert fast.finish_reasons == eager.finish_reasons and fast.texts == eager.texts
    for a, b in zip(fast.logprobs, eager.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "linear_rows, split",
    [pytest.param(0, False, id="cublas-gemms"), pytest.param(1 << 30, False, id="own-gemms"), (1 << 30, True)],
)
def test_fused_routes_match_eager(tiny, prompts, monkeypatch, linear_rows, split):
    """The fused step's projections through cuBLAS on the stream (the norms folded in), or through kernels.py's
    GEMMs with the norm or the residual add inside; attention over the whole cache per program, or split into
    16-slot pieces combined by the last program (the tally left at zero for the next launch)."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU model's fused path needs Triton's interpreter")
    from grpo_knobs.rollout import kernels

    monkeypatch.setattr(kernels, "SPLIT_CHUNK", 16)
    monkeypatch.setattr(kernels, "sm_count", lambda device: 1 << 20 if split else 1)
    model, tokenizer = tiny
    launches = []
    attend = kernels.rotary_attention
    monkeypatch.setattr(kernels, "rotary_attention", lambda *a, **k: launches.append(a[8]) or attend(*a, **k))
    kw = dict(n=2, max_new_tokens=12, temperature=0, seed=0)
    eager = HFEngine(model, tokenizer, fast=False, return_logprobs=True, max_batch_size=8).generate(prompts, **kw)
    engine = HFEngine(model, tokenizer, fast="fused", return_logprobs=True, max_batch_size=8, compact=False)
    engine.decoder.linear_rows = linear_rows
    fused = engine.generate(prompts, **kw)
    assert launches and min(launches) >= 64  # kv_len: with 16-slot pieces, every launch splits at least four ways
    assert fused.token_ids == eager.token_ids
    for a, b in zip(fused.logprobs, eager.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)
    assert not engine.decoder.counts.any()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_folded_norms_match_eager(tiny, prompts, arch):
    """A wide fused step multiplies the residual stream itself by weights with the norms' weights folded in,
    and attention and the SiLU-gate divide by each row's rms; with norm weights far from one, and qwen2's
    q|k|v biases added after that division, greedy tokens and log-probs stay the eager path's."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU model's fused path needs Triton's interpreter")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base, tokenizer = tiny
    model = copy.deepcopy(base)
    if arch == "qwen2":
        cfg = Qwen2Config(**{k: v for k, v in base.config.to_dict().items() if k != "model_type"})
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_proj.bias"):
                p.copy_(
                    torch.rand(p.shape, generator=g) * 2.5 + 0.25
                    if "norm" in name
                    else torch.randn(p.shape, generator=g)
                )
    kw = dict(n=2, max_new_tokens=12, temperature=0, seed=0)
    eager = HFEngine(model, tokenizer, fast=False, return_logprobs=True, max_batch_size=8).generate(prompts, **kw)
    engine = HFEngine(model, tokenizer, fast="fused", return_logprobs=True, max_batch_size=8, compact=False)
    engine.decoder.linear_rows = 0  # every width through the folded cuBLAS layer
    fused = engine.generate(prompts, **kw)
    assert fused.token_ids == eager.token_ids
    for a, b in zip(fused.logprobs, eager.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)


def test_fast_samples_match_eager_on_cpu(tiny, prompts):
    """On CPU torch.multinomial draws one sample as an exponential race too, from the same seeded stream,
    so the two paths sample identical tokens (a torch implementation detail: if this breaks alone, the
    distribution tests below still hold). The fused path draws Philox noise in its kernel instead."""
    model, tokenizer = tiny
    kw = dict(n=2, max_new_tokens=12, temperature=0.8, seed=11)
    eager = HFEngine(model, tokenizer, fast=False).generate(prompts, **kw)
    fast = HFEngine(model, tokenizer, fast=True, compact=False).generate(prompts, **kw)
    assert fast.token_ids == eager.token_ids


def compacting_engine(model, tokenizer, fast, state):
    """An engine that checks for finished rows every 2 steps and may shrink to one row, with weights
    under which EOS is likely, so rows finish at different steps and get dropped."""
    engine = HFEngine(model, tokenizer, fast=fast, return_logprobs=True, compact=True, max_batch_size=16)
    engine.decoder.check_every, engine.decoder.min_rows = 2, 1
    engine.update_weights(state)
    return engine


@pytest.mark.parametrize("fast", [True, FUSED])
def test_dropping_finished_rows_keeps_greedy_outputs(tiny, staggered, fast):
    model, tokenizer = tiny
    prompts, state = staggered
    reference = HFEngine(model, tokenizer, fast=True, return_logprobs=True, compact=False, max_batch_size=16)
    reference.update_weights(state)
    engine = compacting_engine(model, tokenizer, fast, state)
    kw = dict(n=1, max_new_tokens=12, temperature=0, seed=0)
    want, got = reference.generate(prompts, **kw), engine.generate(prompts, **kw)
    assert engine.decoder.compactions > 0 and reference.decoder.compactions == 0
    assert len(set(map(len, want.token_ids))) > 2  # rows did finish at different steps
    assert got.token_ids == want.token_ids and got.finish_reasons == want.finish_reasons
    for a, b in zip(got.logprobs, want.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("fast", [True, "fused"])
def test_graph_replays_match_eager_steps_on_cuda(tiny, staggered, fast):
    """A decode step's or a prefill's shape runs eagerly the first time it comes up and is captured then;
    later calls replay it. Replays must give the eager decoder's tokens and log-probs while rows finish and
    are dropped, and a replayed prefill must read the new call's prompts."""
    model, tokenizer = tiny
    prompts, state = staggered
    engines = []
    for graphs in (False, True):
        engine = HFEngine(
            model, tokenizer, device="cuda", fast=fast, return_logprobs=True, compact=True, max_batch_size=16
        )
        engine.decoder.check_every, engine.decoder.min_rows = 2, 1
        engine.decoder.use_graphs = graphs
        engine.update_weights(state)
        engines.append(engine)
    eager, graphed = engines
    # the fused sampler's noise is keyed by seed and step, so sampled tokens must match too
    for temperature in (0.0, 1.0) if fast == "fused" else (0.0,):
        kw = dict(n=2, max_new_tokens=24, temperature=temperature, seed=3)
        prefills = len(graphed.decoder.prefill_graphs)  # greedy and sampled prefills are separate shapes
        want = eager.generate(prompts, **kw)
        first = graphed.generate(prompts, **kw)  # every shape's first call eager, then captured
        captured = len(graphed.decoder.graphs)
        again = graphed.generate(prompts, **kw)  # replays only
        assert captured > 1 and len(graphed.decoder.graphs) == captured
        assert len(graphed.decoder.prefill_graphs) == prefills + 1
        assert graphed.decoder.compactions > 0
        for got in (first, again):
            assert got.token_ids == want.token_ids and got.finish_reasons == want.finish_reasons
            for a, b in zip(got.logprobs, want.logprobs):
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-3, rtol=1e-3)
        # other prompts of the same shape: the replayed prefill reads them
        other = [p[::-1] for p in prompts[::-1]]
        want, got = eager.generate(other, **kw), graphed.generate(other, **kw)
        assert len(graphed.decoder.prefill_graphs) == prefills + 1 and got.token_ids != again.token_ids
        assert got.token_ids == want.token_ids and got.finish_reasons == want.finish_reasons
    assert not eager.decoder.graphs and not eager.decoder.prefill_graphs


def test_dropping_finished_rows_samples_from_the_model(tiny, staggered):
    """Compacted rows draw different noise, so the check is the distribution: every sampled token's
    log-prob equals the teacher-forced one under the engine's weights."""
    model, tokenizer = tiny
    prompts, state = staggered
    engine = compacting_engine(model, tokenizer, True, state)
    gen = engine.generate(prompts, n=2, max_new_tokens=32, temperature=0.5, seed=5)
    assert engine.decoder.compactions > 0
    scorer = copy.deepcopy(model)
    scorer.load_state_dict(state)
    for i, (tokens, lps) in enumerate(zip(gen.token_ids, gen.logprobs)):
        expected = scored_logprobs(scorer, prompts[gen.prompt_index[i]], tokens, 0.5)
        torch.testing.assert_close(torch.tensor(lps), expected, atol=1e-4, rtol=1e-4)


def prefill_calls(engine) -> list:
    """Record each StaticDecoder.run call's (prompt rows prefilled, expand as a list or None)."""
    calls, run = [], engine.decoder.run

    def recorded(ids, mask, n_real, *args, **kwargs):
        expand = args[5] if len(args) > 5 else kwargs.get("expand")  # after max_new_tokens ... keys
        calls.append((ids.shape[0], None if expand is None else expand.tolist()))
        return run(ids, mask, n_real, *args, **kwargs)

    engine.decoder.run = recorded
    return calls


def per_row_and_shared(model, tokenizer, prompts, state, kw: dict, **engine_kw):
    """Generate with a prefill per row, then with shared prefills, in chunks of 10 rows that check for finished
    rows every 2 steps; returns both Generations and, for each, its run calls and compactions."""
    gens, calls, compactions = [], [], []
    for share in (False, True):
        engine = HFEngine(model, tokenizer, return_logprobs=True, max_batch_size=10, **engine_kw)
        engine.decoder.check_every, engine.decoder.min_rows = 2, 1
        engine.update_weights(state)
        engine.share_prefill = share
        calls.append(prefill_calls(engine))
        gens.append(engine.generate(prompts, **kw))
        compactions.append(engine.decoder.compactions)
    return gens, calls, compactions


# n = 3 in chunks of 10 rows: decoder rows -> distinct prompts of each chunk, groups cut at the chunk edges
SHARED_CALLS = [(4, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]), (4, [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]), (2, [0, 1, 1, 1])]


@pytest.mark.parametrize(
    "fast, compact, temperature, keyed, ignore_eos, steps",
    [
        pytest.param(True, False, 0.0, False, False, 12, id="greedy"),
        pytest.param(True, False, 0.3, False, False, 24, id="sampled"),
        pytest.param(True, True, 0.3, False, False, 24, id="sampled-compacting"),
        pytest.param(True, True, 0.3, True, False, 24, id="keyed-compacting"),
        pytest.param(True, False, 0.3, True, True, 12, id="keyed-ignore-eos"),
        # greedy: the interpreted kernels are slow, and greedy rows finish (and are dropped) within 12 steps
        pytest.param(*FUSED.values, True, 0.0, True, False, 12, id="fused-compacting", marks=FUSED.marks),
    ],
)
def test_shared_prefill_matches_a_prefill_per_row(
    tiny, staggered, fast, compact, temperature, keyed, ignore_eos, steps
):
    """Each distinct prompt of a chunk is prefilled once and its cache, validity, position and last hidden
    state copied to the rows that carry it; every row still draws its own noise. Tokens equal those of a
    prefill per row; log-probs agree to float32 rounding, not bit for bit, because the prefill's matrix
    products run over fewer rows and the CPU BLAS may round a row differently with the row count. Chunks
    of 10 rows cut the groups of 3; the prompts' lengths differ (left padding)."""
    model, tokenizer = tiny
    prompts, state = staggered
    kw = dict(n=3, max_new_tokens=steps, temperature=temperature, seed=5, ignore_eos=ignore_eos)
    engine_kw = dict(fast=fast, compact=compact, keyed_sampling=keyed)
    (per_row, shared), calls, compactions = per_row_and_shared(model, tokenizer, prompts, state, kw, **engine_kw)
    assert calls == [[(10, None), (10, None), (4, None)], SHARED_CALLS]
    assert (compactions[1] > 0) == compact and compactions[0] == compactions[1]
    if not ignore_eos:
        assert len(set(shared.response_lengths)) > 2  # rows finished at different steps
    assert shared.token_ids == per_row.token_ids and shared.finish_reasons == per_row.finish_reasons
    assert shared.texts == per_row.texts
    if temperature > 0:
        assert len({tuple(t) for t in shared.token_ids[:3]}) > 1  # one prompt's rows sampled apart
    for a, b in zip(shared.logprobs, per_row.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the shared prefill's CUDA path needs a GPU")
@pytest.mark.parametrize("fast", [True, "fused"])
def test_shared_prefill_matches_a_prefill_per_row_on_cuda(tiny, staggered, fast):
    """As on CPU, in bf16 with CUDA graphs replayed and rows dropped as they finish: tokens equal, log-probs
    to bf16 rounding (the prefill's matrix products may round a row differently with the row count)."""
    model, tokenizer = tiny
    prompts, state = staggered
    for temperature in (0.0, 0.3):
        kw = dict(n=3, max_new_tokens=24, temperature=temperature, seed=5)
        engine_kw = dict(device="cuda", fast=fast, compact=True, keyed_sampling=True)
        (per_row, shared), calls, _ = per_row_and_shared(model, tokenizer, prompts, state, kw, **engine_kw)
        assert calls[1] == SHARED_CALLS
        assert shared.token_ids == per_row.token_ids and shared.finish_reasons == per_row.finish_reasons
        for a, b in zip(shared.logprobs, per_row.logprobs):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-3, rtol=1e-3)


def test_decoder_expands_any_row_to_prompt_map(tiny, prompts):
    """StaticDecoder.run with expand: rows map to the prompts in any order, filler rows past n_real included,
    and decode as the same rows prefilled one by one."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=True, keyed_sampling=True)
    order = [2, 0, 2, 1, 0, 1]  # decoder row -> prompt
    keys = response_keys(9, len(order), 1)  # [6]
    ids, mask = engine._pad([prompts[i] for i in order], 8)  # [8, P]; rows 6 and 7 repeat row 0
    want = engine.decoder.run(ids, mask, 6, 10, 1.0, 0, False, keys)
    ids, mask = engine._pad(prompts, 3)  # [3, P]
    got = engine.decoder.run(ids, mask, 6, 10, 1.0, 0, False, keys, torch.tensor(order + [2, 2]))
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)
    assert engine.decoder.done[6:8].all()  # filler rows stay finished


@pytest.mark.parametrize(
    "fast, share_reads",
    [
        pytest.param(*FUSED.values, True, id="fused", marks=FUSED.marks),
        pytest.param(*FUSED.values, False, id="fused-no-share-reads", marks=FUSED.marks),
        pytest.param(True, True, id="fast"),
    ],
)
def test_rows_of_a_prompt_read_its_first_rows_cache_through_compaction(tiny, prompts, fast, share_reads):
    """``share`` points each decoder row at the first row that carries the same prompt (the fused attention
    reads prompt slots there); when finished rows are dropped, the map follows the moved rows, and every
    row's source holds the same prompt cache as the row itself. A decoder that never reads the map (the
    unfused step, or share_reads off) leaves it unset."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=fast)
    dec = engine.decoder
    dec.share_reads = share_reads
    reads = fast == "fused" and share_reads
    order = [2, 0, 2, 1, 0, 1, 1, 2]  # decoder row -> prompt
    ids, mask = engine._pad(prompts, 3)  # [3, P]
    dec.run(ids, mask, 8, 3, 0.0, 0, True, None, torch.tensor(order))
    assert dec.share[:8].tolist() == ([0, 1, 0, 3, 1, 3, 3, 0] if reads else [0] * 8)
    live = torch.tensor([False, True, True, False, False, True, False, True])  # rows 1, 2, 5, 7 decode on
    tokens, logprobs = torch.zeros(8, 3, dtype=torch.long), torch.zeros(8, 3)
    dec._keep_rows(live, 4, 8, torch.arange(8), tokens, logprobs, 3)
    assert dec.prompt_of[:4].tolist() == [0, 2, 1, 2]
    assert dec.share[:4].tolist() == ([0, 1, 2, 1] if reads else [0] * 4)
    P = ids.shape[1]
    for r, s in enumerate([0, 1, 2, 1]):  # rows of the same prompt hold the same prompt cache
        assert torch.equal(dec.kv[:, :, r, :, :P], dec.kv[:, :, s, :, :P])
        assert torch.equal(dec.valid[r, :P], dec.valid[s, :P])


def test_prompt_rows_merge_repeated_prompts(tiny, prompts):
    """A chunk's distinct prompts by their tokens, in first-occurrence order, whichever prompt index repeats
    them; without repeats every row is its own prompt."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=True)
    a, b, _ = prompts
    ids, mask, expand = engine._prompt_rows([b, a, b, list(a), b])
    assert expand.tolist() == [0, 1, 0, 1, 0] and ids.shape[0] == 2
    assert ids[0, mask[0]].tolist() == b and ids[1, mask[1]].tolist() == a
    ids, mask, expand = engine._prompt_rows([a, b])
    assert expand is None and ids.shape[0] == 2
    engine.share_prefill = False
    assert engine._prompt_rows([a, a])[2] is None


def test_shared_prefill_of_prompts_with_the_same_tokens(tiny, prompts):
    """Prompts that repeat another's tokens share one prefill row and generate as with a prefill per row."""
    model, tokenizer = tiny
    a, b, c = prompts
    gens = []
    for share in (False, True):
        engine = HFEngine(model, tokenizer, fast=True, return_logprobs=True, keyed_sampling=True)
        engine.share_prefill = share
        gens.append(engine.generate([a, b, a, c, b], n=2, max_new_tokens=6, temperature=1.0, seed=3))
    per_row, shared = gens
    assert shared.token_ids == per_row.token_ids
    for x, y in zip(shared.logprobs, per_row.logprobs):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-5, rtol=0)


def test_left_pad(prompts):
    """Rows end at the right edge behind pad; rows past the given ones repeat the first."""
    ids, mask = left_pad(prompts, 5, pad_id=-1)
    width = max(map(len, prompts))
    assert ids.shape == mask.shape == (5, width)
    for row, tokens in zip(range(5), prompts + prompts[:1] * 2):
        gap = width - len(tokens)
        assert ids[row].tolist() == [-1] * gap + tokens
        assert mask[row].tolist() == [False] * gap + [True] * len(tokens)


def test_cut_rows_is_cut_at_stop_per_row():
    """Stop tokens anywhere (first column, last column, twice, none, pad equal to a stop id after it): each
    row ends at its first stop token, kept, with finish "stop", or runs to the cap with "length"; log-probs
    are cut to the same length."""
    stop_ids = {0, 7}
    rows = [
        [0, 0, 0, 0, 0, 0],
        [3, 4, 5, 6, 8, 9],
        [3, 4, 5, 6, 8, 7],
        [3, 7, 5, 0, 0, 0],
        [3, 4, 0, 7, 0, 0],
        [9, 9, 9, 9, 9, 9],
    ]
    g = torch.Generator().manual_seed(0)
    rows += torch.randint(0, 12, (40, 6), generator=g).tolist()
    tokens = torch.tensor(rows)  # [R, S]
    logprobs = -torch.rand(tokens.shape, generator=g)  # [R, S]
    token_ids, finish, lps = cut_rows(tokens, logprobs, stop_ids)
    expected = [cut_at_stop(row, stop_ids) for row in rows]
    assert token_ids == [kept for kept, _ in expected] and finish == [reason for _, reason in expected]
    assert finish[:6] == ["stop", "length", "stop", "stop", "stop", "length"]
    assert token_ids[0] == [0] and token_ids[3] == [3, 7] and token_ids[2] == rows[2]
    assert lps == [logprobs[i, : len(kept)].tolist() for i, kept in enumerate(token_ids)]
    assert cut_rows(tokens, None, stop_ids)[2] is None


def test_decode_texts_is_batch_decode(tiny, prompts):
    """The direct Rust decode gives batch_decode's texts (special tokens skipped); a tokenizer that decodes
    its own way, or cleans up spaces, goes through batch_decode."""
    _, tokenizer = tiny
    eos = tokenizer.eos_token_id
    rows = [p + [eos] for p in prompts] + [[eos], prompts[0][:1], tokenizer("  spaced , out !").input_ids]
    assert decode_texts(tokenizer, rows) == tokenizer.batch_decode(rows, skip_special_tokens=True)
    assert not decode_texts(tokenizer, rows)[0].endswith(tokenizer.eos_token)

    class Shouting(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return super()._decode(token_ids, **kwargs).upper()

    shouting = copy.copy(tokenizer)
    shouting.__class__ = Shouting
    assert decode_texts(shouting, rows) == [t.upper() for t in decode_texts(tokenizer, rows)]
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    cleaning.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    assert decode_texts(cleaning, rows) == cleaning.batch_decode(rows, skip_special_tokens=True)
    assert decode_texts(cleaning, rows) != decode_texts(tokenizer, rows)
    # asked to clean up, a BPE tokenizer does not (transformers 5): the direct decode stays exact
    asked = copy.copy(tokenizer)
    asked.clean_up_tokenization_spaces = True
    asked.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = False
    assert type(asked.backend_tokenizer.model).__name__ == "BPE" and not cleans_up_spaces(asked)
    assert decode_texts(asked, rows) == asked.batch_decode(rows, skip_special_tokens=True)


def test_decode_texts_reads_byte_level_tokens_as_utf8(tiny):
    """The byte table's texts are the Rust decoder's: multi-byte characters, special tokens skipped, rows cut
    inside a character (not UTF-8: left to the decoder, which replaces the bytes), an added token that is not
    special (left to the decoder), and ids past the vocabulary."""
    _, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)  # tokens are added below
    ids = tokenizer("Prices: 5€, 3£ — naïve café 😀 中文 ok", add_special_tokens=False).input_ids
    table = byte_table(tokenizer)
    assert table is not None and all(table[i] for i in ids)  # every token of the text has its bytes
    assert table[tokenizer.eos_token_id] == b"" and None not in table
    emoji = tokenizer("😀", add_special_tokens=False).input_ids
    assert len(emoji) > 1  # a character over several tokens: its first alone is not UTF-8
    rows = [ids, [tokenizer.eos_token_id, *ids, tokenizer.eos_token_id], emoji[:1], ids + emoji[:-1], [], [10**6]]
    tokenizer.add_tokens(["<plain marker>"])  # added, not special: the decoder keeps its text
    marker = tokenizer.convert_tokens_to_ids("<plain marker>")
    rows.append([ids[0], marker, ids[1]])
    table = byte_table(tokenizer)
    assert len(table) == len(tokenizer) and table[marker] is None  # rebuilt when the vocabulary grew
    want = [tokenizer.backend_tokenizer.decode(r, skip_special_tokens=True) for r in rows]
    assert decode_texts(tokenizer, rows) == want == tokenizer.batch_decode(rows, skip_special_tokens=True)
    assert "😀" in want[0] and "\ufffd" in want[2] and "<plain marker>" in want[-1] and want[-2] == ""


def test_response_stream_is_cut_rows_and_decode_texts(tiny):
    """Blocks of output columns added as a decoder writes them (rows moved and dropped between blocks, filler
    and padding rows, stop tokens in any column, a character's bytes over two blocks, an added token that is
    not special, an id past the vocabulary) give cut_rows' lists and decode_texts' texts of the whole output."""
    _, tokenizer = tiny
    tokenizer = copy.deepcopy(tokenizer)  # a token is added below
    tokenizer.add_tokens(["<plain marker>"])
    eos, marker = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<plain marker>")
    text = tokenizer("naïve café 😀 中文 and more plain words here", add_special_tokens=False).input_ids
    emoji = tokenizer("😀", add_special_tokens=False).input_ids
    R, S, k = 12, 20, 6  # responses, columns, block width
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor(text)
    tokens = pool[torch.randint(0, len(text), (R, S), generator=g)]  # [R, S]
    tokens[0, :] = eos  # stops at once
    tokens[1, 5] = eos  # at a block's last column
    tokens[2, 6] = eos  # at a block's first
    tokens[3, 17:] = eos  # in the last block
    tokens[4, 4 : 4 + len(emoji)] = torch.tensor(emoji)  # a character's bytes over two blocks
    tokens[5, 2] = marker
    tokens[6, 9] = 10**6
    tokens[7, 3], tokens[7, 12] = eos, marker  # stops before the marker
    logprobs = -torch.rand(R, S, generator=g)  # [R, S]
    stream = ResponseStream(tokenizer, R, {eos}, logprobs=True)
    # decoder rows: row i carries response origin[i]; a block moves the rows and drops some (filler: -1; R + 1:
    # a padding row past the responses), as compaction does
    origin = torch.arange(R + 2)
    origin[R:] = torch.tensor([-1, R + 1])
    for start in range(0, S, k):
        stream.add(
            tokens[origin.clamp(0, R - 1), start : start + k].numpy(),
            logprobs[origin.clamp(0, R - 1), start : start + k].numpy(),
            origin.numpy(),
        )
        keep = torch.randperm(len(origin), generator=g)
        origin = origin[keep]
        done = [i for i, o in enumerate(origin.tolist()) if 0 <= o < R and (tokens[o, : start + k] == eos).any()]
        origin[done[:2]] = -1  # stopped rows dropped, their outputs already taken
    want_ids, want_finish, want_lps = cut_rows(tokens, logprobs, {eos})
    got_ids, got_finish, got_lps, got_texts = stream.finish()
    assert got_ids == want_ids and got_finish == want_finish and got_lps == want_lps
    assert got_texts == decode_texts(tokenizer, want_ids) == tokenizer.batch_decode(want_ids, skip_special_tokens=True)
    assert "😀" in got_texts[4] and "<plain marker>" in got_texts[5] and "<plain marker>" not in got_texts[7]
    assert got_finish[:4] == ["stop"] * 4 and [len(t) for t in got_ids[:4]] == [1, 6, 7, 18]


def test_byte_table_reads_a_byte_level_decoder_inside_a_sequence(tiny):
    """transformers 5.17 gives SmolLM2's GGUF tokenizer a Sequence decoder (ByteFallback, Fuse, a one-character
    Replace, ByteLevel): it still gets a byte table, tokens those steps would change are left to the decoder, and
    the texts are the decoder's; a Sequence with any other step gets no table."""
    _, tokenizer = tiny
    assert byte_table(tokenizer) is not None  # cached on the tokenizer, so each copy below starts with it
    texts = ["Prices: 5€, naïve café 😀", " two  spaces and Ġ", "<0x41> stays text"]
    rows = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    rows += [[*rows[0], tokenizer.eos_token_id], rows[0][:-1]]  # a special token skipped; a cut character
    for replaced in ("▁", "Ġ"):  # outside the byte map (no token holds it), and GPT-2's own space mark
        sequence = copy.deepcopy(tokenizer)
        steps = [decoders.ByteFallback(), decoders.Fuse(), decoders.Replace(replaced, " "), decoders.ByteLevel()]
        sequence.backend_tokenizer.decoder = decoders.Sequence(steps)
        table = byte_table(sequence)
        assert table is not None
        holding = [i for i in range(len(table)) if replaced in (sequence.backend_tokenizer.id_to_token(i) or "")]
        assert all(table[i] is None for i in holding) and (replaced == "▁") == (not holding)
        want = [sequence.backend_tokenizer.decode(r, skip_special_tokens=True) for r in rows]
        assert decode_texts(sequence, rows) == want
    stripping = copy.deepcopy(tokenizer)
    stripping.backend_tokenizer.decoder = decoders.Sequence([decoders.Strip(" ", 1, 0), decoders.ByteLevel()])
    assert byte_table(stripping) is None
    assert decode_texts(stripping, rows) == stripping.batch_decode(rows, skip_special_tokens=True)


@pytest.mark.parametrize("fast", [False, True, FUSED])
def test_sampled_logprobs_match_the_model(tiny, prompts, fast):
    """Each sampled token's engine log-prob equals the teacher-forced one at T: the right distribution,
    at the right positions, for both paths."""
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=fast, return_logprobs=True)
    for temperature in (0.7, 1.0):
        gen = engine.generate(prompts, n=2, max_new_tokens=10, temperature=temperature, seed=3)
        for i, (tokens, lps) in enumerate(zip(gen.token_ids, gen.logprobs)):
            expected = scored_logprobs(model, prompts[gen.prompt_index[i]], tokens, temperature)
            torch.testing.assert_close(torch.tensor(lps), expected, atol=1e-4, rtol=1e-4)


def test_sampler_distribution():
    """The fast path's exponential-race sampler draws from softmax(logits / T), untruncated."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -4.0])
    temperature, draws = 0.7, 200_000
    tokens, logprobs = sample_tokens(logits.expand(draws, -1), torch.tensor([1 / temperature]), greedy=False)
    probs = torch.softmax(logits / temperature, -1)
    freq = torch.bincount(tokens, minlength=6).double() / draws
    assert (freq - probs).abs().max() < 4 * (probs * (1 - probs) / draws).sqrt().max()
    torch.testing.assert_close(logprobs, probs.log()[tokens])
    greedy, _ = sample_tokens(logits[None], torch.ones(1), greedy=True)
    assert greedy.tolist() == [0]


def test_make_engine_names(tiny):
    model, tokenizer = tiny
    assert make_engine("hf-fast", model, tokenizer).fast
    assert not make_engine("hf", model, tokenizer).fast  # auto: eager on CPU
    with pytest.raises(ValueError, match="hf-eager"):
        make_engine("vllm", model, tokenizer)


@pytest.mark.parametrize("fast", [True, FUSED])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_streamed_outputs_are_the_outputs_after_the_steps(tiny, staggered, fast, ignore_eos):
    """Responses cut and decoded while the decoder runs (rows dropped as they finish, filler rows, two chunks)
    are those cut and decoded after its last step."""
    model, tokenizer = tiny
    prompts, state = staggered
    engine = compacting_engine(model, tokenizer, fast, state)
    engine.max_batch_size = 10  # 16 responses: chunks of 10 and 6
    kw = dict(n=2, max_new_tokens=12, temperature=0, seed=3, ignore_eos=ignore_eos)
    streamed = engine.generate(prompts, **kw)
    engine.decoder.stream_outputs = False
    after = engine.generate(prompts, **kw)
    assert engine.decoder.compactions > 0 or ignore_eos
    assert streamed == after
    assert ("stop" in after.finish_reasons) and ("length" in after.finish_reasons)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="blocks copied behind the steps need a GPU")
@pytest.mark.parametrize("fast", [True, "fused"])
def test_streamed_outputs_are_the_outputs_after_the_steps_on_cuda(tiny, staggered, fast):
    """On the GPU each block goes to pinned host memory behind the steps that wrote it, without a wait: with
    graphs replayed, rows dropped and a chunk padded to its graph's width, the responses are those cut and
    decoded after the last step."""
    model, tokenizer = tiny
    prompts, state = staggered
    engine = HFEngine(
        model, tokenizer, device="cuda", fast=fast, return_logprobs=True, compact=True, max_batch_size=10
    )
    engine.decoder.check_every, engine.decoder.min_rows = 2, 1
    engine.update_weights(state)
    for ignore_eos in (False, True):
        kw = dict(n=2, max_new_tokens=12, temperature=0, seed=3, ignore_eos=ignore_eos)  # chunks of 10 and 6 (of 8)
        engine.decoder.stream_outputs = True
        engine.generate(prompts, **kw)  # every shape captured
        streamed = engine.generate(prompts, **kw)
        engine.decoder.stream_outputs = False
        assert streamed == engine.generate(prompts, **kw)
        assert ("stop" in streamed.finish_reasons) and ("length" in streamed.finish_reasons)
    assert engine.decoder.compactions > 0 and engine.decoder.graphs


def test_ignore_eos_runs_every_step(tiny, prompts):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, fast=True)
    first = engine.generate(prompts, n=1, max_new_tokens=12, temperature=0, seed=0)
    engine.update_weights(eos_likely(model, tokenizer, first.token_ids[0][3]))
    assert "stop" in engine.generate(prompts, n=1, max_new_tokens=12, temperature=0, seed=0).finish_reasons
    eager = HFEngine(model, tokenizer, fast=False)
    eager.update_weights(eos_likely(model, tokenizer, first.token_ids[0][3]))
    gen = eager.generate(prompts, n=1, max_new_tokens=12, temperature=0, seed=0, ignore_eos=True)
    assert gen.response_lengths == [12, 12, 12]  # generate's min_new_tokens suppresses EOS


@pytest.mark.slow
def test_smollm2_smoke():
    model, tokenizer, _ = load_model("smollm2-135m-instruct")
    questions = ["What is 2+3?", "Name a primary color.", "Say hello."]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in questions
    ]
    gen = make_engine("hf", model, tokenizer).generate(prompts, n=1, max_new_tokens=16, temperature=0, seed=0)
    assert "5" in gen.texts[0]
    assert all(t.strip() for t in gen.texts)
    assert gen.finish_reasons[0] == "stop" and gen.token_ids[0][-1] == tokenizer.eos_token_id
