"""What several services cost: start-up until every service runs and until
tend is ready, with 1, 2 and 5 trivial services (`bench/up.c`) against tini
with one; tend's memory with 1 and 5; signals through tend while 5 services
write without pause. Part of bench.py's run (`bench/run`), or alone with
`bench/run --services-only`.
"""
import os
import signal
import statistics
import subprocess
import sys
import time

import bench as b

COUNTS = (1, 2, 5)


def services_toml(up_bin, n, ready, extra=""):
    """n [[service]] tables running `up`, and a readiness file."""
    text = f'[readiness]\nfile = "{ready}"\n\n'
    for i in range(n):
        text += f'[[service]]\nname = "s{i}"\ncommand = ["{up_bin}"]\n{extra}\n'
    return text


def read_ups(fd, n, timeout=10):
    """The CLOCK_MONOTONIC ns of the last of `n` "up <ns>" lines on `fd`."""
    seen, rest, last = 0, b"", None
    deadline = time.monotonic() + timeout
    while seen < n and time.monotonic() < deadline:
        if not b.select.select([fd], [], [], 1)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            # "up NS", or "s0 | up NS" through tend (several services).
            at = line.find(b"up ")
            if at >= 0:
                seen += 1
                last = max(last or 0, int(line[at + 3:].split()[0]))
    return last if seen == n else None


def wait_for_file(path, timeout=10):
    """Polls for `path` every 100 us; monotonic ns when it was seen."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0001)
    return time.monotonic_ns()


def start_costs(tend, up_bin, work, rounds):
    """Per setup, per round, alternating: ms from launching `unshare --pid
    --fork INIT` until the last service wrote its "up" line ("running"),
    until tend's readiness file exists ("ready"), and PID 1's VmRSS and
    RssAnon (kB) 0.3 s later."""
    setups = [("tini, 1 process", ["/usr/bin/tini-static", "--", up_bin], 1, None)]
    for n in COUNTS:
        ready = os.path.join(work, f"ready-{n}")
        cfg = os.path.join(work, f"services-{n}.toml")
        with open(cfg, "w") as f:
            f.write(services_toml(up_bin, n, ready))
        setups.append((f"tend, {n} service{'s' if n > 1 else ''}", [tend, "--config", cfg], n, ready))
    out = {name: {"running": [], "ready": [], "rss": [], "anon": []} for name, _, _, _ in setups}
    for _ in range(rounds):
        for name, argv, n, ready in setups:
            if ready and os.path.exists(ready):
                os.unlink(ready)
            r, w = os.pipe()
            t0 = time.monotonic_ns()
            p = b.unshare(argv, stdout=w, stderr=subprocess.DEVNULL, env=b.env_quiet())
            os.close(w)
            try:
                last = read_ups(r, n)
                assert last is not None, f"{name}: not every service ran"
                out[name]["running"].append((last - t0) / 1e6)
                if ready:
                    seen = wait_for_file(ready)
                    assert seen is not None, f"{name}: never ready"
                    out[name]["ready"].append((seen - t0) / 1e6)
                time.sleep(0.3)
                pid = b.pid1_of(p)
                out[name]["rss"].append(b.status_field(pid, "VmRSS"))
                out[name]["anon"].append(b.status_field(pid, "RssAnon"))
            finally:
                b.stop(p)
                os.close(r)
    return out


def flood_signals(tend, lines_bin, work, signals):
    """SIGUSR1 sent to tend until the service (recorder.py, reporting on a
    pipe of its own) has it, 30 ms apart, with tend's stdout read by `cat`:
    alone; beside 5 services writing lines without pause through tend
    (`output = "prefix"`); and beside the same 5 writing straight into the
    pipe (`output = "inherit"`), which costs the machine the same writing
    and reading without tend's part."""
    cases = (("quiet", 0, None), ("5 services flood, through tend", 5, "prefix"),
             ("5 services flood, straight to the pipe", 5, "inherit"))
    out = {}
    for label, floods, mode in cases:
        rec_r, rec_w = os.pipe()
        cfg = os.path.join(work, "flood-signals.toml")
        with open(cfg, "w") as f:
            rec = ", ".join(f'"{a}"' for a in b.RECORDER + ["/dev/null"])
            f.write(f'[[service]]\nname = "app"\ncommand = [{rec}]\nenv = {{ RECORDER_FD = "{rec_w}" }}\n\n')
            for i in range(floods):
                f.write(f'[[service]]\nname = "flood{i}"\ncommand = ["{lines_bin}", "flood"]\n'
                        f'output = "{mode}"\n\n')
        r, w = os.pipe()
        p = b.unshare([tend, "--config", cfg], stdout=w, stderr=w, env=b.env_quiet(), pass_fds=(rec_w,))
        os.close(w)
        os.close(rec_w)
        cat = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
        rec = os.fdopen(rec_r, "rb", buffering=0)
        lat = []
        try:
            assert b.read_line(rec, 10).startswith("ready")
            pid = b.pid1_of(p)
            time.sleep(1.0)
            for _ in range(signals):
                time.sleep(0.03)
                t0 = time.monotonic_ns()
                os.kill(pid, signal.SIGUSR1)
                line = b.read_line(rec, 5)
                if line and line.startswith("USR1 "):
                    lat.append((int(line.split()[1]) - t0) / 1000)
            out[label] = lat
        finally:
            b.stop(p)
            cat.kill()
            cat.wait()
            rec.close()
            os.close(r)
    return out


def report(tend, up_bin, lines_bin, work, quick):
    rounds = 5 if quick else 30
    signals = 10 if quick else 30
    med = statistics.median
    print("## Several services: start-up, memory, signals under output\n")
    sc = start_costs(tend, up_bin, work, rounds)
    tini = sc["tini, 1 process"]
    t_run = med(tini["running"])
    print(f"{rounds} rounds, alternating. Each service is `bench/up.c`, which writes `up` and its "
          "CLOCK_MONOTONIC time on stdout once it runs, then waits. *Running* is the time from launching "
          "`unshare --pid --fork INIT` until the last service wrote that line; *ready* until tend's "
          "`[readiness] file` exists (polled every 100 us; without `notify` or `ready_check` a service is "
          "ready once started). Memory is PID 1's, 0.3 s later. Ratios to tini starting one process.\n")
    print("| | running (ms) | ready (ms) | idle RSS of PID 1 (kB) | of which private (kB) |")
    print("|---|---|---|---|---|")
    for name, r in sc.items():
        run = med(r["running"])
        ready = f"{b.med_spread(r['ready'], '{:.2f}')}" if r["ready"] else "-"
        print(f"| {name} | {b.med_spread(r['running'], '{:.2f}')} ({b.ratio(run, t_run)}) | {ready} | "
              f"{b.med_spread(r['rss'])} ({b.ratio(med(r['rss']), med(tini['rss']))}) | "
              f"{b.med_spread(r['anon'])} ({b.ratio(med(r['anon']), med(tini['anon']))}) |")
    one = med(sc["tend, 1 service"]["running"])
    five = med(sc["tend, 5 services"]["running"])
    print(f"\nEach service after the first adds {(five - one) / 4:.2f} ms until it runs "
          f"(1 to 5 services); each adds {(med(sc['tend, 5 services']['anon']) - med(sc['tend, 1 service']['anon'])) / 4:.0f} kB "
          "of tend's private memory.\n")
    sys.stdout.flush()
    fs = flood_signals(tend, lines_bin, work, signals)
    print(f"SIGUSR1 sent to tend {signals} times, 30 ms apart, until the service has it; tend's stdout and "
          "stderr are one pipe read by `cat`. Five more services write 100-byte lines without pause "
          "(`bench/lines.c flood`), through tend, or straight into the same pipe, which loads the two CPUs "
          "the same way without tend's part.\n")
    print("| | p50 (us) | p90 (us) | max (us) | signals |")
    print("|---|---|---|---|---|")
    base = b.pct(fs["quiet"], 50)
    for label, v in fs.items():
        p50 = b.pct(v, 50)
        print(f"| {label} | {p50:.0f} ({b.ratio(p50, base)}) | {b.pct(v, 90):.0f} | {max(v):.0f} | {len(v)} |")
    through = b.pct(fs["5 services flood, through tend"], 50)
    straight = b.pct(fs["5 services flood, straight to the pipe"], 50)
    print(f"\nThrough tend against straight to the pipe: {through / straight:.2f}x at the median.\n")
    sys.stdout.flush()
    return {"start_1_vs_tini": one / t_run, "start_5_vs_1": five / one,
            "rss_5_vs_1": med(sc["tend, 5 services"]["rss"]) / med(sc["tend, 1 service"]["rss"]),
            "flood_vs_straight": through / straight}
