"""Configuration of :class:`~t3d_trl.T3DTrainer`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from transformers.utils import is_torch_bf16_gpu_available
from trl.trainer.base_config import _BaseConfig

from .losses import PATH_WEIGHTINGS
from .student_states import STUDENT_STATE_LABELS

LOSS_TYPES = ("t3d", "ddo", "td", "redi", "dparallel", "mdlm")
TRAJECTORY_LOSSES = ("t3d", "ddo", "td")  # need the teacher's decoding order (decode_step)
REFERENCE_LOSSES = ("t3d", "ddo")  # need the reference model
# Settings that some objectives only read: set for another one, they would be ignored silently.
OBJECTIVE_SETTINGS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("beta", "fake_weight", "fake_estimator", "ref_sync_steps"), ("t3d", "ddo")),
    **dict.fromkeys(("lambda_path", "path_weighting"), ("t3d",)),
    **dict.fromkeys(("certainty_weight", "certainty_temperature"), ("dparallel",)),
    "state_sampling": TRAJECTORY_LOSSES,
    "tokens_per_step": tuple(loss for loss in LOSS_TYPES if loss != "mdlm"),  # the student's few-step budget
}
FAKE_ESTIMATORS = ("argmax", "expectation")  # how the DDO fake term is taken
STATE_SAMPLING = ("uniform", "reference")


@dataclass
class T3DConfig(_BaseConfig):
    r"""
    Configuration of [`T3DTrainer`]: trajectory self-distillation of a masked diffusion LM into a few-step student.

    Only the parameters specific to T3D are listed here; see [`~transformers.TrainingArguments`] for the rest.
    Defaults follow the T3D paper and its reference implementation.

    Parameters:
        > Objective

        loss_type (`str`, *optional*, defaults to `"t3d"`):
            `"t3d"`: trajectory DDO plus `lambda_path` times the path-consistency loss (the paper's method).
            `"ddo"`: trajectory DDO only. `"td"`: trajectory distillation with the forward KL (cross-entropy on
            the teacher's trajectory states). `"redi"`: endpoint distillation on the teacher's clean outputs with
            random masking. `"dparallel"`: certainty-forcing distillation on semi-autoregressively masked teacher
            outputs. `"mdlm"`: the standard masked-diffusion loss on real data (the SFT baseline; also pre-trains
            a teacher), which reads prompt/completion or text columns instead of `decode_step`.
        beta (`float`, *optional*, defaults to `0.1`):
            Scale of DDO's implicit discriminator `sigmoid(beta * log p_theta / p_ref)`.
        fake_weight (`float`, *optional*, defaults to `0.5`):
            `alpha`, weight of DDO's fake term (the reference model's own predictions).
        fake_estimator (`str`, *optional*, defaults to `"argmax"`):
            How the fake term's expectation over `x_0 ~ p_ref(x_0 | x_t)` (Eq. step-ddo) is taken: `"argmax"`,
            the log-ratio of the reference's argmax at `x_t` (the public reference code), or `"expectation"`, the
            exact expectation `-KL(p_ref || p_theta)` per masked position, which has no gradient at
            `p_theta = p_ref` (the argmax pushes the predicted token down from the first step on).
        lambda_path (`float`, *optional*, defaults to `0.2`):
            Weight of the path-consistency loss in `"t3d"`.
        path_weighting (`str`, *optional*, defaults to `"early"`):
            Token weights of the path-consistency loss: `"early"` `(B - pi + 1) / B`, `"uniform"` 1, `"late"`
            `pi / B`, with `pi` the student step at which the token is decoded and `B` the student steps per block.
        ref_sync_steps (`int`, *optional*, defaults to `10`):
            Optimizer steps between refreshes of the DDO reference model from the student ("multi-round").
        certainty_weight (`float`, *optional*, defaults to `2.0`):
            `"dparallel"`: weight of the entropy penalty on correctly predicted masked tokens.
        certainty_temperature (`float`, *optional*, defaults to `0.5`):
            `"dparallel"`: temperature of the logits inside that entropy.

        > Training states and the student's decoding budget

        state_sampling (`str`, *optional*, defaults to `"uniform"`):
            How a trajectory state `x_t` is drawn: `"uniform"` over the teacher's denoising steps, or
            `"reference"` with probability proportional to (share of the block still masked)^8, the public
            reference code's choice (early, heavily masked states dominate).
        student_state_ratio (`float`, *optional*, defaults to `0.0`):
            Share of the rows (`lmbda` in TRL's GKD) whose trajectory state is moved onto the student's own path:
            the student, without gradient, commits its `tokens_per_step` most confident masked tokens of the
            state's block (one greedy parallel step, as it decodes; only where a mask is left after it), and the
            frozen teacher (the initial model) relabels the positions still masked in those blocks with its own
            prediction at that state. The student then trains on the states its few-step decoding reaches, not
            only on the teacher's. `0`: teacher states only (the paper). Trajectory losses only; costs one student
            and one teacher forward (no gradient) per batch. Measured in `docs/method_study.md` (it lost there).
        student_state_labels (`str`, *optional*, defaults to `"argmax"`):
            How the teacher labels the still-masked positions of a moved block (`student_state_ratio > 0` only):
            `"argmax"`, its per-position argmax at the student state (one teacher forward; in a state with two
            possible answers neighbouring labels can come from different answers); `"rollout"`, the tokens of
            its own sequential completion of that state, greedy, one token per step and block in low-confidence
            order, every block in parallel (labels only: the input stays the student state). Rollout costs up to
            `block_length` teacher forwards (no gradient) per moved micro-batch instead of one.
        random_token_prob (`float`, *optional*, defaults to `0.1`):
            Probability that a masked input position shows a uniformly drawn vocabulary token instead of the
            mask token (targets stay clean). Applies to every `loss_type`; set 0 to reproduce a published
            baseline exactly.
        block_length (`int` or `None`, *optional*, defaults to `None`):
            Decoding block length of the trajectories and of the student. `None`: read from the trajectory
            metadata, else the model's block size (block-causal models), else 4 (the paper's).
        tokens_per_step (`int`, *optional*, defaults to `2`):
            The student's few-step budget in tokens per step (TokPS): `block_length / tokens_per_step` steps per
            block. Sets the path-consistency weights and the decoding defaults saved with the distilled model.
            Ignored by `"mdlm"`.

        > Data

        max_prompt_length (`int` or `None`, *optional*, defaults to `512`):
            Rows whose prompt is longer are dropped (with a warning); a prompt is never truncated.
        max_completion_length (`int` or `None`, *optional*, defaults to `1024`):
            Completions (with their decode steps) are truncated to this many tokens.
        dataset_num_proc (`int` or `None`, *optional*, defaults to `None`):
            Processes used to prepare the dataset.
        disable_dropout (`bool`, *optional*, defaults to `True`):
            Disable dropout in the student (and hence the reference): DDO's log-ratio must be exactly 0 right
            after a refresh.

        > Output folder

        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Train into an `output_dir` that already holds `checkpoint-*` folders or a finished model without
            resuming: those checkpoints and the model's weight files are deleted first. Without it such a run stops
            with an error (pass `resume_from_checkpoint=True` to continue from the last checkpoint), so a rerun
            never mixes two runs' checkpoints nor replaces a finished model unasked.

    Activation checkpointing is on by default (TRL's default), under transformers' name
    `activation_checkpointing`; the deprecated `gradient_checkpointing` is still read when set.
    """

    # Parameters whose defaults differ from TrainingArguments: the paper's optimiser settings.
    learning_rate: float = field(
        default=1e-5, metadata={"help": "Initial AdamW learning rate (the reference code's: 1e-5)."}
    )
    # TRL sets the deprecated alias to True, which makes transformers warn on every run: unset it here and turn
    # activation_checkpointing on in __post_init__ instead (same behaviour, no warning).
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )
    # Unset means on; "%(default).0s" keeps --help from printing "(default: None)", which reads as off.
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Trade compute for memory by recomputing activations in the backward pass. On unless set to "
            "false (TRL's default)%(default).0s."
        },
    )

    loss_type: str = field(
        default="t3d",
        metadata={"help": "Objective.", "choices": list(LOSS_TYPES)},
    )
    beta: float = field(default=0.1, metadata={"help": "DDO discriminator scale beta."})
    fake_weight: float = field(default=0.5, metadata={"help": "DDO fake-term weight alpha."})
    fake_estimator: str = field(
        default="argmax",
        metadata={"help": "DDO fake term: argmax or expectation.", "choices": list(FAKE_ESTIMATORS)},
    )
    lambda_path: float = field(default=0.2, metadata={"help": "Weight of the path-consistency loss (t3d)."})
    path_weighting: str = field(
        default="early",
        metadata={"help": "Path-consistency token weights.", "choices": list(PATH_WEIGHTINGS)},
    )
    ref_sync_steps: int = field(
        default=10, metadata={"help": "Optimizer steps between refreshes of the DDO reference model."}
    )
    certainty_weight: float = field(default=2.0, metadata={"help": "dparallel: entropy penalty weight."})
    certainty_temperature: float = field(default=0.5, metadata={"help": "dparallel: entropy temperature."})
    state_sampling: str = field(
        default="uniform",
        metadata={"help": "How trajectory states are drawn.", "choices": list(STATE_SAMPLING)},
    )
    student_state_ratio: float = field(
        default=0.0,
        metadata={
            "help": "Share of rows moved one student parallel step off the trajectory, teacher-labelled."
        },
    )
    student_state_labels: str = field(
        default="argmax",
        metadata={
            "help": "Teacher labels of student states: argmax (one forward) or rollout (its own completion).",
            "choices": list(STUDENT_STATE_LABELS),
        },
    )
    random_token_prob: float = field(
        default=0.1, metadata={"help": "Share of masked input positions shown as random tokens."}
    )
    block_length: int | None = field(
        default=None, metadata={"help": "Decoding block length (default: trajectory metadata or model)."}
    )
    tokens_per_step: int = field(default=2, metadata={"help": "Student tokens per decoding step (TokPS)."})
    max_prompt_length: int | None = field(
        default=512, metadata={"help": "Drop rows with longer prompts (never truncated)."}
    )
    max_completion_length: int | None = field(default=1024, metadata={"help": "Truncate completions."})
    dataset_num_proc: int | None = field(
        default=None, metadata={"help": "Processes for dataset preparation."}
    )
    disable_dropout: bool = field(default=True, metadata={"help": "Disable dropout in the model."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete the checkpoints and the finished model already in output_dir instead of refusing to "
            "train there."
        },
    )

    def __post_init__(self):
        # Processes started by torchrun (or a MULTI_GPU accelerate config) on a machine without GPUs train together
        # on the CPU (data parallel over gloo); left alone, accelerate would make each a separate one-process run.

        if (
            not self.use_cpu
            and int(os.environ.get("WORLD_SIZE", "1")) > 1
            and not torch.accelerator.is_available()
        ):
            self.use_cpu = True
        # TRL turns bf16 on by default; only do so where bf16 training works (not on a CPU-only machine).
        if self.bf16 is None and not self.fp16:
            self.bf16 = not self.use_cpu and is_torch_bf16_gpu_available()
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        # Every parameter takes part in every diffusion forward pass (the whole network runs on the canvas), so
        # DDP need not search the graph for unused ones; transformers would otherwise turn that search on
        # whenever activation checkpointing is off (or the model is a peft wrapper), and DDP warns every run.
        if self.ddp_find_unused_parameters is None:
            self.ddp_find_unused_parameters = False
        # Pinned memory only helps copies to an accelerator; without one torch warns on every dataloader.
        if self.use_cpu or not torch.accelerator.is_available():
            self.dataloader_pin_memory = False
        super().__post_init__()
        self._check_run()
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.fake_estimator not in FAKE_ESTIMATORS:
            raise ValueError(f"fake_estimator must be one of {FAKE_ESTIMATORS}, got {self.fake_estimator!r}")
        if self.path_weighting not in PATH_WEIGHTINGS:
            raise ValueError(f"path_weighting must be one of {PATH_WEIGHTINGS}, got {self.path_weighting!r}")
        if self.state_sampling not in STATE_SAMPLING:
            raise ValueError(f"state_sampling must be one of {STATE_SAMPLING}, got {self.state_sampling!r}")
        for name in ("beta", "certainty_temperature", "fake_weight", "lambda_path", "certainty_weight"):
            if not math.isfinite(
                getattr(self, name)
            ):  # NaN passes every comparison below and trains a NaN model
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        for name in ("beta", "certainty_temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("fake_weight", "lambda_path", "certainty_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.ref_sync_steps < 1:
            raise ValueError(
                f"ref_sync_steps must be a positive number of optimizer steps, got {self.ref_sync_steps}"
            )
        if not 0 <= self.student_state_ratio <= 1:
            raise ValueError(f"student_state_ratio must be in [0, 1], got {self.student_state_ratio}")
        if self.student_state_ratio > 0 and self.loss_type not in TRAJECTORY_LOSSES:
            raise ValueError(
                f"student_state_ratio={self.student_state_ratio} moves trajectory states, but "
                f"loss_type={self.loss_type!r} masks randomly; use it with one of {TRAJECTORY_LOSSES}"
            )
        if self.student_state_labels not in STUDENT_STATE_LABELS:
            raise ValueError(
                f"student_state_labels must be one of {STUDENT_STATE_LABELS}, got {self.student_state_labels!r}"
            )
        if not 0 <= self.random_token_prob < 1:
            raise ValueError(f"random_token_prob must be in [0, 1), got {self.random_token_prob}")
        if self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be positive, got {self.tokens_per_step}")
        if self.block_length is not None:
            if self.block_length < 1:
                raise ValueError(f"block_length must be positive, got {self.block_length}")
            if self.loss_type != "mdlm" and self.block_length % self.tokens_per_step:
                raise ValueError(
                    f"block_length={self.block_length} is not a multiple of tokens_per_step={self.tokens_per_step}"
                )
        for name in ("max_prompt_length", "max_completion_length"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive or None, got {getattr(self, name)}")
        if self.student_state_labels != "argmax" and self.student_state_ratio == 0:
            raise ValueError(
                f"student_state_labels={self.student_state_labels!r} labels student states, but "
                "student_state_ratio=0 makes none; set student_state_ratio > 0"
            )
        for name, readers in OBJECTIVE_SETTINGS.items():
            value = getattr(self, name)
            if self.loss_type not in readers and value != self.__dataclass_fields__[name].default:
                raise ValueError(
                    f"{name}={value!r} is read only by loss_type="
                    + " or ".join(map(repr, readers))
                    + f"; loss_type={self.loss_type!r} would ignore it (leave it at its default)"
                )
        if self.loss_type == "t3d" and self.lambda_path == 0:
            raise ValueError("loss_type='t3d' with lambda_path=0 is DDO alone: use loss_type='ddo'")

    def _check_run(self) -> None:
        """The run's length and folder, checked before a model or data loads."""
        # transformers' convention: max_steps > 0 overrides num_train_epochs, -1 (the default) trains for
        # num_train_epochs. 0 (or no epochs) would take one step at learning rate 0 and save the unchanged model.
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(
                f"max_steps must be a positive number of optimizer steps, or -1 to train for num_train_epochs; got "
                f"{self.max_steps}"
            )
        if self.max_steps == -1 and not (math.isfinite(self.num_train_epochs) and self.num_train_epochs > 0):
            raise ValueError(
                f"num_train_epochs must be positive when max_steps=-1 sets the run's length by epochs; got "
                f"{self.num_train_epochs}"
            )
        if self.output_dir is not None and os.path.isfile(self.output_dir):
            raise ValueError(
                f"output_dir {self.output_dir} is a file: checkpoints and the model need a folder"
            )
