"""A VM's autostop: the setting kept in its metadata (`tpuops-autostop`), what its watcher on worker 0 publishes
(the guest attribute `tpuops/autostop`), and the REST calls with which the VM stops or deletes itself (its backend's:
the Cloud TPU API for a node, Compute Engine for an instance or a MIG)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuops.cloud.create import AUTOSTOP_KEY as KEY  # the metadata: "<seconds>s stop|delete", or "off"
from tpuops.errors import UsageError

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.tpu_api import VmInfo

# The watcher's guest attribute: "idle SINCE ACTS_AT", "busy WHY", "acting ACTION" or "off".
NAMESPACE, ATTRIBUTE = "tpuops", "autostop"
ACTIONS = ("stop", "delete")
TPU_HOST = "https://tpu.googleapis.com"
COMPUTE_HOST = "https://compute.googleapis.com"


@dataclass(frozen=True)
class Autostop:
    """Stop (or delete) the VM once it has been idle `idle_s` seconds: no run lock held, no job alive."""

    idle_s: int
    action: str = "stop"

    @property
    def value(self) -> str:
        return f"{self.idle_s}s {self.action}"

    @property
    def words(self) -> str:
        return f"{self.action} after {_duration(self.idle_s)} idle"


def parse(duration: str, action: str = "stop") -> Autostop | None:
    """`--autostop DURATION|off` and `--autostop-action stop|delete` -> the setting (None: off); exit 2 on a bad one."""
    from tpuops.config import parse_duration

    chosen = action.strip().lower()
    if chosen not in ACTIONS:
        raise UsageError(f"--autostop-action must be stop or delete, received {action!r}")
    if duration.strip().lower() == "off":
        return None
    return Autostop(int(parse_duration("--autostop", duration)), chosen)


def of(vm: VmInfo) -> Autostop | None:
    """The VM's setting, from its metadata (None: off, or never set)."""
    words = vm.metadata.get(KEY, "").split()
    if len(words) != 2 or words[1] not in ACTIONS or not words[0].removesuffix("s").isdigit():
        return None
    return Autostop(int(words[0].removesuffix("s")), words[1])


def check(vm: VmInfo, setting: Autostop) -> None:
    """The VM can do to itself what the setting asks (exit 2 naming what it can do instead)."""
    calls(None, vm, setting.action)


def calls(api: Api | None, vm: VmInfo, action: str) -> list[tuple[str, str]]:
    """(method, URL) of each REST call that makes `vm` stop or go, in order: its backend's, against the endpoint
    tpuops talks to (the emulator's, else Google's)."""
    from tpuops.cloud.backends import backend_of

    endpoint = (api.endpoint if api else None) or ""
    tpu = endpoint.rstrip("/") or TPU_HOST
    compute = (endpoint.rstrip("/") or COMPUTE_HOST) + "/compute/v1"
    return backend_of(vm).autostop_calls(vm, action, tpu, compute)


def watch_config(api: Api, vm: VmInfo, setting: Autostop, poll_s: float) -> dict[str, object]:
    """What the watcher on worker 0 reads (sop/autostop_watch.py): the idle time, the action and its calls."""
    return {
        "vm": vm.name,
        "idle_s": setting.idle_s,
        "action": setting.action,
        "calls": [list(c) for c in calls(api, vm, setting.action)],
        "poll_s": poll_s,
    }


def status(published: str, now: float | None = None) -> str:
    """The watcher's guest attribute in words: when it acts, or why it waits."""
    words = published.split()
    if len(words) == 3 and words[0] == "idle":
        left = float(words[2]) - (now if now is not None else time.time())
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(words[2])))
        return f"idle: acts at {at} (in {_duration(max(0, int(left)))})"
    if words and words[0] == "busy":
        return f"busy ({' '.join(words[1:])}): the idle time starts when it ends"
    if words and words[0] in ("acting", "acted"):
        return " ".join(words)
    return "no watcher has reported (it starts with the next run, or `tpuops vm autostop NAME DURATION`)"


def state(api: Api, vm: VmInfo) -> dict[str, str] | None:
    """`vm describe`'s autostop: the setting and what its watcher last published (None: off)."""
    from tpuops.cloud.backends import backend_of
    from tpuops.errors import CloudError

    setting = of(vm)
    if setting is None:
        return None
    published = ""
    try:
        attrs = backend_of(vm).guest_attributes(api, vm)
        published = attrs[0].get(NAMESPACE, {}).get(ATTRIBUTE, "") if attrs else ""
    except CloudError:  # a stopped VM has no guest attributes to read: the setting alone is shown
        pass
    return {
        "setting": setting.value,
        "words": setting.words,
        "published": published,
        "status": status(published),
    }


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
