"""Shared fixtures: a local character-level tokenizer with a mask token and tiny models, all built in-process
(the plain helpers behind them are in ``testing_utils.py``)."""

from __future__ import annotations

import os

import pytest
import torch
from testing_utils import (
    BENCHMARK_ROWS,
    build_bidirectional_model,
    build_block_causal_model,
    build_modernbert_model,
    build_tokenizer,
)
from transformers import PreTrainedTokenizerFast

from t3d_trl.models.auto import _with_mixin  # noqa: F401  (imported so fixtures share the mixin classes)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # tiny models: threads cost more than they give


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture
def bidirectional_model(tokenizer):
    return build_bidirectional_model(tokenizer)


@pytest.fixture
def block_causal_model(tokenizer):
    return build_block_causal_model(tokenizer)


@pytest.fixture
def modernbert_model(tokenizer):
    return build_modernbert_model(tokenizer)


@pytest.fixture
def benchmark_files(tmp_path):
    """benchmark name -> a local jsonl file holding its ``BENCHMARK_ROWS``."""
    import json

    paths = {}
    for name, rows in BENCHMARK_ROWS.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths[name] = path
    return paths


@pytest.fixture(autouse=True)
def _isolated_benchmark_registry():
    """Whatever a test registers (directly, through ``--benchmark_modules`` or the quickstart) is gone after it:
    the benchmark registry is global state, and a leak would change what later tests see."""
    import sys

    module = sys.modules.get("t3d_trl.evaluation.benchmarks")
    before = dict(module.BENCHMARKS) if module is not None else None
    yield
    if before is not None:
        module.BENCHMARKS.clear()
        module.BENCHMARKS.update(before)


@pytest.fixture
def single_thread():
    """Run a test's tiny-model forwards on one thread: on a shared, busy CPU two threads are many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
