"""A Hugging Face Space entry point for the t3d-trl playground (teacher and student decoding side by side).

Make a Space with the Gradio SDK, copy this file into it as ``app.py`` and add a ``requirements.txt`` holding
``t3d-trl[playground]``. Choose the models and columns with the Space's variables (Settings -> Variables):

    T3D_TRL_MODELS   teacher=JetLM/SDAR-4B-Chat t3d=your-name/sdar-4b-chat-t3d     (NAME=REPO_ID, spaces between)
    T3D_TRL_COLUMNS  teacher:tokens_per_step=1 t3d:tokens_per_step=4 teacher:threshold=0.9
    T3D_TRL_TRAJECTORIES  your-name/sdar-math-trajectories                          (the replay tab, optional)

Without them the page shows the teachers packaged with t3d-trl, which need no download. A column naming a model
that is not in ``T3D_TRL_MODELS``, or with settings its model refuses, stops the Space at start-up with a
``ValueError`` naming the column (in its logs) rather than failing every Run; so does a
``T3D_TRL_TRAJECTORIES`` that is neither a folder nor a valid dataset id. Run locally,
``python examples/space_app.py`` serves on 127.0.0.1 (a Space sets ``GRADIO_SERVER_NAME=0.0.0.0`` itself).
"""

from __future__ import annotations

import os

from t3d_trl.cli.checks import check_dataset_source
from t3d_trl.playground import build_app


def _words(name: str) -> list[str]:
    return os.environ.get(name, "").split()


entries = _words("T3D_TRL_MODELS")
if any("=" not in item for item in entries):
    raise ValueError(f"T3D_TRL_MODELS holds NAME=PATH entries separated by spaces, got {entries}")
models = dict(item.split("=", 1) for item in entries) or None
trajectories = os.environ.get("T3D_TRL_TRAJECTORIES", "").strip() or None
if trajectories:  # a mistyped path or id stops the Space at start-up, as the command line does
    check_dataset_source(trajectories, "T3D_TRL_TRAJECTORIES")
demo = build_app(
    models,
    _words("T3D_TRL_COLUMNS") or None,
    trajectories=trajectories,
    allow_paths=False,  # visitors pick among these models; they cannot make the Space download others
)

if __name__ == "__main__":
    demo.launch()
