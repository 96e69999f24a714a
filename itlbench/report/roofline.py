"""`itlbench roofline`: the seeds' tables for any Llama-like model on any accelerator.

`roofline_doc` computes every figure once, in SI units (FLOP, bytes, seconds, FLOP/s);
`print_roofline` renders the same document as rich tables, so the JSON and the tables never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from itlbench.core.model_config import ModelConfig
from itlbench.report.tables import TextTable, print_table
from itlbench.sim.accuracy import check_doc, check_line, number_format
from itlbench.sim.roofline import CostModel, Gemm, Hardware, StepShape
from itlbench.units import format_tokens


def _gemm_label(hw: dict[str, Any]) -> str:
    return {"fp8": "FP8 GEMM", "fp4": "FP4 GEMM"}.get(str(hw.get("dtype")), "GEMM")


def _phase_row(cm: CostModel, hw: Hardware, label: str, kind: str, shape: StepShape) -> dict[str, Any]:
    c = cm.cost(shape)
    roof = cm.time(shape, hw.with_(gemm_eff=1.0, fp8_gemm_eff=0.0, fp4_gemm_eff=0.0, attn_eff=1.0, mem_eff=1.0, attn_mem_eff=0.0,
                                   link_eff=1.0, step_overhead_s=0.0, graph_overhead_s=None, seq_overhead_s=0.0,
                                   prefill_overhead_s=0.0, kernel_s=0.0, gemm_m_half=0.0, cost_model="roofline"))
    est = cm.time(shape, hw)
    return {
        "case": label, "kind": kind, "tokens": shape.tokens, "context_tokens": shape.context_tokens,
        "gemm_flops": c.gemm_flops, "attention_flops": c.attn_flops, "flops": c.flops,
        "weight_bytes": c.weight_bytes, "kv_read_bytes": c.kv_read_bytes, "kv_write_bytes": c.kv_write_bytes,
        "bytes": c.bytes, "intensity_flop_per_byte": c.intensity, "bound": roof.bound,
        "achievable_flop_per_s": min(hw.gemm_peak, hw.mem_bw * c.intensity),
        "roofline_time_s": roof.total_s, "estimated_time_s": est.total_s,
        "roofline_allreduce_s": roof.comm_s, "estimated_allreduce_s": est.comm_s,
    }


def _why_not(cm: CostModel, hw: Hardware, longest: int, held: int) -> str | None:
    """Why a case could not run as tabulated: a sequence of `longest` tokens past the model's context, or
    `held` tokens of K/V past what the GPU holds (the figures are still the arithmetic's; the table marks them)."""
    limit = cm.model.max_position_embeddings
    if longest > limit:
        return f"past {cm.model.name}'s {format_tokens(limit)}-token context"
    room = cm.kv_capacity_tokens(hw)
    if held > room:
        return f"{held:,} tokens of K/V, over the {max(room, 0):,} the GPU holds"
    return None


def _gpu_row(cm: CostModel, hw: Hardware, prompt: int, batch: int, context: int) -> dict[str, Any]:
    square = Gemm("d x d", cm.model.hidden_size, cm.model.hidden_size)  # the seeds' d = d' GEMM
    prefill = cm.time(StepShape.prefill(prompt), hw).total_s
    decode = cm.time(StepShape.decode(batch, context), hw).total_s
    return {
        "gpu": hw.name, "label": hw.label, "format": number_format(hw.dtype), "peak_flop_per_s": hw.gemm_peak, "bandwidth_bytes_per_s": hw.mem_bw,
        "memory_bytes": hw.memory_bytes, "ridge_flop_per_byte": hw.ridge,
        "gemm_ridge_tokens": square.ridge_tokens(hw.ridge, cm.b),
        "crossover_prompt_tokens": cm.crossover_tokens(hw.ridge),
        "itl_floor_s": cm.weight_bytes_per_gpu / hw.mem_bw,
        "decode_step_s": decode, "prefill_s": prefill, "stall_to_step_ratio": prefill / decode if decode else None,
        "kv_capacity_tokens": cm.kv_capacity_tokens(hw),
        "published_check": check_doc(hw, cm.tp, cm.kv_room_share(hw)),
    }


def _gemm_row(g: Gemm, cm: CostModel, hw: Hardware, rows: Sequence[int]) -> dict[str, Any]:
    """One weight GEMM's intensity by rows and its rows at the ridge; the LM head in the tables' dtype."""
    table = g.name == "lm_head"
    b = cm.table_b if table else cm.b
    ridge = hw.gemm_peak_of(hw.table_dtype) / hw.mem_bw if table else hw.ridge
    return {"name": g.name, "d_in": g.d_in, "d_out": g.d_out,
            "intensity_flop_per_byte": {str(t): g.intensity(t, b) for t in rows}, "ridge_tokens": g.ridge_tokens(ridge, b)}


def roofline_doc(model: ModelConfig, hw: Hardware, compare: Sequence[Hardware], prompts: Sequence[int],
                 batches: Sequence[int], context: int, tp: int = 1, kv_dtype_bytes: int | None = None) -> dict[str, Any]:
    model.check_window(max(context, *prompts), f"use --context and --prompt of at most {model.sliding_window} "
                       "tokens")
    cm = CostModel.for_hardware(model, hw, tp=tp, kv_dtype_bytes=kv_dtype_bytes)
    gemms = [_gemm_row(g, cm, hw, (1, *batches, *prompts)) for g in cm.gemms()]
    phases = [_phase_row(cm, hw, f"prefill {format_tokens(p)}", "prefill", StepShape.prefill(p))
              | {"does_not_run": _why_not(cm, hw, p, p)} for p in prompts]
    phases += [_phase_row(cm, hw, f"decode batch {b} @ {format_tokens(context)}", "decode", StepShape.decode(b, context))
               | {"does_not_run": _why_not(cm, hw, context + 1, b * (context + 1))} for b in batches]
    worst_prompt, big_batch = max(prompts), max(batches)
    return {
        "model": {"name": model.name, "params": cm.params, "layers": model.num_layers, "hidden": model.hidden_size,
                  "heads": model.num_heads, "kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
                  "vocab": model.vocab_size, "tied_embeddings": model.tie_word_embeddings, "family": model.family},
        "hardware": hw.to_dict() | {"ridge_flop_per_byte": hw.ridge, "gemm_peak_flop_per_s": hw.gemm_peak,
                                    "gemm_efficiency": hw.gemm_efficiency},
        "counting": cm.counting,
        "weight_bytes": cm.weight_bytes,
        "kv_bytes_per_token": cm.kv_bytes_per_token,
        "kv_bytes_per_element": cm.kv_b,
        "itl_floor_s": cm.weight_bytes_per_gpu / hw.mem_bw,  # each GPU streams its shard
        "crossover_prompt_tokens": cm.crossover_tokens(hw.ridge),
        "kv_capacity_tokens": cm.kv_capacity_tokens(hw),
        "published_check": check_doc(hw, tp, cm.kv_room_share(hw)),
        "gemms": gemms,
        "phases": phases,
        "tp": tp,
        "weight_bytes_per_gpu": cm.weight_bytes_per_gpu,
        "gpus": [_gpu_row(CostModel.for_hardware(model, g, tp=tp, kv_dtype_bytes=kv_dtype_bytes), g, worst_prompt,
                          big_batch, context)
                 for g in compare],
        "gpu_table_case": {"prefill_tokens": worst_prompt, "decode_batch": big_batch, "decode_context": context},
    }


# ---------------------------------------------------------------------------------------- rendering


def _sig3(v: float) -> str:
    """Three significant digits, trailing zeros kept (34.0, 808, 4.80)."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(v))))
    return f"{round(v, decimals):,.{decimals}f}"


def _si(value: float, unit: str) -> str:
    if math.isinf(value):
        return "never"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{_sig3(value / factor)} {prefix}{unit}"
    return f"{_sig3(value)} {unit}"


def _time(s: float) -> str:
    return f"{_sig3(s * 1e3)} ms" if s < 1 else f"{_sig3(s)} s"


def _with_comm(phase: dict[str, Any], which: str, tp: int) -> str:
    """A step's time, and at TP > 1 the all-reduces' share of it: the part that FLOPs and bytes do not explain."""
    total = _time(phase[f"{which}_time_s"])
    comm = phase.get(f"{which}_allreduce_s")
    return f"{total} ({_time(comm)} all-reduce)" if tp > 1 and comm else total


def _num(v: float) -> str:
    return "never" if math.isinf(v) else f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def print_roofline(console: Console, doc: dict[str, Any]) -> None:
    m, hw = doc["model"], doc["hardware"]
    console.print(f"[bold]{m['name']}[/] ({_si(m['params'], '')}params, {doc['counting']} counting) on "
                  f"[bold]{hw['label']}[/]: {_si(hw['gemm_peak_flop_per_s'], 'FLOP/s')}, {_si(hw['mem_bw'], 'B/s')}, "
                  f"ridge {hw['ridge_flop_per_byte']:.0f} FLOP/B, {hw['dtype']}", highlight=False)
    console.print(f"[dim]{hw['source']}[/]", highlight=False)

    counts = list(doc["gemms"][0]["intensity_flop_per_byte"])
    t = TextTable("Weight GEMMs: intensity (FLOP/B) by token rows, and the rows at the ridge",
                  ["GEMM", "d_in × d_out", *(f"T={n}" for n in counts), "T at ridge"])
    for g in doc["gemms"]:
        t.add_row(g["name"], f"{g['d_in']} × {g['d_out']}", *(_num(g["intensity_flop_per_byte"][n]) for n in counts),
                  _num(g["ridge_tokens"]))
    print_table(console, t)

    per_gpu = (f" (per GPU at TP {doc['tp']}; the times include two all-reduces a layer)" if doc["tp"] > 1 else "")
    t = TextTable(f"Steps: FLOPs, bytes, intensity; achievable = min(peak, bandwidth × intensity){per_gpu}",
                  ["case", "GEMM", "attention", "total", "bytes", "FLOP/B", "bound", "achievable", "roofline",
                   "estimated", "runs"])
    marks = [p for p in doc["phases"] if p.get("does_not_run")]
    for p in doc["phases"]:  # a case that would not run keeps its arithmetic, marked (a row of its own when turned)
        runs = "no" + "*" * (marks.index(p) + 1) if p in marks else "yes"
        t.add_row(p["case"], _si(p["gemm_flops"], "FLOP"), _si(p["attention_flops"], "FLOP"), _si(p["flops"], "FLOP"),
                  _si(p["bytes"], "B"), _num(p["intensity_flop_per_byte"]), p["bound"],
                  _si(p["achievable_flop_per_s"], "FLOP/s"), _with_comm(p, "roofline", doc["tp"]),
                  _with_comm(p, "estimated", doc["tp"]), runs)
    print_table(console, t)
    for i, p in enumerate(marks):
        console.print(f"[yellow]{'*' * (i + 1)} {p['case']} would not run: {p['does_not_run']}[/]", highlight=False)
    kv = f"KV {doc['kv_bytes_per_token']:,} B/token ({doc['kv_bytes_per_element']} B an element)"
    room = (f"KV room {doc['kv_capacity_tokens']:,} tokens (90 % of memory less weights)" if doc["kv_capacity_tokens"] > 0
            else "KV room none: the weights alone overflow 90 % of each GPU's memory")
    console.print(f"weights {_si(doc['weight_bytes'], 'B')} · {kv} · ITL floor "
                  f"(weights / bandwidth) {_time(doc['itl_floor_s'])} · crossover prompt length "
                  f"{doc['crossover_prompt_tokens']:,.0f} tokens · {room}", highlight=False)
    per_kernel = ", kernel by kernel" if hw["cost_model"] == "operators" else ""
    tp = f" · TP {doc['tp']}: {_si(doc['weight_bytes_per_gpu'], 'B')} of weights per GPU" if doc["tp"] > 1 else ""
    gemm = f"{_gemm_label(hw)} {hw['gemm_efficiency']:.0%}"
    ramp = f" x k/(k + {hw['attn_k_half']:.0f}) at k keys a query" if hw.get("attn_k_half") else ""
    console.print(f"[dim]roofline = at peak; estimated = at the profile's efficiencies{per_kernel} "
                  f"({gemm}, attention {hw['attn_eff']:.0%}{ramp}, bandwidth {hw['mem_eff']:.0%}) "
                  f"+ {hw['step_overhead_s'] * 1e3:g} ms per step{tp}[/]", highlight=False)
    console.print(escape(check_line(doc["published_check"])), highlight=False)

    if not doc["gpus"]:
        return
    case = doc["gpu_table_case"]
    t = TextTable(f"GPUs side by side (estimated prefill of {format_tokens(case['prefill_tokens'])} tokens; "
                  f"decode batch {case['decode_batch']} at {format_tokens(case['decode_context'])} context)",
                  ["GPU", "format", "peak", "bandwidth", "ridge", "GEMM ridge T", "crossover", "ITL floor", "decode step",
                   "prefill", "stall ÷ step", "KV room"])
    for g in doc["gpus"]:
        ratio = g["stall_to_step_ratio"]
        t.add_row(g["label"], g.get("format", ""), _si(g["peak_flop_per_s"], "FLOP/s"), _si(g["bandwidth_bytes_per_s"], "B/s"),
                  f"{g['ridge_flop_per_byte']:.0f}", _num(g["gemm_ridge_tokens"]), _num(g["crossover_prompt_tokens"]),
                  _time(g["itl_floor_s"]), _time(g["decode_step_s"]), _time(g["prefill_s"]),
                  "—" if ratio is None else f"{ratio:,.0f}×",
                  "does not fit" if g["kv_capacity_tokens"] <= 0 else f"{g['kv_capacity_tokens']:,}")
    print_table(console, t)
    cells = " · ".join(f"{g['label']} {_check_cell(g['published_check'])}" for g in doc["gpus"])
    at = f" at TP {doc['tp']}" if doc["tp"] > 1 else ""
    console.print(f"[dim]held-out MAPE against published figures{at}: {cells}[/]", highlight=False)


def _check_cell(check: dict[str, Any]) -> str:
    """A compared GPU's held-out MAPE (figures): at the table's degree of TP where it is above 1; and where its K/V
    room is tight, the reserve a runtime keeps that the simulated engine does not."""
    acc = check.get("at_tp") if check.get("tp", 1) > 1 else check.get("held_out")
    cell = "none" if not acc else f"{acc['mape']:.1%} ({acc['figures']})"
    if check.get("fits") is False:
        return f"{cell}, weights do not fit"
    if not check.get("tight"):
        return cell
    if "reserve_gib" not in check:  # recorded before the reserve was known
        return f"{cell}, ⚠️ K/V room {check['kv_share']:.0%}"
    return f"{cell}, ⚠️ K/V room {check['kv_share'] * check['memory_gib']:.1f} GiB, {check['reserve_gib']:.1f} of it a runtime's"


def print_calibration(console: Console, result: Any, path: Any) -> None:
    hw = result.profile
    console.print(f"[bold]{hw.name}[/]: GEMM {hw.gemm_eff:.1%} of {_si(hw.peak_flops, 'FLOP/s')}, attention "
                  f"{hw.attn_eff:.1%}, bandwidth {hw.mem_eff:.1%} of {_si(hw.mem_bw, 'B/s')}, "
                  f"{hw.step_overhead_s * 1e3:.2f} ms per step (fit on {result.fit_steps} steps)", highlight=False)
    t = TextTable("Prediction error on held-out steps", ["phase", "steps", "median step", "MAPE", "median APE"])
    for phase, e in result.errors.items():
        t.add_row(phase, f"{e['steps']:,}", _time(e["median_s"]), f"{e['mape']:.1%}", f"{e['median_ape']:.1%}")
    print_table(console, t)
    if result.at_roof:
        console.print(f"[yellow]{' and '.join(result.at_roof)} fitted at 100 % of the roof: these steps say only "
                      "that it costs no more (too little of their time is spent there to tell), or the roofs "
                      "(measured now, or --base) are below what the run reached: a busier machine now, or the "
                      "wrong --base[/]", highlight=False)
    console.print(f"profile written to {path}: use it with --engine sim --gpu {path}", highlight=False)
