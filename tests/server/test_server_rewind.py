"""ds4-server's rewind points (docs/SERVER.md, Sessions and KV reuse): a conversation whose earlier
message was edited resumes from the last rewind point inside the prefix it shares with the slot's
tokens, and answers as a server that evaluated the edited conversation from the start (greedy,
so equal texts follow from equal logits; tests/runtime/test_session_rewind.cpp compares the
logits themselves bit for bit). The counts come from ds4's own tokenizer (`ds4 --dump-tokens`)."""
import pytest

from ds4_server_harness import MODEL_ID, post, rendered_chat, start_server

INTERVAL = 8
FIRST = ("Quel ramo del lago di Como, che volge a mezzogiorno, tra due catene non interrotte di "
         "monti, tutto a seni e a golfi, a seconda dello sporgere e del rientrare di quelli.")
EDITED = FIRST.replace("a seconda dello sporgere e del rientrare di quelli.", "vien quasi a un tratto a ristringersi.")
ANSWER, NEXT = "Va bene.", "E poi?"


def conversation(first):
    return [{"role": "user", "content": first}, {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": NEXT}]


def rendered(first):
    return rendered_chat("", [("user", first), ("assistant", ANSWER), ("user", NEXT)])


def ask(server, messages):
    s, parsed, raw = post(server, "/v1/chat/completions",
                          {"model": MODEL_ID, "messages": messages, "temperature": 0, "max_tokens": 12})
    assert s == 200, raw
    return parsed["choices"][0]["message"]["content"], parsed["usage"]


@pytest.fixture(scope="module")
def prompts(count_tokens):
    p1, p2 = count_tokens(rendered(FIRST)), count_tokens(rendered(EDITED))
    common = next(i for i, (a, b) in enumerate(zip(p1, p2)) if a != b)
    # enough shared tokens for a rewind point, and few enough in all that none is thinned out
    assert INTERVAL <= common < len(p1) - INTERVAL and len(p1) + 12 < 32 * INTERVAL
    return p1, p2, common


def cold_answer(tool, tmp_path, name, messages):
    s = start_server(tool, tmp_path / f"{name}.log")
    try:
        text, usage = ask(s, messages)
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        return text
    finally:
        s.stop()


def test_an_edited_earlier_message_resumes_from_the_last_point_before_the_edit(tool, tmp_path, prompts):
    p1, p2, common = prompts
    s = start_server(tool, tmp_path / "rewind.log", "--rewind-interval", str(INTERVAL))
    try:
        text1, usage1 = ask(s, conversation(FIRST))
        assert usage1["prompt_tokens"] == len(p1) and usage1["prompt_tokens_details"]["cached_tokens"] == 0
        text2, usage2 = ask(s, conversation(EDITED))
        assert usage2["prompt_tokens"] == len(p2)
        assert usage2["prompt_tokens_details"]["cached_tokens"] == common // INTERVAL * INTERVAL
        # and back to the first version: the points before the edit are still there
        again, usage3 = ask(s, conversation(FIRST))
        assert usage3["prompt_tokens_details"]["cached_tokens"] == common // INTERVAL * INTERVAL
        assert again == text1
        assert "a rewind point every 8 tokens" in s.log()
    finally:
        s.stop()
    assert text2 == cold_answer(tool, tmp_path, "cold", conversation(EDITED))


def test_without_periodic_points_an_edit_evaluates_everything(tool, tmp_path, prompts):
    s = start_server(tool, tmp_path / "none.log", "--rewind-interval", "0")
    try:
        ask(s, conversation(FIRST))
        _, usage = ask(s, conversation(EDITED))
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        # the end of the last prompt is still a point: the same request again is all cached
        _, usage = ask(s, conversation(EDITED))
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(prompts[1])
    finally:
        s.stop()


@pytest.mark.parametrize("flags,message", [
    (["--rewind-points", "0"], "--rewind-points"),
    (["--rewind-interval", "-1"], "--rewind-interval"),
    (["--rewind-interval", "x"], "--rewind-interval"),
])
def test_bad_rewind_flags_exit_2_naming_the_flag(tool, flags, message):
    import subprocess
    from ds4_server_harness import MODEL
    p = subprocess.run([tool("ds4-server"), "-m", MODEL, "--port", "0", *flags],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
