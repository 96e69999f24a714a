"""The bundled server's port is the child's own: it binds a free port itself, says which in a port
file carrying its pid, and only then is asked `/health`; an impostor on the port is never believed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from itlbench.core.engine_config import EngineConfig
from itlbench.errors import ItlbenchError
from itlbench.harness.bundled_server import PORT_FILE_ENV, BundledServer
from itlbench.server import main as server_main

TINY = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=512)


class _Impostor(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"status": "ok", "impostor": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_child_reports_the_port_it_bound(tmp_path: Path):
    with BundledServer(TINY, tmp_path / "server.log") as srv:
        assert srv.port > 0 and srv.engine_info["engine"]["kv_blocks"] == 128
        assert not srv.port_file.exists()
    assert server_main.PORT_FILE_ENV == PORT_FILE_ENV


def test_a_key_in_the_environment_is_not_required_by_the_bundled_child(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    """ITLBENCH_API_KEY set for other commands reached the child, which then answered the harness's own /v1/engine
    probe 401: `itlbench run` ended in a traceback."""
    monkeypatch.setenv("ITLBENCH_API_KEY", "set-for-another-server")
    with BundledServer(TINY, tmp_path / "server.log") as srv:
        assert srv.engine_info["engine"]["kv_blocks"] == 128


def test_an_impostor_on_the_port_is_never_taken_for_the_engine(tmp_path: Path):
    """Before: `_wait_healthy` accepted the impostor's /health at once and read its engine info."""
    impostor = HTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        srv = BundledServer(TINY, tmp_path / "server.log", port=impostor.server_address[1], start_timeout_s=120)
        with pytest.raises(ItlbenchError, match="the bundled engine server exited with code"):
            srv.start()
        assert srv.engine_info == {}
    finally:
        impostor.shutdown()


def test_a_port_file_from_another_process_is_refused(tmp_path: Path):
    srv = BundledServer(TINY, tmp_path / "server.log")
    srv.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        srv.port_file = tmp_path / "port.json"
        srv.port_file.write_text(json.dumps({"port": 1234, "pid": 1}))
        with pytest.raises(ItlbenchError, match="was not written by the bundled engine server"):
            srv._reported_port()
        server_main.report_port(4321, str(srv.port_file))  # this process: not the child either
        with pytest.raises(ItlbenchError):
            srv._reported_port()
    finally:
        srv.process.kill()
        srv.process.wait()
