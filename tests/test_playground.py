"""The playground in a real browser (headless Chromium through selenium), and its handlers without one."""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest
import torch
from testing_utils import free_port

from t3d_trl.data.prompts import encode_prompts
from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
from t3d_trl.evaluation.runner import load_model
from t3d_trl.playground import ColumnSpec, ModelRegistry, build_app, default_columns, default_models
from t3d_trl.playground.app import column_spec, decode_page

SORT2 = str(PACKAGED_TEACHERS / "sort2")
PROMPT = "h c a f b e d g ="


def _expected(prompt: str, **settings) -> tuple[str, int]:
    """``diffusion_generate``'s completion (cut at EOS, special tokens skipped) and NFE for the sort2 teacher."""
    model, tokenizer = load_model(SORT2, device="cpu")
    ids = torch.tensor(encode_prompts(tokenizer, [prompt])[1])
    out = model.diffusion_generate(ids, return_dict_in_generate=True, **settings)
    completion = out.sequences[0, ids.shape[1] :].tolist()
    eos = tokenizer.eos_token_id
    completion = completion[: completion.index(eos)] if eos in completion else completion
    return tokenizer.decode(completion, skip_special_tokens=True), int(out.nfe[0])


def _column_models(app) -> list[str]:
    """The model each of the page's columns starts with."""
    return [
        next(b.value for b in app.blocks.values() if getattr(b, "elem_id", None) == f"t3d-model-{i}")
        for i in range(3)
    ]


# ------------------------------------------------------------------------------------------------ handlers
def _values(*specs: ColumnSpec) -> list:
    values = []
    for spec in specs:
        values += [spec.model, spec.tokens_per_step, spec.threshold, spec.block_length, spec.max_new_tokens]
        values += [spec.cache, spec.temperature]
    return values


def test_decode_page_streams_each_column_and_names_bad_input():
    registry = ModelRegistry(default_models())
    assert registry.names == ["sort2", "wordset", "wordsort", "wordsort_bidirectional"]
    teacher, student, dynamic = default_columns(registry.names)
    assert (teacher.tokens_per_step, student.tokens_per_step, dynamic.threshold) == (1, 4, 0.9)
    frames = list(decode_page(registry, PROMPT, True, 0, _values(teacher, student)))
    # Every forward pass of every column is shown: 8 at one token per step, 2 at four.
    for column, passes in ((0, 8), (1, 2)):
        shown = [
            int(html.split('data-nfe="')[1].split('"')[0]) for _, htmls in frames for html in [htmls[column]]
        ]
        assert sorted(set(shown) - {0}) == list(range(1, passes + 1)) and shown == sorted(shown)
    for spec, html in zip((teacher, student), frames[-1][1]):
        text, nfe = _expected(PROMPT, **spec.overrides())
        assert '<div class="t3d-text"' in html and f">{text}</div>" in html
        assert f'data-done="1" data-nfe="{nfe}"' in html and html.count('class="t3d-tok"') == 8
    assert 'data-state="running"' in frames[0][0] and 'data-state="done"' in frames[-1][0]
    assert "t3d-mask" in frames[1][1][0]  # the first pass: one token committed, seven masked

    bad = [
        ColumnSpec("wordsort", cache="prefix"),  # settings a block-causal model refuses
        ColumnSpec("/no/such/model"),  # a model folder that does not exist
        ColumnSpec("sort2"),
    ]
    status, htmls = list(decode_page(registry, "a " * 70, True, 0, _values(*bad)))[-1]
    assert "block-causal models decode with their exact block cache" in htmls[0]
    assert "model &#x27;/no/such/model&#x27;: no such folder" in htmls[1]
    assert "exceeds the model&#x27;s max_position_embeddings=64" in htmls[2]  # prompt too long
    assert all('class="t3d-error"' in html for html in htmls)
    status, htmls = next(decode_page(registry, "  ", True, 0, _values(*bad)))
    assert "prompt is empty" in status and 'data-state="error"' in status and htmls == [None, None, None]
    # A public page loads only its own models.
    closed = ModelRegistry({"sort2": SORT2}, allow_paths=False)
    status, htmls = list(decode_page(closed, PROMPT, True, 0, _values(ColumnSpec(SORT2))))[-1]
    assert "is not one of this page&#x27;s models (sort2)" in htmls[0]


def test_column_specs_from_the_command_line_and_the_page():
    spec = ColumnSpec.parse("t3d:tokens_per_step=4,threshold=0.9,cache=dual")
    assert spec == ColumnSpec("t3d", tokens_per_step=4, threshold=0.9, cache="dual")
    assert spec.label == "t3d (tokens_per_step=4, threshold=0.9, cache=dual)"
    for text, message in [
        ("t3d:steps=2", "'steps=2' is not key=value with a key in"),
        ("t3d:tokens_per_step=x", "tokens_per_step must be int, got 'x'"),
        ("t3d:tokens_per_step=1,tokens_per_step=2", "tokens_per_step is given twice"),
        # The config's own checks, before the page is served: no Run could use these.
        ("sort2:cache=bogus", "cache must be one of ('none', 'prefix', 'dual'), got 'bogus'"),
        ("sort2:threshold=2", "threshold must be in (0, 1], got 2.0"),
        ("sort2:tokens_per_step=-2", "tokens_per_step must be positive, got -2"),
        ("sort2:temperature=-1", "temperature must be >= 0, got -1.0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"column {text!r}: {message}")):
            ColumnSpec.parse(text)
    # 0 is a setting: static decoding (no threshold, whatever the model saved) and greedy decoding.
    assert ColumnSpec.parse("t3d:threshold=0,temperature=0").overrides() == {
        "threshold": None,
        "temperature": 0.0,
    }
    # The page: an empty box or "(saved)" leaves a setting to the model; "(off)" turns a column off.
    assert column_spec(["sort2", 2, "", None, "8", "(saved)", None]) == ColumnSpec(
        "sort2", tokens_per_step=2, max_new_tokens=8
    )
    assert column_spec(["sort2", "", "0", "", "", "none", "0"]) == ColumnSpec(
        "sort2", threshold=0.0, cache="none", temperature=0.0
    )
    assert column_spec(["(off)", 1, None, None, None, "none", 0.0]) is None
    for values, message in [
        (["sort2", "2.5", "", "", "", "(saved)", ""], "tokens_per_step must be int, got '2.5'"),
        (["sort2", "-2", "", "", "", "(saved)", ""], "tokens_per_step must be positive, got -2"),
        (["sort2", "", "", "", "", "(saved)", "-1"], "temperature must be >= 0, got -1.0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            column_spec(values)


def test_page_zero_settings_override_saved_ones_and_negatives_fail_in_their_column():
    model, tokenizer = load_model(SORT2, device="cpu")
    # A model saved with dynamic, sampled decoding.
    model.diffusion_generation_config.update(threshold=0.9, temperature=0.8).save_to_model_config(
        model.config
    )
    registry = ModelRegistry({"dynamic": (model, tokenizer)})
    values = ["dynamic", 1, 0, None, None, "(saved)", 0]  # threshold 0: static; temperature 0: greedy
    values += ["dynamic", -2, None, None, None, "(saved)", None]
    values += ["dynamic", 1, None, None, None, "(saved)", -1]
    status, htmls = list(decode_page(registry, PROMPT, True, 0, values))[-1]
    text, nfe = _expected(PROMPT, tokens_per_step=1)  # the packaged sort2: static and greedy
    assert nfe == 8 and f'data-done="1" data-nfe="{nfe}"' in htmls[0] and f">{text}</div>" in htmls[0]
    assert "tokens_per_step must be positive, got -2" in htmls[1] and 'class="t3d-error"' in htmls[1]
    assert "temperature must be &gt;= 0, got -1.0" in htmls[2] and 'class="t3d-error"' in htmls[2]
    assert 'data-state="done"' in status


def test_quickstart_models_and_columns(tmp_path):
    import json

    with pytest.raises(FileNotFoundError, match="not the output folder of a finished quickstart run"):
        default_models(tmp_path)
    (tmp_path / "t3d").mkdir()
    (tmp_path / "t3d" / "config.json").write_text("{}")
    results = {"task": "sort2", "teacher": SORT2, "config": {"methods": ["t3d", "td"]}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    models = default_models(tmp_path)
    assert models["teacher"] == SORT2 and models["t3d"] == str(tmp_path / "t3d") and "td" not in models
    assert [c.model for c in default_columns(list(models))] == ["teacher", "t3d", "teacher"]
    # A teacher that has moved is not replaced by the packaged one (the students were not distilled from it),
    # unless the run recorded the packaged teacher of another install.
    for recorded, shown in (
        ("/gone/models/bi", "/gone/models/bi"),
        ("/old/venv/t3d_trl/demo/teachers/sort2", SORT2),
    ):
        (tmp_path / "results.json").write_text(json.dumps({**results, "teacher": recorded}))
        assert default_models(tmp_path)["teacher"] == str(shown)
    (tmp_path / "results.json").write_text(json.dumps({**results, "teacher": "/gone/models/bi"}))
    with pytest.raises(FileNotFoundError, match="model '/gone/models/bi': no such folder"):
        build_app(None, ["teacher"], quickstart_dir=tmp_path)
    # A student is shown whatever named the models (--models, a Space's variables), not only a quickstart run.
    assert [c.model for c in default_columns(["teacher", "td", "sort2"])] == ["teacher", "td", "teacher"]
    assert [c.model for c in default_columns(["sort2", "wordset"])] == ["sort2", "sort2", "sort2"]


def test_build_app_refuses_columns_the_page_cannot_run():
    with pytest.raises(
        ValueError, match=r"column 3, sort \(threshold=0.9\): model 'sort' is not one of this page"
    ):
        build_app({"sort2": SORT2}, ["sort2", "sort2", "sort:threshold=0.9"], allow_paths=False)
    with pytest.raises(ValueError, match="block_length=8 is not a multiple of tokens_per_step=3"):
        build_app({"sort2": SORT2}, [ColumnSpec("sort2", tokens_per_step=3)])
    # A budget past the model's positions would fail at every Run, whatever the prompt.
    with pytest.raises(
        ValueError, match=r"column 1, .*max_new_tokens=80 leaves no room for a prompt: .* 64 pos"
    ):
        build_app({"sort2": SORT2}, ["sort2:max_new_tokens=80"])


def test_playground_command_binds_locally_and_checks_models_first(monkeypatch, capsys):
    import gradio

    from t3d_trl.cli.main import main

    launched = {}
    monkeypatch.setattr(gradio.Blocks, "launch", lambda self, **kwargs: launched.update(kwargs))
    assert main(["playground", "--models", f"teacher={SORT2}", "--columns", "teacher:tokens_per_step=2"]) == 0
    assert launched == {"server_name": "127.0.0.1", "server_port": None, "share": False}
    assert main(["playground", "--models", "teacher=/no/such/folder"]) == 2
    assert "t3d-trl playground: model '/no/such/folder': no such folder" in capsys.readouterr().err
    assert main(["playground", "--columns", "sort2:speed=2"]) == 2
    assert "'speed=2' is not key=value" in capsys.readouterr().err
    # Whatever the page would fail on later is refused before it is served.
    launched.clear()
    for argv, message in [
        (["--columns", "nomodel:tokens_per_step=1"], "model 'nomodel': no such folder"),
        (["--columns", "sort2:cache=bogus"], "cache must be one of ('none', 'prefix', 'dual'), got 'bogus'"),
        (["--columns", "sort2:threshold=2"], "threshold must be in (0, 1], got 2.0"),
        (
            ["--columns", "sort2:tokens_per_step=3"],
            "column 1, sort2 (tokens_per_step=3): block_length=8 is not a multiple of tokens_per_step=3",
        ),
        (["--columns", "wordsort:cache=prefix"], "block-causal models decode with their exact block cache"),
        (
            ["--trajectories", "/no/such/trajectories"],
            "trajectories: '/no/such/trajectories' is no file or folder",
        ),
        (["--dtype", "float33"], "invalid choice: 'float33'"),
    ]:
        assert main(["playground", *argv]) == 2
        assert message in capsys.readouterr().err
    assert launched == {}
    # The default columns show a student of --models too.
    apps = []
    monkeypatch.setattr(gradio.Blocks, "launch", lambda self, **kwargs: apps.append(self))
    assert main(["playground", "--models", f"teacher={SORT2}", f"t3d={SORT2}"]) == 0
    assert _column_models(apps[0]) == ["teacher", "t3d", "teacher"]


def test_replay_tab_animates_a_stored_trajectory(tmp_path, tokenizer):
    from testing_utils import build_bidirectional_model, build_trajectories

    from t3d_trl.playground.app import replay_page

    teacher = build_bidirectional_model(tokenizer)
    dataset = build_trajectories(teacher, tokenizer, ["hello", "abc"], max_new_tokens=8, block_length=4)
    dataset.save_to_disk(str(tmp_path / "traj"))
    tokenizer.save_pretrained(tmp_path / "tok")
    frames = list(replay_page(str(tmp_path / "traj"), 1, str(tmp_path / "tok"), 0))
    row = dataset[1]
    steps = sorted(set(row["decode_step"]))
    assert len(frames) == len(steps) + 1  # one frame per stored step, then the finished row
    assert frames[0].count("t3d-mask") == len(row["completion_ids"]) - row["decode_step"].count(steps[0])
    assert f'data-done="1" data-nfe="{len(steps)}"' in frames[-1] and "t3d-mask" not in frames[-1]
    assert frames[-1].count('class="t3d-tok"') == len(row["completion_ids"])
    # Tokens sit on the colour of their stored step's rank (the pass number of the live view).
    for position, step in enumerate(row["decode_step"]):
        assert f'data-step="{steps.index(step) + 1}"' in frames[-1].split('class="t3d-tok"')[position + 1]
    assert "out of range: the dataset has 2 rows" in next(replay_page(str(tmp_path / "traj"), 5, "", 0))
    assert "t3d-error" in next(replay_page(str(tmp_path / "nope"), 0, "", 0))
    # A closed page (a Space) replays its own dataset only, whatever a request names, and without one it has
    # no replay tab.
    from t3d_trl.playground import build_app

    closed = build_app({"sort2": SORT2}, ["sort2"], trajectories=str(tmp_path / "traj"), allow_paths=False)
    (handler,) = [f.fn for f in closed.fns.values() if f.fn.__name__ == "on_replay"]
    typed = ("someone/any-dataset", 1, "someone/any-tokenizer", 0)
    own = list(replay_page(str(tmp_path / "traj"), 1, "", 0))  # the dataset's teacher's tokenizer
    assert list(handler(*typed)) == own != list(replay_page(*typed))
    bare = build_app({"sort2": SORT2}, ["sort2"], allow_paths=False)
    assert not [f for f in bare.fns.values() if f.fn.__name__ == "on_replay"]


# ------------------------------------------------------------------------------------------------ browser
def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        message = (
            "the browser test needs the system packages chromium and chromium-driver (.ci/run installs them)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)  # never skipped in CI
        pytest.skip(message)
    return chromium, driver


@pytest.fixture(scope="module")
def browser_page():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _browser_paths()
    port = free_port()
    app = build_app({"sort2": SORT2}, ["sort2:tokens_per_step=2"], seconds_per_step=0.6)
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        yield driver
    finally:
        driver.quit()
        app.close()


def _wait(driver, css: str, timeout: float = 120.0):
    """The first element matching ``css``."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        if found:
            return found[0]
        time.sleep(0.05)
    shown = {
        sel: [e.text for e in driver.find_elements(By.CSS_SELECTOR, sel)]
        for sel in ("#t3d-status", "#t3d-view-0")
    }
    raise AssertionError(f"nothing matched {css!r} within {timeout} s; the page shows {shown}")


def _run_state(driver) -> tuple[int, str | None]:
    """``(number, state)`` of the run the status shows (``(0, None)`` before the first)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        runs = driver.find_elements(By.CSS_SELECTOR, "#t3d-status .t3d-run")
        return (
            (int(runs[0].get_attribute("data-run")), runs[0].get_attribute("data-state"))
            if runs
            else (0, None)
        )
    except StaleElementReferenceException:  # redrawn while read: read again
        return _run_state(driver)


def _run(driver, prompt: str, timeout: float = 120.0) -> str:
    """Type ``prompt``, press Run and wait for that run to finish; returns its final state (done or error)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = _wait(driver, "#t3d-prompt textarea")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    if prompt:
        box.send_keys(prompt)
    last, _ = _run_state(driver)
    deadline, clicked = time.monotonic() + timeout, -1e9
    while time.monotonic() < deadline:
        run, state = _run_state(driver)
        if run > last and state != "running":
            return state
        if run == last and time.monotonic() - clicked > 10:
            # Gradio ignores a click while the previous run is still closing: click again if none started.
            driver.find_element(By.CSS_SELECTOR, "#t3d-run").click()
            clicked = time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"the run of {prompt!r} did not finish within {timeout} s")


@pytest.mark.slow  # a browser and a server: ~15 s; `make test` and CI run it
@pytest.mark.subprocess
def test_browser_runs_the_sort2_teacher_and_survives_bad_input(browser_page, tmp_path):
    from selenium.webdriver.common.by import By

    driver = browser_page
    text, nfe = _expected(PROMPT, tokens_per_step=2)
    _wait(driver, "#t3d-view-0")
    # The page itself records every NFE its canvas showed while still masked (polling could miss frames).
    driver.execute_script(
        "window.t3dSeen = new Set(); const view = document.querySelector('#t3d-view-0');"
        "new MutationObserver(() => { const s = view.querySelector('.t3d-stats');"
        " if (s && view.querySelector('.t3d-mask')) window.t3dSeen.add(s.dataset.nfe); })"
        ".observe(view, {subtree: true, childList: true, attributes: true, characterData: true});"
    )
    assert _run(driver, PROMPT) == "done"
    stats = _wait(driver, "#t3d-view-0 .t3d-stats[data-done='1']")
    shown = driver.execute_script("return Array.from(window.t3dSeen)")
    assert shown and set(shown) <= {"1", "2", "3"}, shown  # canvases with masks were streamed, step by step
    assert driver.find_element(By.CSS_SELECTOR, "#t3d-view-0 .t3d-text").text == text
    assert stats.find_element(By.CSS_SELECTOR, ".t3d-nfe").text == str(nfe) == "4"
    steps = {
        e.get_attribute("data-step") for e in driver.find_elements(By.CSS_SELECTOR, "#t3d-view-0 .t3d-tok")
    }
    assert steps == {"1", "2", "3", "4"}
    screenshot = tmp_path / "playground.png"
    assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")

    # Bad input: an empty prompt is named in the page; a prompt over the model's limit in its column.
    assert _run(driver, "") == "error"
    assert "prompt is empty" in _wait(driver, "#t3d-status .t3d-error").text
    assert _run(driver, "a " * 70) == "done"
    error = _wait(driver, "#t3d-view-0 .t3d-error")
    assert "exceeds the model's max_position_embeddings=64" in error.text
    # The server still serves: a good run afterwards decodes again.
    assert _run(driver, PROMPT) == "done"
    _wait(driver, "#t3d-view-0 .t3d-stats[data-done='1']")
    assert driver.find_element(By.CSS_SELECTOR, "#t3d-view-0 .t3d-text").text == text
    assert not driver.find_elements(By.CSS_SELECTOR, "#t3d-status .t3d-error")


def test_space_entry_point_builds_the_page_from_its_variables(monkeypatch):
    import runpy
    from pathlib import Path

    import gradio

    monkeypatch.setenv("T3D_TRL_MODELS", f"teacher={SORT2}")
    monkeypatch.setenv("T3D_TRL_COLUMNS", "teacher:tokens_per_step=1 teacher:tokens_per_step=4")
    app = Path(__file__).parent.parent / "examples" / "space_app.py"
    demo = runpy.run_path(str(app))["demo"]
    assert isinstance(demo, gradio.Blocks)
    assert _column_models(demo) == ["teacher", "teacher", "(off)"]
    # A column naming a model the Space does not offer is refused at start-up, not at every Run.
    monkeypatch.setenv("T3D_TRL_COLUMNS", "teacher:tokens_per_step=1 sort:threshold=0.9")
    with pytest.raises(ValueError, match="column 2, sort \\(threshold=0.9\\): model 'sort' is not one of"):
        runpy.run_path(str(app))
    # So is a replay dataset that is neither a folder nor a dataset id (it used to fail only in the replay tab).
    monkeypatch.setenv("T3D_TRL_COLUMNS", "teacher:tokens_per_step=1")
    monkeypatch.setenv("T3D_TRL_TRAJECTORIES", "./no/such/trajectories")
    with pytest.raises(FileNotFoundError, match="T3D_TRL_TRAJECTORIES"):
        runpy.run_path(str(app))
