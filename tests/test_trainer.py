"""T3DTrainer end to end on tiny in-process models: every objective, PEFT, resume, multi-process, bad input."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    build_bidirectional_model,
    build_block_causal_model,
    build_trajectories,
    qwen3_config,
)

from t3d_trl import AutoModelForDiffusionLM, DiffusionGenerationConfig
from t3d_trl.data.schema import TrajectoryMetadata
from t3d_trl.trainer import T3DConfig, T3DTrainer
from t3d_trl.trainer.t3d_trainer import REFERENCE_FILE

PROMPTS = ["hello", "what is 2+2", "abc", "the cat sat"]
BUILDERS = {"bidirectional": build_bidirectional_model, "block_causal": build_block_causal_model}


@pytest.fixture(scope="module")
def trajectories(tokenizer):
    """attention kind -> trajectories of a tiny teacher on PROMPTS (16 tokens, blocks of 4, 1 token per step)."""
    return {
        kind: build_trajectories(build(tokenizer, seed=1), tokenizer, PROMPTS)
        for kind, build in BUILDERS.items()
    }


def config(tmp_path, **overrides) -> T3DConfig:
    values = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=8,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        gradient_checkpointing=False,
        disable_tqdm=True,
        ref_sync_steps=100,
    )
    values.update(overrides)
    return T3DConfig(**values)


def train(tokenizer, dataset, args, kind="bidirectional", **kwargs) -> T3DTrainer:
    trainer = T3DTrainer(
        BUILDERS[kind](tokenizer, seed=1), args, train_dataset=dataset, processing_class=tokenizer, **kwargs
    )
    trainer.train()
    return trainer


def logged(trainer, key="loss") -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]


@pytest.mark.parametrize(
    "loss_type, kind, extra",
    [
        ("t3d", "bidirectional", {}),
        # TRL's defaults on a CPU: gradient checkpointing on, bf16 (CPU autocast) when asked for.
        ("t3d", "block_causal", {"gradient_checkpointing": True, "bf16": True, "use_cpu": True}),
        ("ddo", "bidirectional", {}),
        ("ddo", "block_causal", {"fake_estimator": "expectation"}),
        ("td", "block_causal", {}),
        ("redi", "bidirectional", {}),
        ("dparallel", "block_causal", {}),
        ("mdlm", "bidirectional", {}),
        ("t3d", "block_causal", {"student_state_ratio": 0.5}),
    ],
)
def test_each_loss_type_trains_with_finite_decreasing_loss(
    tokenizer, trajectories, tmp_path, loss_type, kind, extra
):
    dataset = trajectories[kind]
    if loss_type == "mdlm":  # real data: text, no decoding order
        dataset = dataset.select_columns(["prompt", "completion"])
    trainer = train(tokenizer, dataset, config(tmp_path, loss_type=loss_type, **extra), kind)
    values = logged(trainer)
    assert len(values) == 8 and all(math.isfinite(v) for v in values)
    assert sum(values[-3:]) / 3 < sum(values[:3]) / 3
    metrics = trainer.state.log_history[0]
    assert {"masked_token_accuracy", "masked_entropy"} <= set(metrics)
    if loss_type in ("t3d", "ddo"):
        assert {"loss/ddo", "logratio/real", "logratio/fake"} <= set(metrics)
        # Right after the reference is synced (step 0) both log-ratios are 0: DDO = (1 + alpha) log 2.
        assert metrics["loss/ddo"] == pytest.approx(1.5 * math.log(2), abs=1e-4)
    if loss_type == "t3d":
        assert "loss/path" in metrics
        assert metrics["loss"] == pytest.approx(metrics["loss/ddo"] + 0.2 * metrics["loss/path"], rel=1e-3)


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
def test_student_states_take_one_student_step_and_teacher_labels(tokenizer, trajectories, tmp_path, kind):
    args = config(tmp_path, loss_type="td", student_state_ratio=1.0, random_token_prob=0.0, tokens_per_step=2)
    trainer = T3DTrainer(
        BUILDERS[kind](tokenizer, seed=1), args, train_dataset=trajectories[kind], processing_class=tokenizer
    )
    with torch.no_grad():  # the student drifts away from the teacher; labels must still be the teacher's
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    out = trainer.student_states(trainer.model, batch)
    committed = batch["loss_mask"] & ~out["loss_mask"]
    assert not (out["loss_mask"] & ~batch["loss_mask"]).any()  # only masked positions get committed
    keep = batch["keep"]
    student = trainer._logits(trainer.model, batch).argmax(-1)
    assert torch.equal(out["input_ids"][:, keep][committed], student[committed])
    untouched = ~committed
    assert torch.equal(out["input_ids"][:, keep][untouched], batch["input_ids"][:, keep][untouched])
    block = (
        out["position_ids"][:, keep] // 4
        if kind == "block_causal"
        else torch.arange(keep.numel()).expand_as(committed) // 4
    )
    for row in range(committed.shape[0]):
        for b in block[row][committed[row]].unique().tolist():
            in_block = block[row] == b
            assert committed[row][in_block].sum() == 2  # tokens_per_step, the student's parallel step
            assert (batch["loss_mask"][row] & in_block).sum() > 2  # a mask is left to learn from
        if kind == "bidirectional":  # one decoding block at a time
            assert len(block[row][committed[row]].unique()) <= 1
    assert committed.any()
    teacher = BUILDERS[kind](tokenizer, seed=1).train()
    labels = trainer._logits(teacher, out).argmax(-1)
    moved = torch.zeros_like(committed)
    for row in range(committed.shape[0]):
        for b in block[row][committed[row]].unique().tolist():
            moved[row] |= block[row] == b
    relabelled = out["loss_mask"] & moved
    assert relabelled.any()
    assert torch.equal(out["targets"][relabelled], labels[relabelled])
    assert torch.equal(out["targets"][~moved], batch["targets"][~moved])  # blocks that did not move


def test_gradient_accumulation_normalises_over_the_whole_step(tokenizer, trajectories, tmp_path):
    full = train(
        tokenizer, trajectories["bidirectional"], config(tmp_path / "a", loss_type="t3d", max_steps=1)
    )
    accumulated = train(
        tokenizer,
        trajectories["bidirectional"],
        config(
            tmp_path / "b",
            loss_type="t3d",
            max_steps=1,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
        ),
    )
    assert logged(accumulated) == pytest.approx(logged(full), rel=1e-4)
    assert logged(accumulated, "grad_norm") == pytest.approx(logged(full, "grad_norm"), rel=1e-4)


def test_peft_lora_trains_with_a_reference_adapter_and_saves_an_adapter_that_loads(
    tokenizer, trajectories, tmp_path
):
    from peft import LoraConfig, PeftModel

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    args = config(tmp_path, max_steps=4, ref_sync_steps=3, gradient_checkpointing=True)
    trainer = train(tokenizer, trajectories["bidirectional"], args, peft_config=lora)
    assert trainer.ref_model is None  # no second copy of the base model
    model = trainer.model
    params = dict(model.named_parameters())
    lora_names = [n for n in params if ".default." in n]
    assert lora_names and not any(params[n.replace(".default.", ".ref.")].requires_grad for n in lora_names)
    # The reference adapter was synced at step 3: it differs from the adapter trained one more step.
    assert any(not torch.equal(params[n], params[n.replace(".default.", ".ref.")]) for n in lora_names)
    assert all(math.isfinite(v) for v in logged(trainer))

    trainer.save_model()
    out = Path(args.output_dir)
    assert (out / "adapter_model.safetensors").exists() and not (out / "ref").exists()
    loaded = PeftModel.from_pretrained(build_bidirectional_model(tokenizer, seed=1), str(out)).eval()
    ids = torch.tensor([trajectories["bidirectional"][0]["prompt_ids"]])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_resume_restores_the_reference_model(tokenizer, trajectories, tmp_path):
    dataset = trajectories["bidirectional"]

    def run(folder, resume=None):
        args = config(folder, max_steps=5, ref_sync_steps=3, save_strategy="steps", save_steps=4)
        trainer = T3DTrainer(build_bidirectional_model(tokenizer, seed=1), args, train_dataset=dataset)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run(tmp_path / "straight")
    checkpoint = tmp_path / "straight" / "out" / "checkpoint-4"
    assert (checkpoint / REFERENCE_FILE).exists()
    resumed = run(tmp_path / "resumed", resume=str(checkpoint))
    assert resumed._ref_synced_at == 3  # the sync phase: synced at step 3, next at 6
    # Step 5 runs against the reference synced at step 3, exactly as in the uninterrupted run.
    assert logged(resumed)[-1] == pytest.approx(logged(straight)[-1], rel=1e-5)
    for a, b in zip(resumed.ref_model.parameters(), straight.ref_model.parameters()):
        torch.testing.assert_close(a, b)

    # Without the saved reference the resumed run re-syncs from the step-4 student and step 5 differs.
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare)
    (bare / REFERENCE_FILE).unlink()
    resynced = run(tmp_path / "resynced", resume=str(bare))
    assert logged(resynced)[-1] != pytest.approx(logged(straight)[-1], rel=1e-5)


def test_saved_model_samples_with_the_distilled_budget(tokenizer, trajectories, tmp_path):
    args = config(tmp_path, max_steps=2, tokens_per_step=2)
    trainer = train(tokenizer, trajectories["bidirectional"], args)
    metrics = trainer.evaluate(trajectories["bidirectional"])
    assert math.isfinite(metrics["eval_loss"]) and "eval_loss/ddo" in metrics
    trainer.save_model()
    loaded = AutoModelForDiffusionLM.from_pretrained(args.output_dir)
    generation = DiffusionGenerationConfig.from_model_config(loaded.config)
    assert (generation.block_length, generation.tokens_per_step, generation.threshold) == (4, 2, None)
    assert generation.max_new_tokens == 16  # the trajectories' max_new_tokens
    ids = torch.tensor([trajectories["bidirectional"][0]["prompt_ids"]])
    out = loaded.diffusion_generate(ids, return_dict_in_generate=True, stop_at_eos=False)
    assert out.nfe.item() == 16 // 2  # 4 blocks of 4 tokens, 2 tokens per step
    trained = trainer.model.eval().diffusion_generate(ids, stop_at_eos=False)
    assert torch.equal(out.sequences, trained)
    card = (Path(args.output_dir) / "README.md").read_text()
    assert "- t3d" in card and "Few-Step Diffusion Language Models via Trajectory Self-Distillation" in card
    assert "| tokens per step | 2 |" in card and '"loss_type": "t3d"' in card


def _with_metadata(dataset, **changes):
    metadata = TrajectoryMetadata.from_dataset(dataset)
    return TrajectoryMetadata.from_dict({**metadata.to_dict(), **changes}).attach(
        dataset.map(lambda row: row)
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("metadata_vocab", "vocabulary of 50000"),
        (
            "token_ids",
            r"row 2 \(id='row-2'\): prompt_ids holds token id 300, outside the model's vocabulary of 128",
        ),
        ("mask_token", "mask token id 7"),
        ("no_decode_step", r"needs column\(s\) \['decode_step'\]"),
        ("length_mismatch", "completion_ids and decode_step differ in length"),
        ("no_mask_token", "has no mask token"),
    ],
)
def test_bad_input_is_refused_before_training(tokenizer, trajectories, tmp_path, case, message):
    from transformers import Qwen3ForCausalLM

    dataset = trajectories["bidirectional"]
    model = build_bidirectional_model(tokenizer, seed=1)
    if case == "metadata_vocab":
        dataset = _with_metadata(dataset, vocab_size=50000)
    elif case == "token_ids":
        dataset = dataset.map(
            lambda row, i: {"prompt_ids": row["prompt_ids"] + [300] * (i == 2)}, with_indices=True
        )
    elif case == "mask_token":
        dataset = _with_metadata(dataset, mask_token_id=7)
    elif case == "no_decode_step":
        dataset = dataset.remove_columns("decode_step")
    elif case == "length_mismatch":
        dataset = dataset.map(lambda row: {"decode_step": row["decode_step"][:-1]})
    else:
        model = Qwen3ForCausalLM(qwen3_config(tokenizer))  # a plain causal LM: no diffusion description
    with pytest.raises(ValueError, match=message):
        T3DTrainer(model, config(tmp_path), train_dataset=dataset)


def test_prompts_over_the_limit_are_dropped_not_truncated(tokenizer, trajectories, tmp_path):
    dataset = trajectories["bidirectional"]
    limit = sorted(len(ids) for ids in dataset["prompt_ids"])[1]
    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        config(tmp_path, max_prompt_length=limit, max_completion_length=10),
        train_dataset=dataset,
    )
    kept = trainer.train_dataset
    assert len(kept) == sum(len(ids) <= limit for ids in dataset["prompt_ids"])
    assert set(map(tuple, kept["prompt_ids"])) <= set(map(tuple, dataset["prompt_ids"]))
    assert max(len(ids) for ids in kept["completion_ids"]) <= 10
    assert [len(s) for s in kept["decode_step"]] == [len(c) for c in kept["completion_ids"]]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"loss_type": "sft"}, "loss_type must be one of"),
        ({"loss_type": "td", "path_weighting": "late"}, "only loss_type='t3d'"),
        ({"loss_type": "redi", "state_sampling": "reference"}, "masks randomly"),
        ({"lambda_path": 0.0}, "use loss_type='ddo'"),
        ({"block_length": 4, "tokens_per_step": 3}, "not a multiple of tokens_per_step"),
        ({"ref_sync_steps": 0}, "ref_sync_steps"),
        ({"fake_estimator": "sample"}, "fake_estimator must be one of"),
        ({"random_token_prob": 1.0}, "random_token_prob"),
        ({"loss_type": "redi", "student_state_ratio": 0.5}, "moves trajectory states"),
        ({"student_state_ratio": 1.5}, "student_state_ratio must be in"),
    ],
)
def test_invalid_configurations_fail_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        T3DConfig(output_dir=str(tmp_path), **overrides)


def test_config_defaults_follow_the_paper_and_work_on_cpu(tmp_path):
    args = T3DConfig(output_dir=str(tmp_path))
    assert (args.loss_type, args.beta, args.fake_weight, args.lambda_path) == ("t3d", 0.1, 0.5, 0.2)
    assert (args.path_weighting, args.ref_sync_steps, args.random_token_prob) == ("early", 10, 0.1)
    assert args.fake_estimator == "argmax"  # the reference code's fake samples
    assert args.student_state_ratio == 0.0  # teacher states only, as in the paper
    assert (args.max_prompt_length, args.max_completion_length, args.learning_rate) == (512, 1024, 1e-5)
    if not torch.cuda.is_available():
        assert args.bf16 is False  # TRL's bf16 default would refuse to start on a CPU-only machine
    assert args.gradient_checkpointing is True
