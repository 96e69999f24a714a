"""Durations as a person reads them, for every figure, table and line a report or the terminal prints
(kept free of matplotlib so the terminal can use it without loading a plotting library)."""

from __future__ import annotations


def fmt_s(value: float | None) -> str:
    """Seconds the way a person reads them: 1.88 s, 46 ms, 0.3 ms, 40 µs; 0 ms for none at all."""
    if value is None:
        return "—"
    v = float(value)
    a = abs(v)  # each unit from where its rounding would otherwise print the next one's "1000 ms", "10.00 s"
    if a >= 9.995:
        return f"{v:,.1f} s"
    if a >= 0.9995:
        return f"{v:.2f} s"
    if a >= 0.00995:
        return f"{v * 1e3:.0f} ms"
    if a >= 0.0000995:
        return f"{v * 1e3:.1f} ms"
    if v == 0:
        return "0 ms"
    return f"{v * 1e6:.0f} µs"


def counted(n: int | float | str, noun: str) -> str:
    """'1 event', '31 events': a count a reader reads, not '1 events'."""
    shown = f"{n:,}" if isinstance(n, int) else str(n)
    return f"{shown} {noun}" if n == 1 else f"{shown} {noun}s"
