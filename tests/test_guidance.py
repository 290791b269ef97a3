"""Classifier-free guidance in the sampler (``cfg_scale``, t3d_trl.generation.guidance) against a port of LLaDA's
``generate``."""

from __future__ import annotations

import json

import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model, build_modernbert_model

from t3d_trl import DiffusionGenerationConfig
from t3d_trl.generation.guidance import guide_logits


def _varied(build, tokenizer, **kwargs):
    # Large random weights: predictions depend on the context, so guidance visibly changes the decoding.
    return build(tokenizer, initializer_range=0.5, **kwargs)


@torch.no_grad()
def llada_generate_with_cfg(model, prompt, steps, gen_length, block_length, cfg_scale, mask_id):
    """A port of LLaDA's ``generate`` (greedy, ``low_confidence``, equal-length prompts) with its ``cfg_scale``.

    Every step: if ``cfg_scale > 0``, the canvas and a copy whose prompt positions are the mask token run as one
    batch and the logits are ``un + (cfg_scale + 1) * (cond - un)``; the argmax (the mask token excluded, as
    the sampler does: a random model may predict it, a trained one does not) and its probability under the
    softmax; confidences after the current block are ``-inf``; each row commits its ``k`` most confident masks,
    ``k`` from LLaDA's ``get_num_transfer_tokens``.
    """
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    prompt_index = x != mask_id
    steps_per_block = steps // (gen_length // block_length)
    for b in range(gen_length // block_length):
        start = prompt.shape[1] + b * block_length
        counts = (x[:, start : start + block_length] == mask_id).sum(1, keepdim=True)
        quota = counts // steps_per_block + (torch.arange(steps_per_block) < counts % steps_per_block).long()
        for i in range(steps_per_block):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                both = _bidirectional_logits(model, torch.cat([x, un_x]))
                logits, un_logits = both.chunk(2)
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            else:
                logits = _bidirectional_logits(model, x)
            x0 = logits.index_fill(-1, torch.tensor([mask_id]), float("-inf")).argmax(-1)
            confidence = torch.softmax(logits.double(), -1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            confidence[:, start + block_length :] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, confidence, torch.tensor(float("-inf"), dtype=torch.double))
            for row in range(x.shape[0]):
                top = torch.topk(confidence[row], k=int(quota[row, i])).indices
                x[row, top] = x0[row, top]
    return x


def _bidirectional_logits(model, x):
    attention = torch.zeros(x.shape[0], 1, x.shape[1], x.shape[1])
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    return model(input_ids=x, attention_mask=attention, position_ids=positions).logits.float()


@pytest.mark.parametrize("cfg_scale", [0.0, 0.5, 2.0])
@pytest.mark.parametrize(("gen_length", "block_length", "steps"), [(8, 8, 8), (16, 4, 8), (8, 4, 4)])
def test_cfg_matches_llada_generate_port(tokenizer, cfg_scale, gen_length, block_length, steps):
    model = _varied(build_bidirectional_model, tokenizer)
    mask_id = tokenizer.mask_token_id
    prompt = torch.randint(5, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=gen_length, block_length=block_length, steps=steps, stop_at_eos=False)
    ours = model.diffusion_generate(prompt, cfg_scale=cfg_scale, **settings)
    port = llada_generate_with_cfg(model, prompt, steps, gen_length, block_length, cfg_scale, mask_id)
    assert torch.equal(ours, port)
    if cfg_scale:  # guidance changes the decoding here, so the comparison above can fail
        plain = llada_generate_with_cfg(model, prompt, steps, gen_length, block_length, 0.0, mask_id)
        assert not torch.equal(ours, plain)


def test_cfg_zero_builds_no_unconditional_pass(tokenizer, monkeypatch):
    model = build_bidirectional_model(tokenizer)
    prompt = tokenizer(["hello"], return_tensors="pt").input_ids
    rows = []
    hook = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    model.diffusion_generate(prompt, max_new_tokens=4, block_length=4, cfg_scale=0.0)
    model.diffusion_generate(prompt, max_new_tokens=4, block_length=4, cfg_scale=1.0)
    hook.remove()
    assert set(rows[:4]) == {1} and set(rows[4:]) == {2}


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cfg_with_approximate_caches(tokenizer, cache):
    """One step per block: every step is the cache's refreshing full pass, so the cached and exact guided
    decodings agree; with more steps per block the cache's approximation applies to both halves."""
    model = _varied(build_bidirectional_model, tokenizer)
    input_ids, attention_mask = tokenizer(
        ["hi", "a longer prompt"], return_tensors="pt", padding=True
    ).values()
    settings = dict(max_new_tokens=8, block_length=4, tokens_per_step=4, cfg_scale=1.0, stop_at_eos=False)
    exact = model.diffusion_generate(input_ids, attention_mask, cache="none", **settings)
    cached = model.diffusion_generate(input_ids, attention_mask, cache=cache, **settings)
    assert torch.equal(cached, exact)
    settings["tokens_per_step"] = 1
    out = model.diffusion_generate(
        input_ids, attention_mask, cache=cache, return_dict_in_generate=True, **settings
    )
    assert (out.sequences[:, -8:] != tokenizer.mask_token_id).all() and out.nfe.tolist() == [8, 8]


def test_cfg_block_causal_cache_is_exact_and_padding_is_harmless(tokenizer):
    model = _varied(build_block_causal_model, tokenizer)
    prompts = ["hi", "hello there", "x = 3 + 4"]
    input_ids, attention_mask = tokenizer(prompts, return_tensors="pt", padding=True).values()
    settings = dict(max_new_tokens=8, block_length=4, cfg_scale=0.5, stop_at_eos=False)
    cached = model.diffusion_generate(input_ids, attention_mask, use_cache=True, **settings)
    reference = model.diffusion_generate(input_ids, attention_mask, use_cache=False, **settings)
    assert torch.equal(cached, reference)
    for row, prompt in enumerate(prompts):  # a left-padded batch decodes each row as alone
        alone = model.diffusion_generate(tokenizer([prompt], return_tensors="pt").input_ids, **settings)
        assert torch.equal(alone[0, -8:], cached[row, -8:])
    assert not torch.equal(
        cached, model.diffusion_generate(input_ids, attention_mask, **{**settings, "cfg_scale": 0})
    )


def test_guided_runner_wraps_the_block_runner(tokenizer):
    from t3d_trl.generation.guidance import GuidedRunner
    from t3d_trl.generation.sampler import BlockRunner, layout_canvas

    model = _varied(build_block_causal_model, tokenizer)
    input_ids, attention_mask = tokenizer(
        ["hi", "a longer prompt"], return_tensors="pt", padding=True
    ).values()
    diffusion, mask_id = model.diffusion_config, tokenizer.mask_token_id
    canvas = layout_canvas(input_ids, attention_mask.bool(), diffusion, 4, 8, 0)
    runner = GuidedRunner(lambda c: BlockRunner(model, diffusion, c, True), canvas, mask_id, 1.5)
    assert runner.cached and runner.canvas.tokens.shape[0] == 4  # the wrapped runner's, over 2B rows
    # The unconditional rows hide exactly the real prompt tokens.
    hidden = runner.canvas.tokens[2:] == mask_id
    assert torch.equal(hidden & ~(canvas.tokens == mask_id), canvas.valid & (canvas.tokens != mask_id))
    start, end = canvas.blocks[0]
    plain = BlockRunner(model, diffusion, runner.canvas, False).block_logits(runner.canvas.tokens, start, end)
    torch.testing.assert_close(
        runner.block_logits(canvas.tokens, start, end), guide_logits(*plain.chunk(2), 1.5)
    )


def test_cfg_encoder_mlm_runs(tokenizer):
    model = build_modernbert_model(tokenizer)
    ids = tokenizer(["hello"], return_tensors="pt").input_ids
    out = model.diffusion_generate(ids, max_new_tokens=4, block_length=4, cfg_scale=1.0)
    assert out.shape == (1, ids.shape[1] + 4)


def test_guide_logits_and_validation():
    cond, uncond = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0])
    assert guide_logits(cond, uncond, 0.5).tolist() == [0.5, 3.5]
    assert torch.equal(guide_logits(cond, uncond, 0.0), cond)
    with pytest.raises(ValueError, match="cfg_scale must be >= 0"):
        DiffusionGenerationConfig(cfg_scale=-1.0)
    assert DiffusionGenerationConfig().to_dict()["cfg_scale"] == 0.0


def test_cfg_scale_from_the_command_line(tmp_path, tokenizer, benchmark_files, capsys):
    """``--cfg_scale`` (a flag derived from the dataclass) reaches generate's decoding, eval's results and collect's
    manifest."""
    from t3d_trl.cli.main import main
    from t3d_trl.evaluation.completions import generate_completions

    model = _varied(build_bidirectional_model, tokenizer)
    path = tmp_path / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    argv = ["generate", "--model", str(path), "--prompt", "2+2=", "--no_use_chat_template"]
    argv += ["--max_new_tokens", "8", "--block_length", "4", "--cfg_scale", "2.0"]
    assert main(argv) == 0
    config = model.diffusion_generation_config.update(max_new_tokens=8, block_length=4)
    guided = generate_completions(
        model, tokenizer, ["2+2="], config.update(cfg_scale=2.0), use_chat_template=False, progress=False
    )
    plain = generate_completions(model, tokenizer, ["2+2="], config, use_chat_template=False, progress=False)
    assert capsys.readouterr().out == guided.completions[0] + "\n" != plain.completions[0] + "\n"
    assert main([*argv[:-1], "-1"]) == 2
    assert capsys.readouterr().err.strip().endswith("cfg_scale must be >= 0 (0 turns guidance off), got -1.0")

    data = tmp_path / "problems.jsonl"
    data.write_text("".join(f'{{"id": "q{i}", "problem": "{q}"}}\n' for i, q in enumerate(["1+1", "7-4"])))
    argv = [
        "collect",
        "--model_name_or_path",
        str(path),
        "--dataset_name",
        str(data),
        "--prompt_template",
        "plain",
    ]
    argv += [
        "--max_new_tokens",
        "8",
        "--block_length",
        "4",
        "--cfg_scale",
        "0.5",
        "--output_dir",
        str(tmp_path / "c"),
    ]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "c" / "collection.json").read_text())
    assert manifest["generation_config"]["cfg_scale"] == 0.5

    argv = [
        "eval",
        "--models",
        str(path),
        "--benchmarks",
        "gsm8k",
        "--data_files",
        f"gsm8k={benchmark_files['gsm8k']}",
    ]
    argv += ["--block_lengths", "4", "--tokens_per_step", "4", "--max_new_tokens", "4", "--limit", "2"]
    assert main([*argv, "--cfg_scale", "0.5", "--output_dir", str(tmp_path / "e")]) == 0
    (run,) = json.loads((tmp_path / "e" / "results.json").read_text())["results"]
    assert run["generation_config"]["cfg_scale"] == 0.5
