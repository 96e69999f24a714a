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
from tests.support.servers import TINY_ENGINE

REQUIRE_NATIVE_ENV = "ITLBENCH_REQUIRE_NATIVE"  # CI sets it: a native library that does not build fails the run


def pytest_sessionstart(session: pytest.Session) -> None:
    """Where the native CPU library must build (CI), its failure to build is a failure, not the
    skips and slower fallbacks the tests otherwise take."""
    if os.environ.get(REQUIRE_NATIVE_ENV) == "1":
        from itlbench.engine.cpu import native

        if native.load() is None:
            pytest.exit(f"{REQUIRE_NATIVE_ENV}=1 but the native library did not build: "
                        f"{native.unavailable_reason()}", returncode=1)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    """A real bundled server (tiny preset) on a free loopback port, one per test module."""
    torch.set_num_threads(1)
    with BackgroundServer(ServerConfig(engine=TINY_ENGINE, port=0)) as srv:
        yield srv
