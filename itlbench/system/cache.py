"""Where itlbench keeps what it computed once (the native kernels, the simulator's error bars): a directory
that is this user's alone.

`$ITLBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/itlbench`, else `~/.cache/itlbench`, else `<tmp>/itlbench-<uid>`
(mode 0700): the first that can be created and written (containers often have a read-only or absent home).
What is read back from it is trusted only when it is a real file or directory owned by this user and not
writable by group or others, so nobody else can plant a library to load or a figure to report.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

CACHE_ENV = "ITLBENCH_CACHE_DIR"


class CacheDirError(OSError):
    """No candidate can hold a private cache directory; the message lists why each could not."""


def private_cache_dir(sub: str) -> Path:
    """`<first usable cache root>/<sub>`, created with mode 0700 and checked to be ours."""
    problems = []
    for root in cache_candidates():
        problem = _private_dir(root / sub, root)
        if problem is None:
            return root / sub
        problems.append(problem)
    raise CacheDirError("no usable cache directory: " + "; ".join(problems) + f" (set {CACHE_ENV} to a writable one)")


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
