"""``convert_checkpoint`` and ``t3d-trl convert``: published LLaDA, SDAR and Dream -> native transformers."""

from __future__ import annotations

import json

import pytest
import torch
from published_checkpoints import (
    FAMILY_NAMES,
    NATIVE,
    SHARDS,
    build_published,
    family_tokenizer,
    model_logits,
    reference_logits,
    sample_ids,
    write_checkpoint,
)
from safetensors import safe_open
from testing_utils import CHAT_TEMPLATE
from transformers import AutoModelForCausalLM, AutoTokenizer

from t3d_trl import AutoModelForDiffusionLM, DiffusionConfig, DiffusionGenerationConfig
from t3d_trl.cli.main import main as cli
from t3d_trl.models.convert import convert_checkpoint
from t3d_trl.models.families import get_family

MODEL_TYPE = {"llada": "llada", "sdar": "sdar", "dream": "Dream"}


def converted_names(dst) -> dict[str, str]:
    """Tensor name -> output file, read from the written shards themselves."""
    names = {}
    for path in dst.glob("*.safetensors"):
        with safe_open(path, framework="pt") as f:
            names |= dict.fromkeys(f.keys(), path.name)
    return names


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_converted_checkpoint_loads_with_plain_transformers(tmp_path, family):
    src, config, state_dict, _ = build_published(tmp_path / "src", family, shards=SHARDS[family])
    dst = convert_checkpoint(src, tmp_path / "dst", max_shard_size="16KB")

    written = json.loads((dst / "config.json").read_text())
    native = NATIVE[family]
    assert written["architectures"] == [native.__name__] and "auto_map" not in written
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    names = converted_names(dst)
    assert index["weight_map"] == names and len(set(names.values())) > 1
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state_dict.values())
    assert all(
        path.stat().st_size < 16_000 + 4096 for path in dst.glob("*.safetensors") if path.stat().st_size
    )

    plain = AutoModelForCausalLM.from_pretrained(dst)  # no remote code, no t3d-trl
    assert type(plain) is native and set(plain.state_dict()) >= set(names)
    assert DiffusionConfig.from_model_config(plain.config) == get_family(MODEL_TYPE[family]).diffusion_config(
        config
    )

    model = AutoModelForDiffusionLM.from_pretrained(dst)
    direct = AutoModelForDiffusionLM.from_pretrained(src)
    assert model.diffusion_config == direct.diffusion_config
    assert model.diffusion_generation_config == direct.diffusion_generation_config
    ids = sample_ids(2)
    torch.testing.assert_close(
        model_logits(model, ids), reference_logits(family, config, state_dict, ids), atol=1e-4, rtol=1e-4
    )

    tokenizer = AutoTokenizer.from_pretrained(dst)
    assert tokenizer.chat_template == get_family(MODEL_TYPE[family]).chat_template  # the source had none
    assert tokenizer.mask_token_id == config["mask_token_id"]


def reference_greedy_steps(family, config, state_dict, prompt, generation: DiffusionGenerationConfig, steps):
    """The generated region after each of the first ``steps`` greedy steps, one token per step, decoded with
    the reference forward: the family's block layout, remasking score and (for SDAR) block-causal attention."""
    mask_id = config["mask_token_id"]
    length = generation.max_new_tokens
    block = config.get("block_size") or generation.block_length or length  # SDAR: its attention blocks
    canvas = torch.cat([prompt, torch.full((1, length), mask_id)], dim=1)
    start_of_gen = prompt.shape[1]
    history = []
    for step in range(steps):
        start = start_of_gen + (step // block) * block
        logits = reference_logits(family, config, state_dict, canvas)[0, start : start + block]
        logp = logits.log_softmax(-1)
        if generation.remasking == "entropy":
            score = (logp.exp() * logp).sum(-1)
        else:
            score = logp.max(-1).values
        score = score.masked_fill(canvas[0, start : start + block] != mask_id, float("-inf"))
        position = int(score.argmax())
        canvas[0, start + position] = logits[position].argmax()
        history.append(canvas[0, start_of_gen:].clone())
    return history


@pytest.mark.parametrize(
    ("family", "overrides"),
    [*((family, {}) for family in FAMILY_NAMES), ("sdar", {"block_size": 8})],
    ids=[*FAMILY_NAMES, "sdar-block8"],
)
def test_greedy_generation_with_family_defaults_follows_reference(tmp_path, family, overrides):
    src, config, state_dict, _ = build_published(tmp_path / "src", family, shards=SHARDS[family], **overrides)
    model = AutoModelForDiffusionLM.from_pretrained(convert_checkpoint(src, tmp_path / "dst"))
    defaults = model.diffusion_generation_config
    # The family's decoding defaults, greedy, with a generation length scaled down for speed.
    max_new_tokens = {"llada": 32, "sdar": 2 * config.get("block_size", 4), "dream": 8}[family]
    prompt = sample_ids(3, (1, 8))  # a whole number of SDAR blocks, so blocks start at the prompt end
    out = model.diffusion_generate(
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        return_dict_in_generate=True,
        output_history=True,
    )
    assert out.sequences.shape == (1, 8 + max_new_tokens)
    assert not (out.sequences == config["mask_token_id"]).any()
    generation = defaults.update(max_new_tokens=max_new_tokens, temperature=0.0)
    expected = reference_greedy_steps(family, config, state_dict, prompt, generation, steps=6)
    assert len(out.history) >= len(expected)  # SDAR: steps 5-6 decode its second block against the cache
    for step, (ours, reference) in enumerate(zip(out.history, expected)):
        assert torch.equal(ours[0], reference), f"step {step + 1}"


def test_single_file_source_and_existing_chat_template_are_kept(tmp_path):
    tokenizer = family_tokenizer("dream")
    tokenizer.chat_template = CHAT_TEMPLATE
    src, *_ = build_published(tmp_path / "src", "dream", tokenizer=tokenizer)
    dst = convert_checkpoint(src, tmp_path / "dst")  # default shard size: the largest source shard

    assert sorted(p.name for p in dst.glob("*.safetensors")) == ["model.safetensors"]
    assert not (dst / "model.safetensors.index.json").exists()
    assert AutoTokenizer.from_pretrained(dst).chat_template == CHAT_TEMPLATE


def test_default_shard_size_is_the_largest_source_shard(tmp_path):
    src, *_ = build_published(tmp_path / "src", "llada", shards=3)
    largest = max(p.stat().st_size for p in src.glob("*.safetensors"))
    dst = convert_checkpoint(src, tmp_path / "dst")
    sizes = [p.stat().st_size for p in dst.glob("*.safetensors")]
    assert len(sizes) >= 2 and max(sizes) <= largest + 4096  # + header


def test_dtype_cast(tmp_path):
    src, *_ = build_published(tmp_path / "src", "sdar")
    dst = convert_checkpoint(src, tmp_path / "dst", dtype="bfloat16")
    assert json.loads((dst / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(dst / "model.safetensors", framework="pt") as f:
        names = f.keys()
        assert {f.get_tensor(k).dtype for k in names} == {torch.bfloat16}
    with pytest.raises(ValueError, match="floating-point torch dtype such as 'bfloat16', got torch.int8"):
        convert_checkpoint(src, tmp_path / "bad", dtype=torch.int8)
    with pytest.raises(ValueError, match="got 'float8_e4m3fn'"):  # floating point, but no plain cast keeps it
        convert_checkpoint(src, tmp_path / "bad", dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="got 'bf16'"):
        convert_checkpoint(src, tmp_path / "bad", dtype="bf16")
    # "auto" (as the other commands take it) keeps the source's dtype, as None does.
    kept = convert_checkpoint(src, tmp_path / "auto", dtype="auto")
    with safe_open(kept / "model.safetensors", framework="pt") as f:
        names = f.keys()
        assert {f.get_tensor(k).dtype for k in names} == {torch.float32}


def test_missing_shard_is_named(tmp_path):
    src, *_ = build_published(tmp_path / "src", "llada", shards=3)
    (src / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"shard model-00002-of-00003.safetensors listed in .* is missing"
    ):
        convert_checkpoint(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_sizes_that_do_not_match_the_weights_are_named(tmp_path):
    src, config, *_ = build_published(tmp_path / "src", "llada", shards=2)
    config["mlp_hidden_size"] = 40  # the weights are 48 wide
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"model-00001-of-00002.safetensors: tensor 'model.transformer.blocks.0.ff_out.weight' has shape "
        r"\[32, 48\] but config.json implies \[32, 40\] for 'model.layers.0.mlp.down_proj.weight'",
    ):
        convert_checkpoint(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_unexpected_and_missing_tensors_are_named(tmp_path):
    src, config, state_dict, tokenizer = build_published(tmp_path / "src", "sdar")
    write_checkpoint(src, config, state_dict | {"model.layers.0.self_attn.rotary.inv_freq": torch.ones(8)})
    with pytest.raises(
        ValueError, match=r"model.safetensors: tensor 'model.layers.0.self_attn.rotary.inv_freq'"
    ):
        convert_checkpoint(src, tmp_path / "dst")
    del state_dict["model.layers.1.self_attn.k_norm.weight"]
    write_checkpoint(src, config, state_dict)
    with pytest.raises(
        ValueError, match=r"lacks 1 weight\(s\) .*\['model.layers.1.self_attn.k_norm.weight'\]"
    ):
        convert_checkpoint(src, tmp_path / "dst")


def test_other_bad_input(tmp_path):
    src, *_ = build_published(tmp_path / "src", "llada", model_type="llama")
    with pytest.raises(
        ValueError, match=r"model_type 'llama'; .* families \['Dream', 'dream', 'llada', 'sdar'\]"
    ):
        convert_checkpoint(src, tmp_path / "dst")
    src, *_ = build_published(tmp_path / "ok", "llada")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="full is not empty"):
        convert_checkpoint(src, tmp_path / "full")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="weights are read from safetensors files only"):
        convert_checkpoint(src, tmp_path / "dst")


def test_a_failed_conversion_leaves_nothing_and_the_rerun_works(tmp_path):
    # The tokenizer files are copied last; a bad one used to fail after the weights and config were written,
    # leaving a folder that looked converted and refused the rerun as "not empty".
    src, *_ = build_published(tmp_path / "src", "dream")
    good = (src / "tokenizer_config.json").read_text()
    (src / "tokenizer_config.json").write_text(good[: len(good) // 2])
    dst = tmp_path / "dst"
    dst.mkdir()
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        convert_checkpoint(src, dst)
    assert list(dst.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    (src / "tokenizer_config.json").write_text(good)
    assert (convert_checkpoint(src, dst) / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


def test_tokenizer_code_is_copied(tmp_path):
    src, *_ = build_published(tmp_path / "src", "dream")
    (src / "tokenization_dream.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\nclass DreamTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n"
    )
    tokenizer_config = json.loads((src / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": [None, "tokenization_dream.DreamTokenizer"]}
    tokenizer_config["tokenizer_class"] = "DreamTokenizer"
    (src / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    dst = convert_checkpoint(src, tmp_path / "dst")
    assert (dst / "tokenization_dream.py").read_text() == (src / "tokenization_dream.py").read_text()
    assert type(AutoTokenizer.from_pretrained(dst, trust_remote_code=True)).__name__ == "DreamTokenizer"


def test_cli_convert(tmp_path, capsys):
    src, config, state_dict, _ = build_published(tmp_path / "src", "dream", shards=2)
    assert cli(["convert", str(src), str(tmp_path / "dst"), "--max-shard-size", "20KB"]) == 0
    assert "converted" in capsys.readouterr().out
    assert len(list((tmp_path / "dst").glob("model-*-of-*.safetensors"))) > 1

    assert cli(["convert", str(src), str(tmp_path / "dst")]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("t3d-trl convert: ") and "is not empty" in err and "Traceback" not in err
    # A size in bytes, as convert_checkpoint takes it, splits the same way as its "20KB".
    assert cli(["convert", str(src), str(tmp_path / "bytes"), "--max_shard_size", "20000"]) == 0
    assert len(list((tmp_path / "bytes").glob("model-*-of-*.safetensors"))) == len(
        list((tmp_path / "dst").glob("model-*-of-*.safetensors"))
    )
    capsys.readouterr()
    assert (
        cli(["convert", "org/not-cached", str(tmp_path / "none")]) == 2
    )  # offline: named, not "no config.json"
    assert (
        "offline (HF_HUB_OFFLINE=1) the Hub repo 'org/not-cached' is not in the local cache"
        in capsys.readouterr().err
    )


def test_converted_sdar_round_trips_its_attention_description(tmp_path):
    from t3d_trl.models.masks import block_attention_mask

    src, config, state_dict, _ = build_published(tmp_path / "src", "sdar")
    dst = convert_checkpoint(src, tmp_path / "dst")
    assert json.loads((dst / "config.json").read_text())["diffusion"] == {
        "mask_token_id": config["mask_token_id"],
        "attention": "block_causal",
        "block_size": 4,
        "shift_logits": False,
    }
    # Plain transformers keeps the description through load and save_pretrained ...
    plain = AutoModelForCausalLM.from_pretrained(dst)
    plain.save_pretrained(tmp_path / "resaved")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "resaved")
    diffusion = DiffusionConfig.from_model_config(again.config)
    assert (diffusion.attention, diffusion.block_size) == ("block_causal", 4)
    assert AutoModelForDiffusionLM.from_pretrained(tmp_path / "resaved").diffusion_config == diffusion
    # ... but runs causal attention unless given the block-causal mask (the recipe in docs/families.md).
    ids = sample_ids(2)
    reference = reference_logits("sdar", config, state_dict, ids)
    blocks = (torch.arange(ids.shape[1]) // diffusion.block_size).expand(ids.shape[0], -1)
    mask = block_attention_mask(blocks, blocks, torch.ones_like(ids, dtype=torch.bool), again.dtype)
    with torch.no_grad():
        recipe = again(input_ids=ids, attention_mask=mask).logits.double()
        causal = again(input_ids=ids).logits.double()
    torch.testing.assert_close(recipe, reference, atol=1e-4, rtol=1e-4)
    assert (causal - reference).abs().max() > 1e-2
