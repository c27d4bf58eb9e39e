"""tpuops.toml, the project's over the user's (~/.config/tpuops/config.toml): read, checked against one pydantic
model (unknown keys and wrong types are exit 2 with file, line and key), merged."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import cast

from pydantic import ValidationError

from tpuops.config.model import UserConfig
from tpuops.config.target import parse_duration
from tpuops.config.trust import refuse_untrusted, search_up
from tpuops.errors import UsageError


def project_file(cwd: Path | None = None) -> Path | None:
    """The project's tpuops.toml: the one `tpuops --config PATH` named (TPUOPS_CONFIG), else the nearest one
    on the way up from `cwd` to the repository root (search_up), refused when another user owns or can write it."""
    named = os.environ.get("TPUOPS_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise UsageError(f"--config {named}: no such file", hint="name an existing tpuops.toml")
        return path
    cwd = (cwd or Path.cwd()).resolve()
    found = next((d / "tpuops.toml" for d in search_up(cwd) if (d / "tpuops.toml").is_file()), None)
    if found is not None:
        refuse_untrusted(found, "settings")
    return found


def config_paths(cwd: Path | None = None) -> list[Path]:
    """The files read, lowest precedence first: the user file, then the nearest project tpuops.toml."""
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    paths = [xdg / "tpuops" / "config.toml"]
    project = project_file(cwd)
    return [*paths, project] if project else paths


def load(cwd: Path | None = None) -> UserConfig:
    """The project file over the user file, each checked against UserConfig where it is read: an unknown key
    or a value of the wrong type is exit 2 naming the file, the line, the key and what it expects."""
    merged: dict[str, object] = {"params": {}}
    params_at: dict[str, str] = {}
    for path in config_paths(cwd):
        if not path.is_file():
            continue
        text = _read_text(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: invalid TOML: {e}") from None
        _spellings(path, text, data)
        _check(path, text, data)
        given = cast(dict[str, object], data.get("params", {}))  # a table: `_check` saw to that
        params = {**cast(dict[str, object], merged["params"]), **given}
        params_at.update({k: f"{path}:{_param_line(text, k)}" for k in given})
        merged.update(data)
        merged["params"] = params
    cfg = UserConfig.model_validate(merged)
    cfg._params_at = params_at
    return cfg


def _read_text(path: Path) -> str:
    """A TOML file's text: UTF-8, as TOML defines it (a UTF-8 byte-order mark is dropped). Every other encoding
    (UTF-16 from an editor on Windows, a Latin-1 byte) or an unreadable file is exit 2 naming the file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e})") from None
    bom = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    if bom or b"\x00" in data:  # UTF-16: its byte-order mark, or the NUL bytes of its ASCII characters
        raise UsageError(
            f"{path}: is UTF-16 text{'' if bom else ' (it holds NUL bytes)'}; a TOML file is UTF-8",
            hint=f"save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 {path.name} > {path.name}.new)",
        )
    try:
        return data.removeprefix(b"\xef\xbb\xbf").decode()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UsageError(
            f"{path}:{line}: byte {e.start} (0x{data[e.start]:02x}) is not UTF-8; a TOML file is UTF-8",
            hint=f"save it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 {path.name} > {path.name}.new)",
        ) from None


def _spellings(path: Path, text: str, data: dict[str, object]) -> None:
    """`key_ttl` as the --key-ttl flag takes it (seconds, or `30m`, `12h`, `7d`); `key_ttl_s`, its older name,
    still read (in seconds)."""
    if "key_ttl_s" in data:
        if "key_ttl" in data:
            raise UsageError(
                f"{path}:{_line(text, 'key_ttl_s')}: key_ttl_s is the older name of key_ttl: keep one"
            )
        data["key_ttl"] = data.pop("key_ttl_s")
    ttl = data.get("key_ttl")
    if isinstance(ttl, str):
        data["key_ttl"] = float(parse_duration(f"{path}:{_line(text, 'key_ttl')}: key_ttl", ttl))


_TYPES = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "str": "a quoted string",
    "dict": "a table",
}


def _check(path: Path, text: str, data: dict[str, object]) -> None:
    valid = list(UserConfig.model_fields)
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(
                f"{path}:{_line(text, key)}: unknown key {key!r}{hint}",
                hint=f"valid keys: {', '.join(valid)}",
            )
    _check_values(path, text, data)
    try:
        UserConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"][:1])
        field = UserConfig.model_fields[key]
        expected = " or ".join(
            _TYPES.get(t, t) for t in re.findall(r"\b(bool|int|float|str|dict)\b", str(field.annotation))
        )
        raise UsageError(
            f"{path}:{_line(text, key)}: {key} = {data[key]!r}: {first['msg'].lower()}",
            hint=f"{key} takes {expected or first['type']}",
        ) from None


def _line(text: str, key: str) -> int:
    """The line where a top-level key is set (1 when it cannot be told: a dotted or inline form)."""
    head = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")
    table = re.compile(rf"^\s*\[\s*{re.escape(key)}\s*\]")
    in_table = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            if table.match(line):
                return n
            in_table = True
        elif not in_table and head.match(line):
            return n
    return 1


def _param_line(text: str, key: str) -> int:
    """The line where a [params] key is set: under `[params]`, or dotted (`params.key = ...`); 1 when it cannot
    be told (an inline table)."""
    name = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    inside, dotted = re.compile(rf"^\s*{name}\s*="), re.compile(rf"^\s*params\s*\.\s*{name}\s*=")
    in_params = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            in_params = re.match(r"^\s*\[\s*params\s*\]", line) is not None
        elif (in_params and inside.match(line)) or (not in_params and dotted.match(line)):
            return n
    return 1


def _check_values(path: Path, text: str, data: dict[str, object]) -> None:
    """Names by the API's rules, numbers by sign and finiteness (config/validators.py), before anything runs."""
    from tpuops.config import validators

    def where(key: str) -> str:
        return f"{path}:{_line(text, key)}: {key}"

    for kind in ("vm", "zone", "project"):
        if kind in data:
            validators.name(kind, data[kind], where(kind))
    if "parallel" in data:
        validators.number(data["parallel"], where("parallel"), minimum=1, above=False, integer=True)
    if "unreachable_s" in data:
        validators.number(data["unreachable_s"], where("unreachable_s"), minimum=1, above=False)
    if "key_ttl" in data:
        validators.number(data["key_ttl"], where("key_ttl"))
