"""``t3d-trl eval``: evaluate models side by side over benchmarks and decoding budgets.

    t3d-trl eval --config recipes/sdar-4b-chat/eval.yaml
    t3d-trl eval --models original=JetLM/SDAR-4B-Chat t3d=./t3d-out --benchmarks gsm8k math500 \\
        --block_lengths 4 8 --tokens_per_step 2 4 --limit 50

Writes ``results.json``, ``table.md`` (the paper's Table 1 layout), ``samples/`` and plots to ``output_dir``,
and prints the table. Every model, benchmark, data file and setting is checked before the first generation; a
rerun of the same command skips the runs already finished (unless the model changed since: its weights or saved
settings differ from the fingerprint recorded with them) and merges ``results.json``. This is
:func:`t3d_trl.evaluation.runner.run_grid` behind a recipe.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from ..utils import launched_processes
from .decoding import optional_decoding_fields
from .parsing import named_paths, parse_recipe

_DESCRIPTION = (
    "Evaluate models side by side over benchmarks and decoding budgets (block lengths x tokens per step, "
    "dynamic thresholds); writes results.json, table.md, samples/ and plots to output_dir. Rerunning the same "
    "command skips the runs already in output_dir/results.json (a model changed since is evaluated again) and "
    "merges the new ones into it."
)


#: Decoding fields that are axes of the grid: each takes a list (``--block_lengths 4 8``, ``--tokens_per_step 1 2``,
#: ``--thresholds 0.9``, ``--steps 64``); ``--block_length`` and ``--threshold`` are accepted as their aliases.
GRID_FIELDS = ("block_length", "tokens_per_step", "threshold", "steps")

# Every other decoding field of DiffusionGenerationConfig, optional: unset keeps each model's saved setting.
EvalDecodingConfig = make_dataclass("EvalDecodingConfig", optional_decoding_fields(skip=GRID_FIELDS))


@dataclass
class EvalConfig(EvalDecodingConfig):
    """Settings of ``t3d-trl eval`` (every field is a recipe key and a ``--flag``).

    The decoding fields of :class:`~t3d_trl.DiffusionGenerationConfig` are options under their own names
    (unset: each model's saved setting); the budgets are the grid's axes.
    """

    models: list[str] = field(
        default_factory=list,
        metadata={
            "help": "models as NAME=PATH or PATH (a local folder or Hub repo id); the first is the baseline"
        },
    )
    benchmarks: list[str] = field(
        default_factory=lambda: ["math500", "gsm8k", "mbpp", "humaneval"],
        metadata={"help": "registered benchmark names (see --benchmark_modules for your own)"},
    )
    benchmark_modules: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Python modules (importable names or .py files) that call register_benchmark; "
            "imported first, so that --benchmarks can name what they register"
        },
    )
    data_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "BENCHMARK=FILE: read a benchmark from a local json/jsonl/parquet file (offline use)"
        },
    )
    block_lengths: list[int] = field(
        default_factory=lambda: [4],
        metadata={"help": "grid axis: decoding block lengths", "aliases": ["--block_length"]},
    )
    tokens_per_step: list[int] = field(
        default_factory=list,
        metadata={"help": "grid axis, static budgets: tokens committed per step (TokPS); default 1"},
    )
    steps: list[int] = field(
        default_factory=list,
        metadata={"help": "grid axis, static budgets: total denoising steps (instead of tokens_per_step)"},
    )
    thresholds: list[float] = field(
        default_factory=list,
        metadata={
            "help": "grid axis, dynamic budgets: confidence thresholds (e.g. 0.9)",
            "aliases": ["--threshold"],
        },
    )
    limit: int | None = field(
        default=None, metadata={"help": "evaluate the first N problems of each benchmark"}
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "help": "prompts per diffusion_generate call (default: from free GPU memory on a GPU, else 8)"
        },
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "one run per seed"})
    num_samples: int = field(
        default=1, metadata={"help": "completions per problem and seed (>1 gives pass@k)"}
    )
    use_chat_template: bool = field(default=True, metadata={"help": "wrap prompts in the chat template"})
    dtype: str = field(default="auto", metadata={"help": "auto, bfloat16, float16 or float32"})
    device: str | None = field(default=None, metadata={"help": "default: cuda when available, else cpu"})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "run the modeling code a checkpoint ships (auto_map); read it first"}
    )
    output_dir: str = field(default="eval_results", metadata={"help": "where results, tables and plots go"})
    code_extraction: str | None = field(
        default=None,
        metadata={
            "help": "code benchmarks: entry_point (evalplus-like, default) or last_block (the paper's rule)"
        },
    )

    def __post_init__(self) -> None:
        if not (self.tokens_per_step or self.steps or self.thresholds):
            self.tokens_per_step = [1]  # the default static budget: one token per step
        if not self.models:
            raise ValueError("give at least one model: --models NAME=PATH ... (or `models:` in the recipe)")

    def model_paths(self) -> dict[str, str]:
        """Display name -> path; a bare path is named after its last component."""
        return named_paths(self.models, "models")

    def data_file_paths(self) -> dict[str, str]:
        return named_paths(self.data_files, "data_files", bare=False)

    def generation_kwargs(self) -> dict[str, object]:
        """The decoding fields set (not ``None``), applied over each model's saved settings."""
        values = {f.name: getattr(self, f.name) for f in fields(EvalDecodingConfig)}
        return {key: value for key, value in values.items() if value is not None}


def import_benchmark_module(name: str) -> None:
    """Import a module by name, or a ``.py`` file by path, for the benchmarks it registers."""
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"benchmark_modules: {name!r} is not a file")
        spec = importlib.util.spec_from_file_location(f"t3d_trl_user_benchmarks.{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return
    if os.getcwd() not in sys.path:  # as `python -m` does: a module next to the recipe imports by name
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(name)
    except ImportError as err:
        raise ValueError(f"benchmark_modules: cannot import {name!r} ({err})") from err


def main(argv: list[str]) -> int:
    (config,) = parse_recipe([EvalConfig], argv, prog="t3d-trl eval", description=_DESCRIPTION)
    launched = launched_processes()
    if launched > 1:
        raise ValueError(
            f"t3d-trl eval runs as one process, but was launched as {launched}: each would evaluate every row and "
            "write the same output folder. Run it without torchrun or accelerate launch (one process decodes a "
            "batch at a time on its device); `t3d-trl lm-eval` splits documents over processes"
        )
    from ..demo.benchmarks import register_demo_benchmarks

    register_demo_benchmarks()  # demo-<task>: generated, offline; registered first so that a miss lists them too
    for module in config.benchmark_modules:
        import_benchmark_module(module)
    from ..evaluation.report import accuracy_table
    from ..evaluation.runner import run_grid

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("t3d_trl").setLevel(logging.INFO)
    grid = run_grid(
        config.model_paths(),
        config.benchmarks,
        block_lengths=config.block_lengths,
        tokens_per_step=config.tokens_per_step,
        thresholds=config.thresholds,
        steps=config.steps,
        generation_kwargs=config.generation_kwargs(),
        data_files=config.data_file_paths(),
        limit=config.limit,
        batch_size=config.batch_size,
        seeds=config.seeds,
        num_samples=config.num_samples,
        use_chat_template=config.use_chat_template,
        dtype=config.dtype,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
        output_dir=config.output_dir,
        code_extraction=config.code_extraction,
    )
    print(accuracy_table(grid.results))
    print(f"\nresults, samples, table.md and plots written to {config.output_dir}")
    return 0
