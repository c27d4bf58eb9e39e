"""OS Login: import the public key into the caller's login profile and take its POSIX username."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tpuops.cloud.client import gcloud_config_value, short_error
from tpuops.errors import CloudError, PermissionDeniedError, UsageError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud.oslogin_v1 import OsLoginServiceClient

EMULATOR_ACCOUNT = "tpuops-user@example.com"  # the emulator's caller when no account is configured
ROLE_HINT = (
    "needs roles/compute.osLogin (roles/compute.osAdminLogin for sudo) on project {project}; "
    "users from outside the organisation also need roles/compute.osLoginExternalUser"
)


def account(endpoint: str | None, credentials: Credentials | None = None) -> str:
    """Whose profile: gcloud's `core/account` (as gcloud uses), else the service account of the credentials,
    else the email the access token belongs to."""
    found = gcloud_config_value("core", "account")
    if found:
        return found
    if endpoint:
        return EMULATOR_ACCOUNT
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return email
    token_email = _token_email(credentials)
    if token_email:
        return token_email
    raise UsageError(
        "OS Login needs your Google account and none is configured",
        hint="run `gcloud config set account YOU@EXAMPLE.COM` (or `gcloud auth login`)",
    )


def _token_email(credentials: Credentials | None) -> str | None:
    import google.auth.transport.requests
    import requests

    if credentials is None:
        return None
    try:
        credentials.refresh(google.auth.transport.requests.Request())
        resp = requests.get(
            "https://oauth2.googleapis.com/tokeninfo", params={"access_token": credentials.token}, timeout=10
        )
        email = resp.json().get("email") if resp.ok else None
        return email if isinstance(email, str) else None
    except Exception:
        return None


def client(endpoint: str | None) -> tuple[OsLoginServiceClient, Credentials]:
    """(OsLoginServiceClient over REST, its credentials): anonymous against an emulator endpoint."""
    from google.cloud import oslogin_v1

    from tpuops.cloud.answers import guard
    from tpuops.cloud.client import client_kwargs

    kw = client_kwargs(endpoint)
    return guard(oslogin_v1.OsLoginServiceClient(**kw)), kw["credentials"]


def import_key(
    project: str, endpoint: str | None, public: str, ttl_s: float | None, requested_user: str | None = None
) -> tuple[str, str]:
    """ImportSshPublicKey into `users/ACCOUNT` for `project`; returns (POSIX username, account).

    The username is chosen as gcloud does: the requested one when the profile has it, else the primary
    POSIX account, else the first."""
    from google.api_core import exceptions as gexc

    svc, creds = client(endpoint)
    who = account(endpoint, creds)
    key: dict[str, str | int] = {"key": public}
    if ttl_s:
        key["expiration_time_usec"] = int((time.time() + ttl_s) * 1e6)
    try:
        resp = svc.import_ssh_public_key(
            request={"parent": f"users/{who}", "ssh_public_key": key, "project_id": project}, timeout=30
        )
    except (gexc.PermissionDenied, gexc.Forbidden, gexc.Unauthenticated) as e:
        raise PermissionDeniedError(
            f"OS Login refused to import your SSH key for {who}: {short_error(e)}",
            hint=ROLE_HINT.format(project=project),
        ) from None
    except gexc.GoogleAPICallError as e:
        raise CloudError(f"OS Login import of your SSH key for {who}: {short_error(e)}") from None
    except Exception as e:  # a web page, cut JSON, no answer in time: one line (answers.failure)
        from tpuops.cloud.answers import call_limits, failure

        raise failure("OS Login", f"import of your SSH key for {who}", e, "oslogin.googleapis.com",
                      call_limits()) from None  # fmt: skip
    accounts = list(resp.login_profile.posix_accounts)
    if not accounts:
        raise CloudError(
            f"OS Login profile of {who} has no POSIX account for project {project}",
            hint=ROLE_HINT.format(project=project),
        )
    names = [a.username for a in accounts]
    if requested_user is not None and requested_user in names:
        return requested_user, who
    primary = next((a.username for a in accounts if a.primary), names[0])
    return primary, who
