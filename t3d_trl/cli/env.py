"""``t3d-trl env``: versions of t3d-trl and the libraries it builds on, for bug reports."""

from __future__ import annotations

import platform
from importlib import metadata

from .parsing import ArgumentParser

PACKAGES = (
    "t3d-trl",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "evaluate",
    "huggingface_hub",
    "math-verify",
    "safetensors",
    "tokenizers",
    "lm_eval",  # the optional commands' libraries: lm-eval and playground
    "gradio",
)


def collect() -> dict[str, str]:
    info = {"python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    try:
        import torch

        info["cuda available"] = str(torch.cuda.is_available())
        if torch.cuda.is_available():
            info["gpu"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except ImportError:
        pass
    return info


def main(argv: list[str]) -> int:
    ArgumentParser(prog="t3d-trl env", description=__doc__).parse_args(argv)
    for key, value in collect().items():
        print(f"- {key}: {value}")
    return 0
