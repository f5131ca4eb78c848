"""Render an untrusted chat template in a child process bounded in time, memory and output.

A model folder's Jinja template is a program. Jinja's sandbox stops it from reaching Python's
internals, but not from looping for hours (`range` nested in `range`) or building a string of
ten gigabytes in one C call (`'x' * 10**10`), and no check inside the process can interrupt
either. So the template runs in a fresh interpreter (only Jinja imported, about 0.1 s) under an
address-space limit, is killed at a deadline, and stops rendering past an output limit; the
parent gets the rendered texts or one `TemplateFailure` saying why. Rendering follows
transformers' `_compile_jinja_template`: an immutable sandbox, trimmed blocks, loop controls,
its `tojson`, `raise_exception` and `strftime_now`.

Run as `python -m rlhf.tokenizer.template_sandbox`, it is the child: a JSON request on stdin, a
JSON answer on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any, NoReturn

from rlhf.errors import PipelineError

RENDER_SECONDS = 5  # the child's time for compiling the template and every rendering
START_SECONDS = 30  # beyond that, for the interpreter to start (a loaded host, slow disks)
RENDER_CHARS = 100_000  # text one rendering may produce; a real one frames a turn in < 2,000
RENDER_MEMORY = 1 << 30  # the child's address space, interpreter and Jinja included
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # holds the `rlhf` package


class TemplateFailure(Exception):
    """The template cannot be rendered; the message says why, for a user to read."""


class RendererError(PipelineError):
    """The renderer itself could not run (no interpreter, no Jinja): not the template's
    fault, so not reported as one."""


def render(template: str, contexts: list[dict[str, Any]], today: date) -> list[str]:
    """`template` rendered with each of `contexts`, in a bounded child process."""
    request = json.dumps({"template": template, "contexts": contexts, "today": today.isoformat()})
    paths = [*filter(None, [os.environ.get("PYTHONPATH")]), str(PACKAGE_ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    try:
        child = subprocess.run(
            [sys.executable, "-m", __name__], input=request, capture_output=True, text=True,
            timeout=RENDER_SECONDS + START_SECONDS, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise TemplateFailure(f"rendering it takes longer than {RENDER_SECONDS} s") from None
    except OSError as exc:
        raise RendererError(f"the template renderer could not start ({exc})") from None
    answers = child.stdout.strip().splitlines()
    try:  # the answer is the last line: a site hook may have printed before it
        answer = json.loads(answers[-1])
    except (IndexError, json.JSONDecodeError):
        said = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise RendererError(f"the template renderer stopped without an answer ({said})") from None
    if "failure" in answer:  # on one line: a foreign program's message may hold newlines
        raise TemplateFailure(" ".join(answer["failure"].split()))
    return answer["rendered"]


def _child() -> None:
    """Answer one request; every failure of the template becomes a reason, never a crash."""
    import resource  # Unix only, as the child is
    import signal

    _, hard = resource.getrlimit(resource.RLIMIT_AS)  # a limit set above us stays
    limit = RENDER_MEMORY if hard == resource.RLIM_INFINITY else min(RENDER_MEMORY, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    request = json.load(sys.stdin)
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(RENDER_SECONDS)  # counted from here: the interpreter's start is not the template's
    try:
        answer = {"rendered": _render_all(**request)}
    except MemoryError:
        answer = {"failure": f"rendering it needs more than {limit >> 20} MiB"}
    except TemplateFailure as exc:
        answer = {"failure": str(exc)}
    except RecursionError:
        answer = {"failure": "it fails to render (it recurses without end)"}
    except Exception as exc:  # a foreign program: any error is its failure
        answer = {"failure": f"it fails to render ({type(exc).__name__}: {exc})"}
    signal.alarm(0)
    print(json.dumps(answer))


def _out_of_time(signum: int, frame: object) -> NoReturn:
    raise TemplateFailure(f"rendering it takes longer than {RENDER_SECONDS} s")


def _render_all(template: str, contexts: list[dict[str, Any]], today: str) -> list[str]:
    import jinja2

    environment = _environment(date.fromisoformat(today))
    try:
        program = environment.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateFailure(f"it is not valid Jinja ({exc})") from None
    return [_bounded(program.generate(**context)) for context in contexts]


def _bounded(pieces: Any) -> str:
    """Join a rendering's pieces, stopping as soon as they pass `RENDER_CHARS`."""
    text, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > RENDER_CHARS:
            raise TemplateFailure(f"it renders more than {RENDER_CHARS:,} characters")
        text.append(piece)
    return "".join(text)


def _environment(today: date) -> Any:
    """The Jinja environment transformers compiles chat templates in."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda pattern: today.strftime(pattern)
    return environment


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' tojson: unlike Jinja's own, it does not escape HTML characters."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    """The template's own refusal (transformers' `raise_exception`)."""
    raise TemplateFailure(f"it raises an error: {message}")


if __name__ == "__main__":
    _child()
