"""The child side of the code sandbox: the program that :func:`t3d_trl.evaluation.sandbox.run_program` starts.

It runs as a file in a fresh ``python -I -S`` interpreter (isolated mode: neither this file's folder nor the
current directory is on ``sys.path``), so it must import only the standard library, never ``t3d_trl``.

Command line: result fd, memory bytes, CPU seconds, file-size bytes, process limit (-1: unset), as_main
(0/1), extra ``sys.path`` entries (``os.pathsep``-joined). Stdin: a token line, then the program source.
The child sets its resource limits, installs the guard (see the :mod:`~t3d_trl.evaluation.sandbox`
docstring), runs the program and writes ``token\\nstatus\\ndetail`` to the result fd.

The token is never bound to a name while the program runs: :func:`main` reads it from stdin as an argument
of the :func:`report` call that runs the program (:func:`run_guarded`) as its last argument, so until
then it sits on the evaluation stack of :func:`main`'s frame, which neither a module global nor any frame's
``f_locals`` shows (a program walking ``sys._getframe()`` back finds no token; a test checks this). Code that
digs deeper (``ctypes``, reading process memory) can still forge a pass: the sandbox is not a security
boundary.
"""

import builtins
import errno
import io
import os
import posix
import resource
import sys

_FORBIDDEN = [
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "kill", "killpg",
    "setsid", "setpgid", "setpgrp", "setuid", "setgid", "seteuid", "setegid", "setreuid",
    "setregid", "setresuid", "setresgid", "setgroups", "initgroups", "chroot", "fchmod",
    "fchown", "lchmod", "chflags", "lchflags", "setxattr", "removexattr",
]  # fmt: skip
_PATH_CHECKED = ("remove", "unlink", "rmdir", "mkdir", "mkfifo", "mknod", "chmod", "chown", "lchown", "utime")
# Harmless write targets outside the directory (only for opening, never for removal etc.).
_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def set_limits(memory, cpu, fsize, nproc):
    """Lower the soft and hard limits (a negative value leaves one unset); the CPU hard limit stays one
    second above the soft one, so that ``SIGXCPU`` comes before ``SIGKILL``."""

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


def path_check(root):
    """``inside(path, dir_fd=None)``: whether ``path`` resolves (symlinks followed) to ``root`` or below."""
    realpath, isabs, join, fspath = os.path.realpath, os.path.isabs, os.path.join, os.fspath
    readlink, fsdecode, sep = os.readlink, os.fsdecode, os.sep

    def inside(path, dir_fd=None):
        if isinstance(path, int):
            return False
        try:
            path = fspath(path)
            if isinstance(path, bytes):
                path = fsdecode(path)
            if dir_fd is not None and not isabs(path):
                path = join(readlink(f"/proc/self/fd/{dir_fd}"), path)
            resolved = realpath(path)
        except (TypeError, ValueError, OSError):
            return False
        return resolved == root or resolved.startswith(root + sep)

    return inside


def _refuse(what, path=None):
    message = f"sandbox: {what} is not allowed"
    if path is None:
        raise PermissionError(errno.EPERM, message)
    raise PermissionError(errno.EACCES, message, path)


def _patch(name, function, modules=(os, posix)):
    for module in modules:
        if hasattr(module, name):
            setattr(module, name, function)


def _disabled(name):
    def function(*args, **kwargs):
        _refuse(name + "()")

    function.__name__ = name
    return function


def _path_checked(inside, name, positions=(0,), int_ok=False):
    original = getattr(os, name)

    def function(*args, **kwargs):
        dir_fd = kwargs.get("dir_fd")
        for position in positions:
            if position < len(args):
                path = args[position]
                if int_ok and isinstance(path, int):
                    continue
                if not inside(path, dir_fd):
                    _refuse(name + "() outside the sandbox directory", path)
        return original(*args, **kwargs)

    function.__name__ = name
    return function


def _is_device(path):
    try:
        path = os.fspath(path)
    except TypeError:
        return False
    return (os.fsdecode(path) if isinstance(path, bytes) else path) in _DEVICES


def disable_processes():
    """Process creation and replacement, signalling others, leaving the group, identity changes, raising
    limits: each raises ``PermissionError``."""
    import _posixsubprocess
    import _signal

    for name in _FORBIDDEN + [n for n in dir(os) if n.startswith(("exec", "spawn"))]:
        _patch(name, _disabled(name))
    _posixsubprocess.fork_exec = _disabled("fork_exec")
    signal_modules = tuple(m for m in (_signal, sys.modules.get("signal")) if m is not None)
    for name in ("pthread_kill", "pidfd_send_signal"):
        _patch(name, _disabled(name), signal_modules)
    resource.setrlimit = _disabled("setrlimit")
    if hasattr(resource, "prlimit"):
        resource.prlimit = _disabled("prlimit")


def guard_paths(inside):
    """Every way to write, create, delete, rename, link or change a path outside the working directory
    raises ``PermissionError`` (reading stays allowed)."""
    for name in _PATH_CHECKED:
        if hasattr(os, name):
            _patch(name, _path_checked(inside, name))
    _patch("truncate", _path_checked(inside, "truncate", int_ok=True))
    for name in ("rename", "replace", "link"):
        _patch(name, _path_checked(inside, name, (0, 1)))
    _patch("symlink", _path_checked(inside, "symlink", (1,)))

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    os_open = os.open

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags and not (_is_device(path) or inside(path, dir_fd)):
            _refuse("opening for writing outside the sandbox directory", path)
        return os_open(path, flags, mode, dir_fd=dir_fd)

    _patch("open", guarded_os_open)

    def writes(file, mode):
        if isinstance(file, int) or _is_device(file) or not isinstance(mode, str):
            return False
        return any(c in mode for c in "wax+")

    builtin_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if writes(file, mode) and not inside(file):
            _refuse("opening for writing outside the sandbox directory", file)
        return builtin_open(file, mode, *args, **kwargs)

    import _io

    class FileIO(_io.FileIO):
        def __init__(self, file, mode="r", closefd=True, opener=None):
            if writes(file, mode) and not inside(file):
                _refuse("opening for writing outside the sandbox directory", file)
            super().__init__(file, mode, closefd, opener)

    builtins.open = io.open = _io.open = guarded_open
    io.FileIO = _io.FileIO = FileIO


def run_source(source, as_main):
    """Run the program; ``(status, detail)`` with status ``passed``, ``exited``, ``memory`` or ``failed``."""
    namespace = {"__name__": "__main__" if as_main else "__sandbox__", "__builtins__": builtins}
    status, detail = b"passed", ""
    try:
        code = compile(source.decode("utf-8", "replace"), "<program>", "exec")
        del source
        exec(code, namespace)
    except SystemExit as exc:
        status, detail = b"exited", f"SystemExit({exc.code!r})"
    except MemoryError:
        status, detail = b"memory", "MemoryError"
    except BaseException as exc:
        status = b"failed"
        try:
            detail = f"{type(exc).__name__}: {exc}"
        except BaseException:
            detail = type(exc).__name__
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    return status, detail


def run_guarded(as_main):
    """Read the program (the rest of stdin), switch stdin to ``/dev/null``, install the guard and run it;
    ``(status, detail)`` as :func:`run_source`, with the program's output flushed."""
    source = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.path.extend(p for p in sys.argv[7].split(os.pathsep) if p)
    builtins.exit = builtins.quit = sys.exit

    inside = path_check(os.path.realpath(os.getcwd()))
    disable_processes()
    guard_paths(inside)

    outcome = run_source(source, as_main)
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not imported in the child: start-up time counts for every program
            stream.flush()
        except BaseException:
            pass
    return outcome


def report(write, exit_now, result_fd, token_line, outcome):
    """Write ``token\\nstatus\\ndetail`` to the result fd and end the process."""
    try:
        status, detail = outcome
        detail = detail.replace("\n", " ")[:1000].encode("utf-8", "replace")
        write(result_fd, token_line.rstrip(b"\n") + b"\n" + status + b"\n" + detail)
    finally:
        exit_now(0)


def main():
    """Limits, guard, program, report (see the module docstring)."""
    write, exit_now = os.write, os._exit
    result_fd, memory, cpu, fsize, nproc = (int(a) for a in sys.argv[1:6])
    as_main = sys.argv[6] == "1"
    set_limits(memory, cpu, fsize, nproc)
    # The token line is an argument evaluated before run_guarded starts: it waits on this frame's evaluation
    # stack, in no local (f_locals) and no global, until report() gets it after the program has ended.
    report(write, exit_now, result_fd, sys.stdin.buffer.readline(), run_guarded(as_main))


if __name__ == "__main__":
    main()
