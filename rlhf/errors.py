"""The failures a user can fix, as opposed to bugs.

Every entry point (the `rlhf` command, `python -m rlhf.stages.*` under `dvc repro`, Prefect
task runs) reports a `PipelineError` as one line, with no traceback: the message itself must
say which file, row and field or which params key is wrong, what was expected and what to do.
A traceback is kept for bugs, and for everything when RLHF_DEBUG=1 asks for it.
"""

from __future__ import annotations

# exit statuses, shared by every entry point (`rlhf`, `python -m rlhf.stages.*`) and the
# data-parallel launcher, which reads its workers' statuses
USER_ERROR = 2  # a failure the message explains
PEER_LOST = 3  # a data-parallel worker whose collective broke because another rank died
RETRY = 75  # EX_TEMPFAIL: stopped from outside (a killed worker); rerunning resumes it
INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class PipelineError(Exception):
    """A failure the message alone explains: bad params, bad data, a missing or refused file."""


class ParamsError(PipelineError, ValueError):
    """A params file (or a params value) that does not match the schema."""


class StageInterrupted(Exception):
    """A run stopped by something outside it (a data-parallel worker killed, say): running
    the stage again resumes it, so a scheduler retries it, unlike a `PipelineError`."""


class CheckpointError(PipelineError):
    """A checkpoint or resume file that is missing, unreadable or not what the stage needs."""


class OutputError(PipelineError):
    """An output that could not be written, or that a command refuses to overwrite."""


class ResourceError(PipelineError):
    """A run the machine cannot hold: refused before the allocation that would fail."""


class OptionError(PipelineError):
    """A command-line option the command cannot use with these inputs: more new tokens than
    the model's context, options that exclude each other, no input at all."""
