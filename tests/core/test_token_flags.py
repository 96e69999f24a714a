"""Engine flags that count tokens read `128k` as `--inject` and `--chunk-budget` do (k = 1024)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import parse_context_len
from itlbench.errors import ConfigError


def test_context_length_reads_k_and_none() -> None:
    assert parse_context_len("128k") == 131_072 and parse_context_len("8192") == 8192
    assert parse_context_len("none") is None and parse_context_len(None) is None
    with pytest.raises(ConfigError) as err:
        parse_context_len("12x")
    assert err.value.field == "--max-model-len" and "128k" in err.value.fix


def test_a_run_takes_its_context_and_unchunked_cap_in_k(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--engine", "sim", "--max-model-len", "16k", "--chunk-budget", "none",
                                      "--unchunked-prefill-cap", "8k", "--duration", "2", "--brief", "--no-report",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    engine = json.loads((out / "run.json").read_text())["engine"]
    assert engine["max_model_len"] == 16_384  # what the engine ran with
    assert engine["engine"]["max_model_len"] == 16_384 and engine["engine"]["unchunked_prefill_cap"] == 8192


def test_a_bad_context_length_is_one_line_naming_the_flag() -> None:
    result = CliRunner().invoke(app, ["run", "--engine", "sim", "--max-model-len", "lots", "--duration", "2"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--max-model-len: cannot read 'lots' as a token count" in " ".join(result.output.split())
