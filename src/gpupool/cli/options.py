"""The options several commands share, each declared once with its one help text.

A command takes one as its parameter's default (`simulate: str | None = options.SIMULATE`); what
differs between commands (a default that depends on another option) is said in the command's own
help, not in a second declaration of the option.
"""

from __future__ import annotations

import typer

SIMULATE = typer.Option(
    None,
    "--simulate",
    metavar="SPEC",
    help="Simulated GPUs: 8xH100-80GB, 4xA30-24GB,2xA100-40GB or an inventory YAML.",
)
NODE_DIR = typer.Option(None, "--node-dir", metavar="DIR", help="The simulated node's directory.")
MEMORY = typer.Option(
    None, "--memory", metavar="SIZE", help="GPU memory per GPU: 4Gi (2^30), 4G (10^9) or 50%."
)
COMPUTE = typer.Option(
    None,
    "--compute",
    metavar="PERCENT",
    help="Compute share per GPU, a whole percent 1..100 (30 or 30%; default 100).",
)
PRIORITY = typer.Option(
    None,
    "--priority",
    metavar="high|low",
    help="high (default): guaranteed; low: only while no high share on the GPU has work.",
)
URL = typer.Option(
    None,
    "--url",
    metavar="URL",
    help="The node daemon: unix:///path.sock, http(s)://host:port (default: $GPUPOOL_URL, "
    "else the default state dir's socket).",
)
JSON = typer.Option(False, "--json", help="Print JSON.")
