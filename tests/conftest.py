"""Fixtures shared across test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from itlbench.server import BackgroundServer, ServerConfig
from tests.server_fixtures import TINY_ENGINE


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    """A real bundled server (tiny preset) on a free loopback port, one per test module."""
    torch.set_num_threads(1)
    with BackgroundServer(ServerConfig(engine=TINY_ENGINE, port=0)) as srv:
        yield srv
