"""`python -m rlhf.cli`: what the `rlhf` script runs."""

from rlhf.cli import app

app()
