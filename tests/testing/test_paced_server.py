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
