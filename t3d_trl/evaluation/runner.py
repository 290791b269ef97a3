"""Run a diffusion LM on a benchmark, and several models over a grid of decoding budgets.

* :func:`generate_completions`: prompts in, completions out (batched, left-padded, sorted by length), with the
  numbers the metrics need. ``t3d-trl generate`` is this function on one prompt.
* :func:`evaluate_model`: one model, one benchmark, one decoding setting, one or more seeds (and samples per
  prompt for pass@k) -> an :class:`EvalResult` with metrics and per-sample records.
* :func:`run_grid`: several models x benchmarks x decoding settings (block length x tokens per step, and
  dynamic thresholds), written to ``results.json`` plus a Table-1 style Markdown table and plots
  (:mod:`t3d_trl.evaluation.report`). ``t3d-trl eval`` is this function.

Metric definitions (per run; averaged over seeds when there are several):

* ``accuracy``: fraction of samples judged correct by the benchmark's checker.
* ``mean_output_length``: generated tokens per sample, up to and including the first EOS (all
  ``max_new_tokens`` when there is none).
* ``tokens_per_second``: all samples' output tokens divided by the wall-clock time spent inside
  ``diffusion_generate`` (tokenisation, detokenisation and answer checking excluded; the GPU is synchronised).
* ``latency_per_sample``: that time divided by the number of samples (batched decoding shares it evenly).
* ``mean_nfe``: denoising forward passes spent on a sample (the paper's "average decoding steps").
* ``tokens_per_step``: output tokens per forward pass (``sum length / sum nfe``).
* ``pass@k`` (with ``num_samples > 1``): the unbiased estimator over the samples of each problem.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import encode_prompts
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.sampler import eos_token_ids, left_pad
from ..models.forward import accepts_4d_mask
from .benchmarks import Benchmark, get_benchmark
from .metrics import mean_std, pass_at_k_from_records, summarize_records

logger = logging.getLogger(__name__)

__all__ = [
    "DecodingSetting",
    "EvalResult",
    "Generations",
    "GridResult",
    "SampleRecord",
    "evaluate_model",
    "generate_completions",
    "grid_settings",
    "load_model",
    "run_grid",
]

_PASS_K = (1, 5, 10, 20, 50, 100)


# ------------------------------------------------------------------------------------------------ generation
@dataclass
class Generations:
    """Completions of a list of prompts, in the prompts' order.

    Attributes:
        prompts: the exact prompt texts the model saw (chat template applied).
        completions: decoded completions, cut before the first EOS.
        num_tokens: generated tokens per completion, up to and including the first EOS.
        nfe: denoising forward passes spent on each completion.
        finished: the completion ended with an EOS (False: it used the whole ``max_new_tokens``).
        latency: each completion's share of its batch's wall-clock time, in seconds.
    """

    prompts: list[str]
    completions: list[str]
    num_tokens: list[int]
    nfe: list[int]
    finished: list[bool]
    latency: list[float]

    @property
    def seconds(self) -> float:
        """Wall-clock seconds spent in ``diffusion_generate``."""
        return math.fsum(self.latency)

    @property
    def tokens_per_second(self) -> float:
        return sum(self.num_tokens) / self.seconds if self.seconds > 0 else float("nan")


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate_completions(
    model: torch.nn.Module,
    tokenizer: Any,
    messages: Sequence[str],
    generation_config: DiffusionGenerationConfig | None = None,
    *,
    use_chat_template: bool = True,
    batch_size: int = 8,
    generator: torch.Generator | None = None,
    progress: bool = True,
    desc: str | None = None,
    streamer: Any = None,
) -> Generations:
    """Decode one completion per user message with ``model.diffusion_generate``.

    Messages are wrapped in the tokenizer's chat template (when it has one and ``use_chat_template``),
    sorted by prompt length (longest first, so an out-of-memory batch shows up at once) and decoded in
    left-padded batches of ``batch_size``; results come back in the input order.

    Args:
        model: a model with ``diffusion_generate`` (see :func:`t3d_trl.add_diffusion_generation`).
        tokenizer: its tokenizer.
        messages: user messages.
        generation_config: decoding settings; defaults to the ones saved with the model.
        use_chat_template: wrap messages in the chat template.
        batch_size: prompts per ``diffusion_generate`` call.
        generator: random generator for sampling (``temperature > 0``) and random remasking.
        progress: show a progress bar.
        desc: its label.
        streamer: a :class:`~t3d_trl.generation.streamers.DiffusionStreamer` handed to every batch's
            ``diffusion_generate`` (it sees the batches in the sorted order).
    """
    if isinstance(messages, str):
        raise TypeError("messages must be a sequence of str, not a single str")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    config = (generation_config or model.diffusion_generation_config).update(
        return_dict_in_generate=True, output_history=False
    )
    device = _device(model)
    eos = torch.tensor(eos_token_ids(model, config), dtype=torch.long, device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0]) if len(eos) else 0
    prompts, ids = encode_prompts(tokenizer, messages, use_chat_template)
    n = len(prompts)
    completions, num_tokens, nfe, finished, latency = [""] * n, [0] * n, [0] * n, [False] * n, [0.0] * n
    order = sorted(range(n), key=lambda i: -len(ids[i]))
    with tqdm(total=n, desc=desc, unit="sample", disable=not progress, leave=False) as bar:
        for start in range(0, n, batch_size):
            batch = order[start : start + batch_size]
            input_ids, attention_mask = (t.to(device) for t in left_pad([ids[i] for i in batch], pad_id))
            _synchronize(device)
            began = time.perf_counter()
            out = model.diffusion_generate(
                input_ids, attention_mask, generation_config=config, generator=generator, streamer=streamer
            )
            _synchronize(device)
            seconds = time.perf_counter() - began
            generated = out.sequences[:, input_ids.shape[1] :]
            is_eos = torch.isin(generated, eos) if len(eos) else torch.zeros_like(generated, dtype=torch.bool)
            has_eos = is_eos.any(-1)
            first = torch.where(has_eos, is_eos.long().argmax(-1), generated.shape[1])
            for row, i in enumerate(batch):
                cut = int(first[row])
                completions[i] = tokenizer.decode(generated[row, :cut].tolist(), skip_special_tokens=True)
                finished[i] = bool(has_eos[row])
                num_tokens[i] = cut + int(finished[i])
                nfe[i] = int(out.nfe[row])
                latency[i] = seconds / len(batch)
            bar.update(len(batch))
    return Generations(prompts, completions, num_tokens, nfe, finished, latency)


# ------------------------------------------------------------------------------------------------ one run
@dataclass
class SampleRecord:
    """One generated sample and its verdict (kept for inspection; written as JSON lines by the grid)."""

    id: str
    seed: int
    sample: int
    prompt: str
    completion: str
    correct: bool
    num_tokens: int
    nfe: int
    finished: bool
    latency: float
    error: str | None = None  # the checker raised on this sample (then ``correct`` is False)


@dataclass
class EvalResult:
    """Metrics of one model on one benchmark with one decoding setting.

    Attributes:
        benchmark: the benchmark's display name.
        generation_config: the decoding settings used (as a dict).
        metrics: the module docstring's metrics, averaged over seeds; ``<name>_std`` is the sample standard
            deviation over seeds (0 with one seed).
        per_seed: the metrics of each seed.
        records: every sample.
    """

    benchmark: str
    generation_config: dict[str, Any]
    metrics: dict[str, float]
    per_seed: list[dict[str, float]]
    records: list[SampleRecord] = field(default_factory=list)

    def to_dict(self, records: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not records:
            data.pop("records")
        return data


def run_metrics(records: Sequence[SampleRecord], pass_k: Sequence[int] = ()) -> dict[str, float]:
    """The metrics of one run (one seed) from its records; see the module docstring."""
    metrics = summarize_records(records)
    total_nfe = sum(r.nfe for r in records)
    if total_nfe:
        metrics["tokens_per_step"] = sum(r.num_tokens for r in records) / total_nfe
    if pass_k:
        metrics.update(pass_at_k_from_records(records, pass_k, task_key="id", passed_key="correct"))
    return metrics


def aggregate_seeds(per_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean over seeds of every metric, plus ``<name>_std`` (sample standard deviation) for each."""
    metrics: dict[str, float] = {}
    for key in per_seed[0]:
        mean, std = mean_std(run[key] for run in per_seed)
        metrics[key] = mean
        if key != "num_samples":
            metrics[f"{key}_std"] = std
    return metrics


def _pass_k(num_samples: int, pass_k: Sequence[int] | None) -> list[int]:
    if pass_k is None:
        return sorted({k for k in _PASS_K if k <= num_samples} | {num_samples}) if num_samples > 1 else []
    bad = [k for k in pass_k if not 1 <= k <= num_samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= num_samples={num_samples}, got k={bad}")
    return sorted(set(pass_k))


def check_safely(
    benchmark: Benchmark, completions: Sequence[str], examples: Sequence[Mapping[str, Any]]
) -> tuple[list[bool], list[str | None]]:
    """``benchmark.check``, where a checker that raises fails only the samples it raises on.

    The batched call comes first; if it raises, each sample is checked alone, and one that still raises is
    judged incorrect with the error kept (``ExceptionType: message``), so that one bad item does not throw
    away the run. Returns the verdicts and the errors (``None`` where there was none).
    """
    try:
        return benchmark.check(completions, examples), [None] * len(completions)
    except Exception as err:  # noqa: BLE001 - a user's checker may raise anything; it is reported per sample
        logger.warning(
            "checker of %s raised (%r); checking its %d samples one by one",
            benchmark.name,
            err,
            len(completions),
        )
    correct: list[bool] = []
    errors: list[str | None] = []
    for completion, example in zip(completions, examples):
        try:
            correct.append(benchmark.check([completion], [example])[0])
            errors.append(None)
        except Exception as err:  # noqa: BLE001
            correct.append(False)
            errors.append(f"{type(err).__name__}: {err}")
    failed = sum(e is not None for e in errors)
    if failed:
        logger.warning(
            "checker of %s raised on %d samples: judged incorrect, errors kept in the samples",
            benchmark.name,
            failed,
        )
    return correct, errors


def evaluate_model(
    model: torch.nn.Module,
    tokenizer: Any,
    benchmark: str | Benchmark,
    generation_config: DiffusionGenerationConfig | None = None,
    *,
    examples: Sequence[Mapping[str, Any]] | None = None,
    data_files: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    seeds: Sequence[int] = (0,),
    num_samples: int = 1,
    pass_k: Sequence[int] | None = None,
    use_chat_template: bool = True,
    warmup: bool = True,
    progress: bool = True,
    code_extraction: str | None = None,
) -> EvalResult:
    """Evaluate one model on one benchmark with one decoding setting.

    Args:
        model: a model with ``diffusion_generate``.
        tokenizer: its tokenizer.
        benchmark: a registered benchmark name (``"math500"``, ``"gsm8k"``, ``"mbpp"``, ``"humaneval"``) or a
            :class:`~t3d_trl.evaluation.benchmarks.Benchmark`.
        generation_config: decoding settings; defaults to the ones saved with the model.
        examples: already loaded examples (``benchmark.load(...)``); otherwise they are loaded here, from
            ``data_files`` (a local file with the benchmark's schema) or the Hub.
        limit: evaluate the first ``limit`` problems only.
        batch_size: prompts per ``diffusion_generate`` call.
        seeds: one run per seed (the seed of the sampling generator); metrics are averaged over runs.
        num_samples: completions per problem and seed; more than one gives pass@k.
        pass_k: the ``k`` of pass@k (default: 1, 5, 10, 20, 50, 100 up to ``num_samples``, and ``num_samples``).
        use_chat_template: wrap prompts in the tokenizer's chat template.
        warmup: first decode one prompt untimed, so that lazy initialisation (CUDA kernels, allocator) does
            not count as decoding time.
        progress: show progress bars.
        code_extraction: code benchmarks: ``"entry_point"`` or ``"last_block"`` (the paper's rule) instead of
            the benchmark's own rule (:func:`t3d_trl.evaluation.sandbox.extract_code`); others ignore it.
    """
    benchmark = get_benchmark(benchmark).with_code_extraction(code_extraction)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    ks = _pass_k(num_samples, pass_k)
    if examples is None:
        examples = benchmark.load(data_files, limit)
    elif limit is not None:
        examples = list(examples)[:limit]
    examples = list(examples)
    if not examples:
        raise ValueError(f"benchmark {benchmark.name!r} has no examples to evaluate")
    config = (generation_config or model.diffusion_generation_config).update(
        return_dict_in_generate=True, output_history=False
    )
    if num_samples > 1 and config.temperature == 0 and config.remasking != "random":
        logger.warning(
            "num_samples=%d with greedy decoding (temperature=0): all samples are identical", num_samples
        )

    messages = [benchmark.user_message(example) for example in examples for _ in range(num_samples)]
    items = [(example, s) for example in examples for s in range(num_samples)]
    device = _device(model)
    if warmup:
        generate_completions(
            model, tokenizer, messages[:1], config, use_chat_template=use_chat_template, progress=False
        )

    records: list[SampleRecord] = []
    per_seed: list[dict[str, float]] = []
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(seed)
        out = generate_completions(
            model,
            tokenizer,
            messages,
            config,
            use_chat_template=use_chat_template,
            batch_size=batch_size,
            generator=generator,
            progress=progress,
            desc=f"{benchmark.name} seed {seed}",
        )
        correct, errors = check_safely(benchmark, out.completions, [example for example, _ in items])
        run = [
            SampleRecord(
                id=str(example["id"]),
                seed=seed,
                sample=s,
                prompt=out.prompts[i],
                completion=out.completions[i],
                correct=correct[i],
                num_tokens=out.num_tokens[i],
                nfe=out.nfe[i],
                finished=out.finished[i],
                latency=out.latency[i],
                error=errors[i],
            )
            for i, (example, s) in enumerate(items)
        ]
        records.extend(run)
        per_seed.append(run_metrics(run, ks))
    return EvalResult(
        benchmark=benchmark.name,
        generation_config=replace(config, return_dict_in_generate=False).to_dict(),
        metrics=aggregate_seeds(per_seed),
        per_seed=per_seed,
        records=records,
    )


# ------------------------------------------------------------------------------------------------ grid
@dataclass(frozen=True)
class DecodingSetting:
    """One decoding budget of the grid.

    Static: ``block_length`` and ``tokens_per_step`` (TokPS; ``block_length / tokens_per_step`` steps per
    block). Dynamic: ``block_length`` and a confidence ``threshold`` (one token per step at least, the
    paper's "block 4, 4 steps per block, threshold 0.9").
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
        """``DiffusionGenerationConfig`` fields of this setting."""
        if self.steps is not None:
            return {"block_length": self.block_length, "steps": self.steps, "threshold": None}
        return {
            "block_length": self.block_length,
            "tokens_per_step": self.tokens_per_step,
            "threshold": self.threshold,
        }


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


def load_model(path: str, dtype: str = "auto", device: str | None = None) -> tuple[torch.nn.Module, Any]:
    """Load a checkpoint (local folder, Hub repo, or a ``peft`` adapter of one) as a diffusion LM, with its tokenizer.

    ``dtype``: ``"auto"`` (the checkpoint's), ``"bfloat16"``, ``"float16"`` or ``"float32"``. ``device``:
    default ``"cuda"`` when available, else ``"cpu"``.
    """
    from transformers import AutoTokenizer

    from ..models.auto import AutoModelForDiffusionLM, adapter_base_model, check_model_source

    if dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"dtype must be 'auto' or a torch dtype name such as 'bfloat16', got {dtype!r}")
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_model_source(path)
    model = AutoModelForDiffusionLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        base = adapter_base_model(path)  # an adapter saved without its tokenizer uses its base model's
        if base is None:
            raise
        tokenizer = AutoTokenizer.from_pretrained(base)
    return model, tokenizer


@dataclass
class GridResult:
    """Everything :func:`run_grid` measured.

    Attributes:
        settings: how the grid was run (models, benchmarks, decoding settings, seeds, ...).
        results: one entry per (model, benchmark, setting): ``model``, ``benchmark``, ``setting`` (its fields
            and ``label``), ``generation_config``, ``metrics``, ``per_seed`` and ``samples_file`` (JSON lines
            of the records, relative to the output folder; ``None`` without one).
    """

    settings: dict[str, Any]
    results: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "results": self.results}

    def metric(self, model: str, benchmark: str, setting: str, name: str = "accuracy") -> float:
        """One number of the grid, e.g. ``grid.metric("t3d", "GSM8K", "block4-tokps2")``."""
        for entry in self.results:
            if (entry["model"], entry["benchmark"], entry["setting"]["label"]) == (model, benchmark, setting):
                return entry["metrics"][name]
        raise KeyError(f"no result for model={model!r}, benchmark={benchmark!r}, setting={setting!r}")


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _check_run_settings(
    models: Mapping[str, Any],
    settings: Sequence[DecodingSetting],
    generation_kwargs: Mapping[str, Any],
    limit: int | None,
    batch_size: int,
    seeds: Sequence[int],
    num_samples: int,
    tokenizer: Any,
) -> None:
    """Everything :func:`run_grid` can check before the first generation (one error, naming the value)."""
    from ..models.auto import adapter_base_model, check_model_source, read_model_kind

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of problems, got {limit}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not list(seeds):
        raise ValueError("seeds must hold at least one seed")
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    for setting in settings:  # over the class defaults: each model's own defaults are checked when it loads
        try:
            config = DiffusionGenerationConfig().update(**{**generation_kwargs, **setting.overrides()})
            if "max_new_tokens" in generation_kwargs:  # else each model's saved length decides
                config.resolve(None)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"decoding setting {setting.label} with {dict(generation_kwargs)}: {err}"
            ) from err
    for name, spec in models.items():
        if isinstance(spec, str):
            try:
                check_model_source(spec)
                base = adapter_base_model(spec)
                if base is not None:
                    check_model_source(base)
            except FileNotFoundError as err:
                raise FileNotFoundError(f"model {name!r}: {err}") from err
            # Settings that depend on the model (a block-causal model refuses an approximate cache), from its
            # config alone: every model is checked before the first generation.
            try:
                DiffusionGenerationConfig().update(**generation_kwargs).check_model(*read_model_kind(spec))
            except ValueError as err:
                raise ValueError(f"model {name!r} ({spec}): {err}") from err
        else:
            if not isinstance(spec, tuple) and tokenizer is None:
                raise ValueError(
                    f"model {name!r} was given as an object without a tokenizer: pass tokenizer=..."
                )
            model = spec[0] if isinstance(spec, tuple) else spec
            try:
                config = model.diffusion_generation_config.update(**generation_kwargs)
                if config.cache_implementation is not None:
                    config.check_model(model.diffusion_config.is_block_causal, accepts_4d_mask(model))
            except ValueError as err:
                raise ValueError(f"model {name!r}: {err}") from err


def _entry_id(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    return entry["model"], entry["benchmark"], entry["setting"]["label"]


def _read_results(output: Path) -> GridResult | None:
    path = output / "results.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return GridResult(settings=data["settings"], results=list(data["results"]))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not a results file of t3d-trl eval ({err}); move it away or use another output_dir"
        ) from err


def _write_results(output: Path, grid: GridResult) -> None:
    # Written beside, then moved into place: a crash mid-write never leaves a truncated results.json.
    output.mkdir(parents=True, exist_ok=True)
    tmp = output / ".results.json.tmp"
    tmp.write_text(json.dumps(grid.to_dict(), indent=2))
    os.replace(tmp, output / "results.json")


def _merge_settings(earlier: GridResult, current: GridResult) -> GridResult:
    """Earlier results kept, the grid description the union of both (models, benchmarks, decoding)."""
    old, new = earlier.settings, current.settings
    merged = dict(new)
    merged["models"] = {**old.get("models", {}), **new["models"]}
    merged["benchmarks"] = list(dict.fromkeys([*old.get("benchmarks", []), *new["benchmarks"]]))
    labels = {d["label"] for d in new["decoding"]}
    merged["decoding"] = [d for d in old.get("decoding", []) if d["label"] not in labels] + new["decoding"]
    merged["data_files"] = {**old.get("data_files", {}), **new["data_files"]}
    return GridResult(settings=merged, results=list(earlier.results))


def run_grid(
    models: Mapping[str, str | torch.nn.Module | tuple[torch.nn.Module, Any]],
    benchmarks: Sequence[str | Benchmark],
    *,
    block_lengths: Sequence[int] = (4,),
    tokens_per_step: Sequence[int] = (1,),
    thresholds: Sequence[float] = (),
    steps: Sequence[int] = (),
    generation_kwargs: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    data_files: Mapping[str, str | Path] | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    seeds: Sequence[int] = (0,),
    num_samples: int = 1,
    use_chat_template: bool = True,
    dtype: str = "auto",
    device: str | None = None,
    output_dir: str | Path | None = None,
    progress: bool = True,
    code_extraction: str | None = None,
) -> GridResult:
    """Evaluate several models side by side over benchmarks x decoding settings.

    Args:
        models: display name -> checkpoint path / Hub id, a loaded model, or ``(model, tokenizer)``. The
            first one is the reference of the table's "Gain" column (put the original model first). Paths are
            loaded one at a time and released after their runs.
        benchmarks: benchmark names or :class:`~t3d_trl.evaluation.benchmarks.Benchmark` objects.
        block_lengths, tokens_per_step, thresholds, steps: the grid (see :func:`grid_settings`).
        generation_kwargs: other ``DiffusionGenerationConfig`` fields for every run (``max_new_tokens``,
            ``temperature``, ``remasking``...), applied over each model's saved defaults.
        tokenizer: the tokenizer of models given as objects without one.
        data_files: benchmark name -> local file with its schema (offline use).
        limit, batch_size, seeds, num_samples, use_chat_template: see :func:`evaluate_model`.
        dtype, device: how checkpoints given as paths are loaded (:func:`load_model`).
        output_dir: when given, ``results.json`` (rewritten after every run), ``samples/`` (per-sample
            records), ``table.md`` and the plots are written there (:func:`t3d_trl.evaluation.report.write_report`).
            A rerun into the same folder keeps every result already there: a run of the grid whose model
            path, benchmark, decoding setting and run settings (data file, limit, seeds, samples, generation
            settings, chat template, dtype) match a finished one is skipped (and logged); others replace it.
        progress: show progress bars.
        code_extraction: see :func:`evaluate_model`.

    Every model path, benchmark, data file and setting is checked before the first generation.
    """
    if not models:
        raise ValueError("models must name at least one model")
    settings = grid_settings(block_lengths, tokens_per_step, thresholds, steps)
    benchmarks = [get_benchmark(b).with_code_extraction(code_extraction) for b in benchmarks]
    if not benchmarks:
        raise ValueError("benchmarks must name at least one benchmark")
    data_files = {get_benchmark(name).name: path for name, path in (data_files or {}).items()}
    unused = sorted(set(data_files) - {b.name for b in benchmarks})
    if unused:  # a recipe may list every local copy and a run evaluate a few: not an error
        logger.warning("data_files of benchmark(s) %s are not used: they are not evaluated", unused)
    generation_kwargs = dict(generation_kwargs or {})
    _check_run_settings(models, settings, generation_kwargs, limit, batch_size, seeds, num_samples, tokenizer)
    examples = {b.name: b.load(data_files.get(b.name), limit) for b in benchmarks}
    for benchmark in benchmarks:  # every prompt can be built (a template may name a column the data lacks)
        for example in examples[benchmark.name]:
            benchmark.user_message(example)
    output = Path(output_dir) if output_dir is not None else None
    grid = GridResult(
        settings={
            "models": {
                name: spec if isinstance(spec, str) else type(spec).__name__ for name, spec in models.items()
            },
            "benchmarks": [b.name for b in benchmarks],
            "decoding": [{**asdict(s), "label": s.label} for s in settings],
            "generation_kwargs": generation_kwargs,
            "data_files": {name: str(path) for name, path in data_files.items()},
            "limit": limit,
            "batch_size": batch_size,
            "seeds": list(seeds),
            "num_samples": num_samples,
            "use_chat_template": use_chat_template,
            "dtype": dtype,
            "code_extraction": code_extraction,
        },
        results=[],
    )
    # A rerun into the same output_dir keeps every earlier result and skips the runs it already finished.
    earlier = _read_results(output) if output is not None else None
    if earlier is not None:
        grid = _merge_settings(earlier, grid)

    def run_key(
        name: str, spec: Any, benchmark: Benchmark, setting: DecodingSetting
    ) -> dict[str, Any] | None:
        if not isinstance(spec, str):
            return None  # an object cannot be recognised again: always evaluated
        return {
            "model": spec,
            "benchmark": benchmark.name,
            "setting": setting.label,
            "data_file": str(data_files[benchmark.name]) if benchmark.name in data_files else None,
            **{k: grid.settings[k] for k in ("generation_kwargs", "limit", "seeds", "num_samples")},
            **{k: grid.settings[k] for k in ("use_chat_template", "dtype")},
        }

    def finished(name: str, key: dict[str, Any] | None) -> bool:
        return key is not None and any(
            entry["model"] == name and entry.get("run_key") == key for entry in grid.results
        )

    todo = {
        name: [
            (benchmark, setting)
            for benchmark in benchmarks
            for setting in settings
            if not finished(name, run_key(name, spec, benchmark, setting))
        ]
        for name, spec in models.items()
    }
    skipped = len(models) * len(benchmarks) * len(settings) - sum(len(runs) for runs in todo.values())
    if skipped:
        logger.info("skipping %d run(s) already finished in %s", skipped, output / "results.json")
    bar = tqdm(total=sum(len(runs) for runs in todo.values()), desc="grid", unit="run", disable=not progress)
    for name, spec in models.items():
        if not todo[name]:
            continue
        if isinstance(spec, str):
            model, model_tokenizer = load_model(spec, dtype, device)
        elif isinstance(spec, tuple):
            model, model_tokenizer = spec
        else:
            model, model_tokenizer = spec, tokenizer
        base = model.diffusion_generation_config.update(**generation_kwargs)
        warmup = True  # once per model
        for benchmark, setting in todo[name]:
            bar.set_postfix_str(f"{name} / {benchmark.name} / {setting.label}")
            result = evaluate_model(
                model,
                model_tokenizer,
                benchmark,
                base.update(**setting.overrides()),
                examples=examples[benchmark.name],
                batch_size=batch_size,
                seeds=seeds,
                num_samples=num_samples,
                use_chat_template=use_chat_template,
                warmup=warmup,
                progress=progress,
            )
            warmup = False
            samples_file = None
            if output is not None:
                samples_file = f"samples/{_safe(name)}/{_safe(benchmark.name)}/{setting.label}.jsonl"
                _write_jsonl(output / samples_file, (asdict(record) for record in result.records))
            entry = {
                "model": name,
                "benchmark": benchmark.name,
                "setting": {**asdict(setting), "label": setting.label},
                **result.to_dict(records=False),
                "samples_file": samples_file,
                "run_key": run_key(name, spec, benchmark, setting),
            }
            same = [i for i, e in enumerate(grid.results) if _entry_id(e) == _entry_id(entry)]
            if same:  # the same run with other settings: replaced where it stood (the table keeps its order)
                grid.results[same[0]] = entry
            else:
                grid.results.append(entry)
            if output is not None:
                _write_results(output, grid)
            bar.update()
        if isinstance(spec, str):  # loaded here: release it before the next one
            del model
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    bar.close()
    if output is not None:
        from .report import write_report

        _write_results(output, grid)
        write_report(grid.results, output)
    return grid
