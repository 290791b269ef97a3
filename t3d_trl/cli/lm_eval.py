"""``t3d-trl lm-eval``: lm-evaluation-harness with the diffusion model ``t3d`` registered.

    t3d-trl lm-eval --model t3d --model_args pretrained=JetLM/SDAR-4B-Chat,block_length=4,tokens_per_step=2 \\
        --tasks gsm8k --batch_size 16 --output_path results/

Every argument is ``lm_eval``'s, and so is the output (the results table, ``--output_path`` files); the ``t3d``
model also logs its NFE and tokens per second and writes them to the results' ``config.t3d_decoding``. See
:mod:`t3d_trl.integrations.lm_eval` for the model arguments. Needs ``pip install "t3d-trl[lm_eval]"``.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str]) -> int:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        print(
            f"t3d-trl lm-eval needs lm-evaluation-harness ({err}): pip install 't3d-trl[lm_eval]'",
            file=sys.stderr,
        )
        return 2
    import t3d_trl.integrations.lm_eval  # noqa: F401  (registers the "t3d" model)

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("t3d_trl.integrations")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except SystemExit as exit_:  # --help and argument errors
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    finally:
        sys.argv = saved
        log.removeHandler(handler)
    return 0
