"""Fixtures of the engine tests."""

from tests.support.fake_flash import fake_flash  # noqa: F401 - the stand-in for flash-attn, as a fixture
