"""A chat-completions stand-in for the tests: a threaded HTTP server on 127.0.0.1 whose every POST
goes to the test's own `handle(handler, body)`."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_posts(handle) -> tuple[ThreadingHTTPServer, str]:
    """Start the server; (it, its base URL `http://127.0.0.1:PORT/v1`). `handle` gets the request
    handler and the JSON body; `server.shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            handle(self, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
