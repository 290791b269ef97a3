"""T3DTrainer end to end on tiny in-process models: every objective, PEFT, resume, multi-process, bad input."""

from __future__ import annotations

import copy
import functools
import importlib.machinery
import json
import logging
import math
import os
import shutil
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from testing_utils import (
    build_bidirectional_model,
    build_block_causal_model,
    build_tokenizer,
    build_trajectories,
    qwen3_config,
)
from transformers import TrainerCallback

from t3d_trl import AutoModelForDiffusionLM, DiffusionGenerationConfig
from t3d_trl.data.schema import TrajectoryMetadata
from t3d_trl.models.forward import unwrap_model
from t3d_trl.trainer import T3DConfig, T3DTrainer
from t3d_trl.trainer.reference import REFERENCE_FILE
from t3d_trl.trainer.student_states import decoding_blocks, teacher_rollout
from t3d_trl.trainer.t3d_config import REFERENCE_LOSSES

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
        activation_checkpointing=False,
        disable_tqdm=True,
    )
    if overrides.get("loss_type", "t3d") in REFERENCE_LOSSES:  # the others refuse a setting they would ignore
        values["ref_sync_steps"] = 100
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
        ("t3d", "block_causal", {"activation_checkpointing": True, "bf16": True, "use_cpu": True}),
        ("ddo", "bidirectional", {}),
        ("ddo", "block_causal", {"fake_estimator": "expectation"}),
        ("td", "block_causal", {}),
        ("redi", "bidirectional", {}),
        ("dparallel", "block_causal", {}),
        ("mdlm", "bidirectional", {}),
        ("t3d", "block_causal", {"student_state_ratio": 0.5}),
        ("td", "bidirectional", {"student_state_ratio": 0.5, "student_state_labels": "rollout"}),
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


def test_student_state_rollout_labels_are_the_teachers_own_completion(tokenizer, trajectories, tmp_path):
    # The trainer passes student_state_labels through: the same student states as argmax labelling, and targets
    # that are the frozen teacher's one-token-per-step completion of them. A larger initialisation makes the
    # tiny teacher's predictions depend on the state (at the default its argmax barely does), so the two differ.
    def build():
        return build_block_causal_model(tokenizer, seed=1, initializer_range=0.2)

    made = {}
    for labels in ("argmax", "rollout"):
        args = config(
            tmp_path,
            loss_type="td",
            student_state_ratio=1.0,
            student_state_labels=labels,
            random_token_prob=0.0,
            tokens_per_step=1,
        )
        trainer = T3DTrainer(
            build(), args, train_dataset=trajectories["block_causal"], processing_class=tokenizer
        )
        batch = next(iter(trainer.get_train_dataloader()))
        made[labels] = trainer.student_states(trainer.model, batch)
    argmax, rollout = made["argmax"], made["rollout"]
    assert torch.equal(argmax["input_ids"], rollout["input_ids"])
    assert torch.equal(argmax["loss_mask"], rollout["loss_mask"])
    assert not torch.equal(argmax["targets"], rollout["targets"])
    block, _ = decoding_blocks(rollout, 4, True)
    committed = batch["loss_mask"] & ~rollout["loss_mask"]
    moved = torch.zeros_like(committed)
    for b in block[committed].unique().tolist():
        moved |= (block == b) & (committed & (block == b)).any(-1, keepdim=True)
    relabelled = rollout["loss_mask"] & moved
    teacher = build().train()
    tokens, forwards = teacher_rollout(rollout, lambda b: trainer._logits(teacher, b), block, relabelled)
    assert relabelled.any() and forwards <= 4
    assert torch.equal(rollout["targets"][relabelled], tokens[relabelled])
    assert torch.equal(rollout["targets"][~moved], batch["targets"][~moved])


@pytest.mark.parametrize("kind", ["bidirectional", "block_causal"])
def test_student_states_are_made_in_training_step_and_counted_before(
    tokenizer, trajectories, tmp_path, kind, monkeypatch
):
    # The loss's normaliser for the accumulated step is counted before any state is made; it must count exactly
    # the positions left after the student states commit theirs.
    args = config(
        tmp_path,
        loss_type="td",
        student_state_ratio=0.5,
        random_token_prob=0.0,
        tokens_per_step=2,
        per_device_train_batch_size=2,
    )
    trainer = T3DTrainer(
        BUILDERS[kind](tokenizer, seed=1), args, train_dataset=trajectories[kind], processing_class=tokenizer
    )
    loader = iter(trainer.get_train_dataloader())
    micro_batches = [next(loader) for _ in range(2)]
    counts = trainer._get_num_items_in_batch(micro_batches, torch.device("cpu"))
    untouched = sum(b["loss_mask"].sum() for b in micro_batches)
    seen = []

    def record(self, model, inputs, **kwargs):  # the inputs the loss sees; a zero loss with a graph
        seen.append(inputs)
        return next(model.parameters()).sum() * 0.0

    monkeypatch.setattr(T3DTrainer, "compute_loss", record)
    trainer.model.train()
    for batch in micro_batches:
        trainer.training_step(trainer.model, batch, counts)
    assert counts[0] == sum(inputs["loss_mask"].sum() for inputs in seen) < untouched
    assert all(not torch.equal(a["loss_mask"], b["loss_mask"]) for a, b in zip(seen, micro_batches))


def test_the_student_states_share_counts_every_row(tokenizer, trajectories, tmp_path):
    """Steps that move no row count too (they were left out, which biased the share up: 0.75 for a ratio of 0.2)."""
    args = config(
        tmp_path, loss_type="td", student_state_ratio=0.25, per_device_train_batch_size=2, max_steps=8
    )
    trainer = train(tokenizer, trajectories["bidirectional"], args)
    shares = [h["student_states"] for h in trainer.state.log_history if "loss" in h]
    assert len(shares) == 8 and 0.0 in shares and set(shares) <= {0.0, 0.5, 1.0}


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


def test_a_lora_adapter_is_initialised_from_the_runs_seed(tokenizer, trajectories, tmp_path):
    """peft draws the adapter's initial weights: from ``args.seed``, not from whatever the global generator holds
    (each process of a launch, and each new run, held another: runs and ranks started from different adapters)."""
    from peft import LoraConfig

    weights = []
    for draw in (1, 2):
        model = build_bidirectional_model(tokenizer, seed=1)
        torch.manual_seed(draw)  # the global generator as another run or another rank leaves it
        trainer = T3DTrainer(
            model,
            config(tmp_path / str(draw), loss_type="td"),
            train_dataset=trajectories["bidirectional"],
            peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        )
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n})
    assert weights[0] and all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])


def test_peft_lora_trains_with_a_reference_adapter_and_saves_an_adapter_that_loads(
    tokenizer, trajectories, tmp_path, monkeypatch
):
    from peft import LoraConfig, PeftModel

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    args = config(tmp_path, max_steps=4, ref_sync_steps=3, activation_checkpointing=True)
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
    # The saved adapter holds the trained adapter's tensors only, not the reference adapter's too.
    with safe_open(out / "adapter_model.safetensors", "pt") as saved:
        assert len(list(saved.keys())) == len(lora_names)
    assert set(model.peft_config) == {"default", "ref"} and "save_pretrained" not in vars(model)
    loaded = PeftModel.from_pretrained(build_bidirectional_model(tokenizer, seed=1), str(out)).eval()
    ids = torch.tensor([trajectories["bidirectional"][0]["prompt_ids"]])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)

    # The project's own loader takes the adapter folder: base model first (peft's convention: the base named in
    # adapter_config.json, here saved to disk), then the adapter, with the distilled decoding defaults.
    base = tmp_path / "base"
    build_bidirectional_model(tokenizer, seed=1).save_pretrained(base)
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    adapter_config["base_model_name_or_path"] = str(base)
    (out / "adapter_config.json").write_text(json.dumps(adapter_config))
    auto = AutoModelForDiffusionLM.from_pretrained(str(out)).eval()
    assert isinstance(auto, PeftModel)
    trained_defaults = DiffusionGenerationConfig.from_model_config(unwrap_model(model).config)
    base_defaults = AutoModelForDiffusionLM.from_pretrained(str(base)).diffusion_generation_config
    assert trained_defaults != base_defaults  # distillation set them: they travel with the adapter
    assert DiffusionGenerationConfig.from_model_config(unwrap_model(auto).config) == trained_defaults
    with torch.no_grad():
        torch.testing.assert_close(auto(input_ids=ids).logits, model(input_ids=ids).logits)
        expected = model.diffusion_generate(ids, stop_at_eos=False)
    assert torch.equal(auto.diffusion_generate(ids, stop_at_eos=False), expected)
    # Merged and saved, it is a plain checkpoint with the same defaults and outputs.
    auto.merge_and_unload().save_pretrained(tmp_path / "merged")
    merged = AutoModelForDiffusionLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert type(merged).__name__ == "Qwen3ForCausalLM"
    assert torch.equal(merged.diffusion_generate(ids, stop_at_eos=False), expected)

    # The model card's snippet runs as written, with a chat template and without one.
    monkeypatch.chdir(tmp_path)
    for chat in (True, False):
        if not chat:
            trainer.processing_class = copy.deepcopy(tokenizer)
            trainer.processing_class.chat_template = None
        trainer.create_model_card()
        card = (out / "README.md").read_text()
        assert "LoRA adapter" in card and "merge_and_unload()" in card
        snippet = card.split("```python\n")[1].split("```")[0]
        assert ("apply_chat_template" in snippet) == chat
        exec(compile(snippet, "README.md", "exec"), {})


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
    assert resumed.reference.synced_at == 3  # the sync phase: synced at step 3, next at 6
    # Step 5 runs against the reference synced at step 3, exactly as in the uninterrupted run.
    assert logged(resumed)[-1] == pytest.approx(logged(straight)[-1], rel=1e-5)
    for a, b in zip(resumed.ref_model.parameters(), straight.ref_model.parameters()):
        torch.testing.assert_close(a, b)
    # Saved into a folder of the user's that does not exist yet (before: safetensors' "No such file or directory").
    straight.reference.save(str(tmp_path / "mine" / "reference"))
    resumed.reference.load(str(tmp_path / "mine" / "reference"))
    assert resumed.reference.synced_at == straight.reference.synced_at

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


@pytest.mark.parametrize("loss_type", ["t3d", "dparallel"])
def test_torch_compile_trains_the_same_model_and_saves_it_unwrapped(
    tokenizer, trajectories, tmp_path, loss_type
):
    # transformers' ``torch_compile`` wraps the student in an OptimizedModule; the "eager" backend traces it the
    # same way without generating kernels, so the losses must match the uncompiled run's.
    data = trajectories["block_causal"]
    steps = dict(loss_type=loss_type, max_steps=4)
    if loss_type == "t3d":
        steps["ref_sync_steps"] = 2  # the reference is synced mid-run
    plain = train(tokenizer, data, config(tmp_path / "plain", **steps), "block_causal")
    args = config(
        tmp_path / "compiled",
        **steps,
        torch_compile=True,
        torch_compile_backend="eager",
    )
    compiled = train(tokenizer, data, args, "block_causal")
    assert type(compiled.model_wrapped).__name__ == "OptimizedModule"
    if loss_type == "t3d":  # accelerate prepares the reference like the student
        assert type(compiled.ref_model).__name__ == "OptimizedModule"
    assert logged(compiled) == pytest.approx(logged(plain), rel=1e-5)
    compiled.save_model()
    loaded = AutoModelForDiffusionLM.from_pretrained(args.output_dir)
    trained = unwrap_model(compiled.model).state_dict()
    assert loaded.state_dict().keys() == trained.keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.items())


def test_model_card_lists_the_settings_the_run_used(tokenizer, trajectories, tmp_path):
    def card(**overrides) -> dict:
        args = config(tmp_path, **overrides)
        trainer = T3DTrainer(
            build_bidirectional_model(tokenizer, seed=1), args, train_dataset=trajectories["bidirectional"]
        )
        trainer.create_model_card()
        text = (Path(args.output_dir) / "README.md").read_text()
        return json.loads(text.split("```json\n")[1].split("```")[0])

    paper = card(loss_type="td")
    assert paper["loss_type"] == "td" and paper["tokens_per_step"] == 2 and paper["max_steps"] == 8
    # Settings td does not read (DDO's, the path loss's, dParallel's) and the epochs max_steps overrode are left out.
    for unused in (
        "beta",
        "fake_weight",
        "lambda_path",
        "ref_sync_steps",
        "certainty_weight",
        "num_train_epochs",
    ):
        assert unused not in paper, unused
    assert "student_state_ratio" not in paper and "student_state_labels" not in paper
    # dParallel's own settings are listed at their defaults too; an epoch-length run lists its epochs.
    dparallel = card(loss_type="dparallel", max_steps=-1, num_train_epochs=1)
    assert {"certainty_weight", "certainty_temperature", "num_train_epochs"} <= dparallel.keys()
    assert "max_steps" not in dparallel and "state_sampling" not in dparallel and "beta" not in dparallel
    assert "tokens_per_step" not in card(loss_type="mdlm") and card()["lambda_path"] == 0.2
    departed = card(loss_type="td", student_state_ratio=0.25, student_state_labels="rollout")
    assert departed["student_state_ratio"] == 0.25 and departed["student_state_labels"] == "rollout"
    assert card(loss_type="dparallel", certainty_weight=3.0)["certainty_weight"] == 3.0
    assert "overwrite_output_dir" not in departed  # how the run was carried out, not a setting of the model
    # The quick start decodes a training prompt (a math question was all [UNK] for a task's own tokenizer), and
    # "other budgets" names a budget other than the model's own.
    plain = build_tokenizer()
    plain.chat_template = None  # a task's own tokenizer, as the demo's
    args = config(tmp_path, loss_type="td")
    trainer = T3DTrainer(
        build_bidirectional_model(plain, seed=1),
        args,
        train_dataset=trajectories["bidirectional"],
        processing_class=plain,
    )
    trainer.create_model_card()
    text = (Path(args.output_dir) / "README.md").read_text()
    first = plain.decode(trajectories["bidirectional"][0]["prompt_ids"], skip_special_tokens=True).strip()
    assert f"inputs = tokenizer({json.dumps(first)}, " in text and "12 * 7" not in text
    assert "tokens_per_step=1)`" in text


def test_model_card_names_hub_datasets_and_base_models_only(tokenizer, trajectories, tmp_path, monkeypatch):
    # A card's datasets/base_model and their links are Hub repos: a local path or a demo task links nowhere.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c1" / "traj").mkdir(parents=True)
    build_bidirectional_model(tokenizer, seed=1).save_pretrained(tmp_path / "models" / "base")
    student = AutoModelForDiffusionLM.from_pretrained("models/base")
    trainer = T3DTrainer(student, config(tmp_path), train_dataset=trajectories["bidirectional"])
    readme = Path(trainer.args.output_dir) / "README.md"
    for local in ("c1/traj", "demo:wordsort"):
        trainer.create_model_card(dataset_name=local)
        text = readme.read_text()
        assert local not in text and "datasets:" not in text and "base_model" not in text
    trainer.create_model_card(dataset_name="me/traj")
    text = readme.read_text()
    assert "datasets:\n- me/traj" in text and "(https://huggingface.co/datasets/me/traj)" in text


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


def test_prompts_over_the_limit_are_dropped_not_truncated(tokenizer, trajectories, tmp_path, caplog):
    dataset = trajectories["bidirectional"]
    limit = sorted(len(ids) for ids in dataset["prompt_ids"])[1]
    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        trainer = T3DTrainer(
            build_bidirectional_model(tokenizer, seed=1),
            config(tmp_path, max_prompt_length=limit, max_completion_length=10),
            train_dataset=dataset,
        )
    kept = trainer.train_dataset
    cut = sum(
        len(c) > 10 for c, p in zip(dataset["completion_ids"], dataset["prompt_ids"]) if len(p) <= limit
    )
    assert (
        cut
        and f"train dataset: cut {cut} of {len(kept)} completions to max_completion_length=10" in caplog.text
    )
    assert len(kept) == sum(len(ids) <= limit for ids in dataset["prompt_ids"])
    assert set(map(tuple, kept["prompt_ids"])) <= set(map(tuple, dataset["prompt_ids"]))
    assert max(len(ids) for ids in kept["completion_ids"]) <= 10
    assert [len(s) for s in kept["decode_step"]] == [len(c) for c in kept["completion_ids"]]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"loss_type": "sft"}, "loss_type must be one of"),
        ({"loss_type": "td", "path_weighting": "late"}, "only by loss_type='t3d'"),
        (
            {"loss_type": "redi", "lambda_path": 5.0},
            "lambda_path=5.0 is read only by loss_type='t3d'; loss_type='redi'",
        ),
        ({"loss_type": "td", "beta": 1.0}, "beta=1.0 is read only by loss_type='t3d' or 'ddo'"),
        ({"loss_type": "t3d", "certainty_weight": 1.0}, "read only by loss_type='dparallel'"),
        (
            {"loss_type": "redi", "state_sampling": "reference"},
            "read only by loss_type='t3d' or 'ddo' or 'td'",
        ),
        ({"loss_type": "mdlm", "tokens_per_step": 4}, "tokens_per_step=4 is read only by"),
        ({"beta": float("nan")}, "beta must be a finite number"),
        ({"lambda_path": float("inf")}, "lambda_path must be a finite number"),
        ({"lambda_path": 0.0}, "use loss_type='ddo'"),
        ({"block_length": 4, "tokens_per_step": 3}, "not a multiple of tokens_per_step"),
        ({"ref_sync_steps": 0}, "ref_sync_steps"),
        ({"fake_estimator": "sample"}, "fake_estimator must be one of"),
        ({"random_token_prob": 1.0}, "random_token_prob"),
        ({"loss_type": "redi", "student_state_ratio": 0.5}, "moves trajectory states"),
        ({"student_state_ratio": 1.5}, "student_state_ratio must be in"),
        ({"student_state_ratio": 0.5, "student_state_labels": "sample"}, "student_state_labels must be"),
        ({"student_state_labels": "rollout"}, "student_state_ratio=0 makes none"),
        # 0 would train one step at learning rate 0 and save the unchanged model; -1 is transformers' "epochs".
        ({"max_steps": 0}, "max_steps must be a positive number of optimizer steps, or -1"),
        ({"max_steps": -2}, "max_steps must be a positive number"),
        ({"num_train_epochs": 0}, "num_train_epochs must be positive when max_steps=-1"),
        ({"num_train_epochs": float("nan")}, "num_train_epochs must be positive"),
    ],
)
def test_invalid_configurations_fail_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        T3DConfig(output_dir=str(tmp_path), **overrides)


def test_an_output_dir_that_is_a_file_fails_at_construction(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")  # the run failed only once it saved, after the model and data had loaded
    with pytest.raises(ValueError, match="output_dir .*afile is a file"):
        T3DConfig(output_dir=str(afile))


def test_config_defaults_follow_the_paper_and_work_on_cpu(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning from our own defaults on every run
        args = T3DConfig(output_dir=str(tmp_path))
    assert (args.loss_type, args.beta, args.fake_weight, args.lambda_path) == ("t3d", 0.1, 0.5, 0.2)
    assert (args.path_weighting, args.ref_sync_steps, args.random_token_prob) == ("early", 10, 0.1)
    assert args.fake_estimator == "argmax"  # the reference code's fake samples
    assert args.student_state_ratio == 0.0  # teacher states only, as in the paper
    assert (args.max_prompt_length, args.max_completion_length, args.learning_rate) == (512, 1024, 1e-5)
    if not torch.cuda.is_available():
        assert args.bf16 is False  # TRL's bf16 default would refuse to start on a CPU-only machine
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True  # TRL's default
    if not torch.accelerator.is_available():
        assert args.dataloader_pin_memory is False  # torch warns about pinned memory without an accelerator
    # Every parameter is used by a diffusion forward: DDP's unused-parameter search (and its warning) is off,
    # unless asked for.
    assert args.ddp_find_unused_parameters is False
    assert T3DConfig(output_dir=str(tmp_path), ddp_find_unused_parameters=True).ddp_find_unused_parameters


# ---- multi-process launches and sharded references ------------------------------------------------------------

LAUNCHER_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "LOCAL_RANK", "MASTER_ADDR", "ACCELERATE_USE_CPU")


@pytest.fixture
def launcher_env(monkeypatch):
    """Clears the launcher variables; returns a setter (used once the trainer exists: accelerate would otherwise
    try to join the group the variables describe)."""
    for name in LAUNCHER_VARIABLES + ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch.setenv


@pytest.mark.parametrize(
    "variables, message",
    [
        # torchrun started 2 processes that did not join one group: 2 independent copies that all save.
        (
            {"WORLD_SIZE": "2"},
            r"launched as 2 processes but runs as 1: each process would train its own copy",
        ),
        ({"PMI_SIZE": "4"}, r"launched as 4 processes but runs as 1"),  # mpirun
        # `accelerate launch --cpu --num_processes 2` without mpirun: one process, no rank, a MASTER_ADDR; the same
        # for `accelerate launch --num_processes 2` on a machine without GPUs (ACCELERATE_USE_CPU=False).
        ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, r"accelerate launch` was asked for"),
        ({"ACCELERATE_USE_CPU": "False", "MASTER_ADDR": "127.0.0.1"}, r"accelerate launch` was asked for"),
        # FSDP asked for where accelerate cannot shard (CPU processes): no silent fallback to whole models.
        ({"ACCELERATE_USE_FSDP": "true"}, r"asked for FSDP but accelerate set up NO: accelerate shards"),
    ],
)
def test_launches_that_would_not_train_one_model_together_are_refused(
    tokenizer, trajectories, tmp_path, launcher_env, variables, message
):
    # The check T3DTrainer runs at construction (a real 2-process launch: tests/test_cli_train.py).
    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        config(tmp_path, use_cpu=True),
        train_dataset=trajectories["bidirectional"],
        processing_class=tokenizer,
    )
    trainer._check_launch()  # a plain one-process run passes
    for name, value in variables.items():
        launcher_env(name, value)
    with pytest.raises(ValueError, match=message):
        trainer._check_launch()


def _fake_deepspeed(rank: int) -> types.ModuleType:
    """``deepspeed`` at the boundary the reference refresh touches: ``zero.GatheredParameters`` (records the
    gathered parameters and the rank allowed to modify them) and ``comm.get_rank``."""
    module = types.ModuleType("deepspeed")
    module.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
    module.gathered = []

    class GatheredParameters:
        def __init__(self, params, modifier_rank=None):
            module.gathered.append((list(params), modifier_rank))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    module.zero = SimpleNamespace(GatheredParameters=GatheredParameters)
    module.comm = SimpleNamespace(get_rank=lambda: rank)
    module.DeepSpeedEngine = type(
        "DeepSpeedEngine", (torch.nn.Module,), {}
    )  # accelerate's unwrap looks for it
    return module


@pytest.mark.parametrize("rank", [0, 1])
def test_zero3_reference_refresh_gathers_both_models_and_copies_on_rank_0(
    tokenizer, trajectories, tmp_path, monkeypatch, rank, caplog
):
    # Not a DeepSpeed run (DeepSpeed is not installed here): the ZeRO-3 branch with DeepSpeed's context managers
    # mocked: one gather of both models' parameters, modified on rank 0 only (the others receive rank 0's copy).
    import sys

    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        config(tmp_path, loss_type="t3d", use_cpu=True),
        train_dataset=trajectories["bidirectional"],
        processing_class=tokenizer,
    )
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)  # the student moved away from the reference
    fake = _fake_deepspeed(rank)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    monkeypatch.setattr(T3DTrainer, "is_zero3", property(lambda self: True))
    trainer.sync_reference()
    student, reference = list(trainer.model.parameters()), list(trainer.ref_model.parameters())
    assert len(fake.gathered) == 1
    params, modifier = fake.gathered[0]
    assert modifier == 0 and [id(p) for p in params] == [id(p) for p in student + reference]
    copied = all(torch.equal(s, r) for s, r in zip(student, reference))
    assert copied is (rank == 0)  # the other ranks' copies come from rank 0 when the context exits

    # A LoRA student keeps its reference as the adapter "ref": the same boundary, over the two adapters' weights
    # only (the trained adapter's, then the reference adapter's, in matching order).
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter_trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=2),
        config(tmp_path / "lora", loss_type="t3d", use_cpu=True),
        train_dataset=trajectories["bidirectional"],
        processing_class=tokenizer,
        peft_config=lora,
    )
    named = dict(adapter_trainer.model.named_parameters())
    trained = [n for n in named if ".default." in n]
    with torch.no_grad():
        for name in trained:
            named[name].add_(1.0)
    adapter_fake = _fake_deepspeed(rank)
    monkeypatch.setitem(sys.modules, "deepspeed", adapter_fake)
    adapter_trainer.sync_reference()
    [(params, modifier)] = adapter_fake.gathered
    expected = [named[n] for n in trained] + [named[n.replace(".default.", ".ref.")] for n in trained]
    assert trained and modifier == 0 and [id(p) for p in params] == [id(p) for p in expected]
    copied = all(torch.equal(named[n], named[n.replace(".default.", ".ref.")]) for n in trained)
    assert copied is (rank == 0)

    # The sharded reference is not written into ZeRO-3 checkpoints; a resume re-syncs it (with a warning).
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    trainer.reference.save(str(folder))
    assert not (folder / REFERENCE_FILE).exists() and "not saved" in caplog.text


def saving_every_step(tokenizer, dataset, tmp_path, **overrides) -> T3DTrainer:
    """A trainer of the same student on ``dataset`` that saves a checkpoint every step into ``tmp_path/out``."""
    args = config(tmp_path, save_strategy="steps", save_steps=1, **overrides)
    return T3DTrainer(build_bidirectional_model(tokenizer, seed=1), args, train_dataset=dataset)


def test_reruns_into_a_folder_with_checkpoints_resume_or_refuse(
    tokenizer, trajectories, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    trainer = functools.partial(saving_every_step, tokenizer, trajectories["bidirectional"], tmp_path)

    trainer(max_steps=2).train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    with pytest.raises(
        ValueError, match=r"already holds checkpoint-1, checkpoint-2: pass resume_from_checkpoint"
    ):
        trainer(max_steps=3).train()  # a plain rerun would mix two runs' checkpoints

    (out / "checkpoint-7").mkdir()  # cut short by a kill: no trainer_state.json, so not resumed from
    resumed = trainer(max_steps=3)
    steps = []
    real = T3DTrainer.compute_loss
    monkeypatch.setattr(
        T3DTrainer, "compute_loss", lambda self, *a, **k: steps.append(1) or real(self, *a, **k)
    )
    resumed.train(resume_from_checkpoint="true")  # what `--resume_from_checkpoint true` passes
    assert resumed.state.global_step == 3 and len(steps) == 1  # steps 1-2 came from checkpoint-2
    monkeypatch.undo()

    fresh = trainer(max_steps=1, overwrite_output_dir=True)
    fresh.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # older checkpoints deleted

    # A save that fails half-way leaves no checkpoint folder for a resume to pick up.
    def disk_full(self, output_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(T3DTrainer, "_save_optimizer_and_scheduler", disk_full)
    with pytest.raises(OSError, match="No space left"):
        trainer(max_steps=1, overwrite_output_dir=True).train()
    assert not list(out.glob("checkpoint-*"))


def test_rows_beyond_the_model_positions_are_dropped_with_a_warning(
    tokenizer, trajectories, tmp_path, caplog
):
    dataset = trajectories["bidirectional"]
    totals = [len(p) + len(c) for p, c in zip(dataset["prompt_ids"], dataset["completion_ids"])]
    limit = sorted(totals)[1]  # the two shortest rows fit
    model = build_bidirectional_model(tokenizer, seed=1, max_position_embeddings=limit)
    with caplog.at_level("WARNING"):
        trainer = T3DTrainer(model, config(tmp_path), train_dataset=dataset)
    kept = sum(t <= limit for t in totals)
    assert len(trainer.train_dataset) == kept < len(dataset)
    assert f"dropped {len(dataset) - kept} of {len(dataset)} rows" in caplog.text
    assert f"longer than the model's max_position_embeddings={limit}" in caplog.text


def test_logged_metrics_weigh_every_token_alike_across_batches_and_processes(
    tokenizer, trajectories, tmp_path
):
    """Sums and counts, summed over micro-batches and processes: a batch of 3 tokens and one of 1 log the mean of
    the 4 tokens, not the mean of the two batch means (which made metrics depend on batch size and process count)."""
    trainer = train(tokenizer, trajectories["bidirectional"], config(tmp_path, loss_type="td", max_steps=1))
    trainer._record({"loss/ddo": (torch.tensor(0.0), torch.tensor(0.0))}, mode="eval")  # counted nothing
    gather = trainer.accelerator.gather
    trainer.accelerator.gather = lambda t: torch.cat([t, t.new_tensor([[[1.0, 1.0]]])])  # a second process
    trainer._record({"masked_token_accuracy": (torch.tensor(3.0), torch.tensor(3.0))}, mode="eval")
    trainer._record({"masked_token_accuracy": (torch.tensor(0.0), torch.tensor(1.0))}, mode="eval")
    trainer.accelerator.gather = gather
    # Tokens: 3 + 1 here, 1 + 1 on the other process, 5 of the 6 correct (the mean of means was 0.75).
    assert trainer._mean_metrics("eval") == {"masked_token_accuracy": pytest.approx(5 / 6)}
    # A diverged model's NaN shows as NaN, not as a perfect 0.0 (an empty batch sums to 0 without a NaN).
    trainer._record({"loss/td": (torch.tensor(float("nan")), torch.tensor(3.0))}, mode="eval")
    trainer._record({"loss/td": (torch.tensor(1.0), torch.tensor(1.0))}, mode="eval")
    assert math.isnan(trainer._mean_metrics("eval")["loss/td"])


@pytest.mark.parametrize("loss_type", ["t3d", "dparallel"])
def test_eval_loss_is_the_objective_over_the_whole_set(tokenizer, trajectories, tmp_path, loss_type):
    """transformers averages per-batch losses (its eval_loss moved with the eval batch size); the logged eval_loss is
    the objective over every token of the set, the sum of its terms as compute_loss weighs them."""
    data = trajectories["bidirectional"]
    trainer = train(tokenizer, data, config(tmp_path, loss_type=loss_type, max_steps=1), eval_dataset=data)
    results = {}
    for batch_size in (1, 3, len(data)):
        trainer.args.per_device_eval_batch_size = batch_size
        results[batch_size] = {k: v for k, v in trainer.evaluate().items() if "loss" in k or "accuracy" in k}
    assert results[1] == pytest.approx(results[3]) and results[1] == pytest.approx(results[len(data)])
    metrics = results[1]
    terms = (
        metrics["eval_loss/ddo"] + trainer.args.lambda_path * metrics["eval_loss/path"]
        if loss_type == "t3d"
        else metrics["eval_loss/ce"] + metrics["eval_loss/certainty"]
    )
    assert metrics["eval_loss"] == pytest.approx(terms)
    assert trainer.predict(data).metrics["test_loss"] == pytest.approx(metrics["eval_loss"])


def test_evaluation_sets_are_checked_prepared_and_named_as_training_data_is(
    tokenizer, trajectories, tmp_path
):
    data = trajectories["bidirectional"]
    with pytest.raises(
        ValueError, match="decoded with block_causal attention but the student is bidirectional"
    ):
        T3DTrainer(
            build_bidirectional_model(tokenizer, seed=1),
            config(tmp_path / "refused"),
            train_dataset=data,
            eval_dataset=trajectories["block_causal"],
        )
    args = config(
        tmp_path, loss_type="td", student_state_ratio=1.0, max_steps=4, eval_strategy="steps", eval_steps=2
    )
    trainer = train(tokenizer, data, args, eval_dataset=data)
    # Student states are training metrics, also on a step that follows an evaluation (model in eval mode).
    steps = [h for h in trainer.state.log_history if "loss" in h]
    evaluations = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(steps) == 4 and all(h["student_states"] == 1.0 for h in steps)
    assert len(evaluations) == 2 and not any("eval_student_states" in h for h in evaluations)

    def scores(metrics):  # without the timings
        return {k: v for k, v in metrics.items() if not k.endswith(("runtime", "per_second"))}

    first = scores(trainer.evaluate())
    assert {"eval_loss", "eval_masked_token_accuracy", "epoch"} <= set(first)
    # A dataset passed to evaluate or predict is prepared as the training set is, on the same epoch-0 states;
    # predict's metrics go into its output, not into the next evaluation.
    assert scores(trainer.evaluate(data)) == pytest.approx(first)
    predicted = trainer.predict(data).metrics
    assert predicted["test_loss"] == pytest.approx(first["eval_loss"])
    assert predicted["test_masked_token_accuracy"] == pytest.approx(first["eval_masked_token_accuracy"])
    assert scores(trainer.evaluate()) == pytest.approx(first)
    named = trainer.evaluate(metric_key_prefix="dev")
    assert "dev_masked_token_accuracy" in named and "eval_masked_token_accuracy" not in named
    bad = data.map(lambda row: {"completion_ids": [10**6, *row["completion_ids"][1:]]})
    with pytest.raises(ValueError, match="row 0"):
        trainer.evaluate(bad)


def test_a_pushed_checkpoint_carries_an_adapters_decoding_defaults(
    tokenizer, trajectories, tmp_path, monkeypatch
):
    # transformers uploads output_dir after copying a fixed list of model files into it from the checkpoint: the
    # adapter's diffusion_config.json must be copied too, or the Hub copy loads without the distilled budget.
    import transformers

    from t3d_trl.models.auto import ADAPTER_DEFAULTS_FILE

    uploaded = []
    monkeypatch.setattr(
        transformers.Trainer,
        "_push_from_checkpoint",
        lambda self, folder: uploaded.append(sorted(os.listdir(self.args.output_dir))),
    )
    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        config(tmp_path),
        train_dataset=trajectories["bidirectional"],
    )
    checkpoint = tmp_path / "out" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / ADAPTER_DEFAULTS_FILE).write_text('{"diffusion_generation": {"tokens_per_step": 2}}')
    trainer._push_from_checkpoint(str(checkpoint))
    assert uploaded == [sorted([ADAPTER_DEFAULTS_FILE, "checkpoint-2"])]

    # A checkpoint with its own code: the modules auto_map names (and what they import) travel with it too.
    auto_map = {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "other/repo--modeling_far.Far"}
    (checkpoint / "config.json").write_text(json.dumps({"auto_map": auto_map}))
    (checkpoint / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_tiny.TinyTokenizer", None]}})
    )
    (checkpoint / "configuration_tiny.py").write_text("from .helpers import X\n")
    for name in ("helpers.py", "tokenization_tiny.py", "unrelated.py"):
        (checkpoint / name).write_text("X = 1\n")
    uploaded.clear()
    trainer._push_from_checkpoint(str(checkpoint))
    code = {"configuration_tiny.py", "helpers.py", "tokenization_tiny.py"}
    assert code <= set(uploaded[0]) and "unrelated.py" not in uploaded[0]
    assert (tmp_path / "out" / ADAPTER_DEFAULTS_FILE).read_text() == (
        checkpoint / ADAPTER_DEFAULTS_FILE
    ).read_text()


def test_an_adapter_of_a_local_base_model_is_not_pushed(tokenizer, trajectories, tmp_path, monkeypatch):
    # adapter_config.json names its base by the path it was loaded from: pushed, nobody else could load it.
    from peft import LoraConfig

    base = tmp_path / "models" / "base"
    build_bidirectional_model(tokenizer, seed=1).save_pretrained(base)
    monkeypatch.chdir(tmp_path)  # the relative path the recipes use
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    args = config(tmp_path, push_to_hub=True, hub_model_id="me/student")
    with pytest.raises(
        ValueError, match=r"base model is the local folder 'models/base'.*Push the base model"
    ):
        T3DTrainer(
            AutoModelForDiffusionLM.from_pretrained("models/base"),
            args,
            train_dataset=trajectories["bidirectional"],
            peft_config=lora,
        )


def test_a_resume_skips_incomplete_checkpoints_and_refuses_other_settings(
    tokenizer, trajectories, tmp_path, monkeypatch, caplog
):
    out = tmp_path / "out"
    trainer = functools.partial(saving_every_step, tokenizer, trajectories["bidirectional"], tmp_path)

    trainer(max_steps=4).train()
    settings = json.loads((out / "checkpoint-4" / "t3d_settings.json").read_text())
    assert (settings["loss_type"], settings["learning_rate"], settings["block_length"]) == ("t3d", 1e-2, 4)
    assert "max_steps" not in settings  # a resume may extend the run
    # Each later checkpoint lacks something the resume needs; transformers would restart the optimizer and
    # schedule silently (no optimizer.pt), stop (no weights), or fail in torch.load (a truncated scheduler.pt).
    (out / "checkpoint-4" / "optimizer.pt").unlink()
    (out / "checkpoint-3" / "model.safetensors").unlink()
    scheduler = out / "checkpoint-2" / "scheduler.pt"
    with open(scheduler, "r+b") as f:
        f.truncate(scheduler.stat().st_size // 2)
    resumed = trainer(max_steps=5)
    steps = []
    real = T3DTrainer.compute_loss
    monkeypatch.setattr(
        T3DTrainer, "compute_loss", lambda self, *a, **k: steps.append(1) or real(self, *a, **k)
    )
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 5 and len(steps) == 4  # from checkpoint-1
    monkeypatch.undo()
    assert "checkpoint-4 holds no optimizer or learning-rate scheduler state (no optimizer.pt)" in caplog.text
    assert "checkpoint-3 has no weights file" in caplog.text
    assert "checkpoint-2/scheduler.pt is damaged (BadZipFile" in caplog.text

    # The td objective at another budget, learning rate and batch would train on from a t3d checkpoint.
    changed = trainer(
        max_steps=8, loss_type="td", tokens_per_step=4, learning_rate=0.5, per_device_train_batch_size=2
    )
    with pytest.raises(ValueError) as info:
        changed.train(resume_from_checkpoint=True)
    message = str(info.value)
    for difference in (
        "loss_type: checkpoint 't3d', now 'td'",
        "tokens_per_step: checkpoint 2, now 4",
        "learning_rate: checkpoint 0.01, now 0.5",
        "per_device_train_batch_size: checkpoint 4, now 2",
    ):
        assert difference in message
    assert "max_steps" not in message and "resume with the checkpoint's settings" in message
    assert changed.state.global_step == 0  # refused before anything trained

    # A checkpoint from before the settings were recorded resumes as it did.
    (out / "checkpoint-5" / "t3d_settings.json").unlink()
    older = trainer(max_steps=6, learning_rate=0.5)
    older.train(resume_from_checkpoint=True)
    assert older.state.global_step == 6


@pytest.mark.parametrize("checkpointing_kwargs", [{}, {"every_n_layers": 2}])
def test_the_lora_reference_forward_leaves_activation_checkpointing_on(
    tokenizer, trajectories, tmp_path, checkpointing_kwargs
):
    """The reference forward runs without gradients: switching checkpointing off and on around it re-enabled it
    with the raw kwargs (``every_n_layers`` failed), added a peft input-embedding hook per step and warned twice."""
    from peft import LoraConfig

    class CountHooks(TrainerCallback):
        def __init__(self):
            self.counts: list[int] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.counts.append(len(model.get_input_embeddings()._forward_hooks))

    def run(name: str, **overrides) -> tuple[T3DTrainer, CountHooks]:
        hooks = CountHooks()
        args = config(tmp_path / name, max_steps=3, **overrides)
        lora = LoraConfig(r=4, target_modules=["q_proj"])
        trainer = T3DTrainer(
            build_bidirectional_model(tokenizer, seed=1),
            args,
            train_dataset=trajectories["bidirectional"],
            peft_config=lora,
            callbacks=[hooks],
        )
        trainer.train()
        return trainer, hooks

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing_(enable|disable).*deprecated")
        on, hooks = run(
            "on", activation_checkpointing=True, activation_checkpointing_kwargs=checkpointing_kwargs
        )
    assert len(hooks.counts) == 3 and len(set(hooks.counts)) == 1  # no hook added per step
    off, _ = run("off")
    assert logged(on) == pytest.approx(logged(off), rel=1e-5)  # checkpointing changes no loss


@pytest.mark.parametrize("lora", [False, True])
def test_load_best_model_at_end_restores_the_reference_of_the_best_checkpoint(
    tokenizer, trajectories, tmp_path, lora
):
    from peft import LoraConfig

    data = trajectories["bidirectional"]
    args = config(
        tmp_path,
        max_steps=3,
        ref_sync_steps=2,  # the reference of the last step is not the best checkpoint's
        per_device_train_batch_size=2,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=True,  # the loss falls: the first checkpoint is the best
    )
    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None
    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        args,
        train_dataset=data,
        eval_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-1")
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.state.best_metric, rel=1e-6)
    assert trainer.reference.synced_at == 0


def test_disable_dropout_warns_when_it_zeroes_lora_dropout(tokenizer, trajectories, tmp_path, caplog):
    from peft import LoraConfig

    def dropouts(name: str, lora_dropout: float, **overrides) -> set[float]:
        trainer = T3DTrainer(
            build_bidirectional_model(tokenizer, seed=1),
            config(tmp_path / name, loss_type="td", **overrides),
            train_dataset=trajectories["bidirectional"],
            peft_config=LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=lora_dropout),
        )
        return {m.p for n, m in trainer.model.named_modules() if "lora_dropout" in n and hasattr(m, "p")}

    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        assert dropouts("zeroed", 0.3) == {0.0}
    assert caplog.text.count("zeroes the adapter's lora_dropout=0.3") == 1
    assert "disable_dropout=False" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        assert dropouts("kept", 0.3, disable_dropout=False) == {0.3}
        dropouts("none", 0.0)
    assert "lora_dropout" not in caplog.text


@pytest.mark.parametrize(
    "loss_type, objective",
    [
        ("t3d", "by trajectory self-distillation (T3D"),
        ("td", "by trajectory self-distillation (T3D"),
        ("redi", "by ReDi endpoint distillation"),
        ("dparallel", "by dParallel certainty forcing"),
        ("mdlm", None),
    ],
)
def test_model_card_describes_the_objective_the_run_trained(
    tokenizer, trajectories, tmp_path, loss_type, objective
):
    data = trajectories["bidirectional"]
    if loss_type == "mdlm":
        data = data.select_columns(["prompt", "completion"])
    args = config(tmp_path, loss_type=loss_type)
    trainer = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1), args, train_dataset=data, processing_class=tokenizer
    )
    trainer.create_model_card()
    intro = (Path(args.output_dir) / "README.md").read_text().split("## Quick start")[0]
    if objective is None:
        assert "A masked diffusion language model" in intro and "distillation" not in intro
    else:
        assert objective in intro
        assert ("decoding trajectories" in intro) == (loss_type in ("t3d", "td"))
