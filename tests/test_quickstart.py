"""The CPU demo (``t3d-trl quickstart``) end to end in its ``--fast`` variant."""

from __future__ import annotations

import json

import pytest

from t3d_trl.cli.main import main
from t3d_trl.cli.parsing import parse_recipe
from t3d_trl.demo.quickstart import QuickstartConfig


@pytest.mark.slow
def test_quickstart_fast_runs_every_stage(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["quickstart", "--fast", "--output_dir", str(out), "--methods", "t3d", "td", "--threads", "1"]
    (out / "eval" / "samples" / "old-student").mkdir(parents=True)  # an earlier run's rows: not this run's
    assert main(argv) == 0
    assert not (out / "eval" / "samples" / "old-student").exists()
    printed = capsys.readouterr().out
    assert "| teacher |" in printed and "| t3d |" in printed and "| td |" in printed
    assert "--fast is a smoke run of every stage, not a distillation" in printed  # says what a small run does
    results = json.loads((out / "results.json").read_text())
    assert set(results["accuracy"]) == {"teacher", "t3d", "td"}
    labels = {"block8-tokps1", "block8-tokps2", "block8-tokps4", "block8-threshold0.9"}
    for accuracy in results["accuracy"].values():
        assert set(accuracy) == labels
        assert all(0.0 <= value <= 1.0 for value in accuracy.values())
    assert set(results["total_correlation_by_jump"]) == {"teacher", "t3d", "td"}
    # Every stage left its artefacts: trajectories, students, evaluation table and plots, TC figures.
    for path in ("trajectories", "t3d/config.json", "td/config.json", "eval/table.md", "tc_heatmap.png"):
        assert (out / path).exists(), path
    assert results["num_trajectories"] == 256


def test_quickstart_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["quickstart", "--help"])
    text = capsys.readouterr().out
    for name in QuickstartConfig.__dataclass_fields__:
        assert f"--{name}" in text, name


def test_fast_shrinks_only_the_budgets_left_at_their_defaults():
    fast = QuickstartConfig(fast=True, distill_steps=12)
    assert fast.distill_steps == 12  # given explicitly: kept (it was cut to 4 silently)
    assert (fast.num_trajectories, fast.num_eval, fast.teacher_steps) == (256, 64, 20)
    assert QuickstartConfig(fast=True).distill_steps == 4
    # A budget given equal to its default is given too (it was taken for "not set" and cut).
    given = QuickstartConfig(fast=True, distill_steps=400, num_eval=1000)
    assert (given.distill_steps, given.num_eval, given.batch_size) == (400, 1000, 64)
    assert (QuickstartConfig().distill_steps, QuickstartConfig().num_eval) == (400, 1000)
    # The same from the command line.
    parsed = parse_recipe([QuickstartConfig], ["--fast", "--distill_steps", "400"], "quickstart", "")[0]
    assert (parsed.distill_steps, parsed.num_eval) == (400, 64)
    # A budget of 0 is refused before any work (it failed after the teacher, collection and distillation ran).
    for name in ("distill_steps", "num_eval", "analysis_samples", "analysis_prompts", "num_trajectories"):
        with pytest.raises(ValueError, match=f"{name} must be a positive number, got 0"):
            QuickstartConfig(fast=True, **{name: 0})


def test_quickstart_rejects_unknown_methods_and_budgets_before_any_work():
    with pytest.raises(ValueError, match=r"unknown methods \['sft'\]"):
        QuickstartConfig(methods=["t3d", "sft"])
    # Found only by the final table before, after every stage had run.
    with pytest.raises(
        ValueError, match=r"eval_tokens_per_step \[3\]: each must divide the sort2 task's block"
    ):
        QuickstartConfig(eval_tokens_per_step=[1, 3])
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\], got 2"):
        QuickstartConfig(threshold=2.0)
    with pytest.raises(ValueError, match="give a teacher or train_teacher, not both"):
        QuickstartConfig(teacher="my-teacher", train_teacher=True)


def test_a_teacher_given_by_a_relative_path_is_recorded_absolute(tmp_path, monkeypatch):
    # results.json names the teacher for the playground and readers, who run from other folders.
    from t3d_trl.demo import get_task
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS, load_teacher

    monkeypatch.chdir(PACKAGED_TEACHERS)
    _, recorded = load_teacher(get_task("sort2"), QuickstartConfig(teacher="sort2"), tmp_path)
    assert recorded == str(PACKAGED_TEACHERS.resolve() / "sort2")


def test_collect_samples_trajectories_at_the_configured_temperature(tmp_path):
    """``trajectory_temperature`` reaches the teacher's decoding: sampled trajectories are reproducible for a seed,
    differ from the greedy ones, and the dataset and its collection manifest record the temperature."""
    import dataclasses

    from t3d_trl.data.schema import TrajectoryMetadata
    from t3d_trl.data.shards import MANIFEST
    from t3d_trl.demo.quickstart import collect
    from t3d_trl.demo.tasks import build_teacher, get_task

    task = get_task("sort2")
    # An untrained teacher is near-uniform over 22 tokens: sampling at T=1 cannot follow its argmax on 64 tokens.
    teacher = build_teacher(
        task, seed=0, hidden_size=32, intermediate_size=64, head_dim=8, num_hidden_layers=1
    )
    rows = task.sample(8, seed=0)
    greedy = QuickstartConfig(num_trajectories=8, seed=0)
    assert greedy.trajectory_temperature == 0.0  # the default stays greedy
    sampled = dataclasses.replace(greedy, trajectory_temperature=1.0)

    def trajectories(config, name):
        dataset = collect(teacher.eval(), task, rows, config, tmp_path / name)
        return dataset, [(row["completion_ids"], row["decode_step"]) for row in dataset]

    greedy_set, greedy_rows = trajectories(greedy, "greedy")
    sampled_set, sampled_rows = trajectories(sampled, "sampled")
    assert trajectories(sampled, "again")[1] == sampled_rows  # the same seed, the same samples
    assert trajectories(dataclasses.replace(sampled, seed=1), "other-seed")[1] != sampled_rows
    assert trajectories(greedy, "greedy-again")[1] == greedy_rows
    differing = sum(g[0] != s[0] for g, s in zip(greedy_rows, sampled_rows))
    assert differing == len(rows)
    assert TrajectoryMetadata.from_dataset(greedy_set).temperature == 0.0
    assert TrajectoryMetadata.from_dataset(sampled_set).temperature == 1.0
    manifest = json.loads((tmp_path / "sampled" / "trajectories" / MANIFEST).read_text())
    assert manifest["metadata"]["temperature"] == manifest["generation_config"]["temperature"] == 1.0


def test_quickstart_parser_takes_the_trajectory_temperature():
    from t3d_trl.cli.parsing import parse_recipe

    argv = ["--trajectory_temperature", "0.1"]
    (config,) = parse_recipe([QuickstartConfig], argv, prog="t3d-trl quickstart", description="")
    assert config.trajectory_temperature == 0.1


@pytest.mark.slow
def test_packaged_teacher_tc_rises_with_the_jump(tmp_path):
    """The paper's Figure 2 claim on the demo teacher: factorization error grows with the decoding interval."""
    from t3d_trl.analysis import TotalCorrelationConfig, total_correlation
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS, collect
    from t3d_trl.demo.tasks import get_task
    from t3d_trl.models.auto import AutoModelForDiffusionLM

    task = get_task("sort2")
    teacher = AutoModelForDiffusionLM.from_pretrained(PACKAGED_TEACHERS / "sort2").eval()
    config = QuickstartConfig(num_trajectories=48, seed=0)
    trajectories = collect(teacher, task, task.sample(48, seed=0), config, tmp_path)
    result = total_correlation(
        teacher, trajectories, config=TotalCorrelationConfig(num_samples=8, seed=0), progress=False
    )
    tc = {row["jump"]: row["tc"] for row in result.by_jump}
    assert tc[1] == 0.0  # one token per step: nothing to factorize
    assert tc[2] < tc[4] < tc[8]
    assert tc[8] > 1.0  # a one-step jump over the whole block mixes the two sorting orders


def test_settings_are_checked_before_the_teacher_and_duplicates_refused(tmp_path, monkeypatch):
    import t3d_trl.demo.quickstart as quickstart

    for settings, message in (
        ({"methods": ["t3d", "t3d"]}, r"methods \['t3d', 't3d'\] names one value twice"),
        ({"eval_tokens_per_step": [2, 2]}, "eval_tokens_per_step .* names one value twice"),
        ({"threads": 0}, "threads must be a positive number"),
    ):
        with pytest.raises(ValueError, match=message):
            QuickstartConfig(**settings)
    # A distillation setting T3DConfig refuses used to fail after the teacher (and earlier students) trained.
    monkeypatch.setattr(quickstart, "load_teacher", lambda *a: pytest.fail("the teacher stage ran"))
    with pytest.raises(ValueError, match="beta"):
        quickstart.run_quickstart(
            QuickstartConfig(fast=True, methods=["td", "t3d"], beta=-1.0, output_dir=str(tmp_path))
        )


def test_a_rerun_replaces_only_what_the_demo_wrote(tmp_path, caplog):
    import logging

    from t3d_trl.demo.quickstart import RUN_RECORD, _claim_output

    # A folder holding a model the demo did not write is refused (it was deleted with a warning).
    (tmp_path / "mine" / "t3d").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=r"holds \['t3d'\] but no earlier quickstart run"):
        _claim_output(QuickstartConfig(methods=["t3d"]), tmp_path / "mine")
    # The demo's own folder: trajectories of another seed are collected again, not refused after the teacher.
    out = tmp_path / "demo"
    out.mkdir()
    _claim_output(QuickstartConfig(fast=True), out)
    (out / "trajectories").mkdir()
    _claim_output(QuickstartConfig(fast=True, distill_steps=8), out)  # the students' settings keep them
    assert json.loads((out / RUN_RECORD).read_text())["seed"] == 0 and (out / "trajectories").exists()
    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        _claim_output(QuickstartConfig(fast=True, seed=1), out)
    assert not (out / "trajectories").exists() and "['seed'] changed since the last run" in caplog.text


def test_a_teacher_of_another_task_is_refused(tmp_path):
    from t3d_trl.demo import get_task
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS, load_teacher

    config = QuickstartConfig(teacher=str(PACKAGED_TEACHERS / "wordsort"))
    with pytest.raises(ValueError, match="has another vocabulary than the sort2 task's"):
        load_teacher(get_task("sort2"), config, tmp_path)


def test_one_yaml_value_of_a_list_option_is_a_list(tmp_path):
    recipe = tmp_path / "quickstart.yaml"
    recipe.write_text("methods: td\neval_tokens_per_step: 2\n")
    (config,) = parse_recipe([QuickstartConfig], ["--config", str(recipe)], "quickstart", "")
    assert config.methods == ["td"] and config.eval_tokens_per_step == [2]  # ['t', 'd'] and a traceback


def test_ctrl_c_stops_the_quickstart_with_one_line(monkeypatch, capsys):
    import t3d_trl.demo.quickstart as quickstart

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(quickstart, "run_quickstart", interrupted)
    assert main(["quickstart", "--fast"]) == 130
    err = capsys.readouterr().err
    assert "t3d-trl quickstart: interrupted; rerun the same command" in err and "Traceback" not in err
