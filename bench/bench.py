#!/usr/bin/env python3
"""tend against tini, dumb-init, catatonit, no init, and the inotify recipes
people use for config reloads, side by side in one run. Prints Markdown.

    bench/run [--quick]          (installs the peers, builds, then runs this)

Every figure is measured for every peer in the same run, alternating peers
within each round, and reported as a median with its spread (min-max, or
p10-p90 for latency distributions), and as a ratio to the best peer.
Needs root: each init runs as PID 1 of a new PID namespace.
"""
import argparse
import os
import random
import resource
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kubelet  # noqa: E402

RECORDER = [sys.executable, os.path.join(HERE, "recorder.py")]


# ------------------------------------------------------------------ helpers

def pct(values, p):
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def med_spread(values, fmt="{:.0f}"):
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ratio(value, best):
    if best in (0, None) or value is None:
        return ""
    return f"{value / best:.2f}x"


def unshare(argv, **kw):
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"] + argv, **kw)


def pid1_of(proc, timeout=5):
    """The host pid of PID 1 inside the namespace `proc` (unshare) made."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                kids = f.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError("PID 1 did not start")


def status_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def read_line(stream, timeout):
    r, _, _ = select.select([stream], [], [], timeout)
    if not r:
        return None
    line = stream.readline()
    return line.decode().strip() if line else None


def stop(proc):
    proc.kill()
    proc.wait()


# ------------------------------------------------------------------ peers

class Peers:
    def __init__(self, tend, work):
        self.work = work
        vols = []
        for i in range(3):
            v = os.path.join(work, f"idle-vol{i}")
            kubelet.project(v, {"app.conf": "v0"})
            vols.append(v)
        cfg = os.path.join(work, "three-watches.toml")
        with open(cfg, "w") as f:
            for i, v in enumerate(vols):
                f.write(f'[[watch]]\nname = "w{i}"\npaths = ["{v}"]\non_change = "signal"\n\n')
        self.inits = [
            ("tend", [tend, "--"]),
            ("tend, 3 watches", [tend, "--config", cfg, "--"]),
            ("tini", ["/usr/bin/tini-static", "--"]),
            ("dumb-init", ["/usr/bin/dumb-init", "--"]),
            ("catatonit", ["/usr/bin/catatonit", "--"]),
            ("no init", []),
        ]
        self.binaries = {
            "tend": tend,
            "tini": "/usr/bin/tini-static",
            "dumb-init": "/usr/bin/dumb-init",
            "catatonit": "/usr/bin/catatonit",
        }


def env_quiet():
    return {**os.environ, "TEND_LOG": "warn"}


# ------------------------------------------------------------------ init cost

def binary_sizes(peers):
    rows = []
    for name, path in peers.binaries.items():
        kind = subprocess.run(["file", "-bL", path], capture_output=True, text=True).stdout
        linked = "static" if "statically linked" in kind or "static-pie" in kind else "dynamic (+ libc)"
        rows.append((name, os.path.getsize(path), linked))
    return rows


def idle_rss(peers, rounds):
    out = {name: [] for name, _ in peers.inits}
    anon = {name: [] for name, _ in peers.inits}
    for _ in range(rounds):
        for name, init in peers.inits:
            p = unshare(init + ["sleep", "1000"], env=env_quiet(), stderr=subprocess.DEVNULL)
            pid = pid1_of(p)
            time.sleep(0.4)
            out[name].append(status_field(pid, "VmRSS"))
            anon[name].append(status_field(pid, "RssAnon"))
            stop(p)
    return out, anon


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def startup(peers, rounds, only=None):
    """Wall time of `unshare --pid --fork INIT true`, and the CPU time of all
    of it (unshare, the init, true: every process waited for), per peer, in
    us. The CPU time does not count waiting for another CPU."""
    times = {name: [] for name, _ in peers.inits}
    cpu = {name: [] for name, _ in peers.inits}
    order = [(n, i) for n, i in peers.inits if only is None or n in only]
    for _ in range(rounds):
        # A new order every round: whichever init runs right after the slow
        # start of "tend, 3 watches" (its watcher thread, a namespace with
        # more to tear down) pays for some of it.
        random.shuffle(order)
        for name, init in order:
            c0 = children_cpu()
            t0 = time.perf_counter_ns()
            subprocess.run(["unshare", "--pid", "--fork"] + init + ["true"], env=env_quiet(),
                           stderr=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter_ns() - t0) / 1000)
            cpu[name].append((children_cpu() - c0) * 1e6)
    return times, cpu


def signal_latency(peers, rounds, one_cpu=False):
    """Per peer, in us: SIGUSR1 and SIGTERM sent to PID 1 until the service
    has it (it waits in sigwaitinfo, so no handler scheduling is in the
    figure), and SIGTERM until PID 1 itself has exited (its pidfd is
    readable), with the service exiting at once on SIGTERM.

    With `one_cpu`, the sender, the init and the service all run on CPU 0
    (the harness pins itself; its children inherit that), so the figure is
    the init's own work. Left to the scheduler, each wake-up of the chain
    lands on either CPU, and every init's figure is bimodal: about 20 us
    when all three share a CPU, about 60 us with a wake-up across CPUs."""
    if one_cpu:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {0})
        try:
            return signal_latency(peers, rounds)
        finally:
            os.sched_setaffinity(0, before)
    usr1 = {name: [] for name, _ in peers.inits}
    term = {name: [] for name, _ in peers.inits}
    gone = {name: [] for name, _ in peers.inits}
    for _ in range(rounds):
        for name, init in peers.inits:
            p = unshare(init + RECORDER + ["/dev/null"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        bufsize=0, env=env_quiet())
            try:
                assert read_line(p.stdout, 10).startswith("ready")
                pid = pid1_of(p)
                pidfd = os.pidfd_open(pid)
                # Ten per round: one round's placement and state of the
                # machine weigh a tenth as much.
                for _ in range(10):
                    time.sleep(0.02)
                    t0 = time.monotonic_ns()
                    os.kill(pid, signal.SIGUSR1)
                    line = read_line(p.stdout, 5)
                    if line and line.startswith("USR1 "):
                        usr1[name].append((int(line.split()[1]) - t0) / 1000)
                time.sleep(0.02)
                t0 = time.monotonic_ns()
                os.kill(pid, signal.SIGTERM)
                if select.select([pidfd], [], [], 5)[0]:
                    gone[name].append((time.monotonic_ns() - t0) / 1000)
                os.close(pidfd)
                line = read_line(p.stdout, 5)
                if line and line.startswith("TERM "):
                    term[name].append((int(line.split()[1]) - t0) / 1000)
            finally:
                p.wait(10) if p.poll() is None else None
                if p.poll() is None:
                    stop(p)
    return usr1, term, gone


def idle_wakeups(peers, seconds):
    """Context switches of an idle PID 1 over `seconds`, all peers at once."""
    procs = []
    for name, init in peers.inits:
        p = unshare(init + ["sleep", "1000"], env=env_quiet(), stderr=subprocess.DEVNULL)
        procs.append((name, p, pid1_of(p)))
    time.sleep(1.0)

    def switches(pid):
        return status_field(pid, "voluntary_ctxt_switches") + status_field(pid, "nonvoluntary_ctxt_switches")
    before = {name: switches(pid) for name, _, pid in procs}
    time.sleep(seconds)
    after = {name: switches(pid) for name, _, pid in procs}
    for _, p, _ in procs:
        stop(p)
    return {name: after[name] - before[name] for name in before}


def reaping(peers, orphans_bin, n, rounds):
    res = {name: [] for name, _ in peers.inits}
    for _ in range(rounds):
        for name, init in peers.inits:
            p = unshare(init + [orphans_bin, str(n)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        env=env_quiet())
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                stop(p)
                continue
            created, done, most, cpu_us, wakeups = out.decode().split()
            res[name].append((float(created), float(done), int(most), float(cpu_us), int(wakeups)))
    return res


# ------------------------------------------------------------------ reloads

READLINK_LOOP = r'''
FILE="$1"
while true; do
  REAL=$(readlink -f "$FILE")
  inotifywait -q -e create -e modify -e delete -e move "$REAL" >/dev/null 2>&1
  kill -HUP $(pgrep -f recorder.py)
done
'''

DATA_WATCHER = r'''
DIR="$1"; PID="$2"
inotifywait -m -q -e moved_to --format %f "$DIR" | while read -r name; do
  [ "$name" = "..data" ] && kill -HUP "$PID"
done
'''


class ReloadSetup:
    """A recorder service reloaded by one mechanism, in its own PID namespace."""

    def __init__(self, name, tend, work):
        self.name = name
        self.vol = os.path.join(work, "vol-" + name.replace(" ", "-"))
        kubelet.project(self.vol, {"app.conf": "v0"})
        conf = os.path.join(self.vol, "app.conf")
        if name == "tend":
            cfg = os.path.join(work, "reload.toml")
            with open(cfg, "w") as f:
                f.write(f'[[watch]]\npaths = ["{self.vol}"]\non_change = "signal"\nsignal = "SIGHUP"\n')
            argv = [tend, "--config", cfg, "--"] + RECORDER + [conf]
        else:
            script = READLINK_LOOP if name == "readlink loop" else DATA_WATCHER
            path = os.path.join(work, name.replace(" ", "-") + ".sh")
            with open(path, "w") as f:
                f.write(script)
            # The service and the sidecar side by side, started from a
            # script file so that only the service's command line says
            # recorder.py (the recipe finds it with pgrep -f).
            rec = " ".join(RECORDER + [conf])
            side = f"sh {path} {conf}" if name == "readlink loop" else f"sh {path} {self.vol} $!"
            pod = os.path.join(work, name.replace(" ", "-") + "-pod.sh")
            with open(pod, "w") as f:
                f.write(f"{rec} &\n{side} &\nwait\n")
            argv = ["/usr/bin/tini-static", "--", "sh", pod]
        self.proc = unshare(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, env=env_quiet())
        assert read_line(self.proc.stdout, 10).startswith("ready"), name
        time.sleep(0.5)
        self.tend_pid = pid1_of(self.proc) if name == "tend" else None

    def drain(self, seconds):
        lines = []
        while (line := read_line(self.proc.stdout, seconds)) is not None:
            lines.append(line)
        return lines

    def update(self, content, wait):
        """One update; (latency us or None, content seen, extra reloads)."""
        t0 = kubelet.project(self.vol, {"app.conf": content})
        line = read_line(self.proc.stdout, wait)
        if line is None:
            return None, None, 0
        ns, _, seen = line.partition(" ")
        extra = len(self.drain(0.1))
        return (int(ns) - t0) / 1000, seen, extra

    def close(self):
        stop(self.proc)


def reload_run(name, tend, work, updates, burst):
    s = ReloadSetup(name, tend, work)
    try:
        lat, missed, stale, extra = [], 0, 0, 0
        for i in range(1, updates + 1):
            us, seen, more = s.update(f"v{i}", 1.0)
            extra += more
            if us is None:
                missed += 1
            elif seen != f"v{i}":
                stale += 1
            else:
                lat.append(us)
        s.drain(0.5)
        for i in range(1, burst + 1):
            kubelet.project(s.vol, {"app.conf": f"b{i}"})
        got = [line.partition(" ")[2] for line in s.drain(1.5)]
        return {"lat": lat, "missed": missed, "stale": stale, "extra": extra,
                "burst_reloads": len(got), "burst_last": got[-1] if got else None, "burst_n": burst}
    finally:
        s.close()


def tend_cost(tend, work, updates):
    s = ReloadSetup("tend", tend, work)
    try:
        def cpu(pid):
            # Nanoseconds on the CPU (schedstat), not the 10 ms ticks of stat,
            # summed over every thread (the loop and the watcher's).
            total = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            return total / 1e9
        idle = status_field(s.tend_pid, "VmRSS")
        c0 = cpu(s.tend_pid)
        ok = 0
        for i in range(1, updates + 1):
            t0 = kubelet.project(s.vol, {"app.conf": f"c{i}"})
            if read_line(s.proc.stdout, 2.0):
                ok += 1
        used = cpu(s.tend_pid) - c0
        return {"cpu_us": used / updates * 1e6, "hwm": status_field(s.tend_pid, "VmHWM"), "idle": idle,
                "ok": ok, "updates": updates}
    finally:
        s.close()


# ------------------------------------------------------------------ tend at scale

def schedstat_cpu(pid):
    """Seconds on a CPU, summed over every thread of `pid`."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9


class Tend:
    """tend with `config` (TOML text) running recorder.py on `conf_file`, as
    PID 1 of its own PID namespace; `started_s` is the time until the
    service said it runs."""

    def __init__(self, tend, work, name, config, conf_file, timeout=300):
        cfg = os.path.join(work, name + ".toml")
        with open(cfg, "w") as f:
            f.write(config)
        t0 = time.monotonic()
        self.proc = unshare([tend, "--config", cfg, "--"] + RECORDER + [conf_file], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0, env=env_quiet())
        line = read_line(self.proc.stdout, timeout)
        assert line and line.startswith("ready"), name
        self.started_s = time.monotonic() - t0
        self.pid = pid1_of(self.proc)

    def signal(self, signo, prefix):
        """Sends `signo` to tend; us until the service had it, or None."""
        t0 = time.monotonic_ns()
        os.kill(self.pid, signo)
        line = read_line(self.proc.stdout, 5)
        if line and line.startswith(prefix + " "):
            return (int(line.split()[1]) - t0) / 1000
        return None

    def reload(self, vol, files, expect, wait=10.0):
        """One kubelet update; us from the ..data rename to SIGHUP, or None."""
        t0 = kubelet.project(vol, files)
        line = read_line(self.proc.stdout, wait)
        if line is None:
            return None
        ns, _, seen = line.partition(" ")
        return (int(ns) - t0) / 1000 if seen == expect else None

    def rss(self):
        return status_field(self.pid, "VmRSS"), status_field(self.pid, "RssAnon")

    def close(self):
        stop(self.proc)


def watch_toml(vol, extra=""):
    return f'[[watch]]\npaths = ["{vol}"]\non_change = "signal"\nsignal = "SIGHUP"\n{extra}\n'


def scale(tend, work, watches, files, updates):
    """1 watch of 1 file; `watches` watches of 1 file each; 1 watch of
    `files` files: idle RSS, start-up to the service running, and reload
    latency of the first watch's file."""
    out = {}
    for label, n_watches, n_files in (("1 watch, 1 file", 1, 1), (f"{watches} watches", watches, 1),
                                      (f"1 watch, {files:,} files", 1, files)):
        vols = []
        for w in range(n_watches):
            v = os.path.join(work, f"scale-{n_watches}-{n_files}-{w}")
            kubelet.project(v, {f"k{i}.conf": "v0" for i in range(n_files)})
            vols.append(v)
        t = Tend(tend, work, f"scale-{n_watches}-{n_files}", "".join(watch_toml(v) for v in vols),
                 os.path.join(vols[0], "k0.conf"))
        try:
            time.sleep(1.0)
            rss, anon = t.rss()
            lat = []
            n = updates if n_files == 1 else max(3, updates // 20)
            for i in range(1, n + 1):
                content = {f"k{j}.conf": "v0" for j in range(n_files)}
                content["k0.conf"] = f"v{i}"
                us = t.reload(vols[0], content, f"v{i}")
                if us is not None:
                    lat.append(us)
                time.sleep(0.05)
            out[label] = {"rss": rss, "anon": anon, "start": t.started_s, "lat": lat, "files": n_files,
                          "watches": n_watches}
        finally:
            t.close()
            for v in vols:
                shutil.rmtree(v, ignore_errors=True)
    return out


def http_cost(tend, work, requests, signals):
    """`[http] listen`: idle memory with and without it, the time and tend's
    CPU per request (a new connection each, as a probe or a scrape makes),
    and SIGUSR1 latency while a client scrapes /metrics without pause."""
    import socket
    import threading

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def get(port, path):
        t0 = time.monotonic_ns()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            answer = b""
            while chunk := c.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.1 503"), answer[:40]
        return (time.monotonic_ns() - t0) / 1000

    vol = os.path.join(work, "http-vol")
    kubelet.project(vol, {"app.conf": "v0"})
    conf = os.path.join(vol, "app.conf")
    port = free_port()
    out = {}
    for label, extra in (("without [http]", ""), ("with [http]", f'[http]\nlisten = "127.0.0.1:{port}"\n\n')):
        t = Tend(tend, work, "http-" + label.split()[0], extra + watch_toml(vol), conf)
        try:
            time.sleep(1.0)
            r = {"idle": t.rss()}
            if extra:
                cpu0 = schedstat_cpu(t.pid)
                r["metrics"] = [get(port, "/metrics") for _ in range(requests)]
                r["ready"] = [get(port, "/ready") for _ in range(requests)]
                r["cpu_us"] = (schedstat_cpu(t.pid) - cpu0) * 1e6 / (2 * requests)
                r["after"] = (status_field(t.pid, "VmRSS"), status_field(t.pid, "VmHWM"))
                quiet, busy = [], []
                for _ in range(signals):
                    time.sleep(0.03)
                    us = t.signal(signal.SIGUSR1, "USR1")
                    if us is not None:
                        quiet.append(us)
                stop_scraping = threading.Event()

                def scrape():
                    while not stop_scraping.is_set():
                        get(port, "/metrics")
                scraper = threading.Thread(target=scrape)
                scraper.start()
                try:
                    for _ in range(signals):
                        time.sleep(0.03)
                        us = t.signal(signal.SIGUSR1, "USR1")
                        if us is not None:
                            busy.append(us)
                finally:
                    stop_scraping.set()
                    scraper.join()
                r["quiet"], r["busy"] = quiet, busy
            out[label] = r
        finally:
            t.close()
    shutil.rmtree(vol, ignore_errors=True)
    return out


def signal_while_hashing(tend, work, rounds, size=2 << 30):
    """SIGUSR1 latency through tend while its watcher thread fingerprints a
    `size` file (sparse, on tmpfs: reading it costs nothing, hashing it is
    all the work), against the same tend idle."""
    d = tempfile.mkdtemp(prefix="tend-bench-hash-", dir="/dev/shm")
    try:
        with open(os.path.join(d, "app.conf"), "w") as f:
            f.write("v0")
        t = Tend(tend, work, "hashing", f'[[watch]]\npaths = ["{d}"]\non_change = "none"\n',
                 os.path.join(d, "app.conf"))
        try:
            time.sleep(0.5)
            idle = []
            for _ in range(rounds):
                us = t.signal(signal.SIGUSR1, "USR1")
                if us is not None:
                    idle.append(us)
                time.sleep(0.03)
            c0, w0 = schedstat_cpu(t.pid), time.monotonic()
            with open(os.path.join(d, "big"), "wb") as f:
                f.truncate(size)
            time.sleep(0.3)  # the debounce, then the scan is under way
            busy = []
            for _ in range(rounds):
                us = t.signal(signal.SIGUSR1, "USR1")
                if us is not None:
                    busy.append(us)
                time.sleep(0.03)
            window_cpu = (schedstat_cpu(t.pid) - c0) / (time.monotonic() - w0)
            # The scan is done when tend stops using CPU.
            last = schedstat_cpu(t.pid)
            while True:
                time.sleep(0.2)
                now = schedstat_cpu(t.pid)
                if now - last < 0.01 or time.monotonic() - w0 > 120:
                    break
                last = now
            return {"idle": idle, "busy": busy, "busy_cpu": window_cpu, "scan_s": time.monotonic() - w0 - 0.2,
                    "size": size}
        finally:
            t.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


NGINX_CONF = "events {{}} http {{ server {{ listen 127.0.0.1:18089; server_name {}; }} }}"


def reload_with_check(tend, work, updates):
    """A reload gated by a real check, `nginx -t`: rename of ..data to the
    service's SIGHUP, against `nginx -t` alone on the same file, alternating."""
    vol = os.path.join(work, "vol-nginx")
    kubelet.project(vol, {"nginx.conf": NGINX_CONF.format("v0")})
    conf = os.path.join(vol, "nginx.conf")
    check = ["nginx", "-t", "-q", "-c", conf, "-g", f"error_log stderr; pid {work}/nginx.pid;"]
    t = Tend(tend, work, "nginx-check", watch_toml(vol, "check = " + repr(check).replace("'", '"')), conf)
    try:
        time.sleep(0.5)
        lat, alone = [], []
        for i in range(1, updates + 1):
            us = t.reload(vol, {"nginx.conf": NGINX_CONF.format(f"v{i}")}, NGINX_CONF.format(f"v{i}"))
            if us is not None:
                lat.append(us)
            t0 = time.monotonic_ns()
            subprocess.run(check, stderr=subprocess.DEVNULL, check=True)
            alone.append((time.monotonic_ns() - t0) / 1000)
            time.sleep(0.05)
        return {"lat": lat, "alone": alone, "updates": updates}
    finally:
        t.close()


SERVER = os.path.join(os.path.dirname(HERE), "examples", "zero-downtime", "server.py")


def restart_gap(tend, work, restarts, port=18090):
    """A program that cannot reload, restarted by tend under a steady client
    (a new connection every 2 ms): with the listening socket held by tend
    (stop-start, and overlap), and with the program binding its own port."""
    import socket
    import threading
    results = {}
    for port, (label, held, mode) in enumerate((("own port, stop-start", False, "stop-start"),
                                                ("held socket, stop-start", True, "stop-start"),
                                                ("held socket, overlap", True, "overlap")), start=port):
        # A port of its own each: connections the last one closed linger in
        # TIME_WAIT.
        vol = os.path.join(work, "vol-restart")
        kubelet.project(vol, {"app.conf": "greeting = g0"})
        conf = os.path.join(vol, "app.conf")
        cfg = os.path.join(work, "restart.toml")
        argv = ["python3", SERVER, conf] + ([] if held else [str(port)])
        with open(cfg, "w") as f:
            f.write(f"[service]\ncommand = {repr(argv)}\nnotify = true\nrestart_mode = \"{mode}\"\n"
                    f"stop_timeout = \"5s\"\n\n".replace("'", '"'))
            if held:
                f.write(f'[[socket]]\nname = "http"\nlisten = "127.0.0.1:{port}"\n\n')
            f.write(f'[[watch]]\npaths = ["{vol}"]\non_change = "restart"\n')
        proc = unshare([tend, "--config", cfg], stdout=subprocess.DEVNULL, stderr=open(cfg + ".log", "w"),
                       env=env_quiet())

        def get():
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                data = b""
                while chunk := c.recv(4096):
                    data += chunk
                return data.partition(b"\r\n\r\n")[2].decode(errors="replace").strip()

        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if get() == "g0":
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{label}: the server never answered"
                time.sleep(0.05)
            log, done = [], threading.Event()

            def client():
                while not done.is_set():
                    t0 = time.monotonic()
                    try:
                        got = get()
                        log.append((t0, time.monotonic() - t0, True, got))
                    except ConnectionRefusedError:
                        log.append((t0, time.monotonic() - t0, False, "refused"))
                    except OSError as e:
                        log.append((t0, time.monotonic() - t0, False, str(e)))
                    time.sleep(0.002)
            th = threading.Thread(target=client)
            th.start()
            time.sleep(0.5)
            for i in range(1, restarts + 1):
                kubelet.project(vol, {"app.conf": f"greeting = g{i}"})
                end = time.monotonic() + 15
                while time.monotonic() < end and not any(r[3] == f"g{i}" for r in log[-5:]):
                    time.sleep(0.01)
                time.sleep(0.3)
            done.set()
            th.join()
            # The longest stretch without an answer: from the start of a
            # failed request, or of a slow one, to the next answer's end.
            gap, since = 0.0, None
            for t0, dt, ok, _ in log:
                if not ok:
                    since = t0 if since is None else since
                else:
                    gap = max(gap, t0 + dt - (since if since is not None else t0))
                    since = None
            results[label] = {"requests": len(log), "failed": sum(1 for r in log if not r[2]),
                              "refused": sum(1 for r in log if r[3] == "refused"), "gap_ms": gap * 1000,
                              "p50_ms": pct([r[1] for r in log if r[2]], 50) * 1000, "restarts": restarts}
        finally:
            stop(proc)
            shutil.rmtree(vol, ignore_errors=True)
    return results


# ------------------------------------------------------------------ output

def read_lines(fd, n, timeout=120):
    """Reads `fd` until `n` newlines came: (seconds from the first byte to
    the n-th newline, lines seen)."""
    seen, first = 0, None
    deadline = time.monotonic() + timeout
    while seen < n and time.monotonic() < deadline:
        if not select.select([fd], [], [], 1)[0]:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        if first is None:
            first = time.monotonic()
        seen += chunk.count(b"\n")
    return (time.monotonic() - first if first else None), seen


def output_config(work, name, services):
    """A supervisor.toml of [[service]] tables (name, argv, extra lines)."""
    cfg = os.path.join(work, name + ".toml")
    with open(cfg, "w") as f:
        for svc, argv, extra in services:
            quoted = ", ".join(f'"{a}"' for a in argv)
            f.write(f'[[service]]\nname = "{svc}"\ncommand = [{quoted}]\noutput = "prefix"\n{extra}\n')
    return cfg


def output_throughput(tend, lines_bin, work, n, rounds):
    """`lines count n` (100-byte lines through stdio) into a pipe that
    Python reads, directly and through tend (prefix), alternating in each
    round: MB/s of the service's bytes from the first byte read to the
    last, and tend's CPU (every thread) per MB."""
    cfg = output_config(work, "output-throughput", [("svc", [lines_bin, "count", str(n)], "")])
    mb = n * 100 / 1e6
    out = {"direct": [], "tend": [], "cpu_ms_per_mb": []}
    for _ in range(rounds):
        for mode in ("direct", "tend"):
            r, w = os.pipe()
            argv = [lines_bin, "count", str(n)] if mode == "direct" else None
            p = subprocess.Popen(argv, stdout=w, stderr=subprocess.DEVNULL) if argv else \
                unshare([tend, "--config", cfg], stdout=w, stderr=subprocess.DEVNULL, env=env_quiet())
            os.close(w)
            try:
                took, seen = read_lines(r, n)
                assert seen >= n, f"{mode}: {seen} of {n} lines"
                out[mode].append(mb / took)
                if mode == "tend":
                    out["cpu_ms_per_mb"].append(schedstat_cpu(pid1_of(p)) * 1000 / mb)
            finally:
                stop(p)
                os.close(r)
    return out


def output_latency(tend, lines_bin, work, n):
    """`lines every 1000 n`: one line a millisecond, each with the time it
    was written; us until Python read it, directly and through tend."""
    cfg = output_config(work, "output-latency", [("svc", [lines_bin, "every", "1000", str(n)], "")])
    out = {}
    for mode in ("direct", "tend"):
        r, w = os.pipe()
        argv = [lines_bin, "every", "1000", str(n)]
        p = subprocess.Popen(argv, stdout=w, stderr=subprocess.DEVNULL) if mode == "direct" else \
            unshare([tend, "--config", cfg], stdout=w, stderr=subprocess.DEVNULL, env=env_quiet())
        os.close(w)
        lat, rest = [], b""
        try:
            while len(lat) < n:
                if not select.select([r], [], [], 5)[0]:
                    break
                chunk = os.read(r, 65536)
                now = time.monotonic_ns()
                if not chunk:
                    break
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    lat.append((now - int(line.split(b" | ")[-1].split()[0])) / 1000)
        finally:
            stop(p)
            os.close(r)
        out[mode] = lat
    return out


def output_signals(tend, lines_bin, work, signals):
    """SIGUSR1 through tend to a service (recorder.py, reporting on a pipe
    of its own), with tend's stdout read by `cat`: alone; next to a service
    that writes lines without pause; and the same with nobody reading
    tend's stdout and stderr (lines are dropped once a write has been
    blocked for a second)."""
    out = {}
    cases = (("quiet", False, True), ("a service floods, stdout read", True, True),
             ("a service floods, nobody reads", True, False))
    for label, flood, read in cases:
        rec_r, rec_w = os.pipe()
        services = [("app", RECORDER + ["/dev/null"], f'env = {{ RECORDER_FD = "{rec_w}" }}')]
        if flood:
            services.append(("flood", [lines_bin, "flood"], ""))
        cfg = output_config(work, "output-signals", services)
        r, w = os.pipe()
        p = unshare([tend, "--config", cfg], stdout=w, stderr=w, env=env_quiet(), pass_fds=(rec_w,))
        os.close(w)
        os.close(rec_w)
        cat = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL) if read else None
        rec = os.fdopen(rec_r, "rb", buffering=0)
        lat = []
        try:
            assert read_line(rec, 10).startswith("ready")
            pid = pid1_of(p)
            time.sleep(2.5)  # nobody reading: well past the second that makes a write stuck
            for _ in range(signals):
                time.sleep(0.03)
                t0 = time.monotonic_ns()
                os.kill(pid, signal.SIGUSR1)
                line = read_line(rec, 5)
                if line and line.startswith("USR1 "):
                    lat.append((int(line.split()[1]) - t0) / 1000)
            out[label] = lat
        finally:
            stop(p)
            if cat:
                cat.kill()
                cat.wait()
            rec.close()
            os.close(r)
    return out


def print_output(tend, lines_bin, work, q):
    n = 200_000 if q else 2_000_000
    rounds = 2 if q else 5
    print("## Output through tend: `output = \"prefix\"`\n")
    th = output_throughput(tend, lines_bin, work, n, rounds)
    med = statistics.median
    d, t = med(th["direct"]), med(th["tend"])
    cpu = med(th["cpu_ms_per_mb"])
    print(f"`bench/lines.c` writes {n:,} lines of 100 bytes through stdio (4 KiB writes that cut lines) into a "
          f"pipe that Python reads, directly and through tend (each line becomes `svc | line`), {rounds} rounds "
          "alternating. MB/s counts the service's bytes (10^6 bytes), from the first byte read to the last; "
          "tend's CPU is every thread's time on a CPU (`schedstat`), start-up included.\n")
    print("| | MB/s | tend's CPU per MB (ms) | tend's CPU at 10 MB/s (% of one core) |")
    print("|---|---|---|---|")
    print(f"| directly | {med_spread(th['direct'])} (1.00x) | - | - |")
    print(f"| through tend | {med_spread(th['tend'])} ({ratio(t, d)}) | {med_spread(th['cpu_ms_per_mb'], '{:.2f}')} | "
          f"{cpu:.1f} |\n")
    sys.stdout.flush()
    lt = output_latency(tend, lines_bin, work, 300 if q else 1000)
    print("One line a millisecond, one write(2) each, stamped with the time it was written: until Python read it.\n")
    print("| | p50 (us) | p90 (us) | p99 (us) |")
    print("|---|---|---|---|")
    for mode in ("direct", "tend"):
        v = lt[mode]
        print(f"| {'directly' if mode == 'direct' else 'through tend'} | {pct(v, 50):.0f} | {pct(v, 90):.0f} | "
              f"{pct(v, 99):.0f} |")
    print(f"\nAdded by tend: {pct(lt['tend'], 50) - pct(lt['direct'], 50):.0f} us per line at the median.\n")
    sys.stdout.flush()
    sg = output_signals(tend, lines_bin, work, 10 if q else 30)
    print("SIGUSR1 sent to tend until the service has it (30 ms apart), with a second service writing lines "
          "without pause: tend's stdout read by `cat`, and not read at all (tend's stdout and stderr are one "
          "pipe nobody reads; from 2.5 s on, tend drops the lines that do not fit).\n")
    print("| | p50 (us) | p99 (us) | max (us) | signals |")
    print("|---|---|---|---|---|")
    base = pct(sg["quiet"], 50)
    for label, v in sg.items():
        print(f"| {label} | {pct(v, 50):.0f} ({ratio(pct(v, 50), base)}) | {pct(v, 99):.0f} | {max(v):.0f} | "
              f"{len(v)} |")
    print()
    print(f"Goals: throughput >= 0.8x direct: {'yes' if t / d >= 0.8 else 'NO'} ({t / d:.2f}x); "
          f"tend's CPU <= 10% of one core per 10 MB/s: {'yes' if cpu <= 10 else 'NO'} ({cpu:.1f}%).\n")
    sys.stdout.flush()


# ------------------------------------------------------------------ report

def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}"


def best_peer(values):
    """The best (lowest) median among the C inits, and its name."""
    meds = {n: statistics.median(values[n]) for n in PEERS if values.get(n)}
    name = min(meds, key=meds.get)
    return meds[name], name


PEERS = ("tini", "dumb-init", "catatonit")
# The inits whose start-up alternates in one rotation.
PLAIN = ("tend", "tini", "dumb-init", "catatonit", "no init")


def print_startup(peers, rounds):
    """Start-up alone, with more rounds than the full run gives it: its
    figures are a few hundred us, and one busy moment moves a median of 100."""
    # Without "tend, 3 watches": its slower start (a watcher thread, a first
    # scan) perturbs whichever init runs next.
    start, cpu = startup(peers, rounds, only=PLAIN)
    base, base_cpu = statistics.median(start["no init"]), statistics.median(cpu["no init"])
    wall = {n: statistics.median(v) - base for n, v in start.items() if v and n != "no init"}
    work = {n: statistics.median(v) - base_cpu for n, v in cpu.items() if v and n != "no init"}
    print(f"`unshare --pid --fork INIT true` minus `unshare --pid --fork true` ({base:.0f} us wall, "
          f"{base_cpu:.0f} us of CPU), {rounds} rounds, the inits alternating within each; medians. "
          "CPU is every process's in it (`getrusage` of the waited-for children).\n")
    print("| | overhead, wall (us) | to tini | overhead, CPU (us) | to tini |")
    print("|---|---|---|---|---|")
    for name in wall:
        print(f"| {name} | {wall[name]:.0f} | {wall[name] / wall['tini']:.2f}x | {work[name]:.0f} | "
              f"{work[name] / work['tini']:.2f}x |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tend", required=True)
    ap.add_argument("--orphans-bin", required=True)
    ap.add_argument("--lines-bin", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, for trying the harness")
    ap.add_argument("--only", choices=["output", "start"], help="run this part alone")
    ap.add_argument("--up-bin", required=True)
    ap.add_argument("--services-only", action="store_true", help="run the several services part alone")
    a = ap.parse_args()
    q = a.quick
    def alone(what, part):
        """One part of the run, with its own heading, in a work directory of its own."""
        work = tempfile.mkdtemp(prefix="tend-bench-")
        try:
            print(f"# Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {what} only\n")
            print(f"Machine: {machine()}.\n")
            part(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    tend = os.path.abspath(a.tend)
    if a.services_only:
        import services
        return alone("several services", lambda work: services.report(
            tend, os.path.abspath(a.up_bin), os.path.abspath(a.lines_bin), work, q))
    if a.only == "output":
        return alone("output", lambda work: print_output(tend, os.path.abspath(a.lines_bin), work, q))
    if a.only == "start":
        return alone("start-up", lambda work: print_startup(Peers(tend, work), 200 if q else 1000))
    rounds = {"rss": 3 if q else 7, "start": 20 if q else 100, "sig": 5 if q else 30, "reap": 1 if q else 5,
              "wake": 5 if q else 30, "updates": 40 if q else 200, "burst": 30, "cost": 200 if q else 1000,
              "scale": 20 if q else 100, "hash": 10 if q else 30, "http": 100 if q else 1000, "check": 20 if q else 100,
              "restarts": 3 if q else 10}
    work = tempfile.mkdtemp(prefix="tend-bench-")
    try:
        peers = Peers(tend, work)
        print(f"# Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        print(f"Machine: {machine()}. tend {subprocess.run([tend, '--version'], capture_output=True, text=True).stdout.strip()}, "
              f"static build. Peers from Debian: tini-static, dumb-init, catatonit, inotify-tools, nginx.\n")
        sys.stdout.flush()

        print("## Init cost\n")
        sizes = binary_sizes(peers)
        rss, anon = idle_rss(peers, rounds["rss"])
        # The plain inits alternate among themselves; "tend, 3 watches" runs
        # apart, after them: its slower start perturbs whichever init follows.
        start, start_cpu = startup(peers, rounds["start"], only=PLAIN)
        watched, watched_cpu = startup(peers, rounds["start"], only=("tend, 3 watches",))
        start["tend, 3 watches"] = watched["tend, 3 watches"]
        start_cpu["tend, 3 watches"] = watched_cpu["tend, 3 watches"]
        usr1, term, gone = signal_latency(peers, rounds["sig"], one_cpu=True)
        usr1_free, term_free, _ = signal_latency(peers, rounds["sig"])
        wake = idle_wakeups(peers, rounds["wake"])
        base = statistics.median(start["no init"])
        base_cpu = statistics.median(start_cpu["no init"])
        overhead = {n: [t - base for t in v] for n, v in start.items()}
        overhead_cpu = {n: [t - base_cpu for t in v] for n, v in start_cpu.items()}
        print(f"Medians, with the range over rounds in brackets; idle RSS over {rounds['rss']} rounds, start-up over "
              f"{rounds['start']}, signals over {rounds['sig']} (SIGUSR1 ten times in each), wake-ups over one {rounds['wake']} s window. "
              "Start-up is `unshare --pid --fork INIT true` minus the same without an init: its wall time, and "
              "the CPU time of every process in it. Signals: with the sender, the init and the service on one "
              "CPU (the init's own work), and left to the scheduler (free; a wake-up across CPUs adds about "
              "40 us, whichever init it is).\n")
        print("| | static binary | idle RSS of PID 1 (kB) | of which private (kB) | start-up overhead, wall (us) | "
              "start-up overhead, CPU (us) | SIGUSR1 to the service, one CPU (us) | SIGTERM to the service, "
              "one CPU (us) | SIGUSR1, free (us) | SIGTERM, free (us) | SIGTERM to PID 1 gone (us) | "
              "wake-ups when idle |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        size_of = {n: (s, k) for n, s, k in sizes}
        for name, _ in peers.inits:
            key = "tend" if name.startswith("tend") else name
            size = f"{size_of[key][0] / 1024:.0f} KiB, {size_of[key][1]}" if key in size_of else "-"
            wall = med_spread(overhead[name]) if name != "no init" else f"0 (baseline: {base:.0f} us)"
            cpu = med_spread(overhead_cpu[name]) if name != "no init" else f"0 (baseline: {base_cpu:.0f} us)"
            print(f"| {name} | {size} | {med_spread(rss[name])} | {med_spread(anon[name])} | {wall} | {cpu} | "
                  f"{med_spread(usr1[name])} | {med_spread(term[name])} | {med_spread(usr1_free[name])} | "
                  f"{med_spread(term_free[name])} | {med_spread(gone[name])} | {wake[name]} |")
        print()
        sys.stdout.flush()

        print("## Reaping 10,000 orphans\n")
        reap = reaping(peers, a.orphans_bin, 10000, rounds["reap"])
        print(f"{rounds['reap']} rounds. PID 1's CPU is every thread's time on a CPU (`schedstat`) while the "
              "orphans were made and reaped; wake-ups are its time slices meanwhile.\n")
        print("| | time to create them (ms) | all reaped after (ms) | most zombies seen at once | "
              "PID 1's CPU (ms) | per orphan (us) | PID 1's wake-ups |")
        print("|---|---|---|---|---|---|---|")
        reap_cpu = {}
        for name, _ in peers.inits:
            r = reap[name]
            done = [d for _, d, _, _, _ in r]
            never = any(d < 0 for d in done)
            reap_cpu[name] = [c / 1000 for _, _, _, c, _ in r]
            print(f"| {name} | {med_spread([c for c, _, _, _, _ in r])} | "
                  f"{'never (nothing reaps them)' if never else med_spread(done)} | {max(m for _, _, m, _, _ in r)} | "
                  f"{med_spread(reap_cpu[name])} | {med_spread([c / 10000 for _, _, _, c, _ in r], '{:.1f}')} | "
                  f"{med_spread([w for _, _, _, _, w in r])} |")
        print()
        sys.stdout.flush()

        print("## Reload: the kubelet's `..data` rename to the service's SIGHUP\n")
        results = {}
        for name in ("tend", "inotifywait -m", "readlink loop"):
            results[name] = reload_run(name, tend, work, rounds["updates"], rounds["burst"])
        best50 = min(statistics.median(r["lat"]) for r in results.values() if r["lat"])
        print(f"{rounds['updates']} updates, one at a time; then a burst of {rounds['burst']} back to back.\n")
        print("| | p50 (us) | p99 (us) | p10-p90 (us) | missed | stale | extra | burst: reloads | burst: last saw the last update |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            lat = r["lat"]
            p50 = pct(lat, 50) if lat else None
            cells = (f"{p50:.0f} ({ratio(p50, best50)})", f"{pct(lat, 99):.0f}", f"{pct(lat, 10):.0f}-{pct(lat, 90):.0f}") \
                if lat else ("n/a", "n/a", "n/a")
            print(f"| {name} | {' | '.join(cells)} | {r['missed']} | {r['stale']} | {r['extra']} | "
                  f"{r['burst_reloads']} | {'yes' if r['burst_last'] == 'b' + str(r['burst_n']) else 'no (' + str(r['burst_last']) + ')'} |")
        print()
        cost = tend_cost(tend, work, rounds["cost"])
        print(f"tend's own cost over {cost['updates']} updates ({cost['ok']} reloads seen): "
              f"{cost['cpu_us']:.0f} us of CPU per reload; RSS {cost['idle']} kB idle, peak {cost['hwm']} kB.\n")
        sys.stdout.flush()

        print("## A reload with a real check: `nginx -t`\n")
        chk = reload_with_check(tend, work, rounds["check"])
        c50, a50 = pct(chk["lat"], 50), pct(chk["alone"], 50)
        print(f"{chk['updates']} updates of an nginx.conf in a kubelet volume, each checked with `nginx -t` before "
              "tend sends SIGHUP; after each, the same `nginx -t` run alone (fork, exec and wait from Python).\n")
        print("| | p50 (us) | p90 (us) | reloads |")
        print("|---|---|---|---|")
        print(f"| ..data rename to SIGHUP, through `nginx -t` | {c50:.0f} ({ratio(c50, a50)}) | {pct(chk['lat'], 90):.0f} | "
              f"{len(chk['lat'])} of {chk['updates']} |")
        print(f"| `nginx -t` alone | {a50:.0f} (1.00x) | {pct(chk['alone'], 90):.0f} | |")
        print(f"\ntend's part of a checked reload: {c50 - a50:.0f} us at the median.\n")
        sys.stdout.flush()

        print("## Many watches, many files\n")
        sc = scale(tend, work, 100, 10000, rounds["scale"])
        one = sc["1 watch, 1 file"]
        print("Idle RSS once the first scans are done; start-up until the service runs (tend starts it after the "
              "first scan); reload latency of one file of the first watch (for 10,000 files, every update "
              "rewrites them all, as the kubelet does, and tend hashes them all again).\n")
        print("| | idle RSS (kB) | private (kB) | private per file or watch (bytes) | start-up to the service (ms) | "
              "reload p50 (us) | reloads |")
        print("|---|---|---|---|---|---|---|")
        for label, r in sc.items():
            n = max(r["files"], r["watches"])
            per = f"{(r['anon'] - one['anon']) * 1024 / (n - 1):.0f}" if n > 1 else "-"
            p50 = pct(r["lat"], 50) if r["lat"] else None
            print(f"| {label} | {r['rss']} ({ratio(r['rss'], one['rss'])}) | {r['anon']} ({ratio(r['anon'], one['anon'])}) | "
                  f"{per} | {r['start'] * 1000:.0f} ({ratio(r['start'], one['start'])}) | "
                  f"{f'{p50:.0f} ({ratio(p50, pct(one[chr(108) + chr(97) + chr(116)], 50))})' if p50 else 'n/a'} | "
                  f"{len(r['lat'])} |")
        print()
        sys.stdout.flush()

        print("## The HTTP endpoint: `[http] listen`\n")
        hc = http_cost(tend, work, rounds["http"], rounds["hash"])
        without, withh = hc["without [http]"], hc["with [http]"]
        print(f"tend with one watch, without and with `[http] listen`. {rounds['http']} requests each of "
              "`GET /metrics` and `GET /ready`, one after another, each on a new connection from Python "
              "(as a probe or a scrape makes them); then SIGUSR1 sent to tend "
              f"{rounds['hash']} times, 30 ms apart, with no client and with a client scraping /metrics "
              "without pause.\n")
        print("| | idle RSS (kB) | private (kB) | RSS / peak after the requests (kB) |")
        print("|---|---|---|---|")
        print(f"| without [http] | {without['idle'][0]} (1.00x) | {without['idle'][1]} (1.00x) | - |")
        print(f"| with [http] | {withh['idle'][0]} ({ratio(withh['idle'][0], without['idle'][0])}) | "
              f"{withh['idle'][1]} ({ratio(withh['idle'][1], without['idle'][1])}) | "
              f"{withh['after'][0]} / {withh['after'][1]} |\n")
        print("| | p50 (us) | p99 (us) |")
        print("|---|---|---|")
        print(f"| GET /metrics, connect to last byte | {pct(withh['metrics'], 50):.0f} | "
              f"{pct(withh['metrics'], 99):.0f} |")
        print(f"| GET /ready, connect to last byte | {pct(withh['ready'], 50):.0f} | {pct(withh['ready'], 99):.0f} |")
        q50, b50 = pct(withh["quiet"], 50), pct(withh["busy"], 50)
        print(f"| SIGUSR1 to the service, no client | {q50:.0f} (1.00x) | {pct(withh['quiet'], 99):.0f} |")
        print(f"| SIGUSR1 to the service, /metrics scraped without pause | {b50:.0f} ({ratio(b50, q50)}) | "
              f"{pct(withh['busy'], 99):.0f} |\n")
        print(f"tend's CPU per request: {withh['cpu_us']:.0f} us.\n")
        sys.stdout.flush()

        print("## Signals while a 2 GB file is fingerprinted\n")
        h = signal_while_hashing(tend, work, rounds["hash"])
        i50, b50 = pct(h["idle"], 50), pct(h["busy"], 50)
        print(f"A 2 GiB file appears in a watched directory; tend's watcher thread hashes it (the scan took "
              f"{h['scan_s']:.1f} s, tend used {h['busy_cpu']:.2f} CPUs meanwhile) while SIGUSR1 is sent to tend "
              f"{rounds['hash']} times, 30 ms apart. The same before the file appears is the baseline.\n")
        print("| | SIGUSR1 to the service p50 (us) | max (us) |")
        print("|---|---|---|")
        print(f"| tend idle | {i50:.0f} (1.00x) | {max(h['idle']):.0f} |")
        print(f"| tend hashing 2 GiB | {b50:.0f} ({ratio(b50, i50)}) | {max(h['busy']):.0f} |\n")
        sys.stdout.flush()

        print_output(tend, os.path.abspath(a.lines_bin), work, q)

        import services
        services.report(tend, os.path.abspath(a.up_bin), os.path.abspath(a.lines_bin), work, q)

        print("## Restarts: the gap a client sees\n")
        rg = restart_gap(tend, work, rounds["restarts"])
        own = rg["own port, stop-start"]["gap_ms"]
        print(f"`examples/zero-downtime/server.py` restarted {rounds['restarts']} times by tend (a config change, "
              "`on_change = \"restart\"`) under one client making a new connection every 2 ms. The gap is the "
              "longest time from a request that failed or waited to the next answer.\n")
        print("| | requests | failed | refused | longest gap (ms) | p50 latency (ms) |")
        print("|---|---|---|---|---|---|")
        for label, r in rg.items():
            print(f"| {label} | {r['requests']} | {r['failed']} | {r['refused']} | {r['gap_ms']:.1f} "
                  f"({ratio(r['gap_ms'], own)}) | {r['p50_ms']:.2f} |")
        print()

        tl = results["tend"]["lat"]
        rl = results["readlink loop"]["lat"]
        wl = results["inotifywait -m"]["lat"]
        print("## Goals\n")
        print("Each a ratio to the best of tini, dumb-init and catatonit in this run (medians).\n")
        bw, bw_n = best_peer(overhead)
        bc, bc_n = best_peer(overhead_cpu)
        bu, bu_n = best_peer(usr1)
        bt, bt_n = best_peer(term)
        bg, bg_n = best_peer(gone)
        br, br_n = best_peer(reap_cpu)
        med = statistics.median
        tini_rss = med(rss["tini"])
        checks = [
            ("start-up overhead, wall, <= 1.0x", med(overhead["tend"]) / bw, bw_n),
            ("start-up overhead, CPU, <= 1.0x", med(overhead_cpu["tend"]) / bc, bc_n),
            ("SIGUSR1 forwarding (one CPU) <= 1.0x", med(usr1["tend"]) / bu, bu_n),
            ("SIGTERM forwarding (one CPU) <= 1.0x", med(term["tend"]) / bt, bt_n),
            ("SIGTERM to PID 1 gone <= 1.0x", med(gone["tend"]) / bg, bg_n),
            ("PID 1's CPU per reaped orphan <= 1.0x", med(reap_cpu["tend"]) / br, br_n),
            ("idle RSS <= 1.5x tini's", med(rss["tend"]) / tini_rss, "tini"),
            ("..data swap to SIGHUP p50 <= 1.0x the inotifywait -m watcher", pct(tl, 50) / pct(wl, 50),
             "inotifywait -m"),
        ]
        print("| goal | met | tend / best | best |")
        print("|---|---|---|---|")
        for what, r, who in checks:
            print(f"| {what} | {'yes' if r <= float(what.split('<= ')[1].split('x')[0]) else 'NO'} | {r:.2f}x | {who} |")
        mib = size_of["tend"][0] / 1048576
        print(f"| static binary <= 1.5 MiB | {'yes' if mib <= 1.5 else 'NO'} | {mib:.2f} MiB | "
              f"tini-static {size_of['tini'][0] / 1048576:.2f} MiB |")
        print()
        p99_vs_loop = f"{pct(rl, 99) / pct(tl, 99):.0f}x better than the readlink loop's" if rl else \
            "the readlink loop reloaded nothing"
        print(f"Also: reload p99 {pct(tl, 99):.0f} us, {p99_vs_loop}; missed {results['tend']['missed']}, "
              f"stale {results['tend']['stale']}, extra {results['tend']['extra']}; wake-ups when idle "
              f"{wake['tend']} ({wake['tend, 3 watches']} with 3 watches).")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
