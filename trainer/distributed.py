"""Multi-host: the join (jax.distributed; coordinator env on CPU) and host data placed on and gathered off the mesh."""

from __future__ import annotations

import os
import sys
import threading

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.sharding import batch_axes

ENV_COORDINATOR = "TRAINER_COORDINATOR"
ENV_NUM = "TRAINER_NUM_PROCESSES"
ENV_ID = "TRAINER_PROCESS_ID"
ENV_TIMEOUT = "TRAINER_JOIN_TIMEOUT"  # seconds to wait for every process (default 120)


def num_slices() -> int:
    """How many slices this run spans: MEGASCALE_NUM_SLICES, as tpuops' run step and Cloud TPU's tpu-env set it."""
    return int(os.environ.get("MEGASCALE_NUM_SLICES") or 1)


def init(timeout_s: int | None = None) -> tuple[int, int]:
    """(process_index, process_count). If the expected processes do not join in time: a clear exit, no hang."""
    timeout_s = timeout_s or int(os.environ.get(ENV_TIMEOUT) or 120)

    num = int(os.environ.get(ENV_NUM) or 1)
    coordinator = os.environ.get(ENV_COORDINATOR)
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")

    def give_up(why: str) -> None:
        print(
            f"multi-host: process {os.environ.get(ENV_ID, '?')} of {num} has not joined the coordinator "
            f"{coordinator or '(auto)'} within {timeout_s}s: {why}",
            file=sys.stderr,
            flush=True,
        )

    # JAX's own timeout aborts the process from C++ (SIGABRT, a stack dump, no Python exception), so a
    # watchdog with a shorter deadline says why and exits 1 first.
    def watchdog() -> None:
        give_up("the other processes did not register (are they all started, with the same coordinator?)")
        os._exit(1)

    timer = threading.Timer(timeout_s, watchdog)
    timer.daemon = True
    try:
        if num > 1 and coordinator:
            pid = int(os.environ.get(ENV_ID) or 0)
            if "cpu" in os.environ.get("JAX_PLATFORMS", ""):
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            timer.start()
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=num,
                process_id=pid,
                initialization_timeout=timeout_s + 60,
            )
        elif "," in hosts:  # a multi-host TPU slice: JAX finds the coordinator itself
            timer.start()
            jax.distributed.initialize(initialization_timeout=timeout_s + 60)
    except Exception as e:
        give_up(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        raise SystemExit(1) from None
    finally:
        timer.cancel()
    return jax.process_index(), jax.process_count()


def global_array(mesh: Mesh, host: np.ndarray) -> jax.Array:
    """A batch-sharded global array from data every process holds in full (each places only its shards)."""
    spec = P(batch_axes(mesh), *([None] * (host.ndim - 1)))
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def to_host(x: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-host) global array, on every process."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
