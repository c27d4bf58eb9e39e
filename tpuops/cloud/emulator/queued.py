"""Emulated queued resources: ACCEPTED -> PROVISIONING -> ACTIVE (or WAITING_FOR_RESOURCES: no capacity); a
multislice (nodeSpec.multisliceParams) provisions nodes PREFIX-0..PREFIX-(n-1), each with its own sshd workers."""

from __future__ import annotations

import time
from typing import Any

from tpuops.cloud.emulator.model import Model
from tpuops.cloud.emulator.records import ApiError, _now

_QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"


def get(model: Model, name: str) -> dict[str, Any]:
    with model.lock:
        qr = model.qrs.get(name)
        if qr is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return dict(qr)


def list_(model: Model, parent: str) -> dict[str, Any]:
    with model.lock:
        return {
            "queuedResources": [dict(q) for n, q in sorted(model.qrs.items()) if n.startswith(parent + "/")]
        }


def create(model: Model, parent: str, qr_id: str, body: dict[str, Any]) -> dict[str, Any]:
    name = f"{parent}/queuedResources/{qr_id}"
    specs = body.get("tpu", {}).get("nodeSpec", [])
    if len(specs) != 1:
        raise ApiError(400, "INVALID_ARGUMENT", "the emulator supports exactly one tpu.nodeSpec")
    with model.lock:
        if name in model.qrs:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        qr = {**body, "name": name, "createTime": _now(), "state": {"state": "ACCEPTED"}}
        model.qrs[name] = qr
        op = model._op(parent, "create", name)
        waiting = model._take_capacity_fault(parent.rsplit("/", 1)[1])
    model._finish(op, {"@type": _QR_TYPE, **qr})
    if waiting:
        with model.lock:
            qr["state"] = {"state": "WAITING_FOR_RESOURCES"}
        return op
    model._spawn(_provision, model, qr, specs[0])
    return op


def _node_ids(qr_id: str, spec: dict[str, Any]) -> list[str]:
    """The node ids a nodeSpec makes: its nodeId, or PREFIX-0..PREFIX-(n-1) (prefix default: the QR's id)."""
    multi = spec.get("multisliceParams")
    if multi:
        count = int(multi.get("nodeCount", 0))
        if count < 2:
            raise ApiError(400, "INVALID_ARGUMENT", f"multisliceParams.nodeCount must be > 1, got {count}")
        return [f"{multi.get('nodeIdPrefix') or qr_id}-{i}" for i in range(count)]
    return [spec["nodeId"]]


def _provision(model: Model, qr: dict[str, Any], spec: dict[str, Any]) -> None:
    with model.lock:
        qr["state"] = {"state": "PROVISIONING"}
    node = dict(spec.get("node", {}))
    if "spot" in qr:
        node["schedulingConfig"] = {**node.get("schedulingConfig", {}), "spot": True}
    multi = "multisliceParams" in spec
    ops = []
    try:
        for node_id in _node_ids(qr["name"].rsplit("/", 1)[1], spec):
            body = {**node, "multisliceNode": True} if multi else node
            ops.append(model.create_node(spec.get("parent", ""), node_id, body, queued_resource=qr["name"]))
    except ApiError as e:
        with model.lock:
            qr["state"] = {"state": "FAILED", "failedData": {"error": {"code": 3, "message": e.message}}}
        return
    while not all(op["done"] for op in ops):
        time.sleep(0.01)
    with model.lock:
        qr["state"] = {"state": "FAILED"} if any("error" in op for op in ops) else {"state": "ACTIVE"}


def delete(model: Model, name: str, force: bool) -> dict[str, Any]:
    qr = get(model, name)
    nodes = _nodes_of(qr)
    with model.lock:
        if any(node in model.nodes for node in nodes) and not force:
            raise ApiError(
                400, "FAILED_PRECONDITION", f"queued resource {name} has a node; delete with force=true"
            )
        model.qrs[name]["state"] = {"state": "DELETING"}
        op = model._op(name.rsplit("/queuedResources/", 1)[0], "delete", name)
    model._spawn(_delete, model, name, nodes, op)
    return op


def _delete(model: Model, name: str, nodes: list[str], op: dict[str, Any]) -> None:
    for node in nodes:
        rec = model.nodes.get(node)
        if rec is not None:
            model._teardown(rec, None)
    with model.lock:
        model.qrs.pop(name, None)
    model._finish(op)


def _nodes_of(qr: dict[str, Any]) -> list[str]:
    spec = qr.get("tpu", {}).get("nodeSpec", [{}])[0]
    qr_id = qr["name"].rsplit("/", 1)[1]
    return [f"{spec.get('parent', '')}/nodes/{n}" for n in _node_ids(qr_id, {"nodeId": "", **spec})]
