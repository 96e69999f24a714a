"""Choosing the attention backend at start-up, and the flash backend's calls checked against a
flash-attn stand-in written from flash-attn's documented semantics (flash-attn needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from itlbench.core.engine_config import EngineConfig
from itlbench.engine.attention import (
    FLASH_BLOCK_SIZE,
    SdpaBackend,
    choose,
    flash,
    make_backend,
    triton_backend,
)
from itlbench.engine.attention.cases import make_case, run_backend
from itlbench.errors import ConfigError

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # a device object only: nothing here runs on it


@pytest.fixture
def no_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def cuda_kit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend flash-attn and Triton are installed with a CUDA device (for the choice logic only)."""
    monkeypatch.setattr(flash, "HAS_FLASH_ATTN", True)
    monkeypatch.setattr(triton_backend, "available", lambda device: (True, ""))


def test_cpu_auto_is_sdpa_saying_why(no_interpreter: None) -> None:
    choice = choose("auto", CPU)
    assert choice.backend == "sdpa" and choice.note.startswith("attention: sdpa (auto;") and "CUDA" in choice.note
    assert "\n" not in choice.note, "the runner logs the choice as one line"
    assert isinstance(make_backend(choice.backend, CPU), SdpaBackend)


def test_named_backend_that_cannot_run_is_a_config_error(no_interpreter: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flash, "HAS_FLASH_ATTN", False)
    with pytest.raises(ConfigError) as info:
        choose("flash", CUDA)
    assert info.value.field == "attention" and "flash_attn is not installed" in str(info.value)
    with pytest.raises(ConfigError) as info:
        choose("triton", CPU)
    assert info.value.field == "attention" and "CUDA" in str(info.value)
    with pytest.raises(ConfigError) as info:
        choose("fast", CPU)
    assert info.value.field == "attention"
    with pytest.raises(ConfigError) as info:
        EngineConfig(attention="fast")
    assert info.value.field == "attention"


def test_triton_on_cpu_only_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose("triton", CPU).backend == "triton"
    assert choose("auto", CPU).backend == "sdpa"  # auto never takes the interpreter


def test_auto_on_cuda_prefers_flash_then_triton_then_sdpa(cuda_kit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    choice = choose("auto", CUDA, 16, torch.bfloat16)
    assert (choice.backend, choice.block_size) == ("flash", FLASH_BLOCK_SIZE)
    assert "256" in choice.note  # says why the block size changed
    assert choose("auto", CUDA, 512, torch.bfloat16).block_size == 512
    # an explicit block size flash cannot page: auto moves on to triton and says why
    choice = choose("auto", CUDA, 32, torch.bfloat16)
    assert choice.backend == "triton" and choice.block_size == 32 and "not a multiple of 256" in choice.note
    # float32 is not a flash-attn dtype
    assert choose("auto", CUDA, 16, torch.float32).backend == "triton"
    monkeypatch.setattr(flash, "HAS_FLASH_ATTN", False)
    monkeypatch.setattr(triton_backend, "available", lambda device: (False, "triton is not installed"))
    choice = choose("auto", CUDA, 16, torch.bfloat16)
    assert choice.backend == "sdpa" and "flash_attn is not installed" in choice.note \
        and "triton is not installed" in choice.note


def test_flash_chooses_or_rejects_the_block_size(cuda_kit: None) -> None:
    assert choose("flash", CUDA, 16, torch.bfloat16).block_size == FLASH_BLOCK_SIZE
    assert choose("flash", CUDA, 768, torch.bfloat16).block_size == 768
    with pytest.raises(ConfigError) as info:
        choose("flash", CUDA, 32, torch.bfloat16)
    assert info.value.field == "block_size" and "--block-size 256" in str(info.value)


# ----------------------------------------------------------------- flash backend against a stand-in


@pytest.mark.parametrize("starts,q_lens", [([300, 5, 511, 0], [1, 1, 1, 1]), ([0, 250, 600], [40, 30, 1])],
                         ids=["decode", "mixed"])
def test_flash_backend_matches_sdpa(fake_flash: None, starts: list[int], q_lens: list[int]) -> None:
    case = make_case(starts, q_lens, heads=8, kv_heads=2, head_dim=16, block_size=FLASH_BLOCK_SIZE)
    ref, ref_k, ref_v = run_backend(SdpaBackend(CPU), case)
    out, k_cache, v_cache = run_backend(flash.FlashBackend(CPU), case)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)


# ----------------------------------------------------------------- the flag as a user meets it


@pytest.mark.parametrize("args", [["run", "--attention", "flash", "--duration", "1", "--no-live"],
                                  ["serve", "--attention", "flash", "--port", "0"],
                                  ["run", "--attention", "nope", "--duration", "1", "--no-live"]])
def test_cli_rejects_an_attention_backend_that_cannot_run(args: list[str], tmp_path: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from itlbench.cli import app

    monkeypatch.setattr(flash, "HAS_FLASH_ATTN", False)
    monkeypatch.setenv("GLIBC_TUNABLES", "")  # `serve` would otherwise re-execute this process
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert text.startswith("error: --attention:") and "Traceback" not in text
    assert not any(tmp_path.iterdir())  # no run directory


def test_cpu_install_needs_neither_triton_nor_flash_attn() -> None:
    """With triton and flash_attn unimportable, the engine still builds and runs on CPU, and naming
    either backend is a clear error."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["triton"] = None
sys.modules["flash_attn"] = None
from itlbench.engine.attention import choose
from itlbench.core.engine_config import EngineConfig
from itlbench.serving.build import create_engine
from itlbench.core.request import SamplingParams
from itlbench.errors import ConfigError
engine = create_engine(EngineConfig(model="tiny", kv_blocks=64, max_model_len=256))
out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True))
assert len(out[0]) == 3 and engine.config.attention == "sdpa"
for name in ("triton", "flash"):
    try:
        choose(name, "cpu")
    except ConfigError as exc:
        print(exc.field, exc.problem)
"""
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == ["attention triton is unavailable: triton is not installed (pip install -e '.[cuda]')",
                     "attention flash is unavailable: flash_attn is not installed (pip install flash-attn on a "
                     "CUDA machine)"]
