"""ds4-server's OpenAI Responses API (docs/SERVER.md, Responses) through the official `openai` SDK
and raw HTTP. The oracles: the chat path (the same conversation through /v1/chat/completions at
temperature 0 must give the same text and token counts: both run the same renderer and engine),
and ds4's own tokenizer on the prompt as docs/SERVER.md renders it. The tiny model never writes
DSML and the Responses API has no prefill, so the function_call output items are checked at the
unit level (tests/server/test_responses.cpp: the tracker's events through the response builder);
here the tools' rendering and a replayed call history are checked against the chat path."""
import json
import urllib.error
import urllib.request

import pytest

from ds4_server_harness import ASSISTANT, BOS, MODEL_ID, USER, post, rendered_chat, sse_events, start_server
from ds4_server_harness import openai_chat as chat
from test_server_tools import TOOLS_OPENAI

SYSTEM = "Sei un narratore."
QUESTION = "Quel ramo del lago di Como"
Q2 = "E poi che accadde?"


def create(client, input, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_output_tokens", 24)
    return client.responses.create(model=MODEL_ID, input=input, **kw)


STATUS = {"length": "incomplete", "stop": "completed"}  # chat finish -> Responses status


def terminal(events):
    """The response of a stream's last event. The tiny model always reaches max_output_tokens, so
    that is response.incomplete, as OpenAI sends it; the SDK's get_final_response() only accepts
    response.completed (openai-python PR #3538), so the event is read directly."""
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.status == events[-1].type.split(".")[1]
    return events[-1].response


def get(server, path):
    try:
        with urllib.request.urlopen(server.url + path, timeout=60) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    return status, json.loads(payload), payload


def test_same_text_and_counts_as_chat_completions(client, server, count_tokens):
    r = create(client, QUESTION, instructions=SYSTEM)
    choice, usage = chat(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    assert r.object == "response" and r.model == MODEL_ID and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output[0].id.startswith("msg_")
    assert r.output_text and r.output_text == choice["message"]["content"]
    assert r.status == STATUS[choice["finish_reason"]] == r.output[0].status
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == usage["completion_tokens"] == 24
    want = len(count_tokens(rendered_chat(SYSTEM, [("user", QUESTION)])))
    assert r.usage.input_tokens == usage["prompt_tokens"] == want
    assert r.usage.total_tokens == want + 24
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == SYSTEM and r.max_output_tokens == 24 and r.temperature == 0
    assert r.store is True and r.previous_response_id is None


def test_input_items_render_as_the_chat_messages(client, server, count_tokens):
    items = [{"role": "developer", "content": SYSTEM},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ZZQ xqk"}]},
             {"role": "user", "content": Q2}]
    r = create(client, items, max_output_tokens=10, metadata={"k": "v"})
    choice, usage = chat(server, [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": QUESTION},
                                  {"role": "assistant", "content": "ZZQ xqk"}, {"role": "user", "content": Q2}],
                         max_tokens=10)
    assert r.output_text == choice["message"]["content"]
    want = len(count_tokens(rendered_chat(SYSTEM, [("user", QUESTION), ("assistant", "ZZQ xqk"), ("user", Q2)])))
    assert r.usage.input_tokens == usage["prompt_tokens"] == want
    assert r.metadata == {"k": "v"}


def test_stream_equals_non_stream(client):
    r = create(client, QUESTION, instructions=SYSTEM)
    with client.responses.stream(model=MODEL_ID, input=QUESTION, instructions=SYSTEM, temperature=0,
                                 max_output_tokens=24) as s:
        events = list(s)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = terminal(events)
    assert "".join(deltas) == r.output_text == final.output_text
    assert final.status == r.status and final.id != r.id
    assert final.usage.output_tokens == r.usage.output_tokens
    assert final.usage.input_tokens == r.usage.input_tokens
    assert final.usage.input_tokens_details.cached_tokens == r.usage.input_tokens  # the same prompt again
    events = list(create(client, QUESTION, instructions=SYSTEM, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text


def test_raw_event_sequence(server):
    body = {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 6, "temperature": 0, "stream": True}
    s, _, raw = post(server, "/v1/responses", body)
    assert s == 200, raw
    events = sse_events(raw)
    names = [n for n, _ in events]
    n = len(names) - 8
    assert n >= 1
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * n + \
        ["response.output_text.done", "response.content_part.done", "response.output_item.done",
         "response.incomplete"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    item = events[2][1]["item"]
    assert events[2][1]["output_index"] == 0
    assert item["type"] == "message" and item["status"] == "in_progress" and item["content"] == []
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert events[3][1]["part"] == part and events[3][1]["item_id"] == item["id"]
    text = "".join(d["delta"] for _, d in events[4:4 + n])
    for _, d in events[4:4 + n + 2]:
        assert d["item_id"] == item["id"] and d["output_index"] == 0 and d["content_index"] == 0
    assert events[4 + n][1]["text"] == text
    assert events[5 + n][1]["part"] == {**part, "text": text}
    done = events[6 + n][1]["item"]
    assert done == {**item, "status": "incomplete", "content": [{**part, "text": text}]}
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] and final["status"] == "incomplete"
    assert final["output"] == [done] and final["usage"]["output_tokens"] == 6
    choice, _ = chat(server, [{"role": "user", "content": QUESTION}], max_tokens=6)
    assert text == choice["message"]["content"] and choice["finish_reason"] == "length"
    # The stored response is the final one.
    st, got, raw = get(server, "/v1/responses/" + final["id"])
    assert st == 200 and got == final, raw


def test_previous_response_id_continues_with_cached_tokens(client, server, count_tokens):
    r1 = create(client, QUESTION, instructions=SYSTEM, max_output_tokens=8)
    p1 = count_tokens(rendered_chat(SYSTEM, [("user", QUESTION)]))
    assert r1.usage.input_tokens == len(p1)
    r2 = create(client, Q2, instructions=SYSTEM, previous_response_id=r1.id, max_output_tokens=8)
    assert r2.previous_response_id == r1.id
    a1 = r1.output_text
    turns = [("user", QUESTION), ("assistant", a1), ("user", Q2)]
    p2 = count_tokens(rendered_chat(SYSTEM, turns))
    assert p2[:len(p1)] == p1
    assert r2.usage.input_tokens == len(p2)
    # Served from the slot's state: at least the first turn's prompt is reused.
    assert r2.usage.input_tokens_details.cached_tokens >= len(p1)
    assert r2.usage.input_tokens_details.cache_write_tokens == len(p2) - r2.usage.input_tokens_details.cached_tokens
    choice, usage = chat(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
                                  {"role": "assistant", "content": a1}, {"role": "user", "content": Q2}], max_tokens=8)
    assert r2.output_text == choice["message"]["content"] and usage["prompt_tokens"] == len(p2)
    # A third turn chains both; instructions are not carried over (as in OpenAI's API).
    r3 = create(client, "Grazie", previous_response_id=r2.id, max_output_tokens=4)
    p3 = count_tokens(rendered_chat("", turns + [("assistant", r2.output_text), ("user", "Grazie")]))
    assert r3.usage.input_tokens == len(p3)
    # Replaying the items of r1 by hand gives the same prompt as previous_response_id.
    items = [{"role": "user", "content": QUESTION}] + [o.model_dump() for o in r1.output] + \
        [{"role": "user", "content": Q2}]
    r2b = create(client, items, instructions=SYSTEM, max_output_tokens=8)
    assert r2b.usage.input_tokens == r2.usage.input_tokens and r2b.output_text == r2.output_text
    assert client.responses.retrieve(r2.id).output_text == r2.output_text


def test_unknown_or_unstored_previous_response_id(client, openai_mod):
    # OpenAI answers an unknown previous_response_id with a 400 previous_response_not_found.
    with pytest.raises(openai_mod.BadRequestError) as e:
        create(client, Q2, previous_response_id="resp_nope")
    assert e.value.status_code == 400
    assert e.value.body["code"] == "previous_response_not_found"
    assert e.value.body["param"] == "previous_response_id"
    assert "resp_nope" in e.value.body["message"]
    r = create(client, QUESTION, store=False, max_output_tokens=2)
    assert r.store is False
    with pytest.raises(openai_mod.BadRequestError):
        create(client, Q2, previous_response_id=r.id)
    with pytest.raises(openai_mod.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai_mod.NotFoundError):
        client.responses.retrieve("resp_nope")


def test_reasoning_effort_turns_thinking_on(client, server, count_tokens):
    """reasoning.effort renders the assistant turn with <think>, as the chat path's
    reasoning_effort does. This tiny model closes its think block at once, so there is no reasoning
    text (the reasoning item is checked in tests/server/test_responses.cpp) and one reasoning token,
    the `</think>` it writes."""
    r = create(client, QUESTION, reasoning={"effort": "high"}, max_output_tokens=12)
    choice, usage = chat(server, [{"role": "user", "content": QUESTION}], max_tokens=12, reasoning_effort="high")
    assert r.usage.input_tokens == usage["prompt_tokens"] == len(count_tokens(BOS + USER + QUESTION + ASSISTANT + "<think>"))
    assert r.output_text == choice["message"]["content"]
    types = (["reasoning"] if choice["message"].get("reasoning_content") else []) + ["message"]
    assert [o.type for o in r.output] == types
    assert r.usage.output_tokens_details.reasoning_tokens == 1
    assert r.reasoning.effort == "high"
    with client.responses.stream(model=MODEL_ID, input=QUESTION, reasoning={"effort": "high"}, temperature=0,
                                 max_output_tokens=12) as s:
        events = list(s)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert terminal(events).usage.output_tokens_details.reasoning_tokens == 1
    r = create(client, QUESTION, reasoning={"effort": "none"}, max_output_tokens=2)
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_function_tools_and_call_history_render_as_chat(client, server):
    fn = TOOLS_OPENAI[0]["function"]
    tools = [{"type": "function", **fn}]
    r = create(client, QUESTION, tools=tools, max_output_tokens=4)
    choice, usage = chat(server, [{"role": "user", "content": QUESTION}], tools=TOOLS_OPENAI, max_tokens=4)
    assert r.usage.input_tokens == usage["prompt_tokens"]
    assert r.output_text == choice["message"]["content"]
    assert r.tools[0].name == "get_weather" and r.tool_choice == "auto"
    args = json.dumps({"city": "Prague", "days": 3})
    items = [{"role": "user", "content": QUESTION},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
             {"type": "function_call_output", "call_id": "call_1", "output": "21 gradi"}]
    r = create(client, items, tools=tools, max_output_tokens=4)
    msgs = [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 gradi"}]
    choice, usage = chat(server, msgs, tools=TOOLS_OPENAI, max_tokens=4)
    assert r.usage.input_tokens == usage["prompt_tokens"] and r.output_text == choice["message"]["content"]
    # A forced call renders the chat path's forced prefix.
    r = create(client, QUESTION, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
               max_output_tokens=4)
    _, usage = chat(server, [{"role": "user", "content": QUESTION}], tools=TOOLS_OPENAI, max_tokens=4,
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.usage.input_tokens == usage["prompt_tokens"]


@pytest.mark.parametrize("kw,param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"temperature": 5}, "temperature"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"extra_body": {"conversation": "conv_1"}}, "conversation"),
])
def test_bad_requests_are_400(client, openai_mod, kw, param):
    kw = {"input": QUESTION, **kw}
    with pytest.raises(openai_mod.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, max_output_tokens=2, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error"


def test_malformed_bodies_raw(server):
    for body in [b"{", b"[1]", b'{"model":"m"}', b'{"input":"x","max_output_tokens":"many"}',
                 b'{"input":"x","stream":"yes"}', b'{"input":' + b"[" * 300 + b"]" * 300 + b"}"]:
        s, parsed, raw = post(server, "/v1/responses", body, raw=True)
        assert s == 400 and parsed["error"]["type"] == "invalid_request_error", raw
    s, parsed, _ = post(server, "/v1/responses", {"input": "ciao " * 5000, "max_output_tokens": 1})
    assert s == 400 and parsed["error"]["code"] == "context_length_exceeded"
    assert parsed["error"]["param"] == "input"
    s, parsed, _ = post(server, "/v1/responses", {"input": QUESTION, "max_output_tokens": 2})
    assert s == 200  # still serving


def test_store_keeps_the_last_n(tool, tmp_path, openai_mod):
    srv = start_server(tool, tmp_path / "server.log", "--responses-store", "2")
    try:
        c = openai_mod.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        ids = [create(c, f"{QUESTION} {i}", max_output_tokens=1).id for i in range(3)]
        with pytest.raises(openai_mod.NotFoundError):
            c.responses.retrieve(ids[0])  # the oldest was dropped
        with pytest.raises(openai_mod.BadRequestError):
            create(c, Q2, previous_response_id=ids[0], max_output_tokens=1)
        assert [c.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
        assert create(c, Q2, previous_response_id=ids[2], max_output_tokens=1).previous_response_id == ids[2]
        c.close()
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log()


def test_delete_removes_a_stored_response(client, server, openai_mod):
    # OpenAI's DELETE /v1/responses/{id}: the deletion object, then GET is a 404 and the id can no
    # longer be continued; a response that already continued it keeps its conversation.
    r1 = create(client, QUESTION, max_output_tokens=4)
    r2 = create(client, Q2, previous_response_id=r1.id, max_output_tokens=4)
    req = urllib.request.Request(server.url + "/v1/responses/" + r1.id, method="DELETE")
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        assert json.loads(resp.read()) == {"id": r1.id, "object": "response", "deleted": True}
    with pytest.raises(openai_mod.NotFoundError):
        client.responses.retrieve(r1.id)
    with pytest.raises(openai_mod.BadRequestError):
        create(client, Q2, previous_response_id=r1.id, max_output_tokens=1)
    with pytest.raises(openai_mod.NotFoundError):
        client.responses.delete(r1.id)  # the SDK's call; a second delete finds nothing
    # r2's history still holds r1's turn: continuing r2 renders the same prompt as replaying it.
    r3 = create(client, "Continua.", previous_response_id=r2.id, max_output_tokens=2)
    items = [{"role": "user", "content": QUESTION}] + [o.model_dump() for o in r1.output] + \
        [{"role": "user", "content": Q2}] + [o.model_dump() for o in r2.output] + \
        [{"role": "user", "content": "Continua."}]
    assert create(client, items, max_output_tokens=2).usage.input_tokens == r3.usage.input_tokens
    client.responses.delete(r2.id)  # the SDK accepts the deletion object
    assert get(server, "/v1/responses/" + r2.id)[0] == 404


def test_input_items_lists_the_stored_input(client, server, openai_mod):
    # OpenAI's GET /v1/responses/{id}/input_items: the response's own input as items with ids,
    # newest first by default, paged by limit/after; the SDK's cursor pages through them.
    items = [{"role": "user", "content": QUESTION},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "E poi?"}]},
             {"role": "user", "content": Q2, "id": "msg_mine"}]
    r = create(client, items, max_output_tokens=2)
    page = client.responses.input_items.list(r.id, order="asc")
    got = [(i.role, i.content[0].text) for i in page.data]
    assert got == [("user", QUESTION), ("assistant", "E poi?"), ("user", Q2)]
    assert page.data[2].id == "msg_mine" and all(i.id.startswith("msg_") for i in page.data)
    assert [i.content[0].type for i in page.data] == ["input_text", "output_text", "input_text"]
    desc = client.responses.input_items.list(r.id)
    assert [i.id for i in desc.data] == [i.id for i in reversed(page.data)]
    # One item a page: the SDK follows has_more/after through all three.
    assert [i.id for i in client.responses.input_items.list(r.id, order="asc", limit=1)] == \
        [i.id for i in page.data]
    s, body, _ = get(server, f"/v1/responses/{r.id}/input_items?limit=1&order=asc")
    assert s == 200 and body["has_more"] is True and body["first_id"] == body["last_id"] == page.data[0].id
    s, body, _ = get(server, f"/v1/responses/{r.id}/input_items?after=msg_mine")
    assert s == 200 and [i["content"][0]["text"] for i in body["data"]] == ["E poi?", QUESTION]
    # A plain string input is one user message.
    r2 = create(client, QUESTION, max_output_tokens=1)
    one = client.responses.input_items.list(r2.id).data
    assert len(one) == 1 and one[0].role == "user" and one[0].content[0].text == QUESTION
    for bad in ("limit=0", "limit=101", "limit=x", "order=up"):
        s, body, _ = get(server, f"/v1/responses/{r.id}/input_items?{bad}")
        assert s == 400 and body["error"]["param"] in ("limit", "order"), bad
    with pytest.raises(openai_mod.NotFoundError):
        client.responses.input_items.list("resp_nope")
