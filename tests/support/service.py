#!/usr/bin/env python3
"""The service that tend's integration tests run: it writes what happens to
it into a log, one line per event, so a test can see what tend did.

Lines (TAG is "service", or --tag, then "grandchild" or "daemon"):
    service env NAME=<value, with \\ and newlines escaped>   (or: service env NAME unset)
    TAG start pid=<pid> pgid=<pgid> t=<monotonic>[ config=<text>]
    TAG sig <NAME> t=<monotonic>[ config=<text of --config, or MISSING>]
    TAG exit <code>
    service orphans <N>      (the N orphans of --orphans are all made)
"""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--log", required=True)
p.add_argument("--tag", default="service", help="the first word of each log line (several services, one log)")
p.add_argument("--config", help="file whose content is logged at start and on every signal")
p.add_argument("--env", action="append", default=[], metavar="NAME",
               help="log this environment variable at start, before the start line (repeatable)")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--term-exit", type=int, default=0, help="exit code on SIGTERM")
p.add_argument("--exit-after", type=float, help="exit by itself after N seconds")
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--fail-first", help="marker file: exit 1 if it does not exist yet (and create it)")
p.add_argument("--orphans", type=int, default=0, help="leave N orphans that exit after --orphan-sleep")
p.add_argument("--orphan-sleep", type=float, default=0.05)
p.add_argument("--orphans-hold", action="store_true",
               help="the orphans live until the service gets SIGUSR1 (instead of --orphan-sleep)")
p.add_argument("--grandchild", action="store_true", help="fork a logging child in the same process group")
p.add_argument("--daemon", choices=["term", "ignore-term"],
               help="leave a logging daemon that escaped the process group (setsid)")
args = p.parse_args()
tag = args.tag


def log(line):
    with open(args.log, "a") as f:
        f.write(f"{tag} {line}\n")


def config_text():
    if not args.config:
        return ""
    try:
        with open(args.config) as f:
            return " config=" + f.read().strip().replace("\n", "\\n")
    except OSError:
        return " config=MISSING"


def signal_name(signum):
    """The name tend logs: SIGHUP; realtime signals as `kill -l` names them
    (SIGRTMIN, SIGRTMIN+2, ..., SIGRTMAX-1, SIGRTMAX)."""
    low, high = signal.SIGRTMIN, signal.SIGRTMAX
    if not low <= signum <= high:
        return signal.Signals(signum).name
    if signum == low:
        return "SIGRTMIN"
    if signum == high:
        return "SIGRTMAX"
    if signum - low <= (high - low) // 2:
        return f"SIGRTMIN+{signum - low}"
    return f"SIGRTMAX-{high - signum}"


# The write end of the pipe the orphans of --orphans-hold wait on: they
# exit once it is closed.
hold = None


def on_signal(signum, _frame):
    global hold
    log(f"sig {signal_name(signum)} t={time.monotonic():.6f}{config_text()}")
    if signum == signal.SIGUSR1 and hold is not None:
        os.close(hold[1])
        hold = None
    if signum == signal.SIGTERM and not (args.ignore_term or tag == "daemon" and args.daemon == "ignore-term"):
        log(f"exit {args.term_exit}")
        sys.exit(args.term_exit)


def handle_everything():
    for s in signal.valid_signals():
        if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        signal.signal(s, on_signal)


def idle_forever():
    while True:
        signal.pause()


handle_everything()
for name in args.env:
    value = os.environ.get(name)
    if value is None:
        log(f"env {name} unset")
    else:
        log("env {}={}".format(name, value.replace("\\", "\\\\").replace("\n", "\\n")))
log(f"start pid={os.getpid()} pgid={os.getpgrp()} t={time.monotonic():.6f}{config_text()}")

if args.fail_first and not os.path.exists(args.fail_first):
    open(args.fail_first, "w").close()
    log("exit 1")
    sys.exit(1)

if args.orphans_hold:
    hold = os.pipe()
for _ in range(args.orphans):
    # Double fork: the middle process exits at once, so the grandchild is
    # re-parented to the nearest subreaper (PID 1 in a container) before
    # waitpid() returns here.
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            if hold is not None:
                os.close(hold[1])
                os.read(hold[0], 1)  # end of file once the service lets go
            else:
                time.sleep(args.orphan_sleep)
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
if args.orphans:
    log(f"orphans {args.orphans}")

if args.grandchild and os.fork() == 0:
    tag = "grandchild"
    log(f"start pid={os.getpid()} pgid={os.getpgrp()}")
    idle_forever()

if args.daemon:
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            tag = "daemon"
            log(f"start pid={os.getpid()} pgid={os.getpgrp()}")
            os.write(w, b"x")
            idle_forever()
        os._exit(0)
    os.read(r, 1)  # the daemon is up and has logged its start

deadline = time.monotonic() + args.exit_after if args.exit_after is not None else None
while True:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            log(f"exit {args.exit_code}")
            sys.exit(args.exit_code)
        time.sleep(min(left, 0.05))
    else:
        signal.pause()
