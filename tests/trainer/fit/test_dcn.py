"""trainer.fit.dcn on a hand-written program of 4 partitions in 2 slices: what crosses slices and what does not."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from trainer.fit import dcn

HLO = """
ENTRY %main (p: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %t = token[] after-all()
  %send = (f32[256]{0}, u32[], token[]) send(%p,%t), frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %inside = f32[256]{0} collective-permute(%p), channel_id=2, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %across = f32[64]{0} collective-permute(%p), channel_id=3, source_target_pairs={{0,0},{1,3},{3,1}}
  %spans = f32[8]{0} all-reduce(%p), channel_id=4, replica_groups={{0,2},{1,3}}, to_apply=%add
  ROOT %within = f32[256]{0} all-reduce(%p), channel_id=5, replica_groups={{0,1},{2,3}}, to_apply=%add
}
"""


def test_megascale_sends_and_collectives_between_slices_are_dcn_traffic() -> None:
    mesh = SimpleNamespace(devices=np.array([SimpleNamespace(slice_index=s) for s in (0, 0, 1, 1)]))
    ops = {op.name: (op.kind, op.bytes) for op in dcn.dcn_ops(HLO, mesh)}
    # A permute inside each slice stays on ICI although its pairs cover every partition; one pair across is DCN.
    assert ops == {
        "send": ("megascale-send", 1024),
        "across": ("collective-permute", 256),
        "spans": ("all-reduce", 32),  # 2 x 32 bytes x (2 - 1) / 2
    }
    assert dcn.dcn_bytes(HLO, mesh) == 1024 + 256 + 32
    assert dcn.dcn_bytes(HLO) == 1024  # without the mesh: the megascale sends only
