"""Caps on what a server may make the client hold: a pending SSE event (event_too_large), a response
head (head_too_large), a control reply (reply_too_large, and a whole-call deadline), a /metrics body
(body_too_large); and the SSE splitter stays linear in the bytes fed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import polars as pl
import pytest

from itlbench.errors import ConfigError
from itlbench.harness.http_json import ReplyTooLarge, request_json
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.load.clients.limits import Limits
from itlbench.load.clients.sse_events import SseEvents, StreamError
from itlbench.load.observers.metrics_sampler import MetricsSampler
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.testing.hostile import HostileConfig, serve_hostile


def test_a_never_ending_event_costs_linear_time_then_fails_at_its_cap():
    """Before: 8 MiB in 4 KiB reads took 10 s (each read copied and rescanned the whole buffer)."""
    events, piece = SseEvents(max_event_bytes=48 << 20), b"x" * (4 << 10)
    assert events.feed(b"data: {\"a\": 1}\n\ndata: ") == [b'{"a": 1}']
    t0 = time.perf_counter()
    for _ in range(32 << 8):  # 32 MiB
        assert events.feed(piece) == []
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"32 MiB of one event took {elapsed:.2f} s"
    assert events.feed(b"\n\n") == [b"x" * (32 << 20)]
    capped = SseEvents(max_event_bytes=1 << 20)
    with pytest.raises(StreamError, match="grew past 1048576 bytes") as exc:
        for _ in range(257):
            capped.feed(piece)
    assert exc.value.kind == "event_too_large" and capped.pending == 0  # its memory is let go


def test_an_event_over_the_cap_fails_however_the_reads_cut_it():
    """An ended event over the cap fails like an unfinished one (before: a whole one in a single read passed, the
    same bytes in two reads failed, so a run's error kinds hung on the network), and the events that ended before
    it in the same read reach the caller."""
    big = b"data: {\"note\": \"" + b"y" * 2000 + b"\"}\n\n"
    for pieces in ([big], [big[:1000], big[1000:]], [b"data: 1\n\n" + big], [b"data: 1\n\n" + big[:1500], big[1500:]]):
        events = SseEvents(max_event_bytes=1024)
        got: list[bytes] = []
        with pytest.raises(StreamError, match="grew past 1024 bytes") as exc:
            for piece in pieces:
                got += events.feed(piece)
        assert exc.value.kind == "event_too_large" and events.pending == 0
        assert got + exc.value.events == ([b"1"] if pieces[0].startswith(b"data: 1") else []), pieces
    events = SseEvents(max_event_bytes=len(big) - 2)  # an event exactly at the cap passes
    assert events.feed(big) == [big[6:-2]]
    handled: list[bytes] = []  # what the readers call: every event before the bad one handled, then the error
    with pytest.raises(StreamError, match="event_too_large|grew past"):
        SseEvents(max_event_bytes=1024).feed_each(b"data: 1\n\ndata: 2\n\n" + big, handled.append)
    assert handled == [b"1", b"2"]


def test_cr_lf_split_across_reads_is_one_line_end():
    events = SseEvents()
    assert events.feed(b"data: a\r") == [] and events.feed(b"\n\r") == [b"a"]
    assert events.feed(b"\ndata: b\r\r") == [b"b"]


def test_limits_parse_and_refuse_clearly():
    lim = Limits.parse("event=8MiB,metrics=1GiB")
    assert (lim.event_bytes, lim.head_bytes, lim.metrics_bytes) == (8 << 20, 64 << 10, 1 << 30)
    with pytest.raises(ConfigError, match="--limits: 'evnt=1MiB' is not NAME=SIZE"):
        Limits.parse("evnt=1MiB")
    with pytest.raises(ConfigError, match="--limits: '12' is not a size of at least 1 KiB"):
        Limits.parse("head=12")
    with pytest.raises(ConfigError, match=r"--limits: event is given twice \(give event=SIZE once\)"):
        Limits.parse("event=1MiB,head=64KiB,event=8MiB")  # was taken silently, the last one winning


def _cfg(url: str, out: Path, reader: str, **kw: object) -> RunConfig:
    base: dict[str, object] = dict(endpoint=url, model="peer", workload="chat-short", streams=2, duration_s=1.5,
                                   warmup_s=0.0, adaptive_warmup=False, drain_timeout_s=10.0, request_timeout_s=20.0,
                                   out=out, stream_reader=reader, limits=Limits(event_bytes=1 << 20, head_bytes=16 << 10))
    base.update(kw)
    return RunConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("reader", ["kernel", "aiohttp"])
def test_an_endless_event_and_an_endless_head_fail_their_requests_only(tmp_path: Path, reader: str):
    modes = ("sane", "never_ending", "huge_head")
    with serve_hostile(HostileConfig(tick_s=0.002, modes=modes)) as (peer, url):
        run_dir, summary = run_load_test(_cfg(url, tmp_path / reader, reader))
        sent = list(peer.log.sent)
    req = read_table(run_dir, "requests")
    kinds = dict(zip(req["server_request_id"].fill_null("-"), req["error_kind"].fill_null("ok"), strict=True))
    assert set(req.filter(pl.col("status") == "ok")["server_request_id"].str.slice(0, 4)) == {"sane"}
    endless = [s for s in sent if s.mode == "never_ending"]
    assert endless and max(s.bytes for s in endless) < 64 << 20, "the client left, so the server stopped"
    by_kind = req.group_by("error_kind").len()
    counts = dict(zip(by_kind["error_kind"].fill_null("ok"), by_kind["len"], strict=True))
    assert counts.get("event_too_large", 0) >= 1 and counts.get("head_too_large", 0) >= 1, counts
    assert "sane" in "".join(kinds) and (run_dir / "summary.json").is_file()
    assert summary["failures"]["by_kind"]["event_too_large"]["count"] >= 1


def test_control_replies_are_capped_in_size_and_time(tmp_path: Path):
    with serve_hostile(HostileConfig(control="huge")) as (_, url):
        with pytest.raises(ReplyTooLarge, match="reply_too_large: .* 16777257 bytes, over the 8388608-byte control limit"):
            request_json(url + "/models")
        assert request_json(url + "/models", max_bytes=32 << 20)["object"] == "list"
        with pytest.raises(ConfigError, match=r"--endpoint: GET .*/models failed: reply_too_large"):
            run_load_test(_cfg(url, tmp_path / "huge", "aiohttp"))
    with serve_hostile(HostileConfig(control="trickle")) as (_, url):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="did not finish its reply within 1 s"):
            request_json(url + "/models", timeout=1.0)
        assert time.monotonic() - t0 < 3.0
    with serve_hostile(HostileConfig(tick_s=0.002, control="odd")) as (_, url):  # no traceback: skipped, defaulted
        run_dir, _ = run_load_test(_cfg(url, tmp_path / "odd", "aiohttp"))
        assert read_table(run_dir, "requests").height > 0


def test_a_metrics_body_past_its_cap_is_a_failed_scrape(tmp_path: Path):
    store = RunStore(tmp_path)

    async def main() -> None:
        with serve_hostile(HostileConfig()) as (_, url):
            async with MetricsSampler(url, store, max_bytes=100) as small:
                assert not await small.scrape("baseline")
                small.finish()
            async with MetricsSampler(url, store) as fine:
                assert await fine.scrape("final")

    asyncio.run(main())
    store.close()
    scrapes = read_table(tmp_path, "scrapes")
    assert scrapes.filter(pl.col("reason") == "baseline")["error"][0].startswith("body_too_large: ")
