"""ds4-server through the official `openai` SDK (docs/SERVER.md): models, chat and completions,
streaming equal to non-streaming at temperature 0, limits, stop sequences, usage counted by ds4's
own tokenizer, KV reuse across turns."""
import pytest

from ds4_server_harness import ASSISTANT, BOS, MODEL_ID, USER, rendered_chat

SYSTEM = "Sei un narratore."
QUESTION = "Quel ramo del lago di Como"


def chat(client, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model=MODEL_ID, messages=messages, **kw)


def stream_chat(client, messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    text, finish, usage, roles = "", None, None, []
    for ch in client.chat.completions.create(model=MODEL_ID, messages=messages, stream=True,
                                             stream_options={"include_usage": True}, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish, usage, roles


def test_models_list_and_retrieve(client, openai_mod):
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    for alias in ["deepseek-v4-flash", MODEL_ID + ".gguf"]:
        assert client.models.retrieve(alias).id == MODEL_ID
    with pytest.raises(openai_mod.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_stream_equals_non_stream(client):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    r = chat(client, msgs)
    assert r.object == "chat.completion" and r.model == MODEL_ID
    assert r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert text
    s_text, s_finish, s_usage, roles = stream_chat(client, msgs)
    assert roles == ["assistant"]
    assert s_text == text
    assert s_finish == r.choices[0].finish_reason
    assert s_usage.prompt_tokens == r.usage.prompt_tokens
    assert s_usage.completion_tokens == r.usage.completion_tokens


def test_chat_usage_is_our_tokenizer_count(client, count_tokens):
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "text", "text": "!"}]}]
    r = chat(client, msgs, max_tokens=4)
    want = len(count_tokens(rendered_chat(SYSTEM, [("user", QUESTION + "!")])))
    assert r.usage.prompt_tokens == want
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_tokens_gives_length(client):
    r = chat(client, [{"role": "user", "content": QUESTION}], max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_completion_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def test_stop_sequence(client):
    msgs = [{"role": "user", "content": QUESTION}]
    full = chat(client, msgs, max_tokens=40).choices[0].message.content
    assert len(full) > 12, full
    # A stop sequence that spans token boundaries: the text must end right before its first match.
    stop = full[5:11]
    want = full[:full.find(stop)]
    r = chat(client, msgs, max_tokens=40, stop=stop)
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == "stop"
    s_text, s_finish, _, _ = stream_chat(client, msgs, max_tokens=40, stop=[stop, "never-here"])
    assert s_text == want and s_finish == "stop"
    # A sequence that never comes: the held-back tail is released, the text is unchanged.
    assert chat(client, msgs, max_tokens=40, stop=["ZZZQ"]).choices[0].message.content == full
    s_text, _, _, _ = stream_chat(client, msgs, max_tokens=40, stop=[full[-1] + "ZZZQ"])
    assert s_text == full


def test_completions(client, count_tokens):
    prompt = "La vigna di Renzo"
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
    assert r.object == "text_completion"
    text = r.choices[0].text
    assert text and r.choices[0].finish_reason in ("stop", "length")
    want = count_tokens(BOS + "You are a helpful assistant" + USER + prompt + ASSISTANT + "</think>")
    assert r.usage.prompt_tokens == len(want)
    streamed, finish = "", None
    for ch in client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0, stream=True):
        for c in ch.choices:
            streamed += c.text
            finish = c.finish_reason or finish
    assert streamed == text and finish == r.choices[0].finish_reason


def test_second_turn_reuses_the_prefix(client, count_tokens):
    q2 = "E poi che accadde?"
    turn1 = [{"role": "system", "content": "Rispondi in breve."}, {"role": "user", "content": QUESTION}]
    r1 = chat(client, turn1, max_tokens=8)
    p1 = count_tokens(rendered_chat("Rispondi in breve.", [("user", QUESTION)]))
    assert r1.usage.prompt_tokens == len(p1)
    # An assistant text the model did not write: the live tokens diverge there, and the snapshot at
    # the end of the first prompt is what can be reused.
    answer = "ZZQ xqk 1234 !!"
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": q2}]
    r2 = chat(client, turn2, max_tokens=8)
    p2 = count_tokens(rendered_chat("Rispondi in breve.", [("user", QUESTION), ("assistant", answer), ("user", q2)]))
    assert p2[:len(p1)] == p1
    assert r2.usage.prompt_tokens == len(p2)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(p1)
    # Replaying the model's own answer reuses at least the previous prompt as well.
    turn3 = turn2 + [{"role": "assistant", "content": r2.choices[0].message.content}, {"role": "user", "content": "Grazie"}]
    r3 = chat(client, turn3, max_tokens=4)
    assert r3.usage.prompt_tokens_details.cached_tokens >= len(p2)
    # The same request again: the whole prompt is cached.
    r4 = chat(client, turn3, max_tokens=4)
    assert r4.usage.prompt_tokens_details.cached_tokens >= len(p2)
    assert r4.choices[0].message.content == r3.choices[0].message.content


def test_malformed_requests_are_400(client, openai_mod):
    with pytest.raises(openai_mod.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[])
    with pytest.raises(openai_mod.BadRequestError):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], temperature=-1)
    with pytest.raises(openai_mod.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"top_k": "many"})
    assert e.value.status_code == 400
    with pytest.raises(openai_mod.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt="ciao " * 5000, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"


def test_thinking_reasoning_content(client, count_tokens):
    """think: true renders the assistant turn with <think>; what the model writes before </think>
    is reasoning_content (all of it when, as with this tiny model, </think> never comes)."""
    msgs = [{"role": "user", "content": QUESTION}]
    r = chat(client, msgs, max_tokens=12, extra_body={"think": True})
    want = count_tokens(BOS + USER + QUESTION + ASSISTANT + "<think>")
    assert r.usage.prompt_tokens == len(want)
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content", "")
    assert reasoning or m.content
    streamed_r, streamed_c = "", ""
    for ch in client.chat.completions.create(model=MODEL_ID, messages=msgs, stream=True, temperature=0,
                                             max_tokens=12, extra_body={"think": True}):
        for c in ch.choices:
            streamed_r += (c.delta.model_extra or {}).get("reasoning_content") or ""
            streamed_c += c.delta.content or ""
    assert (streamed_r, streamed_c) == (reasoning or "", m.content)
    # Non-thinking by default: the same question renders </think> and has no reasoning.
    r = chat(client, msgs, max_tokens=4)
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_default_max_tokens_is_dash_n(client):
    # The fixture's server runs with -n 16: a request without a limit stops there.
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}], temperature=0)
    assert r.usage.completion_tokens <= 16
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 16
