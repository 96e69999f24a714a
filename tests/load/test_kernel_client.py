"""The kernel stream reader against real servers on loopback: the paced server (records identical in
content to the aiohttp reader's) and a scripted raw-socket server (framing split anywhere, keep-alive,
a server that closes mid-stream)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from itlbench.errors import ConfigError
from itlbench.load.clients.kclock import kernel_stamps_available
from itlbench.load.clients.kernel import KernelStreamClient, make_stream_client, select_reader
from itlbench.load.clients.kernel_conn import KernelConnection
from itlbench.load.clients.sse import StreamClient, _Exchange
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan, RequestPlan
from tests.support.load import four_streams, plans, run

pytestmark = pytest.mark.skipif(kernel_stamps_available() is not None, reason=str(kernel_stamps_available()))

TIMES = ("scheduled_ns", "sent_ns", "first_token_ns", "last_token_ns", "done_ns", "first_answer_ns")


def _records(run_dir: Path) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    req = read_table(run_dir, "requests").sort("request_id").drop(*TIMES)
    ch = read_table(run_dir, "chunks").sort("request_id", "index")
    return req.to_dicts(), ch


@pytest.mark.parametrize("cfg,api", [
    (PacedConfig(tick_s=0.004), "completions"),
    (PacedConfig(tick_s=0.004), "chat"),
    (PacedConfig(tick_s=0.004, token_ids=True, tokens_per_chunk=3), "completions"),
    (PacedConfig(tick_s=0.004, role_chunk=False, usage=False), "chat"),
])
def test_records_identical_to_the_aiohttp_reader(tmp_path: Path, cfg: PacedConfig, api: str) -> None:
    out = {}
    for reader in ("kernel", "aiohttp"):
        with serve_in_thread(cfg) as (_, url):  # a fresh server each: the same server ids
            plan = LoadPlan(streams=[plans("s", 10, count=3)])
            # a window ends on time, however early its plan ran out: three 10-token requests at 4 ms a token
            # take ~0.15 s, and the 2 s window idled the rest (1 s: 6x their time, as the other clients' tests)
            res = run(plan, url, tmp_path / reader, duration_s=1, target_kw={"api": api, "stream_reader": reader})
        assert res.client.stream_reader == reader and res.counts["ok"] == 3
        out[reader] = _records(tmp_path / reader)
    (kreq, kch), (areq, ach) = out["kernel"], out["aiohttp"]
    assert kreq == areq
    same = ["request_id", "index", "n_tokens"]
    assert kch.select(same).equals(ach.select(same))
    assert set(kch["stamp"]) == {"kernel"} and set(ach["stamp"]) == {"user"}
    assert (kch["t_ns"] < kch["t_read_ns"]).all()  # the data arrived before the read returned
    assert ach["t_ns"].equals(ach["t_read_ns"], check_names=False)


def test_error_status_recorded_like_the_aiohttp_reader(tmp_path: Path) -> None:
    rows = {}
    for reader in ("kernel", "aiohttp"):
        with serve_in_thread(PacedConfig(status=500)) as (_, url):  # not 503: that one backs the stream off
            run(LoadPlan(streams=[plans("e", 5, count=2)]), url, tmp_path / reader, duration_s=0.5,
                target_kw={"stream_reader": reader})
        rows[reader] = _records(tmp_path / reader)[0]
    assert rows["kernel"] == rows["aiohttp"]
    assert [r["http_status"] for r in rows["kernel"]] == [500, 500]
    assert "paced server set to fail" in rows["kernel"][0]["error"]


# --- a scripted server: exact bytes, split and paced as the test says ------------------------------

def _event(text: str, finish: str | None = None, sid: str = "cmpl-7") -> bytes:
    finish_json = "null" if finish is None else f'"{finish}"'
    return (f'data: {{"id":"{sid}","object":"text_completion","model":"m","choices":[{{"index":0,'
            f'"text":"{text}","finish_reason":{finish_json}}}]}}\n\n').encode()


def chunked_response(events: list[bytes], *, close: bool = False, end: bool = True) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    head += b"Connection: close\r\n\r\n" if close else b"\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return head + body + (b"0\r\n\r\n" if end else b"")


STREAM = [_event(""), _event(" a"), _event(" b"), _event(" c"), _event("", "length"), b"data: [DONE]\n\n"]


class Scripted:
    """A raw HTTP/1.1 server on a thread: for the k-th request it sends `script(k)`, a list of byte
    pieces, each with its own `sendall` after `gap_s`; `close_after` closes the connection after
    that many responses on it (None: keep it open)."""

    def __init__(self, script: Any, gap_s: float = 0.0, close_after: int | None = None) -> None:
        self.script, self.gap_s, self.close_after = script, gap_s, close_after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.connections = 0
        self.requests = 0
        self._threads: list[threading.Thread] = []
        self._stop = False

    def __enter__(self) -> Scripted:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            buf, served = b"", 0
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                k, self.requests = self.requests, self.requests + 1
                try:
                    for piece in self.script(k):
                        if self.gap_s:
                            time.sleep(self.gap_s)  # pacing the server's writes (separate packets), not a sync
                        conn.sendall(piece)
                except OSError:  # the client hung up (a cancelled request)
                    return
                served += 1
                if self.close_after is not None and served >= self.close_after:
                    return


class _Rows:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {"requests": [], "chunks": []}

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows[table].append(row)


def _plan(k: int, n: int = 3) -> RequestPlan:
    return RequestPlan(f"r{k}", "w", "w", 4, n, prompt_token_ids=(1, 2, 3, 4))


async def _drive(cls: type[StreamClient], url: str, n: int = 1) -> tuple[_Rows, StreamClient]:
    sink = _Rows()
    async with cls(Target(url, "m", timeout_s=10), sink) as client:
        for k in range(n):
            await client.run(_plan(k), time.perf_counter_ns())
    return sink, client


def drive(cls: type[StreamClient], url: str, n: int = 1) -> tuple[_Rows, StreamClient]:
    return asyncio.run(_drive(cls, url, n))


def _split_everywhere(data: bytes, step: int) -> list[bytes]:
    return [data[i:i + step] for i in range(0, len(data), step)]


@pytest.mark.parametrize("step", [1, 5, 17, 64])
def test_events_split_across_packets(step: int) -> None:
    """The response arrives in pieces of `step` bytes: head, chunk sizes, events and CRLFs split anywhere."""
    with Scripted(lambda k: _split_everywhere(chunked_response(STREAM), step), gap_s=0.0005) as srv:
        sink, _ = drive(KernelStreamClient, srv.url)
    req = sink.rows["requests"][0]
    assert (req["status"], req["output_tokens"], req["num_chunks"], req["finish_reason"]) == ("ok", 3, 3, "length")
    assert [c["n_tokens"] for c in sink.rows["chunks"]] == [1, 1, 1]
    assert req["server_request_id"] == "cmpl-7"


def test_crlf_comments_and_multiline_events() -> None:
    events = [b": keep-alive\r\n\r\n", _event(" a").replace(b"\n", b"\r\n"),
              b"event: message\ndata: " + _event(" b")[6:], b"data: [DONE]\n\n"]
    with Scripted(lambda k: [chunked_response(events)]) as srv:
        sink, _ = drive(KernelStreamClient, srv.url)
    req = sink.rows["requests"][0]
    assert (req["status"], req["output_tokens"]) == ("ok", 2)


def test_several_events_in_one_packet_share_a_stamp_and_say_so() -> None:
    # the first read carries head + role + one token; then one packet with two tokens and the end
    first = chunked_response(STREAM[:2], end=False)
    rest = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in STREAM[2:]) + b"0\r\n\r\n"
    with Scripted(lambda k: [first, rest], gap_s=0.01) as srv:
        sink, _ = drive(KernelStreamClient, srv.url)
    chunks = sink.rows["chunks"]
    assert [c["read_chunks"] for c in chunks] == [1, 2, 2]
    assert chunks[1]["t_ns"] == chunks[2]["t_ns"] != chunks[0]["t_ns"]
    assert all(c["stamp"] == "kernel" and c["t_ns"] < c["t_read_ns"] for c in chunks)


def test_keep_alive_reuses_one_connection() -> None:
    with Scripted(lambda k: [chunked_response(STREAM)]) as srv:
        sink, client = drive(KernelStreamClient, srv.url, n=4)
    assert [r["status"] for r in sink.rows["requests"]] == ["ok"] * 4
    assert srv.connections == 1 and isinstance(client, KernelStreamClient) and client.connections_opened == 1


def test_connection_close_and_a_server_that_closes_idle_connections() -> None:
    """`Connection: close` is honoured; a pooled connection the server closed is not used again (or,
    if the close races the send, the request goes once more on a fresh connection)."""
    with Scripted(lambda k: [chunked_response(STREAM, close=True)]) as srv:
        sink, client = drive(KernelStreamClient, srv.url, n=3)
    assert [r["status"] for r in sink.rows["requests"]] == ["ok"] * 3 and srv.connections == 3
    with Scripted(lambda k: [chunked_response(STREAM)], close_after=1) as srv:
        sink, client = drive(KernelStreamClient, srv.url, n=3)
    assert [r["status"] for r in sink.rows["requests"]] == ["ok"] * 3 and srv.requests == 3


def test_close_delimited_body() -> None:
    head = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    with Scripted(lambda k: [head, *STREAM], gap_s=0.001, close_after=1) as srv:
        sink, _ = drive(KernelStreamClient, srv.url)
    assert sink.rows["requests"][0]["status"] == "ok" and sink.rows["requests"][0]["output_tokens"] == 3


@pytest.mark.parametrize("cls", [KernelStreamClient, StreamClient])
def test_server_closing_mid_stream_is_a_connection_error_with_the_chunks_kept(cls: type[StreamClient]) -> None:
    partial = chunked_response(STREAM[:3], end=False)
    with Scripted(lambda k: [partial], close_after=1) as srv:
        sink, _ = drive(cls, srv.url)
    req = sink.rows["requests"][0]
    assert req["status"] == "error" and req["num_chunks"] == 2 and len(sink.rows["chunks"]) == 2
    assert req["error"]


def test_mid_stream_close_recorded_alike_by_both_readers() -> None:
    partial = chunked_response(STREAM[:3], end=False)
    out = {}
    for cls in (KernelStreamClient, StreamClient):
        with Scripted(lambda k: [partial], close_after=1) as srv:
            sink, _ = drive(cls, srv.url)
        out[cls] = {k: v for k, v in sink.rows["requests"][0].items() if k not in (*TIMES, "error")}
    assert out[KernelStreamClient] == out[StreamClient]


def test_unreachable_server_is_a_connection_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    sink = _Rows()

    async def main() -> Any:
        async with KernelStreamClient(Target(url, "m"), sink) as client:
            return await client.run(_plan(0), time.perf_counter_ns())

    out = asyncio.run(main())
    assert out.status == "error" and out.connection_error and "Connection" in sink.rows["requests"][0]["error"]


def test_cancelled_request_is_recorded_and_its_connection_dropped() -> None:
    slow = [chunked_response(STREAM[:2], end=False)] + [b"%x\r\n%s\r\n" % (len(e), e) for e in STREAM[2:]]

    async def main(url: str) -> tuple[_Rows, KernelStreamClient]:
        sink = _Rows()
        async with KernelStreamClient(Target(url, "m"), sink) as client:
            task = asyncio.create_task(client.run(_plan(0), time.perf_counter_ns()))
            while not any(c.ex is not None and c.ex.times for c in client._conns.values()):
                await asyncio.sleep(0.005)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert not client._conns and not client._idle
        return sink, client

    with Scripted(lambda k: slow, gap_s=0.5) as srv:
        sink, _ = asyncio.run(main(srv.url))
    req = sink.rows["requests"][0]
    assert req["status"] == "cancelled" and req["num_chunks"] == 1 and len(sink.rows["chunks"]) == 1


def test_reader_selection() -> None:
    sink = _Rows()
    assert select_reader(Target("http://127.0.0.1:1/v1", "m")) == "kernel"
    assert select_reader(Target("https://api.example.com/v1", "m")) == "aiohttp"
    assert select_reader(Target("http://127.0.0.1:1/v1", "m", stream_reader="aiohttp")) == "aiohttp"
    assert type(make_stream_client(Target("http://127.0.0.1:1/v1", "m"), sink)) is KernelStreamClient
    with pytest.raises(ConfigError, match="--stream-reader"):
        select_reader(Target("https://api.example.com/v1", "m", stream_reader="kernel"))
    with pytest.raises(ConfigError, match="--stream-reader"):
        Target("http://127.0.0.1:1/v1", "m", stream_reader="fast")



@pytest.mark.parametrize("args", [["--stream-reader", "fast"],
                                  ["--stream-reader", "kernel", "--endpoint", "https://api.example.com/v1",
                                   "--model", "m"]])
def test_bad_stream_reader_flag_exits_2_naming_it(tmp_path: Path, args: list[str]) -> None:
    from typer.testing import CliRunner

    from itlbench.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--out", str(out), *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "--stream-reader" in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not out.exists()


# --- the whole-read fast path: never a different record from the general path ------------------

def _feed_all(reads: list[bytes], fast: bool) -> tuple[list[int], list[int], str | None, bool, str | None]:
    """Feed reads (read k stamped k) to a connection's parser; (stamps, counts, finish, done, error)."""
    client = KernelStreamClient(Target("http://127.0.0.1:9/v1", "m"), _Rows())
    with socket.socket() as s:
        c = KernelConnection(s, client, True)
        ex = _Exchange(_plan(0), 0, None)
        c.begin(ex, None)
        for k, data in enumerate(reads, start=1):
            if not fast:
                c.fast = False
            c.feed(data, 1000 * k, 1000 * k + 1)
    return ex.times, ex.counts, ex.finish_reason, ex.saw_done, ex.error


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


TRICKY = [" b", "", 'say \\"x\\"', "ends\\\\", " c", "two\\nlines", " d"]


@pytest.mark.parametrize("extra", [
    [],
    [_chunk(_event(" e") + _event(" f"))],  # two events in one HTTP chunk
    [_chunk(_event(" g"))[:20], _chunk(_event(" g"))[20:]],  # one chunk over two reads
    [_chunk(_event(" h")) + _chunk(_event(" i"))],  # two chunks in one read
    [_chunk(_event(" j").replace(b"\n\n", b"\r\n\r\n"))],  # CRLF line ends
    [_chunk(b"data: " + _event(" k")[6:].replace(b'"text"', b'"text" '))],  # another shape
])
def test_fast_path_records_what_the_general_path_records(extra: list[bytes], monkeypatch: Any) -> None:
    taken = []
    fast_path = KernelConnection._fast
    monkeypatch.setattr(KernelConnection, "_fast", lambda self, *a: taken.append(fast_path(self, *a)) or taken[-1])
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    reads = [head + _chunk(_event("")), _chunk(_event(" a"))]
    reads += [_chunk(_event(t)) for t in TRICKY] + extra + [_chunk(_event(" z"))]
    reads += [_chunk(_event("", "length")), _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    fast, slow = _feed_all(reads, True), _feed_all(reads, False)
    assert fast == slow
    assert fast[2] == "length" and fast[3] and fast[4] is None
    assert taken.count(True) >= 3 and False in taken  # the fast path served some reads and refused others


def _plain(status: str, ctype: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body)


@pytest.mark.parametrize("response,kind", [
    (_plain("200 OK", b"application/json", b'{"id":"x","choices":[{"text":"hello"}]}'), "not_sse"),
    (chunked_response([_event(" a"), b"data: {not json\n\n"]), "bad_json"),
    (chunked_response([_event(""), _event(" a"), b"data: {\"id\":\"cmpl-7\",\"choi"]), "truncated"),
    (_plain("429 Too Many Requests", b"application/json", b'{"error":{"message":"slow down"}}'), "http_status"),
    (chunked_response([_event(" a"), b'data: {"error":{"message":"engine died"}}\n\n']), "server_error"),
    # after the shape is learnt (" a", " b"), a chunk that is not JSON: once counted as a token by the kernel reader
    *[(chunked_response([_event(""), _event(" a"), _event(" b"), bad, _event("", "length")]), "bad_json") for bad in (
        _event(" c").replace(b'"object":', b'"object"'),  # a key without its colon
        _event(" c")[:-8] + b"\n\n",  # cut short
        _event("tab\there"),  # a raw control byte (a tab) in the text
        _event("\\q"),  # an escape JSON has not
        _event(" c").replace(b" c", b"\xff\xfe"),  # bytes that are not UTF-8
    )],
])
def test_broken_responses_recorded_alike_by_both_readers(response: bytes, kind: str) -> None:
    out = {}
    for cls in (KernelStreamClient, StreamClient):
        with Scripted(lambda k: [response]) as srv:
            sink, _ = drive(cls, srv.url)
        out[cls] = {k: v for k, v in sink.rows["requests"][0].items() if k not in TIMES}
    assert out[KernelStreamClient] == out[StreamClient]
    assert out[KernelStreamClient]["error_kind"] == kind and out[KernelStreamClient]["status"] == "error"


def test_worker_processes_read_with_kernel_stamps(tmp_path: Path) -> None:
    from itlbench.load.multiproc import drive_workers
    from itlbench.rundir.store import RunStore

    store = RunStore(tmp_path)
    with serve_in_thread(PacedConfig(tick_s=0.01)) as (_, url):
        res = asyncio.run(drive_workers(four_streams, Target(url, "paced"), store, workers=2, duration_s=0.8))
    store.close()
    assert res.client.stream_reader == "kernel" and res.client.kernel_clock is not None
    assert set(read_table(tmp_path, "chunks")["stamp"]) == {"kernel"}
