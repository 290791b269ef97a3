"""The collator's x_t is the teacher's real intermediate state, laid out so the model sees it as at inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model, build_trajectories

from t3d_trl import DiffusionConfig, DiffusionGenerationConfig, T3DConfig, T3DTrainer
from t3d_trl.data.collator import DataCollatorForDiffusion, diffusion_attention_mask, teacher_state
from t3d_trl.models.forward import diffusion_forward
from t3d_trl.models.masks import block_attention_mask, padding_attention_mask

PROMPTS = ["hello there", "a", "what is 2+2?"]
MAX_NEW, BLOCK = 12, 4


def rollout(model, tokenizer):
    """Rows from the sampler (1 token per step, greedy) and, per row, every state the teacher was in."""
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = model.diffusion_generate(
        encoded.input_ids,
        attention_mask=encoded.attention_mask,
        max_new_tokens=MAX_NEW,
        block_length=BLOCK,
        steps=MAX_NEW,
        stop_at_eos=False,
        return_dict_in_generate=True,
        output_history=True,
    )
    mask_id = tokenizer.mask_token_id
    rows, states = [], []
    for i in range(len(PROMPTS)):
        rows.append(
            {
                "prompt_ids": encoded.input_ids[i][encoded.attention_mask[i].bool()].tolist(),
                "completion_ids": out.sequences[i, -MAX_NEW:].tolist(),
                "decode_step": out.decode_steps[i].tolist(),
                "row_index": i,
            }
        )
        # The canvas before the first step (all masked) and after every step of the sampler.
        states.append([torch.full((MAX_NEW,), mask_id)] + [h[i] for h in out.history])
    return rows, states


@pytest.fixture(scope="module")
def rollouts(tokenizer):
    """attention kind -> (teacher, rows, states), decoded once for the module."""
    out = {}
    for build in (build_bidirectional_model, build_block_causal_model):
        model = build(tokenizer)
        out[DiffusionConfig.from_model_config(model.config).attention] = (model, *rollout(model, tokenizer))
    return out


def collate(model, tokenizer, rows, epoch=0, **kwargs):
    collator = DataCollatorForDiffusion(
        DiffusionConfig.from_model_config(model.config), BLOCK, tokenizer.pad_token_id, epoch=epoch, **kwargs
    )
    return collator(rows)


def test_teacher_state_masks_exactly_the_tokens_decoded_later():
    tokens, steps = torch.tensor([10, 11, 12, 13]), torch.tensor([3, 1, 4, 2])
    assert teacher_state(tokens, steps, 2, mask_token_id=0).tolist() == [0, 11, 0, 13]
    assert teacher_state(tokens, steps, 0, mask_token_id=0).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
def test_teacher_state_reproduces_the_sampler_history(tokenizer, rollouts, kind):
    _, rows, states = rollouts[kind]
    for row, history in zip(rows, states):
        tokens, steps = torch.tensor(row["completion_ids"]), torch.tensor(row["decode_step"])
        for state in history[1:]:
            step = int(steps[state != tokenizer.mask_token_id].max())  # the step just executed
            assert torch.equal(teacher_state(tokens, steps, step, tokenizer.mask_token_id), state)


def test_bidirectional_x_t_is_a_real_teacher_state(tokenizer, rollouts):
    model, rows, states = rollouts["bidirectional"]
    mask_id = tokenizer.mask_token_id
    seen = [set() for _ in rows]
    for epoch in range(40):
        batch = collate(model, tokenizer, rows, epoch=epoch)
        keep = batch["keep"]
        for i, (row, history) in enumerate(zip(rows, states)):
            x_t = batch["input_ids"][i, keep]
            # The masked set is exactly the tokens with decode_step later than the chosen step.
            assert any(torch.equal(x_t, state) for state in history if (state == mask_id).any())
            assert torch.equal(batch["loss_mask"][i], x_t == mask_id)
            assert batch["targets"][i].tolist() == row["completion_ids"]
            seen[i].add(int(batch["loss_mask"][i].sum()))
    # Uniform state sampling visits many different steps of every trajectory.
    assert all(len(counts) >= 6 for counts in seen)


def test_block_causal_noisy_blocks_are_real_teacher_states(tokenizer, rollouts):
    model, rows, states = rollouts["block_causal"]
    mask_id = tokenizer.mask_token_id
    for epoch in range(20):
        batch = collate(model, tokenizer, rows, epoch=epoch)
        prompt_width = max(len(r["prompt_ids"]) for r in rows)
        for i, (row, history) in enumerate(zip(rows, states)):
            p, c = len(row["prompt_ids"]), len(row["completion_ids"])
            tail = p % BLOCK
            # The clean copy holds the teacher's final completion.
            assert batch["input_ids"][i, prompt_width : prompt_width + c].tolist() == row["completion_ids"]
            noisy = batch["input_ids"][i, batch["keep"]][tail : tail + c]
            assert batch["input_ids"][i, batch["keep"]][:tail].tolist() == row["prompt_ids"][p - tail :]
            blocks = (tail + torch.arange(c)) // BLOCK
            for b in blocks.unique():
                here = blocks == b
                # Real states of block b: while the teacher decoded it (earlier blocks complete, >= 1 mask here).
                real = [
                    s[here]
                    for s in history
                    if (s[here] == mask_id).any() and not (s[blocks < b] == mask_id).any()
                ]
                assert any(torch.equal(noisy[here], s) for s in real)
            assert torch.equal(batch["loss_mask"][i, tail : tail + c], noisy == mask_id)
            assert not batch["loss_mask"][i, :tail].any()


def test_bidirectional_layout_gives_the_inference_logits(tokenizer, rollouts):
    model, rows, _ = rollouts["bidirectional"]
    diffusion = DiffusionConfig.from_model_config(model.config)
    batch = collate(model, tokenizer, rows, epoch=3)
    mask = diffusion_attention_mask(batch, BLOCK, False, torch.float32, for_decoder=True)
    with torch.no_grad():
        logits, _ = diffusion_forward(
            model, diffusion, batch["input_ids"], mask, batch["position_ids"], keep=batch["keep"]
        )
        for i, row in enumerate(rows):  # each row alone, unpadded, as the sampler runs it
            x_t = batch["input_ids"][i, batch["keep"]]
            ids = torch.cat([torch.tensor(row["prompt_ids"]), x_t]).unsqueeze(0)
            valid = torch.ones_like(ids, dtype=torch.bool)
            alone, _ = diffusion_forward(
                model,
                diffusion,
                ids,
                padding_attention_mask(valid, ids.shape[1], torch.float32),
                torch.arange(ids.shape[1]).unsqueeze(0),
                keep=torch.arange(len(row["prompt_ids"]), ids.shape[1]),
            )
            torch.testing.assert_close(logits[i], alone[0], atol=1e-5, rtol=1e-4)


def test_block_causal_layout_gives_the_inference_logits(tokenizer, rollouts):
    """Each noisy block sees the prompt, the clean blocks before it and itself, at the clean copy's positions."""
    model, rows, _ = rollouts["block_causal"]
    diffusion = DiffusionConfig.from_model_config(model.config)
    batch = collate(model, tokenizer, rows, epoch=5)
    mask = diffusion_attention_mask(batch, BLOCK, True, torch.float32, for_decoder=True)
    with torch.no_grad():
        logits, _ = diffusion_forward(
            model, diffusion, batch["input_ids"], mask, batch["position_ids"], keep=batch["keep"]
        )
        for i, row in enumerate(rows):
            prompt, completion = row["prompt_ids"], row["completion_ids"]
            tail = len(prompt) % BLOCK
            noisy = batch["input_ids"][i, batch["keep"]][tail : tail + len(completion)]
            start = 0
            while start < len(completion):  # one completion block at a time
                end = min(len(completion), (len(prompt) + start) // BLOCK * BLOCK + BLOCK - len(prompt))
                # Inference canvas: prompt + finished blocks + this block's state, block-causal attention.
                ids = torch.tensor(prompt + completion[:start] + noisy[start:end].tolist()).unsqueeze(0)
                blocks = torch.arange(ids.shape[1]).unsqueeze(0) // BLOCK
                full = block_attention_mask(
                    blocks, blocks, torch.ones_like(ids, dtype=torch.bool), torch.float32
                )
                cols = torch.arange(len(prompt) + start, ids.shape[1])
                expected, _ = diffusion_forward(
                    model, diffusion, ids, full, torch.arange(ids.shape[1]).unsqueeze(0), keep=cols
                )
                torch.testing.assert_close(
                    logits[i, tail + start : tail + end], expected[0], atol=1e-5, rtol=1e-4
                )
                start = end


def test_random_tokens_replace_a_share_of_masked_inputs_only(tokenizer, rollouts):
    model, rows, _ = rollouts["bidirectional"]
    mask_id = tokenizer.mask_token_id
    plain = collate(model, tokenizer, rows, epoch=1)
    mixed = collate(model, tokenizer, rows, epoch=1, random_token_prob=0.5, vocab_size=len(tokenizer))
    keep = plain["keep"]
    # Same states (the noise is keyed on the row and epoch), same targets.
    assert torch.equal(plain["loss_mask"], mixed["loss_mask"])
    assert torch.equal(plain["targets"], mixed["targets"])
    masked = mixed["loss_mask"]
    shown = mixed["input_ids"][:, keep]
    assert torch.equal(shown[~masked], plain["input_ids"][:, keep][~masked])  # decoded tokens untouched
    swapped = (shown != mask_id) & masked
    assert 0.25 < swapped.sum() / masked.sum() < 0.75
    assert (shown[swapped] < len(tokenizer)).all()


def test_noise_is_keyed_on_row_and_epoch_not_on_the_batch(tokenizer, rollouts):
    model, rows, _ = rollouts["bidirectional"]
    together = collate(model, tokenizer, rows, epoch=2)
    alone = collate(model, tokenizer, rows[1:2], epoch=2)
    assert torch.equal(together["loss_mask"][1, : len(rows[1]["completion_ids"])], alone["loss_mask"][0])
    epochs = {
        tuple(collate(model, tokenizer, rows, epoch=e)["loss_mask"].flatten().tolist()) for e in range(6)
    }
    assert len(epochs) > 1


def test_reference_state_sampling_prefers_heavily_masked_blocks(tokenizer):
    model = build_block_causal_model(tokenizer)
    row = {
        "prompt_ids": [5, 6, 7, 8],
        "completion_ids": list(range(20, 36)),
        "decode_step": list(range(1, 17)),
    }
    fully_masked = {}
    for sampling in ("uniform", "reference"):
        masked = []
        for index in range(200):
            batch = collate(model, tokenizer, [{**row, "row_index": index}], state_sampling=sampling)
            masked.append(batch["loss_mask"][0].view(4, 4).sum(-1))
        fully_masked[sampling] = (torch.stack(masked) == 4).float().mean().item()
    # 4 states per block: uniform 1/4 each; reference ~0.906 for the fully masked one.
    assert 0.17 < fully_masked["uniform"] < 0.33
    assert fully_masked["reference"] > 0.85


def test_reference_state_sampling_weighs_the_block_on_a_bidirectional_canvas(tokenizer):
    # 4 blocks of 4 decoded in order: every block's fully masked state has the same weight, so the current
    # block (the one holding the first mask) is close to uniform; weighing by the share of the WHOLE
    # completion still masked put ~92% of the states in block 0.
    model = build_bidirectional_model(tokenizer)
    row = {"prompt_ids": [5, 6, 7], "completion_ids": list(range(20, 36)), "decode_step": list(range(1, 17))}
    current, fully_masked = [], []
    for index in range(400):
        loss_mask = collate(model, tokenizer, [{**row, "row_index": index}], state_sampling="reference")
        first = int(loss_mask["loss_mask"][0].long().argmax())
        current.append(first // 4)
        fully_masked.append(first % 4 == 0)
    share = np.bincount(current, minlength=4) / len(current)
    assert (share > 0.15).all() and (share < 0.35).all(), share
    assert np.mean(fully_masked) > 0.85


@pytest.mark.parametrize(
    "schedule, partial, full",
    [("llada", [1, 2], [1, 1, 2, 2]), ("sdar", [1, 1], [1, 1, 2, 2]), ("dream", [2, 2], [1, 2, 2, 2])],
)
def test_path_step_follows_the_quota_of_the_students_schedule(tokenizer, schedule, partial, full):
    # Prompt of 6 tokens, block 4: the first block holds 2 completion tokens (and so does the last). At TokPS 2
    # the sampler splits each block over 2 steps by its schedule: a partial block 1 + 1 (llada), 2 + 0 (sdar),
    # 0 + 2 (dream), a full one 2 + 2, 2 + 2, 1 + 3. path_step must say the same, for every block.
    model = build_block_causal_model(tokenizer)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = model.diffusion_generate(
        prompt, max_new_tokens=12, block_length=4, tokens_per_step=2, schedule=schedule, stop_at_eos=False,
        return_dict_in_generate=True,
    )  # fmt: skip
    steps = out.decode_steps[0]
    row = {"prompt_ids": prompt[0].tolist(), "completion_ids": out.sequences[0, -12:].tolist()}
    batch = collate(
        model, tokenizer, [{**row, "decode_step": steps.tolist()}], tokens_per_step=2, schedule=schedule
    )
    path_step = batch["path_step"][0][batch["target_mask"][0]]
    assert path_step.tolist() == ((steps - 1) % 2 + 1).tolist()
    assert sorted(path_step[:2].tolist()) == partial and sorted(path_step[2:6].tolist()) == full


def test_the_trainer_collates_with_the_students_decoding_schedule(tokenizer, tmp_path):
    # A Dream-style student decodes a block of 4 at TokPS 2 as 1 + 3 tokens: its path steps must count that.
    data = build_trajectories(
        build_bidirectional_model(tokenizer, seed=1), tokenizer, ["hello"], max_new_tokens=8
    )
    student = build_bidirectional_model(tokenizer, seed=1)
    DiffusionGenerationConfig(schedule="dream").save_to_model_config(student.config)
    args = T3DConfig(
        output_dir=str(tmp_path), loss_type="td", tokens_per_step=2, report_to="none", disable_tqdm=True
    )
    trainer = T3DTrainer(student, args, train_dataset=data, processing_class=tokenizer)
    assert trainer.data_collator.schedule == "dream"
    path_step = trainer.data_collator([trainer.train_dataset[0]])["path_step"][0]
    assert sorted(path_step[:4].tolist()) == [1, 2, 2, 2]  # llada's split would give [1, 1, 2, 2]


def test_path_step_counts_student_steps_in_decoding_order(tokenizer):
    model = build_bidirectional_model(tokenizer)
    row = {"prompt_ids": [5, 6], "completion_ids": [20, 21, 22, 23, 24, 25, 26, 27]}
    row["decode_step"] = [3, 1, 4, 2, 5, 8, 6, 7]  # two blocks of 4
    batch = collate(model, tokenizer, [row], tokens_per_step=2)
    # Block 0 in decoding order: 21, 23, 20, 22 -> student steps 1, 1, 2, 2; block 1: 24, 26, 27, 25.
    assert batch["path_step"][0].tolist() == [2, 1, 2, 1, 1, 2, 1, 2]


def test_random_and_semi_autoregressive_states(tokenizer):
    model = build_bidirectional_model(tokenizer)
    rows = [{"prompt_ids": [5], "completion_ids": list(range(20, 32)), "row_index": i} for i in range(30)]
    random_batch = collate(model, tokenizer, rows, states="random")
    assert random_batch["loss_mask"].any(-1).all()
    prob = random_batch["mask_prob"]
    assert ((prob > 0) & (prob <= 1)).all() and len(prob[:, 0].unique()) > 1
    semi = collate(model, tokenizer, rows, states="semi_ar")["loss_mask"].view(30, 3, 4)
    for blocks in semi:  # clean blocks, then one partly masked block, then fully masked blocks
        counts = blocks.sum(-1)
        current = int(torch.nonzero(counts).min())
        assert (counts[:current] == 0).all() and (counts[current + 1 :] == 4).all() and counts[current] >= 1


def test_random_states_keep_the_mdlm_weighting_unbiased_and_bounded(tokenizer):
    """Every state has a mask, and sum(masked / prob) estimates the number of tokens (the MDLM ELBO weight)."""
    model = build_bidirectional_model(tokenizer)
    rows = [{"prompt_ids": [5], "completion_ids": list(range(20, 28)), "row_index": i} for i in range(4000)]
    batch = collate(model, tokenizer, rows, states="random")
    mask, prob = batch["loss_mask"], batch["mask_prob"]
    assert mask.any(-1).all()
    # Forcing one mask at tiny t would weight it by 1/t (unbounded); the conditional redraw keeps 1/prob <= n.
    assert (1 / prob).max() <= 8 + 1e-4
    assert (mask / prob).sum(-1).mean().item() == pytest.approx(8, rel=0.03)


def test_bad_rows_are_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    with pytest.raises(ValueError, match="decode_step"):
        collate(model, tokenizer, [{"prompt_ids": [5], "completion_ids": [20, 21]}])
    with pytest.raises(ValueError, match="1 decode_step entries for 2 completion tokens"):
        collate(model, tokenizer, [{"prompt_ids": [5], "completion_ids": [20, 21], "decode_step": [1]}])
    with pytest.raises(ValueError, match="vocab_size"):
        collate(model, tokenizer, [], random_token_prob=0.1)


def test_block_causal_mask_hides_the_answer_from_its_own_noisy_block():
    # One row: prompt of 2 tokens, completion of 4 (blocks of 2): clean copy cols 0-5, noisy copy cols 6-9.
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 2, 3, 4, 5]])
    noisy = torch.tensor([[False] * 6 + [True] * 4])
    batch = {"position_ids": position_ids, "noisy": noisy, "valid": torch.ones(1, 10, dtype=torch.bool)}
    allowed = diffusion_attention_mask(batch, 2, True, torch.float32, for_decoder=True)[0, 0] == 0
    # noisy block at positions 4-5 (cols 8-9): sees clean blocks 0-1 (cols 0-3) and itself, not clean block 2.
    assert np.flatnonzero(allowed[8].numpy()).tolist() == [0, 1, 2, 3, 8, 9]
    # clean position 3 (col 3): its own and earlier clean blocks only.
    assert np.flatnonzero(allowed[3].numpy()).tolist() == [0, 1, 2, 3]
