"""The model card :class:`~t3d_trl.T3DTrainer` writes (``README.md``): tags, the paper, the settings, how to sample."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from pathlib import Path
from typing import Any

from trl.trainer.base_config import _BaseConfig

from ..data.schema import TrajectoryMetadata
from ..generation.configuration import DiffusionGenerationConfig
from .t3d_config import OBJECTIVE_SETTINGS, T3DConfig

TEMPLATE = Path(__file__).with_name("model_card.jinja")
PAPER = {
    "title": "Few-Step Diffusion Language Models via Trajectory Self-Distillation",
    "id": None,
    "citation": textwrap.dedent("""\
        @misc{zhang2026t3d,
            title   = {{Few-Step Diffusion Language Models via Trajectory Self-Distillation}},
            author  = {Tunyu Zhang and Xinxi Zhang and Ligong Han and Haizhou Shi and Xiaoxiao He and Zhuowei Li and Hao Wang and Kai Xu and Akash Srivastava and Chengzhi Mao and Hao Wang and Vladimir Pavlovic and Dimitris N. Metaxas},
            year    = 2026,
            note    = {Preprint},
        }"""),
}

#: The settings a card lists (the objective, the data limits and the optimisation), less those its objective does
#: not read (:data:`~t3d_trl.trainer.t3d_config.OBJECTIVE_SETTINGS`) and the length it was not given by.
CARD_SETTINGS = (
    "loss_type",
    *OBJECTIVE_SETTINGS,
    "random_token_prob",
    "max_prompt_length",
    "max_completion_length",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "seed",
)
# T3D settings that do not change the model (how the run was carried out), left out of the card.
_NOT_MODEL_SETTINGS = ("overwrite_output_dir", "dataset_num_proc")


#: How a card describes the training objective, by ``loss_type`` (docs/trainer.md's words); ``mdlm`` distils nothing.
#: ``{paper}`` is the T3D paper's title: only the trajectory objectives are its method.
OBJECTIVES = {
    **dict.fromkeys(
        ("t3d", "ddo", "td"),
        'trajectory self-distillation (T3D, "{paper}"): the student learns from its teacher\'s own decoding '
        "trajectories",
    ),
    "redi": "ReDi endpoint distillation: the student learns from its teacher's outputs under random masking",
    "dparallel": (
        "dParallel certainty forcing: the student learns from its teacher's outputs under semi-autoregressive masking"
    ),
}


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def card_settings(args: T3DConfig, block_length: int) -> dict[str, Any]:
    """:data:`CARD_SETTINGS` that the run used, every other setting :class:`~t3d_trl.T3DConfig` adds to TRL's that
    differs from its default (``student_state_ratio``, ...: a run that departs from the paper says so), and the
    block length trained with."""
    unused = {name for name, readers in OBJECTIVE_SETTINGS.items() if args.loss_type not in readers}
    unused.add("num_train_epochs" if args.max_steps > 0 else "max_steps")  # max_steps > 0 overrides epochs
    settings = {name: getattr(args, name) for name in CARD_SETTINGS if name not in unused}
    inherited = {f.name for f in dataclasses.fields(_BaseConfig)}
    for field in dataclasses.fields(T3DConfig):
        if (
            field.name in settings
            or field.name in unused
            or field.name in inherited
            or field.name in _NOT_MODEL_SETTINGS
        ):
            continue
        if field.init and getattr(args, field.name) != _default(field):
            settings[field.name] = getattr(args, field.name)
    settings["block_length"] = block_length
    return settings


def hub_id(name: str | None) -> str | None:
    """``name`` when it can be a Hub repo id; ``None`` for a local path (``models/base``, ``c1/traj``) or anything
    else (``demo:wordsort``): a card's ``base_model``/``datasets`` and their links name Hub repos only."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not name or os.path.exists(name):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def write_model_card(
    output_dir: str,
    *,
    model_config: Any,
    args: T3DConfig,
    block_length: int,
    metadata: TrajectoryMetadata | None,
    paper: dict[str, Any],
    tags: set[str],
    model_name: str,
    hub_model_id: str,
    dataset_name: str | None,
    adapter: bool,
    chat_template: bool,
    example_prompt: str | None = None,
) -> None:
    """Write ``output_dir/README.md`` for a model whose (inner) config is ``model_config``; its quick start decodes
    ``example_prompt`` (a training prompt: a math question reads as unknown tokens to a task's own tokenizer)."""
    from huggingface_hub import ModelCard, ModelCardData
    from trl.trainer.utils import get_config_model_id

    base_model = hub_id(get_config_model_id(model_config))
    dataset_name = hub_id(dataset_name)
    generation = DiffusionGenerationConfig.from_model_config(model_config)
    card = ModelCard.from_template(
        ModelCardData(
            base_model=base_model,
            datasets=[dataset_name] if dataset_name else None,
            library_name="transformers",
            tags=["generated_from_trainer", *sorted(tags)],
        ),
        template_path=str(TEMPLATE),
        model_name=model_name,
        base_model=base_model,
        hub_model_id=hub_model_id,
        dataset_name=dataset_name,
        adapter=adapter,
        chat_template=chat_template,
        example_prompt=example_prompt,  # the template's math question without one
        distilled=args.loss_type != "mdlm",
        objective=OBJECTIVES[args.loss_type].format(paper=paper["title"])
        if args.loss_type in OBJECTIVES
        else None,
        generation=generation,
        steps_per_block=generation.block_length // generation.tokens_per_step
        if generation.block_length and generation.tokens_per_step
        else None,
        settings=json.dumps(card_settings(args, block_length), indent=2),
        teacher=metadata.teacher if metadata else None,
        trajectory=metadata.to_dict() if metadata else None,
        citation=paper["citation"],
    )
    card.save(os.path.join(output_dir, "README.md"))
