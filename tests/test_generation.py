"""Tests of the diffusion sampler (``model.diffusion_generate``)."""

from __future__ import annotations

import pytest
import torch
from conftest import build_bidirectional_model, build_block_causal_model, build_modernbert_model

from t3d_trl import DiffusionGenerationConfig
from t3d_trl.generation.remasking import select_dynamic, select_static, transfer_schedule
from t3d_trl.generation.sampler import BlockRunner, layout_canvas

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
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_equals_single_prompts(tokenizer, kind, use_cache):
    model = BUILDERS[kind](tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(
        max_new_tokens=12, block_length=4, tokens_per_step=2, stop_at_eos=False, use_cache=use_cache
    )
    batched = model.diffusion_generate(input_ids, attention_mask, return_dict_in_generate=True, **settings)
    for row, prompt in enumerate(PROMPTS):
        single = model.diffusion_generate(
            tokenizer(prompt, return_tensors="pt").input_ids, return_dict_in_generate=True, **settings
        )
        assert torch.equal(single.sequences[0, -12:], batched.sequences[row, -12:])
        assert torch.equal(single.decode_steps[0], batched.decode_steps[row])


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
    ],
)
def test_bad_settings_name_the_value(tokenizer, settings, message):
    model = build_bidirectional_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)
    with pytest.raises((ValueError, TypeError)) as info:
        model.diffusion_generate(input_ids, attention_mask, **settings)
    assert message in str(info.value)


def test_right_padded_batch_is_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    enc = tokenizer(["hi", "hello there"], return_tensors="pt", padding=True, padding_side="right")
    with pytest.raises(ValueError, match="row 0 is right-padded.*padding_side = 'left'"):
        model.diffusion_generate(enc.input_ids, enc.attention_mask, max_new_tokens=4, block_length=4)


def test_bad_shapes_are_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    ids = tokenizer(["hello"], return_tensors="pt").input_ids
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
