"""The paced server's truth for scoring other harnesses: arrival times and a request tag in the text."""

import json
import urllib.request

from itlbench.testing.paced_server import PacedConfig, serve_in_thread


def _stream(url: str, max_tokens: int) -> list[dict]:
    body = json.dumps({"model": "paced", "prompt": "hi", "max_tokens": max_tokens, "stream": True}).encode()
    req = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        lines = [ln.decode().removeprefix("data: ").strip() for ln in r if ln.startswith(b"data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


def test_tag_text_names_the_request_and_arrivals_are_logged():
    with serve_in_thread(PacedConfig(tick_s=0.005, tag_text=True, role_chunk=False)) as (srv, url):
        events = _stream(url, 3)
        with urllib.request.urlopen(url.removesuffix("/v1") + "/_log", timeout=10) as r:
            log = json.loads(r.read())
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    sid = events[0]["id"]
    assert texts[:3] == [f" [{sid}]", " tok", " tok"]
    assert len(log["sends"][sid]) == 3
    assert log["arrivals"][sid] <= log["sends"][sid][0]  # one clock: the handler began before the first send
    assert set(log["arrivals"]) == set(log["sends"])


def test_untagged_text_is_unchanged_and_the_word_is_configurable():
    with serve_in_thread(PacedConfig(tick_s=0.005, role_chunk=False)) as (_, url):
        events = _stream(url, 2)
    assert [e["choices"][0]["text"] for e in events if e["choices"]][:2] == [" tok", " tok"]
    with serve_in_thread(PacedConfig(tick_s=0.005, role_chunk=False, word=" the")) as (_, url):
        events = _stream(url, 2)
    assert [e["choices"][0]["text"] for e in events if e["choices"]][:2] == [" the", " the"]


def test_word_passes_through_the_command_line():
    from itlbench.testing.paced_server import _parse

    cfg, _, _ = _parse(["--word", " the", "--tag-text", "True"])
    assert cfg.word == " the" and cfg.tag_text is True


def test_a_streams_end_is_written_in_the_step_of_its_last_token_before_the_next_stream_is_served():
    """Written from the handler after the step, the finish chunk and the body's end trailed the last token
    by the rest of the step; a reader that took them in one read stamped the last token that late."""
    import asyncio

    from itlbench.testing.paced_server import PacedServer, _Stream

    wire: list[tuple[str, bytes]] = []

    class Recorder:  # a test double of the response: which stream's bytes went out, in order
        def __init__(self, sid: str) -> None:
            self.sid = sid

        async def write(self, data: bytes) -> None:
            wire.append((self.sid, data))

        async def write_eof(self) -> None:
            wire.append((self.sid, b"<eof>"))

    async def one_step() -> None:
        srv = PacedServer(PacedConfig())
        loop = asyncio.get_running_loop()
        srv.active = [_Stream(sid, Recorder(sid), False, "paced", left, 0, loop.create_future())  # type: ignore[arg-type]
                      for sid, left in (("a", 1), ("b", 2))]
        await srv._step(1)
        assert [st.sid for st in srv.active] == ["b"] and srv.log == {}

    asyncio.run(one_step())
    a_end = max(i for i, (sid, _) in enumerate(wire) if sid == "a")
    assert [sid for sid, _ in wire[: a_end + 1]] == ["a"] * (a_end + 1), wire  # a's token, finish, usage, [DONE], end
    assert wire[a_end][1] == b"<eof>" and b"[DONE]" in wire[a_end - 1][1]
    assert any(b'"length"' in data for _, data in wire[:a_end])
    assert [sid for sid, _ in wire[a_end + 1:]] == ["b"]  # b's token only: it has one left
