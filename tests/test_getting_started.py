"""docs/getting_started.md's CPU path, run exactly as the page shows it: offline, in a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "getting_started.md"
SECTION = "## On a CPU, offline: the whole loop on a packaged teacher"


def cpu_path_commands() -> str:
    """The ```bash blocks of the page's CPU section, as written."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "the CPU section has no bash block"
    return "\n".join(blocks)


def test_the_cpu_path_names_every_stage():
    script = cpu_path_commands()
    for command in (
        "t3d-trl collect",
        "t3d-trl train",
        "t3d-trl eval",
        "t3d-trl generate",
        "t3d-trl lm-eval",
    ):
        assert command in script
    assert "Gen-Verse" not in script and "JetLM" not in script  # nothing from the Hub


@pytest.mark.slow  # the whole CPU path, command by command (about a minute)
@pytest.mark.subprocess
def test_the_cpu_path_runs_verbatim_offline_in_a_fresh_folder(tmp_path):
    # The commands name recipes/ and the packaged teacher by paths relative to the repository root, as a user
    # in a fresh clone runs them; the outputs (t3d-cpu/) go to a fresh folder that sees the same two paths.
    for name in ("recipes", "t3d_trl"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("HF_HUB_OFFLINE", None)  # the page sets it itself
    done = subprocess.run(
        ["bash", "-e", "-c", cpu_path_commands()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    assert "256 prompts, 256 trajectories saved to t3d-cpu/trajectories, none dropped" in out
    assert "model saved to t3d-cpu/t3d" in out
    assert "demo-wordsort (B=4)" in out and "| t3d |" in out  # eval's table, both models
    assert "finished=False (no EOS within max_new_tokens=32)" in done.stderr  # generate --verbose
    assert "t3d_demo_wordsort" in out and "valid" in out  # lm_eval's table
    completion = next(line for line in out.splitlines() if re.fullmatch(r"([a-z] ){31}[a-z]", line))
    assert len(completion.split()) == 32  # generate's completion: 8 words of 4 letters
    for path in ("trajectories", "t3d/model.safetensors", "eval/results.json"):
        assert (tmp_path / "t3d-cpu" / path).exists(), path
