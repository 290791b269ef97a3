"""Embedded demo task families: tiny generated tasks on which few-step decoding visibly breaks.

Every family is generated in code (nothing is downloaded) and is deterministic given a seed. Its answers are
exactly :attr:`DemoTask.answer_length` tokens long (8, or 32 for ``wordsort``) and every prompt has SEVERAL
valid answers, so a
masked diffusion model trained on the task learns a multi-modal distribution. Decoding one token per step
picks one mode; committing several tokens in one parallel step samples each position from its own marginal
and mixes modes into an invalid answer (the factorization error of the T3D paper, Eq. tc).

Families (``DEMO_TASKS``):

* ``sort2``: 8 distinct letters out of 16 in random order; valid answers: the letters sorted ascending or
  descending (2 modes). One decoding block of 8.
* ``words``: two categories (animal, color, food, tool); answer: a 4-letter word of the first category then
  one of the second, spelled letter by letter (6 x 6 = 36 modes). Two decoding blocks of 4, one word each:
  letters of two different words committed in one step spell no word.
* ``add``: a two-digit and a one-digit number; answer: the sum written out with the operands in either order
  and a 3-digit result, ``4 7 + 8 = 0 5 5`` or ``8 + 4 7 = 0 5 5`` (2 modes; the result digits are
  deterministic). One decoding block of 8.
* ``wordsort`` (the paper's regime: a block-causal model, many blocks): 8 distinct words out of 16 four-letter
  words in random order; answer: the words sorted alphabetically, ascending or descending, spelled letter by
  letter (32 tokens, 8 blocks of 4, one word per block; 2 modes). The first block fixes the direction and every
  later block is conditioned on the earlier ones (the next word in that order); letters of the first and the
  last word committed in one step spell no word. Its teacher is block-causal (SDAR-like, block size 4).
* ``wordset``: the ``wordsort`` prompts; answer: the 8 words in ANY order, spelled (8! = 40,320 valid answers).
  Every block is a choice among the words not yet written, so every block is multi-modal: where ``wordsort``
  has one mode choice (block 0), ``wordset`` has one per block. Block-causal teacher, as ``wordsort``.
* ``wordsort_bidirectional``: the same problems for a bidirectional teacher (LLaDA-like, full attention over
  the canvas), decoded in 8 blocks of 4; the multi-block regime of the approximate (Fast-dLLM) caches.

Each family has its own word-level tokenizer (:meth:`DemoTask.tokenizer`): one token per whitespace-separated
word, the special tokens ``[PAD] [BOS] [EOS] [MASK] [UNK]`` (ids 0-4), left padding, no chat template, no
special tokens added around a prompt. Completions have no EOS: the demo decodes exactly
``max_new_tokens = answer_length`` tokens (:meth:`DemoTask.generation_config`).
"""

from __future__ import annotations

import itertools
import random
import string
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config

from ..generation.configuration import DiffusionGenerationConfig

SPECIAL_TOKENS = ("[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]")
TRAIN_ROWS = 4096  # rows of a task's "train" split (DemoTask.split)
TEST_ROWS = 256  # rows of its held-out "test" split


class DemoTask(ABC):
    """A generated task family: prompts, the set of valid answers of each prompt, and a tokenizer.

    Subclasses set the class attributes and implement :meth:`_draw_prompt` and :meth:`_valid_answers`; prompts
    and answers are strings of whitespace-separated tokens.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    words: ClassVar[tuple[str, ...]]  # every token of the task (beyond the special tokens)
    prompt_length: ClassVar[int]
    answer_length: ClassVar[int] = 8
    block_length: ClassVar[int] = 8
    attention: ClassVar[str] = "bidirectional"  # the teacher's attention (DiffusionConfig.attention)
    teacher_size: ClassVar[dict[str, int]] = {}  # Qwen3Config fields that differ from teacher_config's
    # Whether evaluation prompts can avoid the training prompts: not where the training rows cover the task's
    # few prompts; there evaluation repeats training prompts and tests the decoding, not generalisation.
    held_out_prompts: ClassVar[bool] = True

    @abstractmethod
    def _draw_prompt(self, rng: random.Random) -> list[str]:
        """The tokens of one random prompt."""

    @abstractmethod
    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        """Every valid answer of a prompt, as token tuples (each ``answer_length`` long)."""

    def _split_prompt(self, prompt: str) -> list[str]:
        tokens = prompt.split()
        unknown = [t for t in tokens if t not in self.words]
        if len(tokens) != self.prompt_length or unknown:
            raise ValueError(
                f"{prompt!r} is not a {self.name} prompt: expected {self.prompt_length} tokens out of the task's "
                f"words, got {len(tokens)} tokens" + (f" and unknown ones {unknown}" if unknown else "")
            )
        return tokens

    def valid_answers(self, prompt: str) -> list[str]:
        """All valid answers of ``prompt`` (whitespace-separated tokens), in a fixed order."""
        return [" ".join(answer) for answer in self._valid_answers(self._split_prompt(prompt))]

    def is_valid(self, prompt: str, completion: str) -> bool:
        """Exact-match validity: ``completion`` (tokens separated by whitespace) is one of the valid answers."""
        return tuple(completion.split()) in self._valid_answers(self._split_prompt(prompt))

    def _draw_answer(self, prompt: list[str], rng: random.Random) -> tuple[str, ...]:
        """One valid answer of ``prompt``, uniformly (families with many answers draw it without listing them)."""
        return rng.choice(self._valid_answers(prompt))

    def sample(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` rows ``{"id", "prompt", "answer"}``; the answer is drawn uniformly among the valid ones.

        Deterministic given ``(n, seed)``, and the first ``m`` rows of ``sample(n, seed)`` are ``sample(m, seed)``.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"{self.name}:{seed}")  # str seeds are hashed with sha512: stable across runs
        rows = []
        for i in range(n):
            prompt = self._draw_prompt(rng)
            answer = self._draw_answer(prompt, rng)
            rows.append(
                {"id": f"{self.name}-{seed}-{i}", "prompt": " ".join(prompt), "answer": " ".join(answer)}
            )
        return rows

    def held_out(self, seen: set[str], n: int, seed: int) -> list[dict[str, Any]]:
        """``n`` evaluation rows of ``sample(.., seed)`` whose prompts are not in ``seen`` (the training prompts),
        in order; for a task whose few prompts the training rows cover (:attr:`held_out_prompts` False), the
        first ``n`` rows, training prompts included."""
        rows = self.sample(4 * n + 64, seed=seed)
        if self.held_out_prompts:
            rows = [row for row in rows if row["prompt"] not in seen]
        return rows[:n]

    def split(self, split: str = "train", n: int | None = None) -> list[dict[str, Any]]:
        """The task as a dataset split, what ``t3d-trl collect --dataset_name demo:<task>`` and the ``demo-<task>``
        benchmark of ``t3d-trl eval`` read.

        ``train``: the first ``n`` (default :data:`TRAIN_ROWS`) rows of ``sample(TRAIN_ROWS, seed=0)``. ``test``:
        ``n`` (default :data:`TEST_ROWS`) held-out rows (seed 10000) whose prompts are in no ``train`` row
        (:meth:`held_out`).
        """
        if split == "train":
            return self.sample(min(TRAIN_ROWS if n is None else n, TRAIN_ROWS), seed=0)
        if split == "test":
            seen = {row["prompt"] for row in self.sample(TRAIN_ROWS, seed=0)}
            return self.held_out(seen, TEST_ROWS if n is None else n, seed=10_000)
        raise ValueError(f"demo task {self.name!r} has the splits 'train' and 'test', not {split!r}")

    def tokenizer(self) -> PreTrainedTokenizerFast:
        """A word-level tokenizer over the special tokens (ids 0-4) and the task's words; left padding."""
        vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *self.words))}
        backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            pad_token="[PAD]",
            bos_token="[BOS]",
            eos_token="[EOS]",
            mask_token="[MASK]",
            unk_token="[UNK]",
            padding_side="left",
        )

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.words)

    def generation_config(self, tokens_per_step: int = 1, **overrides: Any) -> DiffusionGenerationConfig:
        """Greedy low-confidence decoding of one answer with ``tokens_per_step`` tokens per step (TokPS)."""
        values: dict[str, Any] = dict(
            max_new_tokens=self.answer_length,
            block_length=self.block_length,
            tokens_per_step=tokens_per_step,
            temperature=0.0,
            remasking="low_confidence",
        )
        values.update(overrides)
        return DiffusionGenerationConfig(**values)


class Sort2(DemoTask):
    name = "sort2"
    description = "8 distinct letters out of 16; answer: sorted ascending or descending (2 valid answers)"
    letters: ClassVar[tuple[str, ...]] = tuple(string.ascii_lowercase[:16])
    words = (*letters, "=")
    prompt_length = 9  # 8 letters and "="

    def _draw_prompt(self, rng: random.Random) -> list[str]:
        return [*rng.sample(self.letters, 8), "="]

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        letters = prompt[:-1]
        if prompt[-1] != "=" or "=" in letters or len(set(letters)) != len(letters):
            raise ValueError(
                f"{' '.join(prompt)!r} is not a sort2 prompt: expected 8 distinct letters and '='"
            )
        ascending = tuple(sorted(letters))
        return [ascending, ascending[::-1]]


class Words(DemoTask):
    name = "words"
    description = "two categories; answer: a 4-letter word of each, spelled out (36 valid answers, 2 blocks)"
    held_out_prompts = False  # 16 prompts in all
    categories: ClassVar[dict[str, tuple[str, ...]]] = {
        "animal": ("bear", "wolf", "lion", "deer", "frog", "duck"),
        "color": ("blue", "gray", "pink", "gold", "teal", "navy"),
        "food": ("rice", "corn", "bean", "pear", "plum", "lime"),
        "tool": ("rake", "hose", "file", "pick", "vise", "plow"),
    }
    words = (
        *categories,
        "=",
        *sorted({letter for group in categories.values() for word in group for letter in word}),
    )
    prompt_length = 3  # two categories and "="
    block_length = 4

    def _draw_prompt(self, rng: random.Random) -> list[str]:
        return [rng.choice(list(self.categories)), rng.choice(list(self.categories)), "="]

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        first, second = self.categories.get(prompt[0]), self.categories.get(prompt[1])
        if first is None or second is None or prompt[2] != "=":
            raise ValueError(
                f"{' '.join(prompt)!r} is not a words prompt: expected '<category> <category> ='"
            )
        return [(*a, *b) for a, b in itertools.product(first, second)]


class Add(DemoTask):
    name = "add"
    description = "a two-digit plus a one-digit number; answer: the sum with the operands in either order"
    held_out_prompts = False  # 900 prompts in all
    digits: ClassVar[tuple[str, ...]] = tuple(string.digits)
    words = (*digits, "add", "and", "+", "=")
    prompt_length = 5  # add a a and b

    def _draw_prompt(self, rng: random.Random) -> list[str]:
        return ["add", *str(rng.randint(10, 99)), "and", str(rng.randint(0, 9))]

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        if (
            prompt[0] != "add"
            or prompt[3] != "and"
            or not all(t in self.digits for t in (*prompt[1:3], prompt[4]))
        ):
            raise ValueError(f"{' '.join(prompt)!r} is not an add prompt: expected 'add <d> <d> and <d>'")
        a, b = prompt[1:3], prompt[4:5]
        total = tuple(f"{int(''.join(a)) + int(b[0]):03d}")
        return [(*a, "+", *b, "=", *total), (*b, "+", *a, "=", *total)]


class WordSort(DemoTask):
    name = "wordsort"
    description = (
        "8 distinct words out of 16; answer: sorted ascending or descending, spelled out "
        "(2 valid answers, 8 blocks of 4, block-causal teacher)"
    )
    vocabulary: ClassVar[tuple[str, ...]] = (
        "bear", "cold", "dusk", "fern", "gust", "hint", "jade", "kelp",
        "lamp", "mint", "note", "pine", "rust", "sand", "tide", "wolf",
    )  # fmt: skip
    words = (*vocabulary, *sorted({letter for word in vocabulary for letter in word}))
    prompt_length = 8  # a multiple of the block: the answer starts a new block
    answer_length = 32
    block_length = 4
    attention = "block_causal"
    # Hidden 64: trains in about half an hour on a busy CPU (~0.25M parameters).
    teacher_size = {"hidden_size": 64, "intermediate_size": 224, "head_dim": 16}

    def _draw_prompt(self, rng: random.Random) -> list[str]:
        return rng.sample(self.vocabulary, 8)

    def _check(self, prompt: list[str]) -> None:
        if any(word not in self.vocabulary for word in prompt) or len(set(prompt)) != len(prompt):
            raise ValueError(f"{' '.join(prompt)!r} is not a {self.name} prompt: expected 8 distinct words")

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        self._check(prompt)
        ascending = sorted(prompt)
        return [tuple("".join(ascending)), tuple("".join(ascending[::-1]))]


class WordOrder(WordSort):
    name = "wordorder"
    description = (
        "8 distinct words out of 16; answer: the words in the given order or reversed, spelled out "
        "(2 valid answers, 8 blocks of 4, block-causal teacher)"
    )

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        self._check(prompt)
        return [tuple("".join(prompt)), tuple("".join(prompt[::-1]))]


class WordSet(WordSort):
    name = "wordset"
    description = (
        "8 distinct words out of 16; answer: the 8 words in any order, spelled out "
        "(8! valid answers, 8 blocks of 4, every block a choice; block-causal teacher)"
    )

    def _valid_answers(self, prompt: list[str]) -> list[tuple[str, ...]]:
        self._check(prompt)
        return [tuple("".join(order)) for order in itertools.permutations(prompt)]

    def is_valid(self, prompt: str, completion: str) -> bool:
        """Valid when the letters spell the prompt's 8 words, each once, in any order (no list of 40,320)."""
        words = self._split_prompt(prompt)
        self._check(words)
        letters = completion.split()
        if len(letters) != self.answer_length:
            return False
        spelled = ["".join(letters[i : i + 4]) for i in range(0, self.answer_length, 4)]
        return sorted(spelled) == sorted(words)

    def _draw_answer(self, prompt: list[str], rng: random.Random) -> tuple[str, ...]:
        self._check(prompt)
        return tuple("".join(rng.sample(prompt, len(prompt))))


class WordSortBidirectional(WordSort):
    name = "wordsort_bidirectional"
    description = (
        "the wordsort problems for a bidirectional teacher (LLaDA-like): 32 tokens in 8 blocks of 4 "
        "(2 valid answers)"
    )
    attention = "bidirectional"


DEMO_TASKS: dict[str, DemoTask] = {
    task.name: task
    for task in (Sort2(), Words(), Add(), WordSort(), WordOrder(), WordSet(), WordSortBidirectional())
}


def get_task(name: str) -> DemoTask:
    """The demo task family called ``name`` (see ``DEMO_TASKS``)."""
    if name not in DEMO_TASKS:
        raise ValueError(f"unknown demo task {name!r}; available: {sorted(DEMO_TASKS)}")
    return DEMO_TASKS[name]


def teacher_config(task: DemoTask | str, **overrides: Any) -> Qwen3Config:
    """The tiny Qwen3 of the demo teacher (hidden 128, 4 layers, ~0.9M parameters; hidden 64 for the families
    whose ``teacher_size`` says so).

    The vocabulary is the task tokenizer's; ``overrides`` replace any ``Qwen3Config`` field.
    """
    task = get_task(task) if isinstance(task, str) else task
    values: dict[str, Any] = dict(
        vocab_size=task.vocab_size,
        hidden_size=128,
        intermediate_size=448,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        is_causal=False,  # run bidirectionally; the diffusion forward passes explicit float masks anyway
        pad_token_id=SPECIAL_TOKENS.index("[PAD]"),
        bos_token_id=SPECIAL_TOKENS.index("[BOS]"),
        eos_token_id=SPECIAL_TOKENS.index("[EOS]"),
    )
    values.update(task.teacher_size)
    values.update(overrides)
    return Qwen3Config(**values)


def build_teacher(task: DemoTask | str, seed: int = 0, **overrides: Any) -> Any:
    """A randomly initialised demo teacher for ``task``, ready for ``diffusion_generate`` and MDLM training.

    Its config carries the diffusion description (the task's attention, block-causal with the task's block size
    for ``wordsort``, and its ``[MASK]``) and the task's
    one-token-per-step decoding defaults, so ``save_pretrained`` gives a checkpoint that loads with
    ``AutoModelForDiffusionLM.from_pretrained``.
    """
    import torch

    from ..models.auto import AutoModelForDiffusionLM
    from ..models.diffusion_config import DiffusionConfig

    task = get_task(task) if isinstance(task, str) else task
    torch.manual_seed(seed)
    return AutoModelForDiffusionLM.from_config(
        teacher_config(task, **overrides),
        diffusion_config=DiffusionConfig(
            mask_token_id=SPECIAL_TOKENS.index("[MASK]"),
            attention=task.attention,
            block_size=task.block_length if task.attention == "block_causal" else None,
        ),
        generation_config=task.generation_config(),
    )
