"""The ``t3d-trl`` dispatcher: expected errors in one line with exit status 2, ``--debug``, one flag dialect."""

from __future__ import annotations

import argparse
import json
import sys

import datasets
import pyarrow.parquet as pq
import pytest

from t3d_trl.cli import main as dispatcher
from t3d_trl.cli.main import DEBUG_ENV, main
from t3d_trl.cli.parsing import build_recipe_parser, snake_case_flags

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def teacher(tmp_path, tokenizer, bidirectional_model):
    path = tmp_path / "teacher"
    bidirectional_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def one_line_error(capsys, command: str) -> str:
    """The command's stderr: exactly one line, ``t3d-trl <command>: <message>``, no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("t3d-trl ")]
    assert len(lines) == 1 and lines[0].startswith(f"t3d-trl {command}: "), err
    assert "Traceback" not in err
    return lines[0]


def collect_argv(teacher: str, data: str, output_dir: str) -> list[str]:
    return [
        "collect",
        *("--model_name_or_path", teacher, "--dataset_name", data, "--output_dir", output_dir),
        *("--prompt_template", "plain", "--max_new_tokens", "4", "--block_length", "4", "--batch_size", "1"),
    ]


def test_malformed_yaml_is_one_line_naming_the_file(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("models: [a, b\n")
    assert main(["eval", "--config", str(recipe)]) == 2
    line = one_line_error(capsys, "eval")
    assert "not valid YAML" in line and "bad.yaml" in line and "line 2" in line
    assert main(["eval", "--config"]) == 2
    assert "--config needs a recipe file" in one_line_error(capsys, "eval")


def test_data_file_errors_name_the_file(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(collect_argv("m", str(empty), str(tmp_path / "out"))) == 2
    assert f"data file '{empty}' is empty" in one_line_error(capsys, "collect")  # was StopIteration
    missing = tmp_path / "nope.jsonl"
    assert main(collect_argv("m", str(missing), str(tmp_path / "out"))) == 2
    line = one_line_error(capsys, "collect")
    assert f"data file '{missing}' does not exist" in line and "Hub" not in line
    # A truncated parquet file (a partial copy): Arrow's own error did not say which file.
    table = tmp_path / "table.parquet"
    datasets.Dataset.from_list([{"problem": "x" * 50}] * 20).to_parquet(table)
    table.write_bytes(table.read_bytes()[:-40])
    assert main(collect_argv("m", str(table), str(tmp_path / "out"))) == 2
    line = one_line_error(capsys, "collect")
    assert f"cannot read data file '{table}' as parquet" in line and "magic bytes" in line


def test_missing_model_path_is_named_not_a_hub_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--model", "./nope", "--prompt", "hi"]) == 2
    assert "model './nope': no such folder" in one_line_error(capsys, "generate")
    assert main(["generate", "--model", "nope-out", "--prompt", "hi"]) == 2  # a repo id, offline in the tests
    assert "not in the local cache" in one_line_error(capsys, "generate")
    (tmp_path / "folder").mkdir()
    assert main(["generate", "--model", "folder", "--prompt", "hi"]) == 2
    assert "folder has no config.json" in one_line_error(capsys, "generate")


def test_collection_errors_name_the_collection(teacher, tmp_path, capsys):
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"problem": p}) + "\n" for p in ["1+1", "2+2"]))
    out = tmp_path / "out"
    assert main(collect_argv(teacher, str(data), str(out))) == 0
    capsys.readouterr()

    shard = sorted((out / "shards").glob("*.parquet"))[0]
    table = pq.read_table(shard)
    foreign = table.set_column(table.column_names.index("id"), "id", [["zzz"] * table.num_rows])
    pq.write_table(foreign, shard)
    # Was KeyError: 'zzz'. A shard holding another collection's rows is named and decoded again.
    assert main(collect_argv(teacher, str(data), str(out))) == 0
    assert pq.read_table(shard).column("id").to_pylist() != ["zzz"] * table.num_rows
    capsys.readouterr()

    (out / "collection.json").write_text('{"metadata": ')
    assert main(collect_argv(teacher, str(data), str(out))) == 2  # was a JSONDecodeError without a path
    assert f"{out / 'collection.json'} is not valid JSON" in one_line_error(capsys, "collect")
    (tmp_path / "a-file").write_text("x")  # an output folder that is a file: one line, not a traceback
    assert main(collect_argv(teacher, str(data), str(tmp_path / "a-file"))) == 2
    assert "Not a directory" in one_line_error(capsys, "collect")


def test_empty_saved_dataset_in_train(teacher, tmp_path, capsys):
    import datasets

    empty = tmp_path / "empty"
    datasets.Dataset.from_dict({"prompt_ids": []}).save_to_disk(str(empty))
    argv = ["train", "--model_name_or_path", teacher, "--dataset_name", str(empty)]
    assert main([*argv, "--output_dir", str(tmp_path / "out"), "--report_to", "none"]) == 2  # was IndexError
    assert f"{empty} holds an empty dataset (0 rows)" in one_line_error(capsys, "train")


def test_debug_shows_the_traceback_and_bugs_keep_theirs(tmp_path, capsys, monkeypatch):
    argv = ["generate", "--model", str(tmp_path / "nope"), "--prompt", "hi"]
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert (
        "Traceback" in err
        and "FileNotFoundError" in err
        and err.splitlines()[-1].startswith("t3d-trl generate:")
    )
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv(DEBUG_ENV)

    class Buggy:
        @staticmethod
        def main(argv):
            raise RuntimeError("a bug")

    monkeypatch.setitem(sys.modules, "t3d_trl.cli.buggy", Buggy)
    monkeypatch.setitem(dispatcher.COMMANDS, "buggy", ("buggy", "raises a bug"))
    with pytest.raises(RuntimeError, match="a bug"):  # not an expected error: its traceback is kept
        main(["buggy"])


def test_version_flag_prints_the_version(capsys):
    import t3d_trl

    assert main(["--version"]) == 0  # was "unknown command '--version'"
    assert capsys.readouterr().out == f"t3d-trl {t3d_trl.__version__}\n"


def test_snake_case_flags():
    argv = [
        "--max-new-tokens",
        "8",
        "--no-use-chat-template",
        "--dtype=auto",
        "--top-p=0.9",
        "-",
        "a-b",
        "--x",
    ]
    assert snake_case_flags(argv) == [
        "--max_new_tokens",
        "8",
        "--no_use_chat_template",
        "--dtype=auto",
        "--top_p=0.9",
        "-",
        "a-b",
        "--x",
    ]


def recipe_types(command: str) -> list[type]:
    from t3d_trl.cli.collect import CollectConfig
    from t3d_trl.cli.eval import EvalConfig
    from t3d_trl.cli.train import TrainDataConfig, TrainModelConfig
    from t3d_trl.demo.quickstart import QuickstartConfig
    from t3d_trl.trainer import T3DConfig

    return {
        "collect": [CollectConfig],
        "train": [TrainModelConfig, TrainDataConfig, T3DConfig],
        "eval": [EvalConfig],
        "quickstart": [QuickstartConfig],
    }[command]


@pytest.mark.parametrize("command", ["collect", "train", "eval", "quickstart"])
def test_every_recipe_command_lists_config_and_helps_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--config RECIPE.yaml" in text
    parser = build_recipe_parser(recipe_types(command))
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(options) > 5
    for action in options:
        if action.help == argparse.SUPPRESS:
            assert action.option_strings[0] not in text
            continue
        assert action.option_strings[0] in text
        assert action.help, action.option_strings[0]
    if command == "collect":  # nothing that means nothing, and TrainingArguments' hub names
        assert "--return_dict_in_generate" not in text and "--output_history" not in text
        assert "--hub_model_id" in text and "--hub_private_repo" in text and "--hub_repo_id" not in text
        argv = ["collect", "--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "o"]
        assert main([*argv, "--return_dict_in_generate", "true"]) == 2
        assert "return_dict_in_generate is no setting of t3d-trl collect" in one_line_error(capsys, "collect")
    if command == "train":  # unset means on (TRL's default): --help must not print "(default: None)" for it
        help_text = " ".join(
            text.split("--activation_checkpointing [")[2]
            .split("--activation_checkpointing_kwargs")[0]
            .split()
        )
        assert "On unless set to false" in help_text and "default: None" not in help_text


def test_a_missing_column_is_a_one_line_error(teacher, tmp_path, capsys):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"question": "1+1"}\n')
    assert main(collect_argv(teacher, str(data), str(tmp_path / "out"))) == 2  # was a KeyError traceback
    line = one_line_error(capsys, "collect")
    assert "prompt_column 'problem' is not a column of the dataset" in line and "['question']" in line


def test_generate_reads_the_prompt_from_stdin_without_echos_newline(capsys, monkeypatch):
    import io

    from t3d_trl.data import prompts
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS

    seen = []
    real = prompts.format_user_message
    monkeypatch.setattr(
        prompts, "format_user_message", lambda t, row: seen.append(row["problem"]) or real(t, row)
    )
    argv = ["generate", "--model", str(PACKAGED_TEACHERS / "sort2"), "--no_use_chat_template", "--prompt"]
    assert main([*argv, "h c a f b e d g ="]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("h c a f b e d g =\n"))  # as `echo "..." |` writes it
    assert main([*argv, "-"]) == 0
    assert seen == ["h c a f b e d g ="] * 2
    capsys.readouterr()
    assert main([*argv, "x", "--device", "bogus"]) == 2  # one line, not torch's traceback
    assert "device 'bogus'" in capsys.readouterr().err
