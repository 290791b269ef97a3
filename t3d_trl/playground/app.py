"""The Gradio page of ``t3d-trl playground``: up to three columns decode one prompt side by side, step by step,
and a tab replays a stored trajectory.

:func:`build_app` returns the ``gradio.Blocks`` (``app.launch()`` serves it; ``examples/space_app.py`` is a
Hugging Face Space around it). The handlers are plain generators (:func:`decode_page`, :func:`replay_page`) so
that they can be driven without a browser.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..generation.configuration import CACHES
from .render import error_html
from .session import (
    INPUT_ERRORS,
    MAX_COLUMNS,
    SETTINGS,
    ColumnSpec,
    ColumnView,
    ModelRegistry,
    check_columns,
    default_columns,
    default_models,
    replay_frames,
    run_columns,
)

OFF = "(off)"
SAVED = "(saved)"
CACHE_CHOICES = [SAVED, *CACHES]
#: Page inputs of one column, in order: the model, then its settings.
COLUMN_FIELDS = ("model", *SETTINGS)
_INTRO = (
    "### t3d-trl playground\n"
    "Each column decodes the prompt with a model and its decoding settings (empty: the model's saved ones; "
    "threshold 0 is static decoding, temperature 0 greedy). Masked positions show as ░; every token sits on "
    "the colour of the forward pass that committed it (hover for the step), the latest pass's tokens outlined. "
    "NFE counts forward passes."
)


def column_spec(values: Sequence[Any]) -> ColumnSpec | None:
    """One column's page inputs (``COLUMN_FIELDS``) as its spec, ``None`` when it is off; ``ValueError`` for a
    setting that is not a number or that decoding refuses."""
    model, *settings = values
    if not model or model == OFF:
        return None
    settings = [None if value == SAVED else value for value in settings]
    return ColumnSpec.from_settings(str(model), dict(zip(SETTINGS, settings)))


def _column(values: Sequence[Any]) -> tuple[ColumnSpec | None, ColumnView | None]:
    """A column's spec and view; a refused setting shows in the view, and the column does not run."""
    try:
        spec = column_spec(values)
    except ValueError as err:
        view = ColumnView(str(values[0]))
        view.fail(str(err))
        return None, view
    return spec, ColumnView(spec.label) if spec else None


def decode_page(
    registry: ModelRegistry,
    prompt: str,
    use_chat_template: bool,
    seconds_per_step: float,
    values: Sequence[Any],
) -> Iterator[tuple[str, list[str | None]]]:
    """The Run button: yields ``(status HTML, [column HTML or None (unchanged)])`` after every shown step.

    Every column advances one forward pass per frame, so a few-step student finishes in fewer frames than its
    teacher; the decoding itself runs column after column in the background at full speed. The status carries
    the run's number and state (``data-run``, ``data-state``: running, done or error), so that a page script or
    a test knows which run it shows.
    """
    run = next(_RUNS)
    width = len(COLUMN_FIELDS)
    columns = [_column(values[i : i + width]) for i in range(0, len(values), width)]
    specs, views = [spec for spec, _ in columns], [view for _, view in columns]
    problem = None
    if not (prompt or "").strip():
        problem = "The prompt is empty: type a prompt, then Run."
    elif not any(views):
        problem = "Every column is off: choose a model in at least one column."
    if problem is not None:
        yield _status(run, "error", error_html(problem)), [None] * len(views)
        return
    htmls = [view.html() if view else _off() for view in views]
    yield _status(run, "running", "decoding&hellip;"), htmls
    events = run_columns(registry, prompt, specs, use_chat_template)
    pending: list[deque] = [deque() for _ in specs]
    running = True
    while running or any(pending):
        try:  # wait for the next event only when there is nothing left to show
            event = events.get(timeout=None if not any(pending) else 0)
            while True:
                if event is None:
                    running = False
                    break
                pending[event[0]].append(event)
                event = events.get_nowait()
        except queue.Empty:
            pass
        stepped = False
        for view, spec, todo in zip(views, specs, pending):
            if todo:
                stepped |= todo[0][1] == "step"
                _show(view, spec, registry, todo.popleft())
        htmls = [view.html() if view else _off() for view in views]
        yield _status(run, "running", "decoding&hellip;"), htmls
        if stepped and seconds_per_step > 0:
            time.sleep(seconds_per_step)  # every step stays on screen, however fast the model decodes
    yield _status(run, "done", ""), htmls


_RUNS = itertools.count(1)


def _status(run: int, state: str, body: str) -> str:
    return f'<div class="t3d-run" data-run="{run}" data-state="{state}">{body}</div>'


def _show(view: ColumnView, spec: ColumnSpec, registry: ModelRegistry, event: tuple) -> None:
    _, kind, payload = event
    if kind == "error":
        view.fail(payload)
        return
    if view.tokenizer is None:
        view.attach(registry.get(spec.model)[1])  # loaded by now: the run needed it
    if kind == "step":
        view.step(payload)
    else:
        view.finish(payload.completions[0], payload.nfe[0], payload.num_tokens[0], payload.seconds)


def _off() -> str:
    return '<div class="t3d-column" style="color:#9ca3af">(off)</div>'


def replay_page(dataset_path: str, row: Any, tokenizer_source: str, seconds_per_step: float) -> Iterator[str]:
    """The Replay button: the HTML of every frame of one stored trajectory, or a message naming the problem."""
    try:
        for view in replay_frames(dataset_path, int(row or 0), tokenizer_source):
            yield view.html()
            if seconds_per_step > 0:
                time.sleep(seconds_per_step)
    except INPUT_ERRORS as err:
        yield error_html(" ".join(str(err).split()))


def build_app(
    models: Mapping[str, Any] | None = None,
    columns: Sequence[ColumnSpec | str] | None = None,
    *,
    quickstart_dir: str | Path | None = None,
    trajectories: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    seconds_per_step: float = 0.15,
    allow_paths: bool = True,
) -> Any:
    """The playground as a ``gradio.Blocks`` (call ``.launch()`` on it).

    Args:
        models: name -> path or Hub id (adapters too) or a loaded ``(model, tokenizer)``; default: the packaged
            teachers, plus the teacher and students of ``quickstart_dir``. Any other path or Hub id can be
            typed into a column's model box.
        columns: up to three :class:`ColumnSpec` (or ``NAME[:key=value,...]`` strings); default: the teacher at
            TokPS 1, a student (or the teacher) at TokPS 4 and the teacher at threshold 0.9. Their models load
            here, and a column whose model the page does not offer or whose settings its model refuses raises
            ``ValueError`` (see :func:`~t3d_trl.playground.session.check_columns`); other models load on first
            use.
        quickstart_dir: output folder of a finished ``t3d-trl quickstart`` run.
        trajectories: the replay tab's dataset (default: the quickstart run's trajectories, when given).
        dtype, device: how models load (see :func:`t3d_trl.evaluation.runner.load_model`).
        seconds_per_step: how long each step stays on screen (changeable in the page).
        allow_paths: let the model boxes take any folder or Hub id, not only the names of ``models``
            (``examples/space_app.py`` turns it off: a public page should not download what visitors type).
    """
    import gradio as gr

    registry = ModelRegistry(
        models if models is not None else default_models(quickstart_dir), dtype, device, allow_paths
    )
    specs = [ColumnSpec.parse(c) if isinstance(c, str) else c for c in columns or []]
    specs = specs or default_columns(registry.names)
    if len(specs) > MAX_COLUMNS:
        raise ValueError(f"the playground has at most {MAX_COLUMNS} columns, got {len(specs)}")
    check_columns(registry, specs)  # else every Run would fail on them
    if (
        trajectories is None
        and quickstart_dir is not None
        and (Path(quickstart_dir) / "trajectories").is_dir()
    ):
        trajectories = str(Path(quickstart_dir) / "trajectories")

    with gr.Blocks(title="t3d-trl playground", analytics_enabled=False) as app:
        gr.Markdown(_INTRO)
        with gr.Tab("Decode"):
            prompt = gr.Textbox(label="Prompt", lines=2, elem_id="t3d-prompt")
            with gr.Row():
                chat = gr.Checkbox(value=True, label="chat template (when the tokenizer has one)")
                delay = gr.Slider(0, 1, value=seconds_per_step, step=0.05, label="seconds per step shown")
                run = gr.Button("Run", variant="primary", elem_id="t3d-run")
            status = gr.HTML(elem_id="t3d-status")
            inputs, views = [], []
            with gr.Row():
                for i in range(MAX_COLUMNS):
                    spec = specs[i] if i < len(specs) else ColumnSpec(OFF)
                    with gr.Column(elem_id=f"t3d-column-{i}"):
                        column_inputs, view = _column_inputs(gr, i, spec, registry)
                        inputs += column_inputs
                        views.append(view)

            def on_run(prompt_text, use_chat, seconds, *values):
                for status_html, htmls in decode_page(registry, prompt_text, use_chat, seconds, values):
                    yield [status_html, *[gr.update() if h is None else h for h in htmls]]

            for trigger in (run.click, prompt.submit):
                trigger(on_run, [prompt, chat, delay, *inputs], [status, *views])
        if registry.allow_paths or trajectories:
            _replay_tab(gr, trajectories, seconds_per_step, registry.allow_paths)
    app.queue(default_concurrency_limit=1)
    return app


def _replay_tab(gr: Any, trajectories: str | None, seconds_per_step: float, allow_paths: bool) -> None:
    """The replay tab; without ``allow_paths`` it replays only ``trajectories``, with their teacher's tokenizer
    (a visitor's request names no path: typed values are ignored on the server, not only greyed out)."""
    with gr.Tab("Replay trajectory"):
        with gr.Row():
            path = gr.Textbox(
                value=trajectories or "",
                label="trajectory dataset" + (" (folder or Hub id)" if allow_paths else ""),
                interactive=allow_paths,
                elem_id="t3d-replay-path",
            )
            row = gr.Number(value=0, precision=0, label="row", elem_id="t3d-replay-row")
            tokenizer = gr.Textbox(label="tokenizer (empty: the dataset's teacher)", visible=allow_paths)
        delay = gr.Slider(0, 1, value=seconds_per_step, step=0.05, label="seconds per step shown")
        replay = gr.Button("Replay", variant="primary", elem_id="t3d-replay")
        view = gr.HTML(elem_id="t3d-replay-view")

        def on_replay(
            dataset_path: str, row_value: Any, tokenizer_source: str, seconds: float
        ) -> Iterator[str]:
            if not allow_paths:
                dataset_path, tokenizer_source = trajectories or "", ""
            yield from replay_page(dataset_path, row_value, tokenizer_source, seconds)

        replay.click(on_replay, [path, row, tokenizer, delay], [view])


def _column_inputs(gr: Any, index: int, spec: ColumnSpec, registry: ModelRegistry) -> tuple[list[Any], Any]:
    """The inputs of one column (in ``COLUMN_FIELDS`` order) and its view, which sits under the model box."""
    model = gr.Dropdown(
        [OFF, *registry.names],
        value=spec.model,
        allow_custom_value=registry.allow_paths,
        label=f"column {index + 1}: model"
        + (" (a name, a folder or a Hub id)" if registry.allow_paths else ""),
        elem_id=f"t3d-model-{index}",
    )
    view = gr.HTML(elem_id=f"t3d-view-{index}")

    def setting(name: str, label: str) -> Any:
        # Text, not gr.Number: a number box cannot be empty (the browser shows and sends 0), and 0 is a setting.
        value = getattr(spec, name)
        return gr.Textbox("" if value is None else str(value), label=label, placeholder="saved", max_lines=1)

    with gr.Accordion("decoding settings (empty: the model's saved setting)", open=True):
        with gr.Row():
            tokps = setting("tokens_per_step", "tokens per step")
            threshold = setting("threshold", "threshold (0: static)")
        with gr.Row():
            block = setting("block_length", "block length")
            new_tokens = setting("max_new_tokens", "max new tokens")
        with gr.Row():
            cache = gr.Dropdown(CACHE_CHOICES, value=spec.cache or SAVED, label="cache")
            temperature = setting("temperature", "temperature (0: greedy)")
    return [model, tokps, threshold, block, new_tokens, cache, temperature], view
