"""`python -m itlbench ...` is the `itlbench` command."""

from itlbench.cli import app

if __name__ == "__main__":
    app(prog_name="python -m itlbench")
