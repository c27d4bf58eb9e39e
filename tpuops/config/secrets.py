"""The local .env: read literally, written in one form that `sh` and python-dotenv read back exactly.

Reading: python-dotenv's own parser (quotes, escapes, `export`, comments, quoted values spanning lines) with no
`${VAR}` interpolation, so a value is what the file says (`PW=pa$$wd${HOME}` is sent as exactly that text). A line
without `=` (python-dotenv's key without a value: mostly a value wrapped onto its own line) and a key that is not a
shell name are errors naming the line number only, never the line's text. A byte-order mark and CRLF line
endings are removed and reported. Writing (`serialize`): one `KEY='value'` or `KEY="value"` line per key,
chosen per value so that `set -a; . ./.env` in a POSIX shell and `dotenv_values(path, interpolate=False)`
both give back the value exactly. Values are never shown: only key names, hashes and fix notes leave here.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

from tpuops.errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_OF_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


@dataclass(frozen=True)
class EnvFile:
    values: dict[str, str]
    fixes: tuple[str, ...] = ()  # what was fixed on reading ("CRLF line endings", "a byte-order mark")

    def digest(self) -> str:
        return hashlib.sha256(serialize(self.values)).hexdigest()

    def key_hashes(self) -> dict[str, str]:
        """Per-key short hashes, to compare workers' files without showing a value."""
        return key_hashes(self.values)


def key_hashes(values: dict[str, str]) -> dict[str, str]:
    return {k: hashlib.sha256(v.encode()).hexdigest()[:12] for k, v in values.items()}


def parse(data: bytes) -> tuple[dict[str, str], list[str], list[str]]:
    """Literal values, fixes made, and one message per line that could not be read (never with its value)."""
    from dotenv.parser import parse_stream  # light: python-dotenv only

    fixes: list[str] = []
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        return {}, fixes, [f"not UTF-8 text (byte {e.start})"]
    if text.startswith("\ufeff"):
        text = text[1:]
        fixes.append("a byte-order mark")
    values: dict[str, str] = {}
    errors: list[str] = []
    crlf = False
    # python-dotenv reads CRLF line ends itself (a CR inside a quoted value stays part of the value); the file
    # sent to workers has LF ends, and the note says so.
    for b in parse_stream(io.StringIO(text, newline="")):
        crlf = crlf or b.original.string.endswith("\r\n")
        line = b.original.line
        if b.error:
            m = _KEY_OF_LINE.match(b.original.string)
            what = f"{m.group(1)} " if m else ""
            errors.append(f"line {line}: {what}cannot be parsed (check its quotes)")
        elif b.key is None:  # a blank line or a comment
            continue
        elif b.value is None:
            # python-dotenv takes a line without `=` for a key with no value: mostly the rest of a value wrapped
            # onto a line of its own, that is a piece of a secret. Neither its text nor a "key" is shown.
            errors.append(f"line {line} has no `=` (a value may span lines only inside quotes)")
        elif not _NAME.fullmatch(b.key):  # not shown either: it may be a wrapped value holding a `=`
            errors.append(f"line {line}: its key is not a shell variable name (letters, digits and _)")
        else:
            values[b.key] = b.value
    if crlf:
        fixes.append("CRLF line endings")
    return values, fixes, errors


def unreadable_keys(data: bytes) -> list[str]:
    """Names of keys on lines python-dotenv cannot parse (a worker's hand-edited file, say)."""
    from dotenv.parser import parse_stream

    text = data.decode(errors="replace").lstrip("\ufeff")
    found = []
    for b in parse_stream(io.StringIO(text, newline="")):
        m = _KEY_OF_LINE.match(b.original.string) if b.error else None
        if m:
            found.append(m.group(1))
    return found


def load(path: Path) -> EnvFile:
    """The local .env, checked: every line parsed, every key a shell name, every value writable (else exit 2)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(
            f"{path}: file not found", hint="create it or name another with --set env_file=PATH"
        ) from None
    values, fixes, errors = parse(data)
    if errors:
        raise UsageError(
            f"{path} {errors[0]}",
            hint="KEY=value, KEY='value' or KEY=\"value\", one per line; a value spanning lines is quoted",
        )
    for key, value in values.items():
        _form(key, value, path)
    return EnvFile(values, tuple(fixes))


def _form(key: str, value: str, path: Path | None = None) -> str:
    """The one quoting both readers agree on for this value.

    Single quotes: sh takes everything literally; python-dotenv only decodes `\\\\` and `\\'` -- so any value
    without `'` or `\\`. Double quotes, escaping `\\` and `"`: both decode `\\\\` and `\\"` alike, and neither
    touches `'` -- so any value without `$` or a backtick (sh would expand them; an escaped one stays escaped
    for python-dotenv). A value with both kinds (say `a'b$c`) has no form both read back, nor has a value
    ending in `\\` (python-dotenv takes `\\"` for an escaped quote there): those are refused (exit 2).
    """
    where = f"{path}: " if path else ""
    if value.endswith("\\"):
        raise UsageError(
            f"{where}the value of {key} ends with \\: python-dotenv cannot read that back",
            hint="end it with another character",
        )
    if "'" not in value and "\\" not in value:
        return f"'{value}'"
    if "$" not in value and "`" not in value:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise UsageError(
        f"{where}the value of {key} has ' or \\ and also $ or `: no .env form reads back the same in sh and "
        "python-dotenv",
        hint="pass it another way (e.g. a file the job reads) or drop one of the two kinds",
    )


def serialize(values: dict[str, str]) -> bytes:
    """The file sent to workers: `set -a; . ./.env` and `dotenv_values(p, interpolate=False)` read it back."""
    return "".join(f"{k}={_form(k, v)}\n" for k, v in sorted(values.items())).encode()


def normalized_env_bytes(path: Path) -> bytes:
    return serialize(load(path).values)
