"""The shipped presets' compiles are started by the root conftest (tests/fits.py); this is their fixture."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import fits


@pytest.fixture
def shipped_fits() -> dict[str, subprocess.CompletedProcess[str]]:
    """Every shipped preset's `trainer.fit` run, waited for."""
    return fits.results(Path(os.environ["TPUOPS_TESTS_SHIPPED_FITS"]), timeout=2600)
