"""The model's forward pass of a denoising step, run eagerly or through ``torch.compile``.

With a static cache every step of a decoding mode has the same shapes, so the forward over a window of the
canvas (:func:`forward_window`) is compiled once per shape and reused by every later step and generation;
``mode="reduce-overhead"`` also captures CUDA graphs. The proposal and its scores
(:func:`~.remasking.propose_tokens`) stay eager: a handful of operations on one block, whose float64 softmax
must equal upstream's bit for bit (a compiled reduction may round the last bit differently and reorder tied
positions). Compiling is an optimisation only: where it is not possible (no compiler, an unsupported model, an
error while compiling) decoding falls back to eager with one warning.
"""

from __future__ import annotations

import logging
import time
import types
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..diffusion.config import DiffusionConfig
from ..diffusion.forward import accepts_4d_mask, cache_keyword, position_offset, unwrap_model
from .static_cache import StaticKVCache

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardSpec:
    """How to call a model for one diffusion forward pass, resolved once per generation (outside any compiled
    code: it inspects the model's signature)."""

    shift_logits: bool
    decoder: bool  # takes 4D masks, ``logits_to_keep`` and a cache
    cache_keyword: str
    position_offset: int | None  # added to the 0-based position ids; None: the forward takes none

    @classmethod
    def of(cls, model: torch.nn.Module, diffusion: DiffusionConfig) -> ForwardSpec:
        return cls(
            diffusion.shift_logits, accepts_4d_mask(model), cache_keyword(model), position_offset(model)
        )


def forward_window(
    model: torch.nn.Module,
    spec: ForwardSpec,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    keep: torch.Tensor,
    cache: StaticKVCache | None,
) -> torch.Tensor:
    """Logits ``[B, len(keep), V]`` of the tokens at window positions ``keep`` after one forward pass over a
    window of the canvas (writing its keys/values into ``cache`` at the cache's ``write_at`` when there is one).
    The same pass as :func:`~t3d_trl.diffusion.forward.diffusion_forward`, with the model's calling convention
    resolved beforehand."""
    # Shifted-logit models (Dream) predict token i at position i - 1.
    source = (keep - 1).clamp_min(0) if spec.shift_logits else keep
    kwargs: dict[str, Any] = {}
    if spec.position_offset is not None:
        kwargs["position_ids"] = position_ids + spec.position_offset
    if not spec.decoder:
        return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits[:, source]
    kwargs |= {"use_cache": cache is not None, "logits_to_keep": source}
    if cache is not None:
        kwargs[spec.cache_keyword] = cache
    return model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits


RECOMPILE_LIMIT = 64


def _own_copy(fn: Callable) -> Callable:
    """``fn`` with a code object of its own. torch.compile keeps its compiled graphs, recompile count and the
    shapes it has seen per code object, so each model's step gets its own instead of sharing (and growing
    shape-generic through) those of every other model."""
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


class EagerStep:
    """The step run as plain PyTorch (no compilation)."""

    compiled = False
    compile_seconds = 0.0

    def forward(self, *args: Any) -> torch.Tensor:
        return forward_window(*args)

    def cache(
        self, model: torch.nn.Module, batch: int, length: int, dtype: torch.dtype, device
    ) -> StaticKVCache:
        return StaticKVCache(model.config, batch, length, dtype, device)


class CompiledStep(EagerStep):
    """``torch.compile`` of the step of one model in one mode, shared by every generation with that model.

    The first call with a new shape compiles (its time is logged once and summed in ``compile_seconds``);
    later calls reuse the compiled code. The static cache of the latest shape is kept and reused, so the buffers
    a compiled step (or a captured CUDA graph) reads never move while generations repeat a shape; generations
    with one model are therefore not reentrant across threads.
    """

    compiled = True

    def __init__(self, model: torch.nn.Module, mode: str):
        self.model_name = type(unwrap_model(model)).__name__
        self.mode = mode
        self.cudagraphs = mode in ("reduce-overhead", "max-autotune")
        # Automatic dynamic shapes: the first shape of a function compiles a specialised graph, a second one a
        # graph generic in the dimensions that changed, so modes whose window length changes per block (prefix,
        # and the no-cache canvas of block-causal models) compile twice, not once per block.
        # The mode's Inductor options, plus rounding every intermediate to its dtype as eager does: fused bf16/fp16
        # kernels would otherwise keep float32 intermediates and flip near-tied tokens against eager decoding.
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode), "emulate_precision_casts": True}
        self._forward = torch.compile(_own_copy(forward_window), options=options, dynamic=None)
        # A model meets a few shapes per mode and batch size; dynamo's default limit (8) would silently send
        # the ninth to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._caches: dict[tuple, StaticKVCache] = {}
        self._seen: set[tuple] = set()
        self.compile_seconds = 0.0
        self.failed = False

    def forward(self, *args: Any) -> torch.Tensor:
        if self.failed:
            return forward_window(*args)
        key = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        first = key not in self._seen
        began = time.perf_counter()
        if self.cudagraphs:
            # Each step is a new iteration: the previous step's logits (read already) may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
        try:
            out = self._forward(*args)
        except Exception as error:  # noqa: BLE001 -- any compiler failure means: decode eagerly
            self.failed = True
            message = str(error).splitlines()[0] if str(error) else ""
            warnings.warn(
                f"torch.compile(mode={self.mode!r}) of the decoding step of {self.model_name} failed "
                f"({type(error).__name__}: {message}); decoding eagerly",
                RuntimeWarning,
                stacklevel=4,
            )
            return forward_window(*args)
        if first:
            self._seen.add(key)
            seconds = time.perf_counter() - began
            level = logging.INFO if self.compile_seconds == 0 else logging.DEBUG
            self.compile_seconds += seconds
            logger.log(
                level,
                "compiled the decoding step of %s (mode=%s) in %.1f s",
                self.model_name,
                self.mode,
                seconds,
            )
        return out

    def cache(
        self, model: torch.nn.Module, batch: int, length: int, dtype: torch.dtype, device
    ) -> StaticKVCache:
        key = (batch, length, dtype, str(device))
        if key not in self._caches:
            # Only the latest shape's cache is kept: evaluation and collection sort prompts by length, so nearly
            # every batch has a canvas of its own, and the batch size is planned for one cache. A shape met again
            # gets a new cache (CUDA graphs re-record for its address; the compiled code is reused).
            self._caches.clear()
            cache = StaticKVCache(model.config, batch, length, dtype, device)
            cache.mark_static()
            self._caches[key] = cache
        return self._caches[key]


_EAGER = EagerStep()
_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, CompiledStep]] = weakref.WeakKeyDictionary()


def step_for(model: torch.nn.Module, mode: str | None) -> EagerStep:
    """The step to decode ``model`` with: eager for ``mode=None``, else the model's compiled step for ``mode``
    (created on first use; eager, with one warning, where the model cannot be compiled)."""
    if not mode:
        return _EAGER
    steps = _COMPILED.setdefault(model, {})
    if mode not in steps:
        name = type(unwrap_model(model)).__name__
        if getattr(unwrap_model(model), "_can_compile_fullgraph", True):
            steps[mode] = CompiledStep(model, mode)
        else:
            warnings.warn(
                f"{name} does not support torch.compile (transformers marks it _can_compile_fullgraph=False); "
                "decoding eagerly",
                RuntimeWarning,
                stacklevel=3,
            )
            steps[mode] = _EAGER
    return steps[mode]
