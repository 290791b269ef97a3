"""EXPLORATORY (not the product): which embedded demo task shows the clearest few-step collapse?

For each task family, trains the tiny demo teacher (``t3d_trl.demo.build_teacher``) from scratch with a PLAIN,
minimal MDLM loop (random masking of the answer, cross-entropy on the masked tokens; not ``T3DTrainer``; a
block-causal task's teacher, ``wordsort`` and the like, in the library's block diffusion layout), then
measures its exact-match accuracy on held-out prompts at 1, 2, 4 (and 8) tokens per step (greedy,
low-confidence remasking) and its conditional total correlation by jump size on its own one-token-per-step
trajectories (``t3d_trl.total_correlation``). Single-threaded, so it can share a busy machine; the numbers
depend on the step budget. The last line printed is one JSON object.

    python benchmarks/explore_demo_tasks.py [--tasks sort2 words add] [--steps 1500] [--seed 0] [--save DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from t3d_trl import TotalCorrelationConfig, TrajectoryMetadata, total_correlation
from t3d_trl.data.collator import diffusion_attention_mask
from t3d_trl.demo import build_teacher, get_task


def encode(task, rows) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer = task.tokenizer()
    prompts = torch.tensor(tokenizer([r["prompt"] for r in rows])["input_ids"])
    answers = torch.tensor(tokenizer([r["answer"] for r in rows])["input_ids"])
    return prompts, answers


def mdlm_loss(model, prompts: torch.Tensor, answers: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Masked-token cross-entropy with the answer masked at a ratio t ~ U(0, 1) per row (at least one token)."""
    batch, length = answers.shape
    ratio = torch.rand(batch, 1)
    masked = torch.rand(batch, length) < ratio
    masked[torch.arange(batch), torch.randint(length, (batch,))] = True
    if model.diffusion_config.is_block_causal:  # wordsort, wordorder, wordset: the sampler's block layout
        return block_causal_loss(model, prompts, answers, masked, mask_id)
    inputs = torch.cat([prompts, answers.masked_fill(masked, mask_id)], dim=1)
    total = inputs.shape[1]
    logits = model(
        input_ids=inputs,
        attention_mask=torch.zeros(batch, 1, total, total),  # bidirectional, no padding
        position_ids=torch.arange(total).expand(batch, -1),
    ).logits[:, prompts.shape[1] :]
    return torch.nn.functional.cross_entropy(logits[masked], answers[masked])


def block_causal_loss(
    model, prompts: torch.Tensor, answers: torch.Tensor, masked: torch.Tensor, mask_id: int
) -> torch.Tensor:
    """The masked-token loss of a block-causal model, in the library's block diffusion layout
    (``DataCollatorForDiffusion``): ``[prompt | clean answer | prompt tail | noisy answer]``, where each noisy
    block sees the clean blocks before it and itself, as when the sampler decodes it (blocks aligned to position 0,
    so the prompt's tail shares the first block)."""
    batch, width = prompts.shape
    length = answers.shape[1]
    block_length = model.diffusion_config.block_size
    tail = width % block_length
    inputs = torch.cat(
        [prompts, answers, prompts[:, width - tail :], answers.masked_fill(masked, mask_id)], 1
    )
    clean, noisy = width + length, tail + length
    layout = {
        "valid": torch.ones(batch, clean + noisy, dtype=torch.bool),
        "position_ids": torch.cat([torch.arange(clean), torch.arange(width - tail, clean)]).expand(batch, -1),
        "noisy": torch.cat(
            [torch.zeros(clean, dtype=torch.bool), torch.ones(noisy, dtype=torch.bool)]
        ).expand(batch, -1),
    }
    dtype = next(model.parameters()).dtype
    logits = model(
        input_ids=inputs,
        attention_mask=diffusion_attention_mask(layout, block_length, True, dtype, for_decoder=True),
        position_ids=layout["position_ids"],
    ).logits[:, clean + tail :]
    return torch.nn.functional.cross_entropy(logits[masked], answers[masked])


def train(task, steps: int, batch_size: int, lr: float, seed: int):
    torch.manual_seed(seed)
    model = build_teacher(task, seed=seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))))
        ),
    )
    prompts, answers = encode(task, task.sample(steps * batch_size, seed=1000 + seed))
    mask_id = model.diffusion_config.mask_token_id
    start = time.perf_counter()
    for step in range(steps):
        rows = slice(step * batch_size, (step + 1) * batch_size)
        loss = mdlm_loss(model, prompts[rows], answers[rows], mask_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 250 == 0 or step == steps - 1:
            print(
                f"  step {step:5d} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)", flush=True
            )
    return model.eval(), time.perf_counter() - start


@torch.no_grad()
def accuracy(model, task, rows, tokens_per_step: int) -> float:
    tokenizer = task.tokenizer()
    prompts, _ = encode(task, rows)
    out = model.diffusion_generate(prompts, generation_config=task.generation_config(tokens_per_step))
    completions = tokenizer.batch_decode(out[:, prompts.shape[1] :], skip_special_tokens=True)
    return 100.0 * sum(task.is_valid(r["prompt"], c) for r, c in zip(rows, completions)) / len(rows)


@torch.no_grad()
def trajectories(model, task, rows):
    prompts, _ = encode(task, rows)
    config = task.generation_config(1, return_dict_in_generate=True)
    out = model.diffusion_generate(prompts, generation_config=config)
    width = prompts.shape[1]
    data = [
        {"prompt_ids": p.tolist(), "completion_ids": s[width:].tolist(), "decode_step": d.tolist()}
        for p, s, d in zip(prompts, out.sequences, out.decode_steps)
    ]
    metadata = TrajectoryMetadata(
        teacher=task.name,
        mask_token_id=model.diffusion_config.mask_token_id,
        attention=model.diffusion_config.attention,  # the block-causal tasks' trajectories are block-causal
        block_length=task.block_length,
        steps_per_block=task.block_length,
        max_new_tokens=task.answer_length,
    )
    return data, metadata


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", nargs="+", default=["sort2", "words", "add"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval_prompts", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="save each teacher (and tokenizer) under DIR/<task>")
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = {}
    for name in args.tasks:
        task = get_task(name)
        print(
            f"{name}: training the teacher ({args.steps} steps, batch {args.batch_size}, lr {args.lr})",
            flush=True,
        )
        model, seconds = train(task, args.steps, args.batch_size, args.lr, args.seed)
        if args.save:
            model.save_pretrained(f"{args.save}/{name}")
            task.tokenizer().save_pretrained(f"{args.save}/{name}")
        held_out = task.sample(args.eval_prompts, seed=10_000 + args.seed)
        budgets = [k for k in (1, 2, 4, 8) if k <= task.block_length]
        acc = {k: accuracy(model, task, held_out, k) for k in budgets}
        data, metadata = trajectories(model, task, held_out[:64])
        tc = total_correlation(
            model,
            data,
            metadata,
            TotalCorrelationConfig(num_samples=16, max_states=256, seed=args.seed),
            progress=False,
        )
        results[name] = {
            "train_seconds": round(seconds, 1),
            "accuracy": acc,
            "tc_by_jump": {e["jump"]: [round(e["tc"], 3), round(e["stderr"], 3)] for e in tc.by_jump},
        }
        print(f"{name}: accuracy at TokPS {budgets}: {[round(acc[k], 1) for k in budgets]}", flush=True)
        print(f"{name}: TC by jump: {results[name]['tc_by_jump']}", flush=True)
    print(json.dumps({"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "results": results}))


if __name__ == "__main__":
    main()
