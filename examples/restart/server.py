#!/usr/bin/env python3
"""A service that cannot reload: it reads its config once, at start-up, and
answers every request with the greeting from it. SIGHUP would kill it (it has
no handler), so tend restarts it instead (on_change = "restart").

    server.py CONFIG

The config is `key = value` lines: `greeting` (required) and `port`. Its
secret comes from the environment, read once too: `API_TOKEN` (required),
which GET /private wants as `Authorization: Bearer <API_TOKEN>`. tend reads it
from the mounted Secret (env_from) at every start, so a restart brings a
rotated token in.
"""
import http.server
import os
import sys

conf = {}
with open(sys.argv[1]) as f:
    for line in f:
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
body = (conf["greeting"] + "\n").encode()
token = os.environ.get("API_TOKEN")
if not token:
    sys.exit("server.py: API_TOKEN is not set")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status, text = 200, body
        if self.path == "/private":
            if self.headers.get("Authorization") == "Bearer " + token:
                text = b"private\n"
            else:
                status, text = 401, b"unauthorized\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("0.0.0.0", int(conf.get("port", 8080))), Handler).serve_forever()
