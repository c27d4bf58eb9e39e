"""The user config: the project's tpuops.toml over ~/.config/tpuops/config.toml, checked where it is read (unknown
keys and wrong types are exit 2 naming file, line and key); flags given either way win over it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops import config
from tpuops.cli.options import TargetOptions
from tpuops.errors import UsageError
from tpuops.run import launch
from tpuops.sop.actions import render_plan


def test_project_file_overrides_user_file_and_feeds_sop_defaults(tmp_path: Path) -> None:
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "tpuops" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('zone = "us-central2-b"\nuser = "me"\n[params]\nbranch = "dev"\nrepo_dir = "~/a"\n')
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "tpuops.toml").write_text(
        'zone = "us-east1-d"\n[params]\nbranch = "release"\nrepo_url = "https://x/y.git"\n'
    )
    cfg = config.load(project / "sub")  # found walking up
    assert (cfg.zone, cfg.user) == ("us-east1-d", "me")
    assert cfg.params == {"branch": "release", "repo_dir": "~/a", "repo_url": "https://x/y.git"}
    result = launch.start(
        launch.RunRequest(sop="sync", target=launch.TargetSpec(hosts=("10.0.0.2",)), dry_run=True),
        cwd=project / "sub",
    )
    assert result.planned is not None
    plan = render_plan(result.planned.plan)
    assert "repo=https://x/y.git; ref=release" in plan
    assert 'dir="$HOME"/a;' in plan
    assert (
        launch.open_transport(launch.resolve(launch.TargetSpec(hosts=("10.0.0.2",)), cfg)).workers[0].user
        == "me"
    )


def test_unknown_key_names_the_closest(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text('zonee = "x"\n')
    with pytest.raises(UsageError, match=r"tpuops.toml:1: unknown key 'zonee'; did you mean 'zone'\?"):
        config.load(tmp_path)


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        (
            'parallel = "many"\n',
            "tpuops.toml:1: parallel",
            "must be a finite whole number >= 1, received 'many'",
        ),
        (
            'zone = "us-east1-d"\n\ninternal_ip = "no"\n',
            "tpuops.toml:3: internal_ip = 'no'",
            "internal_ip takes true or false",
        ),
        ('key_ttl = "12 parsecs"\n', "tpuops.toml:1: key_ttl '12 parsecs' is not a duration", ""),
        ("key_ttl = 60\nkey_ttl_s = 60\n", "tpuops.toml:2: key_ttl_s is the older name of key_ttl", ""),
        (
            'vm = "x"\ntunnel_through_iap = 1\n',
            "tpuops.toml:2: tunnel_through_iap = 1",
            "takes true or false",
        ),
        ("identity = 7\n", "tpuops.toml:1: identity = 7", "identity takes a quoted string"),
        ("params = 3\n", "tpuops.toml:1: params = 3", "params takes a table"),
    ],
)
def test_a_value_of_the_wrong_type_names_file_line_key_and_type(
    tmp_path: Path, text: str, line: str, expected: str
) -> None:
    (tmp_path / "tpuops.toml").write_text(text)
    with pytest.raises(UsageError) as e:
        config.load(tmp_path)
    assert line in e.value.line() and expected in e.value.line() and e.value.exit_code == 2


def test_key_ttl_reads_as_the_flag_does_and_its_older_name_still_reads(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text('key_ttl = "12h"\n')
    assert config.load(tmp_path).key_ttl == 43200 == TargetOptions(vm="v", key_ttl="12h").spec().key_ttl
    (tmp_path / "tpuops.toml").write_text("key_ttl_s = 600\n")
    assert config.load(tmp_path).key_ttl == 600


def test_a_bad_config_file_is_exit_2_with_one_line_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text('zone = "us-east1-d"\nparallel = "many"\n')
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "sop", "run", "sync", "--host", "me@10.0.0.2", "--dry-run", "--offline"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"{tmp_path / 'tpuops.toml'}:2: parallel must be" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ('zone = "us-east1-d"\n'.encode("utf-16"), "tpuops.toml: is UTF-16 text; a TOML file is UTF-8"),
        ('zone = "us-east1-d"\n'.encode("utf-16-be"), "tpuops.toml: is UTF-16 text (it holds NUL bytes)"),
        ('vm = "a"\n# caf\xe9\nzone = "b"\n'.encode("latin-1"), "tpuops.toml:2: byte 14 (0xe9) is not UTF-8"),
    ],
)
def test_a_config_file_that_is_not_utf8_is_one_line_exit_2(tmp_path: Path, data: bytes, says: str) -> None:
    (tmp_path / "tpuops.toml").write_bytes(data)
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "sop", "run", "sync", "--host", "me@10.0.0.2", "--dry-run", "--offline"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr and "save it as UTF-8" in r.stderr


def test_a_utf8_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_bytes('\ufeffzone = "us-east1-d"\n'.encode())
    assert config.load(tmp_path).zone == "us-east1-d"


def test_a_flag_given_either_way_wins_over_the_file_and_the_file_over_the_default(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text("internal_ip = true\nkey_push = false\ntunnel_through_iap = true\n")
    cfg = config.load(tmp_path)
    untold = TargetOptions(vm="v").spec().with_defaults(cfg)
    assert (untold.internal_ip, untold.key_push, untold.tunnel_through_iap) == (True, False, True)
    told = TargetOptions(vm="v", internal_ip=False, key_push=True, tunnel_through_iap=False).spec()
    told = told.with_defaults(cfg)
    assert (told.internal_ip, told.key_push, told.tunnel_through_iap) == (False, True, False)
    bare = TargetOptions(vm="v").spec().with_defaults(config.UserConfig())
    assert (bare.internal_ip, bare.key_push, bare.tunnel_through_iap) == (False, True, False)


def test_the_switches_take_both_forms_on_the_command_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "doctor", "--help"],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    for flag in (
        "--internal-ip",
        "--no-internal-ip",
        "--key-push",
        "--no-key-push",
        "--no-tunnel-through-iap",
    ):
        assert flag in r.stdout, r.stdout


def test_a_params_typo_is_exit_2_with_file_line_key_and_the_nearest_name(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text(
        'zone = "us-east1-d"\n\n[params]\nbranch = "main"\nconfg = "tiny"\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "run", "grpo", "--host", "me@10.0.0.2", "--dry-run", "--offline",
         "--set", "repo_url=https://x/y.git"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert (
        f"{tmp_path / 'tpuops.toml'}:5: [params] unknown parameter 'confg'; did you mean 'config'?"
        in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr


def test_a_param_only_other_sops_take_is_named_and_a_dotted_one_is_found(tmp_path: Path) -> None:
    """`[params]` serves every SOP: `config` (grpo's) with `sync` is a note naming the SOPs that take it, not
    an error; the dotted form `params.x = ...` is pointed at by its own line too."""
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "tpuops" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[params]\nbranch = "dev"\n')
    (tmp_path / "tpuops.toml").write_text(
        'zone = "us-east1-d"\nparams.config = "tiny"\nparams.lockfle = "~/l"\n'
    )
    cfg = config.load(tmp_path)
    assert (cfg.param_at("branch"), cfg.param_at("config")) == (f"{user}:2", f"{tmp_path / 'tpuops.toml'}:2")
    notes: list[str] = []
    request = launch.RunRequest(sop="sync", target=launch.TargetSpec(hosts=("10.0.0.2",)), dry_run=True)
    with pytest.raises(
        UsageError, match=r"tpuops.toml:3: \[params\] unknown parameter 'lockfle'; did you mean 'lockfile'"
    ):
        launch.start(request, cwd=tmp_path, on_notice=notes.append)
    (tmp_path / "tpuops.toml").write_text(
        'zone = "us-east1-d"\nparams.config = "tiny"\nparams.repo_url = "https://x/y.git"\n'
    )
    result = launch.start(request, cwd=tmp_path, on_notice=notes.append)
    assert result.planned is not None and "config" not in result.planned.values
    (note,) = notes
    assert note.startswith(f"{tmp_path / 'tpuops.toml'}:2: [params] config is not a parameter of SOP sync")
    assert note.endswith("(SOP gradcheck, grpo, recompile-check take it)"), note
