"""`itlbench selftest`: this machine's client against a paced server's truth."""

from __future__ import annotations

from typing import Annotated

import typer

from itlbench.cli.app import AsJson, app, console, fail, print_json
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.units import parse_duration_s


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError("--streams", f"{text!r} is not a comma-separated list of counts", "e.g. 10,50,100") from None


@app.command()
def selftest(
    streams: Annotated[str, typer.Option(help="Stream counts to try, rising (comma-separated).")] = "10,50,100,200",
    readers: Annotated[str, typer.Option(help="Stream readers to test: kernel (kernel receive stamps) and/or "
                                              "aiohttp (user-space stamps).")] = "kernel,aiohttp",
    duration: Annotated[str, typer.Option(help="Load per point (e.g. 4s).")] = "4s",
    bound_ms: Annotated[float, typer.Option(help="ITL error p99 a stream count must stay within (ms).")] = 1.0,
    tokens: Annotated[int, typer.Option(help="Tokens per request (the streams run in step: every request "
                                             "ends on one tick).")] = 100,
    first_delay: Annotated[str, typer.Option(help="The paced server's wait before a request's first token "
                                                  "(its prefill).")] = "50ms",
    as_json: AsJson = False,
) -> None:
    """Measure this machine's client: ITL and TTFT error against a paced server's send log, per stream
    count and reader, and the largest stream count whose ITL p99 error stays within --bound-ms."""
    from itlbench.experiments.selftest import SelftestConfig, run_selftest
    try:
        cfg = SelftestConfig(streams=_counts(streams), readers=tuple(r.strip() for r in readers.split(",") if r),
                             duration_s=parse_duration_s(duration, "--duration"), bound_ms=bound_ms,
                             tokens=tokens, first_delay_s=parse_duration_s(first_delay, "--first-delay"))
    except ItlbenchError as exc:
        fail(exc)
    result = run_selftest(cfg, on_row=None if as_json else
                          lambda r: console.print(f"[dim]{r.reader} × {r.streams} streams: {r.chunks} chunks[/]"))
    if as_json:
        print_json(result.to_json())
    else:
        _print(result)


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _ms1(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _print(result) -> None:  # noqa: ANN001 - SelftestResult, imported lazily
    from itlbench.report.tables import TextTable, print_table

    # two tables of seven columns, so an 80-column terminal shows each whole
    itl = TextTable("ITL error against the paced server's send log (ms, absolute)",
                    ["reader", "streams", "chunks", "p50", "p99", "max", f"≤ {result.config.bound_ms:g} ms"], labels=2)
    ttft = TextTable("TTFT error (ms, absolute), and the machine at each point",
                     ["reader", "streams", "p50", "p99", "max", "CPU wait ms/s", "load"], labels=2,
                     caption="CPU wait: the client's loop thread runnable without a CPU (what makes user "
                             "stamps late); load: 1-minute load average at the point's start")
    for r in result.rows:
        itl.add_row(r.reader, str(r.streams), f"{r.chunks:,}", _ms(r.itl.p50_ms), _ms(r.itl.p99_ms),
                    _ms(r.itl.max_ms), "yes" if r.holds else "no")
        ttft.add_row(r.reader, str(r.streams), _ms(r.ttft.p50_ms), _ms(r.ttft.p99_ms), _ms(r.ttft.max_ms),
                     _ms1(r.cpu_wait_ms_per_s), _ms1(r.load1))
    print_table(console, itl)
    print_table(console, ttft)
    for reader, n in result.max_streams_within().items():
        held = f"up to {n} streams" if n is not None else "not even the smallest count"
        console.print(f"{reader}: ITL error p99 within {result.config.bound_ms:g} ms for {held}", highlight=False)
