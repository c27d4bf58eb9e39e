"""Authorising the SSH key on a VM as gcloud does: OS Login when `enable-oslogin` says so (the instance's
metadata over the project's), else the node's `ssh-keys` metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuops.cloud.backends import backend_of
from tpuops.cloud.client import Api, Notify
from tpuops.cloud.keys import Identity, default_user
from tpuops.cloud.tpu_api import VmInfo
from tpuops.cloud.vm_state import update_metadata
from tpuops.console import Routine  # confirmations that change nothing: shown only with -v
from tpuops.errors import ConnectError, PermissionDeniedError

if TYPE_CHECKING:
    import requests

SSH_KEYS = "ssh-keys"


@dataclass(frozen=True)
class Authorized:
    via: str  # "oslogin" or "metadata"
    user: str  # the login name
    pushed: bool  # the key was added just now (the guest agent may need a few seconds to apply it)
    pending: bool = False  # a dry run: the key would have to be added first (nothing was changed)


def project_metadata(api: Api, notify: Notify) -> dict[str, str]:
    """The project's common instance metadata (Compute API `projects.get`); {} with a note when unreadable."""
    url = f"{api.endpoint or 'https://compute.googleapis.com'}/compute/v1/projects/{api.project}"
    try:
        resp = authorized_http(api).get(url, timeout=30)
    except Exception as e:  # the network: decide from the VM's own metadata, as below
        notify(f"project metadata unreadable ({type(e).__name__}); deciding from the VM's metadata alone")
        return {}
    if resp.status_code == 403:
        notify(
            "project metadata unreadable (403: needs compute.projects.get, e.g. roles/compute.viewer); "
            "deciding from the VM's metadata alone"
        )
        return {}
    if not resp.ok:
        notify(f"project metadata unreadable ({resp.status_code}); deciding from the VM's metadata alone")
        return {}
    items = resp.json().get("commonInstanceMetadata", {}).get("items", [])
    return {it["key"]: it.get("value", "") for it in items}


def authorized_http(api: Api) -> requests.Session:
    """A requests session for the one Compute API read tpuops makes by hand (anonymous for an emulator)."""
    if api.endpoint:
        import requests

        return requests.Session()
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(creds)


def oslogin_enabled(project_md: dict[str, str], node_md: dict[str, str]) -> bool:
    """gcloud's rule: the instance's `enable-oslogin` when it has one, else the project's."""
    value = node_md.get("enable-oslogin", project_md.get("enable-oslogin", ""))
    return value.strip().upper() == "TRUE"


def has_key(ssh_keys: str, user: str, identity: Identity) -> bool:
    """Is `user:KEYTYPE BLOB ...` one of the lines (comments and expiry fields may differ)?"""
    for line in ssh_keys.splitlines():
        who, sep, key = line.strip().partition(":")
        if sep and who == user and " ".join(key.split()[:2]) == identity.blob:
            return True
    return False


def authorize(
    api: Api,
    vm: VmInfo,
    identity: Identity,
    *,
    user: str | None,
    key_push: bool,
    key_ttl: float | None,
    notify: Notify,
    dry_run: bool = False,
) -> Authorized:
    """Make the VM accept `identity`; says in one line which way was used. `dry_run`: only read (the VM's and
    the project's metadata), change nothing: say what would be added (`pending`) and add nothing."""
    project_md = project_metadata(api, notify)
    if oslogin_enabled(project_md, vm.metadata):
        return _by_oslogin(api, vm, identity, user=user, key_ttl=key_ttl, notify=notify, dry_run=dry_run)
    return _by_metadata(api, vm, identity, project_md, user=user or default_user(), key_push=key_push,
                        notify=notify, dry_run=dry_run)  # fmt: skip


def _by_oslogin(
    api: Api, vm: VmInfo, identity: Identity, *, user: str | None, key_ttl: float | None, notify: Notify,
    dry_run: bool,
) -> Authorized:  # fmt: skip
    """The key imported into the caller's OS Login profile; the login name is the profile's POSIX user."""
    from tpuops.cloud.oslogin import import_key

    if dry_run:
        notify(
            f"{vm.name}: OS Login (enable-oslogin=TRUE): would import {identity.path.name} into your OS Login "
            "profile (a dry run changes nothing)"
        )
        return Authorized("oslogin", user or default_user(), pushed=False, pending=True)
    posix, who = import_key(api.project, api.endpoint, identity.public, key_ttl, user)
    if user and user != posix:
        notify(f"OS Login: using the POSIX user {posix} instead of --user {user}")
    notify(
        f"{vm.name}: OS Login (enable-oslogin=TRUE): imported {identity.path.name} into {who}'s "
        f"profile; logging in as {posix}"
    )
    return Authorized("oslogin", posix, pushed=False)


def _by_metadata(
    api: Api, vm: VmInfo, identity: Identity, project_md: dict[str, str], *, user: str, key_push: bool,
    notify: Notify, dry_run: bool,
) -> Authorized:  # fmt: skip
    """The key in the project's or the VM's `ssh-keys` metadata already, else added to the VM's."""
    if has_key(project_md.get(SSH_KEYS, ""), user, identity):
        notify(
            Routine(f"{vm.name}: metadata keys: {user}'s key is in the project's ssh-keys; nothing to add")
        )
        return Authorized("metadata", user, pushed=False)
    existing = vm.metadata.get(SSH_KEYS, "")
    if has_key(existing, user, identity):
        notify(Routine(f"{vm.name}: metadata keys: {user}'s key is in the VM's ssh-keys; nothing to add"))
        return Authorized("metadata", user, pushed=False)
    if not key_push:
        raise ConnectError(
            f"{vm.name}: {user}'s key {identity.path} is not in the VM's ssh-keys metadata and --no-key-push "
            "forbids adding it",
            hint=f"drop --no-key-push, or add '{user}:{identity.blob}' to the VM's or the project's ssh-keys",
        )
    entry = f"{user}:{identity.blob} {user}"  # gcloud's form: the user again as the comment
    kept = [ln for ln in existing.splitlines() if ln.strip()]
    if dry_run:
        notify(
            f"{vm.name}: metadata keys: would add your key to the VM's ssh-keys metadata ({user}'s "
            f"{identity.path.name}; a dry run changes nothing)"
        )
        return Authorized("metadata", user, pushed=False, pending=True)
    try:
        update_metadata(api, vm, {SSH_KEYS: "\n".join([*kept, entry])})
    except PermissionDeniedError as e:
        raise PermissionDeniedError(
            f"{vm.name}: adding your key to the VM's ssh-keys metadata was refused: {e.message}",
            hint=f"needs {backend_of(vm).admin_role} on the "
            "project (or ask an admin to add the key, then use --no-key-push)",
        ) from None
    notify(
        f"{vm.name}: metadata keys: added {user}'s key {identity.path.name} to the VM's ssh-keys "
        f"({len(kept)} existing entr{'y' if len(kept) == 1 else 'ies'} kept)"
    )
    return Authorized("metadata", user, pushed=True)
