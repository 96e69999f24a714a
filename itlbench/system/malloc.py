"""glibc malloc settings that keep large activation buffers mapped between engine steps.

Without them every prefill step page-faults its fresh multi-megabyte tensors in again (3–30 %
slower prefill, and several times slower KV gathers on CPU). glibc reads the setting only at
process start, so the serving entry points re-execute themselves once with it.
"""

from __future__ import annotations

import os
import sys

MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"


def env_with_malloc_tunables(env: dict[str, str] | None = None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    out.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return out


def reexec_with_malloc_tunables() -> None:
    """Replace this process with itself plus GLIBC_TUNABLES, unless already set (or not Linux)."""
    if not sys.platform.startswith("linux") or "GLIBC_TUNABLES" in os.environ:
        return
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env_with_malloc_tunables())
