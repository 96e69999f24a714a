"""Fixtures shared across test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when a module's kernels are decorated, i.e. at its first import: set it before
    # any test module imports the engine, so the kernels run in the CPU interpreter in any test order.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from itlbench.server import BackgroundServer, ServerConfig
from tests.server_fixtures import TINY_ENGINE


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    """A real bundled server (tiny preset) on a free loopback port, one per test module."""
    torch.set_num_threads(1)
    with BackgroundServer(ServerConfig(engine=TINY_ENGINE, port=0)) as srv:
        yield srv
