"""Sharded T3D training on CPU processes against one process: DDP, FSDP2 (full shard) and FSDP2 with LoRA.

accelerate cannot shard on CPU processes: it turns a launch into FSDP only when the processes run on GPUs (or
other accelerators); CPU processes become plain data parallel (``MULTI_CPU``), every process holding the whole
model (``docs/recipes.md#several-cpu-processes``). So the FSDP2 runs here wrap the project's trainer pieces
with ``torch.distributed.fsdp.fully_shard`` directly (each decoder layer, then the model; the DDO reference
model too), on two gloo processes: ``T3DTrainer``'s data loader, collator, ``training_step`` (the T3D loss and
its global normalisation), optimizer, scheduler, reference refresh (``sync_reference`` through the trainer's
callback) and reference checkpoint (``reference.save``/``reference.load``).

Four ways, the same data (the packaged ``sort2`` teacher's trajectories), the same global batch, seed and
settings (``loss_type: t3d``, ``ref_sync_steps: 3`` so a refresh falls inside the run), each for 4 optimizer steps:

1. one process, ``T3DTrainer.train()`` (the reference for the others); also with LoRA for run 4;
2. two processes, DDP: ``T3DTrainer.train()`` under ``torchrun`` (gloo);
3. two processes, FSDP2 full shard. The run saves a checkpoint after step 2 (student with ``save_pretrained``
   from the gathered full state, optimizer, scheduler, ``t3d_reference.safetensors``) and goes on; a second
   run resumes from that checkpoint (the student loaded with ``from_pretrained``) and must give the same
   losses for steps 3-4;
4. two processes, FSDP2 with LoRA (the reference is a second adapter, sharded with the layers).

Printed: ``max_loss_diff_ddp`` / ``max_loss_diff_fsdp`` (largest per-step loss difference against one process;
``max_loss_diff_fsdp`` covers runs 3 and 4), ``max_weight_diff_fsdp`` (final weights, FSDP2 saved and reloaded
vs one process), ``fsdp_param_bytes_per_rank_over_full`` (the largest process's local parameter bytes, student
and reference, over the full bytes of both), ``ref_sync_ok`` (right after the refresh at step 3, the reference
equals the student: FSDP2 full and LoRA), ``resume_loss_diff_fsdp``. Targets: loss differences <= 1e-4, bytes
ratio <= 0.6.

Usage::

    python benchmarks/bench_distributed.py [--quick] [--prompts 64] [--batch 16]

``--quick`` uses 16 prompts and a global batch of 4 unless given (well under a minute). The last line printed is
one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from smoke import parse_with_quick

STEPS, SAVE_AT, REF_SYNC_STEPS = 4, 2, 3
TARGETS = {"loss_diff": 1e-4, "bytes_ratio": 0.6}


def _settings(output_dir: Path, batch: int) -> Any:
    from t3d_trl.trainer import T3DConfig

    return T3DConfig(
        output_dir=str(output_dir),
        loss_type="t3d",
        max_steps=STEPS,
        per_device_train_batch_size=batch,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=1.0,
        ref_sync_steps=REF_SYNC_STEPS,
        tokens_per_step=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def _lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])


def _trainer(workdir: Path, name: str, batch: int, lora: bool, student: str | None = None) -> Any:
    from t3d_trl import AutoModelForDiffusionLM, load_trajectories
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
    from t3d_trl.demo.tasks import get_task
    from t3d_trl.trainer import T3DTrainer

    model = AutoModelForDiffusionLM.from_pretrained(student or PACKAGED_TEACHERS / "sort2")
    return T3DTrainer(
        model,
        _settings(workdir / name, batch),
        train_dataset=load_trajectories(str(workdir / "trajectories")),
        processing_class=get_task("sort2").tokenizer(),
        peft_config=_lora() if lora else None,
    )


def _losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _weights(model: Any) -> dict[str, Any]:
    from t3d_trl.models.forward import unwrap_model

    return {n: t.detach().clone() for n, t in unwrap_model(model).state_dict().items()}


# ---- the two-process runs (under torchrun) ----------------------------------------------------------------------


def _shard(trainer: Any) -> None:
    """FSDP2 full shard of the student and the reference model: each decoder layer, then the whole model."""
    from torch.distributed.fsdp import fully_shard

    from t3d_trl.models.forward import unwrap_model

    for module in (trainer.model, trainer.ref_model):
        if module is None:
            continue
        inner = unwrap_model(module)
        for layer in inner.model.layers:
            fully_shard(layer)
        fully_shard(inner)


def _full_equal(sources: list[Any], targets: list[Any]) -> bool:
    from torch.distributed.tensor import DTensor

    def full(t: Any) -> Any:
        return t.full_tensor() if isinstance(t, DTensor) else t

    return all(bool((full(s) == full(t)).all()) for s, t in zip(sources, targets, strict=True))


def _param_bytes(trainer: Any) -> tuple[int, int]:
    """(this process's local bytes, full bytes) of the student's and the reference model's parameters."""
    from torch.distributed.tensor import DTensor

    local = full = 0
    for module in (trainer.model, trainer.ref_model):
        for p in module.parameters() if module is not None else ():
            shard = p.to_local() if isinstance(p, DTensor) else p
            local += shard.numel() * shard.element_size()
            full += p.numel() * p.element_size()
    return local, full


def _train_sharded(trainer: Any, start: int, stop: int, checkpoint: Path | None = None) -> dict[str, Any]:
    """Optimizer steps ``start+1..stop`` of the trainer's own pieces on the FSDP2-sharded models (a resume,
    ``start > 0``, has restored the optimizer and the scheduler)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from t3d_trl.models.forward import unwrap_model

    args, model = trainer.args, trainer.model
    if start == 0:
        trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    batches = iter(trainer.get_train_dataloader())
    for _ in range(start):  # the batches of the steps before a resume
        next(batches)
    trainer.state.global_step = start
    losses, sync_ok = [], None
    for _ in range(start, stop):
        batch = next(batches)
        loss = trainer.training_step(model, batch, trainer._get_num_items_in_batch([batch], args.device))
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad(set_to_none=True)
        trainer.state.global_step += 1
        trainer.callback_handler.on_step_end(args, trainer.state, trainer.control)  # refreshes the reference
        dist.all_reduce(loss)
        losses.append(loss.item() / dist.get_world_size())
        if trainer.state.global_step % args.ref_sync_steps == 0:
            sync_ok = _full_equal(*trainer.reference.pairs())
        if checkpoint is not None and trainer.state.global_step == SAVE_AT:
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(model, options=full)  # gathered on the main process only
            optimizer = get_optimizer_state_dict(model, trainer.optimizer, options=full)
            if args.should_save:
                unwrap_model(model).save_pretrained(checkpoint, state_dict=state)
                torch.save(
                    {"optimizer": optimizer, "scheduler": trainer.lr_scheduler.state_dict()},
                    checkpoint / "trainer.pt",
                )
            trainer.reference.save(str(checkpoint))  # every process: the reference's shards are gathered
            dist.barrier()
    return {"losses": losses, "ref_sync_ok": sync_ok}


def _resume_sharded(trainer: Any, checkpoint: Path) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    saved = torch.load(checkpoint / "trainer.pt", weights_only=False)
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, saved["optimizer"], options=options)
    trainer.lr_scheduler.load_state_dict(saved["scheduler"])
    trainer.reference.load(str(checkpoint))
    return _train_sharded(trainer, SAVE_AT, STEPS)


def worker(workdir: Path, batch: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from t3d_trl.models.forward import unwrap_model

    torch.set_num_threads(1)
    per_device = batch // int(os.environ["WORLD_SIZE"])
    results: dict[str, Any] = {}

    ddp = _trainer(workdir, "ddp", per_device, lora=False)
    ddp.train()
    results["ddp"] = {"losses": _losses(ddp), "world_size": ddp.args.world_size}
    if ddp.args.should_save:
        ddp.save_model(str(workdir / "ddp"))

    fsdp = _trainer(workdir, "fsdp", per_device, lora=False)
    _shard(fsdp)
    local, full = _param_bytes(fsdp)
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, local)
    checkpoint = workdir / "fsdp-checkpoint"
    checkpoint.mkdir(exist_ok=True)
    results["fsdp"] = _train_sharded(fsdp, 0, STEPS, checkpoint)
    results["fsdp"]["bytes_ratio"] = max(sizes) / full
    final = get_model_state_dict(fsdp.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if fsdp.args.should_save:
        unwrap_model(fsdp.model).save_pretrained(workdir / "fsdp-final", state_dict=final)

    resumed = _trainer(workdir, "fsdp-resumed", per_device, lora=False, student=str(checkpoint))
    _shard(resumed)
    results["fsdp_resumed"] = _resume_sharded(resumed, checkpoint)

    lora = _trainer(workdir, "fsdp-lora", per_device, lora=True)
    _shard(lora)
    results["fsdp_lora"] = _train_sharded(lora, 0, STEPS)
    if dist.get_rank() == 0:
        (workdir / "worker.json").write_text(json.dumps(results))
    dist.barrier()


# ---- the driver ----------------------------------------------------------------------------------------------


def _collect(workdir: Path, prompts: int) -> None:
    from datasets import Dataset

    from t3d_trl import AutoModelForDiffusionLM, collect_trajectories
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
    from t3d_trl.demo.tasks import get_task

    task = get_task("sort2")
    collect_trajectories(
        AutoModelForDiffusionLM.from_pretrained(PACKAGED_TEACHERS / "sort2"),
        task.tokenizer(),
        Dataset.from_list(task.sample(prompts, seed=0)),
        prompt_template="plain",
        prompt_column="prompt",
        id_column="id",
        use_chat_template=False,
        generation_config=task.generation_config(tokens_per_step=1, stop_at_eos=False),
        output_dir=str(workdir / "trajectories"),
        batch_size=prompts,
        seed=0,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="training prompts (trajectories)")
    parser.add_argument("--batch", type=int, default=16, help="global batch: sequences per optimizer step")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # the working folder of a torchrun worker
    options = parse_with_quick(
        parser,
        {"prompts": 16, "batch": 4},
        help="default to 16 prompts and a global batch of 4 (seconds); flags win",
    )
    if options.batch < 2 or options.batch % 2:
        parser.error(
            f"--batch must be a positive even number (it is split over 2 processes), got {options.batch}"
        )
    if options.prompts < 1:
        parser.error(f"--prompts must be >= 1, got {options.prompts}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if options.worker:
        worker(Path(options.worker), options.batch)
        return

    import torch

    from t3d_trl import AutoModelForDiffusionLM

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        _collect(workdir, options.prompts)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        command += ["--master_addr", "127.0.0.1", "--master_port", str(_free_port()), __file__]
        command += ["--worker", str(workdir), "--batch", str(options.batch)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        two = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:  # the one-process runs meanwhile
            single = _trainer(workdir, "single", options.batch, lora=False)
            single.train()
            single_lora = _trainer(workdir, "single-lora", options.batch, lora=True)
            single_lora.train()
        finally:
            output, _ = two.communicate()
        if two.returncode:
            sys.exit(f"the two-process run failed (exit {two.returncode}):\n{output[-6000:]}")
        runs = json.loads((workdir / "worker.json").read_text())
        reference, reference_lora = _losses(single), _losses(single_lora)
        expected = _weights(single.model)
        saved = _weights(AutoModelForDiffusionLM.from_pretrained(workdir / "fsdp-final"))
        ddp_weights = _weights(AutoModelForDiffusionLM.from_pretrained(workdir / "ddp"))

    def diff(a: list[float], b: list[float]) -> float:
        if len(a) != len(b):
            raise RuntimeError(f"runs of different lengths: {len(a)} and {len(b)} steps")
        return max(abs(x - y) for x, y in zip(a, b))

    def weight_diff(weights: dict[str, Any]) -> float:
        return max(float((weights[n] - t).abs().max()) for n, t in expected.items())

    resumed = runs["fsdp_resumed"]["losses"]
    summary = {
        "steps": STEPS,
        "prompts": options.prompts,
        "global_batch": options.batch,
        "ddp_world_size": runs["ddp"]["world_size"],
        "max_loss_diff_ddp": diff(runs["ddp"]["losses"], reference),
        "max_loss_diff_fsdp": max(
            diff(runs["fsdp"]["losses"], reference), diff(runs["fsdp_lora"]["losses"], reference_lora)
        ),
        "max_loss_diff_fsdp_full": diff(runs["fsdp"]["losses"], reference),
        "max_loss_diff_fsdp_lora": diff(runs["fsdp_lora"]["losses"], reference_lora),
        "max_weight_diff_ddp": weight_diff(ddp_weights),
        "max_weight_diff_fsdp": weight_diff(saved),
        "fsdp_param_bytes_per_rank_over_full": runs["fsdp"]["bytes_ratio"],
        "ref_sync_ok": bool(runs["fsdp"]["ref_sync_ok"] and runs["fsdp_lora"]["ref_sync_ok"]),
        "resume_loss_diff_fsdp": diff(resumed, runs["fsdp"]["losses"][SAVE_AT:]),
    }
    print(
        f"{'step':>4} {'1 process':>10} {'DDP':>10} {'FSDP2':>10} {'resumed':>10} {'1p LoRA':>10} {'FSDP2 LoRA':>10}"
    )
    for step in range(STEPS):
        row = [reference[step], runs["ddp"]["losses"][step], runs["fsdp"]["losses"][step]]
        row += [resumed[step - SAVE_AT] if step >= SAVE_AT else float("nan")]
        row += [reference_lora[step], runs["fsdp_lora"]["losses"][step]]
        print(f"{step + 1:>4} " + " ".join(f"{v:>10.6f}" for v in row))
    summary["targets_met"] = bool(
        max(summary["max_loss_diff_ddp"], summary["max_loss_diff_fsdp"], summary["resume_loss_diff_fsdp"])
        <= TARGETS["loss_diff"]
        and summary["fsdp_param_bytes_per_rank_over_full"] <= TARGETS["bytes_ratio"]
        and summary["ref_sync_ok"]
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
