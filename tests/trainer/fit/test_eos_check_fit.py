"""trainer.fit's count of the decode positions with the end-of-sequence test every k positions
(`rollout.eos_check_every`): a TPU compile on this CPU machine (libtpu, no TPU), its loops read as libtpu
prints them (no known trip counts: the counter pattern of each loop, trainer.fit.hlo)."""

from __future__ import annotations

import pytest

from trainer import config
from trainer.fit import tpus
from trainer.fit.__main__ import _quiet_libtpu, run


@pytest.mark.slow
def test_fit_counts_the_same_decode_positions_whatever_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """11 fed positions: k = 3 is 3 trips of 3 and one of 2 (a block loop and its remainder); fit counts the
    matmul FLOPs of 11 positions either way (the loop of k positions inside each trip times its k), and the same
    HBM bytes but for the selects of a position run after every row is done and the slot it clears."""
    for k in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES",
              "TF_CPP_MIN_LOG_LEVEL"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    _quiet_libtpu("v6e-8")
    decode = {}
    for every in (1, 3):
        cfg = config.load("tiny", ["rollout.max_new_tokens=12", f"rollout.eos_check_every={every}"])
        result = run(
            cfg, tpus.from_accelerator("v6e-8"), [], fix=False, only=("prefill", "decode"), host=False
        )
        decode[every] = result["phases"]["decode"]
    assert decode[1]["flops"] > 0
    assert decode[3]["flops"] == decode[1]["flops"]
    assert decode[3]["hbm_bytes"] == pytest.approx(decode[1]["hbm_bytes"], rel=1e-3)
