"""`python -m itlbench.server --model tiny --port 8000`."""

import sys

from itlbench.engine.malloc_tuning import reexec_with_malloc_tunables
from itlbench.errors import ItlbenchError
from itlbench.server.main import parse_args, serve


def main() -> None:
    reexec_with_malloc_tunables()
    try:
        serve(parse_args())
    except ItlbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
