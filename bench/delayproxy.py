"""An HTTP proxy on loopback that holds every request a fixed time before forwarding it: an S3
server on loopback (SeaweedFS) made as far away as S3 in a region is (a few ms a request).

    with DelayProxy(upstream, delay=0.005) as proxy: proxy.endpoint

``delay`` may be changed while it runs (setup untimed at 0, the timed reads at 5 ms).
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: Hop-by-hop headers are the proxy's own, never forwarded.
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class DelayProxy:
    def __init__(self, upstream: str, *, delay: float = 0.0):
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.delay = delay
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self.endpoint = ""

    def __enter__(self) -> DelayProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                proxy.requests += 1
                time.sleep(proxy.delay)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream = http.client.HTTPConnection(proxy.host, proxy.port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response_only(answer.status, answer.reason)
                # A HEAD's length is the object's, not the empty body's.
                own = _HOP if self.command == "HEAD" else _HOP | {"content-length"}
                for key, value in answer.getheaders():
                    if key.lower() not in own:
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
