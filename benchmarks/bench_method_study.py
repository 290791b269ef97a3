"""The method study in the paper's regime (docs/method_study.md): T3D against every baseline on ``wordsort``.

``wordsort`` is block-causal (an SDAR-like tiny Qwen3, block 4) with 32-token answers (8 blocks): the first block
fixes the order (ascending or descending) and every later block depends on the earlier ones. For every seed the
packaged teacher (``examples/train_demo_teacher.py --task wordsort``) decodes the training prompts one token per
step; each objective then distils a fresh copy of it on the SAME trajectories with the SAME optimizer steps, and
every model is evaluated on held-out prompts at TokPS 1, 2 and 4 and with dynamic decoding (threshold 0.9).

* Main comparison (``--seeds``, reported): the teacher; ``t3d`` in the recommended setting (``RECOMMENDED``);
  ``t3d_paper`` (the paper's T3D settings); ``ddo``, ``td``, ``redi``, ``dparallel`` and ``mdlm`` (SFT on the
  task's real answers); ``t3d_student``: the recommended T3D with half of the rows moved onto the student's own
  path (``student_state_ratio=0.5`` with 2-token student steps, the step beyond the paper).
* Ablations (``--ablation_seed``, a seed the report's means do not use): the teacher, the recommended T3D and T3D
  with ``path_weighting`` uniform / early / late (at a student budget of TokPS 2: at TokPS 4 a block of 4 is one
  step and every path weight is 1), ``fake_estimator`` argmax, ``beta`` 0.1, ``state_sampling`` reference,
  ``lambda_path`` 0.2.

Jobs run variant by variant over all seeds (``--variants`` sets which and in what order), so a study cut short
holds complete variants; the summary reports the complete ones and lists the others as incomplete.

Every (seed, model) result is written to ``OUTPUT/results/seed<S>/<name>.json`` as soon as it is measured and
reused on a rerun, so the study resumes, and several processes can share it (give them different ``--seeds``,
then run once more over all seeds to print the summary). The last line printed is one JSON object with the means
over ``--seeds``:

    python benchmarks/bench_method_study.py --seeds 0 1 2 --ablation_seed 100 --output_dir study
    python benchmarks/bench_method_study.py --quick   # seconds: a smoke run of every stage on tiny budgets
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from t3d_trl import AutoModelForDiffusionLM
from t3d_trl.demo.quickstart import (
    PACKAGED_TEACHERS,
    QuickstartConfig,
    analyze,
    collect,
    distill,
    evaluate,
    split_rows,
    train_teacher,
)
from t3d_trl.demo.tasks import get_task

TASK = "wordsort"
# The recommended T3D setting: the demo's DDO/path scales, uniform path weights (early tokens are not favoured:
# the sort2 measurement) and DDO's fake term as the exact expectation (the argmax is seed-fragile).
RECOMMENDED: dict[str, Any] = {"path_weighting": "uniform", "fake_estimator": "expectation"}
PAPER = {"beta": 0.1, "lambda_path": 0.2, "path_weighting": "early", "fake_estimator": "argmax"}
# name -> (loss_type, settings); QuickstartConfig fields and T3DConfig fields may be mixed.
MAIN: dict[str, tuple[str, dict[str, Any]]] = {
    "t3d": ("t3d", RECOMMENDED),
    "t3d_paper": ("t3d", PAPER),
    # The student's parallel step must leave a mask in the block: TokPS 2 (uniform path weights ignore it).
    "t3d_student": ("t3d", {**RECOMMENDED, "student_state_ratio": 0.5, "tokens_per_step": 2}),
    "ddo": ("ddo", {"fake_estimator": "expectation"}),
    "td": ("td", {}),
    "redi": ("redi", {}),
    "dparallel": ("dparallel", {}),
    "mdlm": ("mdlm", {}),
}
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


def measure(grid, name: str, base: QuickstartConfig, block: int) -> dict[str, Any]:
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


def run(
    jobs: list[tuple[str, int]],
    variants: dict[str, tuple[str, dict]],
    base: QuickstartConfig,
    teacher_path: str,
    output: Path,
    tc: bool,
) -> None:
    """Distil and evaluate every (variant, seed) of ``jobs`` not yet on disk, in that order.

    Results go to ``results/seed<S>/<name>.json``; trajectories are collected once per seed (and resumed).
    """
    task = get_task(TASK)
    todo = [(n, s) for n, s in jobs if not (output / "results" / f"seed{s}" / f"{n}.json").exists()]
    if not todo:
        return
    teacher = AutoModelForDiffusionLM.from_pretrained(teacher_path).eval()
    fields = {f.name for f in dataclasses.fields(QuickstartConfig)}
    per_seed: dict[int, tuple] = {}
    for name, seed in todo:
        config = dataclasses.replace(base, seed=seed)
        work = output / f"seed{seed}"
        if seed not in per_seed:
            train_rows, eval_rows = split_rows(task, config)
            per_seed[seed] = (train_rows, eval_rows, collect(teacher, task, train_rows, config, work))
        train_rows, eval_rows, trajectories = per_seed[seed]
        start = time.perf_counter()
        if name == "teacher":
            model, method, settings = teacher, "teacher", {}
        else:
            method, settings = variants[name]
            demo = {k: v for k, v in settings.items() if k in fields}
            trainer = {k: v for k, v in settings.items() if k not in fields}
            data = real_data(task, train_rows) if method == "mdlm" else trajectories
            model = distill(
                method,
                teacher,
                data,
                task,
                dataclasses.replace(config, **demo),
                work / name,
                disable_tqdm=True,
                **trainer,
            )
        train_s = time.perf_counter() - start
        (work / name / "tc").mkdir(parents=True, exist_ok=True)
        grid = evaluate({name: model}, task, eval_rows, config, work / name)
        result = {
            "name": name,
            "loss_type": method,
            "settings": settings,
            "seed": seed,
            **measure(grid, name, config, task.block_length),
            "num_eval": len(eval_rows),
            "train_s": round(train_s, 1),
            "total_s": round(time.perf_counter() - start, 1),
        }
        if tc:  # the factorization error on the teacher's own trajectory states
            analysis = analyze({name: model}, trajectories, config, work / name / "tc")
            result["tc_by_jump"] = analysis[name]["by_jump"]
        folder = output / "results" / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result), flush=True)


def load(output: Path, seed: int, name: str) -> dict[str, Any] | None:
    path = output / "results" / f"seed{seed}" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(
    output: Path, seeds: list[int], ablation_seed: int | None, budgets: list[int]
) -> dict[str, Any]:
    """The Markdown tables, the accuracy-vs-TokPS plot and the final JSON (means over ``seeds``)."""
    names = [n for n in ("teacher", *MAIN) if all(load(output, s, n) is not None for s in seeds)]
    rows = {n: [load(output, s, n) for s in seeds] for n in names}
    if "teacher" not in names:
        raise SystemExit(f"no teacher results for seeds {seeds}: run the study first")
    incomplete = [n for n in MAIN if n not in names]

    def acc(name: str, k: int) -> list[float]:
        return [r["tokps"][str(k)] for r in rows[name]]

    header = ["model", *[f"TokPS {k}" for k in budgets], "dynamic 0.9", "dynamic NFE", "train s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells = [name]
        for values in [acc(name, k) for k in budgets] + [[r["dynamic"] for r in rows[name]]]:
            m, s = mean_std(values)
            cells.append(f"{m:.1f} ± {s:.1f}")
        cells.append(f"{statistics.fmean(r['dynamic_nfe'] for r in rows[name]):.2f}")
        cells.append(f"{statistics.fmean(r['train_s'] for r in rows[name]):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)

    ablation_lines = []
    if ablation_seed is not None:
        header = [f"variant (seed {ablation_seed})", *[f"TokPS {k}" for k in budgets], "dynamic 0.9"]
        ablation_lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for name in ("teacher", "t3d", *ABLATIONS, *[n for n in MAIN if n != "t3d"]):
            r = load(output, ablation_seed, name)
            if r is not None:
                cells = [f"{r['tokps'][str(k)]:.1f}" for k in budgets]
                ablation_lines.append("| " + " | ".join([name, *cells, f"{r['dynamic']:.1f}"]) + " |")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name in names:
            means = [mean_std(acc(name, k))[0] for k in budgets]
            stds = [mean_std(acc(name, k))[1] for k in budgets]
            ax.errorbar(budgets, means, yerr=stds, marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(k) for k in budgets])
        ax.set_xlabel("tokens per step (TokPS)")
        ax.set_ylabel(f"exact match (%), mean ± std over seeds {seeds}")
        ax.set_title(f"{TASK}: accuracy vs tokens per step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(output / "accuracy_vs_tokps.png", dpi=120)
        plt.close(fig)
    except ImportError:  # plots are optional (matplotlib is in the dev/analysis extras)
        pass

    def m(name: str, k: int) -> float:
        return statistics.fmean(acc(name, k))

    def diff(a: str, b: str, k: int) -> float | None:
        return round(m(a, k) - m(b, k), 2) if a in names and b in names else None

    baselines = [b for b in BASELINES if b in names]
    best = {k: max(baselines, key=lambda b: m(b, k)) if baselines else None for k in (2, 4)}
    summary = {
        "task": TASK,
        "teacher_drop_tokps4": round(m("teacher", 1) - m("teacher", 4), 2),
        "t3d_minus_best_baseline_tokps2": diff("t3d", best[2], 2) if best[2] else None,
        "t3d_minus_best_baseline_tokps4": diff("t3d", best[4], 4) if best[4] else None,
        "best_baseline": best,
        "baselines_measured": baselines,
        "t3d_full_step_minus_teacher": diff("t3d", "teacher", 1),
        "t3d_student_minus_t3d_tokps2": diff("t3d_student", "t3d", 2),
        "t3d_student_minus_t3d_tokps4": diff("t3d_student", "t3d", 4),
        "recommended_t3d": {"loss_type": "t3d", **RECOMMENDED},
        "incomplete": incomplete,
        "seeds": seeds,
    }
    (output / "summary.md").write_text(table + "\n\n" + "\n".join(ablation_lines) + "\n")
    (output / "summary.json").write_text(json.dumps(summary, indent=2))
    print(table)
    print("\n".join(ablation_lines))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--ablation_seed", type=int, default=None, help="run the ablations on this seed")
    parser.add_argument("--teacher", default=str(PACKAGED_TEACHERS / TASK))
    parser.add_argument("--output_dir", default="method-study")
    parser.add_argument("--distill_steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--num_trajectories", type=int, default=2000)
    parser.add_argument("--num_eval", type=int, default=1000)
    parser.add_argument("--variants", nargs="+", default=None, help="main-comparison models, in run order")
    parser.add_argument("--tc", action="store_true", help="also run the TC analyser on every model")
    parser.add_argument("--summary_only", action="store_true", help="print the summary of results on disk")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--quick", action="store_true", help="tiny budgets and a freshly trained tiny teacher"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    base = QuickstartConfig(
        task=TASK,
        distill_steps=args.distill_steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        num_trajectories=args.num_trajectories,
        num_eval=args.num_eval,
        analysis_prompts=32,
        analysis_samples=8,
    )
    scratch = None
    output = Path(args.output_dir)
    teacher = args.teacher
    if args.quick:  # every stage on tiny budgets, with a teacher trained here for a few steps
        scratch = tempfile.TemporaryDirectory()
        output = Path(scratch.name)
        base = dataclasses.replace(
            base, teacher_steps=2, distill_steps=1, batch_size=8, num_trajectories=16, num_eval=8
        )
        base = dataclasses.replace(base, analysis_prompts=2, analysis_samples=2)
        train_teacher(get_task(TASK), base, output / "teacher")
        teacher = str(output / "teacher")
        args.seeds, args.ablation_seed, args.tc = [0], 0, True
    output.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        # Variant-major: a study cut short still has whole variants over every seed, in the order given.
        names = args.variants or ["teacher", *MAIN]
        unknown = [n for n in names if n != "teacher" and n not in MAIN]
        if unknown:
            raise SystemExit(f"unknown variants {unknown}; choose from {['teacher', *MAIN]}")
        jobs = [(name, seed) for name in names for seed in args.seeds]
        if args.ablation_seed is not None:
            jobs += [(name, args.ablation_seed) for name in ("teacher", "t3d", *ABLATIONS)]
        run(list(dict.fromkeys(jobs)), {**MAIN, **ABLATIONS}, base, teacher, output, args.tc)
    summary = summarise(output, args.seeds, args.ablation_seed, base.eval_tokens_per_step)
    if not args.summary_only:
        summary["wall_s"] = round(time.perf_counter() - start)
    summary["budget"] = {  # as given on this command line (the results on disk record their own)
        "distill_steps": base.distill_steps,
        "batch_size": base.batch_size,
        "num_trajectories": base.num_trajectories,
        "num_eval": base.num_eval,
    }
    if scratch is not None:
        scratch.cleanup()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
