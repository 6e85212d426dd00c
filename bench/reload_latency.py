#!/usr/bin/env python3
"""Latency from the kubelet's ..data rename to the service's SIGHUP, with
tend as PID 1 of a new PID namespace (needs root).

    bench/reload_latency.py --bin target/release/tend [--updates 100] [--burst 30]

Prints p50/p99/max in microseconds, missed and extra reloads, and for a
burst of updates how many reloads came and whether the last saw the last
content.
"""
import argparse
import os
import select
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kubelet  # noqa: E402


def read_line(stream, timeout):
    r, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().decode().strip() if r else None


def percentile(values, p):
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/tend")
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--burst", type=int, default=30)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tend-bench-")
    vol = os.path.join(work, "config")
    kubelet.project(vol, {"app.conf": "v0"})
    cfg = os.path.join(work, "supervisor.toml")
    with open(cfg, "w") as f:
        f.write(f'[service]\ncommand = ["python3", "{HERE}/recorder.py", "{vol}/app.conf"]\n\n'
                f'[[watch]]\npaths = ["{vol}"]\non_change = "signal"\n')
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                             os.path.abspath(a.bin), "--config", cfg],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env={**os.environ, "TEND_LOG": "warn"})
    try:
        assert read_line(proc.stdout, 10).startswith("ready"), "the recorder did not start"
        time.sleep(0.2)
        lat, missed = [], 0
        for i in range(1, a.updates + 1):
            t0 = kubelet.project(vol, {"app.conf": f"v{i}"})
            line = read_line(proc.stdout, 2)
            if line is None or not line.endswith(f" v{i}"):
                missed += 1
                continue
            lat.append((int(line.split()[0]) - t0) / 1000)
            time.sleep(0.01)
        time.sleep(0.3)
        extra = 0
        while read_line(proc.stdout, 0.2) is not None:
            extra += 1
        # A burst: updates back to back.
        for i in range(1, a.burst + 1):
            kubelet.project(vol, {"app.conf": f"b{i}"})
        got = []
        while (line := read_line(proc.stdout, 1.0)) is not None:
            got.append(line.split()[1])
        print(f"updates {a.updates}: p50 {percentile(lat, 50):.0f} us, p99 {percentile(lat, 99):.0f} us, "
              f"max {max(lat):.0f} us; missed {missed}, extra {extra}")
        print(f"burst of {a.burst}: {len(got)} reloads, last saw {got[-1] if got else None!r} "
              f"({'the last content' if got and got[-1] == f'b{a.burst}' else 'NOT the last content'})")
    finally:
        proc.kill()
        proc.wait()
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
