"""Multi-host start-up: jax.distributed on TPU pods, or explicit coordinator/process env for CPU runs."""

from __future__ import annotations

import os
import sys

ENV_COORDINATOR = "TRAINER_COORDINATOR"
ENV_NUM = "TRAINER_NUM_PROCESSES"
ENV_ID = "TRAINER_PROCESS_ID"


def init(timeout_s: int = 120) -> tuple[int, int]:
    """(process_index, process_count). If the expected processes do not join in time: a clear exit, no hang."""
    import jax

    num = int(os.environ.get(ENV_NUM) or 1)
    coordinator = os.environ.get(ENV_COORDINATOR)
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    try:
        if num > 1 and coordinator:
            pid = int(os.environ.get(ENV_ID) or 0)
            if "cpu" in os.environ.get("JAX_PLATFORMS", ""):
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=num,
                process_id=pid,
                initialization_timeout=timeout_s,
            )
        elif "," in hosts:  # a multi-host TPU slice: JAX finds the coordinator itself
            jax.distributed.initialize(initialization_timeout=timeout_s)
    except Exception as e:
        print(
            f"multi-host: process {os.environ.get(ENV_ID, '?')} of {num} has not joined the coordinator "
            f"{coordinator or '(auto)'} within {timeout_s}s: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None
    return jax.process_index(), jax.process_count()
