#!/usr/bin/env python3
"""What the static binary pays for: its code by crate and by tend's own
modules, and which of it is resident in an idle tend. Prints Markdown.

    bench/size                   (builds, then runs this; root for the RSS part)

Input: the static release build with symbols (the same build as
Dockerfile.example, `strip = false`). Every symbol of `nm -S -C` is given
to an owner: a C symbol is glibc's (or libgcc's), `main` is tend's (its
`main.rs`, with what LTO inlined into it); a Rust symbol belongs to the
first crate named in it that is not core, alloc or std, so that generic
code is counted where it comes from: `<toml::de::ValueDeserializer as
serde::Deserializer>::deserialize_struct`, instantiated for tend's config
types, is toml's, and `drop_in_place<tend::config::Config>` is tend's.
What names no other crate is std's (with core and alloc).

The resident part: an idle `tend -- sleep 1000` as PID 1 of a new PID
namespace; /proc/PID/pagemap says which pages of the binary are mapped,
and each mapped page is split among the symbols in it.
"""
import argparse
import bisect
import collections
import os
import re
import struct
import subprocess
import sys
import time

FAMILIES = {
    "toml": ["toml", "toml_parser", "toml_datetime", "serde_spanned", "winnow"],
    "toml_writer": ["toml_writer"],
    "serde": ["serde", "serde_core", "serde_derive"],
    "serde_json": ["serde_json", "itoa", "zmij", "ryu"],
    "sha2": ["sha2", "digest", "block_buffer", "hybrid_array", "crypto_common", "cpufeatures", "typenum",
             "const_oid"],
    "tracing": ["tracing", "tracing_core", "once_cell", "pin_project_lite"],
    "nix": ["nix", "memoffset", "bitflags", "cfg_if"],
    "anyhow": ["anyhow"],
    "memchr": ["memchr"],
    "httparse": ["httparse"],
    "shlex": ["shlex"],
    "libc": ["libc"],
}
CRATE = {c: fam for fam, cs in FAMILIES.items() for c in cs}
# std's backtrace printing, which its default panic hook reaches.
SYMBOLIZER = {"gimli", "addr2line", "miniz_oxide", "rustc_demangle", "adler2", "object", "backtrace_rs"}
BACKTRACE = "std: backtrace printing (gimli, addr2line, miniz_oxide, rustc_demangle)"

# tend's modules, by what they are there for.
FEATURES = [
    ("the init: signals, spawning, reaping, the loop, the command line",
     ["main", "supervisor", "core", "core::protocol", "core::service", "core::status", "core::metrics",
      "core::service_entry", "signals", "process", "process::spawn", "process::reaper", "process::job", "cli",
      "time", "run", "log", "ratelimit", "sockets", "users"]),
    ("supervisor.toml: parsing, checks, check-config", ["config", "text"]),
    ("watches and the reload pipeline", ["watch", "core::watch", "hfa"]),
    ("output through tend", ["output"]),
    ("status file, probe, status command", ["status", "probe", "show"]),
    ("HTTP server and the HTTP action", ["http_server", "http_action"]),
    ("control socket (tend signal, tend restart)", ["control", "core::control"]),
    ("sd_notify socket", ["notify"]),
    ("env_from files", ["envfile"]),
]


def owner(name):
    """(crate family, tend module or None) of a demangled symbol."""
    if "::" not in name:
        return ("tend", "main") if name == "main" else ("glibc", None)
    for tok in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)::", name):
        if tok == "tend":
            m = re.search(r"tend::([a-z_]+)(?:::([a-z_]+))?", name)
            mod = m.group(1)
            if m.group(2) and mod in ("core", "config", "watch", "output", "process", "control"):
                sub = f"{mod}::{m.group(2)}"
                mod = sub if any(sub in mods for _, mods in FEATURES) else mod
            return "tend", mod
        if tok in CRATE:
            return CRATE[tok], None
        if tok in SYMBOLIZER:
            return BACKTRACE, None
    return "std", None


def feature_of(mod):
    for label, mods in FEATURES:
        if mod in mods:
            return label
    return f"other ({mod})"


def symbols(binary):
    """(address, size, demangled name) of every sized code or data symbol."""
    out = subprocess.run(["nm", "-S", "-C", "--defined-only", binary], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[2].lower() not in "tdbrvw":
            continue
        addr, size = int(parts[0], 16), int(parts[1], 16)
        if size:
            syms[addr] = (addr, size, parts[3])  # aliases at one address count once
    return sorted(syms.values())


def sections(binary):
    """{name: (address, size)} of the loaded sections."""
    out = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
    secs = {}
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)", line)
        if m and "A" in m.group(4):
            secs[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16))
    return secs


def resident_pages(binary):
    """Addresses of the pages of `binary` mapped in an idle tend, PID 1 of
    a new PID namespace, and that tend's VmRSS, RssFile and RssAnon."""
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", binary, "--",
                          "sleep", "1000"], env={**os.environ, "TEND_LOG": "warn"}, stderr=subprocess.DEVNULL)
    try:
        pid = None
        for _ in range(500):
            try:
                with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                    kids = f.read().split()
                if kids:
                    pid = int(kids[0])
                    break
            except OSError:
                pass
            time.sleep(0.01)
        assert pid, "tend did not start"
        time.sleep(0.5)
        real = os.path.realpath(binary)
        pages = set()
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
            for line in maps:
                f = line.split()
                if len(f) < 6 or os.path.realpath(f[5]) != real:
                    continue
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                pm.seek(lo // 4096 * 8)
                data = pm.read((hi - lo) // 4096 * 8)
                for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)):
                    if entry >> 63:
                        pages.add(lo + i * 4096)
        status = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssFile", "RssAnon"):
                    status[k] = int(v.split()[0])
        return pages, status
    finally:
        p.kill()
        p.wait()


def kib(n):
    return f"{n / 1024:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", help="the static build with symbols")
    ap.add_argument("--stripped", help="the shipped (stripped) build, for its size")
    ap.add_argument("--no-rss", action="store_true", help="sizes only (no root needed)")
    a = ap.parse_args()
    syms = symbols(a.binary)
    secs = sections(a.binary)
    text_lo, text_size = secs[".text"]
    in_text = [s for s in syms if text_lo <= s[0] < text_lo + text_size]
    pages, status = (set(), {}) if a.no_rss else resident_pages(a.binary)

    by_crate = collections.Counter()
    by_crate_res = collections.Counter()
    by_mod = collections.Counter()
    by_mod_res = collections.Counter()
    for addr, size, name in in_text:
        crate, mod = owner(name)
        res = 0
        page = addr & ~4095
        while page < addr + size:
            if page in pages:
                res += min(addr + size, page + 4096) - max(addr, page)
            page += 4096
        by_crate[crate] += size
        by_crate_res[crate] += res
        if crate == "tend":
            by_mod[feature_of(mod)] += size
            by_mod_res[feature_of(mod)] += res
    counted = sum(by_crate.values())

    shipped = os.path.getsize(a.stripped) if a.stripped else None
    if shipped:
        print(f"Static binary: {shipped:,} bytes ({shipped / 1048576:.2f} MiB).\n")
    print("Segments of the binary, and how much of each is resident in an idle tend:\n")
    print("| section | size (KiB) | resident (KiB) |")
    print("|---|---|---|")
    for name in (".text", ".rodata", ".eh_frame", ".eh_frame_hdr", ".data.rel.ro", ".data", ".bss"):
        if name in secs:
            lo, size = secs[name]
            res = sum(min(lo + size, p + 4096) - max(lo, p) for p in pages if p < lo + size and p + 4096 > lo)
            print(f"| {name} | {kib(size)} | {kib(res) if pages else '-'} |")
    print()
    print(f"`.text` by crate (generic code counted with the crate it comes from; {kib(text_size - counted)} KiB "
          "of padding and unsized symbols left out):\n")
    print("| crate | code (KiB) | share of .text | resident when idle (KiB) |")
    print("|---|---|---|---|")
    for crate, size in by_crate.most_common():
        print(f"| {crate} | {kib(size)} | {size / text_size:.1%} | {kib(by_crate_res[crate]) if pages else '-'} |")
    absent = [fam for fam in FAMILIES if fam not in by_crate]
    if absent:
        print(f"| {', '.join(absent)} | 0 (inlined into their callers, or unused) | | |")
    print()
    print("tend's own code by what it is there for (its `tend::` modules, `main` with what LTO "
          "inlined into it):\n")
    print("| part | code (KiB) | resident when idle (KiB) |")
    print("|---|---|---|")
    for label, size in by_mod.most_common():
        print(f"| {label} | {kib(size)} | {kib(by_mod_res[label]) if pages else '-'} |")
    print()
    if status:
        print(f"Idle `tend -- sleep 1000`: VmRSS {status['VmRSS']} kB, of which RssFile {status['RssFile']} kB "
              f"(the binary's pages: {len(pages) * 4} kB of them) and RssAnon {status['RssAnon']} kB.\n")


if __name__ == "__main__":
    sys.exit(main())
