"""An endpoint that wants a key says which variable to set, not a flag the docs never show with a value."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from itlbench.errors import ConfigError
from itlbench.harness.connect import connect
from itlbench.harness.run_config import RunConfig


class _Status(http.server.BaseHTTPRequestHandler):
    code = 401

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.code)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("code", "fix"), [(401, "set ITLBENCH_API_KEY"), (403, "set ITLBENCH_API_KEY"),
                                           (404, "ends in /v1")])
def test_an_endpoint_refusing_the_key_names_the_environment_variable(tmp_path: Path, code: int, fix: str):
    handler = type("H", (_Status,), {"code": code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = RunConfig(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m", out=tmp_path / "r")
        with pytest.raises(ConfigError) as err:
            connect(cfg, tmp_path / "r")
    finally:
        server.shutdown()
        server.server_close()
    text = str(err.value)
    assert f"HTTP Error {code}" in text and fix in text
    assert "--api-key" not in text
