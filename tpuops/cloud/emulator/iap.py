"""The emulator's stand-in for `gcloud compute start-iap-tunnel`: same arguments, same "Listening on port [N]."
line, bytes forwarded to the worker the emulator names (VMs without external IPs answer only this way).

    python -m tpuops.cloud.emulator.iap --api-endpoint URL compute start-iap-tunnel INSTANCE 22 \\
        --local-host-port=localhost:0 --zone=Z --project=P

tpuops runs it in place of gcloud when $TPUOPS_GCLOUD says so (tests, `tpuops emulator serve` users).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import urllib.error
import urllib.request


def _target(endpoint: str, project: str, zone: str, instance: str, port: int) -> tuple[str, int]:
    req = urllib.request.Request(
        f"{endpoint.rstrip('/')}/iap/v1/tunnel",
        data=json.dumps({"project": project, "zone": zone, "instance": instance, "port": port}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        message = json.loads(e.read()).get("error", {}).get("message", str(e))
        sys.stderr.write(f"ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting [{message}].\n")
        sys.exit(1)
    return answer["host"], int(answer["port"])


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(listener: socket.socket, host: str, port: int) -> None:
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection((host, port), timeout=10)
        except OSError:
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="tpuops-emulator-iap")
    p.add_argument("--api-endpoint", required=True)
    p.add_argument("group", choices=["compute"])
    p.add_argument("command", choices=["start-iap-tunnel"])
    p.add_argument("instance")
    p.add_argument("port", type=int)
    p.add_argument("--local-host-port", default="localhost:0")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", required=True)
    args = p.parse_args(argv)
    host, port = _target(args.api_endpoint, args.project, args.zone, args.instance, args.port)
    local_host, _, local_port = args.local_host_port.rpartition(":")
    listener = socket.socket()
    listener.bind(("127.0.0.1" if local_host in ("", "localhost") else local_host, int(local_port or 0)))
    listener.listen(64)
    sys.stderr.write(f"Listening on port [{listener.getsockname()[1]}].\n")
    sys.stderr.flush()
    _serve(listener, host, port)


if __name__ == "__main__":
    main()
