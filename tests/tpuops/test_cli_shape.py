"""The CLI's shape, read from its code: the README's exit-code table is errors.py's, every command is wired
through one wrapper and the target commands share one option set, and cli/ holds wiring only."""

from __future__ import annotations

from pathlib import Path

from tpuops.errors import ExitCode


def test_readme_exit_code_table_is_the_one_in_errors() -> None:
    """README's "Exit codes" table, row for row, is what tpuops/errors.py says (paste the expected one on a diff)."""
    from tpuops.errors import EXIT_CODES, exit_code_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Exit codes\n", 1)[1]
    table = "\n".join(ln for ln in section.strip().split("\n\n", 1)[0].splitlines() if ln.startswith("|"))
    assert table == exit_code_table(), f"README.md's Exit codes table should be:\n{exit_code_table()}"
    assert sorted(int(c) for c in EXIT_CODES) == [int(c) for c in ExitCode]  # every code has a row
    assert len({cls for cls, _ in EXIT_CODES.values()}) == len(EXIT_CODES)  # error_class names are distinct


def _typer_commands(app: object, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    found: dict[tuple[str, ...], object] = {}
    for info in app.registered_commands:  # type: ignore[attr-defined]
        found[(*path, info.name)] = info.callback
    for group in app.registered_groups:  # type: ignore[attr-defined]
        found.update(_typer_commands(group.typer_instance, (*path, group.name)))
    return found


def test_every_command_is_wired_and_target_commands_share_one_option_set() -> None:
    """Every command records --json through one wrapper; every command that takes a target takes all of its
    options (one field of TargetOptions is one flag on each of them)."""
    import dataclasses

    import typer

    from tpuops.cli import app
    from tpuops.cli.options import TargetOptions

    commands = _typer_commands(app)
    assert len(commands) > 25
    for path, callback in commands.items():
        assert getattr(callback, "wired", False), path
    click_app = typer.main.get_command(app)
    target_names = {f.name for f in dataclasses.fields(TargetOptions)}
    with_target = []
    for path in commands:
        cmd = click_app
        for part in path:
            cmd = cmd.commands[part]  # type: ignore[attr-defined]
        names = {p.name for p in cmd.params}
        if "vm" in names and "host" in names:
            assert target_names <= names, (path, target_names - names)
            with_target.append(" ".join(path))
    assert sorted(with_target) == [
        "bench rollout", "doctor", "gradcheck", "microbench", "recompile-check", "run", "sop run",
    ]  # fmt: skip


def test_cli_modules_hold_no_subprocess_yaml_or_regex() -> None:
    """cli/ is wiring only: parsing and processes live in the library (an import anywhere in a module counts)."""
    import ast

    cli = Path(__file__).resolve().parents[2] / "tpuops" / "cli"
    banned = {"subprocess", "yaml", "re", "shlex"}
    found = []
    for module in sorted(cli.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{module.name}: {n}" for n in names if n.split(".")[0] in banned]
    assert len(list(cli.glob("*.py"))) >= 8 and not found, found
