#!/usr/bin/env python3
"""A service that cannot reload: it reads its config once, at start-up, and
answers every request with the greeting from it. SIGHUP would kill it (it has
no handler), so tend restarts it instead (on_change = "restart").

    server.py CONFIG

The config is `key = value` lines: `greeting` (required) and `port`.
"""
import http.server
import sys

conf = {}
with open(sys.argv[1]) as f:
    for line in f:
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
body = (conf["greeting"] + "\n").encode()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", int(conf.get("port", 8080))), Handler).serve_forever()
