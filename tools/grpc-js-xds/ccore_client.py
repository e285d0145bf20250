# A gRPC C-core xDS client (Debian's python3-grpcio) for xds/traffic_nongo_test.go:
# the same protocol as client.js beside it, so one test drives both.
#
# Usage: GRPC_XDS_BOOTSTRAP=bootstrap.json /usr/bin/python3 ccore_client.py <listener>
#
# One JSON request a line on stdin, one JSON answer a line on stdout:
#   in:  {"calls": 100, "method": "Check" | "Watch", "metadata": {"x-user": "u1"}, "deadline_ms": 0}
#   out: {"backends": {"a": 80}, "errors": {"UNAVAILABLE": 3}, "details": {"UNAVAILABLE": "..."}, "min_ms": 0.4, "max_ms": 3.1}
# Messages are empty HealthCheckRequests sent as raw bytes: no .proto is needed.
import json
import resource
import sys
import time

import grpc


def backend_of(md):
    for k, v in md or ():
        if k == "x-backend":
            return v
    return ""


def one(channel, method, md, deadline_ms):
    timeout = deadline_ms / 1000.0 if deadline_ms > 0 else 10.0
    if method == "Watch":
        stream = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"", metadata=md, timeout=timeout)
        try:
            backend = backend_of(stream.initial_metadata())
            if backend:
                stream.cancel()
                return {"backend": backend}
            next(stream)
            return {"backend": ""}
        except grpc.RpcError as e:
            return {"code": e.code().name, "message": e.details() or ""}
    try:
        _, call = channel.unary_unary("/grpc.health.v1.Health/Check").with_call(b"", metadata=md, timeout=timeout)
        return {"backend": backend_of(call.initial_metadata())}
    except grpc.RpcError as e:
        return {"code": e.code().name, "message": e.details() or ""}


def batch(channel, req):
    out = {"backends": {}, "errors": {}, "details": {}, "min_ms": 0, "max_ms": 0}
    md = tuple((k, str(v)) for k, v in (req.get("metadata") or {}).items())
    for i in range(req.get("calls") or 1):
        start = time.monotonic()
        r = one(channel, req.get("method") or "Check", md, req.get("deadline_ms") or 0)
        ms = (time.monotonic() - start) * 1000
        out["min_ms"] = ms if i == 0 else min(out["min_ms"], ms)
        out["max_ms"] = max(out["max_ms"], ms)
        if "code" in r:
            out["details"].setdefault(r["code"], r["message"])
            out["errors"][r["code"]] = out["errors"].get(r["code"], 0) + 1
        else:
            out["backends"][r["backend"]] = out["backends"].get(r["backend"], 0) + 1
    return out


def main():
    # C-core 1.51's ring hash crashes the process (see the test): leave no core file.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if len(sys.argv) != 2:
        sys.stderr.write("usage: ccore_client.py <listener>\n")
        sys.exit(2)
    with grpc.insecure_channel("xds:///" + sys.argv[1]) as channel:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                out = batch(channel, json.loads(line))
            except Exception as e:  # reported to the test, which fails on it
                out = {"fatal": repr(e)}
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
