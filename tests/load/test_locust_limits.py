"""A Locust worker holds a never-ending SSE event to the same `--limits event=` cap as the other stream
readers (issue 25, Low). Before: its `readline(b"\\n")` waited for a line end that never came,
rescanning a buffer that grew without bound until the request timeout, and the row said only
"timeout" with no error kind."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.load.clients.limits import Limits
from itlbench.rundir.reader import read_table
from itlbench.testing.hostile import HostileConfig, serve_hostile

CAP = 1 << 20


def _cfg(url: str, out: Path) -> RunConfig:
    return RunConfig(endpoint=url, model="peer", workload="chat-short", streams=2, duration_s=1.0, warmup_s=0.0,
                     adaptive_warmup=False, drain_timeout_s=15.0, request_timeout_s=15.0, out=out, live=False,
                     driver="locust", workers=1, limits=Limits(event_bytes=CAP))


@pytest.mark.e2e
def test_a_never_ending_event_fails_its_locust_request_at_the_cap(tmp_path: Path):
    with serve_hostile(HostileConfig(tick_s=0.002, modes=("sane", "never_ending"))) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "run"))
        sent = list(peer.log.sent)
    req = read_table(run_dir, "requests")
    endless = req.filter(pl.col("status") != "ok")
    assert endless.height >= 1 and set(endless["error_kind"]) == {"event_too_large"}, \
        endless.select("status", "error_kind", "error").to_dicts()
    assert all(f"{CAP} bytes" in e for e in endless["error"]), endless["error"].to_list()
    ok = req.filter(pl.col("status") == "ok")
    assert ok.height >= 1 and set(ok["server_request_id"].str.slice(0, 4)) == {"sane"}
    streamed = [s.bytes for s in sent if s.mode == "never_ending"]
    assert streamed and max(streamed) < 64 * CAP, f"the worker left the endless event: {max(streamed)} bytes sent"
    assert (run_dir / "summary.json").is_file() and summary["requests"]["ok"] >= 1
