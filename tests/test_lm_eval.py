"""The lm-evaluation-harness model ``t3d`` (t3d_trl.integrations.lm_eval), offline, on local task YAMLs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lm_eval
import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager
from testing_utils import build_bidirectional_model, build_block_causal_model, free_port, registered_benchmark

from t3d_trl.cli.main import COMMANDS
from t3d_trl.cli.main import main as cli_main
from t3d_trl.demo import get_task
from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
from t3d_trl.evaluation.benchmarks import BENCHMARKS, Benchmark
from t3d_trl.evaluation.completions import generate_completions
from t3d_trl.integrations.lm_eval import DiffusionLM

TASKS = Path(__file__).parent / "data" / "lm_eval"
TEACHER = PACKAGED_TEACHERS / "sort2"


@pytest.fixture
def task_dir(monkeypatch):
    # The task YAMLs name their jsonl files relative to this folder, as a user's own task folder would.
    monkeypatch.chdir(TASKS)
    return TaskManager(include_path=str(TASKS), include_defaults=False)


def test_decoding_stats_without_measured_time_give_a_nan_throughput(tokenizer):
    # One throughput everywhere (t3d_trl.evaluation.metrics.throughput): NaN when no time was measured.
    lm = DiffusionLM(build_bidirectional_model(tokenizer), tokenizer=tokenizer, device="cpu")
    lm.stats.update(samples=2, tokens=10, nfe=5, seconds=0.0)
    assert math.isnan(lm.decoding_stats()["tokens_per_second"])
    lm.stats.update(seconds=4.0)
    assert lm.decoding_stats()["tokens_per_second"] == 2.5


@pytest.mark.parametrize("build", [build_bidirectional_model, build_block_causal_model])
def test_tiny_tasks_run_end_to_end(build, tokenizer, task_dir):
    model = build(tokenizer)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu", block_length=4, tokens_per_step=2, mc_num=4)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=["t3d_tiny_generate", "t3d_tiny_choice"], task_manager=task_dir, log_samples=True
    )
    assert 0 <= out["results"]["t3d_tiny_generate"]["exact_match,none"] <= 1
    assert 0 <= out["results"]["t3d_tiny_choice"]["acc,none"] <= 1
    # The decoding cost is reported next to the metrics.
    stats = out["config"]["t3d_decoding"]
    assert stats["samples"] == 4 and stats["mean_nfe"] > 0 and stats["tokens_per_second"] > 0
    # The settings recorded are those generate_until decoded with: the task's max_gen_toks 6 as two blocks, greedy.
    assert out["config"]["t3d_generation_config_source"] == "generate_until"
    assert {k: out["config"]["t3d_generation_config"][k] for k in ("tokens_per_step", "max_new_tokens")} == {
        "tokens_per_step": 2,
        "max_new_tokens": 8,
    }
    # generate_until is generate_completions on the rendered prompts, cut at the task's `until` ("\n"), with
    # max_gen_toks=6 rounded up to two blocks of 4.
    samples = out["samples"]["t3d_tiny_generate"]
    contexts = [s["arguments"][0][0] for s in samples]
    config = model.diffusion_generation_config.update(block_length=4, tokens_per_step=2, max_new_tokens=8)
    expected = generate_completions(
        model,
        tokenizer,
        contexts,
        config,
        use_chat_template=False,
        generator=torch.Generator().manual_seed(0),
        progress=False,
    )
    assert [s["resps"][0][0] for s in samples] == [c.split("\n", 1)[0] for c in expected.completions]


def test_generate_until_honours_until_and_groups_generation_arguments(tokenizer):
    model = build_bidirectional_model(tokenizer)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu", block_length=4, tokens_per_step=1)
    context = "Q: 2+2=\nA:"
    free = lm.generate_until([Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 8}), 0)])
    assert len(free[0]) > 1
    stop = free[0][1]  # a character the model writes: cutting there leaves one character
    cut = lm.generate_until(
        [
            Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 8}), 0),
            Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 4}), 1),
        ]
    )
    assert cut[0] == free[0].split(stop, 1)[0]
    assert len(cut[1]) <= 4  # its own group, decoded with max_new_tokens=4
    assert lm.decoding_stats()["samples"] == 3

    # With several processes lm-eval pads a process's requests with its last one (the same object, `repeats`
    # times, from its metadata): answered, but not counted as samples; two real samples of one request are.
    lm._world_size = 2
    last = Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 4}), 1, ("t", 1, 1))
    answers = lm.generate_until([Instance("generate_until", {}, (context, {"until": []}), 0), last, last])
    assert len(answers) == 3 and lm.decoding_stats()["samples"] == 3 + 2
    twice = Instance("generate_until", {}, (context, {"until": [], "max_gen_toks": 4}), 0, ("t", 0, 2))
    lm.generate_until([twice, twice])
    assert lm.decoding_stats()["samples"] == 5 + 2


def test_results_record_the_settings_generate_until_decoded_with(tokenizer):
    """``config.t3d_generation_config`` is what ran (the task's length and greedy decoding over the model's saved
    max_new_tokens 8 and temperature 1), a list when the tasks asked for several settings; the model's settings,
    marked as such, when nothing decoded."""
    model = build_bidirectional_model(tokenizer)
    saved = model.diffusion_generation_config.update(max_new_tokens=8, temperature=1.0, block_length=4)
    saved.update(tokens_per_step=4).save_to_model_config(model.config)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu")
    info = lm.get_model_info()
    assert info["t3d_generation_config_source"] == "model"  # a loglikelihood-only run decodes nothing
    assert info["t3d_generation_config"] == lm.generation_config.to_dict()

    def request(max_gen_toks: int) -> Instance:
        arguments = {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False}
        return Instance("generate_until", {}, ("Q: 2+2=\nA:", arguments), 0)

    lm.generate_until([request(16)])
    assert lm.decoding_stats()["mean_nfe"] == 4  # 16 tokens, 4 per step
    info = lm.get_model_info()
    assert info["t3d_generation_config_source"] == "generate_until"
    ran = lm.generation_config.update(max_new_tokens=16, temperature=0.0).to_dict()
    assert info["t3d_generation_config"] == ran
    lm.generate_until([request(4), request(16)])
    shorter = lm.generation_config.update(max_new_tokens=4, temperature=0.0).to_dict()
    assert lm.get_model_info()["t3d_generation_config"] == [ran, shorter]  # each once, in order of first use


def test_peft_adapter_decodes_at_the_adapters_saved_defaults(tokenizer, tmp_path):
    """``pretrained=BASE,peft=ADAPTER`` decodes at the settings saved with the adapter (its diffusion_config.json),
    as ``pretrained=ADAPTER`` and every other loading route do; model arguments still win over them."""
    from peft import LoraConfig, get_peft_model

    from t3d_trl import AutoModelForDiffusionLM
    from t3d_trl.models.auto import save_adapter_defaults

    base, adapter = tmp_path / "base", tmp_path / "adapter"
    build_bidirectional_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    student = get_peft_model(
        AutoModelForDiffusionLM.from_pretrained(base), LoraConfig(r=2, target_modules=["q_proj"])
    )
    trained = student.diffusion_generation_config.update(max_new_tokens=8, block_length=8, tokens_per_step=4)
    trained.save_to_model_config(student.base_model.model.config)
    student.save_pretrained(adapter)
    save_adapter_defaults(student, adapter)

    request = Instance("generate_until", {}, ("Q: 2+2=\nA:", {"until": []}), 0)
    answers = []
    for lm in (
        DiffusionLM(str(base), peft=str(adapter), device="cpu"),
        DiffusionLM(str(adapter), device="cpu"),
    ):
        assert lm.generation_config == trained
        answers.append(lm.generate_until([request]))
        assert lm.decoding_stats()["mean_nfe"] == 2  # 8 tokens, 4 per step (the base model: one per step)
    assert answers[0] == answers[1]
    explicit = DiffusionLM(str(base), peft=str(adapter), device="cpu", tokens_per_step=2)
    assert explicit.generation_config == trained.update(tokens_per_step=2)


@pytest.mark.slow
def test_demo_teacher_scores_what_t3d_trl_eval_says(tmp_path, task_dir, capsys):
    """The packaged teacher on the demo's sort2 prompts, block 8 and 4 tokens per step (a few-step setting where
    it is not always right): the `t3d-trl lm-eval` and `t3d-trl eval` commands agree sample by sample."""
    argv = [
        "lm-eval",
        "--model",
        "t3d",
        "--model_args",
        f"pretrained={TEACHER},block_length=8,tokens_per_step=4",
    ]
    argv += ["--device", "cpu", "--tasks", "t3d_demo_sort2", "--include_path", str(TASKS)]
    argv += ["--output_path", str(tmp_path / "lm_eval"), "--log_samples"]
    assert cli_main(argv) == 0
    assert "t3d_demo_sort2" in capsys.readouterr().out  # lm_eval's own results table
    (results_file,) = (tmp_path / "lm_eval").rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert results["config"]["t3d_decoding"]["mean_nfe"] == 2  # 8 tokens, 4 per step
    (samples_file,) = (tmp_path / "lm_eval").rglob("samples_t3d_demo_sort2_*.jsonl")
    lm_eval_completions = {
        json.loads(line)["doc"]["id"]: json.loads(line)["resps"][0][0] for line in samples_file.open()
    }

    task = get_task("sort2")
    benchmark = Benchmark(
        name="demo-sort2",
        path="t3d-trl/demo-sort2",
        columns={"problem": "prompt", "id": "id"},
        checker=lambda completions, examples: [
            task.is_valid(e["problem"], c) for c, e in zip(completions, examples)
        ],
    )
    argv = ["eval", "--models", f"teacher={TEACHER}", "--benchmarks", "lm-eval-demo-sort2", "--device", "cpu"]
    argv += ["--data_files", f"lm-eval-demo-sort2={TASKS / 'demo_sort2.jsonl'}", "--no_use_chat_template"]
    argv += ["--block_lengths", "8", "--tokens_per_step", "4", "--output_dir", str(tmp_path / "eval")]
    with registered_benchmark("lm-eval-demo-sort2", benchmark):
        assert cli_main(argv) == 0
    assert "lmevaldemosort2" not in BENCHMARKS  # removed again: no registration leaks into later tests
    (run,) = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    records = [json.loads(line) for line in (tmp_path / "eval" / run["samples_file"]).open()]
    assert {r["id"]: r["completion"] for r in records} == lm_eval_completions
    accuracy = run["metrics"]["accuracy"]
    assert results["results"]["t3d_demo_sort2"]["valid,none"] == pytest.approx(accuracy)
    assert 0 < accuracy < 1  # the setting discriminates: a silent change of decoding would show
    assert run["metrics"]["mean_nfe"] == results["config"]["t3d_decoding"]["mean_nfe"]


def test_loglikelihood_prefers_the_valid_answer_and_is_reproducible(task_dir):
    lm = DiffusionLM(str(TEACHER), device="cpu", mc_num=8, mc_batch_size=8, seed=3)
    out = lm_eval.simple_evaluate(model=lm, tasks=["t3d_demo_sort2_choice"], task_manager=task_dir)
    assert out["results"]["t3d_demo_sort2_choice"]["acc,none"] >= 0.9
    assert out["config"]["t3d_loglikelihood"] == {
        "mc_num": 8,
        "seed": 3,
        "estimator": "stratified",
        "cfg": 0.0,
        "is_check_greedy": True,
    }

    row = json.loads((TASKS / "demo_sort2.jsonl").open().readline())
    requests = [
        Instance("loglikelihood", {}, (row["prompt"], " " + choice), i)
        for i, choice in enumerate(row["choices"])
    ]
    (valid, _), (invalid, _) = lm.loglikelihood(requests)
    assert valid > invalid and valid <= 0
    again = DiffusionLM(str(TEACHER), device="cpu", mc_num=8, mc_batch_size=3, seed=3)
    assert again.loglikelihood(requests[:1])[0][0] == pytest.approx(
        valid, rel=1e-5
    )  # same noise, other batches
    other_seed = DiffusionLM(str(TEACHER), device="cpu", mc_num=8, seed=4)
    assert other_seed.loglikelihood(requests[:1])[0][0] != pytest.approx(valid, rel=1e-9)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_data_parallel_run_matches_one_process(tokenizer, task_dir, tmp_path):
    """Two processes (torchrun, gloo on the CPU) split the requests and give the one-process answers."""
    model = build_bidirectional_model(tokenizer)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    args = f"pretrained={tmp_path / 'tiny'},block_length=4,tokens_per_step=2,mc_num=4"
    tasks = ["t3d_tiny_generate", "t3d_tiny_choice"]
    single = lm_eval.simple_evaluate(
        model="t3d", model_args=args, tasks=tasks, task_manager=task_dir, log_samples=True, device="cpu"
    )
    port = free_port()
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
    ]
    command = ["-m", "t3d_trl.cli.main", "lm-eval", "--model", "t3d", "--model_args", args, "--device", "cpu"]
    command += [
        "--tasks",
        ",".join(tasks),
        "--include_path",
        str(TASKS),
        "--output_path",
        str(tmp_path / "out"),
    ]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*launch, *command, "--log_samples"], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "on rank 1" in run.stderr + run.stdout  # the second process took its share
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert results["config"]["t3d_decoding"]["samples"] == 4  # gathered over both processes
    for key in ("t3d_generation_config", "t3d_generation_config_source"):
        assert results["config"][key] == single["config"][key]
    for task in tasks:
        (samples_file,) = (tmp_path / "out").rglob(f"samples_{task}_*.jsonl")
        parallel = {
            json.loads(line)["doc_id"]: _leaves(json.loads(line)["resps"]) for line in samples_file.open()
        }
        assert parallel == {s["doc_id"]: _leaves(s["resps"]) for s in single["samples"][task]}


def _leaves(value):
    """Responses with every leaf as a string, as lm-eval writes them to its samples files."""
    return [_leaves(v) for v in value] if isinstance(value, (list, tuple)) else str(value)


def test_refusals_and_argument_errors(tokenizer):
    model = build_bidirectional_model(tokenizer)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu")
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("some text",), 0)])
    with pytest.raises(ValueError, match="unknown t3d model argument"):
        DiffusionLM(model, tokenizer=tokenizer, device="cpu", block_lenght=4)
    with pytest.raises(ValueError, match="batch_size"):
        DiffusionLM(model, tokenizer=tokenizer, device="cpu", batch_size="auto")
    with pytest.raises(ValueError, match="tokenizer"):
        DiffusionLM(model, device="cpu")
    with pytest.raises(ValueError, match="tokens_per_step"):
        DiffusionLM(model, tokenizer=tokenizer, device="cpu", steps=4, tokens_per_step=2)


def test_continuations_are_the_texts_tokens_whatever_the_tokenizer_appends(tokenizer):
    # A tokenizer that ends every text with a special token (BERT's [SEP]): lm-eval reads the continuation as
    # the tail of context + continuation, which held [SEP] and lost the continuation's first token.
    from testing_utils import build_modernbert_model, build_tokenizer
    from tokenizers.processors import TemplateProcessing

    model = build_modernbert_model(tokenizer)
    wrapped = build_tokenizer()  # its own copy: the post-processor is changed
    bos, eos = wrapped.bos_token, wrapped.eos_token
    wrapped._tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A {eos}",
        special_tokens=[(bos, wrapped.bos_token_id), (eos, wrapped.eos_token_id)],
    )
    lm = DiffusionLM(model, tokenizer=wrapped, device="cpu")
    context, continuation = lm._encode_pair("Q: ab", " cd")
    assert context == [wrapped.bos_token_id, *wrapped("Q: ab", add_special_tokens=False).input_ids]
    assert continuation == wrapped(" cd", add_special_tokens=False).input_ids


def test_long_contexts_are_cut_from_the_left_to_fit_the_model(tokenizer, caplog):
    # As lm-eval's Hugging Face model does; the greedy check failed on the sampler's length error before.
    model = build_bidirectional_model(tokenizer, max_position_embeddings=32)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu", mc_num=2)
    context, continuation = list(range(10, 50)), [12, 13, 14]
    assert lm._fitted_context(context, continuation) == context[-29:]
    (answer,) = lm._loglikelihood_tokens([(("c", "x"), context, continuation)], disable_tqdm=True)
    assert math.isfinite(answer[0]) and "cut from the left" in caplog.text
    with pytest.raises(ValueError, match="a continuation of 32 tokens does not fit the model's 32 positions"):
        lm._fitted_context(context, list(range(10, 42)))


def test_generate_until_cuts_long_contexts_from_the_left(tokenizer, caplog):
    # A few-shot prompt longer than the model's positions aborted the whole lm-eval run before.
    model = build_bidirectional_model(tokenizer, max_position_embeddings=32)
    lm = DiffusionLM(model, tokenizer=tokenizer, device="cpu", block_length=4, steps=8)
    short = "Q: 2+2=\nA:"
    long = "Q: 1+1=\nA: 2\n" * 10 + short
    request = Instance("generate_until", {}, (long, {"until": [], "max_gen_toks": 8}), 0)
    (answer,) = lm.generate_until([request])
    assert "cut from the left" in caplog.text
    # It decodes what an exact fit of the context's tail decodes.
    tail = tokenizer.decode(tokenizer(long).input_ids[-24:])
    (expected,) = generate_completions(
        model,
        tokenizer,
        [tail],
        lm.generation_config.update(max_new_tokens=8),
        use_chat_template=False,
        progress=False,
    ).completions
    assert answer == expected
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings=32"):
        generate_completions(
            model, tokenizer, [long], {"max_new_tokens": 8, "block_length": 4}, progress=False
        )
    with pytest.raises(
        ValueError, match="40 new tokens leave no room for a prompt in the model's 32 positions"
    ):
        lm.generate_until([Instance("generate_until", {}, (short, {"until": [], "max_gen_toks": 40}), 0)])


def test_lm_eval_command_help(capsys):
    assert cli_main(["lm-eval", "--help"]) == 0
    assert "--model_args" in capsys.readouterr().out
    assert COMMANDS["lm-eval"][0] == "lm_eval"


def test_lm_eval_command_reports_a_bad_request_in_one_line(capsys):
    # The model's refusal is raised inside lm-eval's own run; the command still reports it like every other one.
    argv = ["lm-eval", "--model", "t3d", "--model_args", f"pretrained={TEACHER}", "--device", "cpu"]
    argv += ["--tasks", "t3d_demo_sort2", "--include_path", str(TASKS), "--limit", "2"]
    assert cli_main([*argv, "--gen_kwargs", "max_gen_toks=500"]) == 2
    assert (
        "t3d-trl lm-eval: 504 new tokens leave no room for a prompt in the model's 64 positions"
        in capsys.readouterr().err
    )


def test_is_greedy_says_whether_greedy_decoding_writes_the_continuation():
    """is_greedy against an independent greedy decode (one most-confident token per step over exactly the
    continuation's length, temperature 0) on rows where the valid answer is greedy (row 1) and where it is not
    (row 0): both answers of each row match, so a check stuck at False (or True) fails."""
    lm = DiffusionLM(str(TEACHER), device="cpu", mc_num=2, seed=3)
    rows = [json.loads(line) for line in (TASKS / "demo_sort2.jsonl").open()][:2]
    greedy = []
    for row in rows:
        requests = [
            Instance("loglikelihood", {}, (row["prompt"], " " + choice), i)
            for i, choice in enumerate(row["choices"])
        ]
        answers = [is_greedy for _, is_greedy in lm.loglikelihood(requests)]
        length = len(lm.tokenizer(" " + row["choices"][0], add_special_tokens=False).input_ids)
        prompt = torch.tensor([lm.tokenizer(row["prompt"], add_special_tokens=False).input_ids])
        out = lm.model.diffusion_generate(
            prompt,
            max_new_tokens=length,
            block_length=length,
            tokens_per_step=1,
            temperature=0.0,
            stop_at_eos=False,
        )
        decoded = lm.tokenizer.decode(out[0, prompt.shape[1] :].tolist()).strip()
        assert answers == [decoded == choice for choice in row["choices"]], (row["id"], decoded, answers)
        greedy.append(answers[0])
    assert greedy == [False, True]  # one row of each kind: the comparison above can fail either way


def test_model_args_win_over_the_command_lines_batch_size_and_device(tokenizer, tmp_path):
    # lm-eval always passes its own --batch_size and --device: the same keys in --model_args collided (TypeError).
    build_bidirectional_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    lm = DiffusionLM.create_from_arg_string(
        f"pretrained={tmp_path},batch_size=4,device=cpu",
        {"batch_size": 1, "device": "cuda:0", "max_batch_size": None},
    )
    assert lm.batch_size == 4 and lm.device.type == "cpu"
    assert (
        DiffusionLM.create_from_arg_string(f"pretrained={tmp_path},device=cpu", {"batch_size": 2}).batch_size
        == 2
    )
