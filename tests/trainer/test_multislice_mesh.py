"""Multislice mesh: the slices are the outermost mesh axis `dcn` (dp, fsdp and tp stay inside one slice), only the
batch maps to it, and on a compiled TPU multislice topology the trainer's update sends its gradients over DCN
once per update, not once per micro-batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

from trainer import sharding

REPO = Path(__file__).resolve().parents[2]


def test_on_cpu_slice_s_is_dcn_row_s_of_its_processes_devices() -> None:
    devices = jax.devices()[:8]
    mesh = sharding.make_mesh(1, 2, 2, devices, num_slices=2)
    assert mesh.shape == {"dcn": 2, "dp": 1, "fsdp": 2, "tp": 2}
    assert list(mesh.devices[0].reshape(-1)) == devices[:4]  # slice 0: the first half of the devices
    assert list(mesh.devices[1].reshape(-1)) == devices[4:]
    assert sharding.batch_devices(mesh) == 4
    with pytest.raises(ValueError, match=r"device count 8, received 2 slices x 2x2x2"):
        sharding.make_mesh(2, 2, 2, devices, num_slices=2)


def test_only_the_batch_may_cross_slices() -> None:
    assert (
        sharding.DCN_AXIS == "dcn" and sharding.AXES[0] == sharding.DCN_AXIS
    )  # outermost: one row per slice
    on_dcn = [name for name, axes in sharding.LOGICAL.items() if sharding.DCN_AXIS in sharding._names(axes)]
    # The batch's rows, under each of their names (the decode's residual stream, its logits' rows).
    assert on_dcn == ["batch", "group_rows", "residual", "slice_rows"]
    for pattern, spec in sharding.PARAM_RULES:  # every slice holds whole parameters
        for axes in spec:
            assert sharding.DCN_AXIS not in ((axes,) if isinstance(axes, str) else (axes or ())), pattern


def test_the_decode_mesh_keeps_each_slice_in_its_own_dcn_row() -> None:
    devices = jax.devices()[:8]
    mesh = sharding.make_mesh(1, 4, 1, devices, num_slices=2)
    rmesh = sharding.rollout_mesh(mesh, 2)
    assert rmesh.shape == {"dcn": 2, "dp": 2, "fsdp": 1, "tp": 2}
    assert sorted(rmesh.devices[1].reshape(-1), key=lambda d: d.id) == devices[4:]
    assert sharding.kv_cache_sharding(rmesh, (2, 8, 16, 2, 16)).spec == P(
        None, ("dcn", "dp", "fsdp"), None, "tp", None
    )
    with pytest.raises(ValueError, match=r"rollout\.tp must divide a slice's device count 4, received 8"):
        sharding.rollout_mesh(mesh, 8)


_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1")
    import jax
    from jax.experimental import topologies
    from trainer import config
    from trainer.fit import dcn, programs
    from trainer.kernels.logprob.blocks import compile_target

    devices = list(topologies.get_topology_desc(platform="tpu", topology_name="tpu7x:2x2x1", num_slices=2).devices)
    cfg = config.load("tiny", ["train.micro_batch=16", "train.prompts_per_step=8"])  # 32 sequences: 2 micro-batches
    devices = devices[::-1]  # any device order: grouped by slice_index
    mesh = programs.training_mesh(cfg, devices)
    rows = [sorted({d.slice_index for d in r.reshape(-1)}) for r in mesh.devices]
    with compile_target(f"tpu {devices[0].device_kind}"):
        (update,), facts = programs.step_programs(cfg, devices, ("update",))
        text = update.lowered.compile().as_text()
    ops = dcn.dcn_ops(text, mesh)
    print(json.dumps({"rows": rows, "mesh": dict(mesh.shape), "accumulation": facts["accumulation"],
                      "kinds": sorted({o.kind for o in ops}), "dcn": dcn.dcn_bytes(text, mesh),
                      "params_bytes_per_device": facts["params_bytes"]}))
    """
)


@pytest.mark.slow
def test_on_a_tpu_multislice_topology_the_update_reduces_gradients_over_dcn_once() -> None:
    """Compile-only TPU devices (libtpu's topology, 2 slices of tpu7x:2x2x1): create_hybrid_device_mesh puts
    each slice in its own dcn row; the trainer's update (2 micro-batches) sends the gradients over DCN once:
    about their bytes per device (reduced inside every micro-batch it was 4x: docs/performance.md)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rows"] == [[0], [1]] and out["mesh"] == {"dcn": 2, "dp": 1, "fsdp": 8, "tp": 1}
    assert out["accumulation"] == 2
    assert out["kinds"] == ["megascale-send"]  # libtpu's cross-slice reduction (see trainer/fit/dcn.py)
    grads = out["params_bytes_per_device"]  # float32 gradients, split like the parameters
    assert grads <= out["dcn"] <= 1.1 * grads  # + the step's few statistics (losses, token counts)
