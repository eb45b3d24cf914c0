"""Options of a command from a TOML file: ``--config FILE``, or ``$PVM_CONFIG``.

``pvm serve`` and ``pvm wrapper run`` take one, instead of a long list of flags. Its keys
are the command's long options without the dashes (``data_dir`` or ``data-dir``); a flag
takes ``true`` or ``false``, a repeatable option an array. Everything about the keys is
read off the command's own argparse parser, so a new option can be set in the file with
no more code, and every value goes through the option's own ``type`` and ``choices``:
what the command line refuses, the file refuses. Relative paths are relative to the
working directory, as on the command line.

An option given on the command line wins over the file (a repeatable one replaces the
file's list), and the file wins over the defaults. A secret (a token, a database URL with
a password: ``pvm.secret_options``) is never taken from the file in clear: the file may
name the file that holds it (``token_file = "…"``), or the secret comes from the
environment. Any problem with the file is a ``CliError`` naming the file and the key,
raised while the command line is parsed: before the command creates or starts anything.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pvm.cli import CliError
from pvm.secret_options import SecretOption, secret_of

ENV = "PVM_CONFIG"
FLAG = "--config"
DEST = "config"

Parse = Callable[[list[str], Any], tuple[Any, list[str]]]


def add_to(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` the ``--config FILE`` option (``pvm.cli.Parser`` then reads the file)."""
    parser.add_argument(
        FLAG,
        type=Path,
        default=None,
        metavar="FILE",
        help=f"read options from this TOML file (or ${ENV}); keys are the long options without dashes, "
        'e.g. data_dir = "var/pvm"; options on the command line win over it (see docs/configuration.md)',
    )


def parse_known_args(
    parser: argparse.ArgumentParser,
    parse: Parse,
    args: list[str],
    namespace: Any,
    environ: Mapping[str, str] = os.environ,
) -> tuple[Any, list[str]]:
    """``parse(args, namespace)`` (the parser's own parsing) with the options of the
    configuration file, if one is named, filled in where the command line gives none."""
    # A first pass only finds --config as argparse understands it (--config=F, and --help
    # still works with a broken file); required options may come from the file.
    required = [action for action in parser._actions if action.required]
    for action in required:
        action.required = False
    try:
        named = getattr(parse(list(args), argparse.Namespace())[0], DEST, None)
    finally:
        for action in required:
            action.required = True
    if named is not None:
        where = f"{FLAG} {named}"
    elif environ.get(ENV):
        named, where = Path(environ[ENV]), f"${ENV} {environ[ENV]}"
    else:
        return parse(args, namespace)

    values = read(parser, named, where)
    # Each option the file sets (and the twin of a secret: an option and its file are one
    # choice) starts from a marker, so that what is still the marker after parsing was not
    # on the command line.
    touched = dict(values)
    for action in values:
        touched.update((twin, None) for twin in _twins(parser, action) if twin not in touched)
    saved = {action: (action.default, action.required) for action in touched}
    markers = {action: [] if _is_list(action) else object() for action in touched}
    for action in touched:
        action.default, action.required = markers[action], False
    try:
        result, rest = parse(args, namespace)
    finally:
        for action, (default, is_required) in saved.items():
            action.default, action.required = default, is_required
    given = {action for action in touched if getattr(result, action.dest) is not markers[action]}
    for action in touched:
        if action in given:
            continue
        if action in values and not given.intersection(_twins(parser, action)):
            setattr(result, action.dest, values[action])
        else:
            setattr(result, action.dest, saved[action][0])
    setattr(result, DEST, named)
    return result, rest


def read(parser: argparse.ArgumentParser, path: Path, where: str) -> dict[argparse.Action, Any]:
    """The options the TOML file ``path`` sets, converted as the command line converts them;
    ``where`` names the file in errors."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as exc:
        raise CliError(f"{where}: cannot read it: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"{where}: not valid TOML: {exc}") from exc
    options = keys(parser)
    values: dict[argparse.Action, Any] = {}
    seen: dict[argparse.Action, str] = {}
    for key, value in table.items():
        action = options.get(key.replace("-", "_"))
        if action is None:
            raise CliError(f"{where}: {_unknown(key, options, parser.prog)}")
        if action in seen:
            raise CliError(f"{where}: {seen[action]!r} and {key!r} set the same option; keep one")
        seen[action] = key
        values[action] = _value(parser, action, key, value, where)
    return values


def keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a configuration file of ``parser``'s command may hold (its long options,
    dashes as underscores), and the option each sets."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in (DEST, "help") or _kind(action) is None:
            continue
        for flag in action.option_strings:
            if flag.startswith("--"):
                out[flag[2:].replace("-", "_")] = action
    return out


def _kind(action: argparse.Action) -> str | None:
    """``flag`` (a TOML boolean), ``list`` (a TOML array), ``value``, or None for options a
    file cannot set (counters, constants, help)."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction | argparse.BooleanOptionalAction):
        return "flag"
    if isinstance(action, argparse._AppendAction) and action.nargs is None:
        return "list"
    if type(action) is argparse._StoreAction and action.option_strings:
        if action.nargs in (None, argparse.OPTIONAL):
            return "value"
        if action.nargs in (argparse.ZERO_OR_MORE, argparse.ONE_OR_MORE):
            return "list"
    return None


def _is_list(action: argparse.Action) -> bool:
    return _kind(action) == "list"


def _twins(parser: argparse.ArgumentParser, action: argparse.Action) -> list[argparse.Action]:
    """A secret's flag and its file option: the other of the two (empty for other options)."""
    secret = secret_of(action)
    if secret is None:
        return []
    return [a for a in parser._actions if a is not action and secret_of(a) is secret]


def _unknown(key: str, options: Mapping[str, argparse.Action], prog: str) -> str:
    close = difflib.get_close_matches(key.replace("-", "_"), list(options), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"the keys are the long options of {prog} without dashes"
    return f"unknown key {key!r} ({hint})"


def _value(parser: argparse.ArgumentParser, action: argparse.Action, key: str, value: Any, where: str) -> Any:
    secret = secret_of(action)
    if secret is not None and action.dest == secret.dest:
        if not secret.is_url or (isinstance(value, str) and secret.holds_secret(value)):
            raise CliError(f"{where}: {key}: {_secret_refusal(secret)}")
    kind = _kind(action)
    if kind == "flag":
        if not isinstance(value, bool):
            raise CliError(f"{where}: {key} = {_shown(value)}: expected true or false")
        return value if not isinstance(action, argparse._StoreFalseAction) else not value
    if kind == "list":
        if not isinstance(value, list):
            raise CliError(f"{where}: {key} = {_shown(value)}: expected an array of {_wanted(action)[2]}")
        return [_scalar(parser, action, key, item, where) for item in value]
    return _scalar(parser, action, key, value, where)


def _secret_refusal(secret: SecretOption) -> str:
    what = "a URL with a password" if secret.is_url else "a secret"
    return (
        f"{what} is not read from a configuration file in clear; name the file that holds it "
        f'({secret.file_dest} = "PATH", its first line), or set ${secret.env}'
    )


def _scalar(parser: argparse.ArgumentParser, action: argparse.Action, key: str, item: Any, where: str) -> Any:
    """``item`` converted by the option's ``type`` and checked against its ``choices``,
    as argparse does with a word of the command line."""
    wanted, name, _ = _wanted(action)
    fits = isinstance(item, wanted) and not isinstance(item, bool)
    if not fits:
        shown = "" if secret_of(action) is not None else f" = {_shown(item)}"
        raise CliError(f"{where}: {key}{shown}: expected {name}")
    try:
        converted = parser._get_value(action, str(item))
        parser._check_value(action, converted)
    except argparse.ArgumentError as exc:
        raise CliError(f"{where}: {key}: {exc.message}") from exc
    return converted


def _wanted(action: argparse.Action) -> tuple[type | tuple[type, ...], str, str]:
    """The TOML type an option's value must have: what its ``type`` returns, when that is
    a number; a string for anything else (a path, a name, ``TABLE=VALUE``)."""
    convert = action.type
    returns: Any = convert
    if callable(convert) and not isinstance(convert, type):
        try:
            returns = typing.get_type_hints(convert).get("return")
        except Exception:  # no readable annotation: the option takes words, as on the command line
            returns = None
    if returns is int:
        return int, "an integer", "integers"
    if returns is float:
        return (int, float), "a number", "numbers"
    return str, "a string", "strings"


def _shown(value: Any) -> str:
    """``value`` as TOML-ish text, for error messages."""
    return json.dumps(value, default=str)
