#!/usr/bin/env python3
"""A small HTTP service that cannot reload its config in place, written to be
restarted without dropping a request:

- it serves on the listening socket tend holds for it (fd 3, from LISTEN_FDS,
  the systemd socket-activation protocol), or binds PORT itself without tend;
- it says READY=1 on NOTIFY_SOCKET once it has read its config and serves;
- on SIGTERM it stops accepting, finishes the requests in flight, and exits 0.

    server.py CONFIG [PORT]     serve
    server.py --check CONFIG    exit 0 when CONFIG is one the server accepts

CONFIG holds `greeting = TEXT`; GET / answers TEXT.
"""
import http.server
import os
import signal
import socket
import socketserver
import sys
import threading


def read_greeting(path):
    with open(path) as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "greeting" and value.strip():
                return value.strip()
    raise SystemExit(f"{path}: no greeting")


def notify(message):
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), path)


def listening_socket(port):
    """The socket tend passed (LISTEN_FDS), else one of our own."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and int(os.environ.get("LISTEN_FDS", "0")) >= 1:
        return socket.socket(fileno=3)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    return s


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = False  # finish the requests in flight before exiting
    block_on_close = True

    def __init__(self, sock, greeting):
        self.greeting = greeting
        http.server.HTTPServer.__init__(self, sock.getsockname(), Handler, bind_and_activate=False)
        # Two instances accept on the same socket during a restart: whichever
        # loses the race for a connection must not block in accept().
        sock.setblocking(False)
        self.socket = sock

    def get_request(self):
        conn, addr = self.socket.accept()
        conn.setblocking(True)
        return conn, addr


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        body = f"{self.server.greeting}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    if sys.argv[1] == "--check":
        read_greeting(sys.argv[2])
        return
    config = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 8080
    greeting = read_greeting(config)
    server = Server(listening_socket(port), greeting)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    notify(f"READY=1\nSTATUS=serving {greeting!r}")
    stop.wait()
    notify("STOPPING=1")
    server.shutdown()      # no more accept(): the next instance takes the backlog
    server.server_close()  # joins the handler threads: requests in flight complete
    thread.join()


if __name__ == "__main__":
    main()
