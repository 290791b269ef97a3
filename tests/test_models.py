"""Tests of the model layer: the diffusion description, loading, saving and attaching the mixin."""

from __future__ import annotations

import copy
import io
import json
import pickle

import pytest
import torch
import transformers
from testing_utils import (
    add_remote_code,
    build_bidirectional_model,
    build_block_causal_model,
    build_hub_cache,
    build_modernbert_model,
    qwen3_config,
)
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM
from transformers.modeling_outputs import CausalLMOutput

from t3d_trl import (
    AutoModelForDiffusionLM,
    DiffusionConfig,
    DiffusionGenerationConfig,
    DiffusionGenerationMixin,
    add_diffusion_generation,
)
from t3d_trl.diffusion.forward import diffusion_forward, max_positions
from t3d_trl.models.masks import position_ids_from_valid


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 2.5),
        ("block_size", True),
        ("block_size", "4"),
        ("shift_logits", "false"),
        ("shift_logits", 1),
    ],
)
def test_diffusion_config_refuses_wrong_types(field, value):
    values = {"mask_token_id": 5, "attention": "block_causal", "block_size": 4, field: value}
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        DiffusionConfig(**values)


def test_diffusion_config_loads_from_saved_json():
    config = DiffusionConfig(mask_token_id=5, attention="block_causal", block_size=4, shift_logits=True)
    assert DiffusionConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


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


def test_from_config_of_a_bare_encoder_builds_a_masked_lm(tokenizer):
    # ModernBertConfig has no causal-LM class: it went to AutoModelForCausalLM and failed.
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    config = build_modernbert_model(tokenizer).config.to_dict()
    config = ModernBertConfig(**{**config, "architectures": None})  # a fresh config: no head named
    model = AutoModelForDiffusionLM.from_config(
        config, diffusion_config=DiffusionConfig(tokenizer.mask_token_id)
    )
    assert isinstance(model, ModernBertForMaskedLM)


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


def _encoder_mlm(name: str) -> torch.nn.Module:
    """A tiny encoder MLM of each position-embedding kind: absolute from 0 (BERT, DistilBERT), absolute from
    ``padding_idx + 1`` (RoBERTa, XLM-R) and rotary (ModernBERT)."""
    sizes = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    if name == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=64, dim=32, hidden_dim=64, n_layers=2, n_heads=4)
        return transformers.DistilBertForMaskedLM(config).eval()
    if name == "modernbert":
        config = transformers.ModernBertConfig(**sizes, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return transformers.ModernBertForMaskedLM(config).eval()
    config_class, model_class = {
        "bert": (transformers.BertConfig, transformers.BertForMaskedLM),
        "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM),
    }[name]
    return model_class(config_class(**sizes, max_position_embeddings=66, pad_token_id=1)).eval()


@pytest.mark.parametrize("name", ["bert", "distilbert", "roberta", "xlm-roberta", "modernbert"])
def test_encoder_positions_match_the_plain_forward_with_and_without_left_padding(name):
    model = add_diffusion_generation(_encoder_mlm(name), DiffusionConfig(mask_token_id=63))
    ids = torch.randint(3, 60, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        valid = torch.ones_like(ids)
        ours, _ = diffusion_forward(model, model.diffusion_config, ids, valid, position_ids_from_valid(valid))
        # A left-padded row predicts what the unpadded row does; the padding is an ordinary token (not the pad id):
        # the attention mask alone marks it.
        padded = torch.cat([torch.full((1, 3), 5), ids], dim=1)
        valid = torch.cat([torch.zeros(1, 3, dtype=torch.long), valid], dim=1)
        left, _ = diffusion_forward(
            model, model.diffusion_config, padded, valid, position_ids_from_valid(valid)
        )
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left[:, 3:], plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_one_step_generation_on_an_encoder_is_the_plain_forwards_argmax(name):
    """The sampler's own forward (``forward_window``) numbers positions as the model does: RoBERTa's from
    ``padding_idx + 1``."""
    model = add_diffusion_generation(_encoder_mlm(name), DiffusionConfig(mask_token_id=63))
    ids = torch.randint(3, 60, (1, 6), generator=torch.Generator().manual_seed(1))
    out = model.diffusion_generate(ids, max_new_tokens=4, tokens_per_step=4, stop_at_eos=False)
    with torch.no_grad():
        plain = model(input_ids=torch.cat([ids, torch.full((1, 4), 63)], dim=1)).logits[:, 6:].argmax(-1)
    assert torch.equal(out[:, 6:], plain)


def test_roberta_length_limit_counts_the_positions_it_skips():
    """RoBERTa's 66 position embeddings number 64 tokens (ids from padding_idx + 1 = 2): a longer canvas is
    refused in one line, not an index error inside the embedding."""
    model = add_diffusion_generation(_encoder_mlm("roberta"), DiffusionConfig(mask_token_id=63))
    assert max_positions(model) == 64
    fits = torch.randint(3, 60, (1, 56), generator=torch.Generator().manual_seed(0))
    assert model.diffusion_generate(fits, max_new_tokens=8, tokens_per_step=8).shape == (1, 64)
    with pytest.raises(ValueError, match="prompt of 57 tokens plus max_new_tokens=8 exceeds .*=64"):
        model.diffusion_generate(torch.cat([fits, fits[:, :1]], dim=1), max_new_tokens=8, tokens_per_step=8)


class _NoPositionIds(Qwen3ForCausalLM):
    """The calling convention of LLaDA's published remote forward: no ``position_ids``, no ``logits_to_keep``."""

    def forward(
        self, input_ids=None, inputs_embeds=None, attention_mask=None, attention_bias=None, use_cache=None
    ):
        return CausalLMOutput(logits=super().forward(input_ids=input_ids).logits)


def test_forward_without_position_ids_is_called_without_them(tokenizer):
    model = _NoPositionIds(qwen3_config(tokenizer)).eval()
    add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))
    ids = torch.tensor([[7, 8, 9]])
    valid = torch.ones_like(ids)
    with torch.no_grad():
        logits, _ = diffusion_forward(
            model, model.diffusion_config, ids, valid, position_ids_from_valid(valid)
        )
        assert torch.equal(logits, Qwen3ForCausalLM.forward(model, input_ids=ids).logits)


def test_model_with_diffusion_generate_pickles(tmp_path, tokenizer):
    model = build_bidirectional_model(tokenizer)
    prompt = tokenizer(["hello"], return_tensors="pt").input_ids
    expected = model.diffusion_generate(prompt, max_new_tokens=8, block_length=4, stop_at_eos=False)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for restored in (
        torch.load(buffer, weights_only=False),
        pickle.loads(pickle.dumps(model)),
        copy.deepcopy(model),
    ):
        assert type(restored) is type(model)
        assert restored.diffusion_config == model.diffusion_config
        generated = restored.diffusion_generate(prompt, max_new_tokens=8, block_length=4, stop_at_eos=False)
        assert torch.equal(generated, expected)
    restored.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


@pytest.fixture
def saved_adapter(tmp_path, tokenizer):
    """A LoRA adapter folder (as ``t3d-trl train --use_peft`` writes it) on a saved base model."""
    from peft import LoraConfig, get_peft_model

    build_bidirectional_model(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    base = AutoModelForDiffusionLM.from_pretrained(tmp_path / "base")
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "lora"
    )
    return tmp_path


def test_an_adapter_given_an_empty_generation_config_takes_the_class_defaults(saved_adapter):
    # {} is a whole config, as for a model; it was falsy, and the adapter's saved defaults were kept.
    from t3d_trl.models.auto import ADAPTER_DEFAULTS_FILE

    defaults = saved_adapter / "lora" / ADAPTER_DEFAULTS_FILE
    saved = json.loads(defaults.read_text()) if defaults.exists() else {}
    saved["diffusion_generation"] = DiffusionGenerationConfig(max_new_tokens=8, temperature=0.5).to_dict()
    defaults.write_text(json.dumps(saved))
    lora = AutoModelForDiffusionLM.from_pretrained(saved_adapter / "lora")
    assert lora.diffusion_generation_config.temperature == 0.5
    loaded = AutoModelForDiffusionLM.from_pretrained(saved_adapter / "lora", generation_config={})
    assert loaded.diffusion_generation_config == DiffusionGenerationConfig()


def test_a_folder_without_tokenizer_files_is_named(tmp_path, tokenizer):
    # transformers 5 builds a tokenizer of special tokens alone there: prompts encoded to [] and `generate`
    # printed an empty answer.
    from t3d_trl.models.auto import load_tokenizer

    build_bidirectional_model(tokenizer).save_pretrained(tmp_path / "model")
    with pytest.raises(OSError, match="model has no tokenizer files"):
        load_tokenizer(str(tmp_path / "model"))


def test_numpy_eos_ids_become_python_ints_that_save(tmp_path):
    import numpy as np

    config = DiffusionGenerationConfig(eos_token_id=(np.int64(2), np.int64(5)))
    assert config.eos_token_id == [2, 5] and all(type(i) is int for i in config.eos_token_id)
    assert type(DiffusionGenerationConfig(eos_token_id=np.int64(2)).eos_token_id) is int
    json.dumps(config.to_dict())


def test_adapter_loads_trainable_on_request(saved_adapter):
    def trainable(model):
        return {name for name, param in model.named_parameters() if param.requires_grad}

    frozen = AutoModelForDiffusionLM.from_pretrained(saved_adapter / "lora")  # peft's default: inference
    assert not trainable(frozen)
    model = AutoModelForDiffusionLM.from_pretrained(
        saved_adapter / "lora", is_trainable=True, adapter_name="t3d"
    )
    assert trainable(model) and all("lora_" in name and ".t3d." in name for name in trainable(model))
    assert model.active_adapter == "t3d"
    with pytest.raises(ValueError, match=r"is_trainable.* peft adapter"):
        AutoModelForDiffusionLM.from_pretrained(saved_adapter / "base", is_trainable=True)


def test_an_adapter_saved_without_a_tokenizer_is_collected_from_and_trained_by_name(saved_adapter, tokenizer):
    """peft saves no tokenizer: every loader by name (collection, the trainer, evaluation) takes the base model's."""
    import datasets

    from t3d_trl import DiffusionGenerationConfig, T3DConfig, T3DTrainer, collect_trajectories
    from t3d_trl.models.auto import load_tokenizer

    adapter = str(saved_adapter / "lora")
    assert load_tokenizer(adapter).get_vocab() == tokenizer.get_vocab()
    config = DiffusionGenerationConfig(max_new_tokens=4, block_length=4)
    rows = collect_trajectories(
        adapter,
        None,
        [{"problem": "ab"}],
        "plain",
        output_dir=str(saved_adapter / "traj"),
        use_chat_template=False,
        generation_config=config,
    )
    assert len(rows) == 1
    args = T3DConfig(str(saved_adapter / "out"), use_cpu=True, report_to="none", loss_type="mdlm")
    data = datasets.Dataset.from_list([{"prompt": "ab", "completion": "cd"}])
    trainer = T3DTrainer(adapter, args, train_dataset=data)
    assert trainer.processing_class.get_vocab() == tokenizer.get_vocab()
    with pytest.raises(OSError):
        load_tokenizer(str(saved_adapter / "missing"))


def test_remote_code_registered_as_automodel_only_loads(tmp_path, tokenizer):
    model = build_bidirectional_model(tokenizer)
    model.save_pretrained(tmp_path)
    add_remote_code(tmp_path, "AutoModel")

    with pytest.raises(
        ValueError,
        match=r"needs trust_remote_code=True \(the --trust_remote_code flag of the t3d-trl commands",
    ):
        AutoModelForDiffusionLM.from_pretrained(tmp_path)
    loaded = AutoModelForDiffusionLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(loaded).__name__ == "MyModel" and type(loaded).__module__.startswith("transformers_modules")
    assert loaded.diffusion_config == model.diffusion_config
    prompt = tokenizer(["hi"], return_tensors="pt").input_ids
    settings = dict(max_new_tokens=4, stop_at_eos=False)
    assert torch.equal(
        loaded.eval().diffusion_generate(prompt, **settings), model.diffusion_generate(prompt, **settings)
    )


def test_an_adapter_loads_on_the_base_revision_it_was_trained_on(tmp_path, tokenizer, monkeypatch):
    # peft records the base revision in adapter_config.json ("revision"), and its AutoPeftModel loads the base
    # there: so does AutoModelForDiffusionLM (its tokenizer too), not the base's main branch.
    from peft import LoraConfig, get_peft_model

    from t3d_trl.models.auto import load_tokenizer

    build_bidirectional_model(tokenizer, seed=0).save_pretrained(tmp_path / "main")
    build_bidirectional_model(tokenizer, seed=1).save_pretrained(tmp_path / "v1")
    tokenizer.save_pretrained(tmp_path / "v1")  # main has none: a tokenizer read at main fails
    snapshots = {"main": ("a" * 40, tmp_path / "main"), "v1": ("b" * 40, tmp_path / "v1")}
    build_hub_cache(tmp_path, monkeypatch, "me/base", snapshots)
    base = AutoModelForDiffusionLM.from_pretrained("me/base", revision="v1")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], revision="v1")
    get_peft_model(base, lora).save_pretrained(tmp_path / "lora")
    loaded = AutoModelForDiffusionLM.from_pretrained(tmp_path / "lora")
    weights = base.get_input_embeddings().weight
    assert torch.equal(loaded.get_input_embeddings().weight, weights)
    assert load_tokenizer(str(tmp_path / "lora")).get_vocab() == tokenizer.get_vocab()
    # Offline, a revision not in the cache is named (the repo is there).
    with pytest.raises(
        FileNotFoundError, match="offline .*revision 'v2' of the Hub repo 'me/base' is not in the"
    ):
        AutoModelForDiffusionLM.from_pretrained("me/base", revision="v2")


def _cut(path, size: int) -> None:
    """Keep the first ``size`` bytes of ``path``: a copy or download interrupted midway."""
    with path.open("r+b") as f:
        f.truncate(size)


def test_a_missing_or_damaged_weights_file_is_named_before_anything_loads(tmp_path, tokenizer):
    """A folder with its JSON files but weights cut short, a lost shard or no weights at all fails at once, naming
    the file (one line in every command), instead of a safetensors traceback once loading started."""
    import re

    from t3d_trl.models.auto import check_model_source

    model = build_bidirectional_model(tokenizer)
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    model.save_pretrained(whole)
    model.save_pretrained(sharded, max_shard_size="40KB")
    check_model_source(str(whole))
    check_model_source(str(sharded))
    weights = whole / "model.safetensors"
    _cut(weights, weights.stat().st_size // 2)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(weights))} is damaged \(.*not fully covered"):
        AutoModelForDiffusionLM.from_pretrained(whole)
    check_model_source(
        str(whole), weights=False
    )  # from_pretrained skips it for a variant, gguf, state_dict...
    weights.unlink()
    with pytest.raises(
        FileNotFoundError, match=rf"^{re.escape(str(whole))} has no weights file \(.*safetensors"
    ):
        AutoModelForDiffusionLM.from_pretrained(whole)
    # torch.save's zip format must end as a zip archive; older pickles are left to torch.
    torch.save(model.state_dict(), whole / "pytorch_model.bin")
    check_model_source(str(whole))
    _cut(whole / "pytorch_model.bin", 4000)
    with pytest.raises(ValueError, match=r"pytorch_model.bin is damaged \(BadZipFile"):
        check_model_source(str(whole))
    torch.save(model.state_dict(), whole / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    check_model_source(str(whole))
    # A sharded checkpoint: every shard its index lists is there and whole.
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    _cut(shards[-1], 1000)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(shards[-1]))} is damaged"):
        AutoModelForDiffusionLM.from_pretrained(sharded)
    shards[-1].unlink()
    with pytest.raises(
        FileNotFoundError, match=rf"{shards[-1].name} is missing \(a shard .*index.json lists"
    ):
        AutoModelForDiffusionLM.from_pretrained(sharded)


def test_a_damaged_weights_file_in_the_hub_cache_is_named(tmp_path, tokenizer, monkeypatch):
    """A Hub checkpoint already in the cache is checked like a folder: offline it must be complete; online only the
    files there must be whole, since the loader downloads the rest."""
    import re

    from huggingface_hub import constants

    from t3d_trl.models.auto import check_model_source

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    build_bidirectional_model(tokenizer).save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    build_hub_cache(tmp_path, monkeypatch, "me/base", {"main": ("a" * 40, tmp_path / "sharded")})
    shards = sorted((tmp_path / "hub/models--me--base/snapshots" / ("a" * 40)).glob("model-*.safetensors"))
    assert len(shards) > 2
    check_model_source("me/base")
    _cut(shards[0], 1000)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(shards[0]))} is damaged"):
        AutoModelForDiffusionLM.from_pretrained("me/base")
    shards[0].unlink()
    with pytest.raises(FileNotFoundError, match=rf"{shards[0].name} is missing \(a shard .*index.json lists"):
        check_model_source("me/base")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    check_model_source("me/base")  # online: the missing shard is the loader's to download
    _cut(shards[1], 1000)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(shards[1]))} is damaged"):
        check_model_source("me/base")


def test_an_adapter_without_its_weights_is_named_before_its_base_loads(saved_adapter):
    lora = saved_adapter / "lora"
    _cut(lora / "adapter_model.safetensors", 100)
    with pytest.raises(ValueError, match=r"lora/adapter_model.safetensors is damaged"):
        AutoModelForDiffusionLM.from_pretrained(lora)
    (lora / "adapter_model.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"lora has no weights file \(none of adapter_model.safetensors"
    ):
        AutoModelForDiffusionLM.from_pretrained(lora)
