"""Bounded load test of a running `kiln serve` (loopback only; stdlib only).

    python3 load_test.py --url http://127.0.0.1:8080 --pid PID [--requests 1000] [--clients 32]

A warm-up, then REQUESTS requests from CLIENTS concurrent clients (each at
most 32 tokens): 10% invalid (must get a 4xx), 10% streaming clients that
disconnect after the first event, the rest streaming or not with
`ignore_eos`, whose `usage` must be exact. Afterwards: no 5xx, no failed
valid request, the server still alive, and its RSS within 10% of the
level after the warm-up. Exits non-zero on any failure.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.parse

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def prompt_for(i):
    n = 3 + (i * 7) % 40
    return " ".join(WORDS[(i + k * 5) % len(WORDS)] for k in range(n))


INVALID = [
    b"{not json",
    json.dumps({"prompt": "x", "temperature": 9}).encode(),
    json.dumps({"prompt": "x", "model": "no-such-model"}).encode(),
    json.dumps({"prompt": 12}).encode(),
    json.dumps({"messages": []}).encode(),
]


async def request(url, path, body, disconnect=False):
    """(status, body bytes) over a fresh connection; chunked bodies decoded."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    writer.write(head + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    out = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                break
            out += await reader.readexactly(size)
            await reader.readexactly(2)
            if disconnect and b"data: " in out:
                break
    else:
        out = await reader.read()
    writer.close()
    return status, out


class Tally:
    def __init__(self):
        self.statuses = {}
        self.errors = []
        self.tokens = 0

    def fail(self, msg):
        self.errors.append(msg)


async def one(url, i, prompt_len, tally, mix):
    kind = i % 10 if mix else 5
    if kind == 0:
        status, body = await request(url, "/v1/completions", INVALID[i % len(INVALID)])
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        if not 400 <= status < 500 or "error" not in json.loads(body):
            tally.fail(f"invalid request {i}: {status} {body[:200]!r}")
        return
    prompt = prompt_for(i)
    max_tokens = 8 + i % 25
    stream = kind == 1 or i % 2 == 0
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "temperature": 0.7, "seed": i}
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, out = await request(url, "/v1/completions", json.dumps(body).encode(), disconnect=kind == 1)
    tally.statuses[status] = tally.statuses.get(status, 0) + 1
    if status != 200:
        tally.fail(f"request {i}: status {status} {out[:200]!r}")
        return
    if kind == 1:
        return
    if stream:
        events = out.decode().split("\n\n")[:-1]
        if events[-1] != "data: [DONE]":
            tally.fail(f"request {i}: no [DONE]")
            return
        usage = json.loads(events[-2][6:])["usage"]
        finish = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-2]][-1]
    else:
        r = json.loads(out)
        usage, finish = r["usage"], r["choices"][0]["finish_reason"]
    want = {"prompt_tokens": prompt_len[prompt], "completion_tokens": max_tokens,
            "total_tokens": prompt_len[prompt] + max_tokens}
    got = {k: usage[k] for k in want}
    if got != want or finish != "length":
        tally.fail(f"request {i}: usage {got} finish {finish}, expected {want} length")
    tally.tokens += max_tokens


async def run(url, ids, clients, prompt_len, tally, mix):
    queue = list(ids)

    async def worker():
        while queue:
            i = queue.pop()
            try:
                await one(url, i, prompt_len, tally, mix)
            except Exception as e:  # a reset or a malformed reply is a failure
                tally.fail(f"request {i}: {type(e).__name__}: {e}")

    await asyncio.gather(*(worker() for _ in range(clients)))


async def get(url, path):
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return data.decode(errors="replace").split("\r\n\r\n", 1)[1]


async def idle(url):
    """Waits until no sequence runs or waits."""
    deadline = time.time() + 60
    while time.time() < deadline:
        m = await get(url, "/metrics")
        vals = {l.split()[0]: float(l.split()[1]) for l in m.splitlines() if l and not l.startswith("#")}
        if vals.get("kiln_running_sequences") == 0 and vals.get("kiln_queue_depth") == 0:
            return
        await asyncio.sleep(0.1)
    raise SystemExit("the server did not go idle")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


async def tokenize_lengths(url, ids):
    lens = {}
    for i in ids:
        p = prompt_for(i)
        if p not in lens:
            _, out = await request(url, "/tokenize", json.dumps({"content": p, "add_special": True}).encode())
            lens[p] = len(json.loads(out)["tokens"])
    return lens


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=96)
    a = ap.parse_args()
    assert urllib.parse.urlsplit(a.url).hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"
    warm_ids, load_ids = range(a.warmup), range(a.warmup, a.warmup + a.requests)
    prompt_len = await tokenize_lengths(a.url, list(warm_ids) + list(load_ids))

    warm = Tally()
    await run(a.url, warm_ids, a.clients, prompt_len, warm, mix=False)
    await idle(a.url)
    rss_warm = rss_kib(a.pid)

    t0 = time.time()
    tally = Tally()
    await run(a.url, load_ids, a.clients, prompt_len, tally, mix=True)
    secs = time.time() - t0
    await idle(a.url)
    time.sleep(1)
    rss_after = rss_kib(a.pid)
    alive = os.path.exists(f"/proc/{a.pid}")

    print(f"load: {a.requests} requests from {a.clients} clients in {secs:.1f} s, "
          f"{tally.tokens / secs:.1f} tok/s checked; statuses {dict(sorted(tally.statuses.items()))}; "
          f"RSS after warm-up {rss_warm / 1024:.1f} MiB, after load {rss_after / 1024:.1f} MiB")
    failures = warm.errors + tally.errors
    failures += [f"{n} responses with status {s}" for s, n in tally.statuses.items() if s >= 500]
    if not alive:
        failures.append("the server died")
    if rss_after > 1.10 * rss_warm:
        failures.append(f"RSS grew from {rss_warm} KiB to {rss_after} KiB (> 10%)")
    for f in failures[:20]:
        print("FAIL:", f, file=sys.stderr)
    print(f"{a.requests - len(tally.errors)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


asyncio.run(main())
