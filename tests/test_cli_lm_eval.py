"""``t3d-trl lm-eval``: task YAMLs read their local data files relative to themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from t3d_trl.cli.lm_eval import _resolve_data_files, data_files_relative_to_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tests" / "data" / "lm_eval"


def test_relative_data_files_resolve_against_the_yaml_folder():
    resolved = _resolve_data_files({"test": "demo_sort2.jsonl", "hub": "hf://x/y.json"}, TASKS)
    assert resolved == {"test": str(TASKS / "demo_sort2.jsonl"), "hub": "hf://x/y.json"}
    assert _resolve_data_files(["tiny.jsonl"], TASKS) == [str(TASKS / "tiny.jsonl")]
    assert _resolve_data_files("missing.jsonl", TASKS) == "missing.jsonl"  # left to lm_eval to report
    # A glob that matches next to the YAML is read there too (it used to resolve against the working folder).
    assert _resolve_data_files("tin*.jsonl", TASKS) == str(TASKS / "tin*.jsonl")
    assert _resolve_data_files("nothing*.jsonl", TASKS) == "nothing*.jsonl"


@pytest.mark.slow  # lm_eval builds its task index
def test_tasks_built_from_another_folder_read_the_yaml_s_data(tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.chdir(tmp_path)  # not the YAML's folder: lm_eval alone would look for ./demo_sort2.jsonl
    with data_files_relative_to_yaml():
        tasks = TaskManager(include_path=str(TASKS)).load_task_or_group(["t3d_demo_sort2"])
    (task,) = tasks.values() if isinstance(tasks, dict) else tasks
    assert len(task.dataset["test"]) == 16


def test_evaluation_md_documents_the_command_for_the_example_tasks():
    text = (REPO / "docs" / "evaluation.md").read_text()
    command = re.search(
        r"t3d-trl lm-eval --model t3d \\\n.*?--include_path tests/data/lm_eval[^\n]*", text, re.S
    )
    assert command and "t3d_demo_sort2" in command.group(0)


def test_help_lists_every_decoding_field_as_a_model_argument(capsys):
    from t3d_trl.cli.decoding import decoding_fields
    from t3d_trl.cli.main import main

    assert main(["lm-eval", "--help"]) == 0
    out = capsys.readouterr().out
    listed = out[out.index("model arguments of --model t3d") :]
    for f in decoding_fields():
        assert f.name in listed, f.name
    assert "eos_token_id takes one id" in listed
