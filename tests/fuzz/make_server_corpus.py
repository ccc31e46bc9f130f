#!/usr/bin/env python3
"""Writes the seeds of the ds4-server request fuzzer (tests/fuzz/fuzz_server_request.cpp): one
byte choosing the parser (0 chat, 1 completions, 2 Anthropic messages, 3 count_tokens, 4 responses; 200 and up
the tool-call tracker), then a request body of that API, or generated text with a DSML tool call
(the block as DeepSeek's encoding_dsv4.py writes it).
    python3 tests/fuzz/make_server_corpus.py
"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "server")

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
DSML = ("Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Prague</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")

SEEDS = {
    "chat": (0, {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}],
                 "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "stream": True}),
    "chat_tools": (0, {"messages": [{"role": "user", "content": "Weather?"},
                                    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
                                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                       "tools": [TOOL], "tool_choice": "auto", "reasoning_effort": "high"}),
    "completion": (1, {"prompt": "Quel ramo", "max_tokens": 4, "stop": "x", "seed": 3}),
    "messages": (2, {"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "S"}],
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                   "name": "get_weather", "input": {"city": "Rome"}}]},
                                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                   "content": "sunny"}]}],
                     "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
                     "thinking": {"type": "enabled", "budget_tokens": 1024}, "stop_sequences": ["END"]}),
    "count_tokens": (3, {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    "responses": (4, {"model": "m", "instructions": "Be brief.", "max_output_tokens": 8,
                      "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                                {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                                 "arguments": "{\"city\":\"Rome\"}"},
                                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
                      "tools": [{"type": "function", "name": "get_weather",
                                 "parameters": {"type": "object"}}],
                      "reasoning": {"effort": "high"}, "previous_response_id": "resp_1", "stream": True}),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (which, body) in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes([which]) + json.dumps(body, ensure_ascii=False).encode())
    # The tracker's seeds: piece sizes interleaved with the text (fuzz_server_request.cpp's track).
    text = DSML.encode()
    for name, prefilled in (("dsml", 0), ("dsml_prefilled", 1)):
        out = bytearray([200, prefilled])
        for i in range(0, len(text), 7):
            piece = text[i:i + 7]
            out += bytes([len(piece) - 1]) + piece
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(out)


if __name__ == "__main__":
    main()
