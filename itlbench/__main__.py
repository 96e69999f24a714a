"""`python -m itlbench ...` is the `itlbench` command."""

from itlbench.cli import main

if __name__ == "__main__":
    main(prog_name="python -m itlbench")
