"""Run a diffusion LM on a benchmark, and several models over a grid of decoding budgets.

* :func:`evaluate_model`: one model, one benchmark, one decoding setting, one or more seeds (and samples per
  prompt for pass@k) -> an :class:`EvalResult` with metrics and per-sample records.
* :func:`run_grid`: several models x benchmarks x decoding settings (block length x tokens per step, and
  dynamic thresholds), written to ``results.json`` plus a Table-1 style Markdown table and plots
  (:mod:`t3d_trl.evaluation.report`). ``t3d-trl eval`` is this function.

Both decode through :func:`t3d_trl.evaluation.completions.generate_completions` (prompts in, completions out).

Metric definitions (per run; averaged over seeds when there are several):

* ``accuracy``: fraction of samples judged correct by the benchmark's checker.
* ``mean_output_length``: generated tokens per sample, up to and including the first EOS (all
  ``max_new_tokens`` when there is none).
* ``tokens_per_second``: all samples' output tokens divided by the wall-clock time spent inside
  ``diffusion_generate`` (tokenisation, detokenisation and answer checking excluded; the GPU is synchronised);
  NaN when no time was measured (:func:`t3d_trl.evaluation.metrics.throughput`).
* ``latency_per_sample``: that time divided by the number of samples (batched decoding shares it evenly).
* ``mean_nfe``: denoising forward passes spent on a sample (the paper's "average decoding steps").
* ``tokens_per_step``: output tokens per forward pass (``sum length / sum nfe``).
* ``pass@k`` (with ``num_samples > 1``): the unbiased estimator over the samples of each problem.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..generation.configuration import DiffusionGenerationConfig
from ..utils import resolve_dtype
from .benchmarks import Benchmark, check_safely, get_benchmark
from .completions import Generations, generate_completions
from .grid import DecodingSetting, check_run_settings, grid_benchmarks, grid_settings, load_examples
from .metrics import aggregate_seeds, pass_k_values, run_metrics
from .results import (
    GridResult,
    check_output,
    merge_settings,
    model_fingerprint,
    plan_runs,
    run_key,
    safe_name,
    write_jsonl,
    write_results,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DecodingSetting",  # defined in grid, like grid_settings: re-exported for their old import path
    "EvalResult",
    "GridResult",
    "SampleRecord",
    "evaluate_model",
    "grid_settings",
    "load_model",
    "run_grid",
]


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
    # Code benchmarks: how the sandbox ended the sample's program (``"timeout"``, ``"memory"``, ``"exited"``...:
    # t3d_trl.evaluation.sandbox.STATUSES) and its one-line error; ``None`` for other checkers.
    sandbox_status: str | None = None
    sandbox_error: str | None = None


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


def _seed_records(
    benchmark: Benchmark, items: Sequence[tuple[Mapping[str, Any], int]], out: Generations, seed: int
) -> list[SampleRecord]:
    """One seed's completions of ``items`` (``(example, sample index)``), checked, as records."""
    correct, errors = check_safely(benchmark, out.completions, [example for example, _ in items])
    return [
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
            sandbox_status=correct.statuses[i],
            sandbox_error=correct.errors[i],
        )
        for i, (example, s) in enumerate(items)
    ]


def evaluate_model(
    model: torch.nn.Module,
    tokenizer: Any,
    benchmark: str | Benchmark,
    generation_config: DiffusionGenerationConfig | Mapping[str, Any] | None = None,
    *,
    examples: Sequence[Mapping[str, Any]] | None = None,
    data_files: str | Path | None = None,
    limit: int | None = None,
    batch_size: int | None = 8,
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
        generation_config: decoding settings (a config, or a dict of its fields: a whole config, whose missing
            fields take the class defaults); default: the ones saved with the model.
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
            the benchmark's own rule (:func:`t3d_trl.evaluation.code_extraction.extract_code`); others
            ignore it.
    """
    benchmark = get_benchmark(benchmark).with_code_extraction(code_extraction)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    ks = pass_k_values(num_samples, pass_k)
    if examples is None:
        examples = benchmark.load(data_files, limit)
    elif limit is not None:
        examples = list(examples)[:limit]
    examples = list(examples)
    if not examples:
        raise ValueError(f"benchmark {benchmark.name!r} has no examples to evaluate")
    config = DiffusionGenerationConfig.parse(generation_config) or model.diffusion_generation_config
    config = config.update(return_dict_in_generate=True, output_history=False)  # a copy: the caller's is kept
    if num_samples > 1 and config.temperature == 0 and config.remasking != "random":
        logger.warning(
            "num_samples=%d with greedy decoding (temperature=0): all samples are identical", num_samples
        )

    messages = [benchmark.user_message(example) for example in examples for _ in range(num_samples)]
    items = [(example, s) for example in examples for s in range(num_samples)]
    device = next(model.parameters()).device
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
        run = _seed_records(benchmark, items, out, seed)
        records.extend(run)
        per_seed.append(run_metrics(run, ks))
    return EvalResult(
        benchmark=benchmark.name,
        generation_config=replace(config, return_dict_in_generate=False).to_dict(),
        metrics=aggregate_seeds(per_seed),
        per_seed=per_seed,
        records=records,
    )


def load_model(
    path: str, dtype: str = "auto", device: str | None = None, trust_remote_code: bool = False
) -> tuple[torch.nn.Module, Any]:
    """Load a checkpoint (local folder, Hub repo, or a ``peft`` adapter of one) as a diffusion LM, with its tokenizer.

    ``dtype``: ``"auto"`` (the checkpoint's), ``"bfloat16"``, ``"float16"`` or ``"float32"``. ``device``:
    default ``"cuda"`` when available, else ``"cpu"``. ``trust_remote_code``: run the code a checkpoint ships.
    """
    from ..models.auto import AutoModelForDiffusionLM, check_model_source, load_tokenizer

    torch_dtype = resolve_dtype(dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kind = torch.device(device).type
    except RuntimeError as err:
        raise ValueError(f"device {device!r}: {err}") from err
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU on this machine (use cpu, or leave it unset)")
    check_model_source(path)
    remote = {"trust_remote_code": True} if trust_remote_code else {}
    model = AutoModelForDiffusionLM.from_pretrained(path, dtype=torch_dtype, **remote).to(device).eval()
    return model, load_tokenizer(path, **remote)


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
    batch_size: int | None = 8,
    seeds: Sequence[int] = (0,),
    num_samples: int = 1,
    use_chat_template: bool = True,
    dtype: str = "auto",
    device: str | None = None,
    trust_remote_code: bool = False,
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
        block_lengths, tokens_per_step, thresholds, steps: the grid (see
            :func:`t3d_trl.evaluation.grid.grid_settings`).
        generation_kwargs: other ``DiffusionGenerationConfig`` fields for every run (``max_new_tokens``,
            ``temperature``, ``remasking``...), applied over each model's saved defaults; not the grid's own.
        tokenizer: the tokenizer of models given as objects without one.
        data_files: benchmark name -> local file with its schema (offline use).
        limit, batch_size, seeds, num_samples, use_chat_template: see :func:`evaluate_model`.
        dtype, device, trust_remote_code: how checkpoints given as paths are loaded (:func:`load_model`).
        output_dir: when given, ``results.json`` (rewritten after every run), ``samples/`` (per-sample
            records), ``table.md`` and the plots are written there (:func:`t3d_trl.evaluation.report.write_report`).
            A rerun into the same folder keeps every result already there: a run of the grid whose model
            path, benchmark, decoding setting and run settings (data file, limit, seeds, samples, generation
            settings, chat template, dtype) match a finished one is skipped (and logged), unless the model's
            fingerprint (its weights and saved settings) changed since: then it is evaluated again, with a
            warning (:mod:`t3d_trl.evaluation.results`). Others replace it.
        progress: show progress bars.
        code_extraction: see :func:`evaluate_model`.

    Models (weights too), benchmarks, data files, settings and output_dir are checked before the first run.
    """
    if not models:
        raise ValueError("models must name at least one model")
    settings = grid_settings(block_lengths, tokens_per_step, thresholds, steps)
    benchmarks, data_files = grid_benchmarks(benchmarks, data_files, code_extraction)
    generation_kwargs = dict(generation_kwargs or {})
    check_run_settings(models, settings, generation_kwargs, limit, batch_size, seeds, num_samples, tokenizer)
    output, earlier = check_output(output_dir, models)  # before any model loads, like the checks above
    examples = load_examples(benchmarks, data_files, limit)
    run = _GridRun(
        grid=GridResult(settings={}, results=[]),
        output=output,
        examples=examples,
        data_files=data_files,
        generation_kwargs=generation_kwargs,
        tokenizer=tokenizer,
        dtype=dtype,
        device=device,
        trust_remote_code=trust_remote_code,
        batch_size=batch_size,
        seeds=list(seeds),
        num_samples=num_samples,
        use_chat_template=use_chat_template,
        progress=progress,
    )
    run.grid.settings = run.describe(models, benchmarks, settings, limit, code_extraction)
    if earlier is not None:  # a rerun into the same output_dir keeps every earlier result
        run.grid = merge_settings(earlier, run.grid)
    todo = plan_runs(
        run.grid,
        models,
        (
            (name, b, s, run.key(spec, b, s))
            for name, spec in models.items()
            for b in benchmarks
            for s in settings
        ),
        run.output,
    )
    bar = tqdm(total=sum(len(runs) for runs in todo.values()), desc="grid", unit="run", disable=not progress)
    for name, spec in models.items():
        if todo[name]:
            run.evaluate(name, spec, todo[name], bar)
    bar.close()
    if run.output is not None:
        from .report import write_report

        write_results(run.output, run.grid)
        write_report(run.grid.results, run.output)
    return run.grid


@dataclass
class _GridRun:
    """The state of one :func:`run_grid` call that its steps share (the grid so far and how to run it)."""

    grid: GridResult
    output: Path | None
    examples: dict[str, list[dict[str, Any]]]
    data_files: dict[str, str | Path]
    generation_kwargs: dict[str, Any]
    tokenizer: Any
    dtype: str
    device: str | None
    trust_remote_code: bool
    batch_size: int
    seeds: list[int]
    num_samples: int
    use_chat_template: bool
    progress: bool

    def describe(
        self,
        models: Mapping[str, Any],
        benchmarks: Sequence[Benchmark],
        settings: Sequence[DecodingSetting],
        limit: int | None,
        code_extraction: str | None,
    ) -> dict[str, Any]:
        """The ``settings`` of ``results.json``."""
        return {
            "models": {
                name: spec if isinstance(spec, str) else type(spec).__name__ for name, spec in models.items()
            },
            "benchmarks": [b.name for b in benchmarks],
            "decoding": [{**asdict(s), "label": s.label} for s in settings],
            "generation_kwargs": self.generation_kwargs,
            "data_files": {name: str(path) for name, path in self.data_files.items()},
            "limit": limit,
            "batch_size": self.batch_size,
            "seeds": self.seeds,
            "num_samples": self.num_samples,
            "use_chat_template": self.use_chat_template,
            "dtype": self.dtype,
            "code_extraction": code_extraction,
        }

    def key(self, spec: Any, benchmark: Benchmark, setting: DecodingSetting) -> dict[str, Any] | None:
        return run_key(
            spec,
            benchmark.name,
            setting.label,
            self.data_files.get(benchmark.name),
            self.grid.settings,
            benchmark.code_extraction,
        )

    def load(self, spec: Any) -> tuple[torch.nn.Module, Any]:
        if isinstance(spec, str):
            return load_model(spec, self.dtype, self.device, self.trust_remote_code)
        if isinstance(spec, tuple):
            return spec
        return spec, self.tokenizer

    def evaluate(
        self, name: str, spec: Any, runs: Sequence[tuple[Benchmark, DecodingSetting]], bar: Any
    ) -> None:
        """One model's runs, each recorded (and ``results.json`` rewritten) as soon as it finishes."""
        model, tokenizer = self.load(spec)
        # Taken after loading: a Hub model is in the local cache only now.
        fingerprint = model_fingerprint(spec) if isinstance(spec, str) else None
        defaults = model.diffusion_generation_config
        for i, (benchmark, setting) in enumerate(runs):
            bar.set_postfix_str(f"{name} / {benchmark.name} / {setting.label}")
            result = evaluate_model(
                model,
                tokenizer,
                benchmark,
                setting.config(defaults, self.generation_kwargs),
                examples=self.examples[benchmark.name],
                batch_size=self.batch_size,
                seeds=self.seeds,
                num_samples=self.num_samples,
                use_chat_template=self.use_chat_template,
                warmup=i == 0,  # once per model
                progress=self.progress,
            )
            samples_file = None
            if self.output is not None:
                samples_file = f"samples/{safe_name(name)}/{safe_name(benchmark.name)}/{setting.label}.jsonl"
                write_jsonl(self.output / samples_file, (asdict(record) for record in result.records))
            self.grid.record(
                {
                    "model": name,
                    "benchmark": benchmark.name,
                    "setting": {**asdict(setting), "label": setting.label},
                    **result.to_dict(records=False),
                    "samples_file": samples_file,
                    "run_key": self.key(spec, benchmark, setting),
                    "model_fingerprint": fingerprint,
                }
            )
            if self.output is not None:
                write_results(self.output, self.grid)
            bar.update()
        if isinstance(spec, str):  # loaded here: release it before the next one
            del model
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
