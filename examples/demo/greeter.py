#!/usr/bin/env python3
"""A tiny HTTP service for the demo: it answers every request with the
greeting from its config file, reads that file at start and again on SIGHUP,
and can check a config without serving (`--check`), as `nginx -t` does.

    greeter.py CONFIG [--port 8080]
    greeter.py --check CONFIG

The config is `key = value` lines; `greeting` is required and may not be
empty, `port` is optional.
"""
import http.server
import signal
import sys
import threading


def load(path):
    conf = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}:{n}: expected `key = value`, got {line!r}")
            conf[key.strip()] = value.strip()
    if not conf.get("greeting"):
        raise ValueError(f"{path}: `greeting` is missing or empty")
    return conf


if sys.argv[1] == "--check":
    try:
        load(sys.argv[2])
    except (OSError, ValueError) as e:
        print(f"invalid: {e}", file=sys.stderr)
        sys.exit(1)
    print("config ok")
    sys.exit(0)

path = sys.argv[1]
conf = load(path)
reload_requested = threading.Event()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (conf["greeting"] + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def on_hup(*_):
    global conf
    try:
        conf = load(path)
        print(f"greeter: reloaded, greeting is now {conf['greeting']!r}", flush=True)
    except (OSError, ValueError) as e:
        print(f"greeter: reload failed, keeping the old config: {e}", flush=True)


signal.signal(signal.SIGHUP, on_hup)
# Ctrl-C reaches the service (tend hands it the terminal): a clean exit, not
# a KeyboardInterrupt traceback.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
port = int(conf.get("port", 8080))
try:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
except OSError as e:
    print(f"greeter: cannot listen on 127.0.0.1:{port}: {e.strerror}", file=sys.stderr)
    sys.exit(1)
print(f"greeter: serving {conf['greeting']!r} on http://127.0.0.1:{port}/", flush=True)
server.serve_forever()
