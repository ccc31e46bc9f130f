"""A bounded load test of ds4-server on loopback (docs/SERVER.md, Tests): DS4_LOAD_CLIENTS clients
(default 12) for DS4_LOAD_SECONDS (default 30) against --parallel 4, a mix of OpenAI and Anthropic requests,
streamed and not, through the official SDKs. Every request must succeed with a sane answer, the
latency percentiles are printed, and the server's resident memory must stay flat after warm-up."""
import os
import random
import threading
import time

from ds4_server_harness import MODEL_ID, start_server

CLIENTS = int(os.environ.get("DS4_LOAD_CLIENTS", "12"))
SECONDS = float(os.environ.get("DS4_LOAD_SECONDS", "30"))
WORDS = ["Renzo", "Lucia", "Agnese", "don Abbondio", "il lago", "Milano", "la peste", "i bravi", "il castello"]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def one_request(rng, oa, an):
    """One random request; returns the text it got."""
    kind = rng.randrange(4)
    n = rng.randint(4, 40)
    # A few conversations that grow, so that slots get prefix hits and misses.
    msgs = [{"role": "user", "content": f"Parlami di {rng.choice(WORDS)}."}]
    if rng.random() < 0.5:
        msgs += [{"role": "assistant", "content": "Va bene."}, {"role": "user", "content": rng.choice(WORDS)}]
    sampling = {"temperature": rng.choice([0, 0.8]), "seed": rng.randint(1, 1 << 30)}
    if kind == 0:
        r = oa.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=n, **sampling)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= n
        return r.choices[0].message.content
    if kind == 1:
        text, finish = "", None
        for c in oa.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=n, stream=True, **sampling):
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        assert finish in ("stop", "length")
        return text
    if kind == 2:
        r = an.messages.create(model=MODEL_ID, max_tokens=n, messages=msgs, extra_body=sampling)
        assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.output_tokens <= n
        return r.content[0].text if r.content else ""
    with an.messages.stream(model=MODEL_ID, max_tokens=n, messages=msgs, extra_body=sampling) as s:
        text = "".join(s.text_stream)
        assert s.get_final_message().stop_reason in ("end_turn", "max_tokens")
    return text


def test_load_mixed_clients(tool, tmp_path, openai_mod, anthropic_mod, capsys):
    server = start_server(tool, tmp_path / "server.log", "--parallel", "4", "--queue", "32")
    latencies, errors, lock = [], [], threading.Lock()
    t_end = time.time() + SECONDS

    def client(i):
        rng = random.Random(i)
        oa = openai_mod.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        an = anthropic_mod.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        try:
            while time.time() < t_end:
                t0 = time.time()
                try:
                    one_request(rng, oa, an)
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    with lock:
                        errors.append(repr(e))
                    continue
                with lock:
                    latencies.append(time.time() - t0)
        finally:
            oa.close()
            an.close()

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(min(5, SECONDS / 4))
        rss_warm = rss_mib(server.proc.pid)
        for t in threads:
            t.join(SECONDS + 180)
        rss_end = rss_mib(server.proc.pid)
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()[-3000:]
    latencies.sort()
    assert latencies, errors
    p50 = latencies[len(latencies) // 2]
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    with capsys.disabled():
        print(f"\nload: {CLIENTS} clients, {SECONDS:.0f} s, {len(latencies)} requests, {len(errors)} errors, "
              f"p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms, "
              f"RSS {rss_warm:.0f} -> {rss_end:.0f} MiB")
    assert not errors, errors[:10]
    assert len(latencies) >= CLIENTS
    assert rss_end - rss_warm < 64, (rss_warm, rss_end)
