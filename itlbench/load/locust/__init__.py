"""The Locust driver (`--driver locust`): job, master, workers and users. Locust is an optional extra;
nothing here imports it until a master or worker process starts."""

from __future__ import annotations

import importlib.metadata

from itlbench.errors import ConfigError


def require_locust() -> None:
    """Locust is an optional extra; say how to get it before anything starts."""
    for name in ("locust", "geventhttpclient"):
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise ConfigError("--driver", f"locust is not installed ({name} missing)",
                              'pip install -e ".[locust]"') from None
