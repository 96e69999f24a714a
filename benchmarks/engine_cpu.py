"""Prefill throughput and decode step time of the bundled engine on this machine.

    python benchmarks/engine_cpu.py [--model cpu-small] [--long] [--threads N]

Decode is memory-bound, so each decode step is compared with its floor: the bytes it must read
(weights, plus every sequence's K/V cache) divided by the memory bandwidth measured in the same run.
The script re-executes itself with the serving process's malloc settings (see
itlbench/engine/malloc_tuning.py) so its figures match what `itlbench serve` runs with.
Decode runs at short (512) and long (8k, RAG-like) contexts: at long contexts the K/V reads dominate.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from itlbench.engine.config import EngineConfig
from itlbench.engine.engine import Engine
from itlbench.engine.malloc_tuning import reexec_with_malloc_tunables
from itlbench.engine.request import SamplingParams

PREFILL_LENS = (512, 2048, 4096, 8192, 16384)
DECODE_BATCHES = (1, 8, 32)
DECODE_CONTEXTS = (512, 8192)


def measure_bandwidth(mib: int = 1024, repeats: int = 5) -> float:
    """Read bandwidth in bytes/s: the best of several sums over a tensor far larger than any cache."""
    x = torch.ones(mib * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best


def streamed_weight_bytes(engine: Engine) -> int:
    """Bytes a decode step must read: every weight but the embedding rows it does not touch."""
    model = engine.runner.model
    skipped = 0 if model.lm_head is None else model.embed_tokens.numel() * model.embed_tokens.element_size()
    return engine.runner.weight_bytes - skipped


def random_prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(3, vocab, n).tolist()


def last_step_s(engine: Engine) -> float:
    return engine.step_log.since(engine.step_log.last_step)[0].duration_s


def bench_prefill(engine: Engine, n: int, rng: np.random.Generator) -> float:
    engine.add_request(random_prompt(rng, n, engine.model_config.vocab_size), SamplingParams(max_tokens=1))
    engine.step()
    assert not engine.has_unfinished()
    return last_step_s(engine)


def bench_decode(engine: Engine, batch: int, context: int, steps: int, rng: np.random.Generator) -> float:
    sp = SamplingParams(max_tokens=steps + 3, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(random_prompt(rng, context, engine.model_config.vocab_size), sp)
    times = []
    while engine.has_unfinished():
        engine.step()
        rec = engine.step_log.since(engine.step_log.last_step)[0]
        if rec.phase == "decode" and rec.num_decode_reqs == batch:
            times.append(rec.duration_s)
    return statistics.median(times[1:])


def main() -> None:
    reexec_with_malloc_tunables()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--long", action="store_true", help="also prefill 32k tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--decode-steps", type=int, default=20)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lens = PREFILL_LENS + ((32768,) if args.long else ())
    longest_decode = max(DECODE_CONTEXTS) + args.decode_steps + 8
    max_len = max(max(lens) + 8, longest_decode)
    blocks = -(-max(max_len, max(DECODE_BATCHES) * longest_decode) // 16) + 64
    engine = Engine(EngineConfig(model=args.model, chunk_budget=None, kv_blocks=blocks, max_model_len=max_len,
                                 enable_prefix_caching=False))
    cfg, rng = engine.model_config, np.random.default_rng(0)
    weight_bytes = streamed_weight_bytes(engine)
    bw = measure_bandwidth()
    print(f"model {cfg.name}: {cfg.num_params / 1e6:.1f}M params, {cfg.num_layers} layers, hidden "
          f"{cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim}, ffn "
          f"{cfg.intermediate_size}, vocab {cfg.vocab_size}; {engine.device} {engine.dtype}, "
          f"{torch.get_num_threads()} threads")
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; weights read per decode step {weight_bytes / 2**20:.1f} MiB; "
          f"decode floor {weight_bytes / bw * 1e3:.2f} ms/step\n")
    bench_prefill(engine, 256, rng)  # warm-up
    print("| prefill tokens | seconds | tokens/s |\n|---:|---:|---:|")
    for n in lens:
        s = min(bench_prefill(engine, n, rng) for _ in range(2 if n <= 8192 else 1))
        print(f"| {n} | {s:.2f} | {n / s:,.0f} |", flush=True)
    kv_token = cfg.kv_bytes_per_token(torch.finfo(engine.runner.dtype).bits // 8)
    print("\n| decode batch | context | ms/step | tokens/s | floor ms (weights + K/V) | x floor |")
    print("|---:|---:|---:|---:|---:|---:|")
    for ctx in DECODE_CONTEXTS:
        for b in DECODE_BATCHES:
            ms = bench_decode(engine, b, ctx, args.decode_steps, rng) * 1e3
            floor_ms = (weight_bytes + b * ctx * kv_token) / bw * 1e3
            print(f"| {b} | {ctx} | {ms:.1f} | {b / ms * 1e3:,.0f} | {floor_ms:.2f} | {ms / floor_ms:.1f} |",
                  flush=True)

if __name__ == "__main__":
    main()
