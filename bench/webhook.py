#!/usr/bin/env python3
"""tend's `on_change = "http"` against configmap-reload, the sidecar that
POSTs to a reload endpoint when a ConfigMap volume changes. Prints Markdown.

    bench/run --peer configmap-reload      (builds both, then runs this)
    bench/webhook.py --tend BIN --configmap-reload BIN [--updates N]

Each watches a kubelet-style volume of its own and POSTs to the same local
endpoint (bench/endpoint.py, which keeps connections open as Prometheus'
/-/reload does) on every `..data` swap. The updates alternate between the
two, one by one, so drift on a shared machine hits both alike. Measured:
the time from the rename of `..data` to the request's head at the endpoint,
and each reloader's CPU over the whole run (every thread's time on a CPU,
from schedstat, plus the children it reaped), divided by the updates. tend runs as PID 1 of a
new PID namespace with `sleep` as its service; configmap-reload as the
sidecar it is. Both log at their default level, to /dev/null.
"""
import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kubelet  # noqa: E402
from bench import machine, pct, pid1_of, read_line, schedstat_cpu, stop, unshare  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_of(pid):
    """Seconds on a CPU: every thread of `pid` (schedstat), and the children
    it reaped (cutime + cstime, in clock ticks), which a reloader that
    forks per request spends too."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return schedstat_cpu(pid) + reaped


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Peer:
    def __init__(self, name, proc, pid, vol):
        self.name, self.proc, self.pid, self.vol = name, proc, pid, vol
        self.lat, self.missed = [], 0


def start_tend(tend, work, port):
    vol = os.path.join(work, "vol-tend")
    kubelet.project(vol, {"prometheus.yml": "v0"})
    cfg = os.path.join(work, "tend.toml")
    with open(cfg, "w") as f:
        f.write(f'[[watch]]\nname = "prometheus"\npaths = ["{vol}"]\non_change = "http"\n'
                f'http = {{ url = "http://127.0.0.1:{port}/tend", method = "POST" }}\n')
    proc = unshare([tend, "--config", cfg, "--", "sleep", "infinity"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Peer("tend", proc, pid1_of(proc), vol)


def start_cmr(binary, work, port):
    vol = os.path.join(work, "vol-cmr")
    kubelet.project(vol, {"prometheus.yml": "v0"})
    proc = subprocess.Popen([binary, f"--volume-dir={vol}", f"--webhook-url=http://127.0.0.1:{port}/cmr",
                             f"--web.listen-address=127.0.0.1:{free_port()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Peer("configmap-reload", proc, proc.pid, vol)


def update(endpoint, peer, content, path):
    """One update of `peer`'s volume; its latency in us, or None."""
    t0 = kubelet.project(peer.vol, {"prometheus.yml": content})
    deadline = time.monotonic() + 2.0
    while (left := deadline - time.monotonic()) > 0:
        line = read_line(endpoint.stdout, left)
        if line is None:
            break
        seen, _, ns = line.partition(" ")
        if seen == path:
            return (int(ns) - t0) / 1000
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tend", required=True)
    ap.add_argument("--configmap-reload", required=True)
    ap.add_argument("--updates", type=int, default=500, help="updates per reloader")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tend-bench-webhook-")
    port = free_port()
    endpoint = subprocess.Popen([sys.executable, os.path.join(HERE, "endpoint.py"), str(port)],
                                stdout=subprocess.PIPE, bufsize=0)
    peers = []
    try:
        assert (read_line(endpoint.stdout, 10) or "").startswith("listening"), "the endpoint did not start"
        peers = [start_tend(os.path.abspath(a.tend), work, port),
                 start_cmr(os.path.abspath(a.configmap_reload), work, port)]
        path = {"tend": "/tend", "configmap-reload": "/cmr"}
        time.sleep(1.0)
        # Both are watching, and both have made a first request.
        for p in peers:
            for i in range(3):
                assert update(endpoint, p, f"warm{i}", path[p.name]) is not None, f"{p.name} did not call"
        idle = {p.name: rss_kb(p.pid) for p in peers}
        cpu0 = {p.name: cpu_of(p.pid) for p in peers}
        wall0 = time.monotonic()
        for i in range(a.updates):
            order = peers if i % 2 == 0 else peers[::-1]
            for p in order:
                us = update(endpoint, p, f"v{i}", path[p.name])
                if us is None:
                    p.missed += 1
                else:
                    p.lat.append(us)
                time.sleep(0.01)
        wall = time.monotonic() - wall0
        cpu = {p.name: (cpu_of(p.pid) - cpu0[p.name]) / a.updates * 1e6 for p in peers}
        tend, cmr = peers
        print(f"## `on_change = \"http\"` against configmap-reload\n")
        print(f"Machine: {machine()}. {a.updates} updates each, alternating one by one ({wall:.0f} s). "
              "From the rename of `..data` to the request's head at a local endpoint; CPU is every "
              "thread's time on a CPU over the run, and the children reaped, per update.\n")
        print("| | p50 (us) | p90 (us) | p99 (us) | missed | CPU per update (us) | threads | RSS (kB) |")
        print("|---|---|---|---|---|---|---|---|")
        best50 = pct(cmr.lat, 50)
        for p in peers:
            p50 = pct(p.lat, 50)
            print(f"| {p.name} | {p50:.0f} ({p50 / best50:.2f}x) | {pct(p.lat, 90):.0f} | {pct(p.lat, 99):.0f} | "
                  f"{p.missed} | {cpu[p.name]:.0f} ({cpu[p.name] / cpu['configmap-reload']:.2f}x) | "
                  f"{threads(p.pid)} | {idle[p.name]} |")
        print()
        r50 = pct(tend.lat, 50) / best50
        rcpu = cpu["tend"] / cpu["configmap-reload"]
        print("| goal | met | tend / configmap-reload |")
        print("|---|---|---|")
        print(f"| swap -> webhook p50 <= 1.0x | {'yes' if r50 <= 1.0 else 'NO'} | {r50:.2f}x |")
        print(f"| CPU per update <= 1.0x | {'yes' if rcpu <= 1.0 else 'NO'} | {rcpu:.2f}x |")
        print(f"\nMedians over the run: tend {statistics.median(tend.lat):.0f} us, "
              f"configmap-reload {statistics.median(cmr.lat):.0f} us; Linux {platform.release()}.")
    finally:
        for p in peers:
            stop(p.proc)
        stop(endpoint)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
