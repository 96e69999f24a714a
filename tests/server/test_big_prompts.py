"""A 4 MiB prompt is parsed and tokenised off the server's event loop (issue 25, Low): while it is,
another stream's tokens keep flowing. Before, the loop did the work itself and every stream stalled
for the whole tokenisation.

The simulated engine paces the steady stream (a step every ~20 ms, no torch), so the stream's
largest gap while the big request is handled is compared with that request's own time, as a ratio."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

from itlbench.core.engine_config import EngineConfig
from itlbench.server import BackgroundServer, ServerConfig

SIM = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", chunk_budget=None, max_model_len=32768,
                   sim_time_scale=4.0)


def _stream(port: int, stamps: list[float], stop: threading.Event) -> None:
    """A streamed completion read off a raw socket, the arrival of every SSE event stamped."""
    body = json.dumps({"prompt": [5] * 16, "max_tokens": 1000, "stream": True, "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        while not stop.is_set() and (data := s.recv(65536)):
            stamps.extend([time.perf_counter()] * data.count(b"data: "))


def _post_big(port: int, prompt: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": prompt, "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_a_4mib_prompt_is_tokenised_while_other_streams_keep_flowing():
    with BackgroundServer(ServerConfig(engine=SIM, port=0, max_body_mib=5)) as srv:
        port = srv.server.port  # type: ignore[union-attr]
        stamps: list[float] = []
        stop = threading.Event()
        reader = threading.Thread(target=_stream, args=(port, stamps, stop), daemon=True)
        reader.start()
        while len(stamps) < 10 and reader.is_alive():
            time.sleep(0.01)
        t0 = time.perf_counter()
        status = _post_big(port, "a" * (4 << 20))  # 4 Mi tokens: refused for the context, after tokenising
        t1 = time.perf_counter()
        n = len(stamps)
        while len(stamps) < n + 5 and reader.is_alive():
            time.sleep(0.01)
        stop.set()
        reader.join(30)
    assert status == 400
    during = [b - a for a, b in zip(stamps, stamps[1:], strict=False) if b > t0 and a < t1]
    assert during, "the stream delivered tokens around the big request"
    ratio = max(during) / (t1 - t0)
    assert ratio < 0.5, (f"the stream stalled {max(during) * 1e3:.0f} ms while a 4 MiB prompt took "
                         f"{(t1 - t0) * 1e3:.0f} ms (ratio {ratio:.2f}): tokenised on the event loop")
