"""`python -m gpupool` runs the CLI."""

from gpupool.cli.main import main

main()
