"""Settings of few-step diffusion decoding."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from ..utils import dataclass_from_dict

CONFIG_KEY = "diffusion_generation"
REMASKING = ("low_confidence", "random", "entropy", "margin")
DYNAMIC_RULES = ("threshold", "threshold_topup")
SCHEDULES = ("llada", "sdar", "dream")
CACHE_IMPLEMENTATIONS = ("prefix", "dual")
CACHES = ("none", *CACHE_IMPLEMENTATIONS)  # the old ``cache`` spelling: "none" is no approximate cache
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
INTEGER_FIELDS = ("max_new_tokens", "block_length", "steps", "tokens_per_step", "top_k", "pad_token_id")
REAL_FIELDS = ("temperature", "top_p", "threshold", "cfg_scale")
BOOL_FIELDS = ("stop_at_eos", "use_cache", "return_dict_in_generate", "output_history")
#: Output controls set by the code that calls ``diffusion_generate``: no command-line flag, no recipe key.
OUTPUT_FIELDS = ("return_dict_in_generate", "output_history")


@dataclass
class DiffusionGenerationConfig:
    """How ``diffusion_generate`` decodes.

    The generated region is split into blocks of ``block_length`` tokens decoded left to right (semi-
    autoregressive); inside a block, masked positions are unmasked over a number of steps.

    Args:
        max_new_tokens: tokens generated per prompt; a multiple of ``block_length``.
        block_length: tokens per decoding block. ``None``: the model's block size for block-causal models,
            else ``max_new_tokens`` (one block). On a block-causal model it sets the attention blocks of the
            generated region too (as SDAR's ``generate.py`` does): another length than the model's block size
            attends within blocks of that length.
        steps: total denoising steps over all blocks (LLaDA's ``steps``), split evenly over the blocks.
        tokens_per_step: tokens committed per step (TokPS); ``block_length / tokens_per_step`` steps per block.
            Give ``steps`` or ``tokens_per_step``, not both; with neither, one token per step.
        temperature: 0 for greedy; otherwise Gumbel-max sampling with float64 noise.
        top_k: keep only the ``top_k`` most likely tokens before sampling (``None`` = all).
        top_p: nucleus filtering before sampling (``None`` = off).
        remasking: which masked positions a step commits first: ``low_confidence`` (highest probability of the
            chosen token), ``margin`` (largest gap between the top two probabilities), ``entropy`` (lowest
            predictive entropy) or ``random``.
        threshold: ``None`` for static decoding. A float in (0, 1] switches to dynamic decoding: see
            ``dynamic_rule``. Needs a probability-like score (``low_confidence`` or ``margin``).
        dynamic_rule: ``threshold`` (Fast-dLLM, default): commit every masked position of the current block
            whose score is at or above ``threshold``, and at least the single best one; repeat until the
            block is full. ``threshold_topup`` (the T3D reference engine): commit everything above the
            threshold and top up to the static per-step quota.
        schedule: how a static block's masks are split over its steps. ``llada`` (default): each step commits
            ``m // s`` of the block's ``m`` masks, the first ``m % s`` steps one more. ``sdar`` (SDAR's
            ``generate.py``): each step commits ``block_length // s`` (the first ``block_length % s`` steps one
            more) until the block is full, so a first block shared with the prompt's tail finishes early.
            ``dream`` (Dream's ``diffusion_generate``, the default of Dream checkpoints): with timesteps
            ``linspace(1, 1e-3, s + 1)``, step ``i`` commits ``int(n * (1 - t[i+1] / t[i]))`` of the ``n`` masks
            left and the last step all the rest.
        use_cache: decode with a key/value cache. Block-causal models use their exact block cache; bidirectional
            models use the approximate cache named by ``cache_implementation`` (none: every step runs the whole
            canvas, exact). ``False``: no cache at all.
        cache_implementation: approximate key/value cache of bidirectional models (Fast-dLLM), used when
            ``use_cache`` is on. ``prefix``: the first step of a block runs the whole canvas and caches the
            keys/values before the block; later steps run the block and everything after it. ``dual``: the first
            step caches the keys/values before and after the block; later steps run the block alone. Unset: no
            approximate cache (exact). Block-causal models refuse it: their block cache is exact.
        cache: the old spelling of ``cache_implementation`` (``none``, ``prefix`` or ``dual``; ``none`` = unset),
            still accepted in code, recipes, saved configs and as ``--cache``.
        cfg_scale: classifier-free guidance (LLaDA's ``cfg_scale``). ``0`` (default): off, no extra cost. ``> 0``:
            every step also runs the canvas with the prompt replaced by mask tokens (batched with the
            conditional rows, so a step costs two rows per row) and decodes from ``un + (cfg_scale + 1) * (cond -
            un)``. Works with every attention kind and cache (the unconditional rows share the cache scheme).
        eos_token_id: id(s) that end a completion. ``None``: read from the model's config.
        pad_token_id: id written after the end of a finished completion. ``None``: the first EOS id.
        stop_at_eos: once a row has an EOS with every position before it decoded, fill the rest of its
            canvas with ``pad_token_id`` and stop spending steps on it; stop when every row is finished. With
            ``False`` the whole canvas is decoded and returned as is (the LLaDA reference behaviour).
        compile: ``None`` (default) decodes eagerly. A ``torch.compile`` mode (``default``, ``reduce-overhead``,
            which also captures CUDA graphs on GPUs, ``max-autotune``, ``max-autotune-no-cudagraphs``) compiles
            the model's forward pass of a step once per shape and reuses it for every later step and generation
            (the first call is slow; the compile time is logged once). Tokens are identical to eager decoding's.
            Where compiling fails or the model does not support it, decoding falls back to eager with one
            warning.
        return_dict_in_generate: return a :class:`DiffusionGenerationOutput` instead of a tensor.
        output_history: also return the canvas after every step (needs ``return_dict_in_generate``).
    """

    max_new_tokens: int = 128
    block_length: int | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    remasking: Literal["low_confidence", "random", "entropy", "margin"] = "low_confidence"
    threshold: float | None = None
    dynamic_rule: Literal["threshold", "threshold_topup"] = "threshold"
    schedule: Literal["llada", "sdar", "dream"] = "llada"
    cfg_scale: float = 0.0
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    stop_at_eos: bool = True
    use_cache: bool = True
    cache_implementation: Literal["prefix", "dual"] | None = None
    cache: Literal["none", "prefix", "dual"] | None = field(default=None, repr=False)
    compile: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None
    return_dict_in_generate: bool = False
    output_history: bool = False

    def __post_init__(self) -> None:
        if self.compile is False:  # ``compile=False`` reads naturally as "off"
            self.compile = None
        if self.cache is not None:  # the old spelling folds into cache_implementation
            if self.cache not in CACHES:
                raise ValueError(f"cache must be one of {CACHES}, got {self.cache!r}")
            old = None if self.cache == "none" else self.cache
            if self.cache_implementation is not None and self.cache_implementation != old:
                raise ValueError(
                    f"cache={self.cache!r} and cache_implementation={self.cache_implementation!r} disagree: "
                    "give cache_implementation alone (cache is its old spelling)"
                )
            self.cache_implementation, self.cache = old, None
        self._normalise_numbers()
        self.validate()

    def _normalise_numbers(self) -> None:
        # A string from a hand-written dict would otherwise fail later in a comparison; numpy numbers become
        # Python ones so that the config saves as JSON.
        for name in INTEGER_FIELDS + REAL_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            kind = numbers.Integral if name in INTEGER_FIELDS else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kind):
                noun = "an integer" if kind is numbers.Integral else "a number"
                raise TypeError(f"{name} must be {noun}, got {value!r} ({type(value).__name__})")
            if kind is numbers.Real and not math.isfinite(value):  # NaN passes every range check (as greedy)
                raise ValueError(f"{name} must be a finite number, got {value}")
            setattr(self, name, int(value) if kind is numbers.Integral else float(value))
        for name in BOOL_FIELDS:  # the string "false" would read as on
            value = getattr(self, name)
            if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy's bool too
                raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
            setattr(self, name, bool(value))
        # One id or a list of them; a list stays a list of Python ints (saves as JSON, compares after a round trip).
        eos = self.eos_token_id
        ids = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
        if any(
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 for value in ids
        ):
            raise TypeError(f"eos_token_id must be a token id or a list of them, got {eos!r}")
        if isinstance(eos, (list, tuple)):
            self.eos_token_id = [int(value) for value in ids]
        elif eos is not None:
            self.eos_token_id = int(eos)

    def validate(self) -> None:
        """Check values that do not depend on the model or the prompt."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.block_length is not None and self.block_length < 1:
            raise ValueError(f"block_length must be positive, got {self.block_length}")
        if self.steps is not None and self.tokens_per_step is not None:
            raise ValueError(
                f"give steps ({self.steps}) or tokens_per_step ({self.tokens_per_step}), not both"
            )
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be positive, got {self.steps}")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be positive, got {self.tokens_per_step}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.pad_token_id is not None and self.pad_token_id < 0:
            raise ValueError(f"pad_token_id must be a token id (>= 0), got {self.pad_token_id}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be positive, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.dynamic_rule not in DYNAMIC_RULES:
            raise ValueError(f"dynamic_rule must be one of {DYNAMIC_RULES}, got {self.dynamic_rule!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.cache_implementation is not None and self.cache_implementation not in CACHE_IMPLEMENTATIONS:
            raise ValueError(
                f"cache_implementation must be one of {CACHE_IMPLEMENTATIONS} (or unset), "
                f"got {self.cache_implementation!r}"
            )
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be None or one of {COMPILE_MODES}, got {self.compile!r}")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0 (0 turns guidance off), got {self.cfg_scale}")
        if self.threshold is not None:
            if not 0 < self.threshold <= 1:
                raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
            if self.remasking not in ("low_confidence", "margin"):
                raise ValueError(
                    f"dynamic decoding compares a probability with the threshold; remasking={self.remasking!r} "
                    "has no probability score (use low_confidence or margin)"
                )
        if self.output_history and not self.return_dict_in_generate:
            raise ValueError("output_history=True needs return_dict_in_generate=True")

    @property
    def approximate_cache(self) -> str | None:
        """The approximate cache decoding uses: ``cache_implementation`` when ``use_cache`` is on, else ``None``."""
        return self.cache_implementation if self.use_cache else None

    def check_model(self, is_block_causal: bool, is_decoder: bool = True) -> None:
        """Check the settings that depend on the model: its attention kind and whether it is a decoder.

        Only needs what a model's config says (see :func:`t3d_trl.models.auto.read_model_kind`), so a grid can
        check every model before loading any.
        """
        if self.cache_implementation is None:
            return
        if is_block_causal:
            raise ValueError(
                f"cache_implementation={self.cache_implementation!r} is the approximate cache of bidirectional "
                "models; block-causal models decode with their exact block cache (use_cache=True, "
                "cache_implementation unset)"
            )
        if not is_decoder:
            raise ValueError(
                f"cache_implementation={self.cache_implementation!r} needs a decoder with a key/value cache; "
                "an encoder MLM has none (leave cache_implementation unset)"
            )

    def resolve(self, model_block_size: int | None) -> tuple[int, int]:
        """Return ``(block_length, steps_per_block)`` for a model, checking the budget's arithmetic."""
        block_length = self.block_length or model_block_size or self.max_new_tokens
        if self.max_new_tokens % block_length:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} is not a multiple of block_length={block_length}"
            )
        num_blocks = self.max_new_tokens // block_length
        if self.tokens_per_step is not None:
            if self.tokens_per_step > block_length:
                raise ValueError(
                    f"tokens_per_step={self.tokens_per_step} is larger than block_length={block_length}"
                )
            if block_length % self.tokens_per_step:
                raise ValueError(
                    f"block_length={block_length} is not a multiple of tokens_per_step={self.tokens_per_step}"
                )
            return block_length, block_length // self.tokens_per_step
        steps = self.steps if self.steps is not None else self.max_new_tokens
        if steps % num_blocks:
            raise ValueError(
                f"steps={steps} does not split evenly over {num_blocks} blocks of {block_length}"
            )
        steps_per_block = steps // num_blocks
        if steps_per_block > block_length:
            raise ValueError(
                f"steps={steps} gives {steps_per_block} steps per block, more than block_length={block_length}"
            )
        return block_length, steps_per_block

    def update(self, **overrides: Any) -> DiffusionGenerationConfig:
        """A copy with ``overrides`` applied; unknown names raise."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown generation settings: {sorted(unknown)}")
        # Setting one budget unit clears the other, so overrides never conflict with saved defaults; an approximate
        # cache asked for turns a saved use_cache=False on (it would be ignored without a word).
        if overrides.get("steps") is not None:
            overrides.setdefault("tokens_per_step", None)
        if overrides.get("tokens_per_step") is not None:
            overrides.setdefault("steps", None)
        if "cache" in overrides:  # the old spelling overrides the saved cache_implementation
            cache = overrides.pop("cache")
            if cache is not None:
                if cache not in CACHES:
                    raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
                old = None if cache == "none" else cache
                if overrides.get("cache_implementation", old) != old:
                    raise ValueError(
                        f"cache={cache!r} and cache_implementation={overrides['cache_implementation']!r} "
                        "disagree: give cache_implementation alone (cache is its old spelling)"
                    )
                overrides["cache_implementation"] = old
        if overrides.get("cache_implementation") is not None:  # asking for a cache asks for caching
            overrides.setdefault("use_cache", True)
        return replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["cache"]  # always folded into cache_implementation
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffusionGenerationConfig:
        return dataclass_from_dict(cls, data, "diffusion generation config")

    @classmethod
    def parse(
        cls, value: DiffusionGenerationConfig | Mapping[str, Any] | None
    ) -> DiffusionGenerationConfig | None:
        """What every ``generation_config=`` argument accepts: a config, a dict of its fields (a whole config:
        fields it leaves out take the class defaults, not a model's saved ones) or ``None``."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(dict(value))
        raise TypeError(
            f"generation_config must be a DiffusionGenerationConfig or a dict of its fields, got "
            f"{type(value).__name__}"
            + (" (transformers' autoregressive settings)" if hasattr(value, "do_sample") else "")
        )

    @classmethod
    def from_model_config(cls, config: Any) -> DiffusionGenerationConfig:
        """The generation defaults stored with a model (or the class defaults)."""
        return cls.parse(getattr(config, CONFIG_KEY, None)) or cls()

    def save_to_model_config(self, config: Any) -> None:
        """Store as the model's defaults (travels with ``save_pretrained`` and ``push_to_hub``)."""
        data = self.to_dict()
        data["return_dict_in_generate"] = False
        data["output_history"] = False
        setattr(config, CONFIG_KEY, data)
