"""JAX's profiler in a run: the server at start-up, step and phase annotations, a trace of chosen steps."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import jax

from trainer import metrics
from trainer.config import Config

PHASE_PREFIX = "phase/"  # docs/contracts.md: what a trace summary reads as a step's phases


# Facts of the launch, in the environment as TRAINER_COORDINATOR is (tpuops' grpo SOP sets them; the config's
# profile.port and profile.dir, when given, win): process k's server listens on the base port + k, so the
# processes of one host never collide; a steps trace goes into the run's own folder.
ENV_PORT_BASE, ENV_DIR = "TRAINER_PROFILE_PORT_BASE", "TRAINER_PROFILE_DIR"


def launch_port() -> int:
    """The profiler port the launch gave this process (0: none)."""
    from trainer.distributed import ENV_ID

    base = os.environ.get(ENV_PORT_BASE, "")
    if not base.isdigit() or int(base) == 0:
        return 0
    k = os.environ.get(ENV_ID, "0")
    return int(base) + (int(k) if k.isdigit() else 0)


def port_free(port: int) -> bool:
    """Nothing listens on `port` (JAX's server logs a bind failure but does not raise)."""
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
        try:
            s.bind(("::" if socket.has_ipv6 else "0.0.0.0", port))
        except OSError:
            return False
    return True


def start_server(cfg: Config, emit: metrics.Emitter) -> None:
    """profile.port > 0: JAX's profiler server on it, said in the log (`profiler: server port=N`); a port in use
    is said too, and the run goes on without a server."""
    port = cfg.profile.port or launch_port()
    if not port:
        return
    if not port_free(port):
        emit.line(f"profiler: warning: port {port} is in use: no profiler server", all_processes=True)
        return
    jax.profiler.start_server(port)
    emit.line(f"profiler: server port={port}", all_processes=True)


class StepTracer:
    """Each step under a `StepTraceAnnotation` (its number in the trace), each phase under `phase/<name>`; the
    steps of profile.steps traced into profile.dir."""

    def __init__(self, cfg: Config, emit: metrics.Emitter) -> None:
        self.range = cfg.profile.step_range
        out = cfg.profile.dir or os.environ.get(ENV_DIR) or str(Path(cfg.log.output_dir) / "profile")
        self.dir = Path(out).expanduser()
        self.emit = emit
        self.tracing = False
        self.last = -1

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        if self.range and step == self.range[0] and not self.tracing:
            self.dir.mkdir(parents=True, exist_ok=True)
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0  # every Python call an event: the ops would drown
            options.host_tracer_level = 2
            jax.profiler.start_trace(str(self.dir), profiler_options=options)
            self.tracing = True
            self.t0 = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            yield
        self.last = step
        if self.tracing and self.range and step >= self.range[1]:
            self.stop()

    def stop(self) -> None:
        """End a steps trace (after its last step, or when the run ends or stops inside it)."""
        if not self.tracing:
            return
        jax.profiler.stop_trace()
        self.tracing = False
        assert self.range is not None
        self.emit.line(
            f"profiler: trace steps={self.range[0]}-{self.last} dir={self.dir} "
            f"seconds={time.perf_counter() - self.t0:.2f}",
            all_processes=True,
        )

    @staticmethod
    def phase(name: str) -> contextlib.AbstractContextManager[object]:
        return jax.profiler.TraceAnnotation(PHASE_PREFIX + name)
