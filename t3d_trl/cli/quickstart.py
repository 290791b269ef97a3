"""``t3d-trl quickstart``: the T3D demo end to end on the CPU, on an embedded task, with nothing downloaded.

The teacher decodes training prompts one token per step; its trajectories distil few-step students (T3D and
the TD, ReDi and dParallel baselines, same budget); every model is evaluated at 1, 2 and 4 tokens per step and with
dynamic decoding; the factorization error (conditional total correlation) of each is measured. Prints the
accuracy table; writes results.json, the evaluation table and plots, and the TC heatmap to --output_dir.
"""

from __future__ import annotations

import logging
import sys

from .parsing import parse_recipe


def main(argv: list[str]) -> int:
    from ..demo.quickstart import BUDGETS, QuickstartConfig, run_quickstart

    (config,) = parse_recipe([QuickstartConfig], argv, prog="t3d-trl quickstart", description=__doc__)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("t3d_trl").setLevel(logging.INFO)
    try:
        results = run_quickstart(config)
    except KeyboardInterrupt:  # one line, as collect says it: the stages done are kept
        print(
            f"t3d-trl quickstart: interrupted; rerun the same command to resume (the collected trajectories in "
            f"{config.output_dir}/trajectories are kept).",
            file=sys.stderr,
        )
        return 130
    print()
    print(f"Task {results['task']}: {results['task_description']}")
    print(f"Exact-match accuracy (%) on {config.num_eval} held-out prompts:")
    print(results["table"])
    if config.fast and config.distill_steps == BUDGETS["distill_steps"][1]:
        print(
            f"--fast is a smoke run of every stage, not a distillation: {config.distill_steps} training steps do not "
            "train the students, which may score below the teacher at few-step budgets. The default run "
            f"({BUDGETS['distill_steps'][0]} steps) is the one that improves them (docs/quickstart.md)."
        )
    print()
    print("Total correlation (nats) by jump size, teacher vs students:")
    for name, rows in results["total_correlation_by_jump"].items():
        print(f"  {name:<10}" + "  ".join(f"jump {r['jump']}: {r['tc']:.3f}" for r in rows))
    print()
    print(
        f"Finished in {results['timings_s']['total']:.0f} s. Results: {config.output_dir}/results.json, "
        f"{config.output_dir}/eval/ (table and plots), {config.output_dir}/tc_heatmap.png"
    )
    return 0
