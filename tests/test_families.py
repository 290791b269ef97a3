"""Published LLaDA, SDAR and Dream checkpoints load onto native transformers classes without remote code.

Each test builds a tiny checkpoint in the family's PUBLISHED layout (tests/published_checkpoints.py) and checks
the loaded model against an independent plain-torch forward of the published architecture.
"""

from __future__ import annotations

import json

import pytest
import torch
from published_checkpoints import (
    END_OF_TURN,
    FAMILY_NAMES,
    NATIVE,
    SHARDS,
    build_published,
    family_tokenizer,
    model_logits,
    published_config,
    published_state_dict,
    reference_logits,
    sample_ids,
    write_checkpoint,
)
from safetensors import safe_open
from testing_utils import build_tokenizer
from transformers import AutoModelForCausalLM

from t3d_trl import AutoModelForDiffusionLM, DiffusionGenerationMixin
from t3d_trl.models.families import DREAM, LLADA, SDAR, get_family
from t3d_trl.models.forward import diffusion_forward

WRONG_ATTENTION = {"llada": "causal", "sdar": "bidirectional", "dream": "causal"}


def test_registry_is_keyed_by_published_model_type():
    assert get_family("llada") is LLADA
    assert get_family("sdar") is SDAR
    assert get_family("Dream") is DREAM and get_family("dream") is DREAM
    assert get_family("llama") is None and get_family(None) is None


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_published_checkpoint_loads_natively_and_matches_reference(tmp_path, family):
    path, config, state_dict, _ = build_published(tmp_path / family, family, shards=SHARDS[family])
    model = AutoModelForDiffusionLM.from_pretrained(path)

    assert isinstance(model, NATIVE[family]) and isinstance(model, DiffusionGenerationMixin)
    ids = sample_ids()
    ours = model_logits(model, ids)
    reference = reference_logits(family, config, state_dict, ids)
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
    # The comparison is sensitive: the wrong attention kind gives clearly different logits.
    wrong = reference_logits(family, config, state_dict, ids, attention=WRONG_ATTENTION[family])
    assert (wrong - reference).abs().max() > 1e-2


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_family_diffusion_description_and_decoding_defaults(tmp_path, family):
    path, config, _, tokenizer = build_published(tmp_path / family, family)
    model = AutoModelForDiffusionLM.from_pretrained(path)
    diffusion, generation = model.diffusion_config, model.diffusion_generation_config

    assert diffusion.mask_token_id == config["mask_token_id"]
    assert diffusion.attention == ("block_causal" if family == "sdar" else "bidirectional")
    assert diffusion.block_size == (config["block_size"] if family == "sdar" else None)
    assert diffusion.shift_logits is (family == "dream")
    stops = generation.eos_token_id
    assert stops[0] == config["eos_token_id"]
    assert tokenizer.convert_tokens_to_ids(END_OF_TURN[family]) in stops
    assert generation.pad_token_id == config.get("pad_token_id", config["eos_token_id"])
    defaults = get_family(config["model_type"]).generation_defaults
    assert {k: getattr(generation, k) for k in defaults} == dict(defaults)


def test_llada_reference_decoding_defaults():
    assert LLADA.generation_defaults["block_length"] == 32 and LLADA.generation_defaults["temperature"] == 0
    # A block-causal family decodes in its attention blocks: block_length is left to the checkpoint's block_size.
    assert "block_length" not in SDAR.generation_defaults and SDAR.generation_defaults["tokens_per_step"] == 1


def test_config_mapping_keeps_sizes_and_drops_training_knobs():
    tokenizer = family_tokenizer("llada")
    raw = published_config("llada", tokenizer)
    llama = LLADA.native_config(raw)
    assert (llama.hidden_size, llama.intermediate_size, llama.num_hidden_layers) == (
        raw["d_model"],
        raw["mlp_hidden_size"],
        raw["n_layers"],
    )
    assert llama.vocab_size == raw["embedding_size"]  # the padded size the weights have
    assert llama.head_dim == raw["d_model"] // raw["n_heads"]
    assert llama.rope_parameters == {"rope_type": "default", "rope_theta": raw["rope_theta"]}
    assert llama.rms_norm_eps == raw["rms_norm_eps"] and llama.is_causal is False
    assert llama.tie_word_embeddings is False and llama.mask_token_id == raw["mask_token_id"]

    raw = published_config("sdar", family_tokenizer("sdar"))
    qwen3 = SDAR.native_config(raw)
    assert qwen3.model_type == "qwen3" and qwen3.head_dim == raw["head_dim"]
    assert not hasattr(qwen3, "fuse_cross_entropy") and qwen3._attn_implementation != "flex_attention"
    assert qwen3.architectures == ["Qwen3ForCausalLM"]

    qwen2 = DREAM.native_config(published_config("dream", family_tokenizer("dream")))
    assert qwen2.model_type == "qwen2" and qwen2.is_causal is False


def test_sdar_mask_comes_from_the_tokenizer_when_the_config_has_none(tmp_path):
    tokenizer = family_tokenizer("sdar")
    mask_id = tokenizer.convert_tokens_to_ids("<|MASK|>")
    path, *_ = build_published(tmp_path / "declared", "sdar", tokenizer=tokenizer, mask_token_id=None)
    assert AutoModelForDiffusionLM.from_pretrained(path).diffusion_config.mask_token_id == mask_id

    # The published special_tokens_map spells the mask differently from the vocabulary: the known spelling wins.
    undeclared = family_tokenizer("sdar", with_mask=False)
    path, *_ = build_published(tmp_path / "undeclared", "sdar", tokenizer=undeclared, mask_token_id=None)
    assert AutoModelForDiffusionLM.from_pretrained(path).diffusion_config.mask_token_id == mask_id


def test_tokenizer_without_mask_token_is_a_clear_error(tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.mask_token = None
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_end|>"]})
    path, *_ = build_published(
        tmp_path / "sdar", "sdar", tokenizer=tokenizer, mask_token_id=None, eos_token_id=2, bos_token_id=2
    )
    with pytest.raises(
        ValueError, match=r"no 'mask_token_id' and its tokenizer has no mask token.*<\|MASK\|>"
    ):
        AutoModelForDiffusionLM.from_pretrained(path)


def test_checkpoint_without_tokenizer_files_says_so(tmp_path, caplog):
    raw = published_config("sdar", family_tokenizer("sdar"))
    path = write_checkpoint(tmp_path / "sdar", raw, published_state_dict("sdar", raw))  # no tokenizer files
    with caplog.at_level("WARNING"):
        model = AutoModelForDiffusionLM.from_pretrained(path)
    assert model.diffusion_config.mask_token_id == raw["mask_token_id"]
    assert "tokenizer not loaded" in caplog.text
    del raw["mask_token_id"]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="no 'mask_token_id' and no tokenizer could be loaded"):
        AutoModelForDiffusionLM.from_pretrained(path)


def test_checkpoint_without_safetensors_names_what_is_read(tmp_path):
    path, *_ = build_published(tmp_path / "llada", "llada")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="weights are read from safetensors files only") as error:
        AutoModelForDiffusionLM.from_pretrained(path)
    assert "convert" not in str(error.value)


def test_unknown_model_type_is_a_clear_error(tmp_path):
    path, *_ = build_published(tmp_path / "x", "llada", model_type="mdlm-x")
    with pytest.raises(ValueError, match=r"model_type 'mdlm-x'.*\['Dream', 'dream', 'llada', 'sdar'\]"):
        AutoModelForDiffusionLM.from_pretrained(path)


def test_unsupported_or_missing_config_keys_are_named(tmp_path):
    path, *_ = build_published(tmp_path / "alibi", "llada", alibi=True)
    with pytest.raises(ValueError, match=r"config.json key 'alibi'=True is not supported"):
        AutoModelForDiffusionLM.from_pretrained(path)
    path, config, *_ = build_published(tmp_path / "no_d_model", "llada")
    del config["d_model"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lacks required key\(s\) \['d_model'\]"):
        AutoModelForDiffusionLM.from_pretrained(path)


def test_config_sizes_that_do_not_match_the_weights_are_refused(tmp_path):
    path, config, state_dict, _ = build_published(tmp_path / "sdar", "sdar", shards=2)
    config["intermediate_size"] = 80  # the weights are 64 wide
    (path / "config.json").write_text(json.dumps(config))
    first = "model-00001-of-00002.safetensors"
    with pytest.raises(ValueError, match=rf"{first}: tensor 'model.layers.0.mlp.down_proj.weight' has shape"):
        AutoModelForDiffusionLM.from_pretrained(path)


def test_loaded_llada_saves_a_native_checkpoint(tmp_path):
    path, config, state_dict, _ = build_published(tmp_path / "llada", "llada", shards=2)
    model = AutoModelForDiffusionLM.from_pretrained(path)
    model.save_pretrained(tmp_path / "saved")

    with safe_open(tmp_path / "saved" / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
    assert names == set(model.state_dict()) and not any("transformer" in n for n in names)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    ids = sample_ids(1)
    torch.testing.assert_close(
        plain(ids).logits.double(), reference_logits("llada", config, state_dict, ids), atol=1e-4, rtol=1e-4
    )


def test_remote_code_is_an_explicit_opt_in(tmp_path):
    path, *_ = build_published(tmp_path / "sdar", "sdar")
    with pytest.raises(ValueError, match="use_remote_code=True .* trust_remote_code=True"):
        AutoModelForDiffusionLM.from_pretrained(path, use_remote_code=True)


# LLaDA's published remote modeling code, reduced to its calling convention (Fast-dLLM modeling_llada.py
# LLaDAModelLM.forward takes no position_ids and no logits_to_keep) and to the embedding and head weights.
_LLADA_REMOTE_CONFIG = """from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"
"""
_LLADA_REMOTE_MODELING = """from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig


class LLaDAModelLM(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.embedding_size, config.d_model),
                ff_out=nn.Linear(config.d_model, config.embedding_size, bias=False),
            )
        )
        self.post_init()

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, attention_bias=None,
                past_key_values=None, labels=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, return_dict=None):
        transformer = self.model.transformer
        return CausalLMOutputWithPast(logits=transformer.ff_out(transformer.wte(input_ids)))

    def get_output_embeddings(self):
        return self.model.transformer.ff_out
"""


def test_remote_code_runs_with_its_own_calling_convention(tmp_path):
    path, config, state_dict, _ = build_published(tmp_path / "llada", "llada")
    (path / "configuration_llada.py").write_text(_LLADA_REMOTE_CONFIG)
    (path / "modeling_llada.py").write_text(_LLADA_REMOTE_MODELING)
    model = AutoModelForDiffusionLM.from_pretrained(path, use_remote_code=True, trust_remote_code=True)
    assert type(model).__name__ == "LLaDAModelLM" and type(model).__module__.startswith(
        "transformers_modules"
    )
    ids = sample_ids(shape=(1, 6))
    valid = torch.ones_like(ids)
    with torch.no_grad():
        logits, _ = diffusion_forward(model, model.diffusion_config, ids, valid, torch.arange(6)[None])
    embed, head = state_dict["model.transformer.wte.weight"], state_dict["model.transformer.ff_out.weight"]
    torch.testing.assert_close(logits, embed[ids] @ head.T)


CONVERSATION = [{"role": "user", "content": " What is 2+2? "}]


@pytest.mark.parametrize(
    ("family", "kwargs", "expected"),
    [
        (
            "llada",
            {},
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "sdar",
            {"enable_thinking": False},
            "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
        ("sdar", {}, "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n"),
        (
            "dream",
            {},
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n",
        ),
    ],
)
def test_family_chat_templates(family, kwargs, expected):
    tokenizer = family_tokenizer(family)
    tokenizer.chat_template = get_family(
        {"llada": "llada", "sdar": "sdar", "dream": "Dream"}[family]
    ).chat_template
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True, **kwargs)
    assert text == expected
    without_prompt = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=False)
    assert (
        not without_prompt.endswith("assistant<|end_header_id|>\n\n") and "assistant\n" not in without_prompt
    )


# Size keys of the published config.json files (FAMILIES.md; SDAR-1.7B and Dream are [derived]/[3p] there).
_LLADA_8B = {
    "model_type": "llada",
    "d_model": 4096,
    "n_layers": 32,
    "n_heads": 32,
    "n_kv_heads": 32,
    "mlp_hidden_size": 12288,
    "vocab_size": 126464,
    "embedding_size": 126464,
    "weight_tying": False,
}
_SDAR_4B = {
    "model_type": "sdar",
    "hidden_size": 2560,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 9728,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
_SDAR_1_7B = _SDAR_4B | {
    "hidden_size": 2048,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "intermediate_size": 6144,
}
_DREAM_7B = {
    "model_type": "Dream",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    ("raw", "parameters", "tensors"),
    [
        (_LLADA_8B, 8_015_581_184, 291),  # = safetensors index total_size / 2; 291 tensors in the index
        (_SDAR_4B, 4_411_424_256, 399),
        (_SDAR_1_7B, 2_031_739_904, None),
        (_DREAM_7B, 7_615_616_512, None),
    ],
    ids=["LLaDA-8B", "SDAR-4B", "SDAR-1.7B", "Dream-7B"],
)
def test_mapped_configs_reproduce_published_parameter_counts(raw, parameters, tensors):
    config = get_family(raw["model_type"]).native_config(raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == parameters
    if tensors is not None:
        assert len(model.state_dict()) == tensors


@pytest.mark.parametrize("family", ["llada", "sdar", "dream"])
def test_a_published_checkpoint_s_tokenizer_loads_without_remote_code_and_with_the_family_template(
    tmp_path, family
):
    # AutoTokenizer read the published config.json, whose auto_map asked to run its code (a 15 s prompt on a
    # terminal); the family's chat template fills in, as convert writes it.
    from t3d_trl.models.auto import load_tokenizer

    src, *_ = build_published(tmp_path / family, family)
    tokenizer_config = json.loads((src / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name in ("chat_template.jinja", "chat_template.json"):
        (src / name).unlink(missing_ok=True)
    tokenizer = load_tokenizer(str(src))
    assert (
        tokenizer.chat_template
        == get_family(json.loads((src / "config.json").read_text())["model_type"]).chat_template
    )


def test_config_keywords_reach_a_published_checkpoint_s_native_config(tmp_path):
    # They crashed in the model's __init__ (the native config was passed as an object), where a converted copy
    # takes them, as transformers does.
    src, *_ = build_published(tmp_path / "dream", "dream")
    model = AutoModelForDiffusionLM.from_pretrained(src, use_cache=False, attention_dropout=0.1)
    assert model.config.use_cache is False and model.config.attention_dropout == 0.1
    for keyword in ("config", "output_loading_info"):
        with pytest.raises(ValueError, match=f"\\['{keyword}'\\] are not supported"):
            AutoModelForDiffusionLM.from_pretrained(
                src, **{keyword: model.config if keyword == "config" else True}
            )
