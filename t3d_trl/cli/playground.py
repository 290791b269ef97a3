"""``t3d-trl playground``: watch models decode side by side in a browser (a Gradio page).

    t3d-trl playground                                   # the packaged teachers, nothing to download
    t3d-trl playground --quickstart_dir t3d-quickstart  # + the teacher and students of a quickstart run
    t3d-trl playground --models teacher=JetLM/SDAR-4B-Chat t3d=./t3d-out \\
        --columns teacher:tokens_per_step=1 t3d:tokens_per_step=4 teacher:threshold=0.9

Up to three columns, each a model and its decoding settings (``NAME[:key=value,...]``, keys:
tokens_per_step, threshold, block_length, max_new_tokens, cache, temperature; threshold=0 is static decoding and
temperature=0 greedy, whatever the model saved), all editable in the page. The columns' models load before the
page is served, and settings a column's model refuses are named then. Serves on 127.0.0.1 unless ``--host``
says otherwise; ``--share`` (a public Gradio link) is off unless given. Needs the ``playground`` extra:
``pip install "t3d-trl[playground]"``. This is :func:`t3d_trl.playground.build_app`.
"""

from __future__ import annotations

import argparse
import sys

from .checks import check_dataset_source
from .parsing import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="t3d-trl playground", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="models as in `t3d-trl eval`: NAME=PATH or PATH (a folder, Hub repo id or peft adapter); default: "
        "the packaged teachers",
    )
    parser.add_argument(
        "--quickstart_dir", default=None, help="output folder of a finished `t3d-trl quickstart`: its models"
    )
    parser.add_argument(
        "--columns",
        nargs="+",
        default=[],
        metavar="NAME[:key=value,...]",
        help="up to three columns, e.g. teacher:tokens_per_step=1 t3d:tokens_per_step=4 teacher:threshold=0.9",
    )
    parser.add_argument(
        "--trajectories", default=None, help="trajectory dataset of the replay tab (folder or Hub id)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default: Gradio's (7860, or the next free)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        import gradio  # noqa: F401
    except ImportError:
        print('t3d-trl playground: needs Gradio: pip install "t3d-trl[playground]"', file=sys.stderr)
        return 2
    from ..models.auto import check_model_source
    from ..playground import build_app
    from ..playground.session import ColumnSpec, default_models, quickstart_models
    from .eval import EvalConfig

    if args.models:  # named as `eval` names them; a quickstart run's models come too
        quickstart = quickstart_models(args.quickstart_dir) if args.quickstart_dir else {}
        models = {**quickstart, **EvalConfig(models=args.models).model_paths()}
    else:
        models = default_models(args.quickstart_dir)
    for path in models.values():
        check_model_source(path)
    columns = [ColumnSpec.parse(text) for text in args.columns]
    # Everything the page would fail on later is checked before it is served: here what needs no loading,
    # in build_app each column's settings against its model.
    for column in columns:
        if column.model not in models:  # a column may name a folder or Hub id of its own
            check_model_source(column.model)
    if args.trajectories:
        check_dataset_source(args.trajectories, "trajectories")
    app = build_app(
        models,
        columns,
        quickstart_dir=args.quickstart_dir,
        trajectories=args.trajectories,
        dtype=args.dtype,
        device=args.device,
    )
    app.launch(server_name=args.host, server_port=args.port, share=args.share)
    return 0
