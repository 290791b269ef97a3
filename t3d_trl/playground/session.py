"""What the playground runs, without Gradio: models by name, columns of decoding settings, live decoding of
one prompt per column through a step streamer, and the replay of a stored trajectory.

* :class:`ModelRegistry`: models named as in ``t3d-trl eval`` (``NAME=PATH``, Hub ids or folders, adapters too),
  loaded on first use with :func:`t3d_trl.evaluation.runner.load_model`; a path typed in the page loads too.
* :func:`default_models`: the packaged teachers, and the teacher and students of a finished ``t3d-trl
  quickstart`` run.
* :class:`ColumnSpec`: one column, a model and its decoding settings (``teacher:tokens_per_step=4``);
  :func:`check_columns` checks each against its model before the page is served.
* :func:`run_columns`: decodes the prompt column after column in a background thread and queues every
  forward pass; :class:`ColumnView` turns them into the column's HTML.
* :func:`replay_view`: one row of a trajectory dataset as the frames of the same animation.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ..demo.quickstart import METHODS, PACKAGED_TEACHERS
from ..diffusion.forward import accepts_4d_mask, max_positions
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.streamers import DiffusionStep, DiffusionStreamer, token_pieces, token_separator
from .render import CanvasState, canvas_html, column_html, error_html, stats_html, text_html

logger = logging.getLogger(__name__)

MAX_COLUMNS = 3
#: Errors that bad input raises (a missing folder, settings a model refuses): shown in the page as they are.
INPUT_ERRORS = (ValueError, FileNotFoundError, OSError, TypeError)


# ------------------------------------------------------------------------------------------------ models
def default_models(quickstart_dir: str | Path | None = None) -> dict[str, str]:
    """Models that need no download: the packaged teachers (named after their task), and with
    ``quickstart_dir`` the run's ``teacher`` and its students (``t3d``, ``td``, ...)."""
    models = {
        path.name: str(path)
        for path in sorted(PACKAGED_TEACHERS.iterdir())
        if (path / "config.json").is_file()
    }
    if quickstart_dir is not None:
        models = {**quickstart_models(quickstart_dir), **models}
    return models


def quickstart_models(quickstart_dir: str | Path) -> dict[str, str]:
    """``teacher`` and the students of a finished quickstart run (read from its ``results.json``)."""
    folder = Path(quickstart_dir)
    results_file = folder / "results.json"
    if not results_file.is_file():
        raise FileNotFoundError(
            f"{folder} has no results.json: not the output folder of a finished quickstart run"
        )
    results = json.loads(results_file.read_text())
    teacher = (
        folder / "teacher" if results.get("teacher") == "trained here" else Path(results.get("teacher", ""))
    )
    # The packaged teacher of another install is this one's; any other teacher is the one recorded, checked
    # (and named in the error) where the models load, so that `--models teacher=PATH` can replace a moved one.
    if not (teacher / "config.json").is_file() and teacher.parts[-3:] == (
        "demo",
        "teachers",
        results["task"],
    ):
        teacher = PACKAGED_TEACHERS / results["task"]
    models = {"teacher": str(teacher)}
    for method in results.get("config", {}).get("methods", []):
        if (folder / method / "config.json").is_file():
            models[method] = str(folder / method)
    return models


class ModelRegistry:
    """Named models, loaded once on first use (thread-safe). A name that is not registered is read as a path or
    Hub id, as ``t3d-trl eval`` reads ``--models PATH``.

    Args:
        models: name -> path / Hub id, or name -> an already loaded ``(model, tokenizer)``.
        dtype, device: as :func:`t3d_trl.evaluation.runner.load_model` takes them.
        allow_paths: also load a path or Hub id that is not a registered name (a public page may want only
            its own models: any visitor could otherwise make the server download any repo).
    """

    def __init__(
        self,
        models: Mapping[str, Any],
        dtype: str = "auto",
        device: str | None = None,
        allow_paths: bool = True,
    ) -> None:
        self.sources = dict(models)
        self.dtype, self.device, self.allow_paths = dtype, device, allow_paths
        self._loaded: dict[str, tuple[Any, Any]] = {
            name: value for name, value in self.sources.items() if isinstance(value, tuple)
        }
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self.sources)

    def check(self, name: str) -> str:
        """``name`` stripped, or the ``ValueError`` of a name this registry does not load."""
        name = name.strip()
        if not name:
            raise ValueError("no model chosen")
        if name not in self.sources and not self.allow_paths:
            raise ValueError(f"model {name!r} is not one of this page's models ({', '.join(self.sources)})")
        return name

    def get(self, name: str) -> tuple[Any, Any]:
        """``(model, tokenizer)`` of a registered name, or of a path / Hub id."""
        from ..evaluation.runner import load_model

        name = self.check(name)
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = load_model(self.sources.get(name, name), self.dtype, self.device)
            return self._loaded[name]


# ------------------------------------------------------------------------------------------------ columns
@dataclass
class ColumnSpec:
    """One column of the page: a model and its decoding settings (``None``: the model's saved setting).

    Written on the command line as ``NAME[:key=value,...]``, e.g. ``teacher:tokens_per_step=1`` or
    ``t3d:tokens_per_step=4,block_length=8``; the keys are the fields below. ``threshold=0`` is static decoding
    and ``temperature=0`` greedy decoding, whatever the model saved. The settings are checked as
    :class:`DiffusionGenerationConfig` checks them (``ValueError``); what depends on the model is checked
    against it by :func:`check_columns`.
    """

    model: str
    tokens_per_step: int | None = None
    threshold: float | None = None
    block_length: int | None = None
    max_new_tokens: int | None = None
    cache: str | None = None
    temperature: float | None = None

    def __post_init__(self) -> None:
        # The config's own checks over its class defaults: a negative count, a threshold above 1, a cache
        # that does not exist are refused when the column is written, not at every Run.
        DiffusionGenerationConfig().update(**self.overrides())

    @classmethod
    def parse(cls, text: str) -> ColumnSpec:
        name, _, settings = text.partition(":")
        if not name.strip():
            raise ValueError(f"column {text!r}: give a model name first (NAME[:key=value,...])")
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in settings.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in SETTINGS or not value.strip():
                raise ValueError(
                    f"column {text!r}: {item!r} is not key=value with a key in {sorted(SETTINGS)}"
                )
            if key in values:
                raise ValueError(f"column {text!r}: {key} is given twice")
            values[key] = value
        try:
            return cls.from_settings(name.strip(), values)
        except ValueError as err:
            raise ValueError(f"column {text!r}: {err}") from err

    @classmethod
    def from_settings(cls, model: str, settings: Mapping[str, Any]) -> ColumnSpec:
        """A column from raw values (text or numbers, as typed on the command line or in the page); ``None`` or
        an empty text leaves a setting to the model."""
        values: dict[str, Any] = {}
        for key, value in settings.items():
            text = "" if value is None else str(value).strip()
            if text:
                kind = SETTINGS[key]
                try:
                    values[key] = kind(text)
                except ValueError as err:
                    raise ValueError(f"{key} must be {kind.__name__}, got {text!r}") from err
        return cls(model=model, **values)

    def overrides(self) -> dict[str, Any]:
        """The ``DiffusionGenerationConfig`` fields this column sets."""
        values = {name: getattr(self, name) for name in SETTINGS if getattr(self, name) is not None}
        if values.get("threshold") == 0:  # static decoding: no threshold, whatever the model saved
            values["threshold"] = None
        return values

    @property
    def label(self) -> str:
        settings = ", ".join(
            f"{name}={getattr(self, name)}" for name in SETTINGS if getattr(self, name) is not None
        )
        return f"{self.model} ({settings})" if settings else self.model


#: The settings of a column and the type of each: the fields of :class:`ColumnSpec` after ``model``.
SETTINGS: dict[str, type] = {
    f.name: int if "int" in f.type else float if "float" in f.type else str
    for f in fields(ColumnSpec)
    if f.name != "model"
}


def default_columns(models: Sequence[str]) -> list[ColumnSpec]:
    """The page's first columns: the teacher at one token per step, a student (or the same model) at 4, and the
    teacher with threshold 0.9 (the quickstart's budgets). The teacher is the model named ``teacher`` (else the
    first), the student the first of the quickstart's methods (``t3d``, ``td``, ...) among ``models``."""
    if not models:
        return []
    teacher = "teacher" if "teacher" in models else models[0]
    student = next((name for name in METHODS if name in models), teacher)
    return [
        ColumnSpec(teacher, tokens_per_step=1),
        ColumnSpec(student, tokens_per_step=4),
        ColumnSpec(teacher, tokens_per_step=1, threshold=0.9),
    ]


def check_columns(registry: ModelRegistry, specs: Sequence[ColumnSpec]) -> None:
    """Refuse, naming the column, a model the page cannot offer and settings a column's model cannot decode
    with (the block arithmetic, a cache of the wrong kind, a budget past its positions). Loads the columns' models, once every name is known
    to be offered: before the page is served, not at every Run."""

    def refuse(index: int, spec: ColumnSpec, err: ValueError) -> ValueError:
        return ValueError(f"column {index + 1}, {spec.label}: {err}")

    for index, spec in enumerate(specs):
        try:
            registry.check(spec.model)
        except ValueError as err:
            raise refuse(index, spec, err) from err
    for index, spec in enumerate(specs):
        model, _ = registry.get(spec.model)
        diffusion = model.diffusion_config
        try:
            config = generation_config(model, spec)
            config.resolve(diffusion.block_size if diffusion.is_block_causal else None)
            config.check_model(diffusion.is_block_causal, accepts_4d_mask(model))
            limit = max_positions(model)
            if limit is not None and config.max_new_tokens >= limit:
                raise ValueError(
                    f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt: the model numbers "
                    f"{limit} positions (max_position_embeddings)"
                )
        except ValueError as err:
            raise refuse(index, spec, err) from err


# ------------------------------------------------------------------------------------------------ live runs
class _QueueStreamer(DiffusionStreamer):
    """Puts each forward pass of one column on the shared event queue."""

    def __init__(self, events: queue.Queue, column: int):
        self.events, self.column = events, column

    def put(self, step: DiffusionStep) -> None:
        self.events.put((self.column, "step", step))


def run_columns(
    registry: ModelRegistry,
    prompt: str,
    columns: Sequence[ColumnSpec | None],
    use_chat_template: bool = True,
    seed: int = 0,
) -> queue.Queue:
    """Decode ``prompt`` with every column in a background thread, one column after the other (so that each
    column's wall time is its own), and return the queue of its events: ``(column, "step", DiffusionStep)``
    after every forward pass, then ``(column, "done", Generations)`` or ``(column, "error", message)``, and
    ``None`` at the end."""
    events: queue.Queue = queue.Queue()

    def work() -> None:
        for index, spec in enumerate(columns):
            if spec is None:
                continue
            try:
                events.put(
                    (
                        index,
                        "done",
                        decode_one(registry, prompt, spec, use_chat_template, seed, events, index),
                    )
                )
            except INPUT_ERRORS as err:
                events.put((index, "error", " ".join(str(err).split()) or type(err).__name__))
            except Exception as err:  # a bug: the page still says so, the log has the traceback
                logger.exception("playground column %d failed", index)
                events.put((index, "error", f"{type(err).__name__}: {err}"))
        events.put(None)

    threading.Thread(target=work, daemon=True, name="t3d-playground-run").start()
    return events


def decode_one(
    registry: ModelRegistry,
    prompt: str,
    spec: ColumnSpec,
    use_chat_template: bool = True,
    seed: int = 0,
    events: queue.Queue | None = None,
    column: int = 0,
) -> Any:
    """One column's decoding of ``prompt``: :func:`~t3d_trl.evaluation.completions.generate_completions` with the
    column's settings over the model's saved ones (streamed to ``events`` when given)."""
    from ..evaluation.completions import generate_completions

    if not prompt.strip():
        raise ValueError("the prompt is empty: type one first")
    model, tokenizer = registry.get(spec.model)
    config = generation_config(model, spec)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return generate_completions(
        model,
        tokenizer,
        [prompt],
        config,
        use_chat_template=use_chat_template,
        generator=generator,
        progress=False,
        streamer=_QueueStreamer(events, column) if events is not None else None,
    )


def generation_config(model: Any, spec: ColumnSpec) -> DiffusionGenerationConfig:
    """The model's saved settings with the column's on top."""
    return model.diffusion_generation_config.update(**spec.overrides())


class ColumnView:
    """The HTML of one column as its events arrive."""

    def __init__(self, title: str, tokenizer: Any = None, label: str = "NFE"):
        self.title, self.label = title, label
        self.tokenizer: Any = None
        self.special: set[int] = set()
        self.separator = ""
        if tokenizer is not None:
            self.attach(tokenizer)
        self.state: CanvasState | None = None
        self.nfe = 0
        self.footer: list[str] = []
        self.error: str | None = None

    def attach(self, tokenizer: Any) -> None:
        """The tokenizer that turns the column's token ids into text."""
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.separator = token_separator(tokenizer)

    def step(self, step: DiffusionStep) -> None:
        """Show one forward pass (row 0 of the batch)."""
        tokens, committed = step.tokens[0].tolist(), step.committed[0].tolist()
        if self.state is None:
            self.state = CanvasState([""] * len(tokens), [0] * len(tokens), separator=self.separator)
        self.nfe = int(step.nfe[0])
        # The whole row's pieces: a token that completes a character split over byte-level tokens changes how
        # its earlier parts show.
        pieces = token_pieces(self.tokenizer, tokens)
        masked = step.masked[0].tolist()
        for i, flag in enumerate(committed):
            if flag:
                self.state.steps[i] = self.nfe
                if tokens[i] in self.special:
                    self.state.hidden.add(i)
            if not masked[i]:
                self.state.pieces[i] = pieces[i]
        self.state.latest = self.nfe

    def frame(self, pieces: list[str], steps: list[int], latest: int, hidden: set[int]) -> None:
        """Show a stored state (the replay)."""
        self.state = CanvasState(pieces, steps, latest, self.separator, hidden)
        self.nfe = latest

    def finish(self, text: str, nfe: int, tokens: int, seconds: float | None) -> None:
        if self.state is not None:  # what is still masked lies after the completion's end: not drawn
            self.state.hidden |= {i for i, step in enumerate(self.state.steps) if not step}
            self.state.latest = 0
        self.nfe = nfe
        self.footer = [text_html(text), stats_html(nfe, tokens, seconds, done=True, label=self.label)]

    def fail(self, message: str) -> None:
        self.error = message

    def html(self) -> str:
        if self.error is not None:
            return column_html(self.title, [error_html(self.error)])
        body = [canvas_html(self.state)] if self.state is not None else []
        return column_html(self.title, body + (self.footer or [stats_html(self.nfe, label=self.label)]))


# ------------------------------------------------------------------------------------------------ replay
def replay_frames(
    dataset_path: str, row_index: int, tokenizer_source: str | None = None
) -> Iterator[ColumnView]:
    """The animation of one stored trajectory: a :class:`ColumnView` after each of the teacher's decode steps,
    from its stored commit order (``decode_step``), then the finished row.

    ``tokenizer_source``: where to read the tokenizer (default: the ``teacher`` of the dataset's metadata).
    """
    from ..data.hub import load_trajectories
    from ..data.schema import TrajectoryMetadata
    from ..models.auto import load_tokenizer

    if not str(dataset_path).strip():
        raise ValueError("give the path of a trajectory dataset")
    dataset = load_trajectories(dataset_path)
    if not 0 <= row_index < len(dataset):
        raise ValueError(f"row {row_index} is out of range: the dataset has {len(dataset)} rows")
    metadata = TrajectoryMetadata.from_dataset(dataset)
    row = dataset[int(row_index)]
    source = (tokenizer_source or "").strip() or metadata.teacher
    try:
        tokenizer = load_tokenizer(source)
    except OSError as err:
        raise FileNotFoundError(
            f"cannot read the tokenizer of {source!r} (the dataset's teacher): give a tokenizer path ({err})"
        ) from err
    ids, decode_step = list(row["completion_ids"]), list(row["decode_step"])
    order = sorted({step for step in decode_step if step > 0})
    rank = {step: k + 1 for k, step in enumerate(order)}  # pass number, as the live view counts them
    pieces = token_pieces(tokenizer, ids)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    hidden = {i for i, token in enumerate(ids) if token in special}
    view = ColumnView(f"{metadata.teacher} · row {row['id']}", tokenizer, label="steps")
    for k in range(1, len(order) + 1):
        steps = [rank.get(step, 0) if rank.get(step, 0) <= k else 0 for step in decode_step]
        view.frame(pieces, steps, k, hidden)
        yield view
    view.finish(row["completion"], len(order), len(ids), None)
    yield view
