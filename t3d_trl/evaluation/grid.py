"""The decoding budgets of an evaluation grid, and the checks :func:`~t3d_trl.evaluation.runner.run_grid` makes
before its first generation."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..generation.configuration import DiffusionGenerationConfig
from ..models.forward import accepts_4d_mask
from .benchmarks import Benchmark, get_benchmark

logger = logging.getLogger(__name__)

__all__ = [
    "GRID_FIELDS",
    "DecodingSetting",
    "check_run_settings",
    "grid_benchmarks",
    "grid_settings",
    "load_examples",
]

#: The decoding fields the grid sets, and the :func:`run_grid` argument that gives each (refused in
#: ``generation_kwargs``: the grid's value would silently replace it).
GRID_FIELDS = {
    "block_length": "block_lengths",
    "tokens_per_step": "tokens_per_step",
    "threshold": "thresholds",
    "steps": "steps",
}


@dataclass(frozen=True)
class DecodingSetting:
    """One decoding budget of the grid.

    Static: ``block_length`` and ``tokens_per_step`` (TokPS; ``block_length / tokens_per_step`` steps per
    block). Dynamic: ``block_length`` and a confidence ``threshold`` (one token per step at least, the
    paper's "block 4, 4 steps per block, threshold 0.9"); its ``tokens_per_step`` is not used: the
    ``threshold_topup`` rule tops up to the model's own static quota (:meth:`config`).
    """

    block_length: int
    tokens_per_step: int = 1
    threshold: float | None = None
    steps: int | None = None  # static budget as total denoising steps instead of TokPS

    @property
    def label(self) -> str:
        if self.steps is not None:
            return f"block{self.block_length}-steps{self.steps}"
        if self.threshold is not None:
            return f"block{self.block_length}-threshold{self.threshold:g}"
        return f"block{self.block_length}-tokps{self.tokens_per_step}"

    def overrides(self) -> dict[str, Any]:
        """``DiffusionGenerationConfig`` fields of this setting (a dynamic one leaves the static budget alone)."""
        if self.steps is not None:
            return {"block_length": self.block_length, "steps": self.steps, "threshold": None}
        if self.threshold is not None:
            return {"block_length": self.block_length, "threshold": self.threshold}
        return {"block_length": self.block_length, "tokens_per_step": self.tokens_per_step, "threshold": None}

    def config(
        self, defaults: DiffusionGenerationConfig, generation_kwargs: Mapping[str, Any]
    ) -> DiffusionGenerationConfig:
        """The decoding settings of this setting's run of a model: its ``defaults``, then ``generation_kwargs``,
        then this budget. The runner and the checks before the first run build them here, alike."""
        config = defaults.update(**generation_kwargs)
        overrides = self.overrides()
        if self.threshold is not None and config.dynamic_rule == "threshold":
            # The plain rule reads no static quota: one token per step, so that a saved quota (a student's
            # tokens_per_step=4, or steps) cannot fail a smaller block. threshold_topup keeps it: its top-up.
            overrides["tokens_per_step"] = 1
        return config.update(**overrides)


def grid_settings(
    block_lengths: Iterable[int],
    tokens_per_step: Iterable[int] = (),
    thresholds: Iterable[float] = (),
    steps: Iterable[int] = (),
) -> list[DecodingSetting]:
    """Every (block length, TokPS), (block length, steps) and (block length, threshold) pair.

    A TokPS that does not divide the block length has no static schedule; such pairs are skipped with a
    warning (the grid is a cartesian product, so mixed block lengths often produce a few).
    """
    settings = []
    tokens_per_step, thresholds, steps = list(tokens_per_step), list(thresholds), list(steps)
    for block in block_lengths:
        if block < 1:
            raise ValueError(f"block lengths must be positive, got {block}")
        for tokps in tokens_per_step:
            if tokps < 1:
                raise ValueError(f"tokens_per_step values must be positive, got {tokps}")
            if block % tokps:
                logger.warning(
                    "skipping block_length=%d with tokens_per_step=%d: %d does not divide it",
                    block,
                    tokps,
                    tokps,
                )
                continue
            settings.append(DecodingSetting(block, tokps))
        for threshold in thresholds:
            if not 0 < threshold <= 1:
                raise ValueError(f"thresholds must be in (0, 1], got {threshold}")
            settings.append(DecodingSetting(block, 1, float(threshold)))
        for total in steps:
            if total < 1:
                raise ValueError(f"steps values must be positive, got {total}")
            settings.append(DecodingSetting(block, 1, None, total))
    if not settings:
        raise ValueError("the grid is empty: give block lengths with tokens_per_step values or thresholds")
    return settings


def check_run_settings(
    models: Mapping[str, Any],
    settings: Sequence[DecodingSetting],
    generation_kwargs: Mapping[str, Any],
    limit: int | None,
    batch_size: int | None,
    seeds: Sequence[int],
    num_samples: int,
    tokenizer: Any,
) -> None:
    """Everything :func:`run_grid` can check before the first generation (one error, naming the value)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of problems, got {limit}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not list(seeds):
        raise ValueError("seeds must hold at least one seed")
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    for key, argument in GRID_FIELDS.items():
        if key in generation_kwargs:
            raise ValueError(
                f"generation_kwargs sets {key}={generation_kwargs[key]!r}, an axis of the grid that every run "
                f"sets: give it as run_grid's {argument}=[...] (t3d-trl eval: --{argument})"
            )
    for setting in settings:  # what depends on no model, once (each model's defaults are checked below)
        try:
            config = setting.config(DiffusionGenerationConfig(), generation_kwargs)
            if "max_new_tokens" in generation_kwargs:  # else each model's saved length decides
                config.resolve(None)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"decoding setting {setting.label} with {dict(generation_kwargs)}: {err}"
            ) from err
    for name, spec in models.items():
        if isinstance(spec, str):
            _check_model_source(name, spec, settings, generation_kwargs)
            continue
        if not isinstance(spec, tuple) and tokenizer is None:
            raise ValueError(f"model {name!r} was given as an object without a tokenizer: pass tokenizer=...")
        model = spec[0] if isinstance(spec, tuple) else spec
        defaults = model.diffusion_generation_config
        try:  # a model without a diffusion description fails here, named (a stand-in without one is bidirectional)
            diffusion = getattr(model, "diffusion_config", None)
            block_size = diffusion.block_size if diffusion is not None and diffusion.is_block_causal else None
            config = defaults.update(**generation_kwargs)
            if config.cache_implementation is not None:
                config.check_model(model.diffusion_config.is_block_causal, accepts_4d_mask(model))
        except ValueError as err:
            raise ValueError(f"model {name!r}: {err}") from err
        _check_model_settings(name, defaults, block_size, settings, generation_kwargs)


def _check_model_source(
    name: str, spec: str, settings: Sequence[DecodingSetting], generation_kwargs: Mapping[str, Any]
) -> None:
    """A model given as a path or Hub id: its files, and the settings over its saved defaults (config files only)."""
    from ..models.auto import adapter_base_model, check_model_source, read_model_kind, saved_decoding_defaults

    try:
        check_model_source(spec)
        base = adapter_base_model(spec)
        if base is not None:
            check_model_source(base)
    except (FileNotFoundError, ValueError) as err:  # missing, or damaged weights: name the model
        kind = FileNotFoundError if isinstance(err, FileNotFoundError) else ValueError
        raise kind(f"model {name!r}: {err}") from err
    try:
        saved = saved_decoding_defaults(spec)
        defaults = saved[0] if saved is not None else DiffusionGenerationConfig()
        # Settings that depend on the model (a block-causal model refuses an approximate cache).
        defaults.update(**generation_kwargs).check_model(*read_model_kind(spec))
    except (TypeError, ValueError) as err:  # a damaged saved config too: it would fail to load
        raise ValueError(f"model {name!r} ({spec}): {err}") from err
    if saved is not None:  # None: a Hub id not in the cache, checked when it loads
        _check_model_settings(name, *saved, settings, generation_kwargs)


def _check_model_settings(
    name: str,
    defaults: DiffusionGenerationConfig,
    block_size: int | None,
    settings: Sequence[DecodingSetting],
    generation_kwargs: Mapping[str, Any],
) -> None:
    """Every setting over a model's own decoding defaults, as its runs will decode (a later model's saved length,
    remasking or quota would otherwise stop the grid midway)."""
    for setting in settings:
        try:
            setting.config(defaults, generation_kwargs).resolve(block_size)
        except (TypeError, ValueError) as err:
            given = f" with {dict(generation_kwargs)}" if generation_kwargs else ""
            raise ValueError(
                f"model {name!r}: decoding setting {setting.label} over its saved decoding defaults{given}: {err}"
            ) from err


def grid_benchmarks(
    benchmarks: Sequence[str | Benchmark],
    data_files: Mapping[str, str | Path] | None,
    code_extraction: str | None,
) -> tuple[list[Benchmark], dict[str, str | Path]]:
    """The grid's benchmarks, and their data files by display name (an unused one is logged, not an error)."""
    benchmarks = [get_benchmark(b).with_code_extraction(code_extraction) for b in benchmarks]
    if not benchmarks:
        raise ValueError("benchmarks must name at least one benchmark")
    data_files = {get_benchmark(name).name: path for name, path in (data_files or {}).items()}
    unused = sorted(set(data_files) - {b.name for b in benchmarks})
    if unused:  # a recipe may list every local copy and a run evaluate a few: not an error
        logger.warning("data_files of benchmark(s) %s are not used: they are not evaluated", unused)
    return benchmarks, {name: path for name, path in data_files.items() if name not in unused}


def load_examples(
    benchmarks: Sequence[Benchmark], data_files: Mapping[str, str | Path], limit: int | None
) -> dict[str, list[dict[str, Any]]]:
    """Every benchmark's examples, each of whose prompts is built once (a template may name a missing column)."""
    examples = {b.name: b.load(data_files.get(b.name), limit) for b in benchmarks}
    for benchmark in benchmarks:
        if not examples[benchmark.name]:  # refused here, before any model is loaded, not mid-grid
            raise ValueError(f"benchmark {benchmark.name!r} has no examples to evaluate")
        for example in examples[benchmark.name]:
            benchmark.user_message(example)
    return examples
