"""`python -m tpuops` runs the CLI."""

from tpuops.cli import main

main()
