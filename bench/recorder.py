#!/usr/bin/env python3
"""A service for benchmarks: prints "<monotonic_ns> <content of FILE>" on
stdout for every SIGHUP, "USR1 <monotonic_ns>" for every SIGUSR1, and "TERM
<monotonic_ns>" for SIGTERM (then exits), as soon as each arrives
(sigwaitinfo, no handler).

    recorder.py FILE

With RECORDER_FD set, the lines go to that fd instead of stdout (when
stdout itself is what is measured).
"""
import os
import signal
import sys
import time

path = sys.argv[1]
WANTED = {signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1}
signal.pthread_sigmask(signal.SIG_BLOCK, WANTED)
out = os.fdopen(int(os.environ.get("RECORDER_FD", "1")), "w", buffering=1)
out.write(f"ready {time.monotonic_ns()}\n")
while True:
    info = signal.sigwaitinfo(WANTED)
    now = time.monotonic_ns()
    if info.si_signo == signal.SIGTERM:
        out.write(f"TERM {now}\n")
        sys.exit(0)
    if info.si_signo == signal.SIGUSR1:
        out.write(f"USR1 {now}\n")
        continue
    try:
        with open(path) as f:
            content = f.read().strip()
    except OSError:
        content = "MISSING"
    out.write(f"{now} {content}\n")
