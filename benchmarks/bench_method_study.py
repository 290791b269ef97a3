"""The method study, converged (docs/method_study.md): T3D against every baseline, with learning curves.

Two block-causal embedded tasks (``--task``): ``wordsort`` (8 words sorted ascending or descending: one mode
choice, in block 0) and ``wordset`` (the 8 words in any order: a choice in every block). For every seed the
packaged teacher of the task decodes the training prompts one token per step (greedy, or sampled at
``--trajectory_temperature``); each objective then distils a fresh copy of it on the SAME trajectories with the
SAME optimizer steps, and is evaluated on held-out prompts at TokPS 1, 2 and 4 and with dynamic decoding
(threshold 0.9) at every checkpoint of ``--checkpoints`` along ONE run (no retraining per point, the run's later
steps unchanged by the evaluations: :class:`t3d_trl.trainer.EvaluateAtSteps`). Along one cosine run the last
doubling also anneals the learning rate, so the plateau rule is tested with a second, whole run of half the budget
per model (``<name>_steps<N/2>``; ``--no-plateau_runs`` leaves it out); every ``<name>_steps<K>`` run on disk (for
example the whole runs of an earlier, shorter study, copied in) is a point of the whole-run learning curve
(``whole_runs_<task>.png`` beside the along-run ``curves_<task>.png``).

* Main comparison (``--seeds``): the teacher; ``t3d`` in the recommended setting (``RECOMMENDED``); ``ddo``,
  ``td``, ``redi``, ``dparallel``. With ``--variants`` also ``t3d_paper`` (the paper's settings), ``mdlm`` (SFT on
  the task's real answers) and ``t3d_rollout``: the recommended T3D with half of the rows moved onto the student's
  own path and relabelled by the teacher's one-token-per-step completion (the step beyond the paper). The defaults
  are the task's protocol (``TUNED``): the number of trajectories and steps of the converged study, each
  objective's learning rate and the trajectory temperature that the tuning seed chose; ``--num_trajectories``,
  ``--checkpoints``, ``--learning_rate`` and ``--trajectory_temperature`` override them. On ``wordsort`` that is
  32,000 trajectories and 7,680 steps (every objective but DDO at its retuned rate meets the plateau rule): about
  2 h 45 min on a quiet 2-core machine; ``wordset`` (3,840 steps, not converged) about 2 hours
  (docs/method_study.md, "The converged comparison"). ``--tuning_file benchmarks/protocols/<task>_2000.json``
  restores the study's first protocol, ``<task>_32000_first.json`` the rates of the first comparisons with 32,000
  trajectories.
* Tuning (``--tune``, on ``--tuning_seed``, which no reported mean uses): every objective at every learning rate
  of ``--tune_learning_rates`` and every trajectory temperature of ``--tune_temperatures``; prints the choice by
  the rule fixed in docs/method_study.md (highest mean of TokPS 2 and 4 at the last checkpoint), made over every
  tuning result of that seed in ``--output_dir`` measured at the same budget, so a later run of more rates extends
  the grid.
* Ablations (``--ablation_seed``): one setting of the recommended T3D changed at a time.

Every (seed, model) result is written to ``OUTPUT/results/seed<S>/<name>.json`` (``OUTPUT/tuning/...`` for the
grid) as soon as it is measured and reused on a rerun, so a study resumes (a rerun asking for another rate,
temperature, number of trajectories, batch size, ``--num_eval``, checkpoints or teacher (by its weights) stops
and names the results that differ, rather than mixing them into its means; the teacher's results are checked
too, and the teacher is always measured, whether ``--variants`` names it or not); ``--workers`` trains that many
models at once (one single-threaded process each; by default one per core); ``--torch_compile`` trains with
``torch.compile`` (about 1.3x faster per run on a CPU, not bit-identical to the eager runs the docs report; each
result records it). The last line printed is one JSON object with the means over ``--seeds``:

    python benchmarks/bench_method_study.py --seeds 0 1 2                               # wordsort
    python benchmarks/bench_method_study.py --task wordset --seeds 0 1 2
    python benchmarks/bench_method_study.py --tune                                     # the tuning seed
    python benchmarks/bench_method_study.py --tuning_file benchmarks/protocols/wordsort_2000.json  # 960 steps
    python benchmarks/bench_method_study.py --quick   # seconds: a smoke run of every stage on tiny budgets
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_from_disk
from smoke import parse_with_quick

from t3d_trl import AutoModelForDiffusionLM
from t3d_trl.data.trajectories import weights_fingerprint
from t3d_trl.demo.quickstart import (
    PACKAGED_TEACHERS,
    QuickstartConfig,
    collect,
    distill,
    evaluate,
    split_rows,
    train_teacher,
)
from t3d_trl.demo.tasks import get_task
from t3d_trl.trainer import EvaluateAtSteps
from t3d_trl.utils import usable_cpus

TASKS = ("wordsort", "wordset")
# 3e-2, 1e-2 and 3e-3 were added after 1e-3, the top of the first grid, won everywhere (docs/method_study.md).
LR_GRID = (3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4)
TEMPERATURES = (0.0, 0.1, 1.0)  # greedy, the public reference code's 0.1, plain sampling
TUNING_SEED = 100
# The recommended T3D setting: the demo's DDO/path scales, uniform path weights and DDO's fake term as the exact
# expectation (the argmax is seed-fragile).
RECOMMENDED: dict[str, Any] = {"path_weighting": "uniform", "fake_estimator": "expectation"}
PAPER = {"beta": 0.1, "lambda_path": 0.2, "path_weighting": "early", "fake_estimator": "argmax"}
# The objectives whose learning rate is tuned: name -> (loss_type, settings). QuickstartConfig fields and
# T3DConfig fields may be mixed in the settings.
OBJECTIVES: dict[str, tuple[str, dict[str, Any]]] = {
    "t3d": ("t3d", RECOMMENDED),
    "t3d_paper": ("t3d", PAPER),
    "ddo": ("ddo", {"fake_estimator": "expectation"}),
    "td": ("td", {}),
    "redi": ("redi", {}),
    "dparallel": ("dparallel", {}),
    "mdlm": ("mdlm", {}),  # SFT on the task's real answers: reads no teacher output
}
# Student states need a mask left in the block after the student's step: a 2-token student step.
STUDENT = {"student_state_ratio": 0.5, "tokens_per_step": 2}
MAIN: dict[str, tuple[str, dict[str, Any]]] = {
    **OBJECTIVES,
    "t3d_rollout": ("t3d", {**RECOMMENDED, **STUDENT, "student_state_labels": "rollout"}),
    "t3d_student": ("t3d", {**RECOMMENDED, **STUDENT}),  # argmax labels: not run by default
}
# The teacher and the five objectives of the study. mdlm (SFT) is not a default variant: 25-29 points below every
# distillation objective at TokPS 4 on wordsort (`--variants teacher mdlm` runs it). The paper's T3D setting and
# t3d_rollout were measured once at their plateau (3,840 steps with 32,000 trajectories on wordsort, where both
# meet the rule: docs/method_study.md) and are run with `--variants`; `--quick` runs them too.
DEFAULT_VARIANTS = ["teacher", "t3d", "ddo", "td", "redi", "dparallel"]
QUICK_VARIANTS = [*DEFAULT_VARIANTS, "t3d_paper", "t3d_rollout"]
# Path weights need a student budget below the block: at TokPS 4 on blocks of 4, B = 1 and every weight is 1.
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "t3d_tokps2_uniform": ("t3d", {**RECOMMENDED, "tokens_per_step": 2}),
    "t3d_tokps2_early": ("t3d", {**RECOMMENDED, "tokens_per_step": 2, "path_weighting": "early"}),
    "t3d_tokps2_late": ("t3d", {**RECOMMENDED, "tokens_per_step": 2, "path_weighting": "late"}),
    "t3d_argmax": ("t3d", {**RECOMMENDED, "fake_estimator": "argmax"}),
    "t3d_beta0.1": ("t3d", {**RECOMMENDED, "beta": 0.1}),
    "t3d_reference_states": ("t3d", {**RECOMMENDED, "state_sampling": "reference"}),
    "t3d_lambda0.2": ("t3d", {**RECOMMENDED, "lambda_path": 0.2}),
}
BASELINES = ("td", "redi", "ddo", "dparallel")
# The study's protocol per task (docs/method_study.md, "What the defaults follow"): the number of trajectories and
# steps of the reported runs, the budget of the tuning runs, and what the tuning seed chose there: each objective's
# learning rate and the teachers' trajectory temperature. Variants not named use the rate of the objective they
# extend (t3d).
TUNED: dict[str, dict[str, Any]] = {
    # Converged but for DDO at its retuned rate: with 32,000 trajectories whole runs of 3,840 -> 7,680 steps gain at
    # most 0.97 at TokPS 4 at the first rates (TD's), and at these 0.7 or less for every objective but DDO, whose 1e-3
    # gains 1.3 (every seed; 0.8 at its first 3e-3), and 1.4 again from 7,680 to 15,360 (dParallel 1.0, TD 0.6, T3D
    # and ReDi 0.4 there: doubling the default would not meet the rule either). Trajectories at temperature 0.1 (seed
    # 100, first grid: 91.19 on average against 90.97 greedy and 89.83 at 1.0, a tie by any standard error). Rates:
    # tuned again at 32,000 trajectories and 3,840 steps (t3d 3e-3 -> 1e-3, td 1e-3 -> 3e-3, ddo 3e-3 -> 1e-3;
    # dparallel and redi keep theirs); t3d_paper and mdlm (mdlm reads no teacher output) keep their first-grid choice.
    # benchmarks/protocols/wordsort_32000_first.json holds the rates of the first converged comparison.
    "wordsort": {
        "learning_rates": {
            "t3d": 1e-3,
            "t3d_paper": 1e-3,
            "ddo": 1e-3,
            "td": 3e-3,
            "redi": 1e-3,
            "dparallel": 3e-3,
            "mdlm": 1e-3,
        },
        "trajectory_temperature": 0.1,
        "num_trajectories": 32000,
        "distill_steps": 7680,
        "tuning_steps": 3840,
    },
    # Not converged at any budget measured: 3,840 steps with 32,000 trajectories (with 2,000 the trajectory
    # objectives lose 17-20 points of the teacher's full step there) still gains 6.9-10.5 points at TokPS 4
    # over the whole 1,920-step runs, 7,680 steps (all five objectives) 5.0-6.2 over the whole 3,840-step
    # runs, and 15,360 steps (T3D 3.3, dParallel 7.5) over those: the default stays at 3,840, as no doubling
    # measured meets the rule. Rates and temperature: the choice at 2,000 trajectories and 960 steps (1e-2 for
    # every objective, 3e-2 worse for each; greedy, 32.37 against 31.59 at 0.1 and 15.25 at 1.0, and at 32,000
    # trajectories and the rates below 46.68 against 44.49 at 0.1 and 20.76 at 1.0), but for the rates, tuned
    # again at 32,000 trajectories and 3,840 steps (1e-3 to 3e-2): t3d, td, ddo and redi 1e-2 -> 3e-3, dparallel
    # keeps 1e-2 (3e-2 lower); t3d_paper and mdlm (SFT, reads no teacher output) keep their first-grid choice.
    # On the reported seeds the new rates moved TokPS 4 by +0.1 to -2.7 against 1e-2 (a one-seed choice among
    # near-ties); the protocol keeps the tuning seed's choice.
    # benchmarks/protocols/wordset_32000_first.json holds the rates of the first comparisons.
    "wordset": {
        "learning_rates": {
            **dict.fromkeys(OBJECTIVES, 3e-3),
            "dparallel": 1e-2,
            "t3d_paper": 1e-2,
            "mdlm": 1e-3,
        },
        "trajectory_temperature": 0.0,
        "num_trajectories": 32000,
        "distill_steps": 3840,
        "tuning_steps": 3840,
    },
}


def task_protocol(task: str, path: str | None = None) -> dict[str, Any]:
    """The task's protocol (``TUNED``) with the keys of the JSON file at ``path`` over it: a ``--tune`` choice
    (``tuning_seed<S>.json``: rates and temperature), or an earlier protocol with its budget and default variants
    too (``benchmarks/protocols/``: the study's first runs, with 2,000 trajectories)."""
    protocol = dict(TUNED[task])
    if path:
        found = json.loads(Path(path).read_text())
        if not isinstance(found, dict):
            raise ValueError(f"expected a JSON object of protocol keys, found {type(found).__name__}")
        if found.get("task", task) != task:
            raise ValueError(f"a protocol of task {found['task']!r}, not {task!r}")
        # a grid of some objectives (--tune_objectives) leaves the others at the task's rates
        protocol |= {
            **found,
            "learning_rates": {**protocol["learning_rates"], **found.get("learning_rates", {})},
        }
    return protocol


def default_checkpoints(protocol: dict[str, Any], tune: bool) -> list[int]:
    """The steps a run of the task's protocol is evaluated at: 60 doubled up to its budget (the learning curve),
    or for a tuning run half the tuning budget and the budget (the score is taken at the last)."""
    if tune:
        return [protocol["tuning_steps"] // 2, protocol["tuning_steps"]]
    points, step = [], 60
    while step < protocol["distill_steps"]:
        points.append(step)
        step *= 2
    return [*points, protocol["distill_steps"]]


@dataclasses.dataclass(frozen=True)
class Job:
    """One model to train and evaluate: a variant at a learning rate and trajectory temperature, for a seed."""

    name: str
    seed: int
    method: str  # loss_type, or "teacher"
    settings: dict[str, Any]
    learning_rate: float
    temperature: float
    folder: str  # results/seed<S> or tuning/seed<S>, under the output directory
    budget: int | None = (
        None  # a whole run of this many steps evaluated at its end, instead of the curve's run
    )

    def path(self, output: Path) -> Path:
        return output / self.folder / f"{self.name}.json"

    def checkpoints(self, context: dict[str, Any]) -> list[int]:
        """The steps its run is evaluated at: its own budget for a whole run, else the study's checkpoints."""
        return [self.budget] if self.budget else context["checkpoints"]


def objective_of(name: str) -> str:
    """The tuned objective a variant extends (``t3d_rollout`` -> ``t3d``)."""
    return name if name in OBJECTIVES else "t3d"


def reads_teacher(method: str) -> bool:
    return method != "mdlm"


def real_data(task, rows: list[dict]) -> Dataset:
    """The SFT baseline's data: the training prompts with the task's own (valid, uniformly drawn) answers."""
    tokenizer = task.tokenizer()
    return Dataset.from_list(
        [
            {
                "prompt_ids": tokenizer(r["prompt"], add_special_tokens=False).input_ids,
                "completion_ids": tokenizer(r["answer"], add_special_tokens=False).input_ids,
            }
            for r in rows
        ]
    )


def training_budget(base: QuickstartConfig) -> dict[str, Any]:
    """The data a trained result records it was trained on: the number of trajectories and the batch size."""
    return {"num_trajectories": base.num_trajectories, "batch_size": base.batch_size}


def recorded_settings(job: Job, base: QuickstartConfig, teacher_weights: str) -> dict[str, Any]:
    """How ``job`` is measured, as its result records it; a rerun reuses a result only where they match."""
    settings = {
        "learning_rate": job.learning_rate,
        "trajectory_temperature": job.temperature if reads_teacher(job.method) else None,
        # the held-out prompts are drawn from the seed, the training prompts and this count
        "num_eval": base.num_eval,
        # the teacher by its weights (weights_fingerprint), not its path: a moved or copied teacher is the same
        "teacher_weights": teacher_weights,
    }
    if job.method != "teacher":
        settings |= training_budget(base)
    return settings


def differences(found: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """Where the result ``found`` on disk was measured otherwise than ``asked``, one line per field. Fields an
    older result lacks are not checked."""
    return [
        f"{key} {found[key]} (asked {value})"
        for key, value in asked.items()
        if found.get(key, value) != value
    ]


def collected_teacher(output: Path, seed: int) -> str | None:
    """The teacher's fingerprint that ``seed``'s trajectory collections in ``output`` record (each
    ``collection.json`` holds the weights of the teacher that decoded it): the teacher of a result written before
    results recorded their own. None when no collection records one."""
    for manifest in sorted((output / f"seed{seed}").glob("*/trajectories/collection.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return json.loads(manifest.read_text())["teacher_weights"]
    return None


def with_recorded_teacher(found: dict[str, Any], output: Path, seed: int) -> dict[str, Any]:
    """``found`` with the teacher it was measured with: its own record, else its folder's collections'."""
    if "teacher_weights" not in found and (teacher := collected_teacher(output, seed)) is not None:
        return {**found, "teacher_weights": teacher}
    return found


def measure(grid, name: str) -> dict[str, Any]:
    """Accuracy (%) per static budget (keys: TokPS as strings), dynamic accuracy and its mean NFE."""
    out: dict[str, Any] = {"tokps": {}}
    for entry in grid.results:
        if entry["model"] != name:
            continue
        setting, metrics = entry["setting"], entry["metrics"]
        if setting.get("threshold") is not None:
            out["dynamic"] = round(100 * metrics["accuracy"], 2)
            out["dynamic_nfe"] = round(metrics["mean_nfe"], 2)
        else:
            out["tokps"][str(setting["tokens_per_step"])] = round(100 * metrics["accuracy"], 2)
    return out


def trajectories_dir(output: Path, seed: int, temperature: float) -> Path:
    return output / f"seed{seed}" / ("greedy" if temperature == 0 else f"temperature{temperature:g}")


@contextlib.contextmanager
def collection_lock(output: Path, shared: bool) -> Iterator[None]:
    """The lock over ``output``'s collections: exclusive to collect, shared to read. ``collect`` on a finished
    collection merges its shards and moves a fresh save of the dataset into place file by file, so a read must not
    overlap another process's collection."""
    with open(output / ".collect.lock", "w") as lock:  # closing the file releases the lock
        fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield


def load_trajectories(output: Path, seed: int, temperature: float) -> Dataset:
    """Read back a collection that :func:`run` made."""
    with collection_lock(output, shared=True):
        return load_from_disk(str(trajectories_dir(output, seed, temperature) / "trajectories"))


# ------------------------------------------------------------------------------------------------ running
_TEACHER: dict[str, torch.nn.Module] = {}  # per process: the teacher, loaded once


def _teacher(path: str, device: str) -> torch.nn.Module:
    if path not in _TEACHER:
        _TEACHER[path] = AutoModelForDiffusionLM.from_pretrained(path).eval().to(device)
    return _TEACHER[path]


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Hold the job whose result goes to ``path`` for the block: False when another process (or worker) holds it,
    or has written its result meanwhile. Several processes, on CPUs or GPUs, can so share one job list and one
    output folder. The claim is a lock on ``<result>.claim``, which the kernel releases when its holder dies,
    however it dies (a killed worker, a crash), so a restarted study runs the job again instead of skipping it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    claim = path.with_suffix(".claim")
    with open(claim, "a") as handle:  # closing the file releases the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            # a holder writes its result before it lets go, so whoever gets the lock next sees it
            yield not path.exists()
        finally:
            claim.unlink(missing_ok=True)


def held_elsewhere(path: Path) -> bool:
    """Whether another live process holds the claim of the job whose result goes to ``path``."""
    with contextlib.suppress(FileNotFoundError), open(path.with_suffix(".claim")) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def run_job(job: Job, context: dict[str, Any]) -> dict[str, Any] | None:
    """Train ``job``'s model (evaluating it at every checkpoint) or evaluate the teacher; write its result.

    Returns None when the result is on disk already or another process has claimed the job."""
    path = job.path(Path(context["output"]))
    if path.exists():
        return None
    with claimed(path) as mine:
        return _measure_job(job, context, path) if mine else None


def _measure_job(job: Job, context: dict[str, Any], path: Path) -> dict[str, Any]:
    torch.set_num_threads(context["threads"])
    task, output = get_task(context["task"]), Path(context["output"])
    config = dataclasses.replace(context["base"], seed=job.seed, trajectory_temperature=job.temperature)
    teacher = _teacher(context["teacher"], context["device"])
    train_rows, eval_rows = split_rows(task, config)
    work = output / job.folder.replace("/", "-") / job.name
    start = time.perf_counter()
    result: dict[str, Any] = {
        "name": job.name,
        "loss_type": job.method,
        "settings": job.settings,
        "seed": job.seed,
        **recorded_settings(job, config, context["teacher_weights"]),
        "teacher": context["teacher"],  # for the reader; the check reads the weights
    }
    if job.method == "teacher":
        work.mkdir(parents=True, exist_ok=True)
        result |= measure(
            evaluate({job.name: teacher}, task, eval_rows, config, work, progress=False), job.name
        )
    else:
        fields = {f.name for f in dataclasses.fields(QuickstartConfig)}
        demo = {k: v for k, v in job.settings.items() if k in fields}
        trainer = {k: v for k, v in job.settings.items() if k not in fields}
        if job.method == "mdlm":
            data = real_data(task, train_rows)
        else:
            data = load_trajectories(output, job.seed, job.temperature)
        checkpoints = job.checkpoints(context)

        def at_checkpoint(model: torch.nn.Module, step: int) -> dict[str, Any]:
            folder = work / f"step{step}"
            folder.mkdir(parents=True, exist_ok=True)
            return measure(
                evaluate({job.name: model}, task, eval_rows, config, folder, progress=False), job.name
            )

        curve = EvaluateAtSteps(checkpoints, at_checkpoint)
        distill(
            job.method,
            teacher,
            data,
            task,
            dataclasses.replace(
                config, distill_steps=max(checkpoints), learning_rate=job.learning_rate, **demo
            ),
            work,
            callbacks=[curve],
            disable_tqdm=True,
            torch_compile=context["torch_compile"],
            **trainer,
        )
        if curve.missing():
            raise RuntimeError(f"{job.name}: no evaluation at steps {curve.missing()}")
        result |= curve.results[max(checkpoints)]  # the final model is the last checkpoint
        result["curve"] = {str(step): curve.results[step] for step in checkpoints}
        result["steps"] = max(checkpoints)
        result["torch_compile"] = context["torch_compile"]
    result["total_s"] = round(time.perf_counter() - start, 1)
    result["device"] = context["device"]
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2))
    partial.rename(path)  # atomic: a result on disk is always whole
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
    return result


def mismatches(job: Job, context: dict[str, Any]) -> list[str]:
    """How the result on disk for ``job`` was measured differently from what this command asks (empty when it
    matches or is not there): reusing it would silently mix budgets."""
    output = Path(context["output"])
    path = job.path(output)
    if not path.exists():
        return []
    found = with_recorded_teacher(json.loads(path.read_text()), output, job.seed)
    asked = {
        **recorded_settings(job, context["base"], context["teacher_weights"]),
        "checkpoints": job.checkpoints(context),
    }
    if "curve" in found:
        found["checkpoints"] = sorted(int(step) for step in found["curve"])
    lines = differences({k: v for k, v in found.items() if k != "teacher_weights"}, asked)
    if found.get("teacher_weights", asked["teacher_weights"]) != asked["teacher_weights"]:
        # name both teachers: the fingerprints alone do not say which is which
        lines.append(
            f"teacher {found.get('teacher', 'of its trajectories')} (weights {found['teacher_weights'][:12]}; "
            f"asked {context['teacher']}, weights {asked['teacher_weights'][:12]})"
        )
    return lines


def exit_with_parent() -> None:
    """Pool initializer: the worker exits as soon as the study's process dies (its job's claim goes with it, so a
    restarted study runs the job again). A pool's workers are otherwise only stopped by the parent's clean exit, so
    a killed study (``kill``, ``pkill -f``) left them training for many minutes on the cores a restart needs."""
    parent = multiprocessing.parent_process()

    def watch() -> None:
        parent.join()  # returns when the parent's end of the pipe closes, however it died
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_job(args: tuple[Job, dict[str, Any]]) -> str | None:
    """A pool worker's job: the traceback of a failure is returned (and printed), not raised, so that one
    failing model does not stop the others."""
    try:
        run_job(*args)
    except Exception:
        message = f"{args[0].folder}/{args[0].name} failed:\n{traceback.format_exc()}"
        print(message, flush=True)
        return message
    return None


def run(jobs: list[Job], context: dict[str, Any], workers: int) -> None:
    """Run every job not yet on disk, ``workers`` at a time; the trajectories are collected here first (under a
    lock, so that processes sharing the output folder collect each set once)."""
    output = Path(context["output"])
    stale = [
        f"  {job.folder}/{job.name}.json: {', '.join(diff)}"
        for job in jobs
        if (diff := mismatches(job, context))
    ]
    if stale:
        raise SystemExit(
            "results in --output_dir were measured with other settings than this command asks for:\n"
            + "\n".join(stale)
            + "\nuse another --output_dir, or delete those files to measure them again"
        )
    todo = [job for job in jobs if not job.path(output).exists()]
    if not todo:
        return
    task = get_task(context["task"])
    teacher = _teacher(context["teacher"], context["device"])
    with collection_lock(output, shared=False):
        for seed, temperature in dict.fromkeys(
            (j.seed, j.temperature) for j in todo if j.method != "teacher" and reads_teacher(j.method)
        ):
            config = dataclasses.replace(context["base"], seed=seed, trajectory_temperature=temperature)
            rows = split_rows(task, config)[0]
            try:
                collect(teacher, task, rows, config, trajectories_dir(output, seed, temperature))
            except ValueError as error:  # a collection of another teacher or settings: the message says what
                raise SystemExit(f"cannot collect the trajectories of seed {seed}: {error}") from None
    if workers <= 1:
        failures = [_run_job((job, context)) for job in todo]
    else:
        with multiprocessing.get_context("spawn").Pool(workers, exit_with_parent, maxtasksperchild=4) as pool:
            failures = list(pool.imap_unordered(_run_job, [(job, context) for job in todo]))
    failures = [f for f in failures if f]
    elsewhere = [j.name for j in todo if not j.path(output).exists() and held_elsewhere(j.path(output))]
    if elsewhere:
        print(f"claimed by another process, not run here (it writes their results): {elsewhere}")
    if failures:
        raise SystemExit(f"{len(failures)} job(s) failed:\n" + "\n".join(failures))


def main_jobs(
    names: list[str],
    seeds: list[int],
    tuned: dict[str, Any],
    lr: float | None,
    temperature: float | None,
    half_budget: int | None = None,
) -> list[Job]:
    """The jobs of ``names`` x ``seeds``; with ``half_budget``, also a whole run (its own schedule) of that many
    steps per trained model: the doubling test of the plateau rule."""
    temperature = tuned["trajectory_temperature"] if temperature is None else temperature
    jobs = []
    for name in names:
        for seed in seeds:
            if name == "teacher":
                jobs.append(Job(name, seed, "teacher", {}, 0.0, 0.0, f"results/seed{seed}"))
                continue
            method, settings = {**MAIN, **ABLATIONS}[name]
            rate = lr if lr is not None else tuned["learning_rates"][objective_of(name)]
            temp = temperature if reads_teacher(method) else 0.0
            jobs.append(Job(name, seed, method, settings, rate, temp, f"results/seed{seed}"))
            if half_budget:
                label = f"{name}_steps{half_budget}"
                jobs.append(
                    Job(label, seed, method, settings, rate, temp, f"results/seed{seed}", half_budget)
                )
    return jobs


def tuning_jobs(seed: int, objectives: list[str], rates: list[float], temperatures: list[float]) -> list[Job]:
    """The grid, temperature by temperature (in the order given: a grid cut short holds whole temperatures)."""
    jobs = [Job("teacher", seed, "teacher", {}, 0.0, 0.0, f"tuning/seed{seed}")]
    for temperature in temperatures:
        for rate in rates:
            for name in objectives:
                method, settings = OBJECTIVES[name]
                if temperature == 0 or reads_teacher(method):
                    label = f"{name}_lr{rate:g}_T{temperature:g}"
                    jobs.append(Job(label, seed, method, settings, rate, temperature, f"tuning/seed{seed}"))
    return jobs


# ------------------------------------------------------------------------------------------------ summaries
def load(output: Path, folder: str, name: str) -> dict[str, Any] | None:
    path = output / folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def score(result: dict[str, Any]) -> float:
    """The tuning rule (fixed before any tuning result was seen): mean accuracy at TokPS 2 and 4."""
    return (result["tokps"]["2"] + result["tokps"]["4"]) / 2


def tuning_results(output: Path, seed: int, context: dict[str, Any]) -> dict[tuple[str, float, float], Any]:
    """Every tuning result of ``seed`` on disk that was measured as this command measures (the same number of steps,
    trajectories, batch size, held-out prompts and teacher): (objective, learning rate, temperature) -> result.
    The choice reads all of them, so a run of part of the grid (more rates, another objective) extends the earlier
    choice instead of replacing it with a choice over its own part."""
    base, steps = context["base"], max(context["checkpoints"])
    asked = {
        **training_budget(base),
        "num_eval": base.num_eval,
        "teacher_weights": context["teacher_weights"],
    }
    rows = {}
    for path in sorted((output / f"tuning/seed{seed}").glob("*_lr*_T*.json")):
        result = with_recorded_teacher(json.loads(path.read_text()), output, seed)
        name = path.stem.rsplit("_lr", 1)[0]
        if name not in OBJECTIVES or result["steps"] != steps or differences(result, asked):
            continue
        rows[(name, result["learning_rate"], result["trajectory_temperature"] or 0.0)] = result
    order = list(OBJECTIVES)
    return dict(sorted(rows.items(), key=lambda row: (order.index(row[0][0]), row[0][2], -row[0][1])))


def choose(output: Path, seed: int, context: dict[str, Any]) -> dict[str, Any]:
    """The tuning table and the choice, over every comparable tuning result on disk (``tuning_results``): the
    temperature whose best-rate scores, among the rates measured at every temperature, are highest on average over
    the objectives that read the teacher (of the temperatures measured for all of them), then each objective's best
    rate at that temperature, among all the rates measured there."""
    teacher = load(output, f"tuning/seed{seed}", "teacher")
    rows = tuning_results(output, seed, context)
    objectives = [n for n in OBJECTIVES if any(key[0] == n for key in rows)]
    temperatures = sorted({key[2] for key in rows})

    def rates(name: str, temperature: float) -> set[float]:
        return {rate for (n, rate, t) in rows if n == name and t == temperature}

    def best_rate(name: str, temperature: float, among: set[float] | None = None) -> float | None:
        found = [(score(rows[(name, rate, temperature)]), rate) for rate in rates(name, temperature)]
        found = [(s, rate) for s, rate in found if among is None or rate in among]
        return max(found)[1] if found else None

    # Temperatures are compared at the rates measured at all of them, so that a grid extended at one temperature
    # (more rates tried there) does not favour it.
    readers = [n for n in objectives if reads_teacher(OBJECTIVES[n][0])]
    common = {n: set.intersection(*(rates(n, t) for t in temperatures if rates(n, t))) for n in readers}
    by_temperature = {}
    for temperature in temperatures:
        best = [best_rate(n, temperature, common[n]) for n in readers]
        # no objective that reads the teacher (mdlm alone): no temperature to choose
        if readers and all(rate is not None for rate in best):
            by_temperature[temperature] = statistics.fmean(
                score(rows[(n, rate, temperature)]) for n, rate in zip(readers, best)
            )
    chosen_t = max(by_temperature, key=by_temperature.get) if by_temperature else None
    rates_chosen = {n: best_rate(n, chosen_t if reads_teacher(OBJECTIVES[n][0]) else 0.0) for n in objectives}
    header = ["objective", "lr", "T", "TokPS 1", "TokPS 2", "TokPS 4", "dynamic 0.9", "NFE", "score"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if teacher:
        cells = ["teacher", "", "", *[f"{teacher['tokps'][k]:.1f}" for k in ("1", "2", "4")]]
        table.append(
            "| "
            + " | ".join([*cells, f"{teacher['dynamic']:.1f}", f"{teacher['dynamic_nfe']:.2f}", ""])
            + " |"
        )
    for (name, rate, temperature), r in rows.items():
        mark = (
            "**"
            if rates_chosen.get(name) == rate
            and (temperature == chosen_t or not reads_teacher(OBJECTIVES[name][0]))
            else ""
        )
        cells = [name, f"{rate:g}", f"{temperature:g}", *[f"{r['tokps'][k]:.1f}" for k in ("1", "2", "4")]]
        cells += [f"{r['dynamic']:.1f}", f"{r['dynamic_nfe']:.2f}", f"{mark}{score(r):.2f}{mark}"]
        table.append("| " + " | ".join(cells) + " |")
    text = "\n".join(table)
    print(text)
    base = context["base"]
    choice = {
        # the task and budget the choice was made at: --tuning_file refuses it for another task
        "task": context["task"],
        "tuning_budget": {
            "steps": max(context["checkpoints"]),
            **training_budget(base),
            "num_eval": base.num_eval,
        },
        "tuning_seed": seed,
        "trajectory_temperature": chosen_t,
        "mean_best_score_by_temperature": {f"{t:g}": round(s, 2) for t, s in by_temperature.items()},
        "learning_rates": rates_chosen,
        "measured": len(rows),
    }
    if chosen_t is None:  # nothing read the teacher: a --tuning_file of this choice keeps the protocol's
        del choice["trajectory_temperature"]
    (output / f"tuning_seed{seed}.md").write_text(text + "\n")
    (output / f"tuning_seed{seed}.json").write_text(json.dumps(choice, indent=2))
    return choice


def plot_curves(
    path: Path,
    teacher: list[dict],
    series: dict[str, dict[int, list[dict]]],
    task: str,
    seeds: list[int],
    xlabel: str,
) -> None:
    """Accuracy against steps, one panel per budget: ``series`` maps a model to {steps: its evaluation per seed}
    (each with ``tokps`` and ``dynamic``), the teacher is the dashed line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (matplotlib is in the dev/analysis extras)
        return

    def value(r: dict, key: str | None) -> float:
        return r["tokps"][key] if key else r["dynamic"]

    panels = [("TokPS 1", "1"), ("TokPS 2", "2"), ("TokPS 4", "4"), ("dynamic 0.9", None)]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharex=True)
    for ax, (title, key) in zip(axes, panels):
        ax.axhline(
            statistics.fmean(value(r, key) for r in teacher), color="black", linestyle="--", label="teacher"
        )
        for name, points in series.items():
            steps = sorted(points)
            curve = [[value(r, key) for r in points[s]] for s in steps]
            means = [statistics.fmean(c) for c in curve]
            stds = [mean_std(c)[1] for c in curve]
            ax.errorbar(steps, means, yerr=stds, marker="o", markersize=3, capsize=2, label=name)
        ax.set_xscale("log", base=2)
        ticks = sorted({s for points in series.values() for s in points})
        ax.set_xticks(ticks, [str(s) for s in ticks], fontsize=7)
        ax.set_title(f"{task}: {title}")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(f"exact match (%), mean ± std over seeds {seeds}")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def whole_runs(output: Path, seeds: list[int], name: str, main: list[dict]) -> dict[int, list[dict]]:
    """Every budget at which ``name`` has a whole run (its own schedule) on every seed: the main runs and the
    ``<name>_steps<K>`` runs on disk (from ``--plateau_runs``, or copied in from the study of that budget)."""
    runs = {main[0]["steps"]: main}
    for path in sorted((output / f"results/seed{seeds[0]}").glob(f"{name}_steps*.json")):
        budget = path.stem.removeprefix(f"{name}_steps")
        if budget.isdigit() and int(budget) not in runs:  # the main run is the run of its own budget
            found = [load(output, f"results/seed{s}", path.stem) for s in seeds]
            if all(found):
                runs[int(budget)] = found
    return dict(sorted(runs.items()))


def summarise(output: Path, seeds: list[int], variants: list[str], task: str, ablation_seed: int | None):
    """The Markdown tables, the learning-curve plot and the final JSON (means over ``seeds``)."""
    names = [n for n in variants if all(load(output, f"results/seed{s}", n) is not None for s in seeds)]
    rows = {n: [load(output, f"results/seed{s}", n) for s in seeds] for n in names}
    if "teacher" not in names:
        raise SystemExit(f"no teacher results for seeds {seeds}: run the study first")
    incomplete = [n for n in variants if n not in names]

    def acc(name: str, k: str) -> list[float]:
        return [r["tokps"][k] if k != "dynamic" else r["dynamic"] for r in rows[name]]

    def m(name: str, k: str) -> float:
        return statistics.fmean(acc(name, k))

    header = [
        "model",
        "lr",
        "TokPS 1",
        "TokPS 2",
        "TokPS 4",
        "dynamic 0.9",
        "dynamic NFE",
        "TokPS 1 - teacher",
        "s",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [name, f"{rows[name][0]['learning_rate']:g}" if name != "teacher" else ""]
        for k in ("1", "2", "4", "dynamic"):
            mean, std = mean_std(acc(name, k))
            cells.append(f"{mean:.1f} ± {std:.1f}")
        cells.append(f"{statistics.fmean(r['dynamic_nfe'] for r in rows[name]):.2f}")
        cells.append(f"{m(name, '1') - m('teacher', '1'):+.1f}" if name != "teacher" else "")
        cells.append(f"{statistics.fmean(r['total_s'] for r in rows[name]):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    students = [n for n in names if n != "teacher"]
    # Each model's own checkpoints (those of every seed): models of one folder may have been run with others.
    own = {n: sorted(set.intersection(*({int(s) for s in r["curve"]} for r in rows[n]))) for n in students}
    steps = sorted(set().union(*own.values()))
    lasts = sorted({own[n][-1] for n in students if own[n]})
    doubling = f"{lasts[0] // 2} -> {lasts[0]}" if len(lasts) == 1 else "N/2 -> N"
    curve_lines = [
        "| model | "
        + " | ".join(f"{s} steps" for s in steps)
        + f" | last doubling along the run | whole runs of {doubling} steps |",
        "|---|" + "---|" * (len(steps) + 2),
    ]
    whole = {n: whole_runs(output, seeds, n, rows[n]) for n in students}
    whole_tokps4 = {
        n: {k: statistics.fmean(r["tokps"]["4"] for r in runs) for k, runs in whole[n].items()}
        for n in students
    }
    gains, along = {}, {}
    for name in students:
        means = {s: statistics.fmean(r["curve"][str(s)]["tokps"]["4"] for r in rows[name]) for s in own[name]}
        last = own[name][-1] if own[name] else None
        along[name] = round(means[last] - means[own[name][-2]], 2) if len(means) > 1 else None
        # the plateau rule's doubling: whole runs of N/2 and N steps, each with its own schedule
        if last and last // 2 in whole_tokps4[name] and last in whole_tokps4[name]:
            gains[name] = round(whole_tokps4[name][last] - whole_tokps4[name][last // 2], 2)
        cells = [f"{means[s]:.1f}" if s in means else "" for s in steps]
        cells.append(f"{along[name]:+.1f}" if along[name] is not None else "")
        cells.append(f"{gains[name]:+.1f}" if name in gains else "not run")
        curve_lines.append("| " + " | ".join([name, *cells]) + " |")
    along_run = {n: {s: [r["curve"][str(s)] for r in rows[n]] for s in own[n]} for n in students}
    plot_curves(output / f"curves_{task}.png", rows["teacher"], along_run, task, seeds, "optimizer steps")
    budgets = sorted({k for runs in whole.values() for k in runs})
    whole_lines = [
        "| model | " + " | ".join(f"{k} steps" for k in budgets) + " |",
        "|---|" + "---|" * len(budgets),
    ]
    for name in students:
        cells = [f"{whole_tokps4[name][k]:.1f}" if k in whole_tokps4[name] else "" for k in budgets]
        whole_lines.append("| " + " | ".join([name, *cells]) + " |")
    if len(budgets) > 1:  # the learning curve of the plateau rule: each point a run with its own schedule
        plot_curves(
            output / f"whole_runs_{task}.png", rows["teacher"], whole, task, seeds, "steps of the whole run"
        )

    ablation_lines = []
    if ablation_seed is not None:
        header = [f"variant (seed {ablation_seed})", "TokPS 1", "TokPS 2", "TokPS 4", "dynamic 0.9"]
        ablation_lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for name in ("teacher", "t3d", *ABLATIONS):
            r = load(output, f"results/seed{ablation_seed}", name)
            if r is not None:
                cells = [f"{r['tokps'][k]:.1f}" for k in ("1", "2", "4")]
                ablation_lines.append("| " + " | ".join([name, *cells, f"{r['dynamic']:.1f}"]) + " |")

    def diff(a: str, b: str, k: str) -> float | None:
        return round(m(a, k) - m(b, k), 2) if a in names and b in names else None

    baselines = [b for b in BASELINES if b in names]
    best = {k: max(baselines, key=lambda b: m(b, k)) if baselines else None for k in ("2", "4")}
    best_student = max(students, key=lambda n: m(n, "4")) if students else None
    valid_along = [g for g in along.values() if g is not None]
    summary = {
        "task": task,
        "teacher_drop_tokps4": round(m("teacher", "1") - m("teacher", "4"), 2),
        "t3d_minus_best_baseline_tokps2": diff("t3d", best["2"], "2") if best["2"] else None,
        "t3d_minus_best_baseline_tokps4": diff("t3d", best["4"], "4") if best["4"] else None,
        "best_baseline": {k: v for k, v in best.items()},
        "baselines_measured": baselines,
        "t3d_full_step_minus_teacher": diff("t3d", "teacher", "1"),
        "t3d_rollout_minus_t3d_tokps2": diff("t3d_rollout", "t3d", "2"),
        "t3d_rollout_minus_t3d_tokps4": diff("t3d_rollout", "t3d", "4"),
        "recommended_t3d": {"loss_type": "t3d", **RECOMMENDED},
        "distill_steps": steps[-1] if steps else None,
        "checkpoints": steps,
        "learning_rates": {n: rows[n][0]["learning_rate"] for n in students},
        "trajectory_temperature": next(
            (
                rows[n][0]["trajectory_temperature"]
                for n in students
                if rows[n][0]["trajectory_temperature"] is not None
            ),
            None,
        ),
        "num_trajectories": next(
            (rows[n][0]["num_trajectories"] for n in students if "num_trajectories" in rows[n][0]), None
        ),
        # the last doubling along the one (cosine) run: more steps AND the annealing of the learning rate
        "plateau_gain_tokps4": max(valid_along) if valid_along else None,
        "plateau_gain_by_model": along,
        # with --plateau_runs: whole runs of N/2 and N steps, each with its own schedule
        "plateau_gain_whole_runs_tokps4": max(gains.values())
        if gains and len(gains) == len(students)
        else None,
        "plateau_gain_whole_runs_by_model": gains,
        "whole_runs_tokps4": {n: {str(k): round(v, 2) for k, v in whole_tokps4[n].items()} for n in students},
        "best_objective_tokps4": best_student,
        "best_student_tokps4_minus_teacher_tokps1": round(m(best_student, "4") - m("teacher", "1"), 2)
        if best_student
        else None,
        "full_step_minus_teacher": {n: round(m(n, "1") - m("teacher", "1"), 2) for n in students},
        "t3d_dynamic_nfe_over_teacher": (
            round(
                statistics.fmean(r["dynamic_nfe"] for r in rows["t3d"])
                / statistics.fmean(r["dynamic_nfe"] for r in rows["teacher"]),
                3,
            )
            if "t3d" in names
            else None
        ),
        "incomplete": incomplete,
        "seeds": seeds,
    }
    text = "\n".join(lines) + "\n\nTokPS 4 along the run (mean over seeds):\n\n" + "\n".join(curve_lines)
    text += "\n\nTokPS 4 of whole runs, each with its own schedule (mean over seeds):\n\n" + "\n".join(
        whole_lines
    )
    (output / f"summary_{task}.md").write_text(text + "\n\n" + "\n".join(ablation_lines) + "\n")
    (output / f"summary_{task}.json").write_text(json.dumps(summary, indent=2))
    print(text)
    print("\n".join(ablation_lines))
    return summary


# ------------------------------------------------------------------------------------------------ main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=TASKS, default="wordsort")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help="main-comparison models, in run order; the teacher is always one (added first when not named)",
    )
    parser.add_argument("--teacher", default=None, help="default: the packaged teacher of the task")
    parser.add_argument("--output_dir", default=None, help="default: method-study-<task>")
    parser.add_argument(
        "--checkpoints",
        type=int,
        nargs="+",
        default=None,
        help="default: the task's protocol (TUNED), 60 doubled up to its distill_steps; with --tune half its "
        "tuning_steps and tuning_steps",
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=None, help="one rate for every objective")
    parser.add_argument("--trajectory_temperature", type=float, default=None, help="default: the tuned one")
    parser.add_argument(
        "--num_trajectories", type=int, default=None, help="default: the task's protocol (TUNED)"
    )
    parser.add_argument("--num_eval", type=int, default=1000)
    parser.add_argument(
        "--tuning_file",
        default=None,
        help="a JSON whose keys replace the task's protocol (TUNED): a tuning_seed<S>.json of --tune (the rates "
        "and temperature), or a file of benchmarks/protocols/ (an earlier protocol, its budget and variants too)",
    )
    parser.add_argument(
        "--plateau_runs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also a whole run of half the budget per model: the plateau rule on whole runs (1.5x the time)",
    )
    parser.add_argument("--tune", action="store_true", help="run the tuning grid on --tuning_seed instead")
    parser.add_argument("--tuning_seed", type=int, default=TUNING_SEED)
    parser.add_argument("--tune_objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--tune_learning_rates", type=float, nargs="+", default=list(LR_GRID))
    parser.add_argument("--tune_temperatures", type=float, nargs="+", default=list(TEMPERATURES))
    parser.add_argument("--ablation_seed", type=int, default=None, help="run the ablations on this seed")
    parser.add_argument("--summary_only", action="store_true", help="print the summary of results on disk")
    parser.add_argument(
        "--workers",
        type=int,
        default=usable_cpus(),
        help="models trained at once, one process each (default: one per available core)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--torch_compile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="train the students with torch.compile (transformers' torch_compile)",
    )
    tiny = {  # every stage on tiny budgets
        "seeds": [0],
        "ablation_seed": 0,
        "checkpoints": [1, 2],
        "tuning_seed": 1,
        "tune_learning_rates": [1e-3, 3e-4],
        "tune_temperatures": [0.0, 1.0],
        "tune_objectives": ["t3d", "mdlm"],
        "workers": max(parser.get_default("workers"), 2),  # the worker pool too
        "variants": QUICK_VARIANTS,
        "batch_size": 8,
        "num_trajectories": 16,
        "num_eval": 8,
    }
    args = parse_with_quick(
        parser,
        tiny,
        help="a freshly trained tiny teacher, and tiny defaults that flags given with it override",
    )
    if args.quick:
        given = [flag for flag in ("teacher", "output_dir") if getattr(args, flag) is not None]
        if given:  # --quick trains its own tiny teacher in a temporary folder: these would be ignored
            parser.error(f"--quick trains its own teacher in a temporary folder; drop --{given[0]}")
    try:  # a file that cannot be read is a usage error: one line, exit status 2
        args.protocol = task_protocol(args.task, args.tuning_file)
    except (OSError, ValueError) as error:
        parser.error(f"--tuning_file {args.tuning_file}: {error}")
    if (
        args.tune
        and 0 not in args.tune_temperatures
        and not any(reads_teacher(OBJECTIVES[name][0]) for name in args.tune_objectives)
    ):  # an objective that reads no trajectories is tuned at temperature 0 only: the grid would be empty
        parser.error(
            f"--tune_objectives {' '.join(args.tune_objectives)} read no teacher trajectories and are tuned at "
            "temperature 0 only: add 0 to --tune_temperatures"
        )
    args.variants = list(args.variants or args.protocol.get("variants", DEFAULT_VARIANTS))
    # every comparison is against the teacher: it is always measured (or its results read)
    if "teacher" not in args.variants:
        args.variants.insert(0, "teacher")
    unknown = [n for n in args.variants if n != "teacher" and n not in MAIN]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {['teacher', *MAIN]}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    protocol = args.protocol
    base = QuickstartConfig(
        task=args.task,
        batch_size=args.batch_size,
        num_trajectories=args.num_trajectories or protocol["num_trajectories"],
        num_eval=args.num_eval,
        analysis_prompts=32,
        analysis_samples=8,
    )
    scratch = None
    output = Path(args.output_dir or f"method-study-{args.task}")
    teacher = args.teacher or str(PACKAGED_TEACHERS / args.task)
    if args.quick:  # tiny budgets (parse_args), with a teacher trained here for a few steps
        scratch = tempfile.TemporaryDirectory()
        output = Path(scratch.name)
        base = dataclasses.replace(base, teacher_steps=2)
        train_teacher(get_task(args.task), base, output / "teacher")
        teacher = str(output / "teacher")
    output.mkdir(parents=True, exist_ok=True)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    context = {
        "task": args.task,
        "teacher": teacher,
        # what every result records and a rerun checks: the same path may hold another teacher, and vice versa
        "teacher_weights": weights_fingerprint(_teacher(teacher, device)),
        "output": str(output),
        "base": base,
        "checkpoints": sorted(set(args.checkpoints or default_checkpoints(protocol, args.tune))),
        "threads": args.threads,
        "device": device,
        "torch_compile": args.torch_compile,
    }
    variants = args.variants
    tuning = None
    if args.tune or args.quick:
        objectives = args.tune_objectives
        if not args.summary_only:
            jobs = tuning_jobs(args.tuning_seed, objectives, args.tune_learning_rates, args.tune_temperatures)
            run(jobs, context, args.workers)
        tuning = choose(output, args.tuning_seed, context)
    summary: dict[str, Any] = {}
    if not args.tune or args.quick:
        if not args.summary_only:
            half = max(context["checkpoints"]) // 2 if args.plateau_runs else None
            jobs = main_jobs(
                variants, args.seeds, protocol, args.learning_rate, args.trajectory_temperature, half
            )
            if args.ablation_seed is not None:
                jobs += main_jobs(
                    ["teacher", "t3d", *ABLATIONS],
                    [args.ablation_seed],
                    protocol,
                    args.learning_rate,
                    args.trajectory_temperature,
                )
            run(list({(j.folder, j.name): j for j in jobs}.values()), context, args.workers)
        summary = summarise(output, args.seeds, variants, args.task, args.ablation_seed)
    if tuning is not None:
        summary["tuning"] = tuning
    if not args.summary_only:
        summary["wall_s"] = round(time.perf_counter() - start)
    summary["budget"] = {  # as given on this command line (the results on disk record their own)
        "checkpoints": context["checkpoints"],
        "batch_size": base.batch_size,
        "num_trajectories": base.num_trajectories,
        "num_eval": base.num_eval,
        "workers": args.workers,
        "device": device,
    }
    if scratch is not None:
        scratch.cleanup()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
