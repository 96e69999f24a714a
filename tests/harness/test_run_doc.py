"""run.json's `hardware`: the host's torch and CUDA device, without importing torch where no device can be."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import torch

# One fresh interpreter (this one imported torch long ago), three hosts in turn: torch not importable, a host
# with no NVIDIA driver (torch's version from its metadata, torch left unimported), and one with a driver.
PROBE = """
import json, sys
import itlbench.harness.run_doc as doc
seen = []
sys.modules["torch"] = None  # as when torch is not installed
seen.append([doc.hardware()["torch"], doc.hardware()["cuda"], False])
del sys.modules["torch"]
doc._nvidia_driver = lambda: False
hw = doc.hardware()
seen.append([hw["torch"], hw["cuda"], "torch" in sys.modules])
doc._nvidia_driver = lambda: True
hw = doc.hardware()
seen.append([hw["torch"], hw["cuda"], "torch" in sys.modules])
print(json.dumps(seen))
"""


def test_torch_is_imported_for_the_hardware_only_where_a_cuda_device_may_be() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    blocked, no_driver, driver = json.loads(done.stdout)
    assert blocked == [None, None, False]
    assert no_driver == [importlib.metadata.version("torch"), None, False], "no driver: torch is not imported"
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert driver == [torch.__version__, cuda, True], "a driver: torch names the device"
