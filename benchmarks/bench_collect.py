"""Trajectory collection throughput: batch size 1 against 16, and the cost of collection over bare decoding.

Runs on the CPU with a tiny randomly initialised bidirectional Qwen3 (hidden 64, 2 layers, ~0.1M parameters,
so per-call overhead matters as it does for a real model on a GPU) and a character-level tokenizer built
in-process, decoding 32 prompts of 20-60 tokens with the paper's teacher setting (blocks of 4 tokens, 4 steps per block, greedy low-confidence remasking), 32 new tokens each.
Measured side by side in one process, repetitions interleaved, best repetition kept:

* ``collect_trajectories`` at batch size 1 and 16 (end to end: prompts, decoding, shards, merge, save);
* the bare ``diffusion_generate`` calls of the batch-16 plan, to show what collection adds on top.

The last line printed is one JSON object.

    python benchmarks/bench_collect.py [--reps 3] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import string
import tempfile
import time

import datasets
import torch
from smoke import parse_with_quick
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from t3d_trl import DiffusionConfig, DiffusionGenerationConfig, add_diffusion_generation, collect_trajectories
from t3d_trl.data.trajectories import build_prompts, plan_batches
from t3d_trl.generation.sampler import left_pad


def build_tokenizer() -> PreTrainedTokenizerFast:
    specials = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + chars)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]", mask_token="[MASK]", unk_token="[UNK]"
    )


def build_model(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen3ForCausalLM(config).eval()
    model.config.is_causal = False
    return add_diffusion_generation(model, DiffusionConfig(mask_token_id=tokenizer.mask_token_id))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32, help="a multiple of 4 (blocks of 4)")
    args = parse_with_quick(parser, {"reps": 1, "prompts": 4, "new_tokens": 8})
    if min(args.reps, args.prompts, args.threads) < 1:
        parser.error("--reps, --prompts and --threads must be >= 1")
    if args.new_tokens < 4 or args.new_tokens % 4:
        parser.error(f"--new-tokens must be a positive multiple of 4 (blocks of 4), got {args.new_tokens}")
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    datasets.disable_progress_bars()
    rows = datasets.Dataset.from_list(
        [{"problem": f"Problem {i}: " + "17 * 23 + 5, " * (1 + i % 5)} for i in range(args.prompts)]
    )
    config = DiffusionGenerationConfig(
        max_new_tokens=args.new_tokens, block_length=4, tokens_per_step=1, eos_token_id=tokenizer.eos_token_id
    )

    def collect(batch_size: int) -> tuple[float, int]:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            dataset = collect_trajectories(
                model,
                tokenizer,
                rows,
                "plain",
                output_dir=tmp,
                generation_config=config,
                batch_size=batch_size,
            )
            seconds = time.perf_counter() - start
            return seconds, sum(len(ids) for ids in dataset["completion_ids"])

    def bare() -> float:
        start = time.perf_counter()
        for batch in batches:
            input_ids, attention_mask = left_pad([p.prompt_ids for p in batch], tokenizer.pad_token_id)
            model.diffusion_generate(input_ids, attention_mask, config, return_dict_in_generate=True)
        return time.perf_counter() - start

    batches = plan_batches(build_prompts(rows, tokenizer, "plain", use_chat_template=False), 16)
    times: dict[str, list[float]] = {"batch1": [], "batch16": [], "bare16": []}
    tokens = {}
    collect(16)  # warm-up
    for rep in range(args.reps):
        for name, batch_size in (("batch1", 1), ("batch16", 16)):
            seconds, tokens[name] = collect(batch_size)
            times[name].append(seconds)
        times["bare16"].append(bare())
        print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    best = {k: min(v) for k, v in times.items()}
    result = {
        "tokens_per_s_batch1": round(tokens["batch1"] / best["batch1"], 1),
        "tokens_per_s_batch16": round(tokens["batch16"] / best["batch16"], 1),
        "speedup_batch16_over_batch1": round(best["batch1"] / best["batch16"], 2),
        "bare_generate_tokens_per_s_batch16": round(tokens["batch16"] / best["bare16"], 1),
        "collect_over_bare_time_batch16": round(best["batch16"] / best["bare16"], 3),
        "completion_tokens": tokens["batch16"],
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "threads": args.threads,
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }
    print(
        f"collection at batch 16 is {result['speedup_batch16_over_batch1']}x batch 1 "
        f"({result['tokens_per_s_batch16']} vs {result['tokens_per_s_batch1']} tokens/s); collection takes "
        f"{result['collect_over_bare_time_batch16']}x the time of the bare diffusion_generate calls"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
