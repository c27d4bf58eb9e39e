"""The accelerator table and the HLO collective reader (pure functions: no compile)."""

from __future__ import annotations

import pytest

from trainer.fit import hlo, tpus


@pytest.mark.parametrize(
    ("accelerator", "topology", "chips"),
    [("v6e-8", "v6e:2x4", 8), ("v6e-16", "v6e:4x4", 16), ("v4-8", "v4:2x2x1", 4), ("v5litepod-8", "v5e:2x4", 8),
     ("v5p-8", "v5p:2x2x1", 4), ("v5e-1", "v5e:1x1", 1)],
)  # fmt: skip
def test_accelerator_maps_to_topology(accelerator: str, topology: str, chips: int) -> None:
    t = tpus.from_accelerator(accelerator)
    assert (t.topology, t.chips) == (topology, chips)
    assert tpus.from_topology(topology).chips == chips


def test_per_device_figures_split_a_chip_between_its_devices() -> None:
    v4 = tpus.from_accelerator("v4-8")  # JAX shows 8 TensorCores for 4 chips
    assert v4.per_device(8)["hbm_bytes"] == 16 * tpus.GIB
    v6e = tpus.from_accelerator("v6e-8")
    assert v6e.per_device(8) == {
        "hbm_bytes": 32 * tpus.GIB,
        "flops": 918e12,
        "hbm_bw": 1638e9,
        "ici_bw": 400e9,
    }


@pytest.mark.parametrize("bad", ["v6e", "v9-8", "v6e-3", "tpu"])
def test_unknown_accelerator_names_the_known_forms(bad: str) -> None:
    with pytest.raises(tpus.UnknownAcceleratorError, match="v6e"):
        tpus.from_accelerator(bad)


HLO = """
  %all-gather.1 = bf16[1024,2048]{1,0} all-gather(bf16[128,2048]{1,0} %p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %rs = f32[256,64]{1,0} reduce-scatter(f32[2048,64]{1,0} %g), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ar = f32[] all-reduce(f32[] %x), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ags = (bf16[16,8]{1,0}, bf16[64,8]{1,0}) all-gather-start(bf16[16,8]{1,0} %q), replica_groups=[2,4]<=[8], dimensions={0}
  %add.7 = f32[8]{0} add(f32[8]{0} %a, f32[8]{0} %b)
"""


def test_collectives_read_result_bytes_group_sizes_and_async_starts() -> None:
    got = hlo.collectives(HLO, devices=8)
    assert got["all-gather"] == 1024 * 2048 * 2 + 64 * 8 * 2  # the async start's result, not its operand
    assert got["reduce-scatter"] == 256 * 64 * 4
    assert got["all-reduce"] == 4
    moved = 1024 * 2048 * 2 * 7 / 8 + 256 * 64 * 4 * 7 + 2 * 4 * 1 / 2 + 64 * 8 * 2 * 3 / 4
    assert got["moved"] == int(moved)
