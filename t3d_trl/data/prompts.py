"""Prompt templates of the paper (appendix "Prompts"), shared by trajectory collection and evaluation.

A template is a ``str.format`` pattern over the columns of a source row (``{problem}``). The user message it
produces is wrapped with the tokenizer's chat template when the tokenizer has one, so the teacher, the
student and the evaluation all see exactly the same prompt text.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..utils import MissingKeyError
from .schema import TRAJECTORY_COLUMNS

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)


@dataclass
class PromptRow:
    """One source row ready for the teacher."""

    index: int  # position in the source dataset (the merged dataset keeps source order)
    id: str
    prompt: str
    prompt_ids: list[int]
    extra: dict[str, Any]  # pass-through columns


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


_LITERAL_BRACES = "write literal braces doubled, as str.format reads them: {{ and }} (e.g. \\boxed{{}})"


def template_fields(template: str) -> list[str]:
    """Column names a template reads; a malformed pattern or a positional field (``{}``, ``{0}``) is refused."""
    try:
        names = [
            name for _, name, _, _ in string.Formatter().parse(resolve_template(template)) if name is not None
        ]
    except ValueError as err:  # an unmatched brace
        raise ValueError(f"prompt template {template!r}: {err}; {_LITERAL_BRACES}") from err
    positional = [name for name in names if not name or name.isdigit()]
    if positional:  # str.format would look for positional arguments (IndexError): a brace meant literally
        raise ValueError(
            f"prompt template {template!r} has the positional field {{{positional[0]}}}; fields name columns "
            f"({{problem}}), so {_LITERAL_BRACES}"
        )
    return names


def format_user_message(template: str, row: Mapping[str, Any]) -> str:
    """Fill a template from a source row, naming the missing column if there is one."""
    pattern = resolve_template(template)
    names = template_fields(pattern)
    missing = [name for name in names if name not in row]
    if missing:
        raise MissingKeyError(f"prompt template needs column(s) {missing}; the row has {sorted(row)}")
    empty = [name for name in names if row[name] is None]
    if empty:  # str.format would write the word "None" into the prompt
        raise ValueError(f"prompt template field(s) {empty} are empty (None) in this row: drop or fill it")
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


def check_known_tokens(prompt_ids: Sequence[Sequence[int]], tokenizer: Any) -> None:
    """Refuse prompts the tokenizer mostly cannot read: another model's tokenizer, or a model of another task
    (a word-level demo tokenizer), turns them into unknown tokens, and the model would decode from nothing.

    A quarter of unknown tokens is the limit: a chat template's own tokens are known whatever the data.
    """
    unknown_id = getattr(tokenizer, "unk_token_id", None)
    total = sum(len(ids) for ids in prompt_ids)
    unknown = sum(i == unknown_id for ids in prompt_ids for i in ids) if unknown_id is not None else 0
    if unknown * 4 > total:
        raise ValueError(
            f"{unknown} of the prompts' {total} tokens are the unknown token {tokenizer.unk_token!r}: the "
            "tokenizer cannot read this data; is it the model's own, and the data the model's task?"
        )


def build_prompts(
    dataset: datasets.Dataset,
    tokenizer: Any,
    prompt_template: str = "math",
    *,
    prompt_column: str = "problem",
    id_column: str | None = None,
    chat_column: str | None = None,
    use_chat_template: bool = True,
    keep_columns: Sequence[str] | None = None,
) -> list[PromptRow]:
    """Render and tokenise the prompt of every source row (see :func:`collect_trajectories` for the arguments).

    The prompt text is tokenised by :func:`encode_prompts` (a chat rendering as it is, a raw message with the
    tokenizer's special tokens, BOS). The template's ``{problem}`` field reads ``prompt_column`` (needed only
    when the template has that field), other fields read the columns of their name. Every row gives a
    prompt; length limits are applied by :func:`drop_long_prompts`.
    """
    columns = list(dataset.column_names)
    reads_problem = False
    if chat_column is None:
        # A malformed template is refused here, once, rather than for every row.
        reads_problem = "problem" in template_fields(prompt_template)
        if reads_problem and prompt_column not in columns:
            raise MissingKeyError(
                f"prompt_column {prompt_column!r} is not a column of the dataset; it has {sorted(columns)}"
            )
    if id_column is None and "id" in columns:
        id_column = "id"
    for name, value in (("id_column", id_column), ("chat_column", chat_column)):
        if value is not None and value not in columns:
            raise ValueError(f"{name}={value!r} is not a column of the dataset; it has {columns}")
    if chat_column is not None and not use_chat_template:
        raise ValueError(f"chat_column={chat_column!r} needs use_chat_template=True")
    if chat_column is not None and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"chat_column={chat_column!r} needs a tokenizer with a chat template; this one has none"
        )
    if keep_columns is None:
        keep = [c for c in columns if c not in TRAJECTORY_COLUMNS]
    else:
        keep = list(keep_columns)
        clash = [c for c in keep if c in TRAJECTORY_COLUMNS]
        absent = [c for c in keep if c not in columns]
        if clash or absent:
            raise ValueError(
                f"keep_columns {keep}: {clash or absent} "
                + ("are trajectory columns" if clash else f"are not columns of the dataset ({columns})")
            )
    prompts: list[PromptRow] = []
    seen: dict[str, int] = {}
    answered = 0  # conversations that go on after their last user turn
    from tqdm.auto import tqdm

    for index, row in enumerate(tqdm(dataset, desc="tokenising prompts", unit="prompt", leave=False)):
        if chat_column is not None:
            messages = _conversation(row[chat_column], index, chat_column)
            answered += len(messages) < len(row[chat_column])
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds its specials
        else:
            values = {**row, "problem": row[prompt_column]} if reads_problem else row
            try:
                message = format_user_message(prompt_template, values)
            except MissingKeyError:
                raise
            except ValueError as err:
                raise ValueError(f"row {index}: {err}") from err
            [text], [ids] = encode_prompts(tokenizer, [message], use_chat_template)
        if id_column is not None and row[id_column] is None:
            raise ValueError(f"row {index} has no id in column {id_column!r}; ids must be unique")
        row_id = str(row[id_column]) if id_column is not None else str(index)
        if row_id in seen:
            raise ValueError(
                f"id {row_id!r} appears twice (rows {seen[row_id]} and {index}); ids must be unique"
            )
        seen[row_id] = index
        prompts.append(PromptRow(index, row_id, text, list(ids), {c: row[c] for c in keep}))
    if answered:
        logger.warning(
            "%d of %d conversations go on after their last user turn (a reference answer): their prompts stop "
            "at that turn, the teacher writes the answer",
            answered,
            len(prompts),
        )
    return prompts


def _conversation(messages: Any, index: int, column: str) -> list[Any]:
    """A chat column's messages up to the last user turn (the prompt the teacher answers), checked."""
    if not isinstance(messages, (list, tuple)) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise ValueError(
            f"row {index}: {column!r} holds {type(messages).__name__} {str(messages)[:60]!r}, not a list of "
            "{'role', 'content'} messages (a JSON string must be parsed first)"
        )
    users = [i for i, message in enumerate(messages) if message["role"] == "user"]
    if not users:
        raise ValueError(f"row {index}: {column!r} has no user message to answer")
    return list(messages[: users[-1] + 1])


def drop_long_prompts(
    prompts: Sequence[PromptRow],
    max_prompt_length: int | None,
    max_positions: int | None,
    max_new_tokens: int,
) -> tuple[list[PromptRow], dict[str, int]]:
    """Drop the prompts the teacher cannot decode; returns the kept prompts and ``{rule: rows dropped}``.

    A prompt is dropped when it plus ``max_new_tokens`` exceeds the model's ``max_position_embeddings`` (the
    sampler would refuse its whole batch), or when it is longer than ``max_prompt_length``; each dropped prompt
    is counted under the first of these rules it breaks. A prompt is never truncated: that would change the
    question.
    """
    rules = {
        f"prompt + max_new_tokens={max_new_tokens} beyond the model's max_position_embeddings={max_positions}": (
            None if max_positions is None else max_positions - max_new_tokens
        ),
        f"prompt longer than max_prompt_length={max_prompt_length}": max_prompt_length,
    }
    dropped = dict.fromkeys(rules, 0)
    kept = []
    for prompt in prompts:
        rule = next(
            (r for r, limit in rules.items() if limit is not None and len(prompt.prompt_ids) > limit), None
        )
        if rule is None:
            kept.append(prompt)
        else:
            dropped[rule] += 1
    dropped = {rule: n for rule, n in dropped.items() if n}
    for rule, n in dropped.items():
        logger.warning("dropped %d of %d prompts: %s", n, len(prompts), rule)
    return kept, dropped
