"""kiln serve driven by the official `openai` client and by raw HTTP.

Run by crates/kiln-cli/tests/serve.rs, which starts the servers and sets:
  KILN_URL        main server (API key KILN_API_KEY, --parallel 8)
  KILN_SMALL_URL  limited server: --parallel 1 --queue 1 --ctx 64 --max-body 4096
  KILN_BIN        the kiln binary (greedy reference: `kiln run --temp 0`)
  KILN_MODEL_PATH the model file
"""

import base64
import concurrent.futures as cf
import http.client
import json
import math
import os
import socket
import struct
import subprocess
import time
import urllib.parse

import openai
import pytest

URL = os.environ["KILN_URL"]
SMALL_URL = os.environ["KILN_SMALL_URL"]
KEY = os.environ["KILN_API_KEY"]
KILN = os.environ["KILN_BIN"]
MODEL_PATH = os.environ["KILN_MODEL_PATH"]
MODEL = "gemma-3-270m-q4_k_m"

client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=120)
small = openai.OpenAI(base_url=SMALL_URL + "/v1", api_key="unused", max_retries=0, timeout=120)


def raw(method, url, body=None, headers=None, raw=False):
    """(status, headers, body bytes) of one request."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, u.path, body=data, headers=h)
    r = c.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
    c.close()
    return out


def error_of(status, body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert e["message"], e
    return e


# ---------------------------------------------------------------- reference


def kiln_run(prompt, n):
    out = subprocess.run(
        [KILN, "run", "-m", MODEL_PATH, "-t", "1", "--temp", "0", "-n", str(n), "--json", "-p", prompt],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)


def top2_margin(ids):
    out = subprocess.run(
        [KILN, "logits", "-m", MODEL_PATH, "-t", "1", "--ids", ",".join(map(str, ids)), "--top", "2", "--json"],
        check=True, capture_output=True, text=True,
    )
    top = json.loads(out.stdout)["top"]
    return top[0]["logit"] - top[1]["logit"]


def assert_greedy_matches(ref, text):
    """Equal texts, or the first differing step is a near tie (< 1e-3)."""
    if text == ref["text"]:
        return
    ids = ref["ids"]
    for k in range(len(ids)):
        prefix = subprocess.run(
            [KILN, "detokenize", "-m", MODEL_PATH] + [str(i) for i in ids[: k + 1]],
            check=True, capture_output=True, text=True,
        ).stdout.rstrip("\n")
        if not text.startswith(prefix):
            margin = top2_margin(ref["prompt_ids"] + ids[:k])
            assert margin < 1e-3, f"step {k}: server {text!r} vs kiln run {ref['text']!r}, margin {margin}"
            return
    raise AssertionError(f"server {text!r} vs kiln run {ref['text']!r}")


PROMPTS = [
    "The capital of France is",
    "Hi",
    "Write a short poem about the sea. The waves",
    "1, 2, 3, 4, 5,",
    "In the beginning of the twentieth century, the city of Vienna was home to many artists, "
    "musicians and scientists, among them",
    "The recipe calls for",
    "Q: What is the tallest mountain on Earth?\nA:",
    "Once upon a time, in a land far away, there lived a",
]


def server_greedy(prompt, n):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
    return r.choices[0].text


def test_greedy_equals_kiln_run_alone_and_with_8_concurrent():
    n = 24
    refs = [kiln_run(p, n) for p in PROMPTS]
    assert_greedy_matches(refs[0], server_greedy(PROMPTS[0], n))
    with cf.ThreadPoolExecutor(8) as ex:
        texts = list(ex.map(lambda p: server_greedy(p, n), PROMPTS))
    for ref, text in zip(refs, texts):
        assert_greedy_matches(ref, text)


# ---------------------------------------------------------------- openai client


def test_models_lists_the_served_model():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_completion_usage_and_finish_reason():
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == 6  # <bos> The capital of France is
    assert r.usage.total_tokens == 11


def test_chat_stream_equals_chat_whole():
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_n2_gives_two_independent_choices():
    r = client.completions.create(model=MODEL, prompt="My favourite animal is", max_tokens=12,
                                  n=2, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 24
    assert r.choices[0].text != r.choices[1].text


def test_seed_reproducible():
    def gen(seed):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=16, temperature=1.0, top_p=0.95, seed=seed).choices[0].message.content
    assert gen(123) == gen(123)
    assert len({gen(s) for s in (1, 2, 3)}) > 1


def test_stop_string_cuts_and_reports_stop():
    full = server_greedy("1, 2, 3, 4, 5,", 20)
    assert " 7," in full, full
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0,
                                  stop=[" 7,", "never"])
    assert r.choices[0].text == full[: full.index(" 7,")]
    assert r.choices[0].finish_reason == "stop"


def test_chat_logprobs_are_consistent():
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                       max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and math.isclose(t.top_logprobs[0].logprob, t.logprob)
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
    assert "".join(t.token for t in content).strip() != ""


def test_completion_logprobs_and_echo():
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0,
                                  logprobs=2, echo=True, extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.text.startswith("The sky is")
    assert len(c.logprobs.tokens) == 4 and len(c.logprobs.top_logprobs[0]) == 2
    assert all(lp <= 0 for lp in c.logprobs.token_logprobs)


def test_embeddings_mean_and_last_are_unit_vectors():
    r = client.embeddings.create(model=MODEL, input=["The cat sat.", "A dog ran."])  # base64 by default
    assert [d.index for d in r.data] == [0, 1]
    for d in r.data:
        assert len(d.embedding) == 640
        assert math.isclose(sum(x * x for x in d.embedding), 1.0, rel_tol=1e-4)
    assert r.usage.prompt_tokens > 0
    floats = client.embeddings.create(model=MODEL, input="The cat sat.", encoding_format="float")
    assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, r.data[0].embedding)) < 1e-6
    last = client.embeddings.create(model=MODEL, input="The cat sat.", extra_body={"pooling": "last"})
    assert last.data[0].embedding != r.data[0].embedding


@pytest.mark.parametrize("kwargs,param", [
    ({"temperature": 5}, "temperature"),
    ({"n": 1000}, "n"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"logprobs": 100}, "logprobs"),
    ({"stop": [""]}, "stop"),
    ({"extra_body": {"top_k": "many"}}, "top_k"),
])
def test_bad_parameters_are_400_naming_the_field(kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hi", **kwargs)
    assert e.value.body["param"] == param, e.value.body


def test_unknown_model_is_404_and_wrong_key_401():
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-5", prompt="Hi")
    bad = openai.OpenAI(base_url=URL + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_prompt_longer_than_context_is_400():
    with pytest.raises(openai.BadRequestError) as e:
        small.completions.create(model=MODEL, prompt="word " * 200)
    assert e.value.body["code"] == "context_length_exceeded"


# ---------------------------------------------------------------- raw HTTP


def sse_events(body):
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: "):] for e in events]


def test_sse_framing_and_utf8_whole_events():
    status, headers, body = raw("POST", URL + "/v1/completions", {
        "prompt": "Translate to Japanese: good morning =", "max_tokens": 24, "temperature": 0,
        "stream": True, "ignore_eos": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Every event decoded as UTF-8 on its own (json.loads would fail on a split character).
    for c in chunks:
        assert "\ufffd" not in c["choices"][0]["text"]


def test_health_metrics_tokenize_detokenize():
    assert raw("GET", URL + "/health", headers={"Authorization": ""})[0] == 200
    status, headers, body = raw("GET", URL + "/metrics", headers={"Authorization": ""})
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ["kiln_requests_total{", "kiln_prompt_tokens_total", "kiln_generated_tokens_total",
                 "kiln_queue_depth", "kiln_running_sequences", "kiln_kv_running_bytes",
                 "kiln_time_to_first_token_seconds_bucket", "kiln_inter_token_latency_seconds_count"]:
        assert name in text, name
    vals = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and l[0] != "#"}
    busy, fwd = vals["kiln_engine_busy_seconds_total"], vals["kiln_forward_seconds_total"]
    assert busy >= fwd >= 0, (busy, fwd)
    assert (fwd > 0) == (vals["kiln_steps_total"] > 0), (fwd, vals["kiln_steps_total"])
    status, _, body = raw("POST", URL + "/tokenize", {"content": "Hello world", "add_special": True})
    ids = json.loads(body)["tokens"]
    assert status == 200 and ids[0] == 2 and len(ids) == 3
    status, _, body = raw("POST", URL + "/detokenize", {"tokens": ids[1:]})
    assert status == 200 and json.loads(body)["content"] == "Hello world"


@pytest.mark.parametrize("body,fragment", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "UTF-8"),
    (b"[1, 2]", "JSON object"),
    (b'{"prompt": 5}', "prompt"),
    (b'{"prompt": "x", "stream": "yes"}', "stream"),
])
def test_malformed_bodies_are_400_with_an_openai_error(body, fragment):
    status, _, out = raw("POST", URL + "/v1/completions", body)
    assert status == 400
    assert fragment in error_of(status, out)["message"]


def test_missing_key_401_and_big_body_413():
    status, _, body = raw("GET", URL + "/v1/models", headers={"Authorization": ""})
    assert status == 401 and error_of(status, body)["type"] == "authentication_error"
    status, _, body = raw("POST", SMALL_URL + "/v1/completions", {"prompt": "x" * 10000})
    assert status == 413 and error_of(status, body)["code"] == "request_too_large"


def test_full_queue_is_429_with_retry_after():
    # --parallel 1 --queue 1: one running, one waiting, the rest refused.
    # The first request is admitted before the others are sent (on a busy
    # machine six at once can all meet a queue that still holds the first).
    long = {"prompt": "Count:", "max_tokens": 55, "ignore_eos": True, "temperature": 0}
    body = {"prompt": "Count:", "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    with cf.ThreadPoolExecutor(6) as ex:
        first = ex.submit(raw, "POST", SMALL_URL + "/v1/completions", long)
        deadline = time.time() + 60
        while metric("kiln_running_sequences", SMALL_URL) < 1 and not first.done():
            assert time.time() < deadline, "the first request was not admitted"
            time.sleep(0.01)
        rest = list(ex.map(lambda _: raw("POST", SMALL_URL + "/v1/completions", body), range(5)))
        results = [first.result()] + rest
    statuses = sorted(s for s, _, _ in results)
    assert statuses.count(200) >= 2 and 429 in statuses, statuses
    for s, h, b in results:
        if s == 429:
            assert h["retry-after"] == "1" and error_of(s, b)["code"] == "rate_limit_exceeded"


def metric(name, url=URL):
    text = raw("GET", url + "/metrics")[2].decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " "))


def test_disconnect_mid_stream_cancels_the_sequence():
    before = metric("kiln_cancelled_sequences_total")
    u = urllib.parse.urlsplit(URL)
    s = socket.create_connection((u.hostname, u.port))
    body = json.dumps({"prompt": "Hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
              + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
              + b"\r\n\r\n" + body)
    assert b"data: " in s.recv(4096) + s.recv(4096)
    s.close()
    deadline = time.time() + 10
    while metric("kiln_cancelled_sequences_total") <= before:
        assert time.time() < deadline, "the sequence was not cancelled"
        time.sleep(0.05)
