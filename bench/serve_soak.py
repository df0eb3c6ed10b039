"""Soak test for an OpenAI-compatible server (issue 13's acceptance run).

STREAMS clients send streaming `/v1/completions` requests back to back
for DURATION seconds: each prompt is a random token-id sequence of
16..MAX_PROMPT tokens (uniform), each asks for 16..MAX_OUTPUT tokens
(greedy, `ignore_eos`), and a DISCONNECT fraction of the requests is
abandoned mid-stream (the client closes its socket after a random number
of tokens), which the server must notice and free. Then it waits for the
server to go idle and reads /metrics.

The result (one JSON object, also the exit status): requests completed
and abandoned, generated tokens and tokens/s, errors (any status other
than 200, a malformed event stream, a completed stream short of its
tokens, a connection failure: 0 is the pass line), and after the run
whether running sequences, KV bytes in use and queue depth returned to
zero. Device memory is checked by the caller (bench/gpu-soak compares
`nvidia-smi` before and after). Stdlib only; loopback targets only.

    python3 bench/serve_soak.py --url http://127.0.0.1:8080 --streams 64 --duration 600
"""

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.parse

from serve_load import DONE, open_stream, read_metrics, sse_messages


class Abandoned(Exception):
    """The client closed the stream on purpose."""


async def stream_one(url, body, abandon_after):
    """Tokens received; raises on any protocol error, Abandoned on purpose."""
    reader, writer = await open_stream(url, body)
    try:
        tokens, usage_tokens, done = 0, None, False
        async for msg in sse_messages(reader):
            if msg is DONE:
                done = True
                continue
            if "error" in msg:
                raise RuntimeError(f"error event: {msg['error']}")
            choices = msg.get("choices") or []
            if choices and choices[0].get("finish_reason") is None:
                tokens += 1
            if msg.get("usage"):
                usage_tokens = msg["usage"].get("completion_tokens")
            if abandon_after is not None and tokens >= abandon_after:
                raise Abandoned()
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        if usage_tokens != body["max_tokens"]:
            raise RuntimeError(f"usage says {usage_tokens} tokens, asked {body['max_tokens']}")
        return usage_tokens
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--max-prompt", type=int, default=2000)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--disconnect", type=float, default=0.10, help="fraction of requests abandoned")
    ap.add_argument("--vocab", type=int, default=262_144, help="prompt ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--idle-wait", type=float, default=30.0, help="seconds to wait for the server to drain")
    args = ap.parse_args()
    host = urllib.parse.urlsplit(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"refusing a non-loopback target: {host}")

    rng = random.Random(args.seed)
    stats = {"completed": 0, "abandoned": 0, "tokens": 0, "errors": 0}
    error_samples = []
    stop_at = time.perf_counter() + args.duration

    async def client(i):
        while time.perf_counter() < stop_at:
            n_prompt = rng.randint(16, args.max_prompt)
            # Ids from 1000 up: no special tokens in the prompt.
            ids = [2] + [rng.randrange(1000, args.vocab) for _ in range(n_prompt - 1)]
            out = rng.randint(16, args.max_output)
            abandon = rng.randint(1, out - 1) if rng.random() < args.disconnect else None
            body = {"prompt": ids, "max_tokens": out, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            try:
                # (Awaited first: `x += await f()` would read x before
                # the await and drop other clients' updates.)
                n = await stream_one(args.url, body, abandon)
                stats["tokens"] += n
                stats["completed"] += 1
            except Abandoned:
                stats["abandoned"] += 1
                stats["tokens"] += abandon
            except (OSError, RuntimeError, ValueError) as e:
                stats["errors"] += 1
                if len(error_samples) < 5:
                    error_samples.append(f"client {i}: {e}"[:300])

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(args.streams)))
    secs = time.perf_counter() - t0

    # Abandoned sequences are freed within a step; give the engine time to
    # notice the last ones, then read the gauges.
    idle, vals = False, {}
    deadline = time.perf_counter() + args.idle_wait
    while time.perf_counter() < deadline:
        vals = await read_metrics(args.url)
        if all(vals.get(k, 0.0) == 0.0 for k in ("kiln_running_sequences", "kiln_kv_running_bytes",
                                                   "kiln_queue_depth")):
            idle = True
            break
        await asyncio.sleep(0.5)
    result = {**stats, "streams": args.streams, "seconds": round(secs, 1),
              "tok_s": round(stats["tokens"] / secs, 1), "idle_after": idle,
              "running_after": vals.get("kiln_running_sequences"),
              "kv_running_bytes_after": vals.get("kiln_kv_running_bytes"),
              "kv_prefix_cache_bytes_after": vals.get("kiln_kv_prefix_cache_bytes"),
              "error_samples": error_samples}
    print(json.dumps(result))
    return 0 if stats["errors"] == 0 and idle else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
