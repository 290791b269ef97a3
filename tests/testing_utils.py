"""Helpers shared by the tests (TRL's ``testing_utils`` pattern): a local character-level tokenizer with a mask
token, tiny models built in-process, benchmark rows and teacher trajectories. Fixtures that wrap them live in
``conftest.py``; test files import plain helpers from here (``from testing_utils import build_tokenizer``)."""

from __future__ import annotations

import contextlib
import socket
import string
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast, Qwen3Config

from t3d_trl import DiffusionConfig, add_diffusion_generation

SPECIAL_TOKENS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
VOCAB_SIZE = 128


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` every 50 ms until it holds or ``timeout`` seconds have passed; its last value."""
    deadline = time.monotonic() + timeout
    while not (met := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return met


def process_exited(pid: int, timeout: float = 0.0) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie nobody reaped yet), waiting up to ``timeout`` seconds
    for it to. Reads ``/proc``: tests that call it skip where there is none."""

    def exited() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    return wait_until(exited, timeout)


def free_port() -> int:
    """A free rendezvous port for a multi-process test: other test sessions may run torchrun too."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII plus [PAD] [BOS] [EOS] [MASK] [UNK]; decodes losslessly."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def qwen3_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> Qwen3Config:
    values = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return Qwen3Config(**values)


def build_bidirectional_model(tokenizer, seed: int = 0, **overrides):
    """Tiny Qwen3 run bidirectionally (LLaDA-like full diffusion)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(tokenizer, **overrides)).eval()
    model.config.is_causal = False
    return add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))


def build_block_causal_model(tokenizer, seed: int = 0, block_size: int = 4, **overrides):
    """Tiny Qwen3 with SDAR-style block-causal attention (block 4)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(tokenizer, **overrides)).eval()
    diffusion = DiffusionConfig(
        mask_token_id=tokenizer.mask_token_id, attention="block_causal", block_size=block_size
    )
    return add_diffusion_generation(model, diffusion)


def build_modernbert_model(tokenizer, seed: int = 0):
    """Tiny ModernBertForMaskedLM (an encoder MLM, bidirectional by construction)."""
    torch.manual_seed(seed)
    config = ModernBertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        local_attention=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        cls_token_id=tokenizer.bos_token_id,
        sep_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
    )
    model = ModernBertForMaskedLM(config).eval()
    return add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))


# Two rows in the schema of each built-in benchmark's Hub dataset (same column names and types), with
# reference solutions that the checkers accept.
BENCHMARK_ROWS = {
    "math500": [
        {
            "problem": "What is $2+2$?",
            "solution": "$2+2=\\boxed{4}$.",
            "answer": "4",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        },
        {
            "problem": "Simplify $\\frac{2}{4}$.",
            "solution": "$\\boxed{\\frac{1}{2}}$",
            "answer": "\\frac{1}{2}",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/2.json",
        },
    ],
    "gsm8k": [
        {
            "question": "Tom has 1 apple and buys 3 more. How many apples does he have?",
            "answer": "He has 1 + 3 = <<1+3=4>>4 apples.\n#### 4",
        },
        {
            "question": "A box holds 6 eggs. How many eggs are in 2 boxes?",
            "answer": "2 * 6 = <<2*6=12>>12 eggs.\n#### 12",
        },
    ],
    "mbpp": [
        {
            "task_id": 2,
            "prompt": "Write a function to add two numbers.",
            "code": "def add(a, b):\n    return a + b",
            "test_imports": [],
            "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
        },
        {
            "task_id": 3,
            "prompt": "Write a function to find the integer square root of n.",
            "code": "def isqrt(n):\n    return math.isqrt(n)",
            "test_imports": ["import math"],
            "test_list": ["assert isqrt(10) == 3", "assert isqrt(16) == 4"],
        },
    ],
    "humaneval": [
        {
            "task_id": "HumanEval/0",
            "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
            "canonical_solution": "    return sum(xs)\n",
            "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
            "entry_point": "total",
        },
        {
            "task_id": "HumanEval/1",
            "prompt": 'def double(x: int) -> int:\n    """Twice x."""\n',
            "canonical_solution": "    return 2 * x\n",
            "test": "def check(candidate):\n    assert candidate(3) == 6\n",
            "entry_point": "double",
        },
    ],
}


def build_trajectories(teacher, tokenizer, prompts, max_new_tokens: int = 16, block_length: int = 4):
    """Teacher trajectories in the schema of ``t3d_trl.data.schema``, decoded in-process with static decoding (one
    token per step, greedy) and cut at the first EOS, with their ``TrajectoryMetadata`` attached."""
    import datasets

    from t3d_trl import DiffusionConfig as _DiffusionConfig
    from t3d_trl.data.schema import TrajectoryMetadata

    encoded = tokenizer(list(prompts), return_tensors="pt", padding=True)
    out = teacher.diffusion_generate(
        encoded.input_ids,
        attention_mask=encoded.attention_mask,
        max_new_tokens=max_new_tokens,
        block_length=block_length,
        steps=max_new_tokens,
        return_dict_in_generate=True,
    )
    eos = tokenizer.eos_token_id
    rows = []
    for i, prompt in enumerate(prompts):
        prompt_ids = encoded.input_ids[i][encoded.attention_mask[i].bool()].tolist()
        completion = out.sequences[i, -max_new_tokens:].tolist()
        steps = out.decode_steps[i].tolist()
        finished = eos in completion
        if finished:
            cut = completion.index(eos) + 1
            completion, steps = completion[:cut], steps[:cut]
        rows.append(
            {
                "id": f"row-{i}",
                "prompt": prompt,
                "prompt_ids": prompt_ids,
                "completion_ids": completion,
                "decode_step": steps,
                "finished": finished,
                "completion": tokenizer.decode(completion),
            }
        )
    diffusion = _DiffusionConfig.from_model_config(teacher.config)
    metadata = TrajectoryMetadata(
        teacher="tiny-teacher",
        mask_token_id=diffusion.mask_token_id,
        attention=diffusion.attention,
        block_length=block_length,
        steps_per_block=block_length,
        max_new_tokens=max_new_tokens,
        vocab_size=teacher.get_output_embeddings().weight.shape[0],
        eos_token_ids=[eos],
    )
    return metadata.attach(datasets.Dataset.from_list(rows))


@contextlib.contextmanager
def registered_benchmark(name: str, benchmark) -> Iterator:
    """Register ``benchmark`` under ``name`` for the ``with`` block only: the registry is restored afterwards, so
    a test's benchmark never leaks into later tests (the registry is global state)."""
    from t3d_trl.evaluation.benchmarks import BENCHMARKS, register_benchmark

    before = dict(BENCHMARKS)
    try:
        yield register_benchmark(name, benchmark, overwrite=True)
    finally:
        BENCHMARKS.clear()
        BENCHMARKS.update(before)


_REMOTE_CODE = {
    "configuration_my.py": "from transformers import Qwen3Config\n\n\nclass MyConfig(Qwen3Config):\n"
    '    model_type = "mydlm"\n',
    "modeling_my.py": "from transformers import Qwen3ForCausalLM\n\nfrom .configuration_my import MyConfig\n\n\n"
    "class MyModel(Qwen3ForCausalLM):\n    config_class = MyConfig\n",
    "tokenization_my.py": "from transformers import PreTrainedTokenizerFast\n\n\n"
    "class MyTokenizer(PreTrainedTokenizerFast):\n    pass\n",
}


def add_remote_code(folder: Path, auto_class: str = "AutoModelForCausalLM", tokenizer: bool = False) -> None:
    """Make a saved Qwen3 checkpoint one that ships its own code (``model_type`` ``mydlm``, in its ``auto_map``
    under ``auto_class``); with ``tokenizer``, its tokenizer class too."""
    import json

    for name, code in _REMOTE_CODE.items():
        (folder / name).write_text(code)
    config = json.loads((folder / "config.json").read_text())
    config |= {
        "model_type": "mydlm",
        "architectures": ["MyModel"],
        "auto_map": {"AutoConfig": "configuration_my.MyConfig", auto_class: "modeling_my.MyModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        tokenizer_config |= {
            "tokenizer_class": "MyTokenizer",
            "auto_map": {"AutoTokenizer": [None, "tokenization_my.MyTokenizer"]},
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def build_hub_cache(tmp_path: Path, monkeypatch, repo: str, snapshots: dict[str, tuple[str, Path]]) -> None:
    """A Hub cache holding ``repo`` (``revision -> (commit, folder)``), as a download leaves it; offline."""
    import shutil

    from huggingface_hub import constants

    cache = tmp_path / "hub"
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    for revision, (commit, source) in snapshots.items():
        (folder / "refs" / revision).write_text(commit)
        shutil.copytree(source, folder / "snapshots" / commit, dirs_exist_ok=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
