"""Shared fixtures: a local character-level tokenizer with a mask token and tiny models, all built in-process."""

from __future__ import annotations

import os
import string

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast, Qwen3Config

from t3d_trl import DiffusionConfig, add_diffusion_generation
from t3d_trl.models.auto import _with_mixin  # noqa: F401  (imported so fixtures share the mixin classes)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
VOCAB_SIZE = 128


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus [PAD] [BOS] [EOS] [MASK] [UNK]; decodes losslessly."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def qwen3_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> Qwen3Config:
    values = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return Qwen3Config(**values)


def build_bidirectional_model(tokenizer, seed: int = 0, **overrides):
    """Tiny Qwen3 run bidirectionally (LLaDA-like full diffusion)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(tokenizer, **overrides)).eval()
    model.config.is_causal = False
    return add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))


def build_block_causal_model(tokenizer, seed: int = 0, block_size: int = 4, **overrides):
    """Tiny Qwen3 with SDAR-style block-causal attention (block 4)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(tokenizer, **overrides)).eval()
    diffusion = DiffusionConfig(
        mask_token_id=tokenizer.mask_token_id, attention="block_causal", block_size=block_size
    )
    return add_diffusion_generation(model, diffusion)


def build_modernbert_model(tokenizer, seed: int = 0):
    """Tiny ModernBertForMaskedLM (an encoder MLM, bidirectional by construction)."""
    torch.manual_seed(seed)
    config = ModernBertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        local_attention=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        cls_token_id=tokenizer.bos_token_id,
        sep_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
    )
    model = ModernBertForMaskedLM(config).eval()
    return add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))


@pytest.fixture
def bidirectional_model(tokenizer):
    return build_bidirectional_model(tokenizer)


@pytest.fixture
def block_causal_model(tokenizer):
    return build_block_causal_model(tokenizer)


@pytest.fixture
def modernbert_model(tokenizer):
    return build_modernbert_model(tokenizer)
