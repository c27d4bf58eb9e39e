"""The emulator's HTTP side: the TPU v2 and Compute Engine REST routes tpuops uses, plus /admin/* faults."""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tpuops.cloud.emulator import answers, catalog, compute, compute_routes, metadata, queued
from tpuops.cloud.emulator.model import Model
from tpuops.cloud.emulator.records import ApiError, ApiRequest
from tpuops.cloud.zones import EMULATOR_ZONES

DEFAULT_ZONES = EMULATOR_ZONES
_LOC = r"/v2/projects/(?P<p>[^/]+)/locations"
_ZONE = _LOC + r"/(?P<z>[^/:]+)"
_STATUS = {503: "UNAVAILABLE", 429: "RESOURCE_EXHAUSTED", 403: "PERMISSION_DENIED"}


def _route(m: Model, method: str, path: str, q: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """One API call -> the JSON answer (raises ApiError)."""
    if not path.startswith("/v2/"):
        return _other_apis(m, method, unquote(path), q, body)
    if method == "GET" and (r := re.fullmatch(_LOC, path)):
        return {"locations": [{"name": f"projects/{r['p']}/locations/{z}", "locationId": z} for z in m.zones]}
    if not (r := re.match(_ZONE, path)):
        raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")
    parent, rest = m.check_zone(r["p"], r["z"]), path[r.end() :]
    name = parent + rest
    if rest == "" and method == "GET":
        return {"name": parent, "locationId": r["z"]}
    if rest == "/nodes" and method == "GET":
        with m.lock:
            nodes = [n.to_json() for k, n in sorted(m.nodes.items()) if k.startswith(parent + "/")]
        return {"nodes": nodes}
    if rest == "/nodes" and method == "POST":
        return m.create_node(parent, _id(q, "nodeId"), body)
    if re.fullmatch(r"/nodes/[^/:]+", rest):
        if method == "GET":
            with m.lock:
                return m.node(name).to_json()
        if method == "DELETE":
            return m.delete_node(name)
        if method == "PATCH":
            mask = [f.strip() for f in q.get("updateMask", "").split(",") if f.strip()]
            return m.update_node(name, body, [_snake_to_camel(f) for f in mask])
    if rest.endswith(":stop") and re.fullmatch(r"/nodes/[^/:]+:stop", rest) and method == "POST":
        return m.stop_node(name.removesuffix(":stop"))
    if rest.endswith(":getGuestAttributes") and method == "POST":
        return m.guest_attributes(
            name.removesuffix(":getGuestAttributes"),
            body.get("queryPath", ""),
            list(body.get("workerIds", [])),
        )
    if rest == "/queuedResources":
        if method == "GET":
            return queued.list_(m, parent)
        if method == "POST":
            return queued.create(m, parent, _id(q, "queuedResourceId"), body)
    if re.fullmatch(r"/queuedResources/[^/:]+", rest):
        if method == "GET":
            return queued.get(m, name)
        if method == "DELETE":
            return queued.delete(m, name, q.get("force", "false").lower() == "true")
    if re.fullmatch(r"/operations/[^/:]+", rest) and method == "GET":
        with m.lock:
            if name not in m.ops:
                raise ApiError(404, "NOT_FOUND", f"Operation '{name}' was not found")
            return json.loads(json.dumps(m.ops[name]))
    raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")


def _other_apis(m: Model, method: str, path: str, q: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """The bits of Compute Engine (project metadata), OS Login and IAP that reaching a VM needs; the billing
    catalog's services and SKUs (prices)."""
    if path.startswith("/compute/v1/projects/") and path.count("/") > 4:
        return compute_routes.route(m.compute, method, path, q, body)
    if (answer := catalog.route(m.catalog, method, path, q)) is not None:
        return answer
    if method == "GET" and (r := re.fullmatch(r"/compute/v1/projects/([^/]+)", path)):
        with m.lock:
            md = m.projects.get(r[1], {})
        return {
            "name": r[1],
            "commonInstanceMetadata": {"items": [{"key": k, "value": v} for k, v in md.items()]},
        }
    if method == "POST" and (r := re.fullmatch(r"/v1/users/([^/:]+):importSshPublicKey", path)):
        return m.import_ssh_key(r[1], body, q.get("projectId", ""))
    if method == "GET" and (r := re.fullmatch(r"/v1/users/([^/:]+)/loginProfile", path)):
        return m.login_profile(r[1], q.get("projectId", ""))
    if method == "POST" and path == "/iap/v1/tunnel":  # the emulator's own: asked by its IAP forwarder
        host, port = m.iap_target(body["project"], body["zone"], body["instance"], int(body["port"]))
        return {"host": host, "port": port}
    raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")


def _snake_to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _id(q: dict[str, str], key: str) -> str:
    value = q.get(key, "")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", value):
        raise ApiError(400, "INVALID_ARGUMENT", f"{key} {value!r} must match [a-z]([-a-z0-9]*[a-z0-9])?")
    return value


def admin(m: Model, action: str, body: dict[str, Any]) -> dict[str, Any]:
    """Fault injection: preempt (with `notice` seconds: announced on the workers' metadata servers first),
    swap-host-key, faults (unavailable N + code, capacity {zone: N}, oslogin_denied, iap_denied), project-metadata
    (project, metadata {key: value}), catalog (a TPU price), state; `requests` answers the request log from index `since` on."""
    if action == "requests":
        with m.lock:
            return {"requests": [r.__dict__ for r in m.requests[int(body.get("since", 0)) :]]}
    if action == "preempt" and float(body.get("notice") or 0) > 0:
        _notice_then_preempt(m, {k: v for k, v in body.items() if k != "notice"}, float(body["notice"]))
    elif action == "project-metadata":
        m.set_project_metadata(body["project"], {k: str(v) for k, v in body["metadata"].items()})
    elif action == "preempt" and (names := m.compute.resolve(body["node"])):
        for name in _pick(m, names, body):
            m.compute.preempt(name)
    elif action == "recreate":
        names = m.compute.resolve(body["node"])
        if not names:
            raise ApiError(400, "INVALID_ARGUMENT", f"no instance or MIG {body['node']!r}")
        for name in _pick(m, names, body):
            m.compute.recreate(name)
    elif action == "preempt":
        m.preempt(_node_name(m, body["node"]))
    elif action == "swap-host-key":
        m.swap_host_key(_node_name(m, body["node"]), int(body.get("worker", 0)))
    elif action == "faults":
        with m.lock:
            if "unavailable" in body:
                m.faults.unavailable = int(body["unavailable"])
                m.faults.unavailable_code = int(body.get("code", 503))
            for zone, n in body.get("capacity", {}).items():
                m.faults.capacity[zone] = int(n)
            for flag in ("oslogin_denied", "iap_denied"):
                if flag in body:
                    setattr(m.faults, flag, bool(body[flag]))
        if "answers" in body:  # {mode, count, api (tpu, compute, all), code (an HTML page's status)}
            a = body["answers"]
            m.faults.answers.set(a.get("api", "all"), a["mode"], int(a["count"]), int(a.get("code", 200)))
    elif action == "catalog":  # a price: {family, region, on_demand, spot} (USD per chip-hour)
        m.catalog.set(body["family"], body["region"], body["on_demand"], body["spot"])
    elif action != "state":
        raise ApiError(404, "NOT_FOUND", f"unknown admin action {action!r}")
    with m.lock:
        return {
            "nodes": {k: n.state for k, n in m.nodes.items()},
            "instances": {k: r.status for k, r in m.compute.instances.items()},
            "instanceGroupManagers": sorted(m.compute.migs),
            "queuedResources": {k: q["state"]["state"] for k, q in m.qrs.items()},
            "faults": {
                "unavailable": m.faults.unavailable,
                "capacity": dict(m.faults.capacity),
                "answers": m.faults.answers.summary(),
            },
            "requests": len(m.requests),
        }


def _notice_then_preempt(m: Model, body: dict[str, Any], seconds: float) -> None:
    """`instance/preempted` TRUE on each worker's metadata server now, the preemption `seconds` later."""
    if names := m.compute.resolve(body["node"]):
        with m.lock:
            workers = [w for n in _pick(m, names, body) for w in m.compute.instances[n].workers]
    else:
        with m.lock:
            workers = list(m.node(_node_name(m, body["node"])).workers)
    metadata.announce([w.state_dir for w in workers], "preempted", "TRUE")

    def preempt() -> None:
        try:
            admin(m, "preempt", body)
        except ApiError:  # deleted meanwhile: nothing left to preempt
            pass

    metadata.after(seconds, preempt)


def _pick(m: Model, names: list[str], body: dict[str, Any]) -> list[str]:
    """A fault's instances: all of them, or with `worker` the one whose worker number that is."""
    if "worker" not in body:
        return names
    with m.lock:
        hits = [n for n in names
                if m.compute.instances[n].body["metadata"].get(compute.WORKER_NUMBER, "0") == str(body["worker"])]  # fmt: skip
    if not hits:
        raise ApiError(400, "INVALID_ARGUMENT", f"no worker {body['worker']} among {len(names)} instances")
    return hits


def _node_name(m: Model, ref: str) -> str:
    """A full node name, or `zone/name`, or a bare name when it is unique."""
    if ref.startswith("projects/"):
        return ref
    zone, _, node = ref.rpartition("/")
    suffix = f"/locations/{zone}/nodes/{node}" if zone else f"/nodes/{node}"
    hits = [k for k in m.nodes if k.endswith(suffix)]
    if len(hits) != 1:
        raise ApiError(400, "INVALID_ARGUMENT", f"node {ref!r} matches {len(hits)} nodes")
    return hits[0]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses connections
    disable_nagle_algorithm = True  # headers and body go out as two writes: Nagle + delayed ACK cost 40 ms
    _broken: tuple[str, int] | None = None  # this call's broken answer, (mode, code): emulator/answers.py

    def _serve(self) -> None:
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        m = self.server.model
        self._broken = None
        try:
            body = json.loads(raw) if raw else {}
            if url.path.startswith("/admin/"):
                answer = admin(m, url.path.removeprefix("/admin/"), body)
            else:
                with m.lock:
                    m.requests.append(
                        ApiRequest(
                            self.command,
                            url.path,
                            self.headers.get("x-tpuops-client", ""),
                            self.headers.get("x-tpuops-purpose", ""),
                        )
                    )
                    code = m.faults.unavailable_code if m.faults.unavailable > 0 else 0
                    m.faults.unavailable = max(0, m.faults.unavailable - 1)
                self._broken = m.faults.answers.take(url.path)
                if self._broken and self._broken[0] == "hang":
                    answers.send(self, m.faults.answers, *self._broken, b"")
                    return
                if code:
                    raise ApiError(
                        code, _STATUS.get(code, "UNAVAILABLE"), "The service is currently unavailable."
                    )
                answer = _route(m, self.command, url.path, q, body)
            self._send(200, answer)
        except ApiError as e:
            error: dict[str, Any] = {"code": e.http, "message": e.message, "status": e.status}
            if url.path.startswith("/compute/"):  # Compute's classic form: errors[] with domain/reason
                reason = {403: "forbidden", 404: "notFound", 409: "alreadyExists", 412: "conditionNotMet"}
                error["errors"] = [
                    {"domain": "global", "reason": reason.get(e.http, "invalid"), "message": e.message}
                ]
            self._send(e.http, {"error": error})
        except (ValueError, KeyError) as e:
            self._send(
                400, {"error": {"code": 400, "message": f"bad request: {e}", "status": "INVALID_ARGUMENT"}}
            )

    def _send(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        if self._broken:
            answers.send(self, self.server.model.faults.answers, *self._broken, data)
            return
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"emulator: {format % args}\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    model: Model
    verbose: bool


class Emulator:
    """The TPU API emulator, in-process: `start()` returns the endpoint URL, `stop()` stops every sshd."""

    def __init__(
        self,
        state_dir: Path,
        *,
        port: int = 0,
        zones: list[str] | None = None,
        authorized_key: str = "",
        user_prefix: str = "tpuops-e",
        create_delay: float = 0.0,
        verbose: bool = False,
    ) -> None:
        self.model = Model(
            state_dir,
            zones or DEFAULT_ZONES,
            authorized_key=authorized_key,
            user_prefix=user_prefix,
            create_delay=create_delay,
        )
        compute.Compute(self.model)  # the Compute Engine side, at model.compute
        self._port, self._verbose = port, verbose
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> str:
        self.model.state_dir.mkdir(parents=True, exist_ok=True)
        self._server = _Server(("127.0.0.1", self._port), _Handler)
        self._server.model, self._server.verbose = self.model, self._verbose
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.model.faults.answers.clear()  # hung calls let go: their threads end with the server
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.model.stop_all()

    def admin(self, action: str, **body: Any) -> dict[str, Any]:
        """The same fault injection as POST /admin/ACTION, in-process."""
        return admin(self.model, action, body)
