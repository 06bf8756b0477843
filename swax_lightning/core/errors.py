"""The errors a command reports in one line instead of a traceback, and the one way a config check names its field.

Decisions:
- ConfigError and InputError are plain ValueErrors: every layer raises them, the model included, without importing
  Lightning or jsonargparse.
- `usage_errors_reported` turns them, and the parser's and Lightning's own usage errors, into one line `error: ...`
  on stderr with exit code 2. It names those libraries' error types only when a command enters it, so importing
  this module (and the model, which does) loads neither library.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager


class ConfigError(ValueError):
    """A configuration value outside its allowed range; the message names the field."""


class InputError(ValueError):
    """Input that cannot be used as it is: a corrupt, mismatched or too small data folder, shard, checkpoint or file.
    The message names the file or folder and what to do; commands report it in one line."""


def first_line(err: BaseException) -> str:
    """The first line of a library's error message (its name when empty): what a one-line report quotes."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def require(ok: bool, field_name: str, rule: str, value) -> None:
    """Raises ConfigError "<field_name> <rule> (got <value>)" unless ok: every config check names its field this way."""
    if not ok:
        raise ConfigError(f"{field_name} {rule} (got {value!r})")


def require_among(field_name: str, values: list, known) -> None:
    """A non-empty list whose every value is one of `known`, or one ConfigError naming the field."""
    require(bool(values) and all(v in known for v in values), field_name, f"must be among {', '.join(known)}", values)


def usage_errors() -> tuple[type[Exception], ...]:
    """What a command reports as one line: configuration errors, bad input files, values the parser rejects,
    Lightning's misconfiguration errors, and files or folders that are missing or in the way."""
    from jsonargparse import ArgumentError
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    return ConfigError, InputError, ArgumentError, MisconfigurationException, FileNotFoundError, FileExistsError


@contextmanager
def usage_errors_reported(*also: type[Exception]):
    """Turns a usage error (usage_errors(), plus `also`) into one line `error: ...` on stderr and exit code 2; every
    other exception keeps its traceback. SWAX_DEBUG=1 keeps the traceback of every error."""
    caught = (*usage_errors(), *also)
    try:
        yield
    except caught as err:
        if os.environ.get("SWAX_DEBUG"):
            raise
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        raise SystemExit(2) from None
