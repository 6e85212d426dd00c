#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target, from what tend's docs and
tests use: the TOML blocks of the README and docs/, examples/*/supervisor.toml, the
requests, answers, notify messages and env files of the tests.

    fuzz/seed.py DIR      # DIR/<target>/<sha1> for each seed

scripts/fuzz grows the committed corpora from these; `cargo fuzz cmin`
keeps them small. The input formats are described in each target."""

import hashlib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def configs():
    pages = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
    text = "".join(page.read_text() for page in pages)
    for block in re.findall(r"```toml\n(.*?)```", text, re.S):
        yield block.encode()
        # The reference block shows optional keys commented out.
        yield re.sub(r"^# ?(\w+ = )", r"\1", block, flags=re.M).encode()
    for path in sorted(ROOT.glob("examples/*/supervisor.toml")):
        yield path.read_bytes()


def durations():
    for d in ["500ms", "10s", "2m", "1h", "1.5s", "1m30s", "0.1s", "876000h",
              "0s", "1.000000001s", " 3s ", "90m"]:
        yield d.encode()


def signals():
    for s in ["SIGHUP", "hup", "SIGTERM", "term", "SIGUSR1", "usr2", "SIGKILL",
              "SIGQUIT", "SIGWINCH"]:
        yield s.encode()
    yield (15).to_bytes(4, "little") + (0).to_bytes(4, "little")
    yield (40).to_bytes(4, "little") + (-6 & 0xFFFFFFFF).to_bytes(4, "little")


ENV_FILES = [
    b"A=file\nB=file\nC=file\n",
    b"A=1\nexport TOKEN=hunter2\n",
    b"# comment\n\n  PORT=8080\r\nURL=http://x/?a=b=c\n",
    b"A=1\nB=\xff\n",
    b"A =1\n=x\n1ST=x\nno equals\n",
]


def env_dirs():
    """Flags byte (1: the kubelet's layout), then NUL-separated name and
    content pairs; a name's first byte is its kind (f, d, p, l)."""
    yield b"\x00" + b"\x00".join([b"fDB_PASSWORD", b"s3cret\n", b"ftls.crt",
                                  b"line 1\nline 2", b"fEMPTY", b"",
                                  b"f..hidden_by_kubelet_rule", b"x"])
    yield b"\x01" + b"\x00".join([b"fA", b"1", b"fNEW", b"added"])
    yield b"\x00" + b"\x00".join([b"fA", b"1", b"dsub", b""])
    yield b"\x00" + b"\x00".join([b"f1ST", b"x", b"fKEY", b"\xff"])
    yield b"\x00" + b"\x00".join([b"lLINK", b"target", b"ftarget", b"through a link",
                                  b"pFIFO", b""])


REQUESTS = [
    b"GET /ready HTTP/1.1\r\nHost: tend\r\nUser-Agent: kube-probe/1.31\r\n\r\n",
    b"GET /status HTTP/1.1\r\n\r\n",
    b"GET /metrics?x=1 HTTP/1.1\r\n\r\n",
    b"HEAD /metrics HTTP/1.1\r\n\r\n",
    b"GET /ready HTTP/7\r\n\r\n",
    b"GET /ready HTTP/1.0\r\n\r\n",
    b"GET /ready?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://10.1.2.3:9533/ready HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /ready HTTP/1.1\nHost: x\n\n",
    b"GET /ready HTTP/1.1\r\nContent-Length: 25\r\n\r\nGET /status HTTP/1.1\r\n\r\n",
    b"GET /ready HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /ready\xff HTTP/1.1\r\n\r\n",
    b"POST /ready HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"GET /nope HTTP/1.1\r\n\r\n",
    b"GET /ready HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(40)) + b"\r\n",
]

ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\n\r\n\nfailed to reload config: \x1b[31mbad\nmore\n",
    b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfail\r\n3\r\ned\n\r\n0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nnot yet up\r\n",
    b"HTTP/1.1 200",
]

NOTIFY = [
    b"READY=1",
    b"READY=1\nSTATUS=serving",
    b"STATUS=one",
    b"RELOADING=1\nMONOTONIC_USEC=1",
    b"STOPPING=1",
    b"READY=1\nSTATUS=Listening on :8080\nMAINPID=4\n",
    b"FDSTORE=1\nFDNAME=listener",
]


def seeds():
    yield "config", configs()
    yield "duration", durations()
    yield "signal", signals()
    yield "envfile", ENV_FILES
    yield "envdir", env_dirs()
    # One piece, and the same cut in three.
    yield "http_request", [b"\x00" + r for r in REQUESTS] + \
        [b"\x03\x10\x40\xa0" + r for r in REQUESTS[:4]]
    # POST, then HEAD and a reset; whole, then cut.
    yield "http_answer", [b"\x00\x00" + a for a in ANSWERS] + \
        [b"\x06\x02\x30\x90" + a for a in ANSWERS[:4]]
    yield "notify_message", NOTIFY
    # Fd counts: none, one, 16 (what fits), 17 and 40.
    yield "notify_socket", [bytes([n]) + m for n, m in zip([0, 1, 16, 17, 40, 0, 3], NOTIFY)] + \
        [b"\x00READY=1\x00\x00\x05STATUS=x\x00\x00\x28"]


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "fuzz" / "corpus")
    for target, inputs in seeds():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for data in inputs:
            (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


if __name__ == "__main__":
    main()
