"""Prepare the SFT baseline's data: question/answer rows -> the prompt/completion rows ``loss_type: mdlm`` trains on.

The paper trains its SFT reference on data derived from Bespoke-Stratos-17k, "pre-filtered to a maximum sequence
length of 600 tokens" as in the prior work it follows; that work's collection on the Hub is
``Lansechen/bs17k_collection_filtered_hard_maxlength600`` (columns ``question`` and ``qwen7b_answer``). Each
question becomes the prompt the model will see (the prompt template, then the model's chat template), the answer
becomes the completion, and rows longer than ``--max_length`` tokens of this model's tokenizer are dropped:

    python recipes/prepare_sft_data.py --tokenizer JetLM/SDAR-4B-Chat --output data/sdar-4b-chat/sft-bs17k
    t3d-trl train --config recipes/sdar-4b-chat/sft.yaml

Any dataset ``t3d-trl collect`` reads works (a Hub id, a local json/jsonl/parquet/csv file or a saved folder).
"""

from __future__ import annotations

import argparse
from typing import Any

import datasets

from t3d_trl.cli.collect import load_source_dataset
from t3d_trl.data.prompts import encode_prompts, format_user_message, render_prompt

SOURCE = "Lansechen/bs17k_collection_filtered_hard_maxlength600"


def to_prompt_completion(
    dataset: datasets.Dataset,
    tokenizer: Any,
    prompt_column: str = "question",
    completion_column: str = "qwen7b_answer",
    prompt_template: str = "plain",
    max_length: int | None = 600,
) -> datasets.Dataset:
    """Rows with ``prompt`` (chat-templated, exactly what the model sees) and ``completion`` strings.

    Rows whose prompt plus completion plus EOS exceed ``max_length`` tokens are dropped (``None`` keeps all).
    """
    missing = [c for c in (prompt_column, completion_column) if c not in dataset.column_names]
    if missing:
        raise ValueError(f"column(s) {missing} not in the dataset; it has {dataset.column_names}")

    def convert(row: dict[str, Any]) -> dict[str, str]:
        message = format_user_message(prompt_template, {**row, "problem": row[prompt_column]})
        return {"prompt": render_prompt(tokenizer, message), "completion": row[completion_column]}

    rows = dataset.map(convert, remove_columns=dataset.column_names, desc="Rendering prompts")
    if max_length is None:
        return rows

    def short_enough(batch: dict[str, list[str]]) -> list[bool]:
        # Counted as training will tokenise them (a raw prompt gets BOS): prompts as collection and evaluation do.
        _, prompts = encode_prompts(tokenizer, batch["prompt"], use_chat_template=False)
        completions = tokenizer(batch["completion"], add_special_tokens=False)["input_ids"]
        return [len(p) + len(c) + 1 <= max_length for p, c in zip(prompts, completions)]

    return rows.filter(short_enough, batched=True, desc=f"Keeping rows of at most {max_length} tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", required=True, help="the model to train (Hub id or folder)")
    parser.add_argument("--output", required=True, help="folder to save the prepared dataset to")
    parser.add_argument("--dataset", default=SOURCE, help=f"source dataset (default: {SOURCE})")
    parser.add_argument("--split", default="train")
    parser.add_argument("--prompt_column", default="question")
    parser.add_argument("--completion_column", default="qwen7b_answer")
    parser.add_argument(
        "--prompt_template", default="plain", help="plain (the question as it is), math, code or a pattern"
    )
    parser.add_argument("--max_length", type=int, default=600, help="drop longer rows (prompt + completion)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    source = load_source_dataset(args.dataset, split=args.split)
    rows = to_prompt_completion(
        source,
        tokenizer,
        args.prompt_column,
        args.completion_column,
        args.prompt_template,
        args.max_length,
    )
    rows.save_to_disk(args.output)
    print(f"{len(rows)} of {len(source)} rows saved to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
