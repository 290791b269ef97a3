"""Tests of the compiled decoding step (``DiffusionGenerationConfig(compile=...)``) and its eager fallback."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model, build_modernbert_model

from t3d_trl import DiffusionGenerationConfig
from t3d_trl.generation import compiled

PROMPTS = ["hi", "hello there", "x = 3 + 4"]


def _batch(tokenizer):
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


@pytest.fixture(scope="module")
def compiled_models(tokenizer):
    """One block-causal and one bidirectional tiny model, shared so that each shape compiles once."""
    return {
        "block_causal": build_block_causal_model(tokenizer, initializer_range=0.5),
        "bidirectional": build_bidirectional_model(tokenizer, initializer_range=0.5),
    }


# Few shapes (each one compiles): the exact block cache, static and dynamic with sampling; the dual and prefix
# caches (prefix: one window length per block). The no-cache canvas is the dual cache's first-step pass.
CASES = [
    ("block_causal", dict(use_cache=True)),
    ("block_causal", dict(use_cache=True, threshold=0.3, temperature=0.8, top_k=20)),
    ("bidirectional", dict(cache="dual", block_length=4, remasking="margin")),
    ("bidirectional", dict(cache="prefix", block_length=4, schedule="dream")),
]


@pytest.mark.slow
def test_compiled_decoding_gives_the_eager_tokens(tokenizer, compiled_models, caplog):
    input_ids, attention_mask = _batch(tokenizer)  # left-padded rows of different lengths
    for kind, settings in CASES:
        model = compiled_models[kind]
        config = dict(max_new_tokens=12, stop_at_eos=False, return_dict_in_generate=True, **settings)
        with caplog.at_level(logging.INFO, logger=compiled.__name__):
            # Twice: the second generation reuses the compiled step and its static cache.
            outs = [
                model.diffusion_generate(
                    input_ids,
                    attention_mask,
                    compile="default",
                    generator=torch.Generator().manual_seed(0),
                    **config,
                )
                for _ in range(2)
            ]
        eager = model.diffusion_generate(
            input_ids, attention_mask, generator=torch.Generator().manual_seed(0), **config
        )
        for out in outs:
            assert torch.equal(out.sequences, eager.sequences), (kind, settings)
            assert torch.equal(out.decode_steps, eager.decode_steps), (kind, settings)
        step = compiled.step_for(model, "default")
        assert step.compiled and not step.failed and step.compile_seconds > 0
    # The compile cost is logged once per model, whatever the number of shapes compiled.
    logged = [r for r in caplog.records if r.name == compiled.__name__ and r.levelno == logging.INFO]
    assert len(logged) == len(compiled_models)


@pytest.mark.slow
def test_bf16_compiled_decoding_gives_the_eager_tokens_and_keeps_one_cache(tokenizer):
    """Fused bf16 kernels keep float32 intermediates unless told to round as eager does, which flips near-tied
    tokens; and a cache per batch shape (evaluation meets a new canvas length nearly every batch) would pile up
    memory the batch size was not planned for."""
    model = build_block_causal_model(tokenizer, initializer_range=0.5).to(torch.bfloat16)
    prompts = [*PROMPTS, "abcdefg", "a", "what is 7*6?", "Name a prime", "zzz top"]
    config = dict(max_new_tokens=16, block_length=4, stop_at_eos=False)
    longer, shorter = (tokenizer(p, return_tensors="pt", padding=True) for p in (prompts, prompts[3:5]))
    first = model.diffusion_generate(**longer, compile="default", **config)
    assert torch.equal(first, model.diffusion_generate(**longer, **config))
    step = compiled.step_for(model, "default")
    (old,) = step._caches.values()
    old = weakref.ref(old)
    assert torch.equal(
        model.diffusion_generate(**shorter, compile="default", **config),
        model.diffusion_generate(**shorter, **config),
    )
    gc.collect()
    assert old() is None and len(step._caches) == 1  # the first shape's cache is freed
    assert torch.equal(model.diffusion_generate(**longer, compile="default", **config), first)  # met again


def test_a_failing_compiler_falls_back_to_eager_with_one_warning(tokenizer, monkeypatch):
    model = build_block_causal_model(tokenizer)
    input_ids, attention_mask = _batch(tokenizer)

    def broken_compile(fn, **kwargs):
        def raise_on_call(*args, **kw):
            raise RuntimeError("no C++ compiler found")

        return raise_on_call

    monkeypatch.setattr(torch, "compile", broken_compile)
    settings = dict(max_new_tokens=8, stop_at_eos=False)
    with pytest.warns(RuntimeWarning, match="no C.. compiler found.*decoding eagerly") as caught:
        first = model.diffusion_generate(input_ids, attention_mask, compile="reduce-overhead", **settings)
        second = model.diffusion_generate(input_ids, attention_mask, compile="reduce-overhead", **settings)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    eager = model.diffusion_generate(input_ids, attention_mask, **settings)
    assert torch.equal(first, eager) and torch.equal(second, eager)


def test_an_unsupported_model_decodes_eagerly_with_one_warning(tokenizer, monkeypatch):
    model = build_modernbert_model(tokenizer)  # an encoder MLM: transformers does not mark it compilable
    assert not model._can_compile_fullgraph

    def never(fn, **kwargs):
        raise AssertionError("an unsupported model must not be compiled")

    monkeypatch.setattr(torch, "compile", never)
    input_ids, attention_mask = _batch(tokenizer)
    settings = dict(max_new_tokens=8, stop_at_eos=False)
    with pytest.warns(RuntimeWarning, match="does not support torch.compile") as caught:
        out = model.diffusion_generate(input_ids, attention_mask, compile="default", **settings)
        model.diffusion_generate(input_ids, attention_mask, compile="default", **settings)
    assert len(caught) == 1
    assert torch.equal(out, model.diffusion_generate(input_ids, attention_mask, **settings))


def test_compile_setting_is_validated_and_saved_with_the_defaults():
    assert DiffusionGenerationConfig(compile=False).compile is None
    with pytest.raises(ValueError, match="compile must be None or one of"):
        DiffusionGenerationConfig(compile="fast")
    config = DiffusionGenerationConfig(compile="reduce-overhead")
    assert DiffusionGenerationConfig.from_dict(config.to_dict()).compile == "reduce-overhead"


def test_lm_eval_model_reads_the_compile_setting(tokenizer):
    pytest.importorskip("lm_eval")
    from t3d_trl.integrations.lm_eval import DiffusionLM

    model = build_block_causal_model(tokenizer)
    lm = DiffusionLM(pretrained=model, tokenizer=tokenizer, device="cpu", compile="reduce-overhead")
    assert lm.generation_config.compile == "reduce-overhead"
