"""The OTLP/HTTP receiver lives in itlbench.telemetry.otlp_receiver (the product uses it); this name stays for tests."""

from itlbench.telemetry.otlp_receiver import OtlpReceiver, Received, main

__all__ = ["OtlpReceiver", "Received", "main"]
