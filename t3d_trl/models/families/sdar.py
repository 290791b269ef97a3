"""SDAR (JetLM/SDAR-1.7B-Chat, SDAR-4B-Chat): native ``Qwen3ForCausalLM`` with block-causal attention.

SDAR's weights and config keys are Qwen3's (QK-norm, half-rotation RoPE, SiLU-gated MLP, untied head); only
``model_type`` differs, plus ``block_size`` and ``mask_token_id`` (absent from some published copies, in which
case the mask comes from the tokenizer). A position attends its own block of ``block_size`` tokens (4 in the
published configs) and every earlier block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import Qwen3Config

from .base import ModelFamily, require, rope_parameters, take

# Keys shared with Qwen3Config; training-only knobs (fuse_cross_entropy, ep_size, attn_implementation, ...)
# are left behind.
QWEN3_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
    "attention_bias",
    "attention_dropout",
    "tie_word_embeddings",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def qwen3_config(raw: Mapping[str, Any]) -> Qwen3Config:
    """``Qwen3Config`` of a published SDAR ``config.json`` (same keys, model_type ``qwen3``)."""
    require(raw, REQUIRED)
    return Qwen3Config(**take(raw, QWEN3_KEYS), rope_parameters=rope_parameters(raw))


SDAR = ModelFamily(
    name="SDAR",
    model_types=("sdar",),
    map_config=qwen3_config,
    attention="block_causal",
    block_size=4,
    mask_tokens=("<|MASK|>", "<MASK>"),
    end_of_turn_tokens=("<|im_end|>",),
    # SDAR's README decoding: one step per token, greedy, low-confidence static remasking. No block_length: a
    # block-causal model decodes in its attention blocks (block_size); the generation length is the library's.
    generation_defaults={
        "tokens_per_step": 1,
        "temperature": 0.0,
        "remasking": "low_confidence",
    },
    chat_template=CHAT_TEMPLATE,
)
