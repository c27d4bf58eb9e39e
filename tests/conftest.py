"""Session-wide test settings: JAX on CPU with 8 forced host devices (set before anything imports JAX)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.jax_share.sitecustomize import cheaper_cpu_compiles

# Sharding tests need 8 devices; everything else runs on device 0 of the same 8. These must be set before
# the first `import jax` anywhere in the session, so they live at the top of the root conftest.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
cheaper_cpu_compiles()  # XLA's cheaper CPU compiles, as in every process the tests start (its docstring)
os.environ.setdefault("WANDB_MODE", "offline")
# Offline W&B still probes endpoints (stats, CoreWeave metadata, error reports): point them at a closed port.
for _name, _value in {
    "WANDB_BASE_URL": "http://127.0.0.1:1",
    "WANDB__STATS_COREWEAVE_METADATA_BASE_URL": "http://127.0.0.1:1",
    "WANDB_X_DISABLE_STATS": "true",
    "WANDB_ERROR_REPORTING": "false",
}.items():
    os.environ.setdefault(_name, _value)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent JAX compilation cache for the whole session, shared by every process the tests start (the
# trainer, xdist workers inherit the environment; emulated sshd workers get it by SetEnv): the tiny model's
# programs are compiled once, not in every test. A cache hit still logs `Compiling ...` under JAX_LOG_COMPILES,
# so the recompile checks see the same lines. The controller (no PYTEST_XDIST_WORKER) makes it and removes it at
# the end; a caller's own dir is kept.
_OWN_JAX_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ and "PYTEST_XDIST_WORKER" not in os.environ:
    _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="tpuops-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JAX_CACHE
    Path(_OWN_JAX_CACHE).chmod(0o777)  # emulated workers are other Unix users (tpuops/cloud/emulator/sshd.py)
# Multi-process trainer runs share their compiles: process 0 compiles each program and the others load its binary
# (`JAX_SHARE_BINARY_BETWEEN_HOSTS`), which on CPU needs tests/jax_share (its docstring says why), on PYTHONPATH of
# every process the tests start. A copy in a session folder, which the emulated workers (other Unix users) can
# read; the emulator hands both variables to every worker session (TPUOPS_EMULATOR_WORKER_ENV, docs/cloud.md).
_OWN_JAX_SHARE = None
if "TPUOPS_TESTS_JAX_SHARE" not in os.environ:
    _OWN_JAX_SHARE = os.environ["TPUOPS_TESTS_JAX_SHARE"] = tempfile.mkdtemp(prefix="tpuops-tests-jax-share-")
    shutil.copy(Path(__file__).parent / "jax_share" / "sitecustomize.py", _OWN_JAX_SHARE)
    Path(_OWN_JAX_SHARE).chmod(0o755)
    (Path(_OWN_JAX_SHARE) / "sitecustomize.py").chmod(0o644)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_OWN_JAX_SHARE, os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ["JAX_SHARE_BINARY_BETWEEN_HOSTS"] = "1"
    # A peer that waits for a binary that never comes fails in 5 minutes, not JAX's 20.
    os.environ["JAX_SHARE_BINARY_BETWEEN_HOSTS_TIMEOUT_MS"] = "300000"
    os.environ["TPUOPS_EMULATOR_WORKER_ENV"] = (
        "PYTHONPATH,JAX_SHARE_BINARY_BETWEEN_HOSTS,JAX_SHARE_BINARY_BETWEEN_HOSTS_TIMEOUT_MS"
    )
# Where the shipped presets' background compiles (tests/fits.py) leave their results: one folder per session.
if "TPUOPS_TESTS_SHIPPED_FITS" not in os.environ:
    os.environ["TPUOPS_TESTS_SHIPPED_FITS"] = tempfile.mkdtemp(prefix="tpuops-tests-fits-")
    _OWN_FITS: str | None = os.environ["TPUOPS_TESTS_SHIPPED_FITS"]
else:
    _OWN_FITS = None
# libtpu's own logs (every TPU compile in `fit` writes a few files) in a folder of the session, not /tmp/tpu_logs.
_OWN_TPU_LOGS = None
if "TPU_LOG_DIR" not in os.environ:
    _OWN_TPU_LOGS = os.environ["TPU_LOG_DIR"] = tempfile.mkdtemp(prefix="tpuops-tests-tpu-logs-")
# torch (transformers' reference model in test_hf_equivalence) makes /tmp/torchinductor_$USER when imported: a
# folder of the session instead.
_OWN_TORCH = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _OWN_TORCH = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tpuops-tests-torch-")
# Bytecode for the session's processes. A container that sets PYTHONDONTWRITEBYTECODE (as this project's do) makes
# every process the tests start (hundreds of CLIs, trainers, xdist workers) compile tpuops/ and trainer/ from
# source again: about 0.16 s of CPU per CLI. The controller lets its children write it in place and removes, at
# the end, every __pycache__ folder of the checkout that was not there before (site-packages already has its own).
_REPO = Path(__file__).resolve().parents[1]
_PYCACHE_BEFORE: set[Path] | None = None
if os.environ.get("PYTHONDONTWRITEBYTECODE") and "PYTEST_XDIST_WORKER" not in os.environ:
    _PYCACHE_BEFORE = set(_REPO.glob("*/**/__pycache__"))
    del os.environ["PYTHONDONTWRITEBYTECODE"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# ---- the fast tier: `pytest -m "not slow"` (docs/ci.md) ----
# Slow, besides tests marked @pytest.mark.slow themselves: every test that starts real sshd workers, the TPU
# API emulator or a worker interpreter (by the fixtures it uses), and the modules that compile JAX programs
# or run the trainer. They all still run in CI; the fast tier is the inner loop (in-memory transport,
# loader, config, scanner, reports).
SLOW_FIXTURES = frozenset({"sshd_pool", "cloud", "cloud_session", "worker_python", "committed_repo"})
SLOW_MODULES = (
    "tests/trainer/kernels/",
    "tests/trainer/model/test_qwen2.py",
    "tests/trainer/model/test_grouped.py",
    "tests/trainer/model/test_hf_equivalence.py",
    "tests/trainer/model/test_loading.py",
    "tests/trainer/sampling/",
    "tests/trainer/fit/test_fit.py",
    "tests/trainer/grpo/test_loss.py",
    "tests/trainer/test_train.py",
    "tests/trainer/test_train_processes.py",
    "tests/trainer/test_eval.py",
    "tests/trainer/test_wandb.py",
    "tests/trainer/test_checkpoint_gcs.py",
    "tests/trainer/test_sharding.py",
    "tests/trainer/test_hub.py",
    "tests/trainer/test_make_tiny.py",
    "tests/tpuops/test_e2e_local.py",
    "tests/tpuops/checks/test_fit.py",
    # Measured (docs/performance.md, "The fast tier"): the tests that cost the most CPU in the fast tier
    # itself: a real venv, the emulator as a process, pseudo-terminals, real JAX or transformers, many CLI runs.
    "tests/tpuops/cloud/test_e2e_commands.py",
    "tests/tpuops/cloud/test_cli_vm.py",
    "tests/tpuops/test_live.py",
    "tests/tpuops/test_redaction.py",
    "tests/tpuops/test_exit_signals.py",
    "tests/tpuops/logs/test_follow_memory.py",
    "tests/tpuops/sop/test_pyenv.py::test_venv_is_created_then_reused_until_the_requirements_change",
    "tests/tpuops/test_cli.py::test_a_job_that_prints_its_secret_is_redacted_in_every_later_view",
    "tests/tpuops/test_cli.py::test_default_code_is_this_checkouts_pushed_head",
    "tests/tpuops/test_cli_basics.py::test_run_help_lists_the_sops_own_parameters",
    "tests/tpuops/test_cli_basics.py::test_logs_go_to_stdout_unprefixed_for_one_worker",
    "tests/tpuops/test_cli_basics.py::test_version_and_short_help",
    "tests/tpuops/sop/test_loader.py::test_sop_list_shows_the_valid_sops_and_each_broken_file_with_its_error",
    "tests/tpuops/sop/test_user_sops.py::test_sop_new_writes_a_commented_sop_for_the_users_command_that_runs",
    "tests/tpuops/sop/test_trainer_settings.py::test_an_explicit_trainer_key_has_the_last_word",
    "tests/tpuops/run/test_logreport.py::test_baseline_regression_beyond_the_threshold_exits_1",
    "tests/tpuops/run/test_logreport.py::test_html_page_is_self_contained_and_escaped",
    "tests/tpuops/run/test_logreport.py::test_recompile_after_warmup_exits_7_and_names_the_function",
    "tests/tpuops/run/test_logreport.py::test_a_run_id_is_read_from_the_state_home_with_exit_files",
    "tests/tpuops/run/test_logreport.py::test_charts_show_bounded_quantities",
    "tests/tpuops/run/test_scan.py::test_real_jax_compile_logging_is_attributed_to_the_step_that_recompiled",
    "tests/tpuops/run/test_scan.py::test_streaming_in_any_chunking_and_line_by_line_give_the_same_report",
    "tests/tpuops/logs/test_step_lines.py::test_report_reads_a_users_log_with_their_pattern_and_refuses_a_bad_one",
    "tests/trainer/test_config.py::test_a_config_the_run_rejects_exits_2_with_one_line",
    "tests/trainer/test_tokenizer.py::test_the_fast_tokenizer_matches_autotokenizer_and_imports_no_torch",
    "tests/trainer/grpo/test_rewards.py::test_correctness_format_and_tags",
)


# ---- the shipped presets' full-depth TPU compiles: CI's own step (docs/ci.md) ----
# Five full-depth compiles of 0.5B-7B models take about 22-26 core-minutes, more than the rest of the suite's
# 20-minute goal leaves on 2 cores: `.ci/run` runs them as their own step after the suite (`--presets -m presets`).
PRESETS_SKIPPED = "the shipped presets' TPU compiles are CI's own step: run them with --presets -m presets"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--presets",
        action="store_true",
        help="also run the shipped presets' full-depth TPU compiles (tests/fits.py, about 16 minutes of 2 cores); "
        "`-m presets --presets` runs them alone, as .ci/run does after the suite",
    )


class _ShippedFitsStarter:
    """Starts the shipped presets' compiles (tests/fits.py) once per session when the test that reads them will
    run: after -k/-m deselection, in this process when there are no xdist workers, else in the xdist controller
    when a worker's collection has it. Each process moves that test last (the compiles get the whole session)."""

    def __init__(self) -> None:
        self.started: list = []

    def start(self, ids: list[str]) -> None:
        from tests import fits

        if self.started or not any(i.endswith("::" + fits.TEST_NAME) for i in ids):
            return
        self.started.append(fits.ShippedFits(Path(os.environ["TPUOPS_TESTS_SHIPPED_FITS"]), dict(os.environ)))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from tests import fits

        chosen = [item for item in items if item.name == fits.TEST_NAME]
        if not config.getoption("presets"):
            for item in chosen:
                item.add_marker(pytest.mark.skip(reason=PRESETS_SKIPPED))
            return
        for item in chosen:
            items.remove(item)
            items.append(item)
        if chosen and not config.option.collectonly and not _xdist(config):  # else the controller starts them
            self.start([item.nodeid for item in chosen])

    def stop(self) -> None:
        for started in self.started:
            started.stop()


class _XdistController:
    def __init__(self, starter: _ShippedFitsStarter, config: pytest.Config) -> None:
        self.starter, self.config = starter, config

    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        if self.config.getoption("presets"):
            self.starter.start(ids)


_STARTER = _ShippedFitsStarter()


def _xdist(config: pytest.Config) -> bool:
    """A pytest-xdist run: this process is one of its workers or its controller."""
    return "PYTEST_XDIST_WORKER" in os.environ or getattr(config.option, "dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_STARTER, "tpuops-shipped-fits")
    if _xdist(config) and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller
        config.pluginmanager.register(_XdistController(_STARTER, config), "tpuops-shipped-fits-xdist")


def pytest_unconfigure(config: object) -> None:
    _STARTER.stop()
    for own in (_OWN_JAX_CACHE, _OWN_FITS, _OWN_TPU_LOGS, _OWN_JAX_SHARE, _OWN_TORCH):
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
    if _PYCACHE_BEFORE is not None:
        for made in set(_REPO.glob("*/**/__pycache__")) - _PYCACHE_BEFORE:
            shutil.rmtree(made, ignore_errors=True)


# ---- the longest modules first (docs/ci.md) ----
# pytest-xdist hands tests to its workers in collection order, so a long module collected last is a tail one
# worker runs while the others idle (2026-11-28: the trainer's in-process JAX modules, collected last, were the
# last 4 minutes of a run on one core). These modules run first, costliest first (longest processing time first),
# by their measured CPU seconds in a serial run with each test's CPU read from /proc/stat (docs/performance.md,
# "The whole suite"); every other module (under 15 s) keeps its place after them, and each module's tests keep
# their order (so module fixtures are made once per worker).
LONGEST_MODULES_FIRST = (
    "tests/trainer/test_train_processes.py",
    "tests/tpuops/cloud/test_e2e_commands.py",
    "tests/trainer/sampling/test_sampler.py",
    "tests/tpuops/cloud/test_recovery.py",
    "tests/tpuops/cloud/test_recovery_resume.py",
    "tests/trainer/test_train.py",
    "tests/tpuops/checks/test_fit.py",
    "tests/trainer/fit/test_fit.py",
    "tests/tpuops/test_e2e_local.py",
    "tests/trainer/model/test_flash.py",
    "tests/trainer/model/test_grouped.py",
    "tests/tpuops/cloud/test_multislice.py",
    "tests/trainer/kernels/test_cli.py",
    "tests/tpuops/cloud/test_failure_matrix.py",
    "tests/tpuops/cloud/test_e2e_grpo.py",
    "tests/trainer/model/test_qwen2.py",
    "tests/tpuops/cloud/test_fit_preflight.py",
    "tests/trainer/kernels/test_logprob.py",
    "tests/tpuops/cloud/test_cli_vm.py",
    "tests/trainer/test_eval.py",
    "tests/tpuops/test_cli.py",
    "tests/tpuops/sop/test_pyenv.py",
    "tests/trainer/kernels/test_sharded.py",
    "tests/test_package.py",
    "tests/tpuops/cloud/test_compute.py",
    "tests/trainer/test_sharding.py",
    "tests/trainer/test_multislice_mesh.py",
    "tests/tpuops/test_cli_basics.py",
    "tests/tpuops/test_faults.py",
    "tests/tpuops/test_usage_errors.py",
    "tests/trainer/test_wandb.py",
    "tests/trainer/test_hub.py",
    "tests/tpuops/cloud/test_api_calls.py",
    "tests/tpuops/run/test_logreport.py",
    "tests/trainer/model/test_hf_equivalence.py",
    "tests/tpuops/run/test_detach.py",
    "tests/tpuops/test_own_code.py",
    "tests/trainer/grpo/test_loss.py",
    "tests/tpuops/test_redaction.py",
    "tests/trainer/kernels/test_registry.py",
    "tests/tpuops/test_exec.py",
    "tests/tpuops/test_validators.py",
    "tests/tpuops/sop/test_lifecycle.py",
    "tests/trainer/sampling/test_kv_cache.py",
)


def _module_rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_MODULES_FIRST.index(path) if path in LONGEST_MODULES_FIRST else len(LONGEST_MODULES_FIRST)


def pytest_collection_modifyitems(config: object, items: list) -> None:
    slow = pytest.mark.slow
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.nodeid.startswith(
            SLOW_MODULES
        ):
            item.add_marker(slow)
    items.sort(key=_module_rank)  # stable: collection order within a rank
