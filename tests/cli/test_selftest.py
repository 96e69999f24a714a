"""`itlbench selftest`: the client against the paced server's send log (a real server in its own process)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.errors import ConfigError
from itlbench.experiments.selftest import (
    Errors,
    SelftestConfig,
    SelftestResult,
    SelftestRow,
    compare,
    measure,
)


def test_compare_pairs_each_request_chunk_by_chunk() -> None:
    server = {"a": [100, 200, 300], "b": [1000, 1100]}
    client = {"a": [150, 260, 350], "b": [1010, 1110, 1200], "c": [5]}  # c: never sent; b: one chunk extra
    f = compare(client, server)
    assert f.ttft_ns.tolist() == [50, 10]
    assert f.itl_ns.tolist() == [10, -10, 0]
    assert f.compared == 5


def test_the_answer_is_the_last_count_before_the_first_miss() -> None:
    cfg = SelftestConfig(streams=(10, 50, 100), readers=("kernel", "aiohttp"))
    ok, bad = Errors(0.1, 0.5, 0.9), Errors(1, 5, 9)
    rows = [SelftestRow(10, "kernel", 1, ok, ok, True), SelftestRow(50, "kernel", 1, bad, ok, False),
            SelftestRow(100, "kernel", 1, ok, ok, True), SelftestRow(10, "aiohttp", 1, bad, ok, False)]
    assert SelftestResult(cfg, rows).max_streams_within() == {"kernel": 10, "aiohttp": None}


def test_errors_are_absolute_milliseconds() -> None:
    e = Errors.of(np.array([-2_000_000, 1_000_000, 0]))
    assert (e.p50_ms, e.max_ms) == (1.0, 2.0)
    assert Errors.of(np.zeros(0)).p99_ms is None


@pytest.mark.parametrize(("kw", "flag"), [({"streams": ()}, "--streams"), ({"streams": (0,)}, "--streams"),
                                          ({"readers": ("auto",)}, "--readers"), ({"readers": ("x",)}, "--readers"),
                                          ({"duration_s": 0.0}, "--duration"), ({"bound_ms": 0.0}, "--bound-ms"),
                                          ({"tokens": 1}, "--tokens"), ({"first_delay_s": -0.01}, "--first-delay")])
def test_bad_settings_name_the_flag(kw: dict, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        SelftestConfig(**kw)
    assert err.value.field == flag


def test_a_real_point_sees_every_send_after_it_was_sent() -> None:
    cfg = SelftestConfig(streams=(4,), readers=("kernel",), duration_s=1.5, tokens=20)
    row = measure(cfg, 4, "kernel")
    # 4 streams at one chunk per 20 ms tick for 1.5 s: about 300 chunks (startup and drain take some)
    assert 150 <= row.chunks <= 320
    assert row.ttft.p50_ms is not None and row.itl.p99_ms is not None and row.itl.max_ms >= row.itl.p99_ms
    # the loop thread's run-queue wait per second: a share of each second, read from schedstat on Linux
    assert row.cpu_wait_ms_per_s is not None and 0.0 <= row.cpu_wait_ms_per_s <= 1000.0
    assert row.load1 is not None and row.load1 >= 0.0



def test_the_command_prints_json_and_refuses_bad_flags() -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["selftest", "--streams", "3", "--readers", "kernel", "--duration", "1s", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert [r["streams"] for r in doc["rows"]] == [3] and set(doc["max_streams_within_bound"]) == {"kernel"}
    bad = runner.invoke(app, ["selftest", "--streams", "ten"])
    assert bad.exit_code == 2 and "--streams" in bad.output


def test_the_tables_fit_an_80_column_terminal() -> None:
    """Twelve columns in one table wrapped at 80; the ITL and TTFT errors are two tables of seven."""
    done = CliRunner().invoke(app, ["selftest", "--streams", "2", "--readers", "kernel", "--duration", "1s"],
                              terminal_width=80, env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert any("ITL error against the paced server" in line for line in lines)
    rows = [line.split() for line in lines if line.strip().startswith("kernel  ")]
    assert len(rows) == 2 and rows[0][-1] in ("yes", "no") and len(rows[1]) == 7  # ITL row, TTFT row
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
