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

* ``--model demo``: the method study's setting instead: the packaged ``wordsort`` teacher (block-causal, hidden
  64, 0.24M parameters, vocabulary 42), prompts of 8 and completions of 32 tokens, batch 32.
* ``--compile``: also T3D with ``torch_compile=True`` (transformers' flag: the student and its reference are
  compiled by Inductor), alternated with the eager T3D children; the compile happens in the first steps, outside
  the median. Its mean training loss must match the eager run's (same data and seed; compiled kernels may round
  differently).

Usage::

    python benchmarks/bench_train.py [--steps 12] [--repeats 3] [--compile] [--model demo]

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

from smoke import parse_with_quick

# (prompt tokens, completion tokens, batch) per --model
SHAPES = {"qwen3-13m": (32, 64, 4), "demo": (8, 32, 32)}
CONFIGS = {
    "t3d": {"loss_type": "t3d", "lora": False},
    "td": {"loss_type": "td", "lora": False},
    "t3d_lora": {"loss_type": "t3d", "lora": True},
    "t3d_compiled": {"loss_type": "t3d", "lora": False, "compile": True},
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


def build_model(kind: str):
    """The model of ``--model``: a fresh 13.2M-parameter bidirectional Qwen3, or the packaged demo teacher."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from t3d_trl import AutoModelForDiffusionLM, DiffusionConfig, add_diffusion_generation
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS

    if kind == "demo":
        return AutoModelForDiffusionLM.from_pretrained(str(PACKAGED_TEACHERS / "wordsort"))
    config = Qwen3Config(
        vocab_size=8192,
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
    add_diffusion_generation(model, DiffusionConfig(mask_token_id=3))
    return model


def worker(name: str, steps: int, kind: str) -> dict:
    import datasets
    import numpy as np
    import torch
    from transformers import TrainerCallback

    from t3d_trl import T3DConfig, T3DTrainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(kind)
    vocab, block = model.config.vocab_size, 4
    prompt, completion, batch = SHAPES[kind]
    rng = np.random.default_rng(0)
    rows = []
    for i in range(64):
        order = np.concatenate([b * block + 1 + rng.permutation(block) for b in range(completion // block)])
        rows.append(
            {
                "prompt_ids": rng.integers(10, vocab, prompt).tolist(),
                "completion_ids": rng.integers(10, vocab, completion).tolist(),
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
            per_device_train_batch_size=batch,
            learning_rate=1e-4,
            block_length=block,
            activation_checkpointing=False,
            save_strategy="no",
            report_to="none",
            logging_steps=steps,
            disable_tqdm=True,
            use_cpu=True,
            dataloader_pin_memory=False,
            torch_compile=spec.get("compile", False),
        )
        trainer = T3DTrainer(model, args, train_dataset=dataset, callbacks=[Clock()], peft_config=peft_config)
        loss = trainer.train().training_loss
    sampler.running = False
    sampler.join()
    return {
        "name": name,
        "step_s": statistics.median(times[2:]),
        "peak_mib": (sampler.peak - baseline) / 2**20,
        "steps": len(times),
        "loss": loss,
    }


def ratio(a: float, b: float) -> float | None:
    # In-process (--quick) a later worker may add no memory at all: no ratio then.
    return round(a / b, 3) if b else None


def run_child(name: str, steps: int, kind: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, __file__, "--worker", name, "--steps", str(steps), "--model", kind]
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
    parser.add_argument("--compile", action="store_true", help="also T3D with torch_compile=True")
    parser.add_argument(
        "--model",
        choices=sorted(SHAPES),
        default="qwen3-13m",
        help="demo: the method study's model and shapes",
    )
    parser.add_argument("--worker", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    options = parse_with_quick(parser, {"steps": 3, "repeats": 1})
    if options.steps < 3 or options.repeats < 1:
        parser.error("--steps must be >= 3 (the first 2 are warm-up) and --repeats >= 1")
    if options.worker:
        print(json.dumps(worker(options.worker, options.steps, options.model)))
        return

    # --quick runs the workers in this process: no child start-up, and peak memory that means nothing.
    run = worker if options.quick else run_child
    alternated = ["t3d", "td", *(["t3d_compiled"] if options.compile else [])]
    names = [*alternated, "t3d_lora"]
    results: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(options.repeats):
        for name in alternated:
            results[name].append(run(name, options.steps, options.model))
    results["t3d_lora"].append(run("t3d_lora", options.steps, options.model))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    step = {name: median(name, "step_s") for name in names}
    peak = {name: median(name, "peak_mib") for name in names}
    print(f"{'config':<12} {'step (s)':>10} {'peak RSS growth (MiB)':>22}")
    for name in names:
        print(f"{name:<12} {step[name]:>10.3f} {peak[name]:>22.1f}")
    summary = {
        "t3d_over_td_step_time": ratio(step["t3d"], step["td"]),
        "t3d_over_td_peak_memory": ratio(peak["t3d"], peak["td"]),
        "lora_over_full_peak_memory": ratio(peak["t3d_lora"], peak["t3d"]),
        "step_s": {k: round(v, 4) for k, v in step.items()},
        "peak_mib": {k: round(v, 1) for k, v in peak.items()},
        "runs": {k: [round(r["step_s"], 4) for r in v] for k, v in results.items()},
        "steps": options.steps,
        "repeats": options.repeats,
        "model": options.model,
    }
    if options.compile:
        eager_loss = results["t3d"][0]["loss"]
        summary["compiled_over_eager_step_time"] = ratio(step["t3d_compiled"], step["t3d"])
        summary["compiled_loss_rel_diff"] = abs(results["t3d_compiled"][0]["loss"] - eager_loss) / eager_loss
        print(f"compiled / eager t3d step time: {summary['compiled_over_eager_step_time']}x")
    print(
        f"t3d / td step time: {summary['t3d_over_td_step_time']}x (target <= 1.4; reference code design ~2)"
    )
    print(
        f"t3d / td peak memory: {summary['t3d_over_td_peak_memory']}x; LoRA / full t3d: {summary['lora_over_full_peak_memory']}x"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
