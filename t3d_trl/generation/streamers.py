"""Step streamers: watch ``diffusion_generate`` unmask, one forward pass at a time.

In the spirit of transformers' streamers: pass ``streamer=`` to ``model.diffusion_generate`` and the sampler
calls ``streamer.put(step)`` after every denoising forward pass with a :class:`DiffusionStep` (the canvas of the
generated region, what is still masked, what this pass committed, the block, the step count and the NFE so
far), then ``streamer.end()`` once decoding is over. A streamer only reads: tokens and NFE are the same with
or without one, and without one the sampler pays a single ``if``.

* :class:`DiffusionStreamer`: the base class.
* :class:`DiffusionIteratorStreamer`: hands the steps to another thread (``for step in streamer``), as a UI
  that runs generation in the background needs (the playground).
* :class:`TerminalStreamer`: redraws the canvas in a terminal with ANSI escapes, masks visible and each
  step's new tokens highlighted (``t3d-trl generate --show_steps``).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, TextIO

import torch

__all__ = [
    "DiffusionIteratorStreamer",
    "DiffusionStep",
    "DiffusionStreamer",
    "TerminalStreamer",
    "token_pieces",
    "token_separator",
]


@dataclass
class DiffusionStep:
    """The state of a batch after one denoising forward pass.

    Attributes:
        tokens: ``[B, max_new_tokens]`` the generated region; ``mask_token_id`` where still masked.
        masked: ``[B, max_new_tokens]`` bool, positions still masked.
        committed: ``[B, max_new_tokens]`` bool, positions this forward pass committed.
        block: index (0-based) of the decoding block this pass worked on.
        step: ``[B]`` the decode step of this pass for each row: the value ``decode_steps`` records for the
            tokens it committed (static decoding: ``block * steps_per_block + step_in_block + 1``, the same
            for every row; dynamic decoding: each row's own count).
        nfe: ``[B]`` forward passes spent on each row so far (a row stops counting once it is finished).
        mask_token_id: the model's mask token.
    """

    tokens: torch.Tensor
    masked: torch.Tensor
    committed: torch.Tensor
    block: int
    step: torch.Tensor
    nfe: torch.Tensor
    mask_token_id: int


def make_step(
    x: torch.Tensor,
    gen_index: torch.Tensor,
    commit: torch.Tensor,
    start: int,
    block: int,
    step: torch.Tensor,
    nfe: torch.Tensor,
    mask_token_id: int,
) -> DiffusionStep:
    """Build the :class:`DiffusionStep` the sampler hands out from its canvas ``x`` (``[B, T]``), the canvas index of
    each generated position, and the block-local commit mask of this pass (the block starts at ``start``)."""
    committed = torch.zeros_like(x, dtype=torch.bool)
    committed[:, start : start + commit.shape[1]] = commit
    tokens = x.gather(1, gen_index)
    return DiffusionStep(
        tokens=tokens,
        masked=tokens == mask_token_id,
        committed=committed.gather(1, gen_index),
        block=block,
        step=step.clone(),
        nfe=nfe.clone(),
        mask_token_id=mask_token_id,
    )


class DiffusionStreamer:
    """Base class of step streamers: override :meth:`put` (and :meth:`end` when there is something to finish)."""

    def put(self, step: DiffusionStep) -> None:
        """Called after every denoising forward pass."""
        raise NotImplementedError

    def end(self) -> None:
        """Called once when decoding is over."""


class StepRelay(DiffusionStreamer):
    """Hands ``streamer`` the steps of several ``diffusion_generate`` calls (the batches of one job) and ends it
    once, when the ``with`` block over them ends (an error too). Each call gets :attr:`batch`; the time the
    streamer takes (drawing, a full queue) is kept apart, as it is not decoding time (:meth:`take_seconds`)."""

    def __init__(self, streamer: DiffusionStreamer | None):
        self.streamer, self.seconds = streamer, 0.0

    @property
    def batch(self) -> StepRelay | None:
        """What to pass as one call's ``streamer``: the relay, or ``None`` without a streamer."""
        return self if self.streamer is not None else None

    def put(self, step: DiffusionStep) -> None:
        began = time.perf_counter()
        self.streamer.put(step)
        self.seconds += time.perf_counter() - began

    def end(self) -> None:
        """A call's end: the streamer ends with the ``with`` block, after the last call."""

    def take_seconds(self) -> float:
        """Seconds the streamer took since the last call of this method."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def __enter__(self) -> StepRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.streamer is not None:
            self.streamer.end()


class DiffusionIteratorStreamer(DiffusionStreamer):
    """Queues the steps for a consumer in another thread: run ``diffusion_generate`` in a thread and iterate
    over the streamer, which ends when generation does.

    Args:
        timeout: seconds ``next`` waits for a step before raising ``queue.Empty`` (``None``: forever).
    """

    def __init__(self, timeout: float | None = None):
        self.queue: queue.Queue[DiffusionStep | None] = queue.Queue()
        self.timeout = timeout

    def put(self, step: DiffusionStep) -> None:
        self.queue.put(step)

    def end(self) -> None:
        self.queue.put(None)

    def __iter__(self) -> DiffusionIteratorStreamer:
        return self

    def __next__(self) -> DiffusionStep:
        step = self.queue.get(timeout=self.timeout)
        if step is None:
            raise StopIteration
        return step


def token_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Display text of each token (join them with :func:`token_separator`).

    A character that a byte-level tokenizer (Qwen's, SDAR's, Dream's) splits over several tokens decodes to
    U+FFFD token by token: it is shown whole on the token that completes it, and the tokens before show nothing.
    Bytes that nothing completes (the rest still masked: a mask token breaks the run) stay U+FFFD.
    """
    pieces = [tokenizer.decode([i]) for i in ids]
    start = None  # the first token of a character not complete yet
    for k, piece in enumerate(pieces):
        if _REPLACEMENT not in piece:
            start = None
            continue
        start = k if start is None else start
        joined = tokenizer.decode(ids[start : k + 1])
        if _REPLACEMENT not in joined:
            pieces[start:k], pieces[k], start = [""] * (k - start), joined, None
    return pieces


def token_separator(tokenizer: Any) -> str:
    """What goes between two tokens' texts: word-level tokenizers without a decoder join tokens with spaces,
    byte-level and character-level ones concatenate them. Read off the tokenizer by decoding two ordinary
    tokens together and apart."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    sample = [i for i in range(min(len(tokenizer), 512)) if i not in special][:2]
    if len(sample) < 2:
        return ""
    a, b = token_pieces(tokenizer, sample)
    return " " if tokenizer.decode(sample) == f"{a} {b}" else ""


_REPLACEMENT = "\ufffd"  # what a token holding part of a UTF-8 character decodes to

# ANSI styles: masks dim, this step's tokens reversed, earlier tokens plain, special tokens dim.
_DIM, _NEW, _RESET = "\x1b[2m", "\x1b[1;7m", "\x1b[0m"
MASK_GLYPH = "\u2591"  # a light shade block: one cell, visible on any background


class TerminalStreamer(DiffusionStreamer):
    """Redraws the canvas of every row in a terminal after each forward pass.

    Masked positions show as ``░``, the tokens committed by the latest pass are highlighted (reverse video),
    and a status line gives the block, the step and the NFE. On a terminal the canvas is redrawn in place (the
    cursor moves back up over the previous drawing); otherwise, or with ``redraw=False``, every step is printed
    below the previous one, which keeps a log readable.

    Args:
        tokenizer: turns token ids into text.
        stream: where to draw (default: standard error, so standard output keeps the completion alone).
        redraw: redraw in place; ``None``: when ``stream`` is a terminal.
        color: use ANSI styles; ``None``: when ``stream`` is a terminal.
        skip_special_tokens: show special tokens (EOS, padding) as nothing instead of their text.
    """

    def __init__(
        self,
        tokenizer: Any,
        stream: TextIO | None = None,
        redraw: bool | None = None,
        color: bool | None = None,
        skip_special_tokens: bool = False,
    ):
        self.tokenizer = tokenizer
        self.stream = stream if stream is not None else sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.redraw = tty if redraw is None else redraw
        self.color = tty if color is None else color
        self.skip_special_tokens = skip_special_tokens
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.separator = token_separator(tokenizer)
        self._drawn_rows = 0  # terminal rows of the previous drawing (to move back over)
        self.last_step: DiffusionStep | None = None

    def render(self, step: DiffusionStep) -> str:
        """The text of one drawing: one canvas line per batch row and a status line."""
        lines = []
        for row in range(step.tokens.shape[0]):
            ids = step.tokens[row].tolist()
            pieces = token_pieces(self.tokenizer, ids)
            cells = []
            for i, (token, piece) in enumerate(zip(ids, pieces)):
                if step.masked[row, i]:
                    cells.append(self._style(MASK_GLYPH, _DIM))
                elif token in self._special:
                    cells.append("" if self.skip_special_tokens else self._style(piece, _DIM))
                elif step.committed[row, i]:
                    cells.append(self._style(piece, _NEW))
                else:
                    cells.append(piece)
            prefix = f"[{row}] " if step.tokens.shape[0] > 1 else ""
            lines.append(prefix + self.separator.join(cells))
        steps, nfe = step.step.tolist(), step.nfe.tolist()
        one = len(nfe) == 1
        status = f"block {step.block + 1} | step {steps[0] if one else steps} | nfe {nfe[0] if one else nfe}"
        lines.append(self._style(status, _DIM))
        return "\n".join(lines)

    def put(self, step: DiffusionStep) -> None:
        text = self.render(step)
        if self.redraw and self._drawn_rows:
            # Back to the first row of the previous drawing, then clear to the end of the screen.
            up = self._drawn_rows - 1
            self.stream.write((f"\x1b[{up}A" if up else "") + "\r\x1b[J")
        self.stream.write(text + "\n" if not self.redraw else text)
        self.stream.flush()
        self._drawn_rows = _terminal_rows(text, _columns(self.stream))
        self.last_step = step

    def end(self) -> None:
        if self.redraw and self._drawn_rows:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn_rows = 0

    def _style(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and text else text


def _columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` draws on (standard output may be a file while it is a terminal)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no descriptor; io.UnsupportedOperation is an OSError
        return shutil.get_terminal_size().columns


def _terminal_rows(text: str, width: int) -> int:
    """Rows ``text`` (ANSI escapes included) takes on a terminal ``width`` columns wide, wrapped lines counted."""
    width = max(width, 1)
    visible = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return sum(max(1, -(-_display_width(line) // width)) for line in visible.split("\n"))


def _display_width(line: str) -> int:
    """Terminal columns of ``line``: East Asian wide and full-width characters take two, combining marks none."""
    return sum(
        0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in "WF" else 1
        for char in line
    )
