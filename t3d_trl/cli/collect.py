"""``t3d-trl collect --config recipe.yaml``: decode a dataset with a teacher and save its trajectories.

Recipe keys are the fields of :class:`CollectConfig` (the teacher, the source dataset and its columns, the
prompt, every :class:`~t3d_trl.DiffusionGenerationConfig` decoding setting, batching, output and Hub
options); flags override the recipe. The work is done by :func:`t3d_trl.collect_trajectories`; rerunning
the same command resumes an interrupted collection, and a larger ``--limit`` extends a finished one. Run it
under ``accelerate launch`` to split the prompts over several GPUs or processes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..generation.configuration import OUTPUT_FIELDS, DiffusionGenerationConfig
from ..utils import DATA_FILE_BUILDERS, load_data_file, load_data_folder, resolve_dtype
from .checks import check_dataset_source
from .parsing import parse_recipe

if TYPE_CHECKING:  # datasets and torch load when a collection runs, not for --help
    import datasets


@dataclass
class CollectConfig(DiffusionGenerationConfig):
    """Settings of ``t3d-trl collect``: the decoding settings of :class:`DiffusionGenerationConfig` plus these.

    Args:
        model_name_or_path: the teacher (Hub id or local folder), loaded with ``AutoModelForDiffusionLM``.
        model_revision: Hub revision of the teacher.
        tokenizer_name_or_path: defaults to the model's.
        trust_remote_code: run the modeling and tokenizer code the checkpoint ships (its ``auto_map``); read
            it first.
        dtype: ``auto`` or a torch dtype name (``bfloat16``, ``float32``, ...).
        dataset_name: a Hub dataset, a local ``.json``/``.jsonl``/``.parquet``/``.csv`` file, a folder, or
            ``demo:<task>`` (a demo task's generated prompts: ``demo:wordsort``; columns ``id``, ``prompt``,
            ``answer``).
        dataset_config: the Hub dataset's configuration (subset).
        dataset_split: the split to decode.
        limit: decode only the first ``limit`` rows (a larger one later extends the collection).
        prompt_template: ``math``, ``code``, ``plain`` or a ``str.format`` pattern over the columns.
        prompt_column: the column that fills the template's ``{problem}``.
        id_column: a column of unique ids (default: ``id`` if present, else the row index).
        chat_column: a column of chat messages to use instead of the template.
        use_chat_template: wrap prompts with the tokenizer's chat template.
        keep_columns: source columns to pass through (default: all).
        gold_column: keep only completions whose math answer matches this column.
        filter_unfinished: drop completions without EOS.
        max_prompt_length: drop prompts longer than this many tokens.
        batch_size: prompts decoded together (default: from free GPU memory on a GPU, else 8).
        seed: collection seed.
        output_dir: where shards and the final dataset go (rerun to resume).
        push_to_hub: push the dataset and its card to ``hub_model_id`` when done.
        hub_model_id: the Hub dataset repo to push to (named as ``TrainingArguments``' flag).
        hub_private_repo: create that repo private.
    """

    # Always set by the collection itself: no option, no recipe key.
    cli_hidden = OUTPUT_FIELDS

    eos_token_id: list[int] | None = None  # the parser takes one type per flag: one or several ids
    model_name_or_path: str | None = field(default=None, metadata={"help": "teacher model (Hub id or path)"})
    model_revision: str | None = None
    tokenizer_name_or_path: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset, local file or folder, or demo:<task>"}
    )
    dataset_config: str | None = None
    dataset_split: str = "train"
    limit: int | None = None
    prompt_template: str = "math"
    prompt_column: str = "problem"
    id_column: str | None = None
    chat_column: str | None = None
    use_chat_template: bool = True
    keep_columns: list[str] | None = None
    gold_column: str | None = None
    filter_unfinished: bool = False
    max_prompt_length: int | None = None
    batch_size: int | None = None
    seed: int = 0
    output_dir: str | None = field(
        default=None, metadata={"help": "where shards and the dataset are written"}
    )
    push_to_hub: bool = False
    hub_model_id: str | None = None
    hub_private_repo: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        missing = [
            name for name in ("model_name_or_path", "dataset_name", "output_dir") if not getattr(self, name)
        ]
        if missing:
            raise ValueError(f"collect needs {', '.join(missing)} (in the recipe or as flags)")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("push_to_hub=True needs hub_model_id")
        # Refused here, not once the teacher has loaded (a limit below 1 read as "the dataset is empty").
        for name in ("limit", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive number, got {getattr(self, name)}")
        resolve_dtype(self.dtype)

    def generation_config(self) -> DiffusionGenerationConfig:
        """The decoding settings alone."""
        return DiffusionGenerationConfig(
            **{f.name: getattr(self, f.name) for f in fields(DiffusionGenerationConfig)}
        )


DEMO_PREFIX = "demo:"


def load_source_dataset(name: str, config: str | None = None, split: str = "train") -> datasets.Dataset:
    """A Hub dataset (``datasets.load_dataset``), a local data file, a local folder (a ``save_to_disk`` folder: its
    ``split``, refused when it has no such split), or ``demo:<task>`` (a demo task's ``train`` or ``test`` split,
    :meth:`t3d_trl.demo.DemoTask.split`)."""
    import datasets

    from ..data.hub import is_saved_dataset, load_saved_dataset

    if name.startswith(DEMO_PREFIX):  # a demo task by name: its generated rows (prompt, answer, id)
        from ..demo.tasks import get_task

        return datasets.Dataset.from_list(get_task(name[len(DEMO_PREFIX) :]).split(split))
    path = Path(name)
    if path.is_file() or path.suffix.lower() in DATA_FILE_BUILDERS:  # a missing data file is no Hub repo
        return load_data_file(path, split)
    if is_saved_dataset(path):
        return load_saved_dataset(path, split)
    if path.is_dir() and config is None:
        return load_data_folder(path, split)
    return datasets.load_dataset(name, config, split=split)


def _math_checker() -> Any:
    from ..evaluation.math_checker import check_math  # imported when needed: math-verify is slow to import

    return check_math


def run(config: CollectConfig) -> datasets.Dataset:
    """Collect (and optionally push) the trajectories a :class:`CollectConfig` describes; prints the summary line."""

    from ..data.hub import create_trajectory_repo, push_trajectories_to_hub
    from ..data.processes import process_group
    from ..data.trajectories import collect_trajectories, collection_summary
    from ..models.auto import check_model_source

    check_dataset_source(config.dataset_name)  # one line instead of datasets' Hub traceback
    source = load_source_dataset(config.dataset_name, config.dataset_config, config.dataset_split)
    check_model_source(config.model_name_or_path, revision=config.model_revision)  # before the teacher loads
    if config.push_to_hub and process_group()[0] == 0:  # no Hub access or token fails now, not after decoding
        create_trajectory_repo(config.hub_model_id, private=config.hub_private_repo)
    if config.limit is not None:
        source = source.select(range(min(config.limit, len(source))))
    model_kwargs: dict[str, Any] = {"dtype": resolve_dtype(config.dtype)}
    if config.trust_remote_code:  # the teacher's code and its tokenizer's
        model_kwargs["trust_remote_code"] = True
    dataset = collect_trajectories(
        config.model_name_or_path,
        config.tokenizer_name_or_path,
        source,
        config.prompt_template,
        output_dir=config.output_dir,
        generation_config=config.generation_config(),
        batch_size=config.batch_size,
        prompt_column=config.prompt_column,
        id_column=config.id_column,
        chat_column=config.chat_column,
        use_chat_template=config.use_chat_template,
        keep_columns=config.keep_columns,
        max_prompt_length=config.max_prompt_length,
        filter_unfinished=config.filter_unfinished,
        gold_column=config.gold_column,
        answer_checker=_math_checker() if config.gold_column else None,
        seed=config.seed,
        teacher_revision=config.model_revision,
        model_kwargs=model_kwargs,
    )
    if process_group()[0] == 0:  # one line, not one per process
        print(collection_summary(config.output_dir))  # first: it says why a push of 0 rows is refused
        if config.push_to_hub:
            print(push_trajectories_to_hub(dataset, config.hub_model_id, private=config.hub_private_repo))
    return dataset


def main(argv: list[str]) -> int:
    (config,) = parse_recipe([CollectConfig], argv, prog="t3d-trl collect", description=__doc__)
    try:
        run(config)
    except KeyboardInterrupt:
        from ..data.processes import is_first_process

        if is_first_process():  # every process is interrupted; one line
            print(
                f"t3d-trl collect: interrupted; the finished batches are kept in {config.output_dir}. "
                "Rerun the same command to resume.",
                file=sys.stderr,
            )
        return 130
    return 0
