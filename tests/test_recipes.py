"""The shipped recipes (``recipes/``): every one goes through its command's own CLI path (an unknown key fails),
they chain into one pipeline per model, the accelerate configs load with accelerate's own classes, and tiny
copies of every stage (collect -> train -> eval) run end to end on tiny local models."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import yaml
from testing_utils import build_bidirectional_model, build_block_causal_model, build_tokenizer
from tokenizers import processors

from t3d_trl import DiffusionGenerationConfig, TrajectoryMetadata, load_trajectories
from t3d_trl.cli import collect as collect_cli
from t3d_trl.cli import train as train_cli
from t3d_trl.cli.main import main
from t3d_trl.data.prompts import PROMPT_TEMPLATES
from t3d_trl.evaluation import report, runner
from t3d_trl.evaluation.benchmarks import get_benchmark

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
ACCELERATE = RECIPES / "accelerate"
# The CPU getting-started recipes (a packaged teacher, smoke-sized) run in tests/test_getting_started.py.
CPU_DEMO = RECIPES / "cpu-demo"
FOLDERS = sorted(p.name for p in RECIPES.iterdir() if p.is_dir() and p not in (ACCELERATE, CPU_DEMO))
GLOBAL_BATCH = 256  # the paper's sequences per optimizer step


def command_of(path: Path) -> str:
    """The ``t3d-trl`` command that reads a recipe file: ``collect*.yaml``, ``eval*.yaml``, the rest ``train``."""
    return next((c for c in ("collect", "eval") if path.name.startswith(c)), "train")


RECIPE_FILES = {
    command: [
        p
        for p in sorted(RECIPES.glob("*/*.yaml"))
        if p.parent not in (ACCELERATE, CPU_DEMO) and command_of(p) == command
    ]
    for command in ("collect", "train", "eval")
}


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(RECIPES)) for p in paths]


@pytest.fixture(scope="module")
def prepare_script():
    """``recipes/prepare_sft_data.py``, imported from its path (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("prepare_sft_data", RECIPES / "prepare_sft_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------ parsing every recipe
@pytest.fixture
def parse(monkeypatch):
    """``parse(recipe, *flags)`` runs ``t3d-trl <command> --config recipe`` up to where the work would start and
    returns what the command parsed, with its own dataclasses and checks (the workers are replaced)."""
    captured = {}
    monkeypatch.chdir(REPO)  # recipes name their accelerate config relative to the repository root
    monkeypatch.setattr(collect_cli, "run", lambda config: captured.update(value=config) or [])
    monkeypatch.setattr(train_cli, "run", lambda *parsed: captured.update(value=parsed) or "")
    # The paper's models, data and DeepSpeed are not here: the input checks are tests/test_cli_checks.py's.
    monkeypatch.setattr(train_cli, "check_inputs", lambda model_args, data, args: None)
    monkeypatch.setattr(train_cli, "_relaunch", lambda config, argv: captured.update(launch=config) or 0)
    monkeypatch.setattr(report, "accuracy_table", lambda results: "")
    monkeypatch.setattr(
        runner,
        "run_grid",
        lambda models, benchmarks, **kw: (
            captured.update(value=(models, benchmarks, kw)) or SimpleNamespace(results=[])
        ),
    )

    def run(path: Path, *flags: str):
        captured.clear()
        assert main([command_of(path), "--config", str(path), *flags]) == 0
        return captured["value"]

    run.captured = captured
    return run


def with_unknown_key(path: Path, tmp_path: Path) -> Path:
    bad = tmp_path / path.name
    bad.write_text(path.read_text() + "\nnot_a_recipe_key: 1\n")
    return bad


def assert_refused(command: str, bad: Path, capsys) -> None:
    """The command refuses a recipe with an unknown key and names the key."""
    assert main([command, "--config", str(bad)]) == 2
    assert "not_a_recipe_key" in capsys.readouterr().err


def test_every_model_folder_has_every_recipe(capsys):
    assert FOLDERS == ["llada-8b-instruct", "sdar-1.7b-chat", "sdar-4b-chat"]
    stages = ["collect", "collect_code", "ddo", "dparallel", "eval", "eval_code", "redi", "sft", "t3d", "td"]
    for folder in FOLDERS:
        assert sorted(p.stem for p in (RECIPES / folder).glob("*.yaml")) == stages
    # The file-to-command mapping matters: a collect recipe is not a train recipe.
    assert main(["train", "--config", str(RECIPE_FILES["collect"][0])]) == 2
    assert "prompt_template" in capsys.readouterr().err


@pytest.mark.parametrize("path", RECIPE_FILES["collect"], ids=ids(RECIPE_FILES["collect"]))
def test_collect_recipes_parse_with_the_paper_teacher_setting(path, parse, tmp_path, capsys):
    config = parse(path)
    assert type(config) is collect_cli.CollectConfig
    # Static decoding, one token per step, low-confidence remasking, temperature 0.1; prompts over 512 dropped.
    assert (config.tokens_per_step, config.steps, config.threshold) == (1, None, None)
    assert config.remasking == "low_confidence" and config.temperature == 0.1
    assert config.max_prompt_length == 512
    assert config.prompt_template == ("code" if path.stem == "collect_code" else "math")
    assert config.max_new_tokens % config.block_length == 0
    assert config.output_dir.startswith(f"data/{path.parent.name}/")
    assert_refused("collect", with_unknown_key(path, tmp_path), capsys)


@pytest.mark.parametrize("path", RECIPE_FILES["train"], ids=ids(RECIPE_FILES["train"]))
def test_train_recipes_parse_with_the_paper_hyperparameters(path, parse, tmp_path, capsys, monkeypatch):
    # Without a launcher around it, the command relaunches itself with the recipe's accelerate config.
    parse.captured.clear()
    assert main(["train", "--config", str(path)]) == 0
    launch = REPO / parse.captured["launch"]
    assert launch.parent == ACCELERATE and launch.is_file()

    monkeypatch.setenv(train_cli._LAUNCHED, "1")  # as inside the launched processes
    model, data, args = parse(path)
    assert args.loss_type == {"sft": "mdlm"}.get(path.stem, path.stem)
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (1e-5, 0.01, 1.0)
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert args.warmup_steps == 20 and args.activation_checkpointing
    assert (args.max_prompt_length, args.max_completion_length) == (512, 1024)
    processes = yaml.safe_load(launch.read_text())["num_processes"]
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * processes == GLOBAL_BATCH
    if args.loss_type in ("t3d", "ddo"):
        assert (args.beta, args.fake_weight, args.ref_sync_steps) == (0.1, 0.5, 10)
    if args.loss_type == "t3d":
        assert (args.lambda_path, args.path_weighting) == (0.2, "early")
    # T3D and its ablations mix random tokens into the inputs; the published baselines do not.
    assert args.random_token_prob == (0.1 if args.loss_type in ("t3d", "ddo", "td") else 0.0)
    assert model.dtype == "bfloat16" and data.dataset_name.startswith(f"data/{path.parent.name}/")
    assert args.output_dir == f"outputs/{path.parent.name}/{path.stem}"
    assert_refused("train", with_unknown_key(path, tmp_path), capsys)


@pytest.mark.parametrize("path", RECIPE_FILES["eval"], ids=ids(RECIPE_FILES["eval"]))
def test_eval_recipes_parse_into_the_paper_grids(path, parse, tmp_path, capsys):
    models, benchmarks, settings = parse(path)
    code = path.stem == "eval_code"
    assert benchmarks == (["mbpp", "humaneval"] if code else ["math500", "gsm8k"])
    assert list(models)[0] == "original" and "t3d" in models
    assert settings["generation_kwargs"] == {
        "max_new_tokens": 1024,
        "temperature": 0.1,
        "remasking": "low_confidence",
    }
    grid = {
        s.label
        for s in runner.grid_settings(
            **{k: settings[k] for k in ("block_lengths", "tokens_per_step", "thresholds")}
        )
    }
    if path.parent.name.startswith("sdar"):  # Table 1, full decoding (TokPS 1)
        assert {f"block{b}-tokps{k}" for b in (4, 8) for k in (1, 2, 4)} <= grid
    else:  # the LLaDA table
        assert grid == {"block32-tokps4", "block32-tokps8"}
    if path.parent.name == "sdar-4b-chat":  # the dynamic-decoding table
        assert "block4-threshold0.9" in grid
    assert_refused("eval", with_unknown_key(path, tmp_path), capsys)


@pytest.mark.parametrize("folder", FOLDERS)
def test_recipes_of_a_model_chain_into_one_pipeline(folder, parse, monkeypatch):
    """Self-distillation: the students start from the teacher of collect.yaml and train on its trajectories (or
    on the SFT data), and the eval recipes compare the teacher with exactly the trained outputs."""
    monkeypatch.setenv(train_cli._LAUNCHED, "1")
    base = RECIPES / folder
    collect, collect_code = parse(base / "collect.yaml"), parse(base / "collect_code.yaml")
    assert collect.model_name_or_path == collect_code.model_name_or_path
    assert collect.block_length == collect_code.block_length
    outputs = {}
    for path in RECIPE_FILES["train"]:
        if path.parent.name != folder:
            continue
        model, data, args = parse(path)
        assert model.model_name_or_path == collect.model_name_or_path
        if args.loss_type == "mdlm":  # the folder prepare_sft_data.py is told to write
            assert data.dataset_name == f"data/{folder}/sft-bs17k"
        else:
            assert data.dataset_name == collect.output_dir
            assert args.block_length in (None, collect.block_length)  # trajectory states exist only for it
            assert collect.block_length % args.tokens_per_step == 0
        outputs[path.stem] = args.output_dir
    for name, code in (("eval.yaml", False), ("eval_code.yaml", True)):
        models, _, settings = parse(base / name)
        assert models.pop("original") == collect.model_name_or_path
        for objective, model_path in models.items():  # code students: the documented --output_dir ...-code
            suffix = "-code" if code and objective != "sft" else ""
            assert model_path == outputs[objective] + suffix
        assert collect.block_length in settings["block_lengths"]


DOC_PAGES = ("getting_started.md", "cli.md", "recipes.md", "reproducing.md")
DOC_VARIABLES = {"objective": "t3d", "lam": "0.05", "MACHINE_RANK": "0"}  # the docs' shell loop variables


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(page, argv)`` of every ``t3d-trl collect|train|eval`` command in the shell blocks of the docs, launched
    directly or through ``accelerate launch ... -m t3d_trl.cli.main``."""
    commands = []
    for page in DOC_PAGES:
        for block in re.findall(r"```bash\n(.*?)```", (REPO / "docs" / page).read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\$(\w+)", lambda m: DOC_VARIABLES[m.group(1)], line)
                words = shlex.split(line, comments=True)
                for i, word in enumerate(words[:-1]):
                    if word in ("t3d-trl", "t3d_trl.cli.main") and words[i + 1] in RECIPE_FILES:
                        commands.append((page, words[i + 1 :]))
    return commands


def test_documented_recipe_commands_parse(parse, capsys):
    """The collect/train/eval commands of the user docs are real: each parses with the shipped recipes."""
    commands = documented_commands()
    assert {page for page, _ in commands} == set(DOC_PAGES) and len(commands) > 20
    for page, argv in commands:
        parse.captured.clear()
        assert main(argv) == 0, (page, argv, capsys.readouterr().err)
        assert parse.captured, (page, argv)  # got as far as the work (or the relaunch)


# ------------------------------------------------------------------------------------------ accelerate configs
ACCELERATE_CONFIGS = sorted(ACCELERATE.glob("*.yaml"))


def unknown_nested_keys(config) -> list[str]:
    """Keys of ``deepspeed_config``/``fsdp_config`` that ``accelerate launch`` has no option for (it would copy
    them onto its arguments silently)."""
    from accelerate.commands.launch import launch_command_parser

    options = {action.dest for action in launch_command_parser()._actions}
    nested = list(config.deepspeed_config or {}) + [
        key if key.startswith("fsdp_") else f"fsdp_{key}" for key in config.fsdp_config or {}
    ]
    return [key for key in nested if key not in options]


def test_accelerate_configs_cover_ddp_zero_and_fsdp():
    assert [p.stem for p in ACCELERATE_CONFIGS] == ["ddp", "fsdp", "zero1", "zero2", "zero3"]


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=[p.stem for p in ACCELERATE_CONFIGS])
def test_accelerate_configs_load_with_accelerate(path, tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    config = ClusterConfig.from_yaml_file(str(path))  # unknown top-level keys raise
    assert unknown_nested_keys(config) == []
    assert (config.num_machines, config.num_processes, config.mixed_precision) == (1, 8, "bf16")
    argv = ["--config_file", str(path), "-m", "t3d_trl.cli.main", "train"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    kind = (args.multi_gpu, args.use_deepspeed, args.use_fsdp)
    if path.stem == "ddp":
        assert kind == (True, False, False)
    elif path.stem == "fsdp":
        assert kind == (False, False, True)
        env = prepare_multi_gpu_env(args)
        assert (env["FSDP_VERSION"], env["FSDP_AUTO_WRAP_POLICY"]) == ("2", "TRANSFORMER_BASED_WRAP")
        assert env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    else:
        assert kind == (False, True, False)
        names = {f.name for f in dataclasses.fields(DeepSpeedPlugin)}
        plugin = DeepSpeedPlugin(**{k: v for k, v in config.deepspeed_config.items() if k in names})
        ds = plugin.deepspeed_config
        assert ds["zero_optimization"]["stage"] == int(path.stem[-1])
        # Batch, accumulation and clipping are left to the recipe (a fixed value here would have to match it).
        assert (ds["gradient_accumulation_steps"], ds["gradient_clipping"]) == ("auto", "auto")

    bad = tmp_path / path.name
    bad.write_text(path.read_text() + "num_gpus: 8\n")
    with pytest.raises(ValueError, match="num_gpus"):
        ClusterConfig.from_yaml_file(str(bad))
    if config.deepspeed_config or config.fsdp_config:
        nested = "deepspeed_config" if config.deepspeed_config else "fsdp_config"
        values = yaml.safe_load(path.read_text())
        values[nested]["zero_stages"] = 1
        bad.write_text(yaml.safe_dump(values))
        assert unknown_nested_keys(ClusterConfig.from_yaml_file(str(bad))) == [
            "zero_stages" if nested == "deepspeed_config" else "fsdp_zero_stages"
        ]


# ------------------------------------------------------------------------------------- tiny pipeline runs
PIPELINES = {"sdar-4b-chat": build_block_causal_model, "llada-8b-instruct": build_bidirectional_model}
PROBLEMS = ["1+1", "2*3 = ?", "7-4", "9/3"]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_prepare_sft_data_renders_prompts_and_drops_long_rows(prepare_script):
    tokenizer = build_tokenizer()
    rows = [{"question": "2+2?", "qwen7b_answer": "4"}, {"question": "long", "qwen7b_answer": "x" * 100}]
    prepared = prepare_script.to_prompt_completion(datasets.Dataset.from_list(rows), tokenizer, max_length=40)
    # the chat template around the question; the 100-token answer is over max_length
    assert prepared.to_list() == [{"prompt": "[BOS]<user>2+2?\n<assistant>", "completion": "4"}]
    with pytest.raises(ValueError, match="'answer'"):
        prepare_script.to_prompt_completion(prepared, tokenizer, "prompt", "answer")


def test_prepare_sft_data_counts_the_bos_a_raw_prompt_trains_with(prepare_script):
    """Without a chat template the prompt stays raw text, which training tokenises with the tokenizer's BOS:
    a row that fits only without it is dropped (it would exceed max_length once trained on)."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", tokenizer.bos_token_id)]
    )
    rows = [{"question": "abcd", "qwen7b_answer": "xyz"}, {"question": "abc", "qwen7b_answer": "xyz"}]
    prepared = prepare_script.to_prompt_completion(datasets.Dataset.from_list(rows), tokenizer, max_length=8)
    assert prepared["prompt"] == ["abc"]  # BOS + 3 + 3 + EOS = 8; "abcd" makes 9


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("folder", list(PIPELINES))
def test_tiny_copies_of_every_stage_run(folder, tmp_path, benchmark_files, prepare_script, capsys):
    """Each recipe of the folder runs through ``t3d-trl`` with only its model/data/output paths pointed at tiny
    local artifacts, its lengths scaled down, and the run made short and single-process."""
    base = RECIPES / folder
    tokenizer = build_tokenizer()
    teacher = tmp_path / "teacher"
    PIPELINES[folder](tokenizer, max_position_embeddings=1024).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    collect = yaml.safe_load((base / "collect.yaml").read_text())
    new_tokens = 2 * collect["block_length"] if folder.startswith("sdar") else collect["block_length"]

    # collect.yaml and collect_code.yaml
    trajectories = {}
    for name in ("collect", "collect_code"):
        source = write_jsonl(tmp_path / f"{name}.jsonl", [{"question": p} for p in PROBLEMS])
        trajectories[name] = tmp_path / f"{name}-out"
        tiny = f"--model_name_or_path {teacher} --dataset_name {source} --output_dir {trajectories[name]}"
        tiny += f" --max_new_tokens {new_tokens}"
        assert main(["collect", "--config", str(base / f"{name}.yaml"), *tiny.split()]) == 0
        dataset = load_trajectories(str(trajectories[name]))
        metadata = TrajectoryMetadata.from_dataset(dataset)
        assert len(dataset) == len(PROBLEMS)
        assert (metadata.block_length, metadata.steps_per_block) == (collect["block_length"],) * 2
        template = PROMPT_TEMPLATES["code" if name == "collect_code" else "math"]
        assert template.split("{problem}")[1][:20] in dataset[0]["prompt"]

    # the SFT data, prepared as the sft recipe says
    sft_source = write_jsonl(
        tmp_path / "bs17k.jsonl", [{"question": p, "qwen7b_answer": "4"} for p in PROBLEMS]
    )
    sft_data = tmp_path / "sft-data"
    assert (
        prepare_script.main(f"--tokenizer {teacher} --dataset {sft_source} --output {sft_data}".split()) == 0
    )

    # every train recipe on the math trajectories, plus t3d on the code ones (the documented override)
    outputs = {}
    runs = [(p.stem, p.stem, trajectories["collect"]) for p in RECIPE_FILES["train"] if p.parent == base]
    runs.append(("t3d", "t3d-code", trajectories["collect_code"]))
    for stem, name, data in runs:
        outputs[name] = tmp_path / "outputs" / name
        tiny = [
            "--model_name_or_path", str(teacher),
            "--dataset_name", str(sft_data if stem == "sft" else data),
            "--output_dir", str(outputs[name]),
            "--accelerate_config", "",  # one process here (the multi-process path has its own test)
            "--use_cpu", "true",
            "--max_steps", "2",
            "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "1",
            "--save_strategy", "no",
            "--disable_tqdm", "true",
        ]  # fmt: skip
        assert main(["train", "--config", str(base / f"{stem}.yaml"), *tiny]) == 0
        state = json.loads((outputs[name] / "trainer_state.json").read_text())
        assert state["global_step"] == 2
        recipe = yaml.safe_load((base / f"{stem}.yaml").read_text())
        if stem != "sft":  # the student samples with the budget it was trained for
            saved = json.loads((outputs[name] / "config.json").read_text())["diffusion_generation"]
            generation = DiffusionGenerationConfig.from_dict(saved)
            assert generation.block_length == collect["block_length"]
            assert generation.tokens_per_step == recipe["tokens_per_step"]

    # eval.yaml and eval_code.yaml: the recipe's grid and benchmarks, the baseline against the T3D student
    data_files = [f"{name}={path}" for name, path in benchmark_files.items()]
    for name, t3d in (("eval", outputs["t3d"]), ("eval_code", outputs["t3d-code"])):
        recipe = yaml.safe_load((base / f"{name}.yaml").read_text())
        out = tmp_path / name
        tiny = f"--models original={teacher} t3d={t3d} --output_dir {out} --limit 1 --batch_size 1"
        tiny += f" --max_new_tokens {max(recipe['block_lengths'])} --data_files {' '.join(data_files)}"
        assert main(["eval", "--config", str(base / f"{name}.yaml"), *tiny.split()]) == 0
        results = json.loads((out / "results.json").read_text())["results"]
        expected = runner.grid_settings(
            recipe["block_lengths"], recipe["tokens_per_step"], recipe.get("thresholds", [])
        )
        names = {b: get_benchmark(b).name for b in recipe["benchmarks"]}
        assert sorted((e["model"], e["benchmark"], e["setting"]["label"]) for e in results) == sorted(
            (model, names[b], s.label)
            for model in ("original", "t3d")
            for b in recipe["benchmarks"]
            for s in expected
        )
        assert all(e["generation_config"]["temperature"] == recipe["temperature"] for e in results)
        assert (out / "table.md").is_file()
    assert "results, samples, table.md and plots written" in capsys.readouterr().out
