"""Commands about models and hardware, no load: `workloads`, `export-model`, `calibrate`, `roofline`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from itlbench.cli.app import AsJson, app, console, fail, print_json, stdout_console
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.serving.build import require_torch_engine


@app.command()
def workloads(as_json: AsJson = False) -> None:
    """List the workload catalog with its prompt and output lengths."""
    from itlbench.report.terminal import print_catalog
    from itlbench.workloads import catalog_table

    keys = ("name", "mean_in", "mean_out", "in_out", "notes")
    rows = [dict(zip(keys, row, strict=True)) for row in catalog_table()]
    if as_json:  # numbers as numbers ("from trace" as null)
        print_json([r | {k: int(r[k]) if str(r[k]).isdigit() else None for k in ("mean_in", "mean_out")} for r in rows])
        return
    print_catalog(stdout_console(), rows)


@app.command("export-model")
def export_model_command(
    preset: Annotated[str, typer.Argument(metavar="PRESET", help="A preset: cpu-small, cpu-medium, tiny, llama-3.2-1b, ...")],
    out: Annotated[Path, typer.Argument(metavar="OUT", help="Directory (hf, new or empty) or .gguf file to write.")],
    seed: Annotated[int, typer.Option(help="Seed of the dummy weights (the bundled engine's --seed).")] = 0,
    force: Annotated[bool, typer.Option(help="Replace what is already there.")] = False,
    format: Annotated[str | None, typer.Option("--format", help="hf (config.json, safetensors, tokenizer.json: the "
                                               "bundled engine, transformers, vLLM) or gguf (one file: llama.cpp); "
                                               "default: gguf for an OUT ending .gguf, else hf.")] = None,
) -> None:
    """Write a preset with the bundled engine's seeded weights and tokenizer, so the same model runs in
    the bundled engine, transformers, vLLM (hf) and llama.cpp (gguf)."""
    from itlbench.export.hf import size_text

    format = format or ("gguf" if out.suffix.lower() == ".gguf" else "hf")
    try:
        require_torch_engine(sim_alternative=False)  # the seeded weights are drawn by the torch model
        if format == "hf":
            from itlbench.export.hf import export_model

            done = export_model(preset, out, seed=seed, force=force)
            weight_bytes = done.weight_bytes
        elif format == "gguf":
            from itlbench.export.gguf import export_gguf

            done = export_gguf(preset, out, seed=seed, force=force)
            weight_bytes = done.tensor_bytes
        else:
            raise ConfigError("--format", f"unknown format {format!r}", "use hf or gguf")
    except ItlbenchError as exc:
        fail(exc)
        return
    except OSError as exc:  # a read-only or full disk, met while writing
        fail(ConfigError("OUT", f"cannot write {out} ({exc.strerror or exc})", "name a place this user can write"))
        return
    console.print(f"{preset}: {_count(done.model.num_params)} parameters, {size_text(weight_bytes)} of float32 weights "
                  f"(seed {seed}, {format})", highlight=False)
    print(done.path)


def _count(n: int) -> str:
    """Parameters as a reader says them: 152 k, 1.24 B, 8.03 B (a tiny preset is not '0.2 M')."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


@app.command()
def calibrate(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories of the bundled (real) engine.")],
    out: Annotated[Path, typer.Option(help="Where to write the hardware profile (JSON, for --gpu).")] = Path("calibrated.json"),
    name: Annotated[str, typer.Option(help="Profile name shown in reports.")] = "calibrated",
    base: Annotated[str | None, typer.Option(help="Roofs the efficiencies are relative to: cpu (measured now), "
                                             "h100, … (default: cpu for CPU runs, else h100).")] = None,
    holdout: Annotated[float, typer.Option(help="Share of steps held out to report prediction error.")] = 0.25,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split.")] = 0,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree the runs used: step costs are per GPU, 1/tp "
                                    "of the model.")] = 1,
    as_json: AsJson = False,
) -> None:
    """Fit the simulator's efficiencies and per-step overhead to real step logs; save a --gpu profile."""
    from itlbench.rundir.reader import require_records
    from itlbench.sim.calibrate import calibrate as fit
    from itlbench.sim.calibrate import check_profile_out
    from itlbench.sim.roofline import load_hardware

    try:
        if not 0 < holdout < 1:
            raise ConfigError("--holdout", f"must be between 0 and 1, got {holdout}")
        if tp < 1:
            raise ConfigError("--tp", f"must be >= 1, got {tp}")
        check_profile_out(out)  # never over a run's run.json or another file that is not a profile
        for run_dir in run_dirs:
            require_records(run_dir)
        result = fit(run_dirs, base=load_hardware(base, "--base") if base else None, holdout=holdout, seed=seed, name=name,
                     tp=tp)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            result.profile.save(out)
        except OSError as exc:
            raise ConfigError("--out", f"cannot write {out}: {exc.strerror or exc}", "name a file this user can "
                              "write") from None
    except ItlbenchError as exc:
        fail(exc)
        return
    if as_json:
        print_json(result.to_dict() | {"profile_path": str(out)})
        return
    from itlbench.report.roofline import print_calibration

    print_calibration(stdout_console(), result, out)


def _for_dtype(hw: object, dtype: str) -> object:
    """A compared GPU in --dtype, or in its own where it has no such rate (fp8 on an A100, fp4 on an H100)."""
    try:
        return hw.for_dtype(dtype)  # type: ignore[attr-defined]
    except ConfigError:
        return hw


def _token_list(text: str, flag: str) -> list[int]:
    from itlbench.units import parse_tokens

    fix = "give token counts such as 2048,32k (k = 1024)"
    values = [parse_tokens(part, flag, fix) for part in text.split(",") if part.strip()]
    if not values:
        raise ConfigError(flag, f"cannot read {text!r}", fix)
    return values


def _batch_list(text: str) -> list[int]:
    """--batch counts sequences, not tokens: its error says so (it read "'0' is not a whole number of tokens")."""
    fix = "give decode batch sizes such as 1,32"
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not part.isdigit() or int(part) < 1:
            raise ConfigError("--batch", f"{part!r} is not a batch size (a whole number of sequences >= 1)", fix)
        values.append(int(part))
    if not values:
        raise ConfigError("--batch", f"cannot read {text!r}", fix)
    return values


SIDE_BY_SIDE = ("h100", "h200", "a100", "l40s", "rtx4090")


def _default_compare(gpu: str) -> str:
    """The side-by-side GPUs in --gpu's family: the seeds' arithmetic beside a -seeds profile (its headline's
    crossover 295 sat over a table of the fitted presets, 316, under the same name)."""
    suffix = "-seeds" if gpu.strip().lower().endswith("-seeds") else ""
    return ",".join(g + suffix for g in SIDE_BY_SIDE)


def _compared(compare: str, dtype: str) -> list[object]:
    """--compare's GPUs in the order given, each once (h100,h100 showed the H100 twice; an alias is the same GPU);
    a list naming none (',') is refused rather than read as 'none'."""
    from itlbench.sim.roofline import load_hardware

    named = [g for g in compare.split(",") if g.strip()]
    if not named:
        raise ConfigError("--compare", f"{compare!r} lists no GPU", "e.g. --compare h100,h200, or --compare none")
    by_name: dict[str, object] = {}
    for g in named:
        hw = load_hardware(g, "--compare")
        by_name.setdefault(hw.name, hw)
    return [_for_dtype(hw, dtype) for hw in by_name.values()]


@app.command()
def roofline(
    model: Annotated[str, typer.Option(help="Preset, local HF directory or config.json of a Llama-like model.")] = "llama-3-8b",
    gpu: Annotated[str, typer.Option(help="h100, h200, a100, a100-pcie, l40s, rtx4090, b200, any of them with -seeds "
                                     "(the source documents' 40 %/80 % arithmetic), cpu (measured now) or a profile "
                                     "JSON.")] = "h100",
    compare: Annotated[str | None, typer.Option(help="GPUs for the side-by-side table, comma-separated, or 'none' "
                                                "(default: h100,h200,a100,l40s,rtx4090, each with -seeds when --gpu "
                                                "is a -seeds profile).")] = None,
    prompt: Annotated[str, typer.Option(help="Prefill lengths to tabulate (k = 1024 tokens).")] = "2k,32k",
    batch: Annotated[str, typer.Option(help="Decode batch sizes to tabulate.")] = "1,32",
    context: Annotated[str, typer.Option(help="Cached context of each decoding sequence.")] = "2k",
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree: costs per GPU, two all-reduces per layer.")] = 1,
    dtype: Annotated[str, typer.Option(help="auto (the profile's), bfloat16, float16, fp8 (one-byte layer weights, "
                                       "16-bit tables, K/V at one byte unless --kv-cache-dtype says otherwise, the FP8 tensor rate) or fp4 "
                                       "(NVFP4 on a B200, K/V in fp8).")] = "auto",
    kv_cache_dtype: Annotated[str, typer.Option(help="auto (the weights' dtype; fp8 under fp4), bfloat16, float16 or fp8: the K/V "
                                                "cache's dtype apart from the weights'.")] = "auto",
    as_json: AsJson = False,
) -> None:
    """Roofline tables: GEMM and step intensity, prefill vs decode cost, ITL floor, crossover, GPUs side by side."""
    from itlbench.core.presets import load_model_config
    from itlbench.report.roofline import print_roofline, roofline_doc
    from itlbench.sim.hardware import kv_dtype_bytes
    from itlbench.sim.roofline import load_hardware

    try:
        model_cfg = load_model_config(model)
        if tp < 1:
            raise ConfigError("--tp", f"must be >= 1, got {tp}")
        hw = load_hardware(gpu).for_dtype(dtype)
        compare = compare if compare is not None else _default_compare(gpu)
        others = [] if compare.strip().lower() == "none" else _compared(compare, dtype)
        ctx = _token_list(context, "--context")
        if len(ctx) != 1:
            raise ConfigError("--context", f"takes one length, got {context!r}", "e.g. --context 2k")
        doc = roofline_doc(model_cfg, hw, others, _token_list(prompt, "--prompt"), _batch_list(batch), ctx[0],
                           tp=tp, kv_dtype_bytes=kv_dtype_bytes(kv_cache_dtype))
    except ItlbenchError as exc:
        fail(exc)
        return
    if as_json:
        print_json(doc)
        return
    print_roofline(stdout_console(), doc)
