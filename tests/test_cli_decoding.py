"""One definition of every decoding option: the parsers, the recipes and docs/cli.md follow the dataclass."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
import yaml

from t3d_trl.cli import reference
from t3d_trl.cli.decoding import decoding_fields, flag_type
from t3d_trl.cli.parsing import ArgumentParser, RecipeError, build_recipe_parser, docstring_help, parse_recipe
from t3d_trl.generation.configuration import OUTPUT_FIELDS, DiffusionGenerationConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
# eval takes these budgets as the grid's lists, under these flags.
EVAL_GRID = {"block_length": "--block_length", "tokens_per_step": "--tokens_per_step"}
EVAL_GRID |= {"threshold": "--threshold", "steps": "--steps"}


def _parsers():
    from t3d_trl.cli.collect import CollectConfig
    from t3d_trl.cli.eval import EvalConfig
    from t3d_trl.cli.generate import build_parser

    return {
        "generate": build_parser(),
        "collect": build_recipe_parser([CollectConfig], prog="t3d-trl collect"),
        "eval": build_recipe_parser([EvalConfig], prog="t3d-trl eval"),
    }


def _flags(parser) -> dict[str, object]:
    return {o: a for a in parser._actions for o in a.option_strings if a.help != "==SUPPRESS=="}


def test_every_decoding_field_is_a_flag_of_every_command_with_its_choices_and_help():
    names = [f.name for f in decoding_fields()]
    assert set(OUTPUT_FIELDS).isdisjoint(names) and {"top_k", "stop_at_eos", "cache_implementation"} <= set(
        names
    )
    helps = docstring_help(DiffusionGenerationConfig)
    for command, parser in _parsers().items():
        flags = _flags(parser)
        for name in names:
            flag = EVAL_GRID.get(name, f"--{name}") if command == "eval" else f"--{name}"
            assert flag in flags, (command, flag)
            action = flags[flag]
            kind = flag_type(name)
            if typing.get_origin(kind) is typing.Literal and not (command == "eval" and name in EVAL_GRID):
                assert tuple(action.choices) == typing.get_args(kind), (command, name)
            if command != "eval" or name not in EVAL_GRID:
                assert action.help.startswith(helps[name]), (command, name)
        for name in OUTPUT_FIELDS:
            assert f"--{name}" not in flags, (command, name)


def test_docs_cli_md_agrees_with_the_parsers_and_the_dataclass():
    text = DOC.read_text()
    # The decoding table is exactly what the dataclass generates (python -m t3d_trl.cli.reference docs/cli.md).
    assert reference.generated_block() in text
    for f in decoding_fields():
        assert f"| `--{f.name}` |" in text
    # Every option of every parser is named on the page.
    named = set(re.findall(r"`(--[a-z_]+)", text))
    for command, parser in _parsers().items():
        missing = {f for f in _flags(parser) if f.startswith("--") and "-" not in f[2:] and f not in named}
        assert not missing - {"--help"}, (command, sorted(missing))


def test_a_new_field_reaches_every_parser_and_fails_the_doc_check(monkeypatch):
    # The generator is the only list: a field added to the dataclass shows up everywhere, and the doc test
    # catches a page that was not regenerated.
    from t3d_trl.cli import decoding

    extra = [*decoding_fields(), type("F", (), {"name": "seed_of_noise", "default": 0})()]
    monkeypatch.setattr(decoding, "decoding_fields", lambda: extra)
    monkeypatch.setattr(reference, "decoding_fields", lambda: extra)
    monkeypatch.setattr(
        decoding, "flag_type", lambda name: int if name == "seed_of_noise" else flag_type(name)
    )
    monkeypatch.setattr(reference, "flag_type", decoding.flag_type)
    parser = ArgumentParser()
    decoding.add_decoding_arguments(parser)
    assert parser.parse_args(["--seed_of_noise", "3"]).seed_of_noise == 3
    assert reference.generated_block() not in DOC.read_text()


def test_generate_sets_every_decoding_field_under_its_own_name():
    from t3d_trl.cli.decoding import decoding_overrides
    from t3d_trl.cli.generate import build_parser

    argv = ["--model", "m", "--prompt", "p", "--top_k", "5", "--top_p", "0.5", "--stop_at_eos", "false"]
    argv += ["--dynamic_rule", "threshold_topup", "--steps", "8", "--eos_token_id", "3", "4"]
    argv += ["--use_cache", "false", "--cache_implementation", "dual", "--schedule", "dream"]
    overrides = decoding_overrides(build_parser().parse_args(argv))
    assert overrides == {
        "top_k": 5,
        "top_p": 0.5,
        "stop_at_eos": False,
        "dynamic_rule": "threshold_topup",
        "steps": 8,
        "eos_token_id": [3, 4],
        "use_cache": False,
        "cache_implementation": "dual",
        "schedule": "dream",
    }
    config = DiffusionGenerationConfig(tokens_per_step=2).update(**overrides)
    assert (config.steps, config.tokens_per_step, config.approximate_cache) == (8, None, None)
    # `none` clears a saved value: a model saved with a threshold decodes statically (there was no way to).
    cleared = decoding_overrides(
        build_parser().parse_args(["--model", "m", "--prompt", "p", "--threshold", "none", "--top_k", "None"])
    )
    assert cleared == {"threshold": None, "top_k": None}
    saved = DiffusionGenerationConfig(threshold=0.9, top_k=3)
    assert (saved.update(**cleared).threshold, saved.update(**cleared).top_k) == (None, None)
    assert decoding_overrides(
        build_parser().parse_args(["--model", "m", "--prompt", "p", "--threshold", "0.5"])
    ) == {"threshold": 0.5}
    with pytest.raises(RecipeError, match="invalid float value: 'high'"):
        build_parser().parse_args(["--model", "m", "--prompt", "p", "--threshold", "high"])


def test_eval_recipe_and_flags_set_every_decoding_field(tmp_path):
    from t3d_trl.cli.eval import EvalConfig

    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({"models": ["m"], "top_k": 3, "cache": "dual", "block_length": [4, 8]}))
    argv = ["--config", str(recipe), "--stop_at_eos", "false", "--dynamic_rule", "threshold_topup"]
    argv += ["--threshold", "0.9", "--steps", "8"]
    (config,) = parse_recipe([EvalConfig], argv, prog="t3d-trl eval", description="")
    assert config.generation_kwargs() == {
        "top_k": 3,
        "cache": "dual",
        "stop_at_eos": False,
        "dynamic_rule": "threshold_topup",
    }
    assert (config.block_lengths, config.thresholds, config.steps, config.tokens_per_step) == (
        [4, 8],
        [0.9],
        [8],
        [],
    )


def test_collect_recipe_reads_the_old_cache_spelling(tmp_path):
    from t3d_trl.cli.collect import CollectConfig

    recipe = tmp_path / "collect.yaml"
    values = {"model_name_or_path": "m", "dataset_name": "d.jsonl", "output_dir": "o", "cache": "prefix"}
    recipe.write_text(yaml.safe_dump(values))
    (config,) = parse_recipe(
        [CollectConfig], ["--config", str(recipe)], prog="t3d-trl collect", description=""
    )
    assert config.generation_config().cache_implementation == "prefix"
    (config,) = parse_recipe(
        [CollectConfig], ["--config", str(recipe), "--cache", "none"], prog="t3d-trl collect", description=""
    )
    assert config.generation_config().approximate_cache is None


def test_cache_folds_into_use_cache_and_cache_implementation():
    assert DiffusionGenerationConfig(cache="dual").cache_implementation == "dual"
    assert DiffusionGenerationConfig(cache="none").cache_implementation is None
    assert DiffusionGenerationConfig(cache_implementation="prefix", use_cache=False).approximate_cache is None
    saved = DiffusionGenerationConfig.from_dict(
        {"cache": "prefix", "max_new_tokens": 8}
    )  # a config saved before
    assert saved.cache_implementation == "prefix" and "cache" not in saved.to_dict()
    assert saved.update(cache="none").cache_implementation is None
    # Asking for an approximate cache turns a saved use_cache=False on (it was ignored without a word).
    off = DiffusionGenerationConfig(use_cache=False)
    assert off.update(cache_implementation="dual").approximate_cache == "dual"
    assert off.update(cache="prefix").approximate_cache == "prefix"
    assert off.update(cache_implementation="dual", use_cache=False).approximate_cache is None
    assert off.update(cache="none").use_cache is False
    with pytest.raises(ValueError, match="disagree"):
        DiffusionGenerationConfig(cache="prefix", cache_implementation="dual")
    with pytest.raises(ValueError, match="block-causal models decode with their exact block cache"):
        DiffusionGenerationConfig(cache_implementation="dual").check_model(is_block_causal=True)
    with pytest.raises(ValueError, match="encoder MLM"):
        DiffusionGenerationConfig(cache_implementation="dual").check_model(False, is_decoder=False)
    DiffusionGenerationConfig(use_cache=True).check_model(is_block_causal=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_new_token", "8"], "unknown flag --max_new_token; did you mean --max_new_tokens?"),
        (["--temprature", "0.5"], "unknown flag --temprature; did you mean --temperature?"),
        (["--cache_implementation", "full"], "invalid choice: 'full'"),
    ],
)
def test_generate_flags_are_never_abbreviated_and_errors_name_the_closest(argv, message, capsys):
    from t3d_trl.cli.main import main

    assert main(["generate", "--model", "m", "--prompt", "p", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("t3d-trl generate: ") and message in err and err.count("\n") == 1


def test_recipe_keys_and_flags_name_the_closest(tmp_path):
    from t3d_trl.cli.eval import EvalConfig

    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump({"models": ["m"], "temprature": 0.5}))
    with pytest.raises(
        RecipeError, match="unknown key 'temprature' in the recipe; did you mean temperature?"
    ):
        parse_recipe([EvalConfig], ["--config", str(recipe)], prog="t3d-trl eval", description="")
    with pytest.raises(RecipeError, match="unknown flag --benchmark; did you mean --benchmarks?"):
        parse_recipe(
            [EvalConfig], ["--models", "m", "--benchmark", "gsm8k"], prog="t3d-trl eval", description=""
        )


def test_compile_flag_reaches_every_command(tmp_path):
    from t3d_trl.cli.collect import CollectConfig
    from t3d_trl.cli.decoding import decoding_overrides
    from t3d_trl.cli.eval import EvalConfig
    from t3d_trl.cli.generate import build_parser

    args = build_parser().parse_args(["--model", "m", "--prompt", "p", "--compile", "reduce-overhead"])
    assert decoding_overrides(args)["compile"] == "reduce-overhead"
    argv = ["--models", "m", "--compile", "default"]
    (config,) = parse_recipe([EvalConfig], argv, prog="t3d-trl eval", description="")
    assert config.generation_kwargs() == {"compile": "default"}
    argv = [
        "--model_name_or_path",
        "m",
        "--dataset_name",
        "d",
        "--output_dir",
        str(tmp_path),
        "--compile",
        "default",
    ]
    (config,) = parse_recipe([CollectConfig], argv, prog="t3d-trl collect", description="")
    assert config.compile == "default"
    with pytest.raises((SystemExit, RecipeError), match="invalid choice: 'fast'"):
        build_parser().parse_args(["--model", "m", "--prompt", "p", "--compile", "fast"])


@pytest.mark.parametrize(
    ("argv", "full"),
    [
        (["train", "--max_step", "5"], "--max_steps"),
        (["eval", "--models", "m", "--output_di", "x"], "--output_dir"),
        (["collect", "--output_di", "x"], "--output_dir"),
        (["quickstart", "--output_di", "x"], "--output_dir"),
        (["generate", "--model", "m", "--prompt", "p", "--verbos"], "--verbose"),
        (["analyze", "--model", "m", "--trajectories", "t", "--sample", "4"], "--samples"),
        (["convert", "a", "b", "--dtyp", "bfloat16"], "--dtype"),
        (["playground", "--por", "1"], "--port"),
    ],
)
def test_no_command_takes_an_abbreviated_flag(argv, full, capsys):
    from t3d_trl.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown flag {argv[-2] if argv[-1][0] != '-' else argv[-1]}; did you mean {full}?" in err, err
    assert "Traceback" not in err
