"""Sampler benchmark: overhead, speed against a plain LLaDA-reference port, few-step speed-ups, KV caches, dynamic.

Runs on the CPU with randomly initialised Qwen3 models of about 27M parameters whose vocabulary projection
takes a share of the compute similar to a 1-2B LLM's (hidden 512, 6 layers, vocabulary 8192: the LM head is
~18% of the per-token FLOPs; Qwen3-1.7B: ~18%, LLaDA-8B: ~7%). Every comparison is measured side by side in
this one process, interleaved, and reported as a ratio. The approximate (Fast-dLLM) caches of bidirectional
models are also checked token for token against a port of Fast-dLLM's samplers, and their accuracy cost is
measured on a trained demo teacher. The last line printed is one JSON object.

Step 8 compares compiled (``compile="default"``) with eager decoding on the packaged tiny teachers and the 27M
models, in every cache mode at batch 1 and 16, with identical tokens required; ``--compile-only`` runs it alone.

    python benchmarks/bench_generation.py [--reps 3] [--threads 2] [--quick] [--compile-only]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
from smoke import parse_with_quick
from transformers import Qwen3Config, Qwen3ForCausalLM

from t3d_trl import DiffusionConfig, add_diffusion_generation

# The Fast-dLLM port lives with the tests that check the sampler against it (one copy).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fast_dllm_port import fast_dllm_generate  # noqa: E402

MASK_ID = 8191


def build_model(attention: str, quick: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=8192,
        hidden_size=64 if quick else 512,
        intermediate_size=128 if quick else 1536,
        num_hidden_layers=1 if quick else 6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=None,
    )
    model = Qwen3ForCausalLM(config).eval()
    block = 4 if attention == "block_causal" else None
    return add_diffusion_generation(model, DiffusionConfig(MASK_ID, attention=attention, block_size=block))


@torch.no_grad()
def llada_reference_generate(model, prompt, steps, gen_length, block_length, mask_id=MASK_ID):
    """A plain port of the LLaDA reference algorithm (DESIGN.md section 4), for comparison.

    Greedy. Full vocabulary logits for the whole canvas every step, a softmax over all of them, confidences
    of positions after the current block set to -inf, the top-k confident masked positions committed.
    """
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    attention = torch.zeros(x.shape[0], 1, x.shape[1], x.shape[1])  # bidirectional, no padding
    positions = torch.arange(x.shape[1]).unsqueeze(0).expand(x.shape[0], -1)
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for b in range(num_blocks):
        start = prompt.shape[1] + b * block_length
        end = start + block_length
        block_mask = x[:, start:end] == mask_id
        counts = block_mask.sum(1, keepdim=True)
        schedule = (
            counts // steps_per_block
            + (torch.arange(steps_per_block).unsqueeze(0) < (counts % steps_per_block)).long()
        )
        for i in range(steps_per_block):
            mask_index = x == mask_id
            logits = model(input_ids=x, attention_mask=attention, position_ids=positions).logits
            # A trained MDLM never predicts the mask token; a random one may, so both samplers exclude it.
            x0 = logits.index_fill(-1, torch.tensor([mask_id]), float("-inf")).argmax(-1)
            probs = torch.softmax(logits.float(), dim=-1)
            confidence = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            confidence[:, end:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, confidence, torch.tensor(-float("inf")))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for row in range(confidence.shape[0]):
                top = torch.topk(confidence[row], k=int(schedule[row, i])).indices
                transfer[row, top] = True
            x[transfer] = x0[transfer]
    return x


class ForwardTimer:
    """Accumulates wall time spent inside the model's forward passes (hooks on the top module)."""

    def __init__(self, model: torch.nn.Module):
        self.total = 0.0
        self._start = 0.0
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)

    def _pre(self, *_):
        self._start = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._start


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def best(times: list[float]) -> float:
    return min(times)  # least disturbed repetition on a shared machine


def cache_accuracy(args) -> dict[str, float | int | str]:
    """Accuracy (%) of exact, prefix-cache and dual-cache greedy decoding of a trained teacher on held-out prompts
    of its embedded task, at TokPS 1 and 2, in blocks of each of ``args.accuracy_blocks`` (several blocks per
    answer). Keys of the first block length carry no suffix; the others end in ``_block<N>``."""
    from t3d_trl import AutoModelForDiffusionLM
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS, QuickstartConfig, teacher_rows
    from t3d_trl.demo.tasks import get_task
    from t3d_trl.evaluation.completions import generate_completions

    task = get_task(args.task)
    teacher = args.teacher or str(PACKAGED_TEACHERS / task.name)
    model = AutoModelForDiffusionLM.from_pretrained(teacher).eval()
    tokenizer = task.tokenizer()
    # Held out: a seed the teacher's training rows (examples/train_demo_teacher.py --seed S) never used, and any
    # prompt that also occurs among those rows dropped. The default steps and batch size draw at least as many rows
    # as the documented teacher commands, so their rows cover the teacher's. Block lengths were chosen on seed
    # 30,000 (not reported).
    seen = {
        row["prompt"] for row in teacher_rows(task, QuickstartConfig(task=task.name, seed=args.teacher_seed))
    }
    rows = [
        row
        for row in task.sample(4 * args.accuracy_prompts, seed=args.accuracy_seed)
        if row["prompt"] not in seen
    ]
    rows = rows[: args.accuracy_prompts]
    if not rows:
        raise SystemExit(
            f"no held-out prompts: every {task.name} prompt occurs among the teacher's training rows"
        )
    messages = [row["prompt"] for row in rows]
    result: dict[str, float | int | str] = {
        "accuracy_teacher": f"{task.name} ({teacher})",
        "accuracy_prompts": len(rows),
        "accuracy_block": args.accuracy_blocks[0],
        "accuracy_seed": args.accuracy_seed,
        "accuracy_teacher_seed": args.teacher_seed,
    }
    for i, block in enumerate(args.accuracy_blocks):
        suffix = "" if i == 0 else f"_block{block}"
        for k in (1, 2):
            valid = {}
            for cache in ("none", "prefix", "dual"):
                config = task.generation_config(tokens_per_step=k, block_length=block, cache=cache)
                completions = generate_completions(
                    model, tokenizer, messages, config, use_chat_template=False, batch_size=64, progress=False
                ).completions
                valid[cache] = torch.tensor(
                    [float(task.is_valid(m, c)) for m, c in zip(messages, completions)]
                )
            result[f"exact_accuracy_tokps{k}{suffix}"] = round(100 * valid["none"].mean().item(), 2)
            for cache in ("prefix", "dual"):
                # Points lost, and the standard error of that paired difference over the prompts.
                lost = 100 * (valid["none"] - valid[cache])
                result[f"{cache}_cache_accuracy_tokps{k}{suffix}"] = round(
                    100 * valid[cache].mean().item(), 2
                )
                result[f"{cache}_cache_accuracy_delta_tokps{k}{suffix}"] = round(lost.mean().item(), 2)
                result[f"{cache}_cache_accuracy_delta_se_tokps{k}{suffix}"] = round(
                    (lost.std() / len(rows) ** 0.5).item(), 2
                )
    return result


def compile_models(quick: bool) -> dict[str, torch.nn.Module]:
    """The models of the compiled-vs-eager comparison: the packaged tiny teachers and the 27M bench models."""
    from t3d_trl import AutoModelForDiffusionLM
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS

    names = ["wordsort"] if quick else ["wordsort", "wordsort_bidirectional", "sort2"]
    models = {
        name: AutoModelForDiffusionLM.from_pretrained(PACKAGED_TEACHERS / name).eval() for name in names
    }
    if not quick:
        models["bench27m_block_causal"] = build_model("block_causal")
        models["bench27m_bidirectional"] = build_model("bidirectional")
    return models


COMPILE_GEN_LEN = 64  # new tokens of the 27M models in step 8 (decoded in --block blocks)
COMPILE_MODES = {
    "block_causal": {"exact": dict(use_cache=True), "dynamic": dict(use_cache=True, threshold=0.9)},
    "bidirectional": {
        "exact": dict(cache="none"),
        "prefix": dict(cache="prefix"),
        "dual": dict(cache="dual"),
        "dynamic": dict(cache="none", threshold=0.9),
    },
}


@torch.no_grad()
def compile_comparison(args) -> tuple[dict, list[tuple[str, str, str]]]:
    """8. Compiled (``compile="default"``) against eager decoding: tokens/s at batch 1 and 16 in every cache
    mode, side by side and interleaved, with identical tokens required and the compile time reported."""
    from t3d_trl.generation.compiled import step_for

    rows, table, identical, result = [], [], True, {}
    batches = [1] if args.quick else [1, 16]
    for name, model in compile_models(args.quick).items():
        diffusion = model.diffusion_config
        tiny = name.startswith(("wordsort", "sort2"))
        prompt_len, gen_len = (12, 8 if args.quick else 32) if tiny else (64, COMPILE_GEN_LEN)
        block = 4 if diffusion.is_block_causal or tiny else args.block
        modes = COMPILE_MODES["block_causal" if diffusion.is_block_causal else "bidirectional"]
        if args.quick:
            modes = {"exact": modes["exact"]}
        vocab = model.config.vocab_size
        for batch in batches:
            # Random prompt tokens above the specials (mask and EOS excluded).
            prompt = torch.randint(
                5, vocab - 1, (batch, prompt_len), generator=torch.Generator().manual_seed(3)
            )
            prompt[prompt == diffusion.mask_token_id] = 5
            for mode, extra in modes.items():
                settings = dict(
                    max_new_tokens=gen_len, block_length=block, tokens_per_step=1, stop_at_eos=False, **extra
                )
                step = step_for(model, "default")
                before = step.compile_seconds
                compiled_out = model.diffusion_generate(prompt, compile="default", **settings)  # compiles
                compile_s = step.compile_seconds - before
                eager_t, compiled_t, same = [], [], True
                for _ in range(args.reps):
                    t, eager_out = timed(partial(model.diffusion_generate, prompt, **settings))
                    eager_t.append(t)
                    t, compiled_out = timed(
                        partial(model.diffusion_generate, prompt, compile="default", **settings)
                    )
                    compiled_t.append(t)
                    same &= torch.equal(eager_out, compiled_out)
                identical &= same
                row = {
                    "model": name,
                    "batch": batch,
                    "mode": mode,
                    "eager_tokens_per_s": round(batch * gen_len / best(eager_t), 1),
                    "compiled_tokens_per_s": round(batch * gen_len / best(compiled_t), 1),
                    "speedup": round(best(eager_t) / best(compiled_t), 2),
                    "compile_s": round(compile_s, 1),
                    "identical_tokens": bool(same),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    tiny = next(r for r in rows if r["model"] == "wordsort" and r["batch"] == 1 and r["mode"] == "exact")
    result["compiled_speedup_batch1_tiny"] = tiny["speedup"]
    result["compiled_identical_tokens"] = bool(identical)
    result["compile_rows"] = rows
    for r in rows:
        table.append(
            (
                f"compiled/eager {r['model']} b{r['batch']} {r['mode']}",
                f"{r['speedup']:.2f}",
                ">= 1.8" if r is tiny else "",
            )
        )
    table.append(("  compiled tokens identical to eager", str(identical), "True"))
    return result, table


def accuracy_rows(accuracy: dict) -> list[tuple[str, str, str]]:
    """Table rows (measure, value, target) of the points each approximate cache lost."""
    return [
        (
            f"{cache} cache accuracy loss, TokPS {k} (points)",
            f"{accuracy[f'{cache}_cache_accuracy_delta_tokps{k}']:.2f} "
            f"+- {accuracy[f'{cache}_cache_accuracy_delta_se_tokps{k}']:.2f}",
            "<= 1" if cache == "dual" else "",
        )
        for cache in ("prefix", "dual")
        for k in (1, 2)
    ]


def print_table(rows: list[tuple[str, str, str]]) -> None:
    print()
    print(f"{'measure':<48}{'value':>14}{'target':>10}")
    for name, value, target in rows:
        print(f"{name:<48}{value:>14}{target:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument(
        "--block",
        type=int,
        default=32,
        help="decoding block of the 27M bidirectional model: a multiple of 4 (decoded at TokPS 1, 2 and 4) that "
        "divides --gen-len and --approx-gen-len",
    )
    parser.add_argument("--cache-gen-len", type=int, default=512)
    parser.add_argument(
        "--approx-prompt-len", type=int, default=256, help="approximate caches: prompt length"
    )
    parser.add_argument("--approx-gen-len", type=int, default=256, help="approximate caches: new tokens")
    parser.add_argument(
        "--teacher",
        default=None,
        help="accuracy: trained bidirectional teacher (default: the task's packaged one)",
    )
    parser.add_argument(
        "--teacher-seed",
        type=int,
        default=0,
        help="accuracy: the --seed --teacher was trained with (its training prompts are left out; packaged: 0)",
    )
    parser.add_argument(
        "--task", default="wordsort_bidirectional", help="accuracy: the embedded task of --teacher"
    )
    parser.add_argument(
        "--accuracy-blocks",
        type=int,
        nargs="+",
        default=[4, 8],
        help="accuracy: decoding block lengths (the first one is the target's)",
    )
    parser.add_argument("--accuracy-prompts", type=int, default=1000, help="accuracy: held-out prompts")
    parser.add_argument(
        "--accuracy-seed",
        type=int,
        default=20_000,
        help="accuracy: seed of the held-out prompts (30,000 was the tuning set)",
    )
    parser.add_argument(
        "--accuracy-only", action="store_true", help="only the accuracy cost of the caches (step 7)"
    )
    parser.add_argument(
        "--compile-only", action="store_true", help="only compiled against eager decoding (step 8)"
    )
    tiny = {"reps": 1, "prompt_len": 16, "gen_len": 32, "cache_gen_len": 16}
    tiny |= {"approx_prompt_len": 32, "approx_gen_len": 64, "accuracy_prompts": 32}
    args = parse_with_quick(
        parser,
        tiny,
        help="tiny models, and tiny defaults that flags given with it override (seconds); step 8 (compiling) "
        "runs only with --compile-only",
    )
    if min(args.reps, args.threads, args.prompt_len, args.accuracy_prompts) < 1:
        parser.error("--reps, --threads, --prompt-len and --accuracy-prompts must be >= 1")
    # Step 8 (compiled) decodes COMPILE_GEN_LEN tokens of the 27M models; the other steps the two lengths.
    lengths = (
        {} if args.compile_only else {"--gen-len": args.gen_len, "--approx-gen-len": args.approx_gen_len}
    )
    if args.compile_only or not (args.quick or args.accuracy_only):  # step 8 runs: the 27M models' tokens
        lengths["the new tokens of the compiled step"] = COMPILE_GEN_LEN
    if args.block < 4 or args.block % 4 or any(n % args.block for n in lengths.values()):
        named = " and ".join(f"{flag} ({n})" for flag, n in lengths.items())
        parser.error(f"--block {args.block} must be a multiple of 4 that divides {named}")
    if args.cache_gen_len < 4 or args.cache_gen_len % 4:
        parser.error(
            f"--cache-gen-len must be a positive multiple of 4 (blocks of 4), got {args.cache_gen_len}"
        )
    torch.set_num_threads(args.threads)
    if args.accuracy_only:
        accuracy = cache_accuracy(args)
        print_table(accuracy_rows(accuracy))
        print(json.dumps(accuracy))
        return
    if args.compile_only:
        compiled, table = compile_comparison(args)
        print_table(table)
        print(json.dumps(compiled))
        return

    model = build_model("bidirectional", args.quick)
    params = sum(p.numel() for p in model.parameters())
    prompt = torch.randint(0, 8000, (1, args.prompt_len), generator=torch.Generator().manual_seed(1))
    base = dict(max_new_tokens=args.gen_len, block_length=args.block, stop_at_eos=False)
    print(
        f"model: Qwen3 {params / 1e6:.1f}M params, vocab 8192; prompt {args.prompt_len}, generate {args.gen_len}"
    )

    # Warm-up (one block, at a TokPS every valid --block takes).
    model.diffusion_generate(prompt, max_new_tokens=args.block, block_length=args.block, tokens_per_step=4)

    # 1. Ours vs the LLaDA reference port, interleaved; identical tokens required.
    ours_t, ref_t = [], []
    identical = True
    for _ in range(args.reps):
        t, ours = timed(lambda: model.diffusion_generate(prompt, tokens_per_step=1, **base))
        ours_t.append(t)
        t, ref = timed(
            lambda: llada_reference_generate(model, prompt, args.gen_len, args.gen_len, args.block)
        )
        ref_t.append(t)
        identical &= torch.equal(ours, ref)

    # 2. Sampler overhead: time outside the forward passes.
    timer = ForwardTimer(model)
    overheads = []
    for _ in range(args.reps):
        timer.total = 0.0
        wall, _ = timed(lambda: model.diffusion_generate(prompt, tokens_per_step=1, **base))
        overheads.append((wall - timer.total) / wall)

    # 3. Static few-step speed-up, interleaved.
    tokps_t = {1: [], 2: [], 4: []}
    for _ in range(args.reps):
        for k in tokps_t:
            tokps_t[k].append(
                timed(lambda k=k: model.diffusion_generate(prompt, tokens_per_step=k, **base))[0]
            )

    # 4. Dynamic decoding next to static TokPS 1.
    static_out = model.diffusion_generate(prompt, tokens_per_step=1, return_dict_in_generate=True, **base)
    dyn_wall, dynamic_out = timed(
        lambda: model.diffusion_generate(prompt, threshold=0.9, return_dict_in_generate=True, **base)
    )

    # 5. Block KV cache on a block-causal model: 512 tokens, block 4, one token per step.
    causal = build_model("block_causal", args.quick)
    cache_args = dict(max_new_tokens=args.cache_gen_len, block_length=4, tokens_per_step=1, stop_at_eos=False)
    causal.diffusion_generate(prompt, **{**cache_args, "max_new_tokens": 8})
    cached_t, nocache_t = [], []
    same_cache_tokens = True
    for _ in range(max(1, args.reps - 1)):
        t, with_cache = timed(lambda: causal.diffusion_generate(prompt, use_cache=True, **cache_args))
        cached_t.append(t)
        t, without = timed(lambda: causal.diffusion_generate(prompt, use_cache=False, **cache_args))
        nocache_t.append(t)
        same_cache_tokens &= torch.equal(with_cache, without)

    # 6. Approximate caches of a bidirectional model (Fast-dLLM): TokPS 1, blocks of 32, interleaved.
    approx_prompt = torch.randint(
        0, 8000, (1, args.approx_prompt_len), generator=torch.Generator().manual_seed(2)
    )
    approx_args = dict(max_new_tokens=args.approx_gen_len, block_length=args.block, stop_at_eos=False)
    approx_t = {"none": [], "prefix": [], "dual": []}
    approx_out = {}
    for _ in range(args.reps):
        for cache in approx_t:
            t, approx_out[cache] = timed(
                lambda cache=cache: model.diffusion_generate(
                    approx_prompt, tokens_per_step=1, cache=cache, **approx_args
                )
            )
            approx_t[cache].append(t)
    steps = args.approx_gen_len
    port_identical = {}
    for cache in ("prefix", "dual"):
        port, _ = fast_dllm_generate(
            model, approx_prompt, steps, args.approx_gen_len, args.block, cache, mask_id=MASK_ID
        )
        port_identical[cache] = torch.equal(port, approx_out[cache])
    agree = {
        cache: float((approx_out[cache] == approx_out["none"])[:, args.approx_prompt_len :].float().mean())
        for cache in ("prefix", "dual")
    }

    # 7. Accuracy cost of the dual cache on a trained multi-block bidirectional teacher.
    accuracy = cache_accuracy(args)

    # 8. Compiled against eager decoding (compiling takes tens of seconds: not in a --quick run).
    compiled, compile_table = ({}, []) if args.quick else compile_comparison(args)

    tokps1 = best(tokps_t[1])
    result = {
        "model_params": params,
        "sampler_overhead": round(min(overheads), 5),
        "ours_over_reference_wall": round(best(ours_t) / best(ref_t), 4),
        "identical_tokens_vs_reference": bool(identical),
        "tokps_speedup_2": round(tokps1 / best(tokps_t[2]), 3),
        "tokps_speedup_4": round(tokps1 / best(tokps_t[4]), 3),
        "kv_cache_speedup": round(best(nocache_t) / best(cached_t), 2),
        "kv_cache_identical_tokens": bool(same_cache_tokens),
        "static_nfe": int(static_out.nfe[0]),
        "dynamic_nfe": int(dynamic_out.nfe[0]),
        "static_tokens_per_s": round(args.gen_len / tokps1, 1),
        "dynamic_tokens_per_s": round(args.gen_len / dyn_wall, 1),
        "prefix_cache_speedup": round(best(approx_t["none"]) / best(approx_t["prefix"]), 2),
        "dual_cache_speedup": round(best(approx_t["none"]) / best(approx_t["dual"]), 2),
        # Each repetition's own ratio (its runs are back to back): the spread of the figure on this machine.
        **{
            f"{cache}_cache_speedup_per_rep": [
                round(n / c, 2) for n, c in zip(approx_t["none"], approx_t[cache], strict=True)
            ]
            for cache in ("prefix", "dual")
        },
        "prefix_cache_identical_to_port": port_identical["prefix"],
        "dual_cache_identical_to_port": port_identical["dual"],
        "prefix_cache_agreement_random_model": round(agree["prefix"], 4),
        "dual_cache_agreement_random_model": round(agree["dual"], 4),
        **accuracy,
        **compiled,
    }
    rows = [
        ("sampler overhead (share of wall)", f"{result['sampler_overhead']:.2%}", "<= 2%"),
        ("wall(ours) / wall(LLaDA reference port)", f"{result['ours_over_reference_wall']:.3f}", "<= 0.85"),
        ("  identical tokens", str(identical), "True"),
        ("wall(TokPS 1) / wall(TokPS 2)", f"{result['tokps_speedup_2']:.2f}", ">= 1.90"),
        ("wall(TokPS 1) / wall(TokPS 4)", f"{result['tokps_speedup_4']:.2f}", ">= 3.80"),
        (
            f"wall(no cache) / wall(cache), {args.cache_gen_len} tok, block 4",
            f"{result['kv_cache_speedup']:.1f}",
            ">= 5",
        ),
        ("  identical tokens", str(same_cache_tokens), "True"),
        (
            f"wall(no cache) / wall(prefix), {args.approx_prompt_len}+{args.approx_gen_len}",
            f"{result['prefix_cache_speedup']:.2f}",
            ">= 2.5",
        ),
        (
            f"wall(no cache) / wall(dual), {args.approx_prompt_len}+{args.approx_gen_len}",
            f"{result['dual_cache_speedup']:.2f}",
            ">= 5",
        ),
        (
            "  prefix / dual identical to Fast-dLLM port",
            f"{port_identical['prefix']} / {port_identical['dual']}",
            "True",
        ),
        *accuracy_rows(accuracy),
        *compile_table,
        (
            "static TokPS 1: NFE / tokens per s",
            f"{result['static_nfe']} / {result['static_tokens_per_s']}",
            "",
        ),
        (
            "dynamic threshold 0.9: NFE / tokens per s",
            f"{result['dynamic_nfe']} / {result['dynamic_tokens_per_s']}",
            "",
        ),
    ]
    print_table(rows)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
