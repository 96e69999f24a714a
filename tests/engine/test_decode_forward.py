"""A CPU decode step's decoder stack in one native call (decode_forward.c) computes the module path's
logits bit for bit, takes only the steps it can, and leaves greedy output unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import PRESETS
from itlbench.core.request import SamplingParams
from itlbench.engine.batch import flatten
from itlbench.engine.cpu import weights as cpu_weights
from itlbench.engine.cpu.decode_forward import MAX_ROWS
from itlbench.serving.build import create_engine
from tests.support.native import native_library, tiny_greedy

GREEDY = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def needs_native():
    native_library()


def engine_with(model: str, lens: tuple[int, ...], seed: int = 0) -> Engine:
    engine = create_engine(EngineConfig(model=model, device="cpu", chunk_budget=512, kv_blocks=1024, max_model_len=2048,
                                 max_num_seqs=512, seed=seed))
    rng = np.random.default_rng(seed)
    for n in lens:
        engine.add_request(rng.integers(3, PRESETS[model].vocab_size, n).tolist(), GREEDY)
    return engine


def next_batch(engine: Engine):
    """Step until the next step is decode rows only; that step's flattened batch (not run)."""
    while True:
        output = engine.scheduler.schedule()
        if all(c.num_new_tokens == 1 for c in output.chunks):
            return flatten(output, engine.config.block_size)
        sampled = engine.runner.run(output, "step").tokens
        engine.scheduler.commit(output, sampled, engine._eos)


@pytest.mark.parametrize("model", ["cpu-small", "tiny"])  # groups of 4 x 32 and 2 x 16
@pytest.mark.parametrize("threads", [1, 2])
def test_logits_equal_the_module_path_bit_for_bit(model, threads) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        engine = engine_with(model, (1, 15, 16, 17, 300, 700))  # contexts across block edges
        batch = next_batch(engine)
        runner = engine.runner
        assert runner.native_decode is not None
        assert runner.native_decode.supports(batch, runner.backend.prepare(batch))
        native_logits = runner.execute(batch)
        path, runner.native_decode = runner.native_decode, None
        module_logits = runner.execute(batch)  # writes the same K/V rows to the same slots again
        runner.native_decode = path
    finally:
        torch.set_num_threads(before)
    assert native_logits.shape == (6, PRESETS[model].vocab_size)
    assert torch.equal(native_logits, module_logits)
    assert runner.last_greedy is None  # the module path leaves sampling to the sampler


def test_greedy_tokens_taken_beside_the_head_are_the_logits_argmax() -> None:
    engine = engine_with("cpu-small", (3, 40, 600))
    batch = next_batch(engine)
    logits = engine.runner.execute(batch)
    assert engine.runner.last_greedy.tolist() == logits.numpy().argmax(axis=1).tolist()


@pytest.mark.parametrize("threads", [1, 2])
def test_native_argmax_is_numpys_on_ties_nan_and_infinities(threads) -> None:
    """numpy's rule: the first maximum, or the first NaN where a row has one."""
    import ctypes

    lib = native_library().lib
    rows = np.array([
        [1.0, 3.0, 3.0, 2.0],  # tie: the first
        [-np.inf] * 4,  # all -inf: index 0
        [1.0, np.nan, 5.0, np.nan],  # the first NaN, though a larger number follows
        [7.0, 1.0, 2.0, np.nan],  # a NaN after the maximum still wins
        [0.0, 0.0, np.inf, np.inf],
        [-2.0, -1.0, -1.0, -3.0],
    ], dtype=np.float32)
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((5, 8193)).astype(np.float32)
    wide[1, [17, 4000]] = 9.0  # a tie across vector lanes
    for x in (rows, wide):
        out = np.empty(x.shape[0], np.int64)
        fn = lib.itl_argmax_rows_f32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        fn(x.ctypes.data, x.shape[0], x.shape[1], out.ctypes.data, threads)
        assert out.tolist() == x.argmax(axis=1).tolist()


def test_only_steps_of_decode_rows_take_it() -> None:
    engine = engine_with("tiny", (40,))
    runner = engine.runner
    prefill = flatten(engine.scheduler.schedule(), engine.config.block_size)
    assert not runner.native_decode.supports(prefill, runner.backend.prepare(prefill))
    engine = engine_with("tiny", (5,) * (MAX_ROWS + 1))
    big = next_batch(engine)  # every request decoding in one step: one row too many for the native step
    assert big.num_reqs == MAX_ROWS + 1
    assert not engine.runner.native_decode.supports(big, engine.runner.backend.prepare(big))


def test_needs_every_projection_in_panels(monkeypatch) -> None:
    monkeypatch.setattr(cpu_weights, "panel_gemm", lambda: None)
    engine = create_engine(EngineConfig(model="tiny", device="cpu", kv_blocks=64, max_model_len=256))
    assert engine.runner.weight_layout != "panels" and engine.runner.native_decode is None


def test_engine_greedy_same_through_the_native_step_and_the_modules() -> None:
    calls: list[int] = []

    def counted(engine: Engine) -> None:
        real = engine.runner.native_decode.run
        engine.runner.native_decode.run = lambda *a: calls.append(1) or real(*a)

    def modules_only(engine: Engine) -> None:
        engine.runner.native_decode = None

    assert tiny_greedy(9, counted, max_tokens=24) == tiny_greedy(9, modules_only, max_tokens=24)
    assert len(calls) > 10  # the decode tail of the run went through it


def test_a_tied_head_goes_through_the_embedding_panels() -> None:
    """Tied weights: the LM head is the embedding table, packed beside the values the lookup reads."""
    from tests.support.models import TIED

    cfg = EngineConfig(model="tiny", device="cpu", chunk_budget=64, kv_blocks=128, max_model_len=512)
    fast, slow = create_engine(cfg, TIED), create_engine(cfg, TIED)
    assert fast.runner.model.lm_head is None and fast.runner.native_decode is not None
    slow.runner.native_decode = None
    prompts = [list(range(3, 3 + n)) for n in (5, 40, 70)]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert fast.generate(prompts, sp) == slow.generate(prompts, sp)
