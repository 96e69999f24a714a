"""A bundled-engine run checks its attention flags before starting a server; only a named CUDA backend or
device can be refused, so only those ask torch (whose import took the client a second or more)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.orchestrate import _preflight
from itlbench.harness.run_config import RunConfig
seen = []
for attention in ("auto", "sdpa"):
    _preflight(RunConfig(engine=EngineConfig(model="tiny", attention=attention), workload="chat-short"))
    seen.append("torch" in sys.modules)
try:  # flash on a CPU device: refused here, on any box
    _preflight(RunConfig(engine=EngineConfig(model="tiny", attention="flash", device="cpu"), workload="chat-short"))
    seen.append(None)
except ConfigError as exc:
    seen.append(exc.field)
seen.append("torch" in sys.modules)
print(json.dumps(seen))
"""


def test_only_a_backend_that_can_be_refused_imports_torch_before_the_server_starts() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, False, "attention", True]
