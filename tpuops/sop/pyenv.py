"""The python_env step: a venv with the project's extras, reused while the requirements are unchanged."""

from __future__ import annotations

from typing import ClassVar, Literal

from tpuops import shell
from tpuops.sop.actions import Action, Command
from tpuops.sop.model import Outcome, PlanContext, Step, markers
from tpuops.transport.base import CmdResult

_VERSIONS = """import importlib.metadata as m, sys
def v(*names):
    for n in names:
        try:
            return m.version(n)
        except Exception:
            pass
    return "-"
print("tpuops: versions python=%s jax=%s jaxlib=%s libtpu=%s" % (
    sys.version.split()[0], v("jax"), v("jaxlib"), v("libtpu", "libtpu-nightly")))"""


def python_of(venv: str, python: str) -> str:
    """Shell text choosing the interpreter: the venv's, or `python` itself when venv is `none`."""
    if venv == "none":
        return shell.quote(python)
    return f"{shell.path(venv)}/bin/python"


class PythonEnv(Step):
    """Create or reuse a venv in which `pip install -e .[extras]` ran; report python/jax/jaxlib/libtpu versions."""

    kind: Literal["python_env"] = "python_env"
    repo_dir: str = "~/tpuops/repo"
    venv: str = "~/tpuops/venv"  # `none`: use `python` as it is (it must already have the extras)
    python: str = "python3"
    extras: str = "trainer,tpu"
    min_python: str = "3.11"  # the project's requires-python (TPU VM images ship 3.10 as python3)
    timeout: float = 1800.0
    template_fields: ClassVar[tuple[str, ...]] = ("repo_dir", "venv", "python", "extras")

    def plan(self, ctx: PlanContext) -> list[Action]:
        venv, py = ctx.raw(self.venv), ctx.raw(self.python)
        major, minor = (int(x) for x in self.min_python.split("."))
        check = (
            f"import sys; v = sys.version_info; sys.exit(0 if v >= ({major}, {minor}) else sys.executable + "
            f"' is Python %d.%d; the trainer needs {self.min_python} or newer: install it (for example "
            f"python{self.min_python}-venv) and pass --set python=python{self.min_python}' % v[:2])"
        )
        lines = [
            "set -e",
            f"cd {shell.path(ctx.raw(self.repo_dir))}",
            f"{shell.quote(py)} -c {shell.quote(check)}",  # the base interpreter, with or without a venv
        ]
        if venv != "none":
            v = shell.path(venv)
            lines += [
                f"extras={shell.quote(ctx.raw(self.extras))}",
                # The key covers what pip would install: the project's requirements and the extras asked for.
                'key="$(cat pyproject.toml requirements*.txt 2>/dev/null | sha256sum | cut -c1-16)-$extras"',
                f'if [ -x {v}/bin/python ] && [ "$(cat {v}/.tpuops-key 2>/dev/null)" = "$key" ]; then',
                "  echo 'tpuops: venv=reused'",
                "else",
                f"  {shell.quote(py)} -m venv {v}",
                f'  {v}/bin/python -m pip install -q -e ".[$extras]"',
                f'  echo "$key" > {v}/.tpuops-key',
                "  echo 'tpuops: venv=created'",
                "fi",
            ]
        lines.append(f"{python_of(venv, py)} -c {shell.quote(_VERSIONS)}")
        return [Command("\n".join(lines), timeout=self.timeout)]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        found = markers(results[-1].stdout) if results and results[-1].ok else []
        versions = next((m for m in found if m["_"].startswith("versions")), None)
        if versions is None:
            return super().outcome(results)
        data = {k: versions[k] for k in ("python", "jax", "jaxlib", "libtpu")}
        created = any(m.get("venv") == "created" for m in found)
        detail = " ".join(f"{k}={v}" for k, v in data.items())
        return Outcome("changed" if created else "nothing", detail, {"versions": data})
