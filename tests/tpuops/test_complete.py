"""Shell completion of resource names, through each shell's completion protocol: bash runs the very function
`tpuops --show-completion` installs; zsh and fish are asked as their scripts ask (typer's environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tpuops.cli import complete
from tpuops.cloud.tpu_api import VmInfo

REPO = Path(__file__).resolve().parents[2]
RUN_IDS = ["20261127-090000-grpo-aa11", "20261129-101500-smoke-cc33", "20261128-120000-grpo-bb22"]


def _vm(name: str, zone: str, accelerator: str) -> VmInfo:
    return VmInfo(name, zone, "p", "READY", "HEALTHY", accelerator, "base", False, False, ())


def _runs(home: Path) -> None:
    for run_id in RUN_IDS:
        (home / "runs" / run_id).mkdir(parents=True)
        (home / "runs" / run_id / "run.json").write_text(json.dumps({"run_id": run_id}))


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """`tpuops` on PATH as an installed one would be, run from this checkout; no TPU API reachable."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "tpuops"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m tpuops "$@"\n')
    script.chmod(0o755)
    return {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
        "TPUOPS_TPU_API": "http://127.0.0.1:9", **extra,
    }  # fmt: skip


def test_bash_completes_sop_names_run_ids_newest_first_and_cached_vm_names(
    tpuops_home: Path, tmp_path: Path
) -> None:
    _runs(tpuops_home)
    complete.remember_vms(
        [_vm("demo-v6e", "us-east1-d", "v6e-8"), _vm("big-v4", "us-central2-b", "v4-32")],
        ["us-east1-d", "us-central2-b", "europe-west4-a"],
    )
    # The function bash runs on TAB (`complete -F _tpuops_completion tpuops`), with COMP_WORDS/COMP_CWORD set.
    ask = """
source <(_TPUOPS_COMPLETE=source_bash tpuops)
tab() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _tpuops_completion tpuops "${@: -1}";
        echo "$*: ${COMPREPLY[*]}"; }
tab tpuops run gr
tab tpuops sop show sm
tab tpuops attach ''
tab tpuops logs 20261128
tab tpuops run grpo --vm ''
tab tpuops vm describe b
tab tpuops doctor --zone us-
tab tpuops vm create x --accelerator v6e-1
"""
    t0 = time.monotonic()
    out = subprocess.run(
        ["bash", "-c", ask], env=_env(tmp_path), capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == [
        "tpuops run gr: gradcheck grpo",
        "tpuops sop show sm: smoke",
        "tpuops attach : " + " ".join(sorted(RUN_IDS, reverse=True)),  # newest first
        "tpuops logs 20261128: 20261128-120000-grpo-bb22",
        "tpuops run grpo --vm : big-v4 demo-v6e",
        "tpuops vm describe b: big-v4",
        "tpuops doctor --zone us-: us-central2-b us-east1-d",
        "tpuops vm create x --accelerator v6e-1: v6e-1 v6e-16 v6e-128",
    ], out
    # Eight TABs, none of which waited on the unreachable API above (each is a Python start).
    assert time.monotonic() - t0 < 60


def test_zsh_and_fish_get_the_names_with_what_they_are(tpuops_home: Path, tmp_path: Path) -> None:
    complete.remember_vms([_vm("demo-v6e", "us-east1-d", "v6e-8")], ["us-east1-d"])
    zsh = subprocess.run(
        ["tpuops"], capture_output=True, text=True, check=True, timeout=60,
        env=_env(tmp_path, _TPUOPS_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS="tpuops doctor --vm d"),
    )  # fmt: skip
    assert zsh.stdout.startswith("_arguments") and '"demo-v6e":"v6e-8 in us-east1-d"' in zsh.stdout
    fish = subprocess.run(
        ["tpuops"], capture_output=True, text=True, check=True, timeout=60,
        env=_env(tmp_path, _TPUOPS_COMPLETE="complete_fish", _TYPER_COMPLETE_ARGS="tpuops run ",
                 _TYPER_COMPLETE_FISH_ACTION="get-args"),
    )  # fmt: skip
    names = [ln.split("\t")[0] for ln in fish.stdout.splitlines()]
    assert {"grpo", "smoke", "sync", "recompile-check"} <= set(names) and names == sorted(names)


def test_the_vm_cache_is_short_lived_and_a_listing_replaces_its_zones(tpuops_home: Path) -> None:
    complete.remember_vms([_vm("a", "z1-a", "v4-8"), _vm("b", "z2-b", "v4-8")], ["z1-a", "z2-b"])
    complete.remember_vms([_vm("c", "z1-a", "v6e-8")], ["z1-a"])  # `vm list --zone z1-a`: a is gone there
    assert [n for n, _ in complete.vm_names("")] == ["b", "c"]
    complete.remember_vms([], forget=["b"])  # `vm delete b`
    assert [n for n, _ in complete.vm_names("")] == ["c"]
    data = json.loads(complete.cache_file().read_text())
    data["saved"] = time.time() - complete.CACHE_TTL_S - 1
    complete.cache_file().write_text(json.dumps(data))
    assert complete.vm_names("") == [] and complete.zones("") == []  # stale: `tpuops vm list` renews it
    complete.cache_file().write_text("{not json")
    assert complete.vm_names("") == []  # a damaged cache: no names, no error


def test_accelerator_types_are_the_priced_families_and_sizes() -> None:
    names = [n for n, _ in complete.accelerator_types("")]
    assert {"v4-8", "v5litepod-16", "v6e-8", "tpu7x-16", "v5p-128"} <= set(names)
    assert [n for n, _ in complete.accelerator_types("v4-")][:3] == ["v4-8", "v4-16", "v4-32"]
