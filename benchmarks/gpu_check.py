"""One section of the GPU check (`benchmarks/gpu_check.sh` runs them all): prints a table, writes JSON.

Sections:
- env: GPU, torch, Triton, flash-attn, measured HBM bandwidth.
- kernels: the Triton and flash-attn backends against an fp32 SDPA reference at several paged shapes
  (decode, prefill, chunk after a prefix, mixed; GQA 1/4/8; blocks 16 and 256), plus a timing each.
- decode: Llama-3.1-8B (dummy weights, bf16) decode steps at batch 1 and 32, context 2048, per
  backend with and without CUDA graphs, against the HBM floor (weights + K/V read once per step).
- prefill: one unchunked prefill of 2k and of 32k tokens per backend; MFU from the source documents' FLOP count.
- scenario: `itlbench run`, 32 chat streams, one 32k injection, unchunked vs budget 2048: ITL p99 and
  worst gap, the stall, the injected TTFT.
- sim: the simulator's preset for this GPU on every decode and prefill step measured above (its error
  on the same shapes), the copy bandwidth against the preset's bandwidth share, and `itlbench
  calibrate` on the scenario's step logs. Reads the other sections' JSON; needs no GPU.

The scenario and sim sections live in `gpu_check_scenario.py`.

`--dry-run` runs the same code on CPU at tiny shapes (tiny model, Triton in its interpreter), which
checks the script's logic without a GPU; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the scenario and sim sections run itlbench itself; sim_preset is imported for the tests, which read it here
from benchmarks.gpu_check_scenario import section_scenario, section_sim, sim_preset  # noqa: E402, F401
from benchmarks.gpu_check_setup import Setup, setup  # noqa: E402
from itlbench.core.engine import Engine  # noqa: E402
from itlbench.core.engine_config import EngineConfig  # noqa: E402
from itlbench.core.model_config import ModelConfig  # noqa: E402
from itlbench.core.request import SamplingParams  # noqa: E402
from itlbench.engine.attention import flash, make_backend, triton_backend  # noqa: E402
from itlbench.engine.attention.cases import make_case, run_backend  # noqa: E402
from itlbench.serving.build import create_engine  # noqa: E402

# Dense bf16 tensor-core peak and HBM bandwidth by device name (vendor data sheets; the source documents use H100 SXM).
GPU_SPECS = {  # substring of torch.cuda.get_device_name() -> (FLOP/s, bytes/s)
    "H200": (989e12, 4.8e12),
    "H100 PCIe": (756e12, 2.0e12),
    "H100 NVL": (835e12, 3.9e12),
    "H100": (989e12, 3.35e12),
    "A100-SXM4-80GB": (312e12, 2.039e12),
    "A100": (312e12, 1.555e12),
    "L40S": (362e12, 0.864e12),
}


def gpu_spec() -> tuple[str, float | None, float | None]:
    if not torch.cuda.is_available():
        return "cpu", None, None
    name = torch.cuda.get_device_name()
    for key, (flops, bw) in GPU_SPECS.items():
        if key in name:
            return name, flops, bw
    return name, None, None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_bandwidth(device: torch.device, gib: float = 2.0) -> float:
    """Bytes/s of a device-to-device copy (read + write), best of 5."""
    n = int(gib * (1 << 30)) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    best = math.inf
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        best = min(best, time.perf_counter() - t)
    del a, b
    return 2 * n * 2 / best


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def available_backends(s: Setup) -> list[str]:
    names = ["sdpa"]
    if triton_backend.available(s.device)[0]:
        names.append("triton")
    if flash.available(s.device, None, s.dtype)[0]:
        names.append("flash")
    return names


# ----------------------------------------------------------------- env


def section_env(s: Setup) -> dict:
    name, flops, bw = gpu_spec()
    out = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "peak_flops": flops, "nominal_bandwidth": bw,
           "measured_bandwidth": measured_bandwidth(s.device, 0.25 if s.dry_run else 2.0),
           "triton": _version("triton"), "flash_attn": _version("flash_attn"),
           "triton_usable": triton_backend.available(s.device), "flash_usable": flash.available(s.device, None, s.dtype),
           "backends": available_backends(s)}
    print(f"device {name}; torch {out['torch']} (CUDA {out['cuda']}); triton {out['triton']}; "
          f"flash-attn {out['flash_attn']}")
    print(f"HBM copy bandwidth {out['measured_bandwidth'] / 1e12:.2f} TB/s"
          + (f" (data sheet {bw / 1e12:.2f})" if bw else ""))
    print(f"backends: {', '.join(out['backends'])}")
    return out


def _version(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except Exception as exc:  # noqa: BLE001 - report why
        return f"unavailable: {type(exc).__name__}: {exc}"[:200]


# ----------------------------------------------------------------- kernels


def kernel_shapes(s: Setup) -> list[dict]:
    """(name, starts, q_lens, heads, kv_heads, head_dim, block_size)."""
    rng = np.random.default_rng(0)
    if s.dry_run:
        ragged = [int(x) for x in rng.integers(1, 60, 6)]
        return [
            dict(name="decode b6 gqa4 bs16", starts=ragged, q_lens=[1] * 6, heads=8, kv_heads=2, head_dim=32, bs=16),
            dict(name="mixed gqa8 bs32", starts=[0, 40, 17], q_lens=[20, 1, 9], heads=8, kv_heads=1, head_dim=32, bs=32),
            dict(name="decode b3 gqa1 bs256", starts=[300, 5, 0], q_lens=[1, 1, 1], heads=4, kv_heads=4, head_dim=16,
                 bs=256),
        ]
    ctx32 = [int(x) for x in rng.integers(1500, 2600, 32)]
    ctx64 = [int(x) for x in rng.integers(100, 4000, 64)]
    llama = dict(heads=32, kv_heads=8, head_dim=128)
    return [
        dict(name="decode b1 ctx2048", starts=[2047], q_lens=[1], bs=16, **llama),
        dict(name="decode b32 ctx~2k", starts=ctx32, q_lens=[1] * 32, bs=16, **llama),
        dict(name="decode b64 ctx<4k", starts=ctx64, q_lens=[1] * 64, bs=16, **llama),
        dict(name="prefill 2x1024", starts=[0, 0], q_lens=[1024, 1024], bs=16, **llama),
        dict(name="chunk 512 after 3000 + 31 decodes", starts=[3000] + ctx32[:31], q_lens=[512] + [1] * 31,
             bs=16, **llama),
        dict(name="decode b32 gqa1", starts=ctx32, q_lens=[1] * 32, heads=32, kv_heads=32, head_dim=128, bs=16),
        dict(name="decode b32 gqa8 d64", starts=ctx32, q_lens=[1] * 32, heads=32, kv_heads=4, head_dim=64, bs=32),
        dict(name="decode b32 ctx~2k bs256", starts=ctx32, q_lens=[1] * 32, bs=256, **llama),
        dict(name="mixed bs256", starts=[0, 700] + ctx32[:30], q_lens=[900, 300] + [1] * 30, bs=256, **llama),
    ]


def _time(fn, device: torch.device, reps: int) -> float:  # noqa: ANN001
    fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t) / reps


def section_kernels(s: Setup) -> dict:
    tol = 1e-4 if s.dtype == torch.float32 else 3e-2  # vs an fp32 reference; bf16 outputs round at ~4e-3
    backends = [b for b in available_backends(s) if b != "sdpa"] or []
    rows, ok = [], True
    reference = make_backend("sdpa", s.device)
    for shape in kernel_shapes(s):
        case32 = make_case(shape["starts"], shape["q_lens"], shape["heads"], shape["kv_heads"], shape["head_dim"],
                           shape["bs"], torch.float32, device=s.device)
        ref, ref_k, _ = run_backend(reference, case32)
        case = case32.to(s.device, s.dtype)
        row = {"shape": shape["name"], "tolerance": tol}
        for name in ["sdpa", *backends]:
            if name == "flash" and shape["bs"] % flash.FLASH_BLOCK_MULTIPLE:
                continue
            try:
                backend = make_backend(name, s.device)
                out, k_cache, _ = run_backend(backend, case)
                err = (out.float() - ref).abs().max().item()
                stored = torch.equal(k_cache.float(), ref_k.to(s.dtype).float())
                meta = backend.prepare(case.batch)
                kc, vc = case.k_cache.clone(), case.v_cache.clone()
                secs = _time(lambda b=backend, m=meta, c=case, kc=kc, vc=vc: b.forward(c.q, c.k, c.v, kc, vc, m),
                             s.device, 1 if s.dry_run else 20)
                good = err <= tol and stored
                row[name] = {"max_abs_err": err, "kv_stored_exactly": stored, "ok": good, "us": secs * 1e6}
                ok &= good or name == "sdpa"
            except Exception as exc:  # noqa: BLE001 - one failing backend must not hide the others
                row[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                ok = False
        rows.append(row)
        print(f"{shape['name']:<36}" + "".join(
            f"  {n}: " + (f"err {r['max_abs_err']:.1e} {'ok' if r['ok'] else 'FAIL'} {r['us']:8.1f} us"
                          if "error" not in r else f"ERROR {r['error'][:80]}")
            for n, r in row.items() if isinstance(r, dict)))
    print(f"kernels {'PASS' if ok else 'FAIL'} (tolerance {tol} absolute vs fp32 SDPA; sdpa itself for scale)")
    return {"ok": ok, "rows": rows}


# ----------------------------------------------------------------- engines


def engine_variants(s: Setup) -> list[tuple[str, bool]]:
    """(attention, cuda graphs) pairs worth timing here."""
    names = available_backends(s)
    variants = [("sdpa", False)]
    for name in ("triton", "flash"):
        if name in names:
            variants += [(name, True), (name, False)]
    return variants


def make_engine(s: Setup, attention: str, graphs: bool, budget: int | None, max_num_seqs: int = 64) -> Engine:
    cfg = EngineConfig(model=s.model.name, attention=attention, cuda_graphs=graphs, chunk_budget=budget,
                       max_num_seqs=max_num_seqs, kv_memory_gib=s.kv_memory_gib, max_model_len=s.max_model_len,
                       device=s.device.type, seed=0, prefix_caching=False)
    return create_engine(cfg, s.model)


def _prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(3, vocab, n).tolist()


def decode_floor_s(s: Setup, engine: Engine, batch: int, context: int, bandwidth: float) -> float:
    kv = batch * context * s.model.kv_bytes_per_token(torch.finfo(engine.runner.dtype).bits // 8)
    return (engine.runner.weight_bytes + kv) / bandwidth


def run_decode(s: Setup, engine: Engine, batch: int) -> tuple[float, bool, list[list[int]]]:
    """Median decode-step seconds at `batch` requests of context ~decode_context, whether graphs ran,
    and the greedy tokens (for cross-backend agreement)."""
    rng = np.random.default_rng(batch)
    greedy = SamplingParams(max_tokens=s.decode_steps + 4, temperature=0.0, ignore_eos=True)
    reqs = [engine.add_request(_prompt(rng, s.decode_context - 2, s.model.vocab_size), greedy)
            for _ in range(batch)]
    first = engine.step_log.last_step + 1
    while engine.has_unfinished():
        engine.step()
    sync(s.device)
    steps = [r for r in engine.step_log.since(first) if r.phase == "decode" and r.decode_tokens == batch]
    steps = steps[2:] if len(steps) > 4 else steps  # the first decode steps after a prefill warm caches
    median = statistics.median(r.duration_s for r in steps)
    return median, all(r.cuda_graph for r in steps), [list(r.output_token_ids) for r in reqs]


def section_decode(s: Setup, nominal_bandwidth: float | None) -> dict:
    """The floor uses the data-sheet bandwidth as the source documents do (weights / 3.35 TB/s = 4.8 ms on H100);
    where the device is not in GPU_SPECS, the measured copy bandwidth."""
    measured = measured_bandwidth(s.device, 0.25 if s.dry_run else 2.0)
    bw = nominal_bandwidth or measured
    rows, tokens = [], {}
    for attention, graphs in engine_variants(s):
        try:
            engine = make_engine(s, attention, graphs, budget=8192)
            for batch in s.decode_batches:
                secs, graph_ran, toks = run_decode(s, engine, batch)
                floor = decode_floor_s(s, engine, batch, s.decode_context, bw)
                tokens[(attention, graphs, batch)] = toks
                rows.append({"attention": attention, "cuda_graphs": graphs, "graph_ran": graph_ran, "batch": batch,
                             "context": s.decode_context, "step_ms": secs * 1e3, "floor_ms": floor * 1e3,
                             "x_floor": secs / floor, "floor_measured_bw_ms": floor * bw / measured * 1e3})
                print(f"decode {attention:<6} graphs={'on ' if graphs else 'off'} (ran: {graph_ran!s:<5}) "
                      f"batch {batch:>3} ctx {s.decode_context}: {secs * 1e3:7.2f} ms/step, floor "
                      f"{floor * 1e3:6.2f} ms, {secs / floor:5.2f}x")
            del engine
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"attention": attention, "cuda_graphs": graphs, "error": f"{type(exc).__name__}: {exc}"[:300]})
        free_memory()
    agreement = []
    for (attention, graphs, batch), toks in tokens.items():
        ref = tokens.get(("sdpa", False, batch))
        if ref is None or (attention, graphs) == ("sdpa", False):
            continue
        same = sum(a == b for x, y in zip(toks, ref, strict=True) for a, b in zip(x, y, strict=True))
        total = sum(len(x) for x in ref)
        agreement.append({"attention": attention, "cuda_graphs": graphs, "batch": batch,
                          "greedy_tokens_equal_to_sdpa": same / total})
        print(f"greedy agreement with sdpa: {attention} graphs={graphs} batch {batch}: {same}/{total} tokens")
    return {"bandwidth": bw, "measured_bandwidth": measured, "rows": rows, "agreement": agreement}


def prefill_flops(m: ModelConfig, tokens: int) -> float:
    """The source documents' count: 2·P·T for the weight GEMMs plus 2·L·d·T² for causal attention (QKᵀ and PV)."""
    return 2 * m.num_params * tokens + 2 * m.num_layers * m.num_heads * m.head_dim * tokens ** 2


def section_prefill(s: Setup, peak: float | None) -> dict:
    rows = []
    for attention, graphs in engine_variants(s):
        if not graphs and attention != "sdpa":
            continue  # prefill never uses graphs: one engine per backend is enough
        try:
            engine = make_engine(s, attention, graphs, budget=None, max_num_seqs=4)
            rng = np.random.default_rng(7)
            one = SamplingParams(max_tokens=1, ignore_eos=True)
            engine.generate([_prompt(rng, 256, s.model.vocab_size)], one)  # compile, warm up
            for n in s.prefill_lens:
                first = engine.step_log.last_step + 1
                engine.generate([_prompt(rng, n, s.model.vocab_size)], one)
                sync(s.device)
                step = next(r for r in engine.step_log.since(first) if r.prefill_tokens == n)
                flops = prefill_flops(s.model, n)
                mfu = flops / step.duration_s / peak if peak else None
                rows.append({"attention": attention, "tokens": n, "seconds": step.duration_s, "tflops": flops / 1e12,
                             "achieved_tflops_per_s": flops / step.duration_s / 1e12, "mfu": mfu})
                print(f"prefill {attention:<6} {n:>6} tokens: {step.duration_s:7.3f} s, {flops / 1e12:7.1f} TFLOP, "
                      f"{flops / step.duration_s / 1e12:7.1f} TFLOP/s" + (f", MFU {mfu:.1%}" if mfu else ""))
            del engine
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rows.append({"attention": attention, "error": f"{type(exc).__name__}: {exc}"[:300]})
        free_memory()
    return {"peak_flops": peak, "rows": rows}


# ----------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("section", choices=("env", "kernels", "decode", "prefill", "scenario", "sim"))
    p.add_argument("--out", type=Path, required=True, help="JSON file for this section's figures")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: checks the script, not the GPU")
    a = p.parse_args(argv)
    s = setup(a.dry_run)
    if not a.dry_run and a.section != "sim" and not torch.cuda.is_available():  # sim reads JSON only
        print("no CUDA device visible to torch (use --dry-run on CPU)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    _, peak, bw = gpu_spec()
    t = time.perf_counter()
    with torch.inference_mode():
        if a.section == "env":
            result = section_env(s)
        elif a.section == "kernels":
            result = section_kernels(s)
        elif a.section == "decode":
            result = section_decode(s, bw)
        elif a.section == "prefill":
            result = section_prefill(s, peak)
        elif a.section == "scenario":
            result = section_scenario(s, a.out.parent)
        else:
            result = section_sim(s, a.out.parent)
    result = {"section": a.section, "dry_run": a.dry_run, "seconds": time.perf_counter() - t,
              "nominal_bandwidth": bw, **result}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str))
    return 1 if result.get("ok") is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
