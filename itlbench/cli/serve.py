"""`itlbench serve` (the bundled engine as an OpenAI-compatible server) and `itlbench locust-worker`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from itlbench.cli.app import app, fail
from itlbench.cli.engine_options import (
    ENGINE_FIELDS,
    engine_config_from_flags,
    engine_options,
    flag_of,
    given_on_command_line,
)
from itlbench.cli.run import OtlpEndpoint, check_sim
from itlbench.core.engine_config import EngineConfig
from itlbench.core.presets import load_model_config
from itlbench.errors import ConfigError, ItlbenchError
from itlbench.serving.build import require_engine_for


@app.command()
@engine_options()
def serve(
    ctx: typer.Context,
    engine_config: Annotated[str | None, typer.Option(
        help="The whole engine configuration as JSON (what `itlbench run` hands its server); "
             "replaces the engine flags (--model … --torch-threads, listed below), which are then refused.")] = None,
    host: Annotated[str, typer.Option(help="Bind address (loopback unless told otherwise).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="ITLBENCH_API_KEY", help="Require this bearer key; prefer setting ITLBENCH_API_KEY (a value given here shows in ps).")] = None,
    served_model_name: Annotated[str | None, typer.Option(help="Model name in the API (default: the model).")] = None,
    max_waiting: Annotated[int, typer.Option(help="Waiting requests beyond which new ones get 429.")] = 1024,
    max_body_mib: Annotated[float, typer.Option(help="Largest request body accepted (413 above).")] = 4.0,
    access_log: Annotated[bool, typer.Option(help="Log every HTTP request.")] = False,
    max_connections: Annotated[int | None, typer.Option(
        help="Open connections beyond which new ones get 503 and are closed (default 4096, or fewer when "
             "the file-descriptor limit is lower).")] = None,
    head_timeout: Annotated[float, typer.Option(
        help="Seconds a request's head may take from its first byte (408 and closed after).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(
        help="Seconds a request's body may take to arrive (408 and closed after).")] = 60.0,
    otlp_endpoint: OtlpEndpoint = None,
    engine_flags: dict | None = None,
) -> None:
    """Serve the bundled engine with an OpenAI-compatible API, /metrics and /v1/steps.

    --engine sim serves the simulator on a thread of this process (no engine process, no torch; --engine-process
    and --torch-threads are refused): each step takes the time the cost model prices, and the tokens are made up:
    the same text for the same prompt under temperature 0, or for the same prompt and seed. It never emits EOS, so
    a response runs to its max_tokens, except a request that sets no max_tokens and does not send ignore_eos (a
    chat request's default is the rest of the context): that one ends with EOS after a plausible length, lognormal
    with a mean of 500 tokens, drawn like its tokens (else from --seed), as a model's answer would end.
    """
    try:
        if engine_config is not None:
            _refuse_engine_flags(ctx)
            engine = EngineConfig.from_json(engine_config)
        else:
            engine = engine_config_from_flags(engine_flags)
        load_model_config(engine.model)  # a bad --model fails here, not in the engine process
        check_sim(engine)
        require_engine_for(engine)
        if max_body_mib <= 0:
            raise ConfigError("--max-body-mib", f"must be > 0, got {max_body_mib}")
        if max_waiting < 1:  # 0 waiting >= a cap below 1: every request was answered 429
            raise ConfigError("--max-waiting", f"must be >= 1, got {max_waiting}", "e.g. --max-waiting 1024, the default")
        from itlbench.server.guard import ConnectionLimits, check_listen

        limits = ConnectionLimits(max_connections, head_timeout, body_timeout)
        limits.check()
        check_listen(host, port)
        if otlp_endpoint is not None:
            from itlbench.telemetry.otel import check_endpoint, probe_collector

            otlp_endpoint = check_endpoint(otlp_endpoint)
            probe_collector(otlp_endpoint or "")
    except ItlbenchError as exc:
        fail(exc)
        return
    from itlbench.system.malloc import reexec_with_malloc_tunables

    reexec_with_malloc_tunables()  # only after the flags are known good: it restarts the process
    from itlbench.server import ServerConfig
    from itlbench.server import serve as serve_forever
    from itlbench.system.parent import die_with_run

    die_with_run()
    try:
        serve_forever(ServerConfig(engine=engine, host=host, port=port, api_key=api_key,
                                   served_model_name=served_model_name, max_waiting=max_waiting,
                                   access_log=access_log, max_body_mib=max_body_mib,
                                   otlp_endpoint=otlp_endpoint, limits=limits))
    except ItlbenchError as exc:
        fail(exc)


def _refuse_engine_flags(ctx: typer.Context) -> None:
    """--engine-config is the whole engine; an engine flag beside it would be silently overridden."""
    given = given_on_command_line(ctx, ENGINE_FIELDS)
    if given:
        raise ConfigError("--engine-config", f"given together with {', '.join(flag_of(n) for n in given)}",
                          "put every engine setting in the JSON, or drop --engine-config")


@app.command("locust-worker")
def locust_worker(master: Annotated[str, typer.Option(help="HOST:PORT of the master (`itlbench run --driver locust "
                                                            "--master-bind ...` prints it).")]) -> None:
    """A Locust worker for `itlbench run --driver locust` on another machine; runs until the master ends."""
    import os

    from itlbench.load.locust import require_locust
    from itlbench.load.locust.job import parse_host_port

    try:
        parse_host_port(master, "--master")
        require_locust()
    except ItlbenchError as exc:
        fail(exc)
        return
    # a fresh interpreter: locust must monkey-patch the process before anything else is imported
    os.execv(sys.executable, [sys.executable, "-m", "itlbench.load.locust.worker", "--master", master])
