"""A local OTLP/HTTP receiver that accepts trace exports and counts them: what a traced gateway sends to while its
cost per turn is measured (docs/benchmarks.md, "Tracing's cost per turn").

It answers every `POST /v1/traces` with 200 and keeps only counts (requests and bytes; it decodes nothing, so its
own CPU stays small next to the gateway's on a shared machine), printed when it stops (Ctrl-C or SIGTERM):

    python -m sessiongate.benchmarks.otlp_sink --port 4318
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python -m sessiongate.benchmarks.router_overhead ...
"""

from __future__ import annotations

import argparse
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args(argv)
    counts = {"requests": 0, "bytes": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the exporter keeps its connection

        def do_POST(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            self.rfile.read(size)
            with lock:
                counts["requests"] += 1
                counts["bytes"] += size
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"otlp_sink listening on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print(f"otlp_sink received {counts['requests']} export requests, {counts['bytes']} bytes", flush=True)


if __name__ == "__main__":
    main()
