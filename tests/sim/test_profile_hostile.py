"""A hostile or damaged --gpu profile JSON: refused in one line naming the flag, the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlbench.errors import ConfigError
from itlbench.sim.hardware import load_hardware


def _refused(path: Path, *needles: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    assert err.value.field == "--gpu" and "\n" not in str(err.value) and err.value.fix
    for needle in needles:
        assert needle in err.value.problem, err.value.problem


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xff\xfe\x80\x81", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
], ids=["binary", "deep"])
def test_a_profile_that_cannot_be_read_is_refused_naming_the_file(tmp_path: Path, data: bytes, needle: str) -> None:
    # was: UnicodeDecodeError and RecursionError tracebacks, exit 1
    path = tmp_path / "gpu.json"
    path.write_bytes(data)
    _refused(path, str(path), needle)
