"""Training data made ready for the trainer: bad rows named before training, text tokenised as prompts are."""

from __future__ import annotations

import datasets
import pytest
from testing_utils import VOCAB_SIZE, build_tokenizer
from tokenizers import processors

from t3d_trl.data.preparation import prepare_training_dataset
from t3d_trl.data.prompts import build_prompts, render_prompt

GOOD = {"id": "a", "prompt_ids": [5, 6, 7], "completion_ids": [8, 9, 2], "decode_step": [1, 2, 3]}


def prepare(rows, loss_type="t3d", tokenizer=None):
    return prepare_training_dataset(
        datasets.Dataset.from_list(rows),
        "train",
        loss_type=loss_type,
        trajectory_states=loss_type != "mdlm",
        tokenizer=tokenizer,
        vocab_size=VOCAB_SIZE,
        max_positions=256,
        max_prompt_length=None,
        max_completion_length=None,
    )


@pytest.mark.parametrize(
    "bad, column",
    [
        ({"completion_ids": None, "decode_step": None}, "completion_ids"),
        ({"decode_step": [1, None, 3]}, "decode_step"),
        ({"prompt_ids": None}, "prompt_ids"),
    ],
)
def test_rows_holding_none_are_named_not_failed_inside_a_batch(bad, column):
    with pytest.raises(ValueError, match=rf"train dataset row 1 \(id='b'\): {column} is or holds None"):
        prepare([GOOD, {**GOOD, "id": "b", **bad}])


def test_mdlm_text_holding_none_is_named(tokenizer):
    rows = [{"id": "a", "prompt": "p", "completion": "c"}, {"id": "b", "prompt": "p", "completion": None}]
    with pytest.raises(ValueError, match=r"row 1 \(id='b'\): completion is or holds None"):
        prepare(rows, "mdlm", tokenizer)
    with pytest.raises(ValueError, match=r"row 1 \(id=1\): text is or holds None"):
        prepare([{"text": "x"}, {"text": None}], "mdlm", tokenizer)


def test_mdlm_prompts_get_the_ids_the_teacher_and_the_evaluation_see():
    tokenizer = build_tokenizer()  # a copy that adds BOS to raw text, as Llama-style tokenizers do
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", tokenizer.bos_token_id)]
    )
    message = "what is 2+2?"
    rows = [
        {"prompt": message, "completion": "4"},
        {"prompt": render_prompt(tokenizer, message), "completion": "4"},
    ]
    prepared = prepare(rows, "mdlm", tokenizer)
    source = datasets.Dataset.from_list([{"problem": message}])
    # A plain prompt gets its BOS, a chat rendering (which holds one) no second: as collection and evaluation.
    expected = [
        build_prompts(source, tokenizer, "plain", use_chat_template=chat)[0].prompt_ids
        for chat in (False, True)
    ]
    assert prepared["prompt_ids"] == expected
    assert [ids.count(tokenizer.bos_token_id) for ids in expected] == [1, 1]
    assert prepared["completion_ids"][0] == tokenizer("4", add_special_tokens=False)["input_ids"] + [2]
