"""ds4-server's Anthropic Messages API (docs/SERVER.md, Anthropic messages) through the official
`anthropic` SDK and raw HTTP. The oracles: the OpenAI path (the same conversation through
/v1/chat/completions at temperature 0 must give the same text and token counts: both run the
same engine, so this checks that /v1/messages renders the same prompt), /v1/completions on the
hand-rendered transcript (for a prefill), and ds4's own tokenizer on the prompt as docs/SERVER.md
renders it."""
import json

import pytest

from ds4_server_harness import ASSISTANT, BOS, MODEL_ID, USER, openai_chat, post, rendered_chat, sse_events, start_server

MESSAGES = "/v1/messages"
SYSTEM = "Sei un narratore."
QUESTION = "Quel ramo del lago di Como"
USER_Q = [{"role": "user", "content": QUESTION}]


def sdk_args(messages, kw):
    """The SDK's keyword arguments: sampling fields go in extra_body (SDK 2.x has no temperature,
    top_p or top_k arguments); temperature 0 and max_tokens 24 unless given."""
    extra = {k: kw.pop(k) for k in ("temperature", "top_p", "top_k") if k in kw}
    extra.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return dict(model=MODEL_ID, messages=messages, extra_body=extra, **kw)


def create(aclient, messages, **kw):
    return aclient.messages.create(**sdk_args(messages, kw))


def stream(aclient, messages, **kw):
    return aclient.messages.stream(**sdk_args(messages, kw))


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def thinking_of(message):
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def prompt_of(message):
    """The prompt's length: Anthropic reports the part not reused plus the part read from cache."""
    return message.usage.input_tokens + message.usage.cache_read_input_tokens


STOP_REASON = {"length": "max_tokens", "stop": "end_turn"}  # OpenAI finish -> Anthropic stop_reason


def is_anthropic_error(status, body, want_status, want_type="invalid_request_error"):
    return status == want_status and isinstance(body, dict) and body.get("type") == "error" \
        and body["error"]["type"] == want_type and isinstance(body["error"]["message"], str)


def test_same_text_and_counts_as_chat_completions(anthropic_client, server, count_tokens):
    r = create(anthropic_client, USER_Q, system=SYSTEM)
    choice, usage = openai_chat(server, [{"role": "system", "content": SYSTEM}, *USER_Q])
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL_ID
    assert r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"]
    assert text_of(r) and text_of(r) == choice["message"]["content"]
    assert r.usage.output_tokens == usage["completion_tokens"]
    want = len(count_tokens(rendered_chat(SYSTEM, [("user", QUESTION)])))
    assert prompt_of(r) == usage["prompt_tokens"] == want
    assert r.usage.cache_creation_input_tokens == 0
    assert r.stop_reason == STOP_REASON[choice["finish_reason"]]
    assert r.stop_sequence is None


def test_system_blocks_and_text_blocks(anthropic_client, server, count_tokens):
    """System text blocks are joined with newlines, an x-anthropic- block dropped; the text blocks of
    a message are concatenated."""
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; cc_entrypoint=cli"},
              {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Rispondi in breve."}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "text", "text": "!"}]}]
    r = create(anthropic_client, msgs, system=system, max_tokens=10, metadata={"user_id": "u-1"})
    joined = SYSTEM + "\nRispondi in breve."
    choice, usage = openai_chat(server, [{"role": "system", "content": joined},
                                         {"role": "user", "content": QUESTION + "!"}], max_tokens=10)
    assert text_of(r) == choice["message"]["content"]
    assert prompt_of(r) == usage["prompt_tokens"] == len(count_tokens(rendered_chat(joined, [("user", QUESTION + "!")])))


def test_multi_turn_reuses_the_prefix(anthropic_client, server, count_tokens):
    system = "Rispondi in breve."
    r1 = create(anthropic_client, USER_Q, system=system, max_tokens=8)
    p1 = count_tokens(rendered_chat(system, [("user", QUESTION)]))
    assert prompt_of(r1) == len(p1)
    # An answer the model did not write: the snapshot at the end of the first prompt is reused.
    answer, q2 = "ZZQ xqk 1234 !!", "E poi che accadde?"
    turn2 = USER_Q + [{"role": "assistant", "content": [{"type": "text", "text": answer}]},
                      {"role": "user", "content": q2}]
    r2 = create(anthropic_client, turn2, system=system, max_tokens=8)
    p2 = count_tokens(rendered_chat(system, [("user", QUESTION), ("assistant", answer), ("user", q2)]))
    assert p2[:len(p1)] == p1
    assert r2.usage.cache_read_input_tokens == len(p1)
    assert r2.usage.input_tokens == len(p2) - len(p1)
    choice, usage = openai_chat(server, [{"role": "system", "content": system}, *USER_Q,
                                         {"role": "assistant", "content": answer},
                                         {"role": "user", "content": q2}], max_tokens=8)
    assert text_of(r2) == choice["message"]["content"]
    assert usage["prompt_tokens"] == len(p2)
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(p2)  # the same prompt again


def test_assistant_prefill_is_continued(anthropic_client, server, count_tokens):
    prefill = "Quel ramo"
    r = create(anthropic_client, USER_Q + [{"role": "assistant", "content": prefill}], max_tokens=12)
    transcript = rendered_chat("", [("user", QUESTION)]) + prefill
    s, o, raw = post(server, "/v1/completions", {"prompt": transcript, "max_tokens": 12, "temperature": 0})
    assert s == 200, raw
    assert text_of(r) == o["choices"][0]["text"]
    assert prompt_of(r) == o["usage"]["prompt_tokens"] == len(count_tokens(transcript))
    assert r.stop_reason == STOP_REASON[o["choices"][0]["finish_reason"]]


def test_stream_equals_non_stream(anthropic_client):
    r = create(anthropic_client, USER_Q, system=SYSTEM)
    with stream(anthropic_client, USER_Q, system=SYSTEM) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text_of(r) == text_of(final)
    assert final.stop_reason == r.stop_reason and final.stop_sequence is None
    assert final.usage.output_tokens == r.usage.output_tokens
    assert prompt_of(final) == prompt_of(r)
    assert final.usage.cache_read_input_tokens == prompt_of(r)  # the same prompt again: all reused
    events = list(create(anthropic_client, USER_Q, system=SYSTEM, stream=True))
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    assert [e.type for e in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text_of(r)
    assert events[-2].delta.stop_reason == r.stop_reason


def test_raw_event_sequence(server):
    body = {"model": MODEL_ID, "max_tokens": 6, "temperature": 0, "stream": True, "messages": USER_Q}
    s, _, raw = post(server, MESSAGES, body, headers={"anthropic-version": "2023-06-01"})
    assert s == 200, raw
    events = sse_events(raw)
    names = [n for n, _ in events]
    n_deltas = len(names) - 5
    assert n_deltas >= 1
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * n_deltas + \
        ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["type"] == "message" and start["role"] == "assistant"
    assert start["content"] == [] and start["stop_reason"] is None and start["stop_sequence"] is None
    assert start["usage"]["output_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    for _, d in events[2:2 + n_deltas]:
        assert d["index"] == 0 and d["delta"]["type"] == "text_delta" and d["delta"]["text"]
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6
    assert delta["usage"]["input_tokens"] + delta["usage"]["cache_read_input_tokens"] == \
        start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"]
    assert events[-1][1] == {"type": "message_stop"}
    choice, _ = openai_chat(server, USER_Q, max_tokens=6)
    assert "".join(d["delta"]["text"] for _, d in events[2:2 + n_deltas]) == choice["message"]["content"]


def test_stop_sequences(anthropic_client, server):
    full = text_of(create(anthropic_client, USER_Q, max_tokens=40))
    assert len(full) > 12, full
    stop = full[5:11]  # spans token boundaries
    want = full[:full.find(stop)]
    r = create(anthropic_client, USER_Q, max_tokens=40, stop_sequences=["never-here", stop])
    assert text_of(r) == want
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert openai_chat(server, USER_Q, max_tokens=40, stop=[stop])[0]["message"]["content"] == want
    with stream(anthropic_client, USER_Q, max_tokens=40, stop_sequences=[stop]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == want and final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    r = create(anthropic_client, USER_Q, max_tokens=40, stop_sequences=["ZZZQ"])
    assert text_of(r) == full and r.stop_reason != "stop_sequence" and r.stop_sequence is None


def test_max_tokens_stop(anthropic_client):
    r = create(anthropic_client, USER_Q, max_tokens=3)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_top_k_and_top_p_are_honoured(anthropic_client):
    greedy = text_of(create(anthropic_client, USER_Q, max_tokens=16))
    for _ in range(2):
        assert text_of(create(anthropic_client, USER_Q, max_tokens=16, temperature=1, top_k=1)) == greedy
        assert text_of(create(anthropic_client, USER_Q, max_tokens=16, temperature=1, top_p=1e-9)) == greedy
    # Without them, sampling at temperature 1 wanders off the greedy text (else the above proves nothing).
    sampled = {text_of(create(anthropic_client, USER_Q, max_tokens=16, temperature=1)) for _ in range(4)}
    assert sampled != {greedy}


def test_thinking_blocks(anthropic_client, server, count_tokens):
    """thinking enabled renders the assistant turn with <think>; the reasoning is a thinking block,
    as reasoning_content is on the OpenAI path."""
    thinking = {"type": "enabled", "budget_tokens": 1024}
    r = create(anthropic_client, USER_Q, max_tokens=12, thinking=thinking)
    choice, usage = openai_chat(server, USER_Q, max_tokens=12, think=True)
    assert prompt_of(r) == usage["prompt_tokens"] == len(count_tokens(BOS + USER + QUESTION + ASSISTANT + "<think>"))
    assert thinking_of(r) == (choice["message"].get("reasoning_content") or "")
    assert text_of(r) == choice["message"]["content"]
    assert thinking_of(r) or text_of(r)
    assert r.content[-1].type == "text"
    if thinking_of(r):
        assert r.content[0].type == "thinking" and r.content[0].signature == r.id
    with stream(anthropic_client, USER_Q, max_tokens=12, thinking=thinking) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in r.content]
    assert thinking_of(final) == thinking_of(r) and text_of(final) == text_of(r)
    # Off by default.
    assert [b.type for b in create(anthropic_client, USER_Q, max_tokens=4).content] == ["text"]


def test_count_tokens(anthropic_client, count_tokens):
    n = anthropic_client.messages.count_tokens(model=MODEL_ID, system=SYSTEM, messages=USER_Q)
    assert n.input_tokens == len(count_tokens(rendered_chat(SYSTEM, [("user", QUESTION)])))
    n = anthropic_client.messages.count_tokens(model=MODEL_ID, messages=USER_Q, thinking={"type": "enabled", "budget_tokens": 1024})
    assert n.input_tokens == len(count_tokens(BOS + USER + QUESTION + ASSISTANT + "<think>"))


@pytest.mark.parametrize("kw,needle", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "image blocks are not supported"),
    ({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
     "document blocks are not supported"),
    ({"messages": USER_Q, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "server tools"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}]},
     "tool_use blocks belong in assistant messages"),
    ({"messages": USER_Q, "temperature": 1.5}, "temperature"),
    ({"messages": USER_Q, "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "ciao " * 5000}]}, "configured context size"),
])
def test_errors_with_the_sdk(anthropic_client, anthropic_mod, kw, needle):
    kw = {"max_tokens": 4, **kw}
    with pytest.raises(anthropic_mod.BadRequestError) as e:
        create(anthropic_client, kw.pop("messages"), **kw)
    assert e.value.status_code == 400
    assert is_anthropic_error(400, e.value.body, 400), e.value.body
    assert needle in e.value.body["error"]["message"]


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1]", b'{"messages": [', b'{"max_tokens": 5}',
    b'{"messages": [{"role": "user", "content": "x"}]}',  # no max_tokens
    b'{"max_tokens": null, "messages": [{"role": "user", "content": "x"}]}',
    b'{"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}',
    b'{"max_tokens": 5, "messages": [{"content": "x"}]}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_k": "k"}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stream": 1}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}}',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 300 + b"]" * 300 + b"}",
])
def test_malformed_bodies_get_anthropic_errors(server, body):
    s, parsed, raw = post(server, MESSAGES, body, raw=True)
    assert is_anthropic_error(s, parsed, 400), (s, raw[:300])


def test_missing_max_tokens_and_other_statuses(server):
    s, parsed, _ = post(server, MESSAGES, {"model": MODEL_ID, "messages": USER_Q})
    assert is_anthropic_error(s, parsed, 400)
    assert set(parsed) == {"type", "error"} and "max_tokens" in parsed["error"]["message"]
    s, parsed, _ = post(server, MESSAGES + "/nothing", {"max_tokens": 1, "messages": USER_Q})
    assert is_anthropic_error(s, parsed, 404, "not_found_error")
    s, parsed, _ = post(server, MESSAGES, b"{" + b" " * (17 << 20) + b"}", raw=True)
    assert is_anthropic_error(s, parsed, 413, "request_too_large")
    s, parsed, _ = post(server, MESSAGES, {"max_tokens": 1, "messages": [{"role": "user", "content": "ciao " * 5000}]})
    assert is_anthropic_error(s, parsed, 400) and parsed["error"]["n_ctx"] == 4096
    assert parsed["error"]["n_prompt_tokens"] > 4096
    # The OpenAI paths keep their own shape.
    s, parsed, _ = post(server, "/v1/chat/completions", {"messages": []})
    assert s == 400 and "type" not in parsed and parsed["error"]["code"] == "invalid_request"
    assert "internal error" not in server.log()


@pytest.fixture(scope="module")
def keyed_server(tool, tmp_path_factory):
    s = start_server(tool, tmp_path_factory.mktemp("keyed") / "server.log", "--api-key", "sekrit")
    yield s
    s.stop()


def test_api_key_as_x_api_key_or_bearer(keyed_server, anthropic_mod):
    ok = anthropic_mod.Anthropic(base_url=keyed_server.url, api_key="sekrit", max_retries=0, timeout=60)
    assert create(ok, USER_Q, max_tokens=2).usage.output_tokens == 2  # sent as x-api-key
    ok.close()
    bad = anthropic_mod.Anthropic(base_url=keyed_server.url, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic_mod.AuthenticationError) as e:
        create(bad, USER_Q, max_tokens=2)
    assert is_anthropic_error(401, e.value.body, 401, "authentication_error")
    bad.close()
    body = {"max_tokens": 2, "messages": USER_Q}
    s, parsed, _ = post(keyed_server, MESSAGES, body, headers={"Authorization": "Bearer sekrit"})
    assert s == 200 and parsed["usage"]["output_tokens"] == 2
    s, parsed, _ = post(keyed_server, MESSAGES, body)
    assert is_anthropic_error(s, parsed, 401, "authentication_error")
    assert "x-api-key" in parsed["error"]["message"]
    # x-api-key opens the OpenAI paths too.
    s, parsed, _ = post(keyed_server, "/v1/chat/completions", body, headers={"x-api-key": "sekrit"})
    assert s == 200 and parsed["object"] == "chat.completion"
