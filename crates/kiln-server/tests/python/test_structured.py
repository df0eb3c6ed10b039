"""Structured output, tool calls and thinking through the official `openai`
client, on the real 270M (Gemma 3: Kiln's JSON-block tool convention) and
on the tiny Gemma 4 fixture (random weights: only the constraint makes the
output valid).

Run by crates/kiln-cli/tests/serve.rs, which sets:
  KILN_URL, KILN_API_KEY  the real-model server (--parallel 8)
  KILN_G4_URL             kiln serve of gemma4-tiny/model-f32.gguf
"""

import concurrent.futures as cf
import json
import os

import jsonschema
import openai
import pytest

from schemas import PROMPTS, SCHEMAS

REAL = openai.OpenAI(base_url=os.environ["KILN_URL"] + "/v1", api_key=os.environ["KILN_API_KEY"],
                     max_retries=0, timeout=300)
G4 = openai.OpenAI(base_url=os.environ["KILN_G4_URL"] + "/v1", api_key="unused", max_retries=0, timeout=300)
CLIENTS = {"real": REAL, "gemma4": G4}
MODELS = {"real": "gemma-3-270m-q4_k_m", "gemma4": "model-f32"}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a time zone",
    "parameters": {"type": "object", "additionalProperties": False,
                   "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}/[A-Z][a-z]{2,8}$"}},
                   "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(calls, names=None):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in (names or PARAMS), c.function.name
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


def json_reply(which, i, schema, prompt):
    r = CLIENTS[which].chat.completions.create(
        model=MODELS[which], messages=[{"role": "user", "content": prompt}], temperature=1.0, seed=i,
        max_tokens=400,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
    )
    return r.choices[0]


@pytest.mark.parametrize("which", ["real", "gemma4"])
def test_every_sampled_output_validates_against_its_schema(which):
    jobs = [(i * 5 + j, schema, prompt) for i, schema in enumerate(SCHEMAS) for j, prompt in enumerate(PROMPTS)]
    assert len(jobs) == 150
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    failures = []
    with cf.ThreadPoolExecutor(8) as ex:
        for (n, schema, _), c in zip(jobs, ex.map(lambda j: json_reply(which, *j), jobs)):
            try:
                assert c.finish_reason == "stop", c.finish_reason
                jsonschema.validate(json.loads(c.message.content), schema, format_checker=checker)
            except Exception as e:  # noqa: BLE001 - collect every failure
                failures.append((n, repr(e)[:200], c.message.content[:200]))
    assert failures == [], failures[:5]


@pytest.mark.parametrize("which", ["real", "gemma4"])
def test_required_and_named_tool_calls(which):
    client = CLIENTS[which]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODELS[which], messages=msgs, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=1, max_tokens=300)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=MODELS[which], messages=msgs, tools=TOOLS, tool_choice=named,
                                       temperature=1.0, seed=2, max_tokens=300)
    calls = r.choices[0].message.tool_calls
    check_calls(calls, names=["get_time"])
    assert len(calls) == 1


@pytest.mark.parametrize("which", ["real", "gemma4"])
def test_parallel_calls_and_streaming_deltas(which):
    client = CLIENTS[which]
    msgs = [{"role": "user", "content": "Weather in Paris and Rome, and the time in Tokyo?"}]
    # Random weights rarely pick a second call over ending: the fixture's
    # end-of-generation ids (<eos> 1, <end_of_turn> 6) are made less likely.
    bias = {"gemma4": {"1": -6, "6": -6}, "real": {}}[which]
    most = 0
    for seed in range(12):
        kw = dict(model=MODELS[which], messages=msgs, tools=TOOLS, tool_choice="required", temperature=1.0,
                  seed=seed, max_tokens=300, logit_bias=bias)
        whole = client.chat.completions.create(**kw).choices[0]
        check_calls(whole.message.tool_calls)
        # The same seed streamed: tool_calls deltas assemble to the same calls.
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for d in chunk.choices:
                finish = d.finish_reason or finish
                for tc in d.delta.tool_calls or []:
                    calls[tc.index] = (tc.function.name, tc.function.arguments)
        assert finish == "tool_calls"
        assert [calls[k] for k in sorted(calls)] == [
            (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        most = max(most, len(whole.message.tool_calls))
        if most >= 2:
            break
    assert most >= 2, "no seed produced parallel calls"


@pytest.mark.parametrize("which", ["real", "gemma4"])
def test_round_trip_call_result_answer(which):
    client = CLIENTS[which]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODELS[which], messages=msgs, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=300)
    m = r.choices[0].message
    check_calls(m.tool_calls)
    msgs.append({"role": "assistant", "content": None,
                 "tool_calls": [c.model_dump() for c in m.tool_calls]})
    for c in m.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": c.id, "content": "sunny, 21 degrees"})
    final = client.chat.completions.create(model=MODELS[which], messages=msgs, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=24)
    f = final.choices[0]
    assert f.message.tool_calls is None and isinstance(f.message.content, str), f
    assert f.finish_reason in ("stop", "length")
    assert final.usage.prompt_tokens > r.usage.prompt_tokens


THOUGHT = ('start: "<|channel>thought\\n" /[a-z]{2,8}( [a-z]{2,8}){1,3}/ "<channel|>" '
           '/[A-Z][a-z]{2,8}( [a-z]{2,8}){1,3}\\./')


def test_gemma4_thoughts_come_back_as_reasoning_content():
    kw = dict(model=MODELS["gemma4"], messages=[{"role": "user", "content": "Think, then answer."}],
              reasoning_effort="high", temperature=1.0, seed=5, max_tokens=80,
              response_format={"type": "grammar", "grammar": THOUGHT})
    m = G4.chat.completions.create(**kw).choices[0].message
    reasoning = m.model_extra["reasoning_content"]
    assert reasoning and " " in reasoning and "<|channel>" not in reasoning, m
    assert m.content.endswith(".") and "<" not in m.content and "thought" not in m.content, m
    content, thought = "", ""
    for chunk in G4.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta
        content += d.content or ""
        thought += (d.model_extra or {}).get("reasoning_content") or ""
    assert (thought, content) == (reasoning, m.content)


@pytest.mark.parametrize("which", ["real", "gemma4"])
def test_bad_schemas_tools_and_choices_are_400s_naming_the_field(which):
    client = CLIENTS[which]
    msgs = [{"role": "user", "content": "x"}]
    cases = [
        (dict(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}), "response_format"),
        (dict(response_format={"type": "grammar", "grammar": "start: nothing_here"}), "response_format"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "nope"}}}}}], tool_choice="required"), "tools"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "missing"}}), "tool_choice"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODELS[which], messages=msgs, max_tokens=8, **kw)
        err = e.value.body
        assert err["param"] == param and err["message"], err
