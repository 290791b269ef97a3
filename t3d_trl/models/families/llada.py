"""LLaDA (GSAI-ML/LLaDA-8B-Instruct): OLMo-style weights on a native bidirectional ``LlamaForCausalLM``.

The published model is a LLaMA block (pre-norm RMSNorm, half-rotation RoPE, SiLU-gated MLP, no biases, untied
head) that attends bidirectionally. Only its names differ from Llama; note that ``ff_out`` names both the
per-block down projection and the LM head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import LlamaConfig

from .base import ModelFamily, check_supported, require

_BLOCK = r"^model\.transformer\.blocks\.(\d+)\."
_LAYER = r"model.layers.\1."
KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    _BLOCK + r"attn_norm\.": _LAYER + "input_layernorm.",
    _BLOCK + r"ff_norm\.": _LAYER + "post_attention_layernorm.",
    _BLOCK + r"q_proj\.": _LAYER + "self_attn.q_proj.",
    _BLOCK + r"k_proj\.": _LAYER + "self_attn.k_proj.",
    _BLOCK + r"v_proj\.": _LAYER + "self_attn.v_proj.",
    _BLOCK + r"attn_out\.": _LAYER + "self_attn.o_proj.",
    _BLOCK + r"ff_proj\.": _LAYER + "mlp.gate_proj.",  # the input of the SiLU
    _BLOCK + r"up_proj\.": _LAYER + "mlp.up_proj.",
    _BLOCK + r"ff_out\.": _LAYER + "mlp.down_proj.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
}

# Published options, and the only values the native Llama mapping reproduces.
_SUPPORTED = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "rope": (True,),
    "alibi": (False,),
    "include_bias": (False,),
    "include_qkv_bias": (False,),
    "attention_layer_norm": (False,),
    "scale_logits": (False,),
    "input_emb_norm": (False,),
    "layer_norm_with_affine": (True,),
    "bias_for_layer_norm": (False, None),
    "clip_qkv": (None,),
    "multi_query_attention": (False, None),
}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def llama_config(raw: Mapping[str, Any]) -> LlamaConfig:
    """``LlamaConfig`` of a published LLaDA ``config.json`` (d_model, n_layers, n_heads, ... keys)."""
    check_supported(raw, _SUPPORTED, "LLaDA -> Llama")
    require(raw, ("d_model", "n_layers", "n_heads", "vocab_size"))
    d_model, n_heads = int(raw["d_model"]), int(raw["n_heads"])
    if d_model % n_heads:
        raise ValueError(f"config.json: d_model={d_model} is not a multiple of n_heads={n_heads}")
    intermediate = raw.get("mlp_hidden_size") or int(raw.get("mlp_ratio", 4)) * d_model
    return LlamaConfig(
        hidden_size=d_model,
        intermediate_size=int(intermediate),
        num_hidden_layers=int(raw["n_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(raw.get("n_kv_heads") or n_heads),
        head_dim=d_model // n_heads,
        # The embedding matrix has embedding_size rows (vocab_size padded up), and so does the head.
        vocab_size=int(raw.get("embedding_size") or raw["vocab_size"]),
        max_position_embeddings=int(raw.get("max_sequence_length", 4096)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        # LLaDA has no RoPE scaling (never inherit Llama 3's).
        rope_parameters={"rope_type": "default", "rope_theta": float(raw.get("rope_theta", 10000.0))},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        is_causal=False,
    )


LLADA = ModelFamily(
    name="LLaDA",
    model_types=("llada",),
    map_config=llama_config,
    attention="bidirectional",
    mask_tokens=("<|mdm_mask|>",),
    end_of_turn_tokens=("<|eot_id|>",),
    # LLaDA's demo and chat settings (generate.py, chat.py): 128 tokens in blocks of 32, one token per step.
    generation_defaults={
        "max_new_tokens": 128,
        "block_length": 32,
        "tokens_per_step": 1,
        "temperature": 0.0,
        "remasking": "low_confidence",
    },
    chat_template=CHAT_TEMPLATE,
    key_mapping=KEY_MAPPING,
)
