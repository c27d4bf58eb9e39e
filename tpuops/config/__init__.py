"""What the user asked for: tpuops.toml (settings.py; only from places the user owns: trust.py), the target
options it defaults (target.py), names and numbers checked at the edge (validators.py), .env files (secrets.py) and
the state home with its atomic writes (state.py). The names below are the package's public face, each imported on
first use: `tpuops --help` loads none of them (pydantic among them: tests/tpuops/test_cli.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuops.config.model import TargetSettings, UserConfig
    from tpuops.config.settings import config_paths, load, project_file
    from tpuops.config.state import (
        open_private,
        private_dir,
        run_folder,
        state_home,
        write_atomic,
        write_private,
    )
    from tpuops.config.target import TargetSpec, parse_duration, parse_sets, target_from_options
    from tpuops.config.trust import refuse_untrusted, search_up, untrusted

_WHERE = {
    "TargetSettings": "model", "UserConfig": "model",
    "config_paths": "settings", "load": "settings", "project_file": "settings",
    "open_private": "state", "private_dir": "state", "run_folder": "state", "state_home": "state",
    "write_atomic": "state", "write_private": "state",
    "TargetSpec": "target", "parse_duration": "target", "parse_sets": "target", "target_from_options": "target",
    "refuse_untrusted": "trust", "search_up": "trust", "untrusted": "trust",
}  # fmt: skip

__all__ = [
    "TargetSettings", "TargetSpec", "UserConfig", "config_paths", "load", "open_private", "parse_duration",
    "parse_sets", "private_dir", "project_file", "refuse_untrusted", "run_folder", "search_up", "state_home",
    "target_from_options", "untrusted", "write_atomic", "write_private",
]  # fmt: skip


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'tpuops.config' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tpuops.config.{_WHERE[name]}"), name)
