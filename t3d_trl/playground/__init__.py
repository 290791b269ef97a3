"""``t3d-trl playground``: watch diffusion LMs decode, side by side, in a browser (Gradio).

``build_app(...)`` returns the page; ``t3d-trl playground`` serves it on 127.0.0.1, and ``examples/space_app.py``
is a Hugging Face Space around it. Needs the ``playground`` extra (``pip install "t3d-trl[playground]"``).
"""

from .app import build_app
from .session import ColumnSpec, ModelRegistry, default_columns, default_models

__all__ = ["ColumnSpec", "ModelRegistry", "build_app", "default_columns", "default_models"]
