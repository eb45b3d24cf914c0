"""Secrets, and URLs that may carry a password, from a file or the environment.

Every user of the machine can read a process's command line (``ps``), so a secret option
``--x`` also comes as ``--x-file FILE`` (its first line; the file must exist and be
readable) and from an environment variable. One given on the command line still works, with
a warning; a URL only warns when it has a password in it.

>>> import argparse
>>> token = SecretOption("--manager-token", "PVM_MANAGER_TOKEN", "the manager's secret")
>>> parser = argparse.ArgumentParser()
>>> token.add_to(parser)
>>> token.value(parser.parse_args([]), {"PVM_MANAGER_TOKEN": "from-the-environment"})
'from-the-environment'
"""

from __future__ import annotations

import argparse
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pvm.cli import CliError

log = logging.getLogger("pvm.secrets")

# The parser actions each SecretOption added (its flag and its file twin), so that a
# configuration file can tell a secret from any other option (pvm/config_file.py).
_ACTIONS: weakref.WeakKeyDictionary[argparse.Action, SecretOption] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class SecretOption:
    """``flag`` with a ``flag-file`` twin and the environment variable ``env``. ``is_url``:
    the value is a database URL, secret only when it holds a password. ``on_command_line``
    False: no ``flag`` of its own, only the file and the environment."""

    flag: str
    env: str
    help: str
    is_url: bool = False
    on_command_line: bool = True

    @property
    def file_flag(self) -> str:
        return f"{self.flag}-file"

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def file_dest(self) -> str:
        return f"{self.dest}_file"

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """Add ``flag`` (unless ``on_command_line`` is False) and ``flag-file``."""
        if self.on_command_line:
            flag = parser.add_argument(
                self.flag, default=None, help=f"{self.help} (or {self.file_flag} FILE, or ${self.env})"
            )
            _ACTIONS[flag] = self
        what = self.flag if self.on_command_line else f"{self.help} (default: ${self.env})"
        _ACTIONS[
            parser.add_argument(
                self.file_flag, type=Path, default=None, metavar="FILE", help=f"read {what} from the first line of FILE"
            )
        ] = self

    def value(self, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str | None:
        """The value from the command line, else the file, else the environment (None if
        none has one). CliError for both the flag and its file, or for a file that cannot be
        read; a warning for a secret on the command line."""
        given = getattr(args, self.dest, None) if self.on_command_line else None
        path = getattr(args, self.file_dest)
        if given is not None and path is not None:
            raise CliError(f"give {self.flag} or {self.file_flag}, not both")
        if path is not None:
            return read_secret_file(path, self.file_flag)
        if given is not None:
            if self.holds_secret(given):
                log.warning(
                    "%s was given on the command line, where every user of this machine can read it (ps); "
                    "use %s FILE or $%s instead", self.flag, self.file_flag, self.env,
                )  # fmt: skip
            return given
        return environ.get(self.env) or None

    def resolve(self, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> None:
        """Put ``value`` into ``args`` under ``dest``, where the rest of the command reads it."""
        setattr(args, self.dest, self.value(args, environ))

    def holds_secret(self, value: str) -> bool:
        """Whether ``value`` of ``flag`` is a secret: always, but for a URL without a password."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        if not self.is_url:
            return True
        try:
            return make_url(value).password is not None
        except ArgumentError:  # not a URL at all: refused later, with its own message
            return False


def secret_of(action: argparse.Action) -> SecretOption | None:
    """The SecretOption that added ``action`` (its flag or its file twin), None for any other."""
    return _ACTIONS.get(action)


def read_secret_file(path: Path, flag: str) -> str:
    """The first line of ``path``, without its line break; CliError naming ``flag`` if the
    file cannot be read or the line is empty."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"{flag} {path}: cannot read it: {reason}") from exc
    if not line.strip():
        raise CliError(f"{flag} {path}: its first line is empty")
    return line
