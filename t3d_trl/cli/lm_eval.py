"""``t3d-trl lm-eval``: lm-evaluation-harness with the diffusion model ``t3d`` registered.

    t3d-trl lm-eval --model t3d --model_args pretrained=JetLM/SDAR-4B-Chat,block_length=4,tokens_per_step=2 \\
        --tasks gsm8k --batch_size 16 --output_path results/

Every argument is ``lm_eval``'s, and so is the output (the results table, ``--output_path`` files); the ``t3d``
model also logs its NFE and tokens per second and writes them to the results' ``config.t3d_decoding``. See
:mod:`t3d_trl.integrations.lm_eval` for the model arguments: every decoding field of
:class:`~t3d_trl.DiffusionGenerationConfig` is one (``--model_args pretrained=...,top_k=5``). A task YAML's
local ``dataset_kwargs.data_files`` are read relative to the YAML (lm_eval itself reads them relative to the
working folder), so ``--include_path`` task folders run from anywhere. Needs ``pip install "t3d-trl[lm_eval]"``.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _resolve_data_files(data_files: Any, folder: Path) -> Any:
    """Relative paths and globs that match next to the YAML, made absolute (others are left to lm_eval: Hub
    files)."""
    if isinstance(data_files, str):
        if Path(data_files).is_absolute():
            return data_files
        local = folder / data_files
        return str(local) if local.exists() or any(folder.glob(data_files)) else data_files
    if isinstance(data_files, list):
        return [_resolve_data_files(item, folder) for item in data_files]
    if isinstance(data_files, dict):
        return {split: _resolve_data_files(item, folder) for split, item in data_files.items()}
    return data_files


@contextmanager
def data_files_relative_to_yaml():
    """While lm_eval builds its tasks, read each task YAML's local ``data_files`` relative to the YAML."""
    from lm_eval.tasks import _factory

    original = _factory.load_yaml

    def load_yaml(path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        config = original(path, *args, **kwargs)
        dataset_kwargs = config.get("dataset_kwargs")
        if isinstance(dataset_kwargs, dict) and "data_files" in dataset_kwargs:
            folder = Path(path).expanduser().resolve().parent
            dataset_kwargs["data_files"] = _resolve_data_files(dataset_kwargs["data_files"], folder)
        return config

    _factory.load_yaml = load_yaml
    try:
        yield
    finally:
        _factory.load_yaml = original


def t3d_model_arguments_help() -> str:
    """The ``--model_args`` of the ``t3d`` model that set decoding, from ``DiffusionGenerationConfig`` itself."""
    from .decoding import decoding_fields

    names = [f.name for f in decoding_fields()]
    return (
        "\nmodel arguments of --model t3d (--model_args pretrained=PATH,key=value,...): pretrained, tokenizer, peft, "
        "dtype, device, batch_size, seed, mc_num, mc_batch_size, estimator, cfg, is_check_greedy, and every "
        "decoding setting (unset: the model's saved one; eos_token_id takes one id, as model_args hold no lists): "
        f"{', '.join(names)}. See docs/cli.md#decoding-options."
    )


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
        with data_files_relative_to_yaml():
            cli_evaluate()
    except SystemExit as exit_:  # --help and argument errors
        if any(a in ("-h", "--help") for a in argv):
            print(t3d_model_arguments_help())
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    finally:
        sys.argv = saved
        log.removeHandler(handler)
    return 0
