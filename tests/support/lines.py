#!/usr/bin/env python3
"""A service for the output tests: writes numbered lines on stdout (and
stderr), so a test can tell a lost, cut or mixed line from a whole one.

    lines.py NAME [options]

Each line is "NAME PID SEQ " padded with dots to --size bytes, newline
included: SEQ counts from 0 in each process, so a restart starts again.
"""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("name")
p.add_argument("--count", type=int, help="lines to write (default: without end)")
p.add_argument("--size", type=int, default=100)
p.add_argument("--stderr-every", type=int, default=0, help="every Nth line goes to stderr")
p.add_argument("--buffered", action="store_true",
               help="through a buffered file (8 KiB writes that cut lines), not one write per line")
p.add_argument("--burst", type=int, default=0, help="pause --pause seconds after every N lines")
p.add_argument("--pause", type=float, default=0.001)
p.add_argument("--then", choices=["sleep", "exit", "crash"], default="sleep",
               help="after --count lines: sleep, exit 0, or die of SIGKILL")
p.add_argument("--last", help="on SIGTERM, append 'PID SEQ' (the last line written) to this file, exit 0")
a = p.parse_args()

pid = os.getpid()
out = [sys.stdout.buffer, sys.stderr.buffer] if a.buffered else None
seq = -1


def on_term(_signo, _frame):
    if a.last:
        with open(a.last, "a") as f:
            f.write(f"{pid} {seq}\n")
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)

n = 0
while a.count is None or n < a.count:
    head = f"{a.name} {pid} {n} ".encode()
    line = head + b"." * max(0, a.size - len(head) - 1) + b"\n"
    to = 1 if a.stderr_every and n % a.stderr_every == a.stderr_every - 1 else 0
    if out:
        out[to].write(line)
    else:
        os.write(to + 1, line)
    seq = n
    n += 1
    if a.burst and n % a.burst == 0:
        time.sleep(a.pause)

if out:
    for f in out:
        f.flush()
if a.then == "exit":
    sys.exit(0)
if a.then == "crash":
    os.kill(pid, signal.SIGKILL)
while True:
    time.sleep(60)
