"""Project and credentials resolution: flag/config, environment, gcloud's own config file, ADC errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tpuops.cloud.client import EMULATOR_PROJECT, connect, resolve_project
from tpuops.errors import CloudError, UsageError


@pytest.fixture
def gcloud_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "gcloud"
    (root / "configurations").mkdir(parents=True)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(root))
    return root


def test_precedence_flag_then_environment_then_gcloud_file(
    gcloud_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (gcloud_dir / "active_config").write_text("work\n")
    (gcloud_dir / "configurations" / "config_work").write_text(
        "[core]\naccount = a@b.c\nproject = from-gcloud\n"
    )
    (gcloud_dir / "configurations" / "config_default").write_text("[core]\nproject = not-active\n")
    assert resolve_project(None, None) == ("from-gcloud", "gcloud config")
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "from-cloudsdk")
    assert resolve_project(None, None) == ("from-cloudsdk", "CLOUDSDK_CORE_PROJECT")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    assert resolve_project(None, None) == ("from-env", "GOOGLE_CLOUD_PROJECT")
    assert resolve_project("from-flag", None)[0] == "from-flag"


def test_default_configuration_without_active_config(gcloud_dir: Path) -> None:
    (gcloud_dir / "configurations" / "config_default").write_text("[core]\nproject = dflt-project\n")
    assert resolve_project(None, None) == ("dflt-project", "gcloud config")


def test_no_project_anywhere(gcloud_dir: Path) -> None:
    with pytest.raises(UsageError, match="no Google Cloud project") as e:
        resolve_project(None, None)
    assert "--project" in (e.value.hint or "")
    assert resolve_project(None, "http://127.0.0.1:1") == (EMULATOR_PROJECT, "emulator default")


def test_missing_credentials_say_how_to_log_in(gcloud_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(gcloud_dir / "missing.json"))
    with pytest.raises(CloudError, match="no Google credentials") as e:
        connect("p", None)
    assert "application-default login" in (e.value.hint or "")


def test_unreachable_endpoint_is_retried_then_reported(gcloud_dir: Path) -> None:
    notes: list[str] = []
    api = connect(None, "http://127.0.0.1:9", notes.append)  # port 9 (discard): nothing listens
    api.backoff_s = 0.01
    said = "list zones: still failing after 5 retries: the connection to 127.0.0.1:9 failed or was cut"
    with pytest.raises(CloudError, match=re.escape(f"{said}: ConnectionError")) as e:
        api.zones()
    assert "http://127.0.0.1:9 is unavailable" in (e.value.hint or "")
    assert len(notes) == 5
