#!/usr/bin/env python3
"""A small HTTP service that cannot reload its config in place, written to be
restarted without dropping a request:

- it serves on the listening socket tend holds for it (fd 3, from LISTEN_FDS,
  the systemd socket-activation protocol), or binds PORT itself without tend;
- it says READY=1 on NOTIFY_SOCKET once it has read its config and serves;
- on SIGTERM it stops accepting, finishes the requests in flight, and exits 0.

    server.py CONFIG [PORT]     serve
    server.py --check CONFIG    exit 0 when CONFIG is one the server accepts

CONFIG holds `greeting = TEXT` and `workers = N`; GET / answers TEXT, and
GET /healthz answers 200 OK. With `workers = 0` the config still parses, but
every request is answered 503: the kind of mistake only a health request
finds, after the config was applied.
"""
import os
import selectors
import signal
import socket
import sys
import threading


def read_config(path):
    """(greeting, workers); exits naming the problem when they are not there."""
    values = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    if not values.get("greeting"):
        raise SystemExit(f"{path}: no greeting")
    try:
        workers = int(values.get("workers", "1"))
    except ValueError:
        raise SystemExit(f"{path}: workers is not a number")
    return values["greeting"], workers


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


def handle(conn, greeting, workers):
    """One request: read it, answer it, close after the answer is sent."""
    with conn:
        conn.settimeout(10)
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                return
            request += chunk
        if workers < 1:
            status, body = b"503 Service Unavailable", b"no workers\n"
        elif request.startswith(b"GET /healthz "):
            status, body = b"200 OK", b"ok\n"
        else:
            status, body = b"200 OK", f"{greeting}\n".encode()
        conn.sendall(b"HTTP/1.0 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
        conn.shutdown(socket.SHUT_WR)


def serve(sock, greeting, workers, stop):
    """Accepts until `stop` is set, then waits for the requests in flight."""
    # Two instances accept on the same socket during a restart: whichever
    # loses the race for a connection must not block in accept().
    sock.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    threads = []
    while not stop.is_set():
        if not selector.select(0.05):
            continue
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            continue
        conn.setblocking(True)
        t = threading.Thread(target=handle, args=(conn, greeting, workers))
        t.start()
        threads.append(t)
        threads = [t for t in threads if t.is_alive()]
    selector.close()
    sock.close()  # no more accept(): the next instance takes the backlog
    for t in threads:
        t.join()


def main():
    if sys.argv[1] == "--check":
        read_config(sys.argv[2])
        return
    config = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 8080
    greeting, workers = read_config(config)
    sock = listening_socket(port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    notify(f"READY=1\nSTATUS=serving {greeting!r}")
    serve(sock, greeting, workers, stop)
    notify("STOPPING=1")


if __name__ == "__main__":
    main()
