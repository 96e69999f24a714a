"""Where no NVIDIA driver is, nothing asks torch about a GPU: a client run (`--endpoint`, the simulator)
starts without importing it (seconds), yet run.json still records torch's version."""

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
import itlbench.system.nvidia as nvidia
from itlbench.cli.engine_options import _cuda_for
from itlbench.harness.run_doc import hardware
seen = []
sys.modules["torch"] = None  # as when torch is not installed
seen.append([hardware()["torch"], hardware()["cuda"], _cuda_for("auto"), False])
del sys.modules["torch"]
nvidia.driver_present = lambda: False
hw = hardware()
seen.append([hw["torch"], hw["cuda"], _cuda_for("auto"), "torch" in sys.modules])
nvidia.driver_present = lambda: True
hw = hardware()
seen.append([hw["torch"], hw["cuda"], _cuda_for("auto"), "torch" in sys.modules])
print(json.dumps(seen))
"""


def test_torch_is_asked_about_a_gpu_only_where_a_driver_is() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    blocked, no_driver, driver = json.loads(done.stdout)
    assert blocked == [None, None, False, False]
    assert no_driver == [importlib.metadata.version("torch"), None, False, False], "no driver: torch is not imported"
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert driver == [torch.__version__, cuda, cuda is not None, True], "a driver: torch is asked"
