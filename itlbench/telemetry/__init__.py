"""Live telemetry, off unless asked for: the client's Prometheus metrics and live stall causes
(`itlbench run --metrics-port`), OpenTelemetry spans and GenAI metrics of client and server
(`--otlp-endpoint`), and the Grafana dashboards generated from Python (`python -m
itlbench.telemetry.dashboards`). Nothing here is imported when the flags are absent."""
