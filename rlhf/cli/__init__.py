"""The `rlhf` command: every stage, plus the tools users reach for between runs.

One module per command group, each registering on the app of `app.py`: `stages` (one command
per stage, generated from the stage list, and `dvc-yaml`), `pipeline` (report, run, deploy),
`models` (generate, score, export), `data` (import, label) and `experiments` (seeds, compare,
params). Every command reports a failure the user can fix as one `error:` line and exit status
2; `rlhf --debug COMMAND` shows the traceback instead.
"""

# isort: off
# in the order `rlhf --help` lists them; each module registers its commands when imported
from rlhf.cli import stages, pipeline, models, data, experiments  # noqa: F401
from rlhf.cli.app import app

# isort: on

__all__ = ["app"]
