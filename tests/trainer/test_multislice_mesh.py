"""Multislice mesh: the slices are dp's outermost factor (fsdp and tp stay inside one slice); on a compiled TPU
multislice topology the only traffic that crosses slices is the gradients' reduction, no bigger than them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from trainer import sharding

REPO = Path(__file__).resolve().parents[2]


def test_on_cpu_slice_s_holds_dp_rows_of_its_processes_devices() -> None:
    devices = jax.devices()[:8]
    mesh = sharding.make_mesh(2, 2, 2, devices, num_slices=2)
    assert mesh.shape == {"dp": 2, "fsdp": 2, "tp": 2}
    assert list(mesh.devices[0].reshape(-1)) == devices[:4]  # slice 0: the first half of the devices
    assert list(mesh.devices[1].reshape(-1)) == devices[4:]


def test_only_dp_may_cross_slices() -> None:
    with pytest.raises(ValueError, match=r"mesh dp must be a multiple of the 2 slices .*received dp=1"):
        sharding.make_mesh(1, 8, 1, jax.devices()[:8], num_slices=2)
    assert sharding.DCN_AXIS == "dp" and sharding.DCN_AXIS not in sharding.LOGICAL.values()


_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1")
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P
    from trainer import sharding
    from trainer.fit import dcn

    devices = list(topologies.get_topology_desc(platform="tpu", topology_name="tpu7x:2x2x1", num_slices=2).devices)
    mesh = sharding.make_mesh(2, 8, 1, devices[::-1], num_slices=2)  # any device order: grouped by slice_index
    rows = [sorted({d.slice_index for d in r.reshape(-1)}) for r in mesh.devices]
    # A data-parallel step: weights split over fsdp (inside a slice), batch over (dp, fsdp); grads as weights.
    D, F, B = 256, 512, 64
    w_spec = {"a": NamedSharding(mesh, P("fsdp", None)), "b": NamedSharding(mesh, P(None, "fsdp"))}
    x_spec = NamedSharding(mesh, P(sharding.BATCH, None))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w["a"]) @ w["b"])

    step = jax.jit(jax.grad(loss), in_shardings=(w_spec, x_spec), out_shardings=w_spec)
    w = {"a": jax.ShapeDtypeStruct((D, F), jnp.float32, sharding=w_spec["a"]),
         "b": jax.ShapeDtypeStruct((F, D), jnp.float32, sharding=w_spec["b"])}
    x = jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=x_spec)
    text = step.lower(w, x).compile().as_text()
    ops = dcn.dcn_ops(text, mesh)
    grad_bytes = sum(int(np.prod(s.sharding.shard_shape(s.shape))) * 4 for s in w.values())
    print(json.dumps({"rows": rows, "kinds": sorted({o.kind for o in ops}), "dcn": dcn.dcn_bytes(text, mesh),
                      "grad_bytes_per_device": grad_bytes}))
    """
)


@pytest.mark.slow
def test_on_a_tpu_multislice_topology_only_the_gradients_cross_dcn() -> None:
    """Compile-only TPU devices (libtpu's topology, 2 slices of tpu7x:2x2x1): create_hybrid_device_mesh puts
    each slice in its own dp row; what the step sends over DCN is the gradients' reduction, at most their bytes."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rows"] == [[0], [1]]
    assert out["kinds"] == ["megascale-send"]  # libtpu's cross-slice reduction (see trainer/fit/dcn.py)
    assert 0 < out["dcn"] <= out["grad_bytes_per_device"]
