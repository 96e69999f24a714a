"""Open a file in headless Chromium over the DevTools protocol: what it logged, loaded and showed.

Chromium prints its DevTools WebSocket URL on stderr when started with `--remote-debugging-port=0`;
aiohttp speaks the protocol. Console errors, uncaught exceptions, log entries at level error, every
network request that is not a `file:` or `data:` URL, and each image's load state are collected,
then a PNG screenshot of the whole page is taken.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--remote-debugging-port=0")


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # non-file, non-data URLs the page asked for
    images: list[tuple[bool, int]] = field(default_factory=list)  # (complete, naturalWidth)
    title: str = ""
    height: int = 0
    screenshot: bytes = b""


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def pump(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                await self.events.put(data)

    async def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[msg_id] = fut
        body: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            body["sessionId"] = session
        await self.ws.send_str(json.dumps(body))
        reply = await fut
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return reply.get("result", {})


def _collect(event: dict[str, Any], result: PageResult) -> None:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        result.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                    for a in params.get("args", [])))
    elif method == "Runtime.exceptionThrown":
        result.errors.append("exception: " + str(params.get("exceptionDetails", {}).get("text")))
    elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        result.errors.append("log: " + str(params["entry"].get("text")))
    elif method == "Network.requestWillBeSent":
        url = params.get("request", {}).get("url", "")
        if not url.startswith(("file:", "data:")):
            result.requests.append(url)
    elif method == "Network.loadingFailed":
        result.errors.append("load failed: " + str(params.get("errorText")))


async def _drive(ws_url: str, page: Path, width: int, timeout_s: float) -> PageResult:
    result = PageResult()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        s = _Session(ws)
        pump = asyncio.create_task(s.pump())
        try:
            async with asyncio.timeout(timeout_s):
                target = (await s.call("Target.createTarget", url="about:blank"))["targetId"]
                sid = (await s.call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
                for domain in ("Runtime", "Log", "Page", "Network"):
                    await s.call(f"{domain}.enable", sid)
                await s.call("Emulation.setDeviceMetricsOverride", sid, width=width, height=1000,
                             deviceScaleFactor=1, mobile=False)
                await s.call("Page.navigate", sid, url=page.resolve().as_uri())
                while True:
                    event = await s.events.get()
                    _collect(event, result)
                    if event.get("method") == "Page.loadEventFired":
                        break
                probe = ("JSON.stringify({title: document.title, height: document.documentElement.scrollHeight, "
                         "images: Array.from(document.images).map(i => [i.complete, i.naturalWidth])})")
                value = json.loads((await s.call("Runtime.evaluate", sid, expression=probe,
                                                 returnByValue=True))["result"]["value"])
                result.title, result.height = value["title"], int(value["height"])
                result.images = [(bool(c), int(w)) for c, w in value["images"]]
                shot = await s.call("Page.captureScreenshot", sid, format="png", captureBeyondViewport=True,
                                    clip={"x": 0, "y": 0, "width": width, "height": min(result.height, 6000),
                                          "scale": 1})
                result.screenshot = base64.b64decode(shot["data"])
                while not s.events.empty():
                    _collect(s.events.get_nowait(), result)
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
    return result


def open_page(page: Path, width: int = 1280, timeout_s: float = 90.0) -> PageResult:
    """Load `page` in a fresh headless Chromium (its own profile) and report what happened."""
    with tempfile.TemporaryDirectory(prefix="itlbench-chromium-") as profile:
        proc = subprocess.Popen([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            ws_url = _devtools_url(proc)
            return asyncio.run(_drive(ws_url, page, width, timeout_s))
        finally:
            _stop_process_group(proc)


def _stop_process_group(proc: subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    """Stop Chromium and every process it started: its renderer and helpers outlive the browser
    process by a moment and still write into the profile directory that is about to be removed."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _devtools_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # Chromium writes the URL within a second or two of starting
        seen.append(line)
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:  # keep draining stderr so Chromium never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return m.group(1)
    raise AssertionError("Chromium exited without a DevTools URL:\n" + "".join(seen[-20:]))
