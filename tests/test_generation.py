"""Tests of the diffusion sampler (``model.diffusion_generate``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fast_dllm_port import fast_dllm_generate
from testing_utils import build_bidirectional_model, build_block_causal_model, build_modernbert_model
from transformers import GenerationConfig

from t3d_trl import DiffusionConfig, DiffusionGenerationConfig, add_diffusion_generation
from t3d_trl.generation.remasking import select_dynamic, select_static, transfer_schedule
from t3d_trl.generation.sampler import BlockRunner, eos_token_ids, layout_canvas, left_pad

BUILDERS = {
    "bidirectional": build_bidirectional_model,
    "block_causal": build_block_causal_model,
    "modernbert": build_modernbert_model,
}
PROMPTS = ["hi", "hello there", "a much longer prompt!", "x = 3 + 4"]


def _batch(tokenizer, prompts=PROMPTS):
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def _expected_quota(num_masked: int, steps: int) -> list[int]:
    return [num_masked // steps + (1 if j < num_masked % steps else 0) for j in range(steps)]


def test_transfer_schedule_matches_llada_rule():
    got = transfer_schedule(torch.tensor([4, 3, 7, 1, 0]), 2)
    assert got.tolist() == [[2, 2], [2, 1], [4, 3], [1, 0], [0, 0]]
    assert transfer_schedule(torch.tensor([10]), 4).tolist() == [[3, 3, 2, 2]]


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize(
    ("block_length", "tokens_per_step", "temperature"),
    [(4, 1, 0.0), (4, 2, 0.0), (8, 4, 0.0), (8, 8, 0.0), (4, 1, 2.0)],
)
def test_static_schedule_commits_and_trajectory(tokenizer, kind, block_length, tokens_per_step, temperature):
    model = BUILDERS[kind](tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    max_new = 16
    out = model.diffusion_generate(
        input_ids,
        attention_mask,
        max_new_tokens=max_new,
        block_length=block_length,
        tokens_per_step=tokens_per_step,
        temperature=temperature,  # hot sampling: the mask token must still never be committed
        generator=torch.Generator().manual_seed(0),
        stop_at_eos=False,
        return_dict_in_generate=True,
        output_history=True,
    )
    mask_id = tokenizer.mask_token_id
    steps_per_block = block_length // tokens_per_step
    # Prompt tokens never change.
    assert torch.equal(out.sequences[:, : input_ids.shape[1]], input_ids)
    assert out.decode_steps.shape == (len(PROMPTS), max_new)
    lengths = attention_mask.sum(-1).tolist()
    for row in range(len(PROMPTS)):
        offset = lengths[row] % block_length if kind == "block_causal" else 0
        blocks = [(offset + i) // block_length for i in range(max_new)]
        steps = out.decode_steps[row].tolist()
        # Every generated token was unmasked at a step of its own block, each step used as scheduled.
        for block in set(blocks):
            members = [s for s, b in zip(steps, blocks) if b == block]
            assert all(block * steps_per_block < s <= (block + 1) * steps_per_block for s in members)
            counts = [members.count(block * steps_per_block + j + 1) for j in range(steps_per_block)]
            assert counts == _expected_quota(len(members), steps_per_block)
        # History: a committed token never changes; each recorded step commits its quota.
        previous = torch.full((max_new,), mask_id)
        for state in out.history:
            state = state[row]
            committed = previous != mask_id
            assert torch.equal(state[committed], previous[committed])
            previous = state
        assert torch.equal(previous, out.sequences[row, input_ids.shape[1] :])
        assert not (out.sequences[row] == mask_id).any()
        # NFE counts the forward passes in which the row had something to commit.
        assert int(out.nfe[row]) == len(set(steps))
    assert len(out.history) >= int(out.nfe.max())


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("use_cache, schedule", [(True, "llada"), (False, "llada"), (False, "dream")])
def test_left_padded_batch_equals_single_prompts(tokenizer, kind, use_cache, schedule):
    model = BUILDERS[kind](tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(
        max_new_tokens=12,
        block_length=4,
        tokens_per_step=2,
        stop_at_eos=False,
        use_cache=use_cache,
        schedule=schedule,
    )
    batched = model.diffusion_generate(input_ids, attention_mask, return_dict_in_generate=True, **settings)
    for row, prompt in enumerate(PROMPTS):
        single = model.diffusion_generate(
            tokenizer(prompt, return_tensors="pt").input_ids, return_dict_in_generate=True, **settings
        )
        assert torch.equal(single.sequences[0, -12:], batched.sequences[row, -12:])
        assert torch.equal(single.decode_steps[0], batched.decode_steps[row])
        # A row's forward passes are its own: a step where another row has something to commit and this one
        # has nothing scheduled (a block-causal first block after a longer prompt tail) is not counted.
        assert int(single.nfe[0]) == int(batched.nfe[row])


@pytest.mark.parametrize("block_length", [4, 8])
def test_block_kv_cache_matches_no_cache_reference(tokenizer, block_length):
    model = build_block_causal_model(tokenizer, block_size=block_length)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=16, block_length=block_length, stop_at_eos=False)
    cached = model.diffusion_generate(input_ids, attention_mask, use_cache=True, **settings)
    reference = model.diffusion_generate(input_ids, attention_mask, use_cache=False, **settings)
    assert torch.equal(cached, reference)

    # Logits of every denoising step agree within float tolerance along a shared trajectory.
    canvas = layout_canvas(input_ids, attention_mask.bool(), model.diffusion_config, block_length, 16, 0)
    with_cache = BlockRunner(model, model.diffusion_config, canvas, use_cache=True)
    without = BlockRunner(model, model.diffusion_config, canvas, use_cache=False)
    x = canvas.tokens.clone()
    generator = torch.Generator().manual_seed(0)
    mask_id = tokenizer.mask_token_id
    for start, end in canvas.blocks:
        for _ in range(2):  # two denoising steps per block, committing random tokens in between
            a = with_cache.block_logits(x, start, end)
            b = without.block_logits(x, start, end)
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            block = x[:, start:end]
            fill = torch.randint(5, 100, block.shape, generator=generator)
            commit = (block == mask_id) & (torch.rand(block.shape, generator=generator) < 0.5)
            block[commit] = fill[commit]
        block = x[:, start:end]
        block[block == mask_id] = 7


def test_sampling_is_reproducible_with_a_generator(tokenizer):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=8, block_length=4, tokens_per_step=2, temperature=1.0, stop_at_eos=False)
    a = model.diffusion_generate(
        input_ids, attention_mask, generator=torch.Generator().manual_seed(3), **settings
    )
    b = model.diffusion_generate(
        input_ids, attention_mask, generator=torch.Generator().manual_seed(3), **settings
    )
    c = model.diffusion_generate(
        input_ids, attention_mask, generator=torch.Generator().manual_seed(4), **settings
    )
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("remasking", ["low_confidence", "random", "entropy", "margin"])
def test_remasking_rules_and_top_k_top_p_run(tokenizer, remasking):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    out = model.diffusion_generate(
        input_ids,
        attention_mask,
        max_new_tokens=8,
        block_length=8,
        tokens_per_step=2,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        remasking=remasking,
        stop_at_eos=False,
        generator=torch.Generator().manual_seed(0),
        return_dict_in_generate=True,
    )
    assert sorted(out.decode_steps[0].tolist()) == [1, 1, 2, 2, 3, 3, 4, 4]


def test_top_k_one_equals_greedy(tokenizer):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=8, block_length=4, stop_at_eos=False)
    greedy = model.diffusion_generate(input_ids, attention_mask, **settings)
    sampled = model.diffusion_generate(input_ids, attention_mask, temperature=1.0, top_k=1, **settings)
    assert torch.equal(greedy, sampled)


def test_select_rules():
    score = torch.tensor([[0.95, 0.2, 0.91, 0.5], [0.1, 0.3, 0.2, 0.05]])
    masked = torch.tensor([[True, True, True, False], [True, True, True, True]])
    assert select_static(score, masked, torch.tensor([2, 1])).tolist() == [
        [True, False, True, False],
        [False, True, False, False],
    ]
    # Fast-dLLM rule: everything at or above the threshold, at least the best one.
    assert select_dynamic(score, masked, 0.9).tolist() == [
        [True, False, True, False],
        [False, True, False, False],
    ]
    # Top-up rule: at least the static quota.
    assert select_dynamic(score, masked, 0.9, torch.tensor([3, 2])).tolist() == [
        [True, True, True, False],
        [False, True, True, False],
    ]


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
def test_dynamic_decoding_fills_every_block_with_fewer_forwards(tokenizer, kind):
    model = BUILDERS[kind](tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=16, block_length=8, stop_at_eos=False, return_dict_in_generate=True)
    static = model.diffusion_generate(input_ids, attention_mask, tokens_per_step=1, **settings)
    # With a threshold no token clears, dynamic decoding commits exactly one token per step (= static TokPS 1).
    strict = model.diffusion_generate(input_ids, attention_mask, threshold=1.0, **settings)
    assert torch.equal(strict.sequences, static.sequences)
    assert torch.equal(strict.nfe, static.nfe)
    loose = model.diffusion_generate(input_ids, attention_mask, threshold=0.01, **settings)
    assert (loose.nfe < static.nfe).all()
    assert not (loose.sequences == tokenizer.mask_token_id).any()
    topup = model.diffusion_generate(
        input_ids,
        attention_mask,
        threshold=1.0,
        dynamic_rule="threshold_topup",
        tokens_per_step=4,
        **settings,
    )
    static4 = model.diffusion_generate(input_ids, attention_mask, tokens_per_step=4, **settings)
    assert torch.equal(topup.sequences, static4.sequences)  # nothing clears 1.0: exactly the static quotas
    assert torch.equal(topup.nfe, static4.nfe)


def _eos_heavy_model(tokenizer):
    model = build_bidirectional_model(tokenizer)
    # Push the EOS logit up everywhere: completions end early, at a position the sampler chooses.
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: output.index_add(
            -1, torch.tensor([tokenizer.eos_token_id]), torch.full((*output.shape[:-1], 1), 50.0)
        )
    )
    return model


def test_stop_at_eos_pads_after_eos_and_saves_forwards(tokenizer):
    model = _eos_heavy_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=16, block_length=4, tokens_per_step=1, return_dict_in_generate=True)
    stopped = model.diffusion_generate(input_ids, attention_mask, stop_at_eos=True, **settings)
    full = model.diffusion_generate(input_ids, attention_mask, stop_at_eos=False, **settings)
    assert (stopped.nfe < full.nfe).all()
    generated = stopped.sequences[:, input_ids.shape[1] :]
    eos, pad = tokenizer.eos_token_id, tokenizer.eos_token_id
    for row in range(len(PROMPTS)):
        tokens = generated[row].tolist()
        first = tokens.index(eos)
        assert all(t == pad for t in tokens[first + 1 :])
        assert all(s == 0 for s in stopped.decode_steps[row, first + 1 :].tolist())
        assert all(s > 0 for s in stopped.decode_steps[row, : first + 1].tolist())


def test_shifted_logits_read_the_previous_position(tokenizer):
    from t3d_trl.models.forward import diffusion_forward
    from t3d_trl.models.masks import padding_attention_mask

    model = build_bidirectional_model(tokenizer)
    shifted = model.diffusion_config
    shifted.shift_logits = True
    ids = tokenizer(["hello world"], return_tensors="pt").input_ids
    valid = torch.ones_like(ids, dtype=torch.bool)
    mask = padding_attention_mask(valid, ids.shape[1], torch.float32)
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    keep = torch.tensor([0, 3, 4])
    got, _ = diffusion_forward(model, shifted, ids, mask, positions, keep=keep)
    torch.testing.assert_close(got, full[:, [0, 2, 3]])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(tokens_per_step=8, block_length=4), "tokens_per_step=8 is larger than block_length=4"),
        (dict(max_new_tokens=10, block_length=4), "max_new_tokens=10 is not a multiple of block_length=4"),
        (dict(temperature=-0.5), "temperature must be >= 0, got -0.5"),
        (dict(steps=3, tokens_per_step=1), "give steps (3) or tokens_per_step (1), not both"),
        (dict(steps=6, max_new_tokens=16, block_length=4), "steps=6 does not split evenly over 4 blocks"),
        (dict(threshold=0.9, remasking="random"), "remasking='random' has no probability score"),
        (dict(max_new_tokens=256, block_length=4), "exceeds the model's max_position_embeddings=256"),
        (dict(unknown_flag=1), "unknown generation settings: ['unknown_flag']"),
        (dict(max_new_tokens="8"), "max_new_tokens must be an integer, got '8' (str)"),
        (
            dict(cache="dual", cache_implementation="prefix"),
            "cache='dual' and cache_implementation='prefix' disagree",
        ),
        (dict(temperature="0.5"), "temperature must be a number, got '0.5' (str)"),
        (dict(temperature=float("nan")), "temperature must be a finite number, got nan"),  # was greedy
        (dict(cfg_scale=float("inf")), "cfg_scale must be a finite number, got inf"),
        (
            dict(generation_config={"max_new_tokens": 8, "tokens": 1}),
            "unknown keys in diffusion generation config",
        ),
        (
            dict(generation_config=GenerationConfig()),
            "got GenerationConfig (transformers' autoregressive settings)",
        ),
        (dict(token_type_ids=torch.ones(4, 1, dtype=torch.long)), "token_type_ids marks a second segment"),
        (dict(stop_at_eos="false"), "stop_at_eos must be True or False, got 'false' (str)"),  # read as on
        (dict(use_cache="no"), "use_cache must be True or False, got 'no' (str)"),
        (dict(pad_token_id=-1), "pad_token_id must be a token id (>= 0), got -1"),
        (dict(eos_token_id="2"), "eos_token_id must be a token id or a list of them, got '2'"),
        (dict(pad_token_id=10**6), "pad_token_id=1000000 is not a token the model can emit"),
        (dict(eos_token_id=[2, 10**6]), "eos_token_id=1000000 is not a token the model can emit"),
    ],
)
def test_bad_settings_name_the_value(tokenizer, settings, message):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    with pytest.raises((ValueError, TypeError)) as info:
        model.diffusion_generate(input_ids, attention_mask, **settings)
    assert message in str(info.value)


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
def test_an_empty_prompt_decodes_like_an_empty_row_of_a_batch(tokenizer, kind):
    """An empty prompt (unconditional generation) lays out on the canvas; in a batch it is a row of padding."""
    model = (build_bidirectional_model if kind == "bidirectional" else build_block_causal_model)(tokenizer)
    settings = dict(max_new_tokens=8, block_length=4, tokens_per_step=2, stop_at_eos=False, use_cache=False)
    alone = model.diffusion_generate(torch.zeros(1, 0, dtype=torch.long), **settings)
    assert alone.shape == (1, 8) and not (alone == tokenizer.mask_token_id).any()
    rows = [[], tokenizer("hi")["input_ids"]]
    batched = model.diffusion_generate(*left_pad(rows, tokenizer.pad_token_id), **settings)
    assert torch.equal(batched[0, -8:], alone[0])
    with pytest.raises(ValueError, match="batch of 0 rows"):
        model.diffusion_generate(torch.zeros(0, 3, dtype=torch.long), **settings)
    dream = add_diffusion_generation(
        build_bidirectional_model(tokenizer), DiffusionConfig(tokenizer.mask_token_id, shift_logits=True)
    )
    with pytest.raises(ValueError, match=r"row\(s\) \[0\] have an empty prompt: a shifted-logit model"):
        dream.diffusion_generate(*left_pad(rows, tokenizer.pad_token_id), **settings)


def test_eos_and_pad_ids_are_checked_against_the_model(tokenizer):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    # The mask token as EOS would end every row at once, undecoded.
    with pytest.raises(ValueError, match=f"eos_token_id={tokenizer.mask_token_id} is not a token the model"):
        model.diffusion_generate(input_ids, attention_mask, eos_token_id=tokenizer.mask_token_id)
    # An EOS id of 0 (GPT-NeoX / Pythia tokenizers) saved in the generation config is read, not skipped as falsy.
    model.config.eos_token_id, model.generation_config.eos_token_id = None, 0
    assert eos_token_ids(model, DiffusionGenerationConfig()) == [0]


def test_right_padded_batch_is_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    enc = tokenizer(["hi", "hello there"], return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(ValueError, match="row 0 is right-padded.*padding_side = 'left'"):
        model.diffusion_generate(enc.input_ids, enc.attention_mask, max_new_tokens=4, block_length=4)


def test_bad_shapes_are_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    ids = tokenizer(["hello"], return_tensors="pt").input_ids
    with pytest.raises(TypeError, match="input_ids must be a torch.Tensor, got list"):
        model.diffusion_generate(ids.tolist(), max_new_tokens=4)
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, prompt_len\], got shape \(5,\)"):
        model.diffusion_generate(ids[0], max_new_tokens=4)
    with pytest.raises(ValueError, match="differs from input_ids shape"):
        model.diffusion_generate(ids, torch.ones(1, 3, dtype=torch.long), max_new_tokens=4)


def test_generation_config_object_and_overrides(tokenizer):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    config = DiffusionGenerationConfig(max_new_tokens=8, block_length=4, steps=8, stop_at_eos=False)
    a = model.diffusion_generate(input_ids, attention_mask, generation_config=config)
    b = model.diffusion_generate(input_ids, attention_mask, generation_config=config, tokens_per_step=1)
    assert torch.equal(a, b)  # 8 steps over 2 blocks of 4 = one token per step
    assert config.steps == 8  # overrides never mutate the caller's config
    # A dict is a whole config; numpy numbers are plain ones (the config saves as JSON).
    c = model.diffusion_generate(
        input_ids, attention_mask, generation_config={**config.to_dict(), "steps": np.int64(8)}
    )
    assert torch.equal(a, c)
    assert (
        type(DiffusionGenerationConfig(max_new_tokens=np.int64(8), threshold=np.float32(0.5)).max_new_tokens)
        is int
    )
    # A BERT-style tokenizer's batch (token_type_ids of zeros) can be passed whole.
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
    }
    assert torch.equal(a, model.diffusion_generate(**batch, generation_config=config))


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_a_mask_token_in_the_prompt_is_never_decoded(tokenizer, kind):
    # The block-causal layout shares the first block with the prompt's tail: only generated positions in it
    # are decoded, within the block's steps.
    model = BUILDERS[kind](tokenizer)
    mask_id = model.diffusion_config.mask_token_id
    ids = torch.tensor([tokenizer("hello").input_ids[:5] + [mask_id]])  # 6 tokens: a block-causal tail of 2
    tail = ids.shape[1] % 4 if kind == "block_causal" else 0
    assert kind != "block_causal" or tail  # the prompt's mask shares a block with generated positions
    out = model.diffusion_generate(
        ids,
        max_new_tokens=8,
        block_length=4,
        tokens_per_step=1,
        stop_at_eos=False,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences[:, : ids.shape[1]], ids)
    steps = out.decode_steps[0].tolist()
    # Each generated token is committed at a step of its own block (4 steps per block), one per forward pass.
    assert [(step - 1) // 4 for step in steps] == [(tail + j) // 4 for j in range(8)]
    assert int(out.nfe[0]) == len(set(steps)) == 8


def _varied_model(tokenizer, shift_logits: bool = False):
    """A tiny bidirectional model with large random weights, so that its predictions depend on the context
    (with the default initialisation it proposes one token everywhere and no approximation shows)."""
    model = build_bidirectional_model(tokenizer, initializer_range=0.5)
    diffusion = model.diffusion_config
    diffusion.shift_logits = shift_logits
    diffusion.save_to_model_config(model.config)
    return model


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize(("tokens_per_step", "threshold"), [(1, None), (2, None), (None, 0.5)])
def test_approximate_caches_match_the_fast_dllm_port(tokenizer, cache, tokens_per_step, threshold):
    model = _varied_model(tokenizer)
    mask_id = tokenizer.mask_token_id
    prompt = torch.randint(5, 100, (2, 9), generator=torch.Generator().manual_seed(3))
    settings = dict(max_new_tokens=16, block_length=8, stop_at_eos=False, return_dict_in_generate=True)
    budget = dict(tokens_per_step=tokens_per_step) if threshold is None else dict(threshold=threshold)
    ours = model.diffusion_generate(prompt, cache=cache, **budget, **settings)
    steps = 16 // (tokens_per_step or 1)
    port, port_nfe = fast_dllm_generate(model, prompt, steps, 16, 8, cache, threshold, mask_id=mask_id)
    assert torch.equal(ours.sequences, port)
    # The port counts a step while any row has masks left in the block; ours counts per row.
    assert int(ours.nfe.max()) <= port_nfe and (threshold is not None or ours.nfe.tolist() == [port_nfe] * 2)
    if threshold is not None:
        assert 2 < int(ours.nfe.min()) < 16  # the threshold commits several tokens in some steps, not all
    exact = model.diffusion_generate(prompt, **budget, **settings)
    if tokens_per_step == 1:
        assert not torch.equal(exact.sequences, port)  # the cache is an approximation: the test can fail


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_confident_model_ranks_like_the_fast_dllm_port(tokenizer, cache):
    # Logits as confident as a real LLM's (std about 20): float32 probabilities of the proposals collapse to
    # 1.0 and ties would be committed in another order than the port's float64 softmax (a float32 score fails
    # here with the dual cache).
    seed = 1
    model = build_bidirectional_model(tokenizer, seed=seed, initializer_range=0.5)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    prompt = torch.randint(5, 100, (3, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        std = model(prompt).logits.std().item()
    assert 16 < std < 30
    for tokens_per_step, threshold in ((1, None), (2, None), (None, 0.999)):
        budget = dict(tokens_per_step=tokens_per_step) if threshold is None else dict(threshold=threshold)
        ours = model.diffusion_generate(
            prompt, max_new_tokens=16, block_length=8, stop_at_eos=False, cache=cache, **budget
        )
        steps = 16 // (tokens_per_step or 1)
        port, _ = fast_dllm_generate(
            model, prompt, steps, 16, 8, cache, threshold, mask_id=tokenizer.mask_token_id
        )
        assert torch.equal(ours, port), (tokens_per_step, threshold)


@pytest.mark.parametrize("shift_logits", [False, True])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_step_on_an_unchanged_canvas_gives_exact_logits(tokenizer, cache, shift_logits):
    # Keys/values cached at the block's first pass are exact as long as the canvas has not changed since, so
    # a second step on the same canvas must reproduce the full pass; with shifted logits (Dream) the first
    # block token is read from the position before the block.
    model = _varied_model(tokenizer, shift_logits)
    input_ids, attention_mask = _batch(tokenizer)
    canvas = layout_canvas(input_ids, attention_mask.bool(), model.diffusion_config, 4, 12, 0)
    exact = BlockRunner(model, model.diffusion_config, canvas, use_cache=True)
    cached = BlockRunner(model, model.diffusion_config, canvas, use_cache=True, approximate=cache)
    x = canvas.tokens.clone()
    for start, end in canvas.blocks:
        first = cached.block_logits(x, start, end)
        again = cached.block_logits(x, start, end)
        reference = exact.block_logits(x, start, end)
        torch.testing.assert_close(first, reference, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(again, reference, rtol=1e-4, atol=1e-5)
        # The window's keys/values are written over their cached copies: the cache never grows past the canvas.
        assert cached.cache.get_seq_length() == x.shape[1]
        x[:, start:end] = torch.randint(
            5, 100, (x.shape[0], end - start), generator=torch.Generator().manual_seed(start)
        )
    # After a commit inside the block the cached keys/values are stale: the cache is an approximation.
    start, end = canvas.blocks[-1]
    x[:, end - 1] = tokenizer.mask_token_id
    stale = cached.block_logits(x, start, end)
    assert not torch.allclose(stale, exact.block_logits(x, start, end), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_approximate_cache_left_padded_batch_and_single_step_blocks(tokenizer, cache):
    model = _varied_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=12, block_length=4, stop_at_eos=False, cache=cache)
    batched = model.diffusion_generate(input_ids, attention_mask, tokens_per_step=1, **settings)
    for row, prompt in enumerate(PROMPTS):
        single = model.diffusion_generate(
            tokenizer(prompt, return_tensors="pt").input_ids, tokens_per_step=1, **settings
        )
        assert torch.equal(single[0, -12:], batched[row, -12:])
    # One step per block runs only the refreshing full passes: exactly the exact decoding.
    whole = model.diffusion_generate(input_ids, attention_mask, tokens_per_step=4, **settings)
    exact = model.diffusion_generate(
        input_ids, attention_mask, tokens_per_step=4, **{**settings, "cache": "none"}
    )
    assert torch.equal(whole, exact)


def test_approximate_cache_is_refused_where_it_does_not_apply(tokenizer):
    input_ids, attention_mask = _batch(tokenizer)
    with pytest.raises(ValueError, match="cache must be one of \\('none', 'prefix', 'dual'\\), got 'full'"):
        DiffusionGenerationConfig(cache="full")
    with pytest.raises(ValueError, match="cache_implementation must be one of \\('prefix', 'dual'\\)"):
        DiffusionGenerationConfig(cache_implementation="none")
    causal = build_block_causal_model(tokenizer)
    with pytest.raises(ValueError, match="block-causal models decode with their exact block cache"):
        causal.diffusion_generate(input_ids, attention_mask, max_new_tokens=8, cache="dual")
    encoder = build_modernbert_model(tokenizer)
    with pytest.raises(ValueError, match="cache_implementation='prefix' needs a decoder .* encoder MLM"):
        encoder.diffusion_generate(input_ids, attention_mask, max_new_tokens=8, cache="prefix")


def test_family_schedules():
    # Dream's rule, worked by hand from linspace(1, 1e-3, 9): int(16 * 0.124875) = 1, int(15 * 0.142694) = 2, ...
    assert transfer_schedule(torch.tensor([16]), 8, "dream").tolist() == [[1, 2, 2, 2, 2, 2, 2, 3]]
    # One token per step: int(n * (1 - s/t)) rounds the early steps down to 0; the last step takes the rest.
    dream = transfer_schedule(torch.tensor([8, 5, 0]), 8, "dream")
    assert dream.sum(-1).tolist() == [8, 5, 0] and dream[0, 0] == 0
    # SDAR splits the block length, not the masks left: a first block holding 3 prompt tokens (5 masks in 8)
    # commits 4 then 1 at TokPS 4, where the LLaDA rule commits 3 then 2.
    assert transfer_schedule(torch.tensor([5, 8, 1]), 2, "sdar", block_length=8).tolist() == [
        [4, 1],
        [4, 4],
        [1, 0],
    ]
    assert transfer_schedule(torch.tensor([5]), 2).tolist() == [[3, 2]]
    with pytest.raises(ValueError, match="schedule must be one of"):
        DiffusionGenerationConfig(schedule="cosine")


def dream_reference_generate(model, prompt, steps, gen_length, mask_id, entropy=False):
    """A port of Dream's ``diffusion_generate`` (``_sample``), greedy, no padding: one canvas, timesteps
    ``linspace(1, eps, steps + 1)``, logits shifted right by one, ``maskgit_plus`` (or ``entropy``) confidence,
    the ``int(n * (1 - s / t))`` most confident masked positions committed per step."""
    x = torch.cat([prompt, torch.full((prompt.shape[0], gen_length), mask_id)], dim=1)
    attention = torch.zeros(x.shape[0], 1, x.shape[1], x.shape[1])
    positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
    timesteps = torch.linspace(1, 1e-3, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(input_ids=x, attention_mask=attention, position_ids=positions).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        probs = torch.softmax(mask_logits, dim=-1)
        # A trained model never proposes the mask token; a random one may, so both samplers exclude it.
        x0 = probs.index_fill(-1, torch.tensor([mask_id]), -1.0).argmax(-1)
        confidence = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
        if entropy:
            confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
        t, s = timesteps[i], timesteps[i + 1]
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        count = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_confidence = torch.full(x.shape, -torch.inf)
        full_confidence[mask_index] = confidence
        if count > 0:
            _, transfer = torch.topk(full_confidence, count)
            proposal = torch.full_like(x, mask_id)
            proposal[mask_index] = x0
            rows = torch.arange(x.shape[0]).unsqueeze(1).expand_as(transfer)
            x[rows, transfer] = proposal[rows, transfer]
    return x


@pytest.mark.parametrize(("gen_length", "steps"), [(16, 8), (24, 6), (16, 16)])
@pytest.mark.parametrize("remasking", ["low_confidence", "entropy"])
def test_dream_schedule_matches_dreams_sampler(tokenizer, gen_length, steps, remasking):
    model = _varied_model(tokenizer, shift_logits=True)
    mask_id = tokenizer.mask_token_id
    prompt = torch.randint(5, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    ours = model.diffusion_generate(
        prompt,
        max_new_tokens=gen_length,
        steps=steps,
        schedule="dream",
        remasking=remasking,
        stop_at_eos=False,
    )
    reference = dream_reference_generate(model, prompt, steps, gen_length, mask_id, remasking == "entropy")
    assert torch.equal(ours, reference)
    if steps < gen_length:  # the even split commits other tokens: the comparison can fail
        even = model.diffusion_generate(
            prompt, max_new_tokens=gen_length, steps=steps, remasking=remasking, stop_at_eos=False
        )
        assert not torch.equal(even, reference)
