"""gs:// checkpoints against a local GCS-compatible server: orbax arrays and metadata saved and restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from tests.gcs import BUCKET, gcs_server
from trainer import checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    with gcs_server() as url:
        yield url


def test_orbax_state_saved_to_gs_and_restored_by_a_new_manager(
    gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)
    for var in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        monkeypatch.delenv(var, raising=False)  # what the trainer derives from STORAGE_EMULATOR_HOST
    rng = np.random.default_rng(0)
    state = {"params": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}, "opt_state": jnp.arange(5)}
    directory = f"gs://{BUCKET}/run-{os.getpid()}"
    checkpoint.save(checkpoint.manager(directory), 5, state, {"position": 40})
    # The arrays and metadata are objects on the server (nothing was written to a local folder).
    names = _objects(gcs, f"run-{os.getpid()}/5/")
    assert any("/state/" in n for n in names) and any("/meta/" in n for n in names), names
    like = {"params": {"w": jnp.zeros((3, 4), jnp.float32)}, "opt_state": jnp.zeros(5, jnp.int32)}
    got = checkpoint.restore_latest(checkpoint.manager(directory), like)
    assert got is not None
    step, restored, meta = got
    assert (step, meta) == (5, {"position": 40})
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    np.testing.assert_array_equal(restored["opt_state"], state["opt_state"])


def _objects(url: str, prefix: str) -> list[str]:
    """Object names under `prefix`, asked of the server's JSON API directly."""
    query = urllib.parse.urlencode({"prefix": prefix})
    with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}", timeout=30) as r:
        return [item["name"] for item in json.load(r).get("items", [])]


def test_no_credentials_is_one_line_naming_them_before_anything_loads(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST")
    }
    # No gcloud login, and the metadata server (a VM's credentials) answers nowhere.
    env.update(
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        GCE_METADATA_HOST="127.0.0.1:9",
        GCE_METADATA_IP="127.0.0.1:9",
    )
    r = subprocess.run(
        [sys.executable, "-m", "trainer.main", "--config", "tiny", "--set", "checkpoint.dir=gs://b/run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("checkpoint: checkpoint.dir gs://b/run: no Google Cloud credentials found"), line
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line
