"""``t3d-trl generate``: one prompt in, one completion out, with the decoding settings as flags.

    t3d-trl generate --model JetLM/SDAR-4B-Chat --template math --prompt "What is 7 * 8?" \\
        --block_length 4 --tokens_per_step 2 --verbose

Decoding flags left out keep the settings saved with the model. The completion goes to stdout; with
``--verbose`` the decoding statistics (NFE, tokens, tokens per step, finished, time, tokens/s) go to stderr on one
line; ``--show_steps`` draws the canvas on stderr after every forward pass (redrawn in place on a terminal), then
that line. This is
:func:`t3d_trl.evaluation.completions.generate_completions` on one prompt.
"""

from __future__ import annotations

import argparse
import sys

from .decoding import add_decoding_arguments, decoding_overrides, str_to_bool
from .parsing import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="t3d-trl generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub repo id")
    parser.add_argument("--prompt", required=True, help="the user message; '-' reads it from stdin")
    parser.add_argument(
        "--template", default="plain", help="math, code, plain (the default) or a pattern with {problem}"
    )
    parser.add_argument(
        "--use_chat_template",
        type=str_to_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="{true,false}",
        help="wrap the prompt in the chat template (default: true)",
    )
    parser.add_argument(
        "--no_use_chat_template",
        dest="use_chat_template",
        action="store_false",
        help="the prompt as it is, without the chat template",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the modeling code a checkpoint ships (auto_map); read it first",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print NFE, tokens, tokens per step, finished, seconds and tokens/s to stderr",
    )
    parser.add_argument(
        "--show_steps",
        action="store_true",
        help="watch it decode: redraw the canvas on stderr after every forward pass (masks visible, each "
        "step's new tokens highlighted), then the --verbose line",
    )
    decoding = parser.add_argument_group("decoding (left out: the settings saved with the model)")
    add_decoding_arguments(decoding)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = decoding_overrides(args)
    # The newline `echo` ends stdin with is not part of the prompt.
    prompt = sys.stdin.read().removesuffix("\n") if args.prompt == "-" else args.prompt

    import torch

    from ..data.prompts import format_user_message
    from ..evaluation.completions import generate_completions
    from ..evaluation.runner import load_model
    from ..generation.streamers import TerminalStreamer

    message = format_user_message(args.template, {"problem": prompt})
    model, tokenizer = load_model(args.model, args.dtype, args.device, args.trust_remote_code)
    config = model.diffusion_generation_config.update(**overrides)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(args.seed)
    out = generate_completions(
        model,
        tokenizer,
        [message],
        config,
        use_chat_template=args.use_chat_template,
        generator=generator,
        progress=False,
        streamer=TerminalStreamer(tokenizer, stream=sys.stderr) if args.show_steps else None,
    )
    print(out.completions[0])
    if args.show_steps or args.verbose:  # one statistics line, whichever flags asked for it
        nfe, tokens = out.nfe[0], out.num_tokens[0]
        # Said in words: a model or task without an end-of-sequence token (the demo tasks) never "finishes".
        finished = (
            "True" if out.finished[0] else f"False (no EOS within max_new_tokens={config.max_new_tokens})"
        )
        print(
            f"nfe={nfe} tokens={tokens} tokens/step={tokens / max(nfe, 1):.2f} finished={finished} "
            f"seconds={out.seconds:.3f} tokens/s={out.tokens_per_second:.1f}",
            file=sys.stderr,
        )
    return 0
