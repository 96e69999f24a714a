"""Whether this host may have a CUDA device, asked without importing torch.

Importing torch takes seconds; a client run (`--endpoint`, the simulator) needs none of it, yet asked torch
whether a GPU is there (the default preset, run.json's hardware). Without an NVIDIA driver there is none, and
that is known from the driver's traces alone; only where a driver is does torch need asking.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def driver_present() -> bool:
    """An NVIDIA driver is installed (Linux: /proc/driver/nvidia; elsewhere: its nvidia-smi on PATH)."""
    return Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi") is not None
