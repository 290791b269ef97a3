"""Tests of the model layer: the diffusion description, loading, saving and attaching the mixin."""

from __future__ import annotations

import pytest
import torch
from testing_utils import (
    build_bidirectional_model,
    build_block_causal_model,
    build_modernbert_model,
    qwen3_config,
)
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from t3d_trl import (
    AutoModelForDiffusionLM,
    DiffusionConfig,
    DiffusionGenerationConfig,
    DiffusionGenerationMixin,
    add_diffusion_generation,
)


def test_diffusion_config_validates_and_round_trips():
    config = DiffusionConfig(mask_token_id=5, attention="block_causal", block_size=4)
    assert DiffusionConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="needs a positive block_size, got block_size=None"):
        DiffusionConfig(mask_token_id=5, attention="block_causal")
    with pytest.raises(ValueError, match="attention must be one of .* got 'causal'"):
        DiffusionConfig(mask_token_id=5, attention="causal")
    with pytest.raises(ValueError, match="mask_token_id must be a non-negative int, got None"):
        DiffusionConfig(mask_token_id=None)
    with pytest.raises(ValueError, match=r"unknown keys in diffusion config: \['mask'\]"):
        DiffusionConfig.from_dict({"mask": 3})


@pytest.mark.parametrize("builder", [build_bidirectional_model, build_block_causal_model])
def test_save_pretrained_round_trip_keeps_description_and_defaults(tmp_path, tokenizer, builder):
    model = builder(tokenizer)
    defaults = DiffusionGenerationConfig(
        max_new_tokens=8, block_length=4, tokens_per_step=2, stop_at_eos=False
    )
    add_diffusion_generation(model, generation_config=defaults)
    prompt = tokenizer(["hello"], return_tensors="pt").input_ids
    before = model.diffusion_generate(prompt)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    loaded = AutoModelForDiffusionLM.from_pretrained(tmp_path)
    assert isinstance(loaded, DiffusionGenerationMixin)
    assert isinstance(loaded, type(model).__mro__[1])  # still the native transformers class
    assert loaded.diffusion_config == model.diffusion_config
    assert loaded.diffusion_generation_config == defaults
    after = loaded.eval().diffusion_generate(prompt)  # no extra arguments: the saved defaults apply
    assert after.shape == (1, prompt.shape[1] + 8)
    assert torch.equal(before, after)

    # Plain transformers loads the converted checkpoint too; the description travels in config.json.
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(plain) is Qwen3ForCausalLM
    assert DiffusionConfig.from_model_config(plain.config) == model.diffusion_config


def test_encoder_mlm_loads_with_the_tokenizer_mask(tmp_path, tokenizer):
    model = build_modernbert_model(tokenizer)
    # Save without the diffusion description: from_pretrained must infer it from the tokenizer.
    del model.config.diffusion
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForDiffusionLM.from_pretrained(tmp_path)
    assert loaded.diffusion_config == DiffusionConfig(mask_token_id=tokenizer.mask_token_id)
    out = loaded.diffusion_generate(tokenizer(["hi"], return_tensors="pt").input_ids, max_new_tokens=4)
    assert out.shape == (1, 6)


def test_missing_mask_token_is_a_clear_error(tmp_path, tokenizer):
    model = Qwen3ForCausalLM(qwen3_config(tokenizer))
    with pytest.raises(ValueError, match="no diffusion description.*DiffusionConfig\\(mask_token_id=...\\)"):
        add_diffusion_generation(model)
    model.save_pretrained(tmp_path)
    no_mask = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="[PAD]")
    no_mask.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="neither its config nor its tokenizer defines a mask token"):
        AutoModelForDiffusionLM.from_pretrained(tmp_path)


def test_mask_token_outside_vocabulary_is_refused(tokenizer):
    model = build_bidirectional_model(tokenizer)
    add_diffusion_generation(model, DiffusionConfig(mask_token_id=5000))
    with pytest.raises(ValueError, match="mask_token_id=5000 is outside the model's vocabulary of 128"):
        model.diffusion_generate(tokenizer(["hi"], return_tensors="pt").input_ids, max_new_tokens=4)


def test_peft_model_gets_diffusion_generate(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = build_bidirectional_model(tokenizer)
    prompt = tokenizer(["hello"], return_tensors="pt").input_ids
    before = model.diffusion_generate(prompt, max_new_tokens=8, block_length=4, stop_at_eos=False)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    # LoRA B starts at zero: the adapted model generates exactly what the base did.
    same = peft_model.diffusion_generate(prompt, max_new_tokens=8, block_length=4, stop_at_eos=False)
    assert torch.equal(before, same)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 5.0)
    changed = peft_model.diffusion_generate(prompt, max_new_tokens=8, block_length=4, stop_at_eos=False)
    assert not torch.equal(before, changed)  # the adapter takes part in every forward pass


def test_from_config_builds_a_ready_model(tokenizer):
    config = qwen3_config(tokenizer)
    model = AutoModelForDiffusionLM.from_config(
        config, diffusion_config={"mask_token_id": tokenizer.mask_token_id, "attention": "bidirectional"}
    )
    assert isinstance(model, DiffusionGenerationMixin)
    assert model.diffusion_generate(torch.tensor([[7, 8]]), max_new_tokens=4).shape == (1, 6)


def test_auto_class_cannot_be_instantiated():
    with pytest.raises(OSError, match="from_pretrained"):
        AutoModelForDiffusionLM()
