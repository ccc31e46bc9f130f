"""Fixtures of the ds4-server tests: a server (ds4_server_harness.start_server), the official
`openai` SDK client on it, and ds4's own tokenizer (`ds4 --dump-tokens`) to count rendered prompts."""
import json
import subprocess

import pytest

from ds4_server_harness import MODEL, start_server


@pytest.fixture(scope="module")
def server(tool, tmp_path_factory):
    s = start_server(tool, tmp_path_factory.mktemp("server") / "server.log")
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.log()  # SIGTERM: a clean shutdown


@pytest.fixture(scope="module")
def openai_mod():
    try:
        import openai
    except ImportError:
        pytest.fail("the `openai` Python package is missing: pip install openai (scripts/setup.sh installs it)")
    return openai


@pytest.fixture(scope="module")
def client(server, openai_mod):
    c = openai_mod.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()  # no idle keep-alive connection left for the server's shutdown to wait out


@pytest.fixture(scope="session")
def count_tokens(tool):
    """The ids ds4's own tokenizer gives a rendered prompt (specials recognised)."""
    def ids(rendered):
        p = subprocess.run([tool("ds4"), "-m", MODEL, "--dump-tokens", "-p", rendered],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[0])
    return ids
