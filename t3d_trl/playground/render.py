"""HTML of the playground's canvases: pure functions of the decoding state, no Gradio needed.

A canvas shows one completion's positions: masked ones as ``░``, committed ones on the colour of the forward
pass that committed them (hover: the pass number), the latest pass's tokens outlined. Styles are inline so
the HTML renders the same in any Gradio version and on any page.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..generation.streamers import MASK_GLYPH

GOLDEN_ANGLE = 137.508  # successive passes get well-separated hues


def step_color(step: int) -> str:
    """Background colour of the tokens committed by forward pass ``step`` (1-based)."""
    return f"hsl({(step - 1) * GOLDEN_ANGLE % 360:.0f}, 70%, 82%)"


@dataclass
class CanvasState:
    """What a canvas shows: one entry per generated position.

    Attributes:
        pieces: display text of each position's token (ignored where masked).
        steps: forward pass (1-based) that committed each position; 0 while masked.
        latest: the latest pass (its tokens are outlined); 0 before the first.
        separator: text between two tokens (a space for word-level tokenizers).
        hidden: special positions: committed ones (EOS, padding) draw as a dim dot on their step's colour, masked
            ones (left after the completion ended) not at all.
    """

    pieces: list[str]
    steps: list[int]
    latest: int = 0
    separator: str = ""
    hidden: set[int] = field(default_factory=set)


def canvas_html(state: CanvasState) -> str:
    """The token spans of a canvas (``<div class="t3d-canvas">``)."""
    cells = []
    for i, (piece, step) in enumerate(zip(state.pieces, state.steps)):
        if i in state.hidden and not step:
            continue
        if not step:
            cells.append(
                '<span class="t3d-mask" style="color:#9ca3af;background:#f3f4f6;border-radius:3px;'
                f'padding:0 2px">{MASK_GLYPH}</span>'
            )
            continue
        outline = "outline:2px solid #111827;" if step == state.latest else ""
        text = html.escape(piece).replace("\n", "\u21b5<br>") or "&nbsp;"
        if i in state.hidden:
            text = '<span style="color:#6b7280">&middot;</span>'
        cells.append(
            f'<span class="t3d-tok" data-step="{step}" title="committed at step {step}" '
            f'style="background:{step_color(step)};{outline}border-radius:3px;padding:0 2px;color:#111827">'
            f"{text}</span>"
        )
    separator = html.escape(state.separator).replace(" ", "&nbsp;")
    return (
        '<div class="t3d-canvas" style="font-family:ui-monospace,monospace;font-size:1.2em;line-height:2;'
        'white-space:pre-wrap;word-break:break-all">' + separator.join(cells) + "</div>"
    )


def stats_html(
    nfe: int, tokens: int | None = None, seconds: float | None = None, done: bool = False, label: str = "NFE"
) -> str:
    """The numbers under a canvas: NFE so far (``label``: ``NFE``, or ``steps`` for a replayed trajectory), and
    when ``done``, tokens per forward pass (per step) and time."""
    unit = "forward pass" if label == "NFE" else "step"
    parts = [f'{label} <b class="t3d-nfe">{nfe}</b>']
    if done and tokens is not None:
        parts.append(f'<b class="t3d-tokps">{tokens / max(nfe, 1):.2f}</b> tokens per {unit}')
    if done and seconds is not None:
        parts.append(f'<b class="t3d-seconds">{seconds:.3f}</b> s')
    return (
        f'<div class="t3d-stats" data-done="{int(done)}" data-nfe="{nfe}" style="margin-top:6px">'
        + " &middot; ".join(parts)
        + "</div>"
    )


def text_html(text: str) -> str:
    """The final completion text, as ``diffusion_generate`` returned it (cut at EOS, special tokens skipped)."""
    return (
        '<div class="t3d-text" style="margin-top:6px;font-family:ui-monospace,monospace;white-space:pre-wrap">'
        f"{html.escape(text)}</div>"
    )


def error_html(message: str) -> str:
    """A message naming what went wrong (``<div class="t3d-error">``)."""
    return (
        '<div class="t3d-error" style="color:#991b1b;background:#fee2e2;border-radius:6px;padding:8px">'
        f"{html.escape(message)}</div>"
    )


def column_html(title: str, body: Sequence[str]) -> str:
    """One column's panel: a title line and its parts."""
    return (
        f'<div class="t3d-column"><div class="t3d-title" style="font-weight:600;margin-bottom:4px">'
        f"{html.escape(title)}</div>{''.join(body)}</div>"
    )
