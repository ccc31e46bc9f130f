"""Tool use through ds4-server, end to end with the official SDKs (docs/SERVER.md, Tool calls).

The tiny model never writes DSML by itself, so the calls come from a prefill: the start of the
answer that the request supplies (DeepSeek's chat prefix completion, `"prefix": true` on a last
assistant message, and Anthropic's last assistant message). A prefill holding a whole DSML block is
an answer that is a tool call, exactly as if the model had sampled it; nothing test-only is in the
server. The SDKs' own parsing of tool_calls / tool_use blocks is the oracle for the shapes; the
prompt is checked against ds4's tokenizer on a hand-rendered transcript (the tools block of the
reference server's append_tools_prompt_text, the DSML of DeepSeek's encoding_dsv4.py)."""
import json
import random

import pytest

from ds4_server_harness import ASSISTANT, BOS, EOS, USER, post

TOOLS_OPENAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "Forecast",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
TOOLS_ANTHROPIC = [{"name": "get_weather", "description": "Forecast",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]
ARGS = {"city": "Prague", "days": 3}
INVOKE = ('<｜DSML｜invoke name="get_weather">\n'
          '<｜DSML｜parameter name="city" string="true">Prague</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
          '</｜DSML｜invoke>')
BLOCK = "\n\n<｜DSML｜tool_calls>\n" + INVOKE + "\n</｜DSML｜tool_calls>"
Q = "Che tempo fa a Praga?"

# ds4_server.c, append_tools_prompt_text, transcribed.
TOOLS_HEAD = (
    "## Tools\n\nYou have access to a set of tools to help answer the user question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
    "$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as raw text and set "
    "`string=\"true\"`. Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string "
    "characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing "
    "parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all "
    "other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`."
    "\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> "
    "with tool calls or final response.\n\n### Available Tool Schemas\n\n")
TOOLS_TAIL = ("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
              "calls. Use the exact parameter names from the schemas.")


def schema_line(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def prefixed(prefill):
    return [{"role": "user", "content": Q}, {"role": "assistant", "content": prefill, "prefix": True}]


def check_call(call, prefix):
    assert call.id.startswith(prefix) and len(call.id) == len(prefix) + 32


def test_openai_call_from_the_answer(client):
    r = client.chat.completions.create(model="m", messages=prefixed("Vediamo." + BLOCK), tools=TOOLS_OPENAI,
                                       max_tokens=8, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == ""  # the prefill is not repeated, the markup never shown
    (call,) = c.message.tool_calls
    check_call(call, "call_")
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGS
    assert r.usage.completion_tokens == 0  # the block closed: nothing more is generated


def test_openai_stream_deltas(client):
    chunks = list(client.chat.completions.create(model="m", messages=prefixed(BLOCK), tools=TOOLS_OPENAI,
                                                 max_tokens=8, temperature=0, stream=True))
    calls, finish = {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        assert "DSML" not in (d.content or "")
        for tc in d.tool_calls or []:
            if tc.index not in calls:  # the first delta of a call: id, type, name
                assert tc.id and tc.type == "function" and tc.function.name == "get_weather"
                calls[tc.index] = {"id": tc.id, "args": tc.function.arguments or ""}
            else:
                assert tc.id is None
                calls[tc.index]["args"] += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0]
    check_call(type("C", (), {"id": calls[0]["id"]}), "call_")
    assert json.loads(calls[0]["args"]) == ARGS


def test_openai_call_then_model_text(client):
    # The block is left open after a complete invoke: whatever the model writes next, the call stands.
    r = client.chat.completions.create(model="m", messages=prefixed("\n\n<｜DSML｜tool_calls>\n" + INVOKE + "\n"),
                                       tools=TOOLS_OPENAI, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == ARGS
    assert "DSML" not in r.choices[0].message.content


def test_openai_forced_tool_renders_the_template(client, count_tokens):
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], tools=TOOLS_OPENAI,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       max_tokens=4, temperature=0)
    rendered = (BOS + TOOLS_HEAD + schema_line(TOOLS_OPENAI[0]["function"]) + TOOLS_TAIL + USER + Q + ASSISTANT
                + "</think>" + '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n')
    assert r.usage.prompt_tokens == len(count_tokens(rendered))
    # The tiny model does not finish the call: no call, its text comes back (the forced prefix does not).
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("length", "stop")
    assert "invoke" not in r.choices[0].message.content


def test_openai_history_with_calls_and_results(client, count_tokens):
    msgs = [{"role": "user", "content": Q},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_x", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps(ARGS)}}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "21 gradi"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_OPENAI, max_tokens=2, temperature=0)
    rendered = (BOS + TOOLS_HEAD + schema_line(TOOLS_OPENAI[0]["function"]) + TOOLS_TAIL + USER + Q + ASSISTANT
                + "</think>" + BLOCK + EOS + USER + "<tool_result>21 gradi</tool_result>" + ASSISTANT + "</think>")
    assert r.usage.prompt_tokens == len(count_tokens(rendered))
    # tool_choice none: the tools are not rendered.
    n = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_OPENAI, tool_choice="none",
                                       max_tokens=2, temperature=0)
    assert n.usage.prompt_tokens == len(count_tokens(rendered.replace(
        TOOLS_HEAD + schema_line(TOOLS_OPENAI[0]["function"]) + TOOLS_TAIL, "")))


def test_anthropic_tool_use_block(anthropic_client):
    m = anthropic_client.messages.create(model="m", max_tokens=8, tools=TOOLS_ANTHROPIC, messages=[
        {"role": "user", "content": Q}, {"role": "assistant", "content": "Vediamo." + BLOCK}])
    assert m.stop_reason == "tool_use"
    (block,) = m.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == ARGS
    check_call(block, "toolu_")


def test_anthropic_stream_input_json_delta(anthropic_client, server):
    msgs = [{"role": "user", "content": Q}, {"role": "assistant", "content": BLOCK}]
    with anthropic_client.messages.stream(model="m", max_tokens=8, tools=TOOLS_ANTHROPIC, messages=msgs) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == ARGS
    body = {"model": "m", "max_tokens": 8, "tools": TOOLS_ANTHROPIC, "messages": msgs, "stream": True}
    st, _, raw = post(server, "/v1/messages", json.dumps(body).encode(), raw=True)
    assert st == 200
    events = [json.loads(l[6:]) for l in raw.decode().splitlines() if l.startswith("data: ")]
    kinds = [e["type"] + ("/" + e["delta"]["type"] if e["type"] == "content_block_delta" else "") for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert events[1]["content_block"]["type"] == "tool_use" and events[1]["content_block"]["input"] == {}
    assert set(kinds[2:-3]) == {"content_block_delta/input_json_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert json.loads("".join(e["delta"]["partial_json"] for e in events[2:-3])) == ARGS
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_anthropic_tool_use_and_result_render_as_the_template(anthropic_client, count_tokens):
    m = anthropic_client.messages.create(model="m", max_tokens=2, tools=TOOLS_ANTHROPIC, messages=[
        {"role": "user", "content": Q},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                      "content": [{"type": "text", "text": "21 gradi"}]}]}])
    rendered = (BOS + TOOLS_HEAD + schema_line(TOOLS_ANTHROPIC[0]) + TOOLS_TAIL + USER + Q + ASSISTANT + "</think>"
                + BLOCK + EOS + USER + "<tool_result>21 gradi</tool_result>" + ASSISTANT + "</think>")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == len(count_tokens(rendered))


@pytest.mark.parametrize("kw,needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tool_choice": "required", "extra_body": {"think": True}}, "thinking"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "function"),
])
def test_openai_tool_errors(client, openai_mod, kw, needle):
    kw = {"tools": TOOLS_OPENAI, **kw}
    with pytest.raises(openai_mod.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=2, **kw)
    assert needle in str(e.value)


def test_random_dsml_answers_never_break_the_server(server):
    atoms = ["<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
             "<｜DSML｜parameter", "</｜DSML｜parameter>", ' name="get_weather"', ' string="false"', ">", "\n",
             "{", "\"", "&lt;", "x", "<invoke", "<tool_calls>"]
    rng = random.Random(7)
    for i in range(40):
        prefill = "".join(rng.choice(atoms) for _ in range(rng.randrange(1, 20)))
        for api in ("openai", "anthropic"):
            if api == "openai":
                body = {"messages": prefixed(prefill), "tools": TOOLS_OPENAI, "max_tokens": 3, "stream": i % 2 == 1}
                st, parsed, raw = post(server, "/v1/chat/completions", body)
            else:
                body = {"max_tokens": 3, "tools": TOOLS_ANTHROPIC, "stream": i % 2 == 1,
                        "messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": prefill}]}
                st, parsed, raw = post(server, "/v1/messages", body)
            assert st == 200 or (400 <= st < 500 and parsed), (st, raw[:300], prefill)
            if not body["stream"] and st == 200 and api == "openai":
                for call in parsed["choices"][0]["message"].get("tool_calls", []):
                    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    st, parsed, _ = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": Q}], "max_tokens": 1})
    assert st == 200


# ---------------------------------------------------------------- arguments streamed as written
#
# A prefill that stops inside a string value: the model's own tokens continue the value, so the
# arguments grow token by token. The oracle of the value is /v1/completions on the same transcript
# (no tracker there): the text the model writes after the prefill, greedy.

OPEN_CITY = ("\n\n<｜DSML｜tool_calls>\n" + '<｜DSML｜invoke name="get_weather">\n'
             + '<｜DSML｜parameter name="city" string="true">Pra')
CITY_DONE = OPEN_CITY + "gue</｜DSML｜parameter>\n"
N = 8  # tokens generated


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def continuation(server, schema, prefill):
    """What the model writes after the prefill (greedy, N tokens), and the finish: the transcript
    the chat and messages paths render, through /v1/completions."""
    rendered = BOS + TOOLS_HEAD + schema_line(schema) + TOOLS_TAIL + USER + Q + ASSISTANT + "</think>" + prefill
    st, body, raw = post(server, "/v1/completions", {"prompt": rendered, "max_tokens": N, "temperature": 0})
    assert st == 200, raw
    return body["choices"][0]["text"], body["choices"][0]["finish_reason"]


def openai_stream(client, prefill):
    """Per call: id, name and the argument pieces in order; the content; the finish."""
    calls, content, finish = {}, "", None
    for ch in client.chat.completions.create(model="m", messages=prefixed(prefill), tools=TOOLS_OPENAI,
                                             max_tokens=N, temperature=0, stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:  # the call's first delta: id, type, name, no arguments yet
                assert tc.id and tc.type == "function" and tc.function.arguments == "", tc
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "pieces": []}
            else:
                assert tc.id is None and tc.function.name is None, tc
                calls[tc.index]["pieces"].append(tc.function.arguments)
        finish = ch.choices[0].finish_reason or finish
    return calls, content, finish


def test_openai_arguments_stream_as_the_model_writes_them(client, server):
    text, oracle_finish = continuation(server, TOOLS_OPENAI[0]["function"], OPEN_CITY)
    # The oracle's assumption: the model writes plain text (no '<' or '&' that could start a tag,
    # no EOS), so the whole of it is the value.
    assert text and not set("<&") & set(text) and oracle_finish == "length", text
    want = compact({"city": "Pra" + text})

    r = client.chat.completions.create(model="m", messages=prefixed(OPEN_CITY), tools=TOOLS_OPENAI,
                                       max_tokens=N, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments == want
    # The token limit cut the call: the answer ends as any answer the limit cut.
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == N

    calls, content, finish = openai_stream(client, OPEN_CITY)
    assert content == "" and finish == "length" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    pieces = calls[0]["pieces"]
    assert "".join(pieces) == want
    # Live: the prefill's part first, then the model's tokens one piece at a time, the closing last.
    assert pieces[0] == '{"city":"Pra'
    assert len(pieces) >= N // 2, pieces
    assert pieces[-1].endswith('"}')

    # The SDK's own stream helper accumulates the same arguments from its argument-delta events
    # (its get_final_completion() refuses a finish "length", so its snapshot is read).
    with client.chat.completions.stream(model="m", messages=prefixed(OPEN_CITY), tools=TOOLS_OPENAI,
                                        max_tokens=N, temperature=0) as s:
        deltas = [e.arguments_delta for e in s if e.type == "tool_calls.function.arguments.delta"]
        final = s.current_completion_snapshot
    assert [d for d in deltas if d] == pieces  # (the first delta's arguments "" is one event too)
    assert final.choices[0].message.tool_calls[0].function.arguments == want
    assert final.choices[0].finish_reason == "length"


def test_anthropic_input_json_streams_as_the_model_writes_it(anthropic_client, server):
    text, oracle_finish = continuation(server, TOOLS_ANTHROPIC[0], OPEN_CITY)
    assert text and not set("<&") & set(text) and oracle_finish == "length", text
    want = {"city": "Pra" + text}
    msgs = [{"role": "user", "content": Q}, {"role": "assistant", "content": OPEN_CITY}]

    m = anthropic_client.messages.create(model="m", max_tokens=N, tools=TOOLS_ANTHROPIC, messages=msgs,
                                         extra_body={"temperature": 0})
    assert m.stop_reason == "max_tokens"
    (block,) = m.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == want

    body = {"model": "m", "max_tokens": N, "tools": TOOLS_ANTHROPIC, "messages": msgs, "stream": True,
            "temperature": 0}
    st, _, raw = post(server, "/v1/messages", json.dumps(body).encode(), raw=True)
    assert st == 200
    events = [json.loads(l[6:]) for l in raw.decode().splitlines() if l.startswith("data: ")]
    assert events[1]["type"] == "content_block_start"
    assert events[1]["content_block"]["type"] == "tool_use" and events[1]["content_block"]["input"] == {}
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert {e["delta"]["type"] for e in deltas} == {"input_json_delta"}
    pieces = [e["delta"]["partial_json"] for e in deltas]
    assert "".join(pieces) == compact(want)
    assert pieces[0] == '{"city":"Pra' and len(pieces) >= N // 2, pieces
    assert [e["type"] for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"

    # The SDK's stream helper parses the partial JSON as it comes: its final input is the same.
    with anthropic_client.messages.stream(model="m", max_tokens=N, tools=TOOLS_ANTHROPIC, messages=msgs,
                                          extra_body={"temperature": 0}) as s:
        snapshots = [e.snapshot for e in s if e.type == "input_json"]
        final = s.get_final_message()
    assert final.content[0].input == want and final.stop_reason == "max_tokens"
    assert len(snapshots) == len(pieces)


def test_a_call_broken_after_its_start_is_closed_and_ends_the_answer(client, anthropic_client, server):
    # After a whole parameter the model writes text where a parameter or the closing tag must come:
    # the call, already started, is closed with what was written, and generation stops there.
    text, _ = continuation(server, TOOLS_OPENAI[0]["function"], CITY_DONE)
    assert text.strip() and not text.lstrip().startswith("<"), text  # the oracle's assumption
    want = compact({"city": "Prague"})
    r = client.chat.completions.create(model="m", messages=prefixed(CITY_DONE), tools=TOOLS_OPENAI,
                                       max_tokens=N, temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.arguments == want
    assert r.choices[0].message.content == ""
    assert r.usage.completion_tokens < N  # stopped at the defect, not at the limit

    calls, content, finish = openai_stream(client, CITY_DONE)
    assert finish == "tool_calls" and content == ""
    assert "".join(calls[0]["pieces"]) == want
    assert calls[0]["pieces"][-1] == "}"  # the closing brace came with the defect, after the rest

    a_text, _ = continuation(server, TOOLS_ANTHROPIC[0], CITY_DONE)
    assert a_text.strip() and not a_text.lstrip().startswith("<"), a_text
    msgs = [{"role": "user", "content": Q}, {"role": "assistant", "content": CITY_DONE}]
    m = anthropic_client.messages.create(model="m", max_tokens=N, tools=TOOLS_ANTHROPIC, messages=msgs,
                                         extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use" and m.content[0].input == {"city": "Prague"}
    with anthropic_client.messages.stream(model="m", max_tokens=N, tools=TOOLS_ANTHROPIC, messages=msgs,
                                          extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Prague"}
