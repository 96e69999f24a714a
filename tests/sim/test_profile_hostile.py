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


BASE = '{"name": "my", "peak_flops": 9.89e14, "mem_bw": 3.35e12, "memory_bytes": 8.0e10, '


@pytest.mark.parametrize("entry", [
    '"step_overhead_s": Infinity', '"seq_overhead_s": 1e400', '"graph_overhead_s": Infinity',
    '"kernel_s": Infinity', '"link_bw": Infinity', '"gemm_slow_rows": [0, 100, Infinity]',
    '"allreduce_measured": {"2": [[1, 1e-6], [Infinity, 1e-5]]}',
])
def test_an_infinite_figure_in_a_profile_is_refused_naming_its_key(tmp_path: Path, entry: str) -> None:
    # was: an infinite overhead ran until the virtual clock's round(inf) raised OverflowError (a traceback, exit 1,
    # a run directory left behind); other infinities priced steps at inf or 0 without a word
    path = tmp_path / "gpu.json"
    path.write_text(BASE + entry + "}")
    key = entry.split('"')[1]
    _refused(path, str(path), key)
