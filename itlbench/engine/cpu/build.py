"""Compiling the native CPU library safely: which compiler, where the result is cached, who compiles
it, and which cached file may be loaded. Torch-free, so its rules are tested without a model.

Why each rule:
- one compile per library: a server, its engine process and test workers often start at once. The
  first takes an exclusive lock (`.build.lock` in the cache directory), compiles into a temporary
  file and renames it into place; the others wait on the lock and then load the finished file. No
  process ever loads a half-written library, and a compile killed midway leaves only a temporary
  file, which the next compile (holding the lock, so no other compile is running) removes.
- a cache directory that works and is ours alone (`system/cache.py`: `$ITLBENCH_CACHE_DIR`, else
  `$XDG_CACHE_HOME/itlbench`, else `~/.cache/itlbench`, else `<tmp>/itlbench-<uid>`).
- load only what this user built: loading a library runs its code, so a `.so` is loaded only when it
  is a regular file owned by the current user and not writable by group or others, in a directory
  with the same properties (so nobody else can swap it between the check and the load). Anything
  else is compiled afresh over it.
- GCC only: the kernels use GCC's vector builtins (`__builtin_shuffle`), which clang lacks, so a
  clang is refused up front in one line instead of failing with pages of errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from itlbench.system.cache import CacheDirError, private_cache_dir, untrusted

log = logging.getLogger("itlbench.engine")

LOCK_NAME = ".build.lock"
TMP_PREFIX = ".tmp-"  # a compile's output before its rename; any left while the lock is free is a dead compile's
COMPILE_TIMEOUT_S = 120.0


class BuildError(OSError):
    """The library cannot be built or loaded here; the message says why in full (a compiler's
    whole stderr included: the line that matters is rarely the last)."""


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str  # `--version` output: part of the cache key


def find_compiler() -> Compiler:
    """`$CC` when set (refused unless it is GCC), else the first GCC among Python's own CC, `cc`, `gcc`."""
    explicit = os.environ.get("CC")
    if explicit:
        path = shutil.which(explicit.split()[0])
        if path is None:
            raise BuildError(f"CC={explicit}: not found on PATH (set CC to a gcc, or unset it)")
        refusal = _not_gcc(path, version := _version(path))
        if refusal:
            raise BuildError(f"CC={explicit}: {refusal}")
        return Compiler(path, version)
    refused = []
    for cand in ((sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc"):
        path = shutil.which(cand) if cand else None
        if path is None:
            continue
        refusal = _not_gcc(path, version := _version(path))
        if refusal is None:
            return Compiler(path, version)
        refused.append(f"{path}: {refusal}")
    if refused:
        raise BuildError("no GCC found (" + "; ".join(dict.fromkeys(refused)) + ")")
    raise BuildError("no C compiler found (install gcc, or set CC)")


def _version(path: str) -> str:
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _not_gcc(path: str, version: str) -> str | None:
    """Why `path` cannot build the kernels, or None when it is GCC."""
    first = version.strip().splitlines()[0] if version.strip() else "no --version output"
    if "clang" in version.lower():
        return (f"{first} is clang; the kernels use GCC vector builtins (__builtin_shuffle) that clang "
                "lacks: install gcc and set CC=gcc")
    if "free software foundation" in version.lower() or "gcc" in first.lower():
        return None
    return f"{first} is not GCC: install gcc and set CC=gcc"


def cache_dir() -> Path:
    """The first usable cache root (see the module docstring); its `kernels/` exists and is ours."""
    try:
        return private_cache_dir("kernels").parent
    except CacheDirError as exc:
        raise BuildError(str(exc)) from None


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory`'s builds, held across processes; released when the holder
    exits, however it exits."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def loadable(target: Path) -> bool:
    """True when `target` exists and may be loaded; a file there that may not is reported and
    will be replaced by a fresh build."""
    if not os.path.lexists(target):
        return False
    problem = untrusted(target)
    if problem:
        log.warning("native library: not loading %s (%s); building it afresh", target, problem)
    return problem is None


def build_library(target: Path, command: Callable[[str], list[str]]) -> Path:
    """`target`, compiled by `command(output_path)` unless a loadable copy is already there."""
    if loadable(target):
        return target
    directory = target.parent
    with build_lock(directory):
        if loadable(target):  # another process built it while this one waited for the lock
            return target
        for stale in directory.glob(TMP_PREFIX + "*"):  # the lock is ours: no compile is running
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".so", dir=directory)
        os.close(fd)
        try:
            argv = command(tmp)
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise BuildError(f"{argv[0]} ran past {COMPILE_TIMEOUT_S:g} s") from None
            if proc.returncode != 0:
                stderr = proc.stderr.strip() or proc.stdout.strip() or "no output"
                raise BuildError(f"{argv[0]} exited with status {proc.returncode}:\n{stderr}")
            os.chmod(tmp, 0o755)  # the linker honours the umask: a group-writable library would be refused
            os.replace(tmp, target)  # atomic: a reader sees no file or the whole file
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return target
