"""A server that sends wrongly typed fields loses nothing: the issue's probe (`"id": 123`) and its kin,
through a whole `itlbench run --endpoint` against the hostile peer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl

from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.rundir.reader import read_table
from itlbench.testing.hostile import HostileConfig, serve_hostile


def _cfg(url: str, out: Path, **kw: object) -> RunConfig:
    base: dict[str, object] = dict(endpoint=url, model="peer", workload="chat-short", streams=2, duration_s=1.0,
                                   warmup_s=0.0, adaptive_warmup=False, drain_timeout_s=10.0,
                                   request_timeout_s=10.0, out=out)
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_a_numeric_id_and_lying_usage_keep_the_run_and_every_row(tmp_path: Path):
    with serve_hostile(HostileConfig(tick_s=0.002, modes=("sane", "wrong_types"))) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / "run"))
        sent = list(peer.log.sent)
    req = read_table(run_dir, "requests")
    assert (run_dir / "summary.json").is_file() and req.height == len(sent) >= 2
    assert (req["status"] == "ok").all(), req.filter(pl.col("status") != "ok")
    odd = req.filter(pl.col("server_request_id").str.contains(r"^\d+$"))
    assert sorted(odd["server_request_id"].to_list()) == sorted(str(s.id) for s in sent if s.mode == "wrong_types")
    assert set(odd["finish_reason"]) == {"7"}
    assert odd["prompt_tokens_reported"].null_count() == odd["output_tokens_reported"].null_count() == odd.height
    assert odd["cached_tokens_reported"].null_count() == odd.height
    chunks = read_table(run_dir, "chunks").group_by("request_id").len()
    joined = req.join(chunks, on="request_id")
    by_id = {str(s.id): s.chunks for s in sent}
    assert joined.height == req.height
    assert all(by_id[sid] == n == k for sid, n, k in joined.select("server_request_id", "len", "num_chunks").iter_rows())
    assert summary["requests"]["ok"] >= 1  # the ones inside the window


def test_the_cli_run_against_the_probe_exits_0_with_a_summary(tmp_path: Path):
    with serve_hostile(HostileConfig(tick_s=0.002, modes=("wrong_types",))) as (_, url):
        p = subprocess.run([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer",
                            "--workload", "chat-short", "--streams", "2", "--duration", "1", "--warmup", "0",
                            "--no-adaptive-warmup", "--out", str(tmp_path / "cli"), "--no-live"],
                           capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["requests"]["ok"] >= 2 and read_table(tmp_path / "cli", "requests").height >= 2
