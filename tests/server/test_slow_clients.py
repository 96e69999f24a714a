"""Slow clients on the bundled server (issue 25, Low; server/guard.py): a head trickled a byte at a
time is cut at its deadline, so is a trickled body, connections past the cap are refused, and a
normal request is served again once the slow ones are gone. Before: a trickling client stayed
connected for aiohttp's 75 s keep-alive timeout, and connections were accepted without limit.

Neither deadline cuts a long generation being streamed or a keep-alive connection idle between
requests. Raw sockets on loopback against the real server; the simulated engine paces the stream."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.server.guard import ConnectionLimits

SIM = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None, max_model_len=4096,
                   sim_time_scale=0.5)
CAP, HEAD_S, BODY_S = 4, 1.0, 1.0
SLACK_S = 4.0  # a loaded box may run the deadline's callback late, never early


@pytest.fixture(scope="module")
def srv() -> Iterator[BackgroundServer]:
    limits = ConnectionLimits(max_connections=CAP, head_timeout_s=HEAD_S, body_timeout_s=BODY_S)
    with BackgroundServer(ServerConfig(engine=SIM, port=0, limits=limits)) as server:
        yield server


def _port(srv: BackgroundServer) -> int:
    assert srv.server is not None
    return srv.server.port


def _request(body: dict, *, close: bool = True) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + (b"Connection: close\r\n" if close else b"") + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)


def _trickle_until_closed(socks: list[socket.socket], data: bytes) -> dict[socket.socket, tuple[float, bytes]]:
    """Send one byte every 0.1 s on each socket until the server closes it: when, and what it said."""
    start, closed = time.monotonic(), {}
    while len(closed) < len(socks) and time.monotonic() - start < HEAD_S + SLACK_S + 1:
        for i, s in enumerate(socks):
            if s in closed:
                continue
            if select.select([s], [], [], 0)[0]:
                try:
                    said = s.recv(65536)
                except ConnectionResetError:
                    said = b""
                closed[s] = (time.monotonic() - start, said)
                continue
            try:
                s.send(data[i % len(data):][:1] or b"x")
            except OSError:
                closed[s] = (time.monotonic() - start, b"")
        time.sleep(0.1)
    return closed


def _ok(port: int) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "hi", "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def test_trickled_heads_are_cut_at_the_deadline_and_connections_past_the_cap_refused(srv: BackgroundServer):
    port, guard = _port(srv), srv.server.guard  # type: ignore[union-attr]
    slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(CAP)]
    for s in slow:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    deadline = time.monotonic() + 5
    while guard.open < CAP and time.monotonic() < deadline:
        time.sleep(0.01)
    assert guard.open == CAP
    with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:  # one past the cap
        try:
            extra.sendall(_request({"prompt": "hi", "max_tokens": 2}))
            said = extra.recv(65536)
        except ConnectionResetError:
            said = b""
    assert not said.startswith(b"HTTP/1.1 200") and (said == b"" or said.startswith(b"HTTP/1.1 503")), said[:200]
    closed = _trickle_until_closed(slow, b"X-Trickle: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")
    for s in slow:
        s.close()
    assert len(closed) == CAP, f"{CAP - len(closed)} trickling clients were still connected after " \
                               f"{HEAD_S + SLACK_S:g} s (head deadline {HEAD_S:g} s)"
    when = sorted(t for t, _ in closed.values())
    assert when[0] >= HEAD_S * 0.9, f"closed at {when[0]:.2f} s, before the {HEAD_S:g} s deadline"
    assert any(said.startswith(b"HTTP/1.1 408") for _, said in closed.values()), closed
    assert guard.timed_out >= CAP and guard.refused >= 1
    deadline = time.monotonic() + 5
    while guard.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _ok(port) == 200, "a normal request is served once the slow clients are gone"


def test_a_trickled_body_is_cut_at_its_deadline(srv: BackgroundServer):
    with socket.create_connection(("127.0.0.1", _port(srv)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        closed = _trickle_until_closed([s], b" ")
    assert closed, f"a trickled body was still being read after {BODY_S + SLACK_S:g} s"
    ((when, said),) = closed.values()
    assert when >= BODY_S * 0.9 and said.startswith(b"HTTP/1.1 408") and b"body" in said, (when, said[:300])


def test_long_streams_and_idle_keepalive_connections_outlive_the_deadlines(srv: BackgroundServer):
    with socket.create_connection(("127.0.0.1", _port(srv)), timeout=30) as s:
        start = time.monotonic()
        s.sendall(_request({"prompt": [5] * 8, "max_tokens": 130, "stream": True, "ignore_eos": True}, close=False))
        got = b""
        while not got.endswith(b"0\r\n\r\n"):  # the chunked body's end
            chunk = s.recv(65536)
            assert chunk, f"the stream was cut after {time.monotonic() - start:.2f} s"
            got += chunk
        assert time.monotonic() - start > HEAD_S + BODY_S, "the stream outlasted both deadlines"
        assert got.count(b"data: ") == 131 and b"[DONE]" in got
        time.sleep(HEAD_S * 1.2)  # idle between requests: the keep-alive timeout's business
        s.sendall(_request({"prompt": "hi", "max_tokens": 2}))
        assert s.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(("flag", "value"), [("--max-connections", "0"), ("--head-timeout", "0"),
                                             ("--body-timeout", "-1")])
def test_bad_limits_are_one_line_errors(flag: str, value: str):
    result = CliRunner().invoke(app, ["serve", "--engine", "sim", "--model", "llama-3.1-8b", flag, value])
    assert result.exit_code == 2 and flag in result.output, result.output
    assert "Traceback" not in result.output
