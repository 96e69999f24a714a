"""Small holes closed (issue 25, Low): a non-UTF-8 Authorization header is a 401, not a 500; NaN and
Infinity temperatures are refused; a web page's cross-origin `text/plain` POST is refused; a server
open to the network without a key says so; child servers never run the working directory's modules."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ConfigError
from itlbench.harness.bundled_server import server_command
from itlbench.harness.orchestrate import run_load_test
from itlbench.harness.run_config import RunConfig
from itlbench.server import BackgroundServer, ServerConfig
from itlbench.server.main import _log_startup
from itlbench.server.protocol import ApiError, parse_completion, parse_json

TINY = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=512)


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out and b"}" in out:
                break
    return out


def test_bad_key_bytes_text_posts_and_non_finite_temperatures():
    with BackgroundServer(ServerConfig(engine=TINY, port=0, api_key="sk-good")) as srv:
        port = srv.server.port  # type: ignore[union-attr]
        body = b'{"model": "tiny", "prompt": "a b", "max_tokens": 2}'
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n" % len(body)
        reply = _raw(port, head + b"Authorization: Bearer \xff\xfe\r\nContent-Type: application/json\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1.1 401"), reply[:200]  # before: 500 (UnicodeEncodeError)
        reply = _raw(port, head + b"Authorization: Bearer sk-good\r\nContent-Type: text/plain\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1.1 415") and b"send application/json" in reply, reply[:300]
        reply = _raw(port, head + b"Authorization: Bearer sk-good\r\nContent-Type: application/json\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    for bad in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        with pytest.raises(ApiError, match="temperature: must be a finite number"):
            parse_completion(parse_json(b'{"prompt": "a", "temperature": ' + bad + b"}"))


def test_serving_beyond_loopback_without_a_key_warns(caplog: pytest.LogCaptureFixture):
    class _Srv:
        config = ServerConfig(engine=TINY, host="0.0.0.0", port=0)
        base_url = "http://0.0.0.0:0/v1"

    layout = {"engine_process": False, "torch_threads": 1, "decode_kernel": "-", "weight_layout": "-"}
    with caplog.at_level(logging.WARNING, logger="itlbench.server"):
        _log_startup(_Srv(), object(), layout)  # type: ignore[arg-type]
    assert "without an API key" in caplog.text
    caplog.clear()
    _Srv.config = ServerConfig(engine=TINY, host="127.0.0.1", port=0)
    with caplog.at_level(logging.WARNING, logger="itlbench.server"):
        _log_startup(_Srv(), object(), layout)  # type: ignore[arg-type]
    assert "without an API key" not in caplog.text


def test_a_planted_itlbench_in_the_working_directory_is_not_run(tmp_path: Path):
    planted = tmp_path / "itlbench"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('planted module ran')\n")
    (planted / "__main__.py").write_text("raise SystemExit('planted module ran')\n")
    cmd = server_command(TINY, "127.0.0.1", 0)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([*cmd[:4], "--help"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "planted" not in p.stdout + p.stderr, p.stderr[-500:]
    assert cmd[:4] == [sys.executable, "-P", "-m", "itlbench"]


def test_out_naming_a_file_is_a_one_line_error_and_a_users_empty_dir_survives_a_failed_connect(tmp_path: Path):
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="--out: .* is a file, not a directory"):
        run_load_test(RunConfig(endpoint="http://127.0.0.1:9/v1", model="m", duration_s=1.0, out=f))
    empty = tmp_path / "mine"
    empty.mkdir()
    with pytest.raises(ConfigError, match="--endpoint"):
        run_load_test(RunConfig(endpoint="http://127.0.0.1:9/v1", model="m", duration_s=1.0, out=empty))
    assert empty.is_dir() and not any(empty.iterdir())
