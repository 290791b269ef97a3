"""The conditional total correlation (factorization error) analyser and ``t3d-trl analyze``."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model

from t3d_trl import TotalCorrelationConfig, TotalCorrelationResult, TrajectoryMetadata, total_correlation
from t3d_trl.analysis.total_correlation import _complete_blocks, _prepare, _states
from t3d_trl.demo import build_teacher, get_task

SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)


def tiny_task_model(task_name: str = "add", seed: int = 0, initializer_range: float = 0.02):
    """A small random demo-task model; a large ``initializer_range`` makes its predictions strongly coupled."""
    return build_teacher(get_task(task_name), seed=seed, initializer_range=initializer_range, **SMALL).eval()


def never_predict_specials(model, special_ids=range(5)):
    """Make greedy decoding of a random model never pick a special token (no early EOS, no committed mask).

    Each special token's output row becomes the mean of two ordinary rows, so its logit is the mean of theirs
    and never strictly the largest.
    """
    weight = model.get_output_embeddings().weight
    with torch.no_grad():
        for k, special in enumerate(special_ids):
            weight[special] = (weight[10 + k] + weight[11 + k]) / 2
    return model


def metadata(block_length=4, max_new_tokens=4, attention="bidirectional", mask_token_id=3):
    return TrajectoryMetadata(
        teacher="test",
        mask_token_id=mask_token_id,
        attention=attention,
        block_length=block_length,
        steps_per_block=block_length,
        max_new_tokens=max_new_tokens,
    )


ROW = {"prompt_ids": [15, 9, 12, 16, 13], "completion_ids": [7, 9, 6, 5], "decode_step": [3, 1, 4, 2]}


@torch.no_grad()
def exact_total_correlation(model, row, t: int, jump: int, mask_id: int = 3) -> float:
    """KL(joint || product of marginals) of the jump ``t -> t - jump`` of a one-block row, by enumeration.

    Written independently of the analyser: plain bidirectional forwards (no padding) of explicit canvases. By
    the chain rule the KL is the sum over chain positions k of E_{x_<k ~ joint} KL(p(x_k | x_t, x_<k) || p(x_k | x_t)),
    enumerated over every prefix x_<k.
    """
    prompt, completion, steps = row["prompt_ids"], row["completion_ids"], row["decode_step"]
    order = sorted(range(len(completion)), key=lambda g: steps[g])
    clean, chain = order[: len(order) - t], order[len(order) - t :][:jump]
    base = prompt + [completion[g] if g in clean else mask_id for g in range(len(completion))]
    columns = [len(prompt) + g for g in chain]

    def log_probs(canvases: torch.Tensor, column: int) -> torch.Tensor:
        n, length = canvases.shape
        logits = (
            model(
                input_ids=canvases,
                attention_mask=torch.zeros(n, 1, length, length),
                position_ids=torch.arange(length).expand(n, -1),
            )
            .logits[:, column]
            .float()
        )
        logits[:, mask_id] = float("-inf")
        return logits.log_softmax(-1)

    canvases = torch.tensor([base])
    prefix_logp = torch.zeros(1)
    vocab = model.config.vocab_size
    total = 0.0
    for k, column in enumerate(columns):
        conditional = log_probs(canvases, column)  # [prefixes, V]
        marginal = log_probs(torch.tensor([base]), column)[0]
        kl = torch.where(conditional.isinf(), 0.0, conditional.exp() * (conditional - marginal)).sum(-1)
        total += float((prefix_logp.exp() * kl).sum())
        if k + 1 < len(columns):  # extend every prefix by every token of this position
            canvases = canvases.repeat_interleave(vocab, 0)
            canvases[:, column] = torch.arange(vocab).repeat(len(prefix_logp))
            prefix_logp = (prefix_logp.unsqueeze(1) + conditional).reshape(-1)
            keep = prefix_logp > float("-inf")  # drop prefixes holding the mask token
            canvases, prefix_logp = canvases[keep], prefix_logp[keep]
    return total


@pytest.fixture(scope="module")
def coupled_model():
    return tiny_task_model(initializer_range=0.3)


@pytest.fixture(scope="module")
def coupled_result(coupled_model):
    config = TotalCorrelationConfig(num_samples=3000, max_states=None, batch_size=16384, seed=0)
    return total_correlation(coupled_model, [ROW], metadata(), config, progress=False)


@pytest.mark.parametrize(("t", "jump"), [(2, 2), (4, 2), (3, 3)])
def test_estimate_agrees_with_exact_enumeration(coupled_model, coupled_result, t, jump):
    exact = exact_total_correlation(coupled_model, ROW, t, jump)
    cell = next(c for c in coupled_result.grid if (c["t"], c["s"]) == (t, t - jump))
    assert cell["states"] == 1 and cell["stderr"] > 0
    assert exact > 10 * cell["stderr"]  # the check below can tell a wrong joint from the right one
    assert abs(cell["tc"] - exact) < 4 * cell["stderr"], (cell, exact)


def test_single_token_jump_is_exactly_zero_and_tc_grows_with_the_jump(coupled_result):
    grid = {(c["t"], c["s"]): c for c in coupled_result.grid}
    assert sorted(grid) == [(t, s) for t in range(1, 5) for s in range(t)]
    assert all(grid[(t, t - 1)]["tc"] == 0.0 for t in range(1, 5))
    by_jump = [entry["tc"] for entry in coupled_result.by_jump]
    assert by_jump[0] == 0.0
    assert by_jump[1] > 0.05 and all(b > a for a, b in itertools.pairwise(by_jump))


def test_predictions_that_ignore_other_positions_have_zero_tc():
    model = tiny_task_model(initializer_range=0.3)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()  # every position now sees only its own token
    rows = [ROW, {**ROW, "decode_step": [1, 2, 3, 4]}]
    config = TotalCorrelationConfig(num_samples=64, max_states=None)
    result = total_correlation(model, rows, metadata(), config, progress=False)
    assert len(result.grid) == 10 and all(abs(c["tc"]) < 1e-5 for c in result.grid)
    coupled = total_correlation(
        tiny_task_model(initializer_range=0.3), rows, metadata(), config, progress=False
    )
    assert coupled.tc(4, 0) > 0.05  # the same states, the attention left in: clearly positive


def test_peft_model_is_measured_through_its_base_model(coupled_model, coupled_result):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        tiny_task_model(initializer_range=0.3), LoraConfig(r=2, target_modules=["q_proj"])
    )
    config = TotalCorrelationConfig(num_samples=3000, max_states=None, batch_size=16384, seed=0)
    # LoRA starts as the identity, so the adapted model is the coupled model: same draws, same estimates.
    assert total_correlation(peft_model, [ROW], metadata(), config, progress=False) == coupled_result


def test_entropy_curve_and_json(coupled_result):
    ratios = [entry["mask_ratio"] for entry in coupled_result.entropy]
    assert ratios == [0.25, 0.5, 0.75, 1.0]
    vocab = get_task("add").vocab_size
    assert all(0 <= entry["entropy"] <= math.log(vocab - 1) for entry in coupled_result.entropy)
    data = json.loads(json.dumps(coupled_result.to_dict(), allow_nan=False))
    assert TotalCorrelationResult.from_dict(data).tc(4, 0) == coupled_result.tc(4, 0)
    matrix = coupled_result.matrix()
    assert matrix[0, 4] == coupled_result.tc(4, 0) and math.isnan(matrix[4, 0])


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
def test_states_are_the_teachers_intermediate_canvases(tokenizer, attention):
    """Every rebuilt state x_t equals the sampler's canvas after the matching step (left padding, prompt tails)."""
    build = build_block_causal_model if attention == "block_causal" else build_bidirectional_model
    model = never_predict_specials(build(tokenizer))
    prompts = [
        "hello",
        "a much longer prompt",
    ]  # lengths 5 and 20: different tails in the block-causal layout
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    out = model.diffusion_generate(
        encoded["input_ids"],
        encoded["attention_mask"],
        max_new_tokens=8,
        block_length=4,
        tokens_per_step=1,
        return_dict_in_generate=True,
        output_history=True,
    )
    width = encoded["input_ids"].shape[1]
    rows = [
        {
            "prompt_ids": tokenizer(prompt)["input_ids"],
            "completion_ids": out.sequences[i, width:].tolist(),
            "decode_step": out.decode_steps[i].tolist(),
        }
        for i, prompt in enumerate(prompts)
    ]
    meta = metadata(max_new_tokens=8, attention=attention, mask_token_id=tokenizer.mask_token_id)
    pairs = [(i, b) for i, row in enumerate(rows) for b in _complete_blocks(meta, len(row["prompt_ids"]), 8)]
    canvas, blocks = _prepare(rows, pairs, meta, model.diffusion_config, tokenizer.pad_token_id)
    states, index = _states(canvas, blocks, tokenizer.mask_token_id)
    assert len(states) == sum(len(b.order) for b in blocks) > 8
    for state, (k, t) in zip(states, index):
        block = blocks[k]
        # Tokens of earlier blocks, plus the block's tokens decoded before this state, were each 1 step.
        first_step = min(
            rows[block.row]["decode_step"][g]
            for g in range(8)
            if canvas.gen_index[block.row, g] in block.order
        )
        step = first_step - 1 + len(block.order) - t
        expected = out.history[step - 1][block.row] if step > 0 else torch.full((8,), tokenizer.mask_token_id)
        assert torch.equal(state[canvas.gen_index[block.row]], expected), (block, t)


def test_block_causal_model_runs_and_counts_the_tokens_of_each_block(tokenizer):
    model = build_block_causal_model(tokenizer)
    # Prompt of 6 tokens: its tail of 2 shares the first block of 4, which then holds 2 completion tokens.
    row = {
        "prompt_ids": [10, 11, 12, 13, 14, 15],
        "completion_ids": [20, 21, 22, 23, 24, 25],
        "decode_step": [2, 1, 6, 5, 8, 7],
    }
    meta = metadata(max_new_tokens=6, attention="block_causal", mask_token_id=tokenizer.mask_token_id)
    result = total_correlation(model, [row], meta, TotalCorrelationConfig(num_samples=4), progress=False)
    assert result.num_blocks == 2 and result.num_states == 6
    assert [e["mask_ratio"] for e in result.entropy] == [0.25, 0.5, 0.75, 1.0]
    assert {c["t"]: c["states"] for c in result.grid if c["s"] == 0} == {1: 2, 2: 2, 3: 1, 4: 1}


def test_max_states_subsamples_whole_blocks_deterministically(coupled_model):
    rows = [{**ROW, "completion_ids": ROW["completion_ids"] * 2, "decode_step": [3, 1, 4, 2, 7, 5, 8, 6]}] * 6
    meta = metadata(max_new_tokens=8)
    config = TotalCorrelationConfig(num_samples=2, max_states=10, seed=1)
    first = total_correlation(coupled_model, rows, meta, config, progress=False)
    assert first.num_blocks == 3 and first.num_states == 12
    assert first == total_correlation(coupled_model, rows, meta, config, progress=False)


def test_mismatched_model_and_trajectories_raise(coupled_model):
    with pytest.raises(ValueError, match="does not match the trajectories"):
        total_correlation(coupled_model, [ROW], metadata(attention="block_causal"), progress=False)
    with pytest.raises(ValueError, match="no complete decoding block"):
        total_correlation(
            coupled_model,
            [{**ROW, "completion_ids": [7, 2], "decode_step": [1, 2]}],
            metadata(),
            progress=False,
        )
    with pytest.raises(ValueError, match="num_samples must be positive"):
        TotalCorrelationConfig(num_samples=0)
    # One state's draws share a pass, so a smaller batch would be exceeded, not honoured.
    with pytest.raises(ValueError, match=r"batch_size \(16\) must be at least num_samples \(64\)"):
        TotalCorrelationConfig(num_samples=64, batch_size=16)
    # Trajectories of another vocabulary: refused, not scored (or indexed out of range).
    with pytest.raises(ValueError, match="a vocabulary of 7 .* but the model has"):
        total_correlation(coupled_model, [ROW], dataclasses.replace(metadata(), vocab_size=7), progress=False)


# ------------------------------------------------------------------------------------------------ the CLI


def _save_task_model(path, task_name: str, seed: int):
    model = never_predict_specials(tiny_task_model(task_name, seed=seed, initializer_range=0.3))
    model.save_pretrained(path)
    get_task(task_name).tokenizer().save_pretrained(path)
    return str(path)


def test_cli_help_documents_every_option(capsys):
    from t3d_trl.cli.analyze import build_parser
    from t3d_trl.cli.main import COMMANDS, main

    assert "analyze" in COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    options = [a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 12
    for option in options:
        assert option in text
    for action in build_parser()._actions:
        assert action.help, action.dest


def test_cli_task_mode_writes_json_and_figures(tmp_path, capsys):
    from t3d_trl.cli.main import main

    teacher = _save_task_model(tmp_path / "teacher", "words", seed=0)
    student = _save_task_model(tmp_path / "student", "words", seed=1)
    out = tmp_path / "analysis"
    argv = ["analyze", "--model", f"teacher={teacher}", "--model", f"student={student}", "--task", "words"]
    argv += ["--num_prompts", "4", "--samples", "4", "--max_states", "16", "--output_dir", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "total_correlation.json").read_text())
    assert set(report["models"]) == {"teacher", "student"}
    assert report["settings"]["trajectory_metadata"]["block_length"] == 4
    for result in report["models"].values():
        assert result["num_states"] == 16 and len(result["grid"]) == 10
        assert {c["jump"] for c in result["grid"]} == {1, 2, 3, 4}
    for name in ("tc_heatmap.png", "tc_by_jump.png", "entropy.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    printed = capsys.readouterr().out
    assert "TC (nats" in printed and "teacher" in printed and "student" in printed


def test_cli_trajectories_mode_and_bad_block_length(tmp_path, capsys):
    from t3d_trl import collect_trajectories
    from t3d_trl.cli.main import main

    task = get_task("sort2")
    teacher = _save_task_model(tmp_path / "teacher", "sort2", seed=0)
    from t3d_trl import AutoModelForDiffusionLM

    model = AutoModelForDiffusionLM.from_pretrained(teacher)
    collect_trajectories(
        model,
        task.tokenizer(),
        task.sample(3, seed=0),
        "plain",
        output_dir=tmp_path / "trajectories",
        generation_config=task.generation_config(),
        prompt_column="prompt",
        use_chat_template=False,
    )
    out = tmp_path / "analysis"
    argv = ["analyze", "--model", teacher, "--trajectories", str(tmp_path / "trajectories"), "--samples", "2"]
    assert main([*argv, "--output_dir", str(out)]) == 0
    result = json.loads((out / "total_correlation.json").read_text())["models"]["teacher"]
    assert result["num_states"] == 24 and result["block_length"] == 8
    capsys.readouterr()
    assert main([*argv, "--block_length", "4", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err  # progress bars, then the one-line error
    assert (
        err.splitlines()[-1].startswith("t3d-trl analyze: --block_length 4 differs")
        and "Traceback" not in err
    )
    assert main(["analyze", "--model", teacher, "--task", "sort2", "--samples", "0"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "t3d-trl analyze: --samples must be positive, got 0"
    # A second model that does not match the trajectories is refused before the first one's estimate.
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS

    mixed = ["analyze", "--model", f"a={teacher}", "--model", f"b={PACKAGED_TEACHERS / 'wordsort'}"]
    assert main([*mixed, "--trajectories", str(tmp_path / "trajectories"), "--output_dir", str(out)]) == 2
    captured = capsys.readouterr()
    assert "estimating TC" not in captured.out
    assert captured.err.splitlines()[-1].startswith(
        "t3d-trl analyze: model 'b': the model (attention='block_causal'"
    )
    # A model of another task on this task's prompts: refused, not measured on unknown tokens.
    assert main(["analyze", "--model", str(PACKAGED_TEACHERS / "wordsort"), "--task", "sort2"]) == 2
    assert "its tokenizer does not know the sort2 task's tokens" in capsys.readouterr().err
