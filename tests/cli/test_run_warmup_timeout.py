"""A first token that never comes: the warm-up says which stream it waits for, gives up after its limit (tied to
--request-timeout), says so, and a run that then measured nothing ends early (exit 1), not valid and 0."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.harness.run_config import RunConfig
from itlbench.load.progress import ProgressSnapshot
from itlbench.testing.openai_peer import PeerConfig, serve_in_thread

runner = CliRunner()


def test_a_first_token_that_never_comes_ends_the_warmup_says_so_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serve_in_thread(PeerConfig(fault="no_first_token")) as (_, url):
        result = runner.invoke(app, ["run", "--endpoint", url, "--workload", "chat-short", "--streams", "2",
                                     "--duration", "1s", "--warmup", "0", "--request-timeout", "1.5s",
                                     "--drain-timeout", "0", "--no-live", "--no-report", "--out", str(out)],
                               terminal_width=400)
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    doc = json.loads((out / "run.json").read_text())
    assert doc["warmup_timeout"]["streams_without_token"] == ["s00", "s01"]
    assert 1.4 <= doc["warmup_timeout"]["waited_s"] < 10  # the limit follows --request-timeout, not 300 s
    assert re.search(r"the warm-up waited \d s for the first token of stream\(s\) s00, s01", doc["aborted_reason"])
    assert "warning: the warm-up waited" in text and "which never came" in text


def test_the_warmup_limit_is_a_minute_past_warmup_or_the_request_timeout() -> None:
    assert RunConfig(warmup_s=5).warmup_limit_s == 65
    assert RunConfig(warmup_s=5, request_timeout_s=10).warmup_limit_s == 15


def test_the_live_line_names_the_stream_the_warmup_waits_for() -> None:
    snap = ProgressSnapshot(3.0, False, 2, 0, 2, 0, None, None, None, 1.0, 0.1, waiting_for="s01")
    assert "warmup (waiting for s01's first token)" in snap.line()
