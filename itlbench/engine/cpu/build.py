"""Compiling the native CPU library safely: which compiler, where the result is cached, who compiles
it, and which cached file may be loaded. Torch-free, so its rules are tested without a model.

Why each rule:
- one compile per library: a server, its engine process and test workers often start at once. The
  first takes an exclusive lock (`.build.lock` in the cache directory), compiles into a temporary
  file and renames it into place; the others wait on the lock and then load the finished file. No
  process ever loads a half-written library, and a compile killed midway leaves only a temporary
  file, which the next compile (holding the lock, so no other compile is running) removes.
- a cache directory that works: `$ITLBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/itlbench`, else
  `~/.cache/itlbench`, else `<tmp>/itlbench-<uid>` (mode 0700), the first that can be created and
  written (containers often have a read-only or absent home).
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
import stat
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("itlbench.engine")

CACHE_ENV = "ITLBENCH_CACHE_DIR"
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
    problems = []
    for root in cache_candidates():
        problem = _private_dir(root / "kernels", root)
        if problem is None:
            return root
        problems.append(problem)
    raise BuildError("no usable cache directory: " + "; ".join(problems) + f" (set {CACHE_ENV} to a writable one)")


def cache_candidates() -> list[Path]:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return [Path(explicit)]
    found = []
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        found.append(Path(xdg) / "itlbench")
    with contextlib.suppress(RuntimeError, KeyError):  # no home directory at all
        found.append(Path.home() / ".cache" / "itlbench")
    found.append(Path(tempfile.gettempdir()) / f"itlbench-{os.getuid()}")
    return list(dict.fromkeys(found))


def _private_dir(path: Path, root: Path) -> str | None:
    """Create `path` (and a per-user temporary root) with mode 0700; why it is unusable, or None."""
    try:
        if root.parent == Path(tempfile.gettempdir()):
            root.mkdir(mode=0o700, exist_ok=True)  # a shared temporary directory: ours alone
            if problem := untrusted(root, want_dir=True):
                return f"{root}: {problem}"
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path}: not writable"
    problem = untrusted(path, want_dir=True)
    return f"{path}: {problem}" if problem else None


def untrusted(path: Path, want_dir: bool = False) -> str | None:
    """Why `path` must not be trusted (loaded from, or written into), or None: it must be a real
    file or directory (no symlink) owned by this user and not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        return "a symbolic link" if stat.S_ISLNK(st.st_mode) else f"not a {'directory' if want_dir else 'file'}"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"mode {stat.S_IMODE(st.st_mode):o} lets group or others write it"
    return None


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
