"""A barrage of hostile responses (itlbench.testing.hostile: wrong JSON types, a never-ending event,
HTML 5xx, trickled bytes, null choices, a chunk cut in half, a huge head, absurd usage) against a
whole `itlbench run --endpoint`: the run finishes, summary.json is written, no traceback reaches the
user, every sane request's rows are intact, each hostile one carries its error kind, and the client's
memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from itlbench.rundir.reader import read_table
from itlbench.testing.hostile import MODES, HostileConfig, serve_hostile

RSS_BOUND = 1 << 30  # the client process tree, peak (a quiet run of this shape peaks near 300 MiB)
# the event cap: above huge_usage's 2 MiB usage event, which a client must record whole. At a 2 MiB cap it failed
# or passed by how the network cut it into reads (it failed once in a whole-suite run, passed alone six times);
# every event over the cap now fails.
KIND = {"html_5xx": "http_status", "never_ending": "event_too_large", "choices_not_list": "bad_json",
        "cut_mid_chunk": "closed", "huge_head": "head_too_large"}
INTACT = ("sane", "trickle", "wrong_types", "huge_usage")  # data a client must record in full


def _peak_rss(proc: subprocess.Popen[str]) -> int:
    peak = 0
    p = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss = sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        except psutil.Error:
            break
        peak = max(peak, rss)
        time.sleep(0.05)
    return peak


@pytest.mark.parametrize("reader", ["kernel", "aiohttp"])
def test_a_hostile_barrage_leaves_a_whole_run(tmp_path: Path, reader: str):
    out = tmp_path / reader
    t0 = time.monotonic()
    with serve_hostile(HostileConfig(tick_s=0.003, modes=MODES, trickle_s=0.0)) as (peer, url):
        proc = subprocess.Popen([sys.executable, "-m", "itlbench", "run", "--endpoint", url, "--model", "peer",
                                 "--workload", "chat-short", "--streams", "6", "--duration", "4", "--warmup", "0",
                                 "--no-adaptive-warmup", "--no-live", "--stream-reader", reader,
                                 "--limits", "event=3MiB,head=32KiB", "--drain-timeout", "30s",
                                 "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = _peak_rss(proc)
        stdout, stderr = proc.communicate(timeout=300)
        sent = {str(s.id): s for s in peer.log.sent}
    print(f"{reader}: {time.monotonic() - t0:.1f} s, peak client RSS {peak / 2**20:.0f} MiB, "
          f"{len(sent)} requests served")
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    assert peak < RSS_BOUND, f"client peak RSS {peak / 2**20:.0f} MiB"
    summary = json.loads((out / "summary.json").read_text())
    req, chunks = read_table(out, "requests"), read_table(out, "chunks")
    assert req["request_id"].n_unique() == req.height and summary["requests"]["total"] > 0
    modes = {s.mode for s in sent.values()}
    assert modes == set(MODES), f"the run ended before every mode was served: {modes}"
    per_req = chunks.group_by("request_id").len()
    rows = req.join(per_req, on="request_id", how="left").with_columns(pl.col("len").fill_null(0))
    seen = 0
    for sid, status, kind, n, rows_n in rows.select("server_request_id", "status", "error_kind", "num_chunks",
                                                    "len").iter_rows():
        assert n == rows_n, f"{sid}: {n} chunks counted, {rows_n} chunk rows"
        s = sent.get(sid or "")
        if s is None:
            continue
        seen += 1
        if status == "cancelled":  # in flight at the end of the drain
            continue
        if s.mode in INTACT:
            assert status == "ok" and n == s.chunks, (sid, status, kind, n, s.chunks)
        elif s.mode == "null_choices":
            assert status == "ok" and n == 0
        elif s.mode in KIND:
            assert kind == KIND[s.mode], (sid, kind)
    assert seen >= len(INTACT)
    kinds = set(req["error_kind"].drop_nulls())
    assert {"http_status", "event_too_large", "bad_json", "closed", "head_too_large"} <= kinds, kinds
    assert set(summary["failures"]["by_kind"]) >= {"event_too_large", "head_too_large"}
