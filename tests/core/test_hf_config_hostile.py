"""Hostile or damaged config.json files: each is refused in one line naming the file or key, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlbench.core.hf_config import read_hf_config
from itlbench.errors import ConfigError


def _refused_file(tmp_path: Path, data: bytes, *needles: str) -> ConfigError:
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(ConfigError) as err:
        read_hf_config(tmp_path)
    assert "\n" not in str(err.value) and err.value.fix
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    return err.value


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xff\xfe\x00garbage\x80", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
], ids=["binary", "deep"])
def test_a_config_json_that_cannot_be_read_is_refused_naming_the_file(tmp_path: Path, data: bytes,
                                                                      needle: str) -> None:
    # was: UnicodeDecodeError and RecursionError tracebacks, exit 1
    err = _refused_file(tmp_path, data, "config.json", needle)
    assert err.field == "model"
