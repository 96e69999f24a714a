"""`python -m itlbench.server ...` is `itlbench serve ...`: one serve command, one set of flags."""

import sys

from itlbench.cli import app

if __name__ == "__main__":
    app(["serve", *sys.argv[1:]], prog_name="python -m itlbench.server")
