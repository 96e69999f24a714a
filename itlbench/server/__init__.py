"""OpenAI-compatible HTTP server for the bundled engine, with /metrics and a step-log stream."""

from itlbench.server.main import BackgroundServer, RunningServer, ServerConfig, serve, start_server

__all__ = ["BackgroundServer", "RunningServer", "ServerConfig", "serve", "start_server"]
