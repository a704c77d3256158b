"""The output convention of every command: one JSON document under --json, stdout for answers,
stderr for summaries, one exit-code table, and the library's errors turned into click's.

A command module gets all of it by defining its command with `cls=RectoolCommand` and
wrapping it in `@library_errors`.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import IO, Any, NoReturn, TypeVar, cast

import click

from ..doors.output import discard_stream
from ..errors import InputError, RectoolError, UsageError
from ..extras import MissingExtraError, missing_extra
from ..redaction import environment_secrets, redact, redact_document, redacted_stderr, secrets_of

# The output convention, one place for every command (new ones get it by being defined with
# `@click.command(cls=RectoolCommand)` and using `@json_option` and `@library_errors`):
# - human summaries, progress bars and messages go to stderr; data goes to stdout;
# - with --json, stdout holds exactly one JSON document, written by `emit_json`: the command's
#   result, or `{"error": ..., "exit": N, "seconds": ...}` for every failure (library errors exit
#   1, usage errors 2, click's own parse errors included, Ctrl-C 130). A result whose command
#   exits non-zero (pack's 3, verify's 1) carries that `exit` too; every document has `seconds`;
# - nothing shown holds a credential: every error, JSON document, answer and stderr line goes
#   through `rectool.redaction` here (`shown`), whatever the command put in it;
# - paths in a document are built from the paths given on the command line, as given: relative
#   ones stay relative to the current directory, absolute ones stay absolute.
# `list ... -` and `reader -o -` write their data to stdout: `list`'s JSON then goes to stderr.

JSON_FLAG = "--json"


def _wants_json(args: Iterable[str]) -> bool:
    """Return True when --json is on a command line (before any `--`)."""
    args = list(args)
    if "--" in args:
        args = args[: args.index("--")]
    return JSON_FLAG in args


def command_secrets(args: Iterable[str]) -> frozenset[str]:
    """Return what no output of a command run with `args` may show: the credentials in its
    URLs and in the environment (see `rectool.redaction`)."""
    return secrets_of(args) | environment_secrets()


def shown(text: str) -> str:
    """Return `text` as a command may show it: without a credential (`rectool.redaction`)."""
    ctx = click.get_current_context(silent=True)
    return redact(text, ctx.meta.get("rectool.secrets") if ctx is not None else None)


def seconds_since_start(ctx: click.Context | None) -> float:
    start = ctx.meta.get("rectool.start") if ctx is not None else None
    return round(time.perf_counter() - start, 3) if start is not None else 0.0


def emit_json(document: Mapping[str, object], exit_code: int = 0, err: bool = False) -> None:
    """Print `document` as the command's one JSON document (with `seconds`, and `exit` when
    non-zero), then exit with `exit_code` when it is not 0."""
    ctx = click.get_current_context(silent=True)
    document = dict(document)
    document.setdefault("seconds", seconds_since_start(ctx))
    if exit_code:
        document["exit"] = exit_code
    secrets = ctx.meta.get("rectool.secrets") if ctx is not None else None
    document = cast(dict, redact_document(document, secrets))
    write_stream(json.dumps(document, ensure_ascii=False, indent=2), err=err, data=True)
    if exit_code:
        sys.exit(exit_code)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process was so that it cleans up as for Ctrl-C; exit 143."""


_WATCHER: dict[str, int | None] = {"pid": None}


def watch_sigterm() -> None:
    """Make SIGTERM (a job scheduler's stop, `kill`) an interruption of this process, cleaned
    up and reported as Ctrl-C is (`rectool`'s `main` calls it)."""
    _WATCHER["pid"] = os.getpid()
    signal.signal(signal.SIGTERM, on_sigterm)


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Make SIGTERM an interruption in the rectool process itself. A forked worker (a pool's
    process, which its pool stops with SIGTERM) inherits this handler: there it ends quietly,
    as SIGTERM's default does, instead of printing a traceback."""
    if os.getpid() != _WATCHER["pid"]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


def interrupted_status(exc: BaseException) -> int:
    """Return the exit status of an interruption: 143 for SIGTERM, 130 for Ctrl-C."""
    return 143 if isinstance(exc, Terminated) else 130


def write_stream(text: str, nl: bool = True, err: bool = False, data: bool = False) -> None:
    """Write a command's answer, data or JSON document to stdout (`err`: to stderr) and flush
    it: the one place commands write their output, so a closed pipe or a full disk
    (`> /dev/full`) ends every command the same way, never with a traceback. A closed pipe
    exits 1 quietly, as other command-line tools do; any other failure prints one `Error:`
    line on stderr, exit 1. An answer is `shown` without credentials; `data` (a module's
    source, a list of paths, a JSON document `emit_json` redacted) is written as it is."""
    stream = sys.stderr if err else sys.stdout
    if not data:
        text = shown(text)
    try:
        click.echo(text, nl=nl, err=err)
        stream.flush()
    except OSError as exc:
        _output_failed(stream, exc)


def _output_failed(stream: IO[str], exc: OSError) -> NoReturn:
    # What is left in the stream's buffer would fail again when Python flushes it at exit:
    # point the descriptor at /dev/null first (what the Python docs advise for SIGPIPE).
    try:
        discard_stream(stream.fileno())
    except (OSError, ValueError):  # not a real file (click's test runner)
        pass
    if exc.errno != errno.EPIPE and stream is sys.stdout:
        message = f"Error: cannot write standard output: {exc.strerror or exc}"
        try:
            click.echo(message, err=True)
        except OSError:
            pass
    sys.exit(1)


class UnusableInput(click.ClickException):
    """An input that cannot be used at all (`InputError`): `Error: ...`, exit 2."""

    exit_code = 2


class CommandFailed(click.ClickException):
    """An exit with a status and a message printed as is (no `Error: ` prefix)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        # click types `exit_code` a ClassVar; click itself reads it from the instance.
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(shown(self.message), err=True)


class JsonFailure(click.ClickException):
    """A failure under --json: `{"error": ..., "exit": N, "seconds": ...}` on stdout."""

    def __init__(self, message: str, exit_code: int, seconds: float, err: bool = False) -> None:
        super().__init__(message)
        # click types `exit_code` a ClassVar; click itself reads it from the instance.
        self.exit_code = exit_code  # type: ignore[misc]
        self.seconds = seconds
        self.err = err

    def show(self, file: IO[Any] | None = None) -> None:
        document = {"error": shown(self.message), "exit": self.exit_code, "seconds": self.seconds}
        write_stream(json.dumps(document, ensure_ascii=False, indent=2), err=self.err, data=True)


class RectoolCommand(click.Command):
    """A command that keeps the output convention above, whatever happens in it."""

    # A command whose stdout may carry data: its JSON goes to stderr when the command line
    # (its arguments, as given) says it does.
    json_on_stderr: Callable[[list[str]], bool] | None = None

    def _json_on_stderr(self, args: list[str]) -> bool:
        return bool(self.json_on_stderr and self.json_on_stderr(args))

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        given = list(args)
        as_json = _wants_json(given)
        start = time.perf_counter()
        secrets = command_secrets(given)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            # A bad value may be a URL; click types `message` Final, and shows what it holds.
            exc.message = redact(exc.message, secrets)  # type: ignore[misc]
            if not as_json or isinstance(exc, JsonFailure):
                raise
            err = self._json_on_stderr(given)
            message = redact(exc.format_message(), secrets)
            raise JsonFailure(message, exc.exit_code, 0.0, err) from exc
        ctx.meta["rectool.start"] = start
        ctx.meta["rectool.args"] = given
        ctx.meta["rectool.secrets"] = secrets
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        as_json = bool(ctx.params.get("as_json"))
        err = as_json and self._json_on_stderr(ctx.meta.get("rectool.args", []))
        secrets = ctx.meta.get("rectool.secrets") or command_secrets([])
        try:
            with redacted_stderr(secrets):
                try:
                    return super().invoke(ctx)
                except ImportError as exc:  # of an extra's module (obstore, dask), anywhere
                    missing = missing_extra(exc)
                    if missing is None:
                        raise
                    raise UnusableInput(str(missing)) from None  # one line, exit 2
        except JsonFailure:
            raise
        except click.ClickException as exc:
            exc.message = redact(exc.message, secrets)  # type: ignore[misc]
            if not as_json:
                raise
            message = redact(exc.format_message(), secrets)
            raise JsonFailure(message, exc.exit_code, seconds_since_start(ctx), err) from exc
        except KeyboardInterrupt as exc:
            status = interrupted_status(exc)
            word = "terminated" if status == 143 else "interrupted"
            if not as_json:
                click.echo(f"{word.capitalize()}.", err=True)
                sys.exit(status)
            raise JsonFailure(word, status, seconds_since_start(ctx), err) from None


class RectoolGroup(click.Group):
    """The `rectool` group: its commands are `RectoolCommand`s."""

    command_class = RectoolCommand

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.ClickException as exc:  # "No such command 'URL'": shown redacted too
            exc.message = redact(exc.message, command_secrets(args))  # type: ignore[misc]
            raise


F = TypeVar("F", bound=Callable[..., Any])


def library_errors(func: F) -> F:
    """Turn the library's own exceptions into click's: exit 1 (`Error: ...`) or 2 for usage."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from exc
        except (InputError, MissingExtraError) as exc:  # exit 2, without click's usage text
            raise UnusableInput(str(exc)) from exc
        except RectoolError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            # The library names its files in its own errors; this is the net for the rest
            # (a read-only output folder, a full disk): a message, never a traceback.
            where = f"{exc.filename}: " if exc.filename else ""
            raise click.ClickException(f"{where}{exc.strerror or exc}") from exc

    return cast(F, wrapper)  # functools.wraps: the same signature


# URL targets' helpers live in `remote_targets.py`, imported on first use (PEP 562).
_REMOTE_TARGETS = ("local_targets", "named_by_url", "named_by_urls")


def __getattr__(name: str) -> Any:
    if name not in _REMOTE_TARGETS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import remote_targets

    return getattr(remote_targets, name)
