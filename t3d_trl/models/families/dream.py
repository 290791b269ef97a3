"""Dream (Dream-org/Dream-v0-Instruct-7B): native ``Qwen2ForCausalLM``, bidirectional, logits shifted by one.

Dream's weights are Qwen2.5's (biases on q/k/v only, half-rotation RoPE, SiLU-gated MLP, untied head) and it
attends bidirectionally. It keeps its autoregressive initialisation's habit of predicting token ``i`` at
position ``i - 1``; the sampler applies that shift (``DiffusionConfig.shift_logits``), the weights are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import Qwen2Config

from .base import ModelFamily, require, rope_parameters, take

QWEN2_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
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
    "{% if messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen2_config(raw: Mapping[str, Any]) -> Qwen2Config:
    """Bidirectional ``Qwen2Config`` of a published Dream ``config.json`` (head_dim = hidden / heads)."""
    require(raw, REQUIRED)
    return Qwen2Config(**take(raw, QWEN2_KEYS), rope_parameters=rope_parameters(raw), is_causal=False)


DREAM = ModelFamily(
    name="Dream",
    model_types=("Dream", "dream"),
    map_config=qwen2_config,
    attention="bidirectional",
    shift_logits=True,
    mask_tokens=("<|mask|>",),
    end_of_turn_tokens=("<|im_end|>",),
    # Dream-Instruct evaluation settings (dParallel eval.sh): one block of 256 tokens, one token per step,
    # temperature 0.1, top-p 0.9, entropy-ordered unmasking; per-step counts by Dream's own timestep rule.
    generation_defaults={
        "max_new_tokens": 256,
        "tokens_per_step": 1,
        "temperature": 0.1,
        "top_p": 0.9,
        "remasking": "entropy",
        "schedule": "dream",
    },
    chat_template=CHAT_TEMPLATE,
)
