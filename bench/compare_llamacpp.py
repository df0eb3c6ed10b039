#!/usr/bin/env python3
"""Kiln vs llama.cpp on one GGUF (run through bench/compare-llamacpp).

Each measurement is its own process, so load time and peak RSS are per
run. Per test and repetition the engines alternate (kiln, llama.cpp, kiln,
...) so slow drifts of the machine hit both alike. The llama.cpp side uses
llama-cpp-python's low-level API the way llama-bench does: random tokens,
one llama_decode per batch, logits for the last token only, one warm-up run
of the same test first (as `kiln bench` does).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

TESTS = {
    # name: (n_prompt, n_gen, depth)
    "pp512": (512, 0, 0),
    "tg128": (0, 128, 0),
    "tg128 @ d4096": (0, 128, 4096),
}


def status_bytes(field):
    """VmRSS / VmHWM of this process from /proc, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def llama_worker(model, test, threads):
    """One llama.cpp measurement; prints one JSON line."""
    import llama_cpp

    n_prompt, n_gen, depth = TESTS[test]
    # The Python interpreter and the bindings are not llama.cpp's memory.
    baseline = status_bytes("VmRSS")
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=model,
        n_ctx=depth + n_prompt + n_gen + 1,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    ctx = llm.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    rng = random.Random(1234)

    def decode(tokens, pos0):
        for i in range(0, len(tokens), 512):
            chunk = tokens[i : i + 512]
            batch.n_tokens = len(chunk)
            for j, tok in enumerate(chunk):
                batch.token[j] = tok
                batch.pos[j] = pos0 + i + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = j == len(chunk) - 1
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        llama_cpp.llama_synchronize(ctx)

    def rand_tokens(n):
        return [rng.randrange(n_vocab) for _ in range(n)]

    def run_once():
        llama_cpp.llama_memory_clear(mem, True)
        if n_prompt:
            # Like kiln bench: the context (untimed), then BOS + random tokens.
            if depth:
                decode(rand_tokens(depth), 0)
            toks = [bos] + rand_tokens(n_prompt - 1)
            t = time.perf_counter()
            decode(toks, depth)
            return n_prompt / (time.perf_counter() - t)
        # Decode after a 1-token (or depth-token) prompt, one token per call.
        ctx_toks = [bos] + rand_tokens(depth - 1) if depth else [bos]
        decode(ctx_toks, 0)
        pos = len(ctx_toks)
        toks = rand_tokens(n_gen)
        t = time.perf_counter()
        for k, tok in enumerate(toks):
            decode([tok], pos + k)
        return n_gen / (time.perf_counter() - t)

    run_once()  # warm-up
    ts = run_once()
    llama_cpp.llama_batch_free(batch)
    hwm = status_bytes("VmHWM")
    print(
        json.dumps(
            {
                "avg_ts": ts,
                "load_s": load_s,
                "peak_rss_bytes": hwm - baseline,
                "vmhwm_bytes": hwm,
            }
        )
    )


def run_child(cmd):
    """Runs cmd; returns its stdout (stderr only shown on failure)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def kiln_run(kiln, model, test, threads):
    n_prompt, n_gen, depth = TESTS[test]
    cmd = [
        kiln, "bench", "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
        "-d", str(depth), "-t", str(threads), "-r", "1", "--json",
    ]
    rows = [json.loads(l) for l in run_child(cmd).splitlines() if l.startswith("{")]
    rows = [r for r in rows if r.get("test") == test]
    if len(rows) != 1:
        raise RuntimeError(f"kiln bench printed no {test!r} line")
    return rows[0]


def llama_run(model, test, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", test,
           "-m", model, "-t", str(threads)]
    return json.loads(run_child(cmd).strip().splitlines()[-1])


def kiln_usable(kiln):
    if not os.access(kiln, os.X_OK):
        return f"{kiln} not found (cargo build --release -p kiln-cli)"
    r = subprocess.run([kiln, "bench", "--help"], capture_output=True, text=True)
    if r.returncode != 0 or "--json" not in r.stdout:
        return f"{kiln} has no `bench --json`"
    return None


def fmt(xs, scale=1.0, digits=2):
    if not xs:
        return "-"
    m = statistics.mean(xs) / scale
    if len(xs) > 1:
        return f"{m:.{digits}f} ± {statistics.stdev(xs) / scale:.{digits}f}"
    return f"{m:.{digits}f}"


def ratio(k, l):
    return f"{statistics.mean(k) / statistics.mean(l):.2f}" if k and l else "-"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cache = os.environ.get("KILN_CACHE_DIR", os.path.expanduser("~/.cache/kiln"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=os.environ.get(
        "KILN_MODEL", os.path.join(cache, "gemma-3-270m-q4_k_m.gguf")))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--kiln", default=os.path.join(root, "target/release/kiln"))
    ap.add_argument("--tests", default=",".join(TESTS),
                    help="comma-separated subset of: " + ", ".join(TESTS))
    ap.add_argument("--json-out", help="also write every sample here (JSON)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.worker:
        return llama_worker(a.model, a.worker, a.threads)

    tests = [t.strip() for t in a.tests.split(",")]
    for t in tests:
        if t not in TESTS:
            ap.error(f"unknown test {t!r}")
    why_not = kiln_usable(a.kiln)
    if why_not:
        print(f"warning: {why_not}; measuring llama.cpp only", file=sys.stderr)

    samples = {t: {"kiln": [], "llama": []} for t in tests}
    for t in tests:
        for rep in range(a.reps):
            if not why_not:
                r = kiln_run(a.kiln, a.model, t, a.threads)
                samples[t]["kiln"].append(r)
                print(f"{t} rep {rep + 1}: kiln {r['avg_ts']:.1f} t/s", file=sys.stderr)
            r = llama_run(a.model, t, a.threads)
            samples[t]["llama"].append(r)
            print(f"{t} rep {rep + 1}: llama.cpp {r['avg_ts']:.1f} t/s", file=sys.stderr)

    def col(engine, key):
        return [r[key] for t in tests for r in samples[t][engine]]

    print(f"model: {a.model}, threads: {a.threads}, reps: {a.reps}, "
          f"llama-cpp-python {__import__('llama_cpp').__version__} (flash_attn on)\n")
    print("| test | Kiln | llama.cpp | Kiln / llama.cpp |")
    print("| --- | ---: | ---: | ---: |")
    for t in tests:
        k = [r["avg_ts"] for r in samples[t]["kiln"]]
        l = [r["avg_ts"] for r in samples[t]["llama"]]
        print(f"| {t} (t/s) | {fmt(k)} | {fmt(l)} | {ratio(k, l)} |")
    k, l = col("kiln", "load_s"), col("llama", "load_s")
    print(f"| load time (s) | {fmt(k, digits=3)} | {fmt(l, digits=3)} | {ratio(k, l)} |")
    k, l = col("kiln", "peak_rss_bytes"), col("llama", "peak_rss_bytes")
    print(f"| peak RSS (MiB) | {fmt(k, 2**20, 0)} | {fmt(l, 2**20, 0)} | {ratio(k, l)} |")
    print("\nt/s: higher is better; load time and RSS: lower is better. "
          "llama.cpp RSS is VmHWM minus the Python interpreter's RSS before loading.")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "reps": a.reps,
                       "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()
