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


def startup(peers, rounds):
    """Wall time of `unshare --pid --fork INIT true`, per peer, in us."""
    times = {name: [] for name, _ in peers.inits}
    for _ in range(rounds):
        for name, init in peers.inits:
            t0 = time.perf_counter_ns()
            subprocess.run(["unshare", "--pid", "--fork"] + init + ["true"], env=env_quiet(),
                           stderr=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter_ns() - t0) / 1000)
    return times


def signal_latency(peers, rounds):
    """SIGTERM sent to PID 1 until the service has it (sigwaitinfo), in us."""
    lat = {name: [] for name, _ in peers.inits}
    for _ in range(rounds):
        for name, init in peers.inits:
            p = unshare(init + RECORDER + ["/dev/null"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        bufsize=0, env=env_quiet())
            try:
                assert read_line(p.stdout, 10).startswith("ready")
                pid = pid1_of(p)
                time.sleep(0.05)
                t0 = time.monotonic_ns()
                os.kill(pid, signal.SIGTERM)
                line = read_line(p.stdout, 5)
                if line and line.startswith("TERM "):
                    lat[name].append((int(line.split()[1]) - t0) / 1000)
            finally:
                p.wait(10) if p.poll() is None else None
                if p.poll() is None:
                    stop(p)
    return lat


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
            created, done, most = out.decode().split()
            res[name].append((float(created), float(done), int(most)))
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


# ------------------------------------------------------------------ report

def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tend", required=True)
    ap.add_argument("--orphans-bin", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer rounds, for trying the harness")
    a = ap.parse_args()
    q = a.quick
    rounds = {"rss": 3 if q else 7, "start": 20 if q else 100, "sig": 5 if q else 30, "reap": 1 if q else 3,
              "wake": 5 if q else 30, "updates": 40 if q else 200, "burst": 30, "cost": 200 if q else 1000}
    work = tempfile.mkdtemp(prefix="tend-bench-")
    tend = os.path.abspath(a.tend)
    try:
        peers = Peers(tend, work)
        print(f"# Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        print(f"Machine: {machine()}. tend {subprocess.run([tend, '--version'], capture_output=True, text=True).stdout.strip()}, "
              f"static build. Peers from Debian: tini-static, dumb-init, catatonit, inotify-tools.\n")
        sys.stdout.flush()

        print("## Init cost\n")
        sizes = binary_sizes(peers)
        rss, anon = idle_rss(peers, rounds["rss"])
        start = startup(peers, rounds["start"])
        sig = signal_latency(peers, rounds["sig"])
        wake = idle_wakeups(peers, rounds["wake"])
        base = statistics.median(start["no init"])
        overhead = {n: [t - base for t in v] for n, v in start.items()}
        print(f"Medians, with the range over rounds in brackets; idle RSS over {rounds['rss']} rounds, start-up over "
              f"{rounds['start']}, signal latency over {rounds['sig']}, wake-ups over one {rounds['wake']} s window.\n")
        print("| | static binary | idle RSS of PID 1 (kB) | of which private (kB) | start-up overhead (us) | "
              "SIGTERM to the service's handler (us) | wake-ups when idle |")
        print("|---|---|---|---|---|---|---|")
        size_of = {n: (s, k) for n, s, k in sizes}
        for name, _ in peers.inits:
            key = "tend" if name.startswith("tend") else name
            size = f"{size_of[key][0] / 1024:.0f} KiB, {size_of[key][1]}" if key in size_of else "-"
            print(f"| {name} | {size} | {med_spread(rss[name])} | {med_spread(anon[name])} | "
                  f"{med_spread(overhead[name]) if name != 'no init' else '0 (baseline: ' + f'{base:.0f} us)'} | "
                  f"{med_spread(sig[name])} | {wake[name]} |")
        tini_rss = statistics.median(rss["tini"])
        tend_rss = statistics.median(rss["tend"])
        tini_over = statistics.median(overhead["tini"])
        tend_over = statistics.median(overhead["tend"])
        print(f"\nRatios: tend's idle RSS is tini's + {tend_rss - tini_rss:.0f} kB "
              f"({ratio(tend_rss, tini_rss)}); its start-up overhead is {ratio(tend_over, tini_over)} tini's; "
              f"its signal latency is {ratio(statistics.median(sig['tend']), statistics.median(sig['tini']))} tini's.\n")
        sys.stdout.flush()

        print("## Reaping 10,000 orphans\n")
        reap = reaping(peers, a.orphans_bin, 10000, rounds["reap"])
        print("| | time to create them (ms) | all reaped after (ms) | most zombies seen at once |")
        print("|---|---|---|---|")
        for name, _ in peers.inits:
            r = reap[name]
            done = [d for _, d, _ in r]
            never = any(d < 0 for d in done)
            print(f"| {name} | {med_spread([c for c, _, _ in r])} | "
                  f"{'never (nothing reaps them)' if never else med_spread(done)} | {max(m for _, _, m in r)} |")
        print()
        sys.stdout.flush()

        print(f"## Reload: the kubelet's `..data` rename to the service's SIGHUP\n")
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
        tl = results["tend"]["lat"]
        rl = results["readlink loop"]["lat"]
        wl = results["inotifywait -m"]["lat"]
        print("## Targets\n")
        checks = [
            ("reload p99 under 1 ms", pct(tl, 99) < 1000, f"{pct(tl, 99):.0f} us"),
            ("reload p50 within 1.2x of the inotifywait -m watcher", pct(tl, 50) <= 1.2 * pct(wl, 50),
             f"{pct(tl, 50) / pct(wl, 50):.2f}x"),
            ("reload p99 at least 10x better than the readlink loop",
             bool(rl) and pct(rl, 99) >= 10 * pct(tl, 99),
             f"{pct(rl, 99) / pct(tl, 99):.1f}x" if rl else "the loop reloaded nothing"),
            ("zero missed and zero extra reloads",
             results["tend"]["missed"] + results["tend"]["extra"] + results["tend"]["stale"] == 0,
             f"missed {results['tend']['missed']}, stale {results['tend']['stale']}, extra {results['tend']['extra']}"),
            ("idle wake-ups zero", wake["tend"] == 0 and wake["tend, 3 watches"] == 0,
             f"{wake['tend']} and {wake['tend, 3 watches']} with 3 watches"),
            ("idle RSS at most 1 MiB above tini's", tend_rss - tini_rss <= 1024, f"+{tend_rss - tini_rss:.0f} kB"),
            ("start-up overhead within 1.5x of tini's", tend_over <= 1.5 * tini_over, f"{tend_over / tini_over:.2f}x"),
            ("static binary under 3 MiB", size_of["tend"][0] < 3 * 1024 * 1024, f"{size_of['tend'][0] / 1048576:.2f} MiB"),
        ]
        print("| target | met | measured |")
        print("|---|---|---|")
        for what, met, value in checks:
            print(f"| {what} | {'yes' if met else 'NO'} | {value} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
