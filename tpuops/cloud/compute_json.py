"""The Compute Engine REST API's JSON as tpuops reads it: the fields of instances, MIGs, managed instances,
guest attributes and list pages that the code looks at (cloud.google.com/compute/docs/reference/rest/v1;
the JSON names are the proto json_names, 64-bit ints such as `id` come as strings). Every field may be
missing from an answer except where `Required` says otherwise."""

from __future__ import annotations

from typing import Required, TypedDict


class MetadataItem(TypedDict, total=False):
    key: Required[str]
    value: str


class Metadata(TypedDict, total=False):
    fingerprint: str
    items: list[MetadataItem]


class AccessConfig(TypedDict, total=False):
    type: str
    name: str
    natIP: str


class NetworkInterface(TypedDict, total=False):
    network: str
    networkIP: str
    accessConfigs: list[AccessConfig]


class Scheduling(TypedDict, total=False):
    provisioningModel: str  # SPOT | STANDARD | FLEX_START | RESERVATION_BOUND
    preemptible: bool
    instanceTerminationAction: str
    onHostMaintenance: str
    automaticRestart: bool


class Instance(TypedDict, total=False):
    name: Required[str]
    id: str
    status: str  # PROVISIONING, STAGING, RUNNING, STOPPING, TERMINATED, ...
    machineType: str  # a URL ending in the machine type's name
    creationTimestamp: str
    networkInterfaces: list[NetworkInterface]
    scheduling: Scheduling
    metadata: Metadata


class Mig(TypedDict, total=False):
    """An instance group manager."""

    name: Required[str]
    baseInstanceName: str
    targetSize: int
    instanceTemplate: str


class ManagedInstance(TypedDict, total=False):
    instance: str  # the instance's URL
    name: str
    id: str
    instanceStatus: str  # empty while the VM does not exist
    currentAction: str  # NONE, CREATING, RECREATING, DELETING, ...


class ManagedInstances(TypedDict, total=False):
    """instanceGroupManagers.listManagedInstances."""

    managedInstances: list[ManagedInstance]


class GuestAttribute(TypedDict, total=False):
    namespace: str
    key: str
    value: str


class GuestAttributeValue(TypedDict, total=False):
    items: list[GuestAttribute]


class GuestAttributes(TypedDict, total=False):
    """instances.getGuestAttributes."""

    queryPath: str
    queryValue: GuestAttributeValue


class ScopedList(TypedDict, total=False):
    """One zone's part of an aggregatedList (`warning` only when the zone has none)."""

    instances: list[Instance]
    instanceGroupManagers: list[Mig]


class InstancePage(TypedDict, total=False):
    """One page of instances.list."""

    items: list[Instance]
    nextPageToken: str


class AggregatedPage(TypedDict, total=False):
    """One page of an aggregatedList: zone ("zones/Z") -> that zone's resources."""

    items: dict[str, ScopedList]
    nextPageToken: str
