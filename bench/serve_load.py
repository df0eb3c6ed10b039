"""Load generator for OpenAI-compatible servers (kiln serve, llama-server).

For each concurrency level, STREAMS clients each send greedy streaming
`/v1/completions` requests (a PROMPT-token prompt given as token ids, so
both servers see the same tokens; OUTPUT tokens with `ignore_eos`) until
ROUNDS requests per client are done. Reports aggregate generated tokens/s
(all tokens over the level's wall time) and median / p90 time to first
token. Stdlib only; loopback targets only.

    python3 bench/serve_load.py --url http://127.0.0.1:8080 --streams 1,4,8,16 [--json]
"""

import argparse
import asyncio
import json
import statistics
import time
import urllib.parse


DONE = "[DONE]"


async def open_stream(url, body):
    """(reader, writer) of a POST /v1/completions whose 200 response headers
    have been read; RuntimeError for any other status."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    data = json.dumps(body).encode()
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
    await writer.drain()
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or parts[1] != b"200":
        rest = await reader.read()
        writer.close()
        raise RuntimeError(f"status line {status_line[:80]!r}: {rest[:300]!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    return reader, writer


async def sse_messages(reader):
    """Each Server-Sent Event's JSON payload as a dict, and DONE for
    `data: [DONE]`; other lines are skipped."""
    buf = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            line = event.split(b"data: ", 1)[-1].strip()
            if line == b"[DONE]":
                yield DONE
            elif line.startswith(b"{"):
                yield json.loads(line)


async def read_metrics(url):
    """A server's /metrics as {name: value} (unlabelled samples)."""
    u = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    text = (await reader.read()).decode(errors="replace")
    writer.close()
    vals = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            try:
                vals[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return vals


async def stream_one(url, body):
    """(time to first token, tokens, total seconds) of one streamed request."""
    t0 = time.perf_counter()
    reader, writer = await open_stream(url, body)
    ttft, tokens = None, 0
    async for msg in sse_messages(reader):
        if msg is DONE:
            continue
        choices = msg.get("choices") or []
        # llama-server sends one token per event; kiln too (held-back
        # stop-string text aside, which greedy ignore_eos runs have none of).
        if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
            if ttft is None:
                ttft = time.perf_counter() - t0
            tokens += 1
        usage = msg.get("usage")
        if usage and usage.get("completion_tokens"):
            tokens = usage["completion_tokens"]
    writer.close()
    return ttft or 0.0, tokens, time.perf_counter() - t0


async def engine_seconds(url):
    """(busy, forward, steps) from a kiln server's /metrics; None elsewhere."""
    try:
        vals = await read_metrics(url)
    except OSError:
        return None
    keys = ("kiln_engine_busy_seconds_total", "kiln_forward_seconds_total", "kiln_steps_total")
    return tuple(vals[k] for k in keys) if all(k in vals for k in keys) else None


# Second prompt token of the next request: every request of a run (the
# warm-up and every level) gets its own, so no request finds another's
# prompt in a server's prefix cache (kiln serve keeps finished prompts;
# llama-server is told not to with cache_prompt).
_next_id = [1000]


async def level(url, streams, rounds, prompt_ids, output):
    ttfts, total = [], 0

    async def client(i):
        nonlocal total
        for r in range(rounds):
            # A different second token per request: no prefix-cache hits
            # between requests, on either server.
            ids = [prompt_ids[0], _next_id[0]] + prompt_ids[2:]
            _next_id[0] += 1
            body = {"prompt": ids, "max_tokens": output, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}, "cache_prompt": False}
            ttft, n, _ = await stream_one(url, body)
            ttfts.append(ttft)
            total += n

    before = await engine_seconds(url)
    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(streams)))
    secs = time.perf_counter() - t0
    after = await engine_seconds(url)
    ttfts.sort()
    engine = {}
    if before and after and after[2] > before[2]:
        busy, fwd, steps = (a - b for a, b in zip(after, before))
        # The host's share of the engine's busy time: everything outside the
        # model's forward steps (planning, sampling, detokenizing, events).
        engine = {"steps": int(steps), "ms_per_step": round(1e3 * busy / steps, 3),
                  "host_share": round(1 - fwd / busy, 3) if busy > 0 else None}
    return {**engine,
        "streams": streams,
        "requests": streams * rounds,
        "tokens": total,
        "seconds": round(secs, 2),
        "tok_s": round(total / secs, 1),
        "ttft_median_s": round(statistics.median(ttfts), 3),
        "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 3),
    }


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", action="store_true", help="one JSON line per level")
    a = ap.parse_args()
    assert urllib.parse.urlsplit(a.url).hostname in ("127.0.0.1", "localhost", "::1"), "loopback only"
    # <bos> then ordinary word-piece ids (same for every server of the model).
    prompt_ids = [2] + [(4000 + 37 * k) % 200000 + 1000 for k in range(a.prompt - 1)]
    await level(a.url, 1, 1, prompt_ids, 8)  # warm-up
    for s in map(int, a.streams.split(",")):
        r = await level(a.url, s, a.rounds, prompt_ids, a.output)
        r["label"] = a.label
        if a.json:
            print(json.dumps(r), flush=True)
        else:
            print(f"{a.label}: {s:3d} streams: {r['tok_s']:8.1f} tok/s, TTFT median {r['ttft_median_s']:.3f} s, "
                  f"p90 {r['ttft_p90_s']:.3f} s ({r['requests']} requests, {r['tokens']} tokens, {r['seconds']} s)"
                  + (f"; {r['steps']} steps, {r['ms_per_step']} ms/step, host {100 * r['host_share']:.1f}%"
                     if r.get("host_share") is not None else ""),
                  flush=True)


if __name__ == "__main__":
    asyncio.run(main())
