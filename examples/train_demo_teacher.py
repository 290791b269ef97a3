"""Pre-train the tiny teacher that ``t3d-trl quickstart`` ships for an embedded task.

The teacher is trained with the library's own trainer (``T3DTrainer(loss_type="mdlm")``, the standard masked
diffusion loss) and saved into the package (``t3d_trl/demo/teachers/<task>``), so that the demo spends its
time on distillation. Anyone can rerun it:

    python examples/train_demo_teacher.py --task sort2 [--steps 2000] [--batch_size 128] [--seed 0]

``--hidden_size`` trains a larger teacher of the same shape otherwise (intermediate 3.5 x hidden, 4 heads; the
method study's capacity axis): ``--task wordsort --hidden_size 256 --output_dir teacher-256``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

from t3d_trl.demo.quickstart import PACKAGED_TEACHERS, QuickstartConfig, train_teacher
from t3d_trl.demo.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="sort2")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--hidden_size", type=int, default=None, help="default: the task's teacher size")
    parser.add_argument("--output_dir", default=None, help="default: the package's teachers folder")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = get_task(args.task)
    config = QuickstartConfig(
        task=task.name,
        seed=args.seed,
        teacher_steps=args.steps,
        batch_size=args.batch_size,
        teacher_learning_rate=args.learning_rate,
    )
    target = Path(args.output_dir) if args.output_dir else PACKAGED_TEACHERS / task.name
    with tempfile.TemporaryDirectory() as scratch:
        size = {}
        if args.hidden_size:
            size = dict(
                hidden_size=args.hidden_size,
                intermediate_size=args.hidden_size * 7 // 2,
                head_dim=args.hidden_size // 4,
            )
        model = train_teacher(task, config, Path(scratch) / "run", **size)
        model.save_pretrained(target)  # weights, config (diffusion description, decoding defaults)
        task.tokenizer().save_pretrained(target)
    for leftover in ("training_args.bin",):
        (target / leftover).unlink(missing_ok=True)
    shutil.rmtree(target / "runs", ignore_errors=True)
    print(f"teacher for {task.name} saved to {target}")


if __name__ == "__main__":
    main()
