#!/usr/bin/env python3
"""A reload endpoint for benchmarks: answers every request with 200 and
prints "<path> <monotonic_ns>" on stdout as soon as a request's head has
arrived. Keeps connections open when the client does (as Prometheus'
/-/reload does), and serves many at once on one thread (selectors).

    endpoint.py PORT
"""
import os
import selectors
import socket
import sys
import time

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n%s\r\nok\n"


def main():
    port = int(sys.argv[1])
    out = os.fdopen(1, "w", buffering=1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    heads = {}
    out.write(f"listening {port}\n")
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    heads[conn] = b""
                    sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(sock)
                heads.pop(sock, None)
                sock.close()
                continue
            buf = heads[sock] + data
            while b"\r\n\r\n" in buf:
                head, buf = buf.split(b"\r\n\r\n", 1)
                now = time.monotonic_ns()
                path = head.split(b" ", 2)[1].decode()
                out.write(f"{path} {now}\n")
                close = b"connection: close" in head.lower()
                try:
                    sock.sendall(OK % (b"Connection: close\r\n" if close else b""))
                except OSError:
                    close = True
                if close:
                    sel.unregister(sock)
                    heads.pop(sock, None)
                    sock.close()
                    buf = None
                    break
            if buf is not None:
                heads[sock] = buf


if __name__ == "__main__":
    main()
