"""NVTX ranges around engine phases, a no-op where there is no CUDA (and no torch import for it)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


class _Nvtx:
    """NVTX ranges when CUDA is present; a no-op context otherwise (guarded: CPU torch raises). A
    process that never loaded torch (the simulated engine) has no CUDA work to range, and stays
    torch-free."""

    def __init__(self) -> None:
        self._push = self._pop = self._mark = None
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_available():
                nvtx = torch.cuda.nvtx
                self._push, self._pop, self._mark = nvtx.range_push, nvtx.range_pop, nvtx.mark
        except Exception:  # noqa: BLE001 - any import/runtime problem means "no NVTX"
            self._push = self._pop = self._mark = None

    @property
    def enabled(self) -> bool:
        return self._push is not None

    @contextlib.contextmanager
    def range(self, name: str, note: str | None = None) -> Iterator[None]:
        if self._push is None:
            yield
            return
        self._push(name)
        if note:
            self._mark(f"{name} {note}")
        try:
            yield
        finally:
            self._pop()


_nvtx: _Nvtx | None = None


def nvtx_range(name: str, note: str | None = None) -> contextlib.AbstractContextManager[None]:
    """`with nvtx_range("step/mixed", "prefill=2048 decode=31"):` a range, and the note as a mark at
    its start; costs a dictionary lookup on CPU-only machines."""
    global _nvtx
    if _nvtx is None:
        _nvtx = _Nvtx()
    return _nvtx.range(name, note)
