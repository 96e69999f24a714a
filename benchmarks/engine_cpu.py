"""Prefill throughput and decode step time of the bundled engine on this machine, against its floors.

    python benchmarks/engine_cpu.py [--model cpu-small] [--threads N] [--decode-only] [--long]

A decode step must read every weight it applies and every sequence's K/V cache once: its memory
floor is those bytes over the read bandwidth, and it must do its arithmetic (2 FLOPs per weight per
row, 4 per K/V element and query head): its compute floor is those FLOPs over the rate this machine's
BLAS reaches on a large matrix product with the same threads. The roofline floor is the larger of the
two; `x floor` is the step over the memory floor, `x roofline` over the roofline. At batch 32 and
short contexts a CPU step is compute-bound (the memory floor is out of reach there by construction);
at long contexts the K/V reads dominate.

Both rates are probed between the row's own steps (every `--probe-every` steps; the step after a
probe, which starts on caches the probe flushed, is left out), and the row's floors are the best
probes of the pass they ran in. On a shared box a neighbour moves the read bandwidth between ~28 and
~61 GB/s from one minute to the next; a floor probed in another minute than the steps flatters or
wrongs the step (a batch-32 x 8k row was judged against 52 GB/s measured beside it; minutes later the
same probe read 30 GB/s, and that row's K/V reads ran at 27).
For the same reason every decode
row is measured in several passes spread over the run (`--passes`, round-robin over the rows): the
row shows its best pass against that pass's floors, with every pass's median step beside it.

Each decode row also shows where the step's time goes (the StepRecord split: schedule, prepare,
forward, sample, output). The script re-executes itself with the serving process's malloc settings
(itlbench/engine/malloc_tuning.py) so its figures match what `itlbench serve` runs with. Timing on a
shared machine: compare ratios from one run, and check `uptime` first.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from itlbench.core.engine import Engine
from itlbench.core.engine_config import EngineConfig
from itlbench.core.request import SamplingParams
from itlbench.core.steps import StepRecord
from itlbench.serving.build import create_engine
from itlbench.system.heap import freeze_heap
from itlbench.system.malloc import reexec_with_malloc_tunables

PREFILL_LENS = (512, 2048, 4096, 8192, 16384)
DECODE_BATCHES = (1, 8, 32)
DECODE_CONTEXTS = (512, 8192)
PARTS = ("schedule_ns", "prepare_ns", "forward_ns", "sample_ns", "output_ns")


def measure_bandwidth(mib: int = 1024, repeats: int = 10) -> float:
    """Read bandwidth in bytes/s: the best of several sums over a tensor far larger than any cache."""
    x = torch.ones(mib * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.nbytes / best


def measure_gemm_rate(n: int = 1024, repeats: int = 20) -> float:
    """FLOP/s of a large fp32 matrix product with the current threads: the most a step's GEMMs get."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def streamed_weights(engine: Engine) -> int:
    """Weight elements a decode step applies: every weight but the embedding rows it only indexes."""
    model = engine.runner.model
    return sum(p.numel() for name, p in model.named_parameters() if name != "embed_tokens" or model.lm_head is None)


@dataclass
class Floors:
    bandwidth: float  # bytes/s
    gemm_rate: float  # FLOP/s
    weight_elems: int
    dtype_bytes: int
    kv_bytes_per_token: int
    attn_flops_per_token: int  # per context token of one sequence, all layers

    @classmethod
    def measure(cls, engine: Engine, bandwidth_repeats: int = 10, gemm_repeats: int = 20) -> Floors:
        cfg = engine.model_config
        dtype_bytes = torch.finfo(engine.runner.dtype).bits // 8
        return cls(measure_bandwidth(repeats=bandwidth_repeats), measure_gemm_rate(repeats=gemm_repeats),
                   streamed_weights(engine), dtype_bytes, cfg.kv_bytes_per_token(dtype_bytes),
                   4 * cfg.num_layers * cfg.num_heads * cfg.head_dim)

    @classmethod
    def probe(cls, engine: Engine) -> Floors:
        """A short measurement (~0.1 s) to take between a row's steps."""
        return cls.measure(engine, bandwidth_repeats=2, gemm_repeats=3)

    def best(self, other: Floors) -> Floors:
        """The higher rates of two measurements: what the machine reaches when its neighbours are quiet.
        A single measurement on a shared box can come out a third low, which flatters every multiple."""
        return dataclasses.replace(self, bandwidth=max(self.bandwidth, other.bandwidth),
                                   gemm_rate=max(self.gemm_rate, other.gemm_rate))

    def memory_s(self, batch: int, context: int) -> float:
        return (self.weight_elems * self.dtype_bytes + batch * context * self.kv_bytes_per_token) / self.bandwidth

    def compute_s(self, batch: int, context: int) -> float:
        return (2 * batch * self.weight_elems + batch * context * self.attn_flops_per_token) / self.gemm_rate

    def roofline_s(self, batch: int, context: int) -> float:
        return max(self.memory_s(batch, context), self.compute_s(batch, context))


def random_prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(3, vocab, n).tolist()


def last_record(engine: Engine) -> StepRecord:
    return engine.step_log.since(engine.step_log.last_step)[0]


def bench_prefill(engine: Engine, n: int, rng: np.random.Generator) -> float:
    engine.add_request(random_prompt(rng, n, engine.model_config.vocab_size), SamplingParams(max_tokens=1))
    engine.step()
    assert not engine.has_unfinished()
    return last_record(engine).duration_s


def bench_decode(engine: Engine, batch: int, context: int, steps: int, rng: np.random.Generator,
                 probe: Callable[[], object] | None = None, probe_every: int = 8) -> tuple[float, dict[str, float]]:
    """Median decode step (s) with `batch` sequences at about `context` tokens, and the median of each
    part of the step (ms). `probe` runs after every `probe_every` decode steps; the step after it is
    left out, as is the first (both start on caches something else has just flushed)."""
    sp = SamplingParams(max_tokens=steps + 3, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(random_prompt(rng, context, engine.model_config.vocab_size), sp)
    records: list[StepRecord] = []
    seen, cold = 0, True
    while engine.has_unfinished():
        engine.step()
        rec = last_record(engine)
        if rec.phase == "decode" and rec.num_decode_reqs == batch:
            seen += 1
            if not cold:
                records.append(rec)
            cold = False
            if probe is not None and seen % probe_every == 0 and engine.has_unfinished():
                probe()
                cold = True
    if not records:  # every full-batch step was a cold one, or the batch never decoded together (KV room)
        raise SystemExit(f"no warm decode step of all {batch} sequences at {context} tokens in {steps} steps: give "
                         f"--decode-steps more than {probe_every + 2} (the first step and each after a probe are "
                         "left out), or a smaller batch or context if the KV cache cannot hold it")
    parts = {p.removesuffix("_ns"): statistics.median(getattr(r, p) for r in records) / 1e6 for p in PARTS}
    return statistics.median(r.duration_s for r in records), parts


def decode_engine(model: str, max_context: int, max_batch: int, steps: int) -> Engine:
    """An engine sized for decode runs of up to `max_batch` sequences of `max_context` tokens."""
    longest = max_context + steps + 8
    blocks = -(-max_batch * longest // 16) + 64
    return create_engine(EngineConfig(model=model, chunk_budget=None, kv_blocks=blocks, max_model_len=longest + 8,
                               prefix_caching=False))


def main() -> None:
    reexec_with_malloc_tunables()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--long", action="store_true", help="also prefill 32k tokens")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill table")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--decode-steps", type=int, default=40)
    ap.add_argument("--passes", type=int, default=3, help="measurements of each decode row, spread over the run")
    ap.add_argument("--probe-every", type=int, default=8, help="decode steps between two probes of the floors")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lens = () if args.decode_only else PREFILL_LENS + ((32768,) if args.long else ())
    max_len = max(max(lens, default=0) + 8, max(DECODE_CONTEXTS) + args.decode_steps + 16)
    engine = decode_engine(args.model, max_len, max(DECODE_BATCHES), args.decode_steps)
    cfg, rng = engine.model_config, np.random.default_rng(0)
    start = Floors.measure(engine)
    freeze_heap()  # as the served engine does: collections then scan only what the steps allocate
    kernel = getattr(engine.runner.backend, "decode_kernel", engine.runner.backend.name)
    print(f"model {cfg.name}: {cfg.num_params / 1e6:.1f}M params, {cfg.num_layers} layers, hidden "
          f"{cfg.hidden_size}, heads {cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim}, ffn "
          f"{cfg.intermediate_size}, vocab {cfg.vocab_size}; {engine.device} {engine.dtype}, "
          f"{torch.get_num_threads()} threads, decode attention: {kernel}, weights: "
          f"{engine.runner.weight_layout}\n")
    if lens:
        bench_prefill(engine, 256, rng)  # warm-up
        print("| prefill tokens | seconds | tokens/s |\n|---:|---:|---:|")
        for n in lens:
            s = min(bench_prefill(engine, n, rng) for _ in range(2 if n <= 8192 else 1))
            print(f"| {n} | {s:.2f} | {n / s:,.0f} |", flush=True)
        print()
    passes: dict[tuple[int, int], list[tuple[float, dict[str, float], Floors]]] = {}
    for i in range(max(1, args.passes)):
        for ctx in DECODE_CONTEXTS:
            for b in DECODE_BATCHES:
                probes: list[Floors] = []
                step_s, parts = bench_decode(engine, b, ctx, args.decode_steps, rng,
                                             lambda probes=probes: probes.append(Floors.probe(engine)), args.probe_every)
                floors = functools.reduce(Floors.best, probes) if probes else Floors.measure(engine)
                passes.setdefault((b, ctx), []).append((step_s, parts, floors))
                print(f"decode batch {b} x {ctx}, pass {i + 1}: {step_s * 1e3:.1f} ms/step "
                      f"({floors.bandwidth / 1e9:.1f} GB/s, {floors.gemm_rate / 1e9:.0f} GFLOP/s probed between "
                      "its steps)", flush=True)
    print(f"\nweights read per decode step {start.weight_elems * start.dtype_bytes / 2**20:.1f} MiB; each row: its "
          "best pass, against the best read bandwidth and GEMM rate probed between that pass's steps\n")
    print("| batch | context | ms/step | passes ms | tokens/s | GB/s | GFLOP/s | memory floor ms | x floor "
          "| compute floor ms | x roofline | schedule | prepare | forward | sample | output |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (b, ctx), runs in passes.items():
        step_s, parts, floors = min(runs, key=lambda run: run[0])
        ms, mem, comp = step_s * 1e3, floors.memory_s(b, ctx) * 1e3, floors.compute_s(b, ctx) * 1e3
        split = " | ".join(f"{parts[p.removesuffix('_ns')]:.2f}" for p in PARTS)
        spread = " / ".join(f"{run[0] * 1e3:.1f}" for run in runs)
        print(f"| {b} | {ctx} | {ms:.1f} | {spread} | {b / ms * 1e3:,.0f} | {floors.bandwidth / 1e9:.1f} | "
              f"{floors.gemm_rate / 1e9:.0f} | {mem:.2f} | {ms / mem:.1f} | {comp:.2f} | {ms / max(mem, comp):.1f} | "
              f"{split} |")

if __name__ == "__main__":
    main()
