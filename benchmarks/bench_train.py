"""Cost of a T3D optimizer step against trajectory distillation (TD), and of LoRA against full fine-tuning.

T3D (DDO + path consistency) needs one student forward/backward plus one reference forward per step: real, fake
and path terms read the same logits. TD needs the student forward/backward alone, so the ideal ratio is about
4/3; the public reference code runs two student and two reference forwards (about 2x).

Every configuration runs in a fresh child process (same model, data and seed): a small bidirectional Qwen3
(hidden 384, 4 layers, vocabulary 8192, 13.2M parameters) on synthetic trajectories (prompts of 32 tokens,
completions of 64 tokens in blocks of 4, one token per teacher step), batch 4, AdamW, fp32, one CPU thread. LoRA:
rank 16 on every attention and MLP projection.

* Step time: median wall time of steps 3..N of ``Trainer.train`` (callback timestamps), per child; the children
  alternate t3d, td, t3d, td, ... and the median over repeats is kept.
* Peak memory: the child's resident set size, sampled every 2 ms from just before the trainer is built (model and
  data already loaded) to the end of training; the figure is the peak minus that baseline, so it holds the
  reference copy, gradients, optimizer state, activations and allocator slack of training, not the libraries.

Usage::

    python benchmarks/bench_train.py [--steps 12] [--repeats 3]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROMPT, COMPLETION, BATCH = 32, 64, 4
CONFIGS = {
    "t3d": {"loss_type": "t3d", "lora": False},
    "td": {"loss_type": "td", "lora": False},
    "t3d_lora": {"loss_type": "t3d", "lora": True},
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRSS(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = _rss_bytes()
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.002)


def worker(name: str, steps: int) -> dict:
    import datasets
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, TrainerCallback

    from t3d_trl import DiffusionConfig, T3DConfig, T3DTrainer, add_diffusion_generation

    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab, mask_id, block = 8192, 3, 4
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=384,
        intermediate_size=1152,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=2,
    )
    model = Qwen3ForCausalLM(config)
    model.config.is_causal = False
    add_diffusion_generation(model, DiffusionConfig(mask_token_id=mask_id))
    rng = np.random.default_rng(0)
    rows = []
    for i in range(64):
        order = np.concatenate([b * block + 1 + rng.permutation(block) for b in range(COMPLETION // block)])
        rows.append(
            {
                "prompt_ids": rng.integers(10, vocab, PROMPT).tolist(),
                "completion_ids": rng.integers(10, vocab, COMPLETION).tolist(),
                "decode_step": order.tolist(),
                "id": str(i),
            }
        )
    dataset = datasets.Dataset.from_list(rows)

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    spec = CONFIGS[name]
    peft_config = None
    if spec["lora"]:
        from peft import LoraConfig

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules=targets)
    sampler = _PeakRSS()
    baseline = sampler.peak
    sampler.start()
    with tempfile.TemporaryDirectory() as out:
        args = T3DConfig(
            output_dir=out,
            loss_type=spec["loss_type"],
            max_steps=steps,
            per_device_train_batch_size=BATCH,
            learning_rate=1e-4,
            block_length=block,
            activation_checkpointing=False,
            save_strategy="no",
            report_to="none",
            logging_steps=steps,
            disable_tqdm=True,
            use_cpu=True,
            dataloader_pin_memory=False,
        )
        trainer = T3DTrainer(model, args, train_dataset=dataset, callbacks=[Clock()], peft_config=peft_config)
        trainer.train()
    sampler.running = False
    sampler.join()
    return {
        "name": name,
        "step_s": statistics.median(times[2:]),
        "peak_mib": (sampler.peak - baseline) / 2**20,
        "steps": len(times),
    }


def ratio(a: float, b: float) -> float | None:
    # In-process (--quick) a later worker may add no memory at all: no ratio then.
    return round(a / b, 3) if b else None


def run_child(name: str, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, __file__, "--worker", name, "--steps", str(steps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=12, help="optimizer steps per child (the first 2 are warm-up)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="t3d/td children, alternated")
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a seconds-long smoke run of the whole script (the test suite runs it so); its figures mean nothing",
    )
    options = parser.parse_args()
    if options.quick:
        options.steps, options.repeats = 3, 1
    if options.worker:
        print(json.dumps(worker(options.worker, options.steps)))
        return

    # --quick runs the workers in this process: no child start-up, and peak memory that means nothing.
    run = worker if options.quick else run_child
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _ in range(options.repeats):
        for name in ("t3d", "td"):
            results[name].append(run(name, options.steps))
    results["t3d_lora"].append(run("t3d_lora", options.steps))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    step = {name: median(name, "step_s") for name in CONFIGS}
    peak = {name: median(name, "peak_mib") for name in CONFIGS}
    print(f"{'config':<10} {'step (s)':>10} {'peak RSS growth (MiB)':>22}")
    for name in CONFIGS:
        print(f"{name:<10} {step[name]:>10.3f} {peak[name]:>22.1f}")
    summary = {
        "t3d_over_td_step_time": ratio(step["t3d"], step["td"]),
        "t3d_over_td_peak_memory": ratio(peak["t3d"], peak["td"]),
        "lora_over_full_peak_memory": ratio(peak["t3d_lora"], peak["t3d"]),
        "step_s": {k: round(v, 4) for k, v in step.items()},
        "peak_mib": {k: round(v, 1) for k, v in peak.items()},
        "runs": {k: [round(r["step_s"], 4) for r in v] for k, v in results.items()},
        "steps": options.steps,
        "repeats": options.repeats,
    }
    print(
        f"t3d / td step time: {summary['t3d_over_td_step_time']}x (target <= 1.4; reference code design ~2)"
    )
    print(
        f"t3d / td peak memory: {summary['t3d_over_td_peak_memory']}x; LoRA / full t3d: {summary['lora_over_full_peak_memory']}x"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
