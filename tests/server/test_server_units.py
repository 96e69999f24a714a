"""Pieces of the server in isolation: detokenizer, protocol parsing, engine driver lifecycle, entry point."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.core.tokenizer import ByteTokenizer
from itlbench.errors import ConfigError
from itlbench.harness.bundled_server import BundledServer, free_port
from itlbench.server.detok import IncrementalDetokenizer
from itlbench.server.protocol import ApiError, parse_chat, parse_completion, render_chat
from itlbench.serving.async_engine import AsyncEngine, EngineDeadError
from itlbench.serving.build import create_engine
from itlbench.serving.client import SHUT_DOWN

TINY = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=512, seed=0)


def test_detokenizer_never_splits_a_utf8_character():
    tok = ByteTokenizer(512)
    ids = tok.encode("héllo ✓ wörld")
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == "héllo ✓ wörld"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[ids.index(tok.encode("✓")[0])] == ""  # held back until the character completes


def test_detokenizer_flushes_invalid_bytes_at_the_end():
    tok = ByteTokenizer(512)
    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.encode("ok")) == "ok"
    assert detok.push([3 + 0xE2]) == ""
    assert detok.push([], final=True) == "\ufffd"


def test_protocol_accepts_token_lists_and_chat_parts():
    req = parse_completion({"prompt": [[1, 2, 3]], "max_tokens": 4, "stream": True,
                            "stream_options": {"include_usage": True}})
    assert req.prompt == [1, 2, 3] and req.include_usage and req.max_tokens == 4
    chat = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "max_completion_tokens": 9, "max_tokens": 2})
    assert chat.prompt == "<|user|>\nhi\n<|assistant|>\n" and chat.max_tokens == 9
    assert render_chat([{"role": "system", "content": None}]) == "<|system|>\n\n<|assistant|>\n"
    assert parse_completion({"prompt": "x", "stop": ["\n"]}).stop == ("\n",)
    with pytest.raises(ApiError) as info:
        parse_completion({"prompt": "x", "stop": [1]})
    assert info.value.param == "stop"


def test_async_engine_streams_and_fails_in_flight_on_shutdown():
    torch.set_num_threads(1)
    engine = create_engine(TINY)

    async def scenario() -> None:
        driver = AsyncEngine(engine)
        driver.start()
        outs = [o async for o in driver.generate([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))]
        assert [len(o.new_token_ids) for o in outs] == [1, 1, 1, 1] and outs[-1].finished
        stream = await driver.add([5, 6, 7], SamplingParams(max_tokens=400, ignore_eos=True))
        await asyncio.to_thread(driver.shutdown)
        with pytest.raises(EngineDeadError) as cut:
            async for _ in stream:
                pass
        assert not driver.is_alive
        with pytest.raises(EngineDeadError) as refused:
            await driver.add([1, 2], SamplingParams(max_tokens=2))
        # the cut stream and the refused request in one sentence: why_not_alive's (it said "engine stopped: shutdown")
        assert str(cut.value) == str(refused.value) == await driver.why_not_alive() == SHUT_DOWN

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_async_engine_rejects_bad_input_with_the_engine_error():
    engine = create_engine(TINY)

    async def scenario() -> None:
        driver = AsyncEngine(engine)
        driver.start()
        try:
            with pytest.raises(ValueError, match="max_tokens"):
                await driver.add([5] * 500, SamplingParams(max_tokens=100))
            outs = [o async for o in driver.generate("ok", SamplingParams(max_tokens=2, ignore_eos=True))]
            assert outs[-1].finish_reason == "length"
        finally:
            await asyncio.to_thread(driver.shutdown)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_module_entry_point_serves_with_bundled_flags(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "itlbench", "serve", "--model", "tiny", "--device", "cpu", "--chunk-budget", "64",
           "--kv-blocks", "128", "--max-model-len", "512", "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if _get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        status, body = _get(f"http://127.0.0.1:{port}/v1/engine")
        assert status == 200 and json.loads(body)["engine"]["kv_blocks"] == 128
        status, body = _get(f"http://127.0.0.1:{port}/nope")
        assert status == 404 and "error" in json.loads(body)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    startup = out.decode()
    for part in ("model=tiny", "device=cpu", "dtype=float32", "chunk_budget=64", "policy=budget",
                 f"http://127.0.0.1:{port}/v1"):
        assert part in startup


def _every_field_changed() -> EngineConfig:
    """An EngineConfig whose every field differs from its default, so a dropped one shows."""
    cfg = EngineConfig(model="tiny", chunk_budget=96, unchunked_prefill_cap=4096, policy="prefill-first",
                       mixed=True, max_num_seqs=7, block_size=32, kv_blocks=None, kv_memory_gib=0.0005,
                       max_model_len=640, prefix_caching=False, device="cpu", dtype="float32", seed=3,
                       gpu_memory_fraction=0.5, attention="sdpa", cuda_graphs=False,
                       engine_process=True, torch_threads=1)
    defaults = EngineConfig()
    same = [f for f, v in cfg.as_dict().items()
            if v == defaults.as_dict()[f] and f != "kv_blocks" and f not in SIM_FIELDS]
    assert not same, f"give these fields non-default values too: {same}"
    return cfg


# The simulated engine's fields, changed in a test of their own (disaggregation needs prefix caching on).
SIM_FIELDS = ("engine", "gpu", "sim_time_scale", "disaggregate", "prefill_gpu", "kv_link_gbps", "tp", "kv_cache_dtype")


def test_sim_engine_config_survives_the_process_boundary(tmp_path):
    cfg = EngineConfig(model="tiny", engine="sim", gpu="h200", sim_time_scale=3.0, disaggregate=True,
                       prefill_gpu="a100", kv_link_gbps=100.0, kv_blocks=64, tp=2, kv_cache_dtype="float16")
    assert all(getattr(cfg, f) != getattr(EngineConfig(), f) for f in SIM_FIELDS)
    with BundledServer(cfg, tmp_path / "server.log") as srv:
        info = srv.engine_info
    assert info["engine"] == cfg.as_dict()
    assert info["device"] == "sim:a100x2->h200x2"


def test_engine_config_survives_the_process_boundary(tmp_path):
    cfg = _every_field_changed()
    assert EngineConfig.from_json(cfg.to_json()) == cfg
    with BundledServer(cfg, tmp_path / "server.log") as srv:
        info = srv.engine_info
    assert info["engine"] == cfg.as_dict()
    # tiny: K+V · 2 layers · 2 KV heads · dim 16 · fp32 = 512 bytes a token, 32 tokens a block
    assert info["kv_blocks"] == int(0.0005 * 2**30) // (32 * 512) == 32  # kv_memory_gib and block_size arrived


def test_engine_config_json_rejects_unknown_fields():
    with pytest.raises(ConfigError, match="unknown field.*chunk_budgt"):
        EngineConfig.from_json('{"chunk_budgt": 5}')


@pytest.mark.parametrize(("doc", "words"), [('{"chunk_budget": "x"}', 'chunk_budget is "x" (give an integer or null)'),
                                            ('{"policy": "fifo"}', 'give "budget" or "prefill-first"'),
                                            ('{"mixed": 1}', "mixed is 1 (give true or false)"),
                                            ('{"tp": 2.5}', "tp is 2.5 (give an integer)")])
def test_engine_config_json_names_a_field_of_the_wrong_type(doc: str, words: str):
    with pytest.raises(ConfigError, match="--engine-config") as err:
        EngineConfig.from_json(doc)
    assert words in str(err.value)
    # every field as to_json writes it reads back, JSON's integers standing for floats too
    config = EngineConfig(model="llama-3.1-8b", engine="sim", chunk_budget=None, kv_memory_gib=2, gpu="h100", tp=2)
    assert EngineConfig.from_json(config.to_json()) == config


def test_serve_refuses_engine_flags_beside_engine_config():
    result = CliRunner().invoke(app, ["serve", "--engine-config", EngineConfig(model="tiny").to_json(),
                                      "--chunk-budget", "64", "--port", "0"])
    assert result.exit_code == 2
    assert "--engine-config" in result.output and "--chunk-budget" in result.output


@pytest.mark.parametrize(("args", "flag"), [(["--port", "99999"], "--port"), (["--host", "no-such-host.invalid"], "--host"),
                                            (["--model", "no-such-model"], "--model")])
def test_serve_refuses_an_address_or_model_it_cannot_use_in_one_line(args, flag):
    result = CliRunner().invoke(app, ["serve", "--engine", "sim", "--model", "llama-3.1-8b", *args])
    assert result.exit_code == 2 and f"error: {flag}" in result.output, result.output
    assert "Traceback" not in result.output


def test_serve_on_a_port_in_use_says_so_before_and_after_the_engine_starts():
    import socket

    from itlbench.server import ServerConfig
    from itlbench.server.main import start_server

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--engine", "sim", "--model", "llama-3.1-8b", "--port", str(port)])
        assert result.exit_code == 2 and f"127.0.0.1:{port} is already in use" in result.output, result.output
        # taken between the check and the bind: the same error, and the engine it built is shut down
        config = ServerConfig(engine=EngineConfig(engine="sim", model="llama-3.1-8b"), port=port)
        with pytest.raises(ConfigError, match="already in use"):
            asyncio.run(start_server(config))
