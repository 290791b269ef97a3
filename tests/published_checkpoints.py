"""Tiny checkpoints in the PUBLISHED layouts of LLaDA, SDAR and Dream, and an independent reference forward.

The configs use the published ``config.json`` keys (including the options and training knobs a converter must
ignore) and the published state-dict names, with random weights. ``reference_logits`` is written in plain torch
from the families' published descriptions (see docs/families.md), without transformers, so that a
mapping error (a swapped projection, a wrong RoPE theta or head size, the wrong attention kind, a missing bias
or QK-norm, a missing logit shift) changes the logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from testing_utils import build_tokenizer
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

from t3d_trl.models.forward import diffusion_forward
from t3d_trl.models.masks import block_attention_mask, padding_attention_mask

FAMILY_NAMES = ("llada", "sdar", "dream")

# Special tokens of each published tokenizer: (bos, eos/pad, mask, extra tokens).
_TOKENS = {
    "llada": (
        "<|startoftext|>",
        "<|endoftext|>",
        "<|mdm_mask|>",
        ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    ),
    "sdar": (None, "<|endoftext|>", "<|MASK|>", ["<|im_start|>", "<|im_end|>"]),
    "dream": ("<|beginoftext|>", "<|endoftext|>", "<|mask|>", ["<|im_start|>", "<|im_end|>"]),
}
END_OF_TURN = {"llada": "<|eot_id|>", "sdar": "<|im_end|>", "dream": "<|im_end|>"}


def family_tokenizer(family: str, with_mask: bool = True):
    """The character-level test tokenizer plus the family's special tokens (no chat template)."""
    bos, eos, mask, extra = _TOKENS[family]
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in (bos, eos, mask, *extra) if t]})
    tokenizer.bos_token = bos
    tokenizer.eos_token = eos
    tokenizer.pad_token = eos
    tokenizer.mask_token = mask if with_mask else None
    tokenizer.chat_template = None
    return tokenizer


def published_config(family: str, tokenizer, **overrides) -> dict:
    """A tiny ``config.json`` dict with the family's published keys (sizes scaled down)."""
    vocab = tokenizer.get_vocab()
    bos, eos, mask, _ = _TOKENS[family]
    if family == "llada":
        config = {
            "architectures": ["LLaDAModelLM"],
            "auto_map": {
                "AutoConfig": "configuration_llada.LLaDAConfig",
                "AutoModel": "modeling_llada.LLaDAModelLM",
                "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            },
            "model_type": "llada",
            "d_model": 32,
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 4,
            "mlp_ratio": 4,
            "mlp_hidden_size": 48,
            "vocab_size": 120,
            "embedding_size": 128,
            "max_sequence_length": 256,
            "rope": True,
            "rope_theta": 500000.0,
            "rope_full_precision": True,
            "layer_norm_type": "rms",
            "rms_norm_eps": 1e-5,
            "activation_type": "silu",
            "block_type": "llama",
            "include_bias": False,
            "include_qkv_bias": False,
            "attention_layer_norm": False,
            "weight_tying": False,
            "scale_logits": False,
            "input_emb_norm": False,
            "alibi": False,
            "layer_norm_with_affine": True,
            "attention_dropout": 0.0,
            "residual_dropout": 0.0,
            "embedding_dropout": 0.0,
            "init_device": "meta",
            "flash_attention": False,
            "mask_token_id": vocab.get(mask),
            "eos_token_id": vocab.get(eos),
            "pad_token_id": vocab.get(eos),
            "torch_dtype": "float32",
            "use_cache": False,
        }
    elif family == "sdar":
        config = {
            "architectures": ["SDARForCausalLM"],
            "auto_map": {
                "AutoConfig": "configuration_sdar.SDARConfig",
                "AutoModel": "modeling_sdar.SDARModel",
                "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
            },
            "model_type": "sdar",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,  # not hidden/heads, as in SDAR-4B (2560 / 32 != 128)
            "vocab_size": 128,
            "max_position_embeddings": 256,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 28,
            "bos_token_id": vocab.get(eos),
            "eos_token_id": vocab.get(eos),
            "block_size": 4,
            "mask_token_id": vocab.get(mask),
            "attn_implementation": "flex_attention",
            "fuse_cross_entropy": True,
            "ep_size": 1,
            "micro_forward": False,
            "torch_dtype": "float32",
        }
    else:
        config = {
            "architectures": ["DreamModel"],
            "auto_map": {
                "AutoConfig": "configuration_dream.DreamConfig",
                "AutoModel": "modeling_dream.DreamModel",
            },
            "model_type": "Dream",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 128,
            "max_position_embeddings": 256,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": 28,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "mask_token_id": vocab.get(mask),
            "bos_token_id": vocab.get(bos),
            "eos_token_id": vocab.get(eos),
            "pad_token_id": vocab.get(eos),
            "torch_dtype": "float32",
            "use_cache": True,
        }
    config.update(overrides)
    return {k: v for k, v in config.items() if v is not None or k in ("rope_scaling", "sliding_window")}


def published_state_dict(family: str, config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the family's published names and shapes."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.2 * torch.randn(n, generator=gen)

    if family == "llada":
        h, heads, inter = config["d_model"], config["n_heads"], config["mlp_hidden_size"]
        kv = config["n_kv_heads"] * (h // heads)
        vocab = config["embedding_size"]
        p = "model.transformer."
        sd = {p + "wte.weight": w(vocab, h)}
        for i in range(config["n_layers"]):
            b = f"{p}blocks.{i}."
            sd |= {
                b + "attn_norm.weight": norm(h),
                b + "ff_norm.weight": norm(h),
                b + "q_proj.weight": w(h, h),
                b + "k_proj.weight": w(kv, h),
                b + "v_proj.weight": w(kv, h),
                b + "attn_out.weight": w(h, h),
                b + "ff_proj.weight": w(inter, h),
                b + "up_proj.weight": w(inter, h),
                b + "ff_out.weight": w(h, inter),
            }
        sd |= {p + "ln_f.weight": norm(h), p + "ff_out.weight": w(vocab, h)}
        return sd
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", h // heads)
    sd = {"model.embed_tokens.weight": w(vocab, h)}
    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        sd |= {
            b + "input_layernorm.weight": norm(h),
            b + "post_attention_layernorm.weight": norm(h),
            b + "self_attn.q_proj.weight": w(heads * head_dim, h),
            b + "self_attn.k_proj.weight": w(kv_heads * head_dim, h),
            b + "self_attn.v_proj.weight": w(kv_heads * head_dim, h),
            b + "self_attn.o_proj.weight": w(h, heads * head_dim),
            b + "mlp.gate_proj.weight": w(inter, h),
            b + "mlp.up_proj.weight": w(inter, h),
            b + "mlp.down_proj.weight": w(h, inter),
        }
        if family == "sdar":  # per-head QK-norm
            sd |= {
                b + "self_attn.q_norm.weight": norm(head_dim),
                b + "self_attn.k_norm.weight": norm(head_dim),
            }
        else:  # Dream: biases on q, k, v (not o)
            sd |= {
                b + "self_attn.q_proj.bias": w(heads * head_dim),
                b + "self_attn.k_proj.bias": w(kv_heads * head_dim),
                b + "self_attn.v_proj.bias": w(kv_heads * head_dim),
            }
    sd |= {"model.norm.weight": norm(h), "lm_head.weight": w(vocab, h)}
    return sd


def published_generation_config(family: str, tokenizer) -> dict | None:
    """``generation_config.json`` of the published repo (SDAR's lists its stop ids; Dream's has its sampler keys)."""
    vocab = tokenizer.get_vocab()
    eos = vocab["<|endoftext|>"]
    if family == "sdar":
        return {"bos_token_id": eos, "eos_token_id": [vocab["<|im_end|>"], eos], "pad_token_id": eos}
    if family == "dream":
        return {
            "bos_token_id": vocab["<|beginoftext|>"],
            "eos_token_id": eos,
            "pad_token_id": eos,
            "alg": "origin",
            "steps": 512,
            "eps": 0.001,
        }
    return None


def write_checkpoint(
    path: Path,
    config: dict,
    state_dict: dict[str, torch.Tensor],
    tokenizer=None,
    shards: int = 1,
    generation_config: dict | None = None,
) -> Path:
    """Save like the published repos: config.json, safetensors (sharded with an index when shards > 1)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if generation_config is not None:
        (path / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    keys = list(state_dict)
    if shards == 1:
        save_file(state_dict, path / "model.safetensors", metadata={"format": "pt"})
    else:
        per = math.ceil(len(keys) / shards)
        weight_map = {}
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: state_dict[k] for k in keys[i * per : (i + 1) * per]}
            save_file(part, path / name, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(part, name)
        total = sum(t.numel() * t.element_size() for t in state_dict.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def build_published(path: Path, family: str, shards: int = 1, tokenizer=None, **overrides):
    """Write a tiny published-layout checkpoint; returns ``(path, config, state_dict, tokenizer)``."""
    tokenizer = tokenizer if tokenizer is not None else family_tokenizer(family)
    config = published_config(family, tokenizer, **overrides)
    state_dict = published_state_dict(family, config)
    write_checkpoint(
        path, config, state_dict, tokenizer, shards, published_generation_config(family, tokenizer)
    )
    return path, config, state_dict, tokenizer


# ----- the library side --------------------------------------------------------------------------------------

NATIVE = {"llada": LlamaForCausalLM, "sdar": Qwen3ForCausalLM, "dream": Qwen2ForCausalLM}
SHARDS = {"llada": 3, "sdar": 2, "dream": 1}


def model_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of every position through the library's forward, with the mask of the family's attention kind."""
    diffusion = model.diffusion_config
    batch, length = input_ids.shape
    valid = torch.ones_like(input_ids, dtype=torch.bool)
    if diffusion.is_block_causal:
        blocks = (torch.arange(length) // diffusion.block_size).expand(batch, -1)
        mask = block_attention_mask(blocks, blocks, valid, torch.float32)
    else:
        mask = padding_attention_mask(valid, length, torch.float32)
    positions = torch.arange(length).expand(batch, -1)
    return diffusion_forward(model, diffusion, input_ids, mask, positions)[0].double()


def sample_ids(seed: int = 0, shape=(2, 11)) -> torch.Tensor:
    return torch.randint(5, 100, shape, generator=torch.Generator().manual_seed(seed))


# ----- independent reference forward ------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE, half-rotation layout: dimension pairs are (j, j + d/2), angle = position * theta^(-2j/d)."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * freq[None]
    cos, sin = angle.cos(), angle.sin()
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _allowed(kind: str, length: int, block: int = 4) -> torch.Tensor:
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    if kind == "bidirectional":
        return torch.ones(length, length, dtype=torch.bool)
    if kind == "block_causal":
        return j // block <= i // block
    return j <= i  # causal: only used to show that the attention kind matters


def _layer(family: str, sd: dict, i: int) -> dict:
    g = lambda name: sd[name].double()  # noqa: E731
    if family == "llada":
        b = f"model.transformer.blocks.{i}."
        return {
            "norm1": g(b + "attn_norm.weight"),
            "norm2": g(b + "ff_norm.weight"),
            "q": g(b + "q_proj.weight"),
            "k": g(b + "k_proj.weight"),
            "v": g(b + "v_proj.weight"),
            "o": g(b + "attn_out.weight"),
            "gate": g(b + "ff_proj.weight"),
            "up": g(b + "up_proj.weight"),
            "down": g(b + "ff_out.weight"),
        }
    b = f"model.layers.{i}."
    layer = {
        "norm1": g(b + "input_layernorm.weight"),
        "norm2": g(b + "post_attention_layernorm.weight"),
        "q": g(b + "self_attn.q_proj.weight"),
        "k": g(b + "self_attn.k_proj.weight"),
        "v": g(b + "self_attn.v_proj.weight"),
        "o": g(b + "self_attn.o_proj.weight"),
        "gate": g(b + "mlp.gate_proj.weight"),
        "up": g(b + "mlp.up_proj.weight"),
        "down": g(b + "mlp.down_proj.weight"),
    }
    if family == "sdar":
        layer |= {"q_norm": g(b + "self_attn.q_norm.weight"), "k_norm": g(b + "self_attn.k_norm.weight")}
    else:
        layer |= {n + "_bias": g(f"{b}self_attn.{n}_proj.bias") for n in "qkv"}
    return layer


def reference_logits(
    family: str, config: dict, sd: dict, input_ids: torch.Tensor, attention: str | None = None
) -> torch.Tensor:
    """Float64 logits ``[B, L, V]`` of the published architecture, from the published weights.

    Token ``i``'s prediction sits at position ``i`` (Dream's logits are shifted right by one, as its sampler does).
    """
    if family == "llada":
        h, heads, kv_heads = config["d_model"], config["n_heads"], config["n_kv_heads"]
        layers, head_dim, eps = (
            config["n_layers"],
            config["d_model"] // config["n_heads"],
            config["rms_norm_eps"],
        )
        embed, final, head = (
            sd["model.transformer.wte.weight"],
            sd["model.transformer.ln_f.weight"],
            sd["model.transformer.ff_out.weight"],
        )
        kind = "bidirectional"
    else:
        h, heads, kv_heads = (
            config["hidden_size"],
            config["num_attention_heads"],
            config["num_key_value_heads"],
        )
        layers, eps = config["num_hidden_layers"], config["rms_norm_eps"]
        head_dim = config.get("head_dim", h // heads)
        embed, final, head = sd["model.embed_tokens.weight"], sd["model.norm.weight"], sd["lm_head.weight"]
        kind = "block_causal" if family == "sdar" else "bidirectional"
    kind = attention or kind
    theta = config["rope_theta"]
    batch, length = input_ids.shape
    allowed = _allowed(kind, length, config.get("block_size", 4))
    x = embed.double()[input_ids]
    for i in range(layers):
        p = _layer(family, sd, i)
        y = _rms(x, p["norm1"], eps)
        q, k, v = (y @ p[n].T + p.get(n + "_bias", 0) for n in "qkv")
        q = q.view(batch, length, heads, head_dim).transpose(1, 2)
        k = k.view(batch, length, kv_heads, head_dim).transpose(1, 2)
        v = v.view(batch, length, kv_heads, head_dim).transpose(1, 2)
        if "q_norm" in p:
            q, k = _rms(q, p["q_norm"], eps), _rms(k, p["k_norm"], eps)
        q, k = _rotate(q, theta), _rotate(k, theta)
        group = heads // kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, heads * head_dim)
        x = x + attn @ p["o"].T
        y = _rms(x, p["norm2"], eps)
        x = x + (torch.nn.functional.silu(y @ p["gate"].T) * (y @ p["up"].T)) @ p["down"].T
    logits = _rms(x, final.double(), eps) @ head.double().T
    if family == "dream":
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits
