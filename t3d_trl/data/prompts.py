"""Prompt templates of the paper (appendix "Prompts"), shared by trajectory collection and evaluation.

A template is a ``str.format`` pattern over the columns of a source row (``{problem}``). The user message it
produces is wrapped with the tokenizer's chat template when the tokenizer has one, so the teacher, the
student and the evaluation all see exactly the same prompt text.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

from ..utils import MissingKeyError

MATH_PROMPT = (
    "{problem}. Please reason step by step, and put your final answer within \\boxed{{}}. "
    "You are a precise math problem solver. Solve the given math problem step by step."
)
CODE_PROMPT = (
    "This is the problem: {problem}. Place your code within a single Python code block ```python```. "
    "Do not include more than one code block."
)
PROMPT_TEMPLATES: dict[str, str] = {"math": MATH_PROMPT, "code": CODE_PROMPT, "plain": "{problem}"}


def resolve_template(template: str) -> str:
    """A built-in template name (``math``, ``code``, ``plain``) or a custom ``str.format`` pattern."""
    if template in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[template]
    if "{" not in template:
        raise ValueError(
            f"unknown prompt template {template!r}: use one of {sorted(PROMPT_TEMPLATES)} or a pattern with "
            "{column} fields"
        )
    return template


def template_fields(template: str) -> list[str]:
    """Column names a template reads."""
    return [name for _, name, _, _ in string.Formatter().parse(resolve_template(template)) if name]


def format_user_message(template: str, row: Mapping[str, Any]) -> str:
    """Fill a template from a source row, naming the missing column if there is one."""
    pattern = resolve_template(template)
    missing = [name for name in template_fields(pattern) if name not in row]
    if missing:
        raise MissingKeyError(f"prompt template needs column(s) {missing}; the row has {sorted(row)}")
    return pattern.format(**row)


def render_prompt(tokenizer: Any, user_message: str, use_chat_template: bool = True) -> str:
    """The exact prompt text a model sees: the chat template with a generation prompt, or the raw message."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user_message}], tokenize=False, add_generation_prompt=True
        )
    return user_message


def encode_prompts(
    tokenizer: Any, messages: Sequence[str], use_chat_template: bool = True
) -> tuple[list[str], list[list[int]]]:
    """The exact prompt texts and their token ids, the one rule shared by collection and evaluation.

    A chat-template rendering already holds the special tokens it needs (BOS), so nothing is added to it; a
    raw message gets the tokenizer's usual special tokens, as in pre-training, unless it already starts with
    the BOS token (a chat rendering made elsewhere, e.g. by lm-evaluation-harness).
    """
    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    texts = [render_prompt(tokenizer, message, chat) for message in messages]
    bos = getattr(tokenizer, "bos_token", None)
    rendered = [chat or bool(bos and text.startswith(bos)) for text in texts]
    ids: list[list[int]] = [[] for _ in texts]
    for already in (False, True):  # one batched call per kind of text
        rows = [i for i, r in enumerate(rendered) if r is already]
        if rows:
            encoded = tokenizer([texts[i] for i in rows], add_special_tokens=not already)["input_ids"]
            for i, row in zip(rows, encoded):
                ids[i] = list(row)
    return texts, ids
