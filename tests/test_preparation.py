"""Training data made ready for the trainer: bad rows named before training, text tokenised as prompts are."""

from __future__ import annotations

import datasets
import pytest
from testing_utils import VOCAB_SIZE, build_tokenizer
from tokenizers import processors

from t3d_trl.data.preparation import prepare_training_dataset
from t3d_trl.data.prompts import build_prompts, render_prompt
from t3d_trl.diffusion.config import DiffusionConfig

GOOD = {"id": "a", "prompt_ids": [5, 6, 7], "completion_ids": [8, 9, 2], "decode_step": [1, 2, 3]}


def prepare(rows, loss_type="t3d", tokenizer=None, diffusion=None, block_length=4):
    return prepare_training_dataset(
        datasets.Dataset.from_list(rows),
        "train",
        loss_type=loss_type,
        trajectory_states=loss_type != "mdlm",
        tokenizer=tokenizer,
        vocab_size=VOCAB_SIZE,
        diffusion=diffusion or DiffusionConfig(mask_token_id=3),
        block_length=block_length,
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


def test_steps_that_do_not_decode_block_by_block_are_refused():
    # Steps numbered within each block (1..4 again in block 1), as another tool may write them: a state in the middle
    # of block 0 would mask block 1 too, a state the teacher was never in.
    good = {
        "id": "a",
        "prompt_ids": [5, 6],
        "completion_ids": [8] * 8,
        "decode_step": [2, 1, 4, 3, 6, 5, 8, 7],
    }
    local = {**good, "id": "b", "decode_step": [2, 1, 4, 3, 2, 1, 4, 3]}
    assert prepare([good])["decode_step"] == [good["decode_step"]]
    with pytest.raises(
        ValueError, match=r"row 1 \(id='b'\): decode_step does not decode block by block in blocks of 4"
    ):
        prepare([good, local])
    # Dynamic decoding (any number of steps per block) is fine as long as the blocks come in order.
    assert len(prepare([{**good, "decode_step": [1, 1, 1, 1, 2, 3, 3, 9]}])) == 1
    # Block-causal blocks start at absolute position 0: after a prompt of 2, block 0 holds 2 completion tokens.
    causal = DiffusionConfig(mask_token_id=3, attention="block_causal", block_size=4)
    shifted = {**good, "decode_step": [1, 1, 2, 2, 2, 2, 3, 3]}
    assert len(prepare([shifted], diffusion=causal)) == 1
    with pytest.raises(ValueError, match="row 0 .* block by block"):
        prepare([shifted])  # the same steps on a bidirectional canvas: block 0 is the first 4 tokens


def test_a_shifted_logit_student_needs_a_prompt(tokenizer):
    # Dream predicts token i at position i - 1: a completion with no prompt has no position for its first token.
    dream = DiffusionConfig(mask_token_id=3, shift_logits=True)
    with pytest.raises(ValueError, match=r"row 1 \(id='b'\): prompt_ids is empty: a shifted-logit student"):
        prepare([GOOD, {**GOOD, "id": "b", "prompt_ids": []}], diffusion=dream)
    # Text rows: the first token is the prompt (as a causal LM never predicts its first token).
    text = prepare([{"text": "abc"}], "mdlm", tokenizer, diffusion=dream)
    ids = tokenizer("abc")["input_ids"] + [tokenizer.eos_token_id]
    assert text["prompt_ids"] == [ids[:1]] and text["completion_ids"] == [ids[1:]]
    plain = prepare([{"text": "abc"}], "mdlm", tokenizer)
    assert plain["prompt_ids"] == [[]] and plain["completion_ids"] == [ids]


def test_mdlm_refuses_conversational_rows_in_one_line(tokenizer):
    # TRL's conversational format (message lists) crashed deep inside datasets.map.
    rows = [
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "completion": [{"role": "assistant", "content": "yo"}],
        }
    ]
    with pytest.raises(
        ValueError, match=r"train dataset's 'prompt' column holds List.* \(conversational message lists"
    ):
        prepare(rows, "mdlm", tokenizer)
