"""Fixtures of the ds4-server tests: a server (ds4_server_harness.start_server), the official
`openai` and `anthropic` SDK clients on it, and ds4's own tokenizer (`ds4 --dump-tokens`) to count
rendered prompts."""
import importlib
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


def import_sdk(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.fail(f"the `{name}` Python package is missing: pip install {name} (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def openai_mod():
    return import_sdk("openai")


@pytest.fixture(scope="module")
def client(server, openai_mod):
    c = openai_mod.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()  # no idle keep-alive connection left for the server's shutdown to wait out


@pytest.fixture(scope="module")
def anthropic_mod():
    return import_sdk("anthropic")


@pytest.fixture(scope="module")
def anthropic_client(server, anthropic_mod):
    c = anthropic_mod.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="session")
def count_tokens(tool):
    """The ids ds4's own tokenizer gives a rendered prompt (specials recognised)."""
    def ids(rendered):
        p = subprocess.run([tool("ds4"), "-m", MODEL, "--dump-tokens", "-p", rendered],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[0])
    return ids
