"""A package index on localhost for the tests of sdist downloads: the pages given by path (the JSON simple page,
the files), 404 elsewhere; every request's path and Accept header recorded."""

from __future__ import annotations

import http.server
import threading


def serve(pages: dict[str, bytes]) -> tuple[http.server.ThreadingHTTPServer, list[tuple[str, str | None]]]:
    """(the running server: shut it down after, the requests it answered)."""
    asked: list[tuple[str, str | None]] = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append((self.path, self.headers.get("Accept")))
            data = pages.get(self.path)
            self.send_response(200 if data else 404)
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, asked
