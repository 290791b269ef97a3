"""The CPU demo behind ``t3d-trl quickstart``: T3D end to end on an embedded task, with nothing downloaded.

Pipeline (every stage is the library's public code path):

1. **Teacher.** A tiny bidirectional Qwen3 MDLM for the task: the one shipped in the package (trained by
   ``examples/train_demo_teacher.py`` with ``T3DTrainer(loss_type="mdlm")``), a saved one, or trained here.
2. **Trajectories.** ``collect_trajectories``: the teacher decodes the training prompts one token per step
   (greedy, low-confidence remasking) and records the step at which each token was unmasked.
3. **Distillation.** ``T3DTrainer`` with ``loss_type`` ``t3d`` and the baselines (``td``, ``redi``,
   ``dparallel``), each from a fresh copy of the teacher, with the same number of optimizer steps and batch.
4. **Evaluation.** ``run_grid`` over held-out prompts: static TokPS 1, 2 and 4 and dynamic decoding.
5. **Analysis.** ``total_correlation`` (the factorization error) of the teacher and the students on the
   teacher's trajectory states, as a heatmap like the paper's Figure 2.

The small-scale hyper-parameters were tuned for this task (``docs/quickstart.md``); the paper's defaults stay
the defaults of ``T3DConfig`` and of the LLM recipes.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from .tasks import DEMO_TASKS, DemoTask, build_teacher, get_task

logger = logging.getLogger(__name__)

PACKAGED_TEACHERS = Path(__file__).parent / "teachers"
METHODS = ("t3d", "td", "redi", "dparallel")


#: The budgets not given: (the default, what ``fast`` sets: every stage runs, none trains anything useful).
BUDGETS = {
    "teacher_steps": (2000, 20),
    "num_trajectories": (4000, 256),
    "distill_steps": (400, 4),
    "batch_size": (128, 64),
    "num_eval": (1000, 64),
    "analysis_prompts": (64, 8),
    "analysis_samples": (16, 4),
}


def _budget(name: str, help: str) -> Any:
    """A budget field: ``None`` until ``__post_init__`` sets the default or the ``fast`` value, so that a value
    given explicitly, even one equal to the default, is kept under ``fast``."""
    full, small = BUDGETS[name]
    return field(default=None, metadata={"help": f"{help} (default {full}; with --fast {small})"})


@dataclass
class QuickstartConfig:
    """Settings of the demo. ``fast`` shrinks every budget left at its default for a smoke run (the tests use
    it)."""

    task: str = field(
        default="sort2",
        metadata={"help": f"Embedded task family ({', '.join(DEMO_TASKS)})."},
    )
    output_dir: str = field(default="t3d-quickstart", metadata={"help": "Where models, data and results go."})
    seed: int = field(default=0, metadata={"help": "Seed of data, training and decoding."})
    methods: list[str] = field(
        # dParallel: the best baseline of the converged method study (docs/method_study.md); ReDi: the best here.
        default_factory=lambda: ["t3d", "td", "redi", "dparallel"],
        metadata={"help": f"Distillation methods, from {list(METHODS)}."},
    )
    teacher: str | None = field(
        default=None, metadata={"help": "A saved teacher; default: the packaged one for the task."}
    )
    train_teacher: bool = field(
        default=False, metadata={"help": "Pre-train the teacher here (loss_type=mdlm)."}
    )
    teacher_steps: int | None = _budget("teacher_steps", "Teacher pre-training steps.")
    teacher_learning_rate: float = field(
        default=2e-3, metadata={"help": "Teacher pre-training learning rate."}
    )
    num_trajectories: int | None = _budget("num_trajectories", "Training prompts decoded by the teacher.")
    distill_steps: int | None = _budget("distill_steps", "Optimizer steps of every method.")
    batch_size: int | None = _budget("batch_size", "Training batch size (teacher and students).")
    learning_rate: float = field(default=1e-3, metadata={"help": "Distillation learning rate."})
    trajectory_temperature: float = field(
        default=0.0,
        metadata={
            "help": "Temperature at which the teacher samples its trajectories (0: greedy; the public T3D code "
            "collects at 0.1)."
        },
    )
    tokens_per_step: int = field(
        default=4, metadata={"help": "Student budget (TokPS) used for path weights."}
    )
    beta: float = field(default=1.0, metadata={"help": "DDO beta (reference code: 0.1)."})
    fake_weight: float = field(
        default=0.5, metadata={"help": "DDO fake-term weight alpha (reference code: 0.5)."}
    )
    lambda_path: float = field(default=3.0, metadata={"help": "Path-consistency weight (paper: 0.2)."})
    ref_sync_steps: int = field(
        default=10, metadata={"help": "Reference refresh period (reference code: 10)."}
    )
    num_eval: int | None = _budget("num_eval", "Held-out prompts per evaluation.")
    eval_tokens_per_step: list[int] = field(
        default_factory=lambda: [1, 2, 4], metadata={"help": "Static budgets evaluated (TokPS)."}
    )
    threshold: float = field(default=0.9, metadata={"help": "Dynamic decoding threshold evaluated."})
    analysis_prompts: int | None = _budget("analysis_prompts", "Trajectories used by the TC analysis.")
    analysis_samples: int | None = _budget("analysis_samples", "Monte Carlo samples per TC state.")
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: all cores)."})
    fast: bool = field(
        default=False,
        metadata={"help": "Tiny budgets (those not set explicitly): a smoke run of every stage."},
    )

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if not self.methods:
            raise ValueError("methods must name at least one distillation method")
        for name in ("methods", "eval_tokens_per_step"):  # each would be run (and reported) twice
            values = getattr(self, name)
            if len(set(values)) < len(values):
                raise ValueError(f"{name} {values} names one value twice")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be a positive number (or unset: all cores), got {self.threads}")
        if self.teacher and self.train_teacher:
            raise ValueError("give a teacher or train_teacher, not both: train_teacher trains a new one")
        # The evaluation budgets are checked here, not after the teacher and the students have trained.
        block_length = get_task(self.task).block_length
        bad = [k for k in self.eval_tokens_per_step if k < 1 or block_length % k]
        if bad or not self.eval_tokens_per_step:
            raise ValueError(
                f"eval_tokens_per_step {bad or '[]'}: each must divide the {self.task} task's block length "
                f"{block_length}"
            )
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        for name, (full, small) in BUDGETS.items():  # a budget given explicitly keeps its value
            if getattr(self, name) is None:
                setattr(self, name, small if self.fast else full)
            elif getattr(self, name) < 1:  # else it fails minutes later, after the stages before it ran
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")


def _training_args(config: QuickstartConfig, output_dir: Path, **overrides: Any) -> Any:
    from ..trainer.t3d_config import T3DConfig

    values: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=config.distill_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, config.distill_steps // 20),
        weight_decay=0.0,
        logging_steps=max(1, config.distill_steps // 10),
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        seed=config.seed,
        activation_checkpointing=False,
        dataloader_num_workers=0,
        overwrite_output_dir=True,  # a rerun of the demo replaces its own models
    )
    values.update(overrides)
    return T3DConfig(**values)


def split_rows(task: DemoTask, config: QuickstartConfig) -> tuple[list[dict], list[dict]]:
    """Training and held-out prompts: disjoint (different seeds, duplicates removed) where the task's prompts
    allow it (:meth:`DemoTask.held_out`)."""
    train = task.sample(config.num_trajectories, seed=config.seed)
    held_out = task.held_out({row["prompt"] for row in train}, config.num_eval, seed=10_000 + config.seed)
    return train, held_out


def teacher_rows(task: DemoTask, config: QuickstartConfig) -> list[dict]:
    """The rows ``train_teacher`` trains on: a seed of their own, about four epochs of its steps. Rows are a prefix
    of a longer draw with the same seed, so the rows of a larger ``teacher_steps * batch_size`` contain these."""
    return task.sample(max(config.teacher_steps * config.batch_size // 4, 1000), seed=config.seed + 1)


def train_teacher(task: DemoTask, config: QuickstartConfig, output_dir: Path, **size: Any) -> torch.nn.Module:
    """Pre-train the task's tiny teacher with the library's own trainer (``loss_type="mdlm"``); ``size`` are
    ``Qwen3Config`` fields replacing the task's teacher size (the method study's capacity axis)."""
    from ..trainer.t3d_trainer import T3DTrainer

    tokenizer = task.tokenizer()
    rows = teacher_rows(task, config)
    # Pre-tokenised without EOS: completions are exactly `answer_length` tokens, as decoded by the demo.
    data = Dataset.from_list(
        [
            {
                "prompt_ids": tokenizer(r["prompt"], add_special_tokens=False).input_ids,
                "completion_ids": tokenizer(r["answer"], add_special_tokens=False).input_ids,
            }
            for r in rows
        ]
    )
    model = build_teacher(task, seed=config.seed, **size)
    args = _training_args(
        config,
        output_dir,
        loss_type="mdlm",
        max_steps=config.teacher_steps,
        learning_rate=config.teacher_learning_rate,
        block_length=task.block_length,
        random_token_prob=0.0,
    )
    T3DTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer).train()
    model.eval()
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return model


def load_teacher(task: DemoTask, config: QuickstartConfig, output: Path) -> tuple[torch.nn.Module, str]:
    from ..models.auto import AutoModelForDiffusionLM

    if config.train_teacher:
        return train_teacher(task, config, output / "teacher"), "trained here"
    path = Path(config.teacher) if config.teacher else PACKAGED_TEACHERS / task.name
    if not (path / "config.json").exists():
        if config.teacher:
            raise FileNotFoundError(f"no teacher checkpoint at {path} (config.json missing)")
        logger.warning("no packaged teacher for %s: training one (%d steps)", task.name, config.teacher_steps)
        return train_teacher(task, config, output / "teacher"), "trained here"
    if (path / "tokenizer.json").is_file():  # a teacher of another task reads the prompts as other tokens
        from ..models.auto import load_tokenizer

        if load_tokenizer(str(path)).get_vocab() != task.tokenizer().get_vocab():
            raise ValueError(f"the teacher at {path} has another vocabulary than the {task.name} task's")
    # Recorded absolute: the playground and a reader find it from any working directory.
    return AutoModelForDiffusionLM.from_pretrained(path).eval(), str(path.resolve())


def collect(
    teacher: torch.nn.Module, task: DemoTask, rows: list[dict], config: QuickstartConfig, output: Path
):
    """The teacher's trajectories on the training prompts (self-distillation keeps them all)."""
    from ..data.trajectories import collect_trajectories

    dataset = collect_trajectories(
        teacher,
        task.tokenizer(),
        Dataset.from_list(rows),
        prompt_template="plain",
        prompt_column="prompt",
        id_column="id",
        use_chat_template=False,
        keep_columns=["answer"],
        generation_config=task.generation_config(
            tokens_per_step=1, stop_at_eos=False, temperature=config.trajectory_temperature
        ),
        output_dir=str(output / "trajectories"),
        batch_size=512,
        seed=config.seed,
    )
    valid = sum(task.is_valid(row["prompt"], row["completion"]) for row in dataset)
    logger.info("trajectories: %d of %d teacher answers are valid", valid, len(dataset))
    return dataset


def distill_args(
    method: str, task: DemoTask, config: QuickstartConfig, output: Path, **overrides: Any
) -> Any:
    """The ``T3DConfig`` that :func:`distill` trains ``method`` with: built (and checked) before the teacher."""
    from ..trainer.t3d_config import OBJECTIVE_SETTINGS

    settings: dict[str, Any] = dict(loss_type=method, block_length=task.block_length)
    # The demo's objective settings (TokPS, DDO's, the path weight) that this objective reads.
    settings |= {
        name: getattr(config, name)
        for name, readers in OBJECTIVE_SETTINGS.items()
        if method in readers and hasattr(config, name)
    }
    return _training_args(config, output / method, **{**settings, **overrides})


def distill(
    method: str,
    teacher: torch.nn.Module,
    trajectories: Dataset,
    task: DemoTask,
    config: QuickstartConfig,
    output: Path,
    callbacks: list[Any] | None = None,
    **overrides: Any,
) -> torch.nn.Module:
    """A fresh copy of the teacher distilled with ``loss_type=method``; ``overrides`` are further ``T3DConfig``
    settings (the tuning study in ``benchmarks/sweep_demo_distillation.py`` uses them) and ``callbacks`` trainer
    callbacks (the method study's :class:`~t3d_trl.trainer.EvaluateAtSteps` gives its learning curves)."""
    from ..trainer.t3d_trainer import T3DTrainer

    student = copy.deepcopy(teacher).train()
    args = distill_args(method, task, config, output, **overrides)
    trainer = T3DTrainer(
        model=student,
        args=args,
        train_dataset=trajectories,
        processing_class=task.tokenizer(),
        callbacks=callbacks,
    )
    trainer.train()
    trainer.save_model(str(output / method))
    return trainer.model.eval()


def _benchmark(task: DemoTask):
    from ..evaluation.benchmarks import Benchmark, register_benchmark

    def checker(completions, examples):
        return [
            task.is_valid(example["problem"], completion)
            for completion, example in zip(completions, examples)
        ]

    benchmark = Benchmark(
        name=f"demo-{task.name}",
        path=f"t3d-trl/demo-{task.name}",
        checker=checker,
        columns={"problem": "prompt"},
    )
    register_benchmark(benchmark.name, benchmark, overwrite=True)
    return benchmark


def evaluate(
    models: dict[str, torch.nn.Module],
    task: DemoTask,
    rows: list[dict],
    config: QuickstartConfig,
    output: Path,
    progress: bool = True,
):
    from ..evaluation.runner import run_grid

    shutil.rmtree(output / "eval", ignore_errors=True)  # the demo's own: it describes this run only
    output.mkdir(parents=True, exist_ok=True)
    data_file = output / "eval_prompts.jsonl"
    data_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    benchmark = _benchmark(task)
    return run_grid(
        models,
        [benchmark],
        block_lengths=[task.block_length],
        tokens_per_step=config.eval_tokens_per_step,
        thresholds=[config.threshold],
        generation_kwargs={"max_new_tokens": task.answer_length, "stop_at_eos": False},
        tokenizer=task.tokenizer(),
        data_files={benchmark.name: data_file},
        batch_size=500,
        seeds=[config.seed],
        use_chat_template=False,
        output_dir=output / "eval",
        progress=progress,
    )


def analyze(
    models: dict[str, torch.nn.Module], trajectories: Dataset, config: QuickstartConfig, output: Path
):
    from ..analysis import TotalCorrelationConfig, total_correlation
    from ..analysis.plots import plot_entropy, plot_tc_by_jump, plot_tc_heatmap

    states = trajectories.select(range(min(config.analysis_prompts, len(trajectories))))
    tc_config = TotalCorrelationConfig(num_samples=config.analysis_samples, seed=config.seed)
    results = {
        name: total_correlation(model, states, config=tc_config, progress=True)
        for name, model in models.items()
    }
    plot_tc_heatmap(results, output / "tc_heatmap.png")
    plot_tc_by_jump(results, output / "tc_by_jump.png")
    plot_entropy(results, output / "entropy.png")
    return {name: result.to_dict() for name, result in results.items()}


def summary_table(grid: Any, names: list[str], config: QuickstartConfig, block_length: int) -> str:
    """Accuracy (%) per model and budget, and the dynamic run's mean NFE, as a Markdown table."""
    labels = [f"block{block_length}-tokps{k}" for k in config.eval_tokens_per_step]
    dynamic = f"block{block_length}-threshold{config.threshold:g}"
    header = [
        "model",
        *[f"TokPS {k}" for k in config.eval_tokens_per_step],
        f"dynamic {config.threshold:g}",
        "dynamic NFE",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [f"{100 * _metric(grid, name, label):.1f}" for label in labels]
        cells += [
            f"{100 * _metric(grid, name, dynamic):.1f}",
            f"{_metric(grid, name, dynamic, 'mean_nfe'):.2f}",
        ]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


def _metric(grid: Any, model: str, label: str, name: str = "accuracy") -> float:
    for entry in grid.results:
        if entry["model"] == model and entry["setting"]["label"] == label:
            return float(entry["metrics"][name])
    raise KeyError(f"no result for {model} at {label}")


#: The settings a run's teacher and trajectories follow from: a rerun that changes one replaces them.
DATA_SETTINGS = (
    "task",
    "teacher",
    "train_teacher",
    "teacher_steps",
    "teacher_learning_rate",
    "batch_size",
    "seed",
    "num_trajectories",
    "trajectory_temperature",
)
RUN_RECORD = "quickstart.json"


def _claim_output(config: QuickstartConfig, output: Path) -> None:
    """Make ``output`` this run's: a folder of an earlier demo run (its ``quickstart.json``, or the
    ``results.json`` of a run before that record) has its trajectories replaced when the settings they follow
    from changed; a folder the demo did not write is refused where a student would overwrite a model."""
    record, results = output / RUN_RECORD, output / "results.json"
    earlier = json.loads(record.read_text()) if record.is_file() else None
    if earlier is None and results.is_file():
        earlier = json.loads(results.read_text()).get("config")
    current = json.loads(json.dumps(asdict(config)))
    if earlier is None:
        taken = [name for name in (*config.methods, "trajectories") if (output / name).exists()]
        if taken:
            raise FileExistsError(
                f"{output} holds {taken} but no earlier quickstart run ({RUN_RECORD}): use a new output_dir"
            )
    else:
        changed = [key for key in DATA_SETTINGS if earlier.get(key) != current.get(key)]
        if changed and (output / "trajectories").exists():
            logger.warning(
                "%s changed since the last run in %s: collecting the trajectories again", changed, output
            )
            shutil.rmtree(output / "trajectories")
    record.write_text(json.dumps(current, indent=2))


def run_quickstart(config: QuickstartConfig) -> dict[str, Any]:
    """Run the whole demo; returns (and writes to ``output_dir/results.json``) every number it reports."""
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    output = Path(config.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    task = get_task(config.task)
    timings: dict[str, float] = {}
    start = time.perf_counter()

    def lap(stage: str) -> None:
        timings[stage] = round(time.perf_counter() - start - sum(timings.values()), 1)
        logger.info("%s done in %.1f s", stage, timings[stage])

    for method in config.methods:  # a bad setting fails now, not after the teacher and earlier students
        distill_args(method, task, config, output)
    _claim_output(config, output)
    train_rows, eval_rows = split_rows(task, config)
    teacher, teacher_source = load_teacher(task, config, output)
    lap("teacher")
    trajectories = collect(teacher, task, train_rows, config, output)
    lap("trajectories")
    models: dict[str, torch.nn.Module] = {"teacher": teacher}
    for method in config.methods:
        models[method] = distill(method, teacher, trajectories, task, config, output)
        lap(f"distill {method}")
    grid = evaluate(models, task, eval_rows, config, output)
    lap("evaluation")
    analysis_models = {name: models[name] for name in ("teacher", *config.methods)}
    tc = analyze(analysis_models, trajectories, config, output)
    lap("analysis")

    table = summary_table(grid, list(models), config, task.block_length)
    results = {
        "task": task.name,
        "task_description": task.description,
        "teacher": teacher_source,
        "config": asdict(config),
        "num_trajectories": len(trajectories),
        "accuracy": {
            name: {
                entry["setting"]["label"]: entry["metrics"]["accuracy"]
                for entry in grid.results
                if entry["model"] == name
            }
            for name in models
        },
        "dynamic_nfe": {
            name: _metric(grid, name, f"block{task.block_length}-threshold{config.threshold:g}", "mean_nfe")
            for name in models
        },
        "total_correlation_by_jump": {name: result["by_jump"] for name, result in tc.items()},
        "table": table,
        "timings_s": {**timings, "total": round(time.perf_counter() - start, 1)},
    }
    (output / "results.json").write_text(json.dumps(results, indent=2))
    (output / "total_correlation.json").write_text(json.dumps(tc, indent=2))
    return results
