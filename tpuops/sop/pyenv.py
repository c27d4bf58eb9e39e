"""The python_env step: the repository's Python environment, chosen by what it has (pyproject, requirements,
uv.lock), an existing interpreter, or a conda env; a venv is reused while its requirements are unchanged."""

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

# How a venv is filled (`install`): `auto` decides on the worker from the checkout, in this order.
INSTALLS = ("auto", "uv", "pyproject", "requirements")
# Where conda installs live when `conda` is not on a non-interactive shell's PATH.
CONDA_BASES = (
    '"$(dirname "$(dirname "${CONDA_EXE:-/nonexistent/x/x}")")"',
    '"$HOME"/miniconda3',
    '"$HOME"/anaconda3',
    '"$HOME"/miniforge3',
    '"$HOME"/mambaforge',
    "/opt/conda",
)


def python_of(venv: str, python: str) -> str:
    """Shell text choosing the interpreter: the venv's, or `python` itself when venv is `none`."""
    if venv == "none":
        return shell.quote(python)
    return f"{shell.path(venv)}/bin/python"


def describe(venv: str, python: str, install: str, requirements: str, conda_env: str) -> str:
    """The environment choice in words, as the plan and --dry-run show it."""
    if conda_env:
        return f"conda env {conda_env} (linked at {venv})"
    if venv == "none":
        return f"the interpreter {python} as it is (nothing installed)"
    how = {
        "uv": "uv sync --frozen (uv.lock)",
        "pyproject": "pip install -e .[extras]",
        "requirements": f"pip install -r {requirements or 'requirements.txt'}",
        "auto": "decided on the worker: uv.lock, else pyproject.toml, else requirements.txt",
    }.get(install, install)
    return f"venv {venv} from {python}: {how}"


class PythonEnv(Step):
    """The environment the job runs in, reporting python/jax/jaxlib/libtpu versions:

    - `conda_env: NAME`: that existing conda env, linked at `venv` (nothing installed);
    - `venv: none`: `python` as it is (an interpreter path: nothing installed);
    - else a venv at `venv` made from `python` and filled by `install`: `pyproject` (`pip install -e .[extras]`,
      empty extras allowed), `requirements` (`pip install -r` each file of `requirements`), `uv` (`uv sync
      --frozen`, when uv is on the worker), or `auto` (uv.lock, else pyproject.toml/setup.py, else
      requirements.txt or the `requirements` given, else an empty venv). Reused while the project's requirement
      files, the choice and the extras are unchanged.
    """

    kind: Literal["python_env"] = "python_env"
    repo_dir: str = "~/tpuops/repo"
    venv: str = "~/tpuops/venv"  # `none`: use `python` as it is (it must already have what the job needs)
    python: str = "python3"
    extras: str = "trainer,tpu"
    install: str = "auto"
    requirements: str = ""  # files relative to the checkout, space-separated (install: requirements)
    conda_env: str = ""
    min_python: str = (
        "3.11"  # the project's requires-python (TPU VM images ship 3.10 as python3); "" no check
    )
    timeout: float = 1800.0
    template_fields: ClassVar[tuple[str, ...]] = (
        "repo_dir", "venv", "python", "extras", "install", "requirements", "conda_env", "min_python",
    )  # fmt: skip

    def check(self, ctx: PlanContext) -> list[Action]:
        """The interpreter exists and is new enough, before any step changes the worker (a conda env is
        looked for by the step itself)."""
        py, min_python = ctx.raw(self.python), ctx.raw(self.min_python)
        if ctx.raw(self.conda_env) or not min_python:
            return []
        return [
            Command(
                f"{shell.quote(py)} -c {shell.quote(_version_check(min_python))}",
                timeout=60,
                what=f"check that {py} is Python {min_python} or newer",
            )
        ]

    def check_outcome(self, results: list[CmdResult]) -> Outcome:
        r = results[-1] if results else None
        return Outcome("ok") if r is not None and r.ok else super().outcome(results)

    def plan(self, ctx: PlanContext) -> list[Action]:
        venv, py, conda = ctx.raw(self.venv), ctx.raw(self.python), ctx.raw(self.conda_env)
        install, reqs, min_python = (
            ctx.raw(self.install),
            ctx.raw(self.requirements),
            ctx.raw(self.min_python),
        )
        if install not in INSTALLS:
            raise ValueError(f"install must be one of {', '.join(INSTALLS)}, received {install!r}")
        if conda and venv == "none":
            raise ValueError("conda_env needs venv to be a path (tpuops links the conda env there), not none")
        lines = [
            "set -e",
            f"# python environment: {describe(venv, py, install, reqs, conda)}",
            f"cd {shell.path(ctx.raw(self.repo_dir))}",
        ]
        if conda:
            lines += self._conda(conda, venv)
        else:
            if min_python:
                lines.append(f"{shell.quote(py)} -c {shell.quote(_version_check(min_python))}")
            lines += self._venv(venv, py, install, reqs, ctx.raw(self.extras)) if venv != "none" else []
            if venv == "none":
                lines.append("echo 'tpuops: env=python'")
        lines.append(f"{python_of(venv, py)} -c {shell.quote(_VERSIONS)}")
        what = f"python environment: {describe(venv, py, install, reqs, conda)}"
        return [Command("\n".join(lines), timeout=self.timeout, progress=True, what=what)]

    def _conda(self, name: str, venv: str) -> list[str]:
        v, n = shell.path(venv), shell.quote(name)
        bases = " ".join(CONDA_BASES)
        missing = (
            f"conda env {name} not found on this worker (looked in: conda info --base, $CONDA_EXE's base, "
            f"~/miniconda3, ~/anaconda3, ~/miniforge3, ~/mambaforge, /opt/conda): create it, or pass "
            f"--set python=/path/to/envs/{name}/bin/python"
        )
        taken = f"{venv} exists and is not a venv tpuops made: pass --set venv=PATH for the conda env's link"
        return [
            'prefix=""',
            f"if command -v conda >/dev/null 2>&1; then base=$(conda info --base 2>/dev/null || true); "
            f'[ -n "$base" ] && [ -x "$base"/envs/{n}/bin/python ] && prefix="$base"/envs/{n}; fi',
            f'if [ -z "$prefix" ]; then for base in {bases}; do',
            f'  if [ -x "$base"/envs/{n}/bin/python ]; then prefix="$base"/envs/{n}; break; fi; done; fi',
            f'if [ -z "$prefix" ]; then echo {shell.quote(missing)} >&2; exit 1; fi',
            # A venv tpuops made (it has the key file) is made again when a run needs it; anything else stays.
            f"if [ -e {v} ] && [ ! -L {v} ]; then",
            f"  if [ -f {v}/.tpuops-key ]; then rm -rf {v}; else echo {shell.quote(taken)} >&2; exit 1; fi",
            "fi",
            f'ln -sfn "$prefix" {v}',
            "echo 'tpuops: env=conda'",
        ]

    def _venv(self, venv: str, py: str, install: str, reqs: str, extras: str) -> list[str]:
        v, q = shell.path(venv), shell.quote(py)
        no_uv = (
            "the repository has uv.lock but uv is not on the worker's PATH: install uv there (pip install uv), "
            "or pass --set install=pyproject (or --set requirements=FILE)"
        )
        no_reqs = "no requirements file: pass --set requirements=FILE (relative to the repository)"
        return [
            *_PIP_NAMED,
            f"mode={shell.quote(install)}",
            f"reqs={shell.quote(reqs)}",
            f"extras={shell.quote(extras)}",
            'if [ "$mode" = auto ]; then',
            "  if [ -f uv.lock ]; then mode=uv; elif [ -f pyproject.toml ] || [ -f setup.py ]; then mode=pyproject",
            '  elif [ -n "$reqs" ] || [ -f requirements.txt ]; then mode=requirements; else mode=bare; fi',
            "fi",
            'if [ "$mode" = requirements ] && [ -z "$reqs" ]; then',
            f"  if [ -f requirements.txt ]; then reqs=requirements.txt; else echo {shell.quote(no_reqs)} >&2; exit 1; fi",
            "fi",
            'for f in $reqs; do [ -f "$f" ] || { echo "requirements file $f is not in the checkout" >&2; exit 1; }; done',
            # The key covers what would be installed: the project's requirement files, the choice, the extras.
            'key="$(cat pyproject.toml setup.py uv.lock requirements*.txt $reqs 2>/dev/null | sha256sum | cut -c1-16)'
            '-$mode-$reqs-$extras"',
            f"if [ -L {v} ]; then rm {v}; fi  # an earlier run's conda link: never install into that env",
            f'if [ -x {v}/bin/python ] && [ "$(cat {v}/.tpuops-key 2>/dev/null)" = "$key" ]; then',
            "  echo 'tpuops: venv=reused'",
            "else",
            '  case "$mode" in',
            "  uv)",
            f"    command -v uv >/dev/null 2>&1 || {{ echo {shell.quote(no_uv)} >&2; exit 1; }}",
            '    set --; for e in $(echo "$extras" | tr , \' \'); do set -- "$@" --extra "$e"; done',
            f'    UV_PROJECT_ENVIRONMENT={v} uv sync --frozen --python {q} "$@" ;;',
            "  *)",
            f"    {q} -m venv {v}",
            '    case "$mode" in',
            '    pyproject) if [ -n "$extras" ]; then spec=".[$extras]"; else spec=.; fi',
            f'      pip_named {v}/bin/python -m pip install -e "$spec" ;;',
            '    requirements) set --; for f in $reqs; do set -- "$@" -r "$f"; done',
            f'      pip_named {v}/bin/python -m pip install "$@" ;;',
            "    *) echo 'tpuops: nothing to install (no pyproject.toml, uv.lock or requirements*.txt)' ;;",
            "    esac ;;",
            "  esac",
            f'  echo "$key" > {v}/.tpuops-key',
            "  echo 'tpuops: venv=created'",
            "fi",
            'echo "tpuops: env=$mode"',
        ]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        found = markers(results[-1].stdout) if results and results[-1].ok else []
        versions = next((m for m in found if m["_"].startswith("versions")), None)
        if versions is None:
            return super().outcome(results)
        data: dict[str, object] = {k: versions[k] for k in ("python", "jax", "jaxlib", "libtpu")}
        env = next((m["env"] for m in found if "env" in m), None)
        created = any(m.get("venv") == "created" for m in found)
        detail = " ".join(f"{k}={v}" for k, v in data.items())
        return Outcome(
            "changed" if created else "nothing",
            detail if env is None else f"{detail} env={env}",
            {"versions": data, **({"env": env} if env else {})},
        )


# pip install that names each package on stdout as pip collects it (`tpuops-doing: ...`, the live status line:
# `preparing venv: collecting flax>=0.10`); pip's other lines go to stderr, its exit code is the function's.
_PIP_NAMED = (
    "pip_named() {",
    '  rcf="$(mktemp)"',
    '  { "$@" --progress-bar off 2>&1 && echo 0 > "$rcf" || echo $? > "$rcf"; } | while IFS= read -r l; do',
    '    case "$l" in',
    '      "Collecting "*|"Processing "*|"Obtaining "*) n="${l#* }"; n="${n%% *}"',
    '        echo "tpuops-doing: collecting ${n##*/}" ;;',
    '      "Installing collected packages: "*) echo "tpuops-doing: installing ${l#*: }" ;;',
    "      *) printf '%s\\n' \"$l\" >&2 ;;",
    "    esac",
    "  done",
    '  rc="$(cat "$rcf")"; rm -f "$rcf"; return "$rc"',
    "}",
)


def _version_check(min_python: str) -> str:
    major, minor = (int(x) for x in min_python.split("."))
    return (
        f"import sys; v = sys.version_info; sys.exit(0 if v >= ({major}, {minor}) else sys.executable + "
        f"' is Python %d.%d; this project needs {min_python} or newer: install it (for example "
        f"python{min_python}-venv) and pass --set python=python{min_python}' % v[:2])"
    )
