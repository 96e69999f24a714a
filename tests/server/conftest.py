"""The server tests' fixture: every test that takes `server` runs against both serving layouts, the
engine on a thread of the server's process (embedded) and in its own process (the command line's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from itlbench.server import BackgroundServer, ServerConfig
from tests.support.servers import PROCESS_ENGINE, TINY_ENGINE

LAYOUTS = {"engine-thread": TINY_ENGINE, "engine-process": PROCESS_ENGINE}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def server(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    torch.set_num_threads(1)
    with BackgroundServer(ServerConfig(engine=LAYOUTS[request.param], port=0)) as srv:
        yield srv


@pytest.fixture(scope="module")
def process_server() -> Iterator[BackgroundServer]:
    """The engine-process layout only, for what only it has."""
    with BackgroundServer(ServerConfig(engine=PROCESS_ENGINE, port=0)) as srv:
        yield srv
