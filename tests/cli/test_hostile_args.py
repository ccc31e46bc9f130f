"""Every tool, driven with hostile arguments, ends with a message and a documented exit code.

The contract (docs/CLI.md): no signal, no abort (134) or crash (139), exit status 0, 1 or 2, and a
failure says why in one line on stderr starting with the tool's name. The chat must answer the
next turn after hostile commands. Run it against the sanitizer build as well:
    DS4_BUILD_DIR=build-asan python3 -m pytest tests/cli/test_hostile_args.py
(DS4_BIN_DIR, when set, names the folder of the binaries directly: tests/conftest.py.)
"""
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Numbers no option accepts as written, or only at its limits.
NUMBERS = ["-1", "0", "nan", "inf", "-inf", "1e999", "99999999999999999999", "4294967296", "1.5",
           "0x10", "", "abc", "9" * 400]
GARBAGE = os.fsdecode(b"\xff\xfe\x80\x01garbage")
LONG = "x" * 100000
SANITIZER_MARKS = ("terminate called", "AddressSanitizer", "LeakSanitizer", "runtime error:",
                   "Segmentation fault", "Aborted")


@pytest.fixture(autouse=True)
def in_scratch_folder(tmp_path, monkeypatch):
    """Relative output paths (GARBAGE is one) are written into a scratch folder, never the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def files(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    tiny = d / "tiny.gguf"
    subprocess.run([tool("ds4-mkmodel"), "--shape", "tiny", "--quant", "q8_0", "--out", str(tiny), "-q",
                    "--vocab", os.path.join(REPO, "models", "ds4-vocab.gguf")], check=True, timeout=300)
    data = tiny.read_bytes()
    (d / "trunc.gguf").write_bytes(data[: len(data) // 2])
    (d / "garbage.bin").write_bytes(bytes(range(256)) * 64)
    (d / "sub").mkdir()
    return {"tiny": str(tiny), "trunc": str(d / "trunc.gguf"), "garbage": str(d / "garbage.bin"),
            "dir": str(d / "sub"), "missing": str(d / "no-such-dir" / "file"), "out": str(d / "out.bin"),
            "unwritable": str(tiny) + "/x.out", "text": os.path.join(REPO, "README.md")}


def check(tool_name, p, args):
    what = f"{tool_name} {[a[:60] for a in args]}"
    assert p.returncode in (0, 1, 2), f"{what}: exit {p.returncode}\n{p.stderr[-3000:]}"
    for mark in SANITIZER_MARKS:
        assert mark not in p.stderr, f"{what}: {mark}\n{p.stderr[-3000:]}"
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert lines, f"{what}: exit {p.returncode} with nothing on stderr"
        last = lines[-1]
        assert last.startswith(f"{tool_name}: ") and len(last) > len(tool_name) + 3, f"{what}: {last!r}"


def run(tool, tool_name, args, stdin=None, timeout=120):
    p = subprocess.run([tool(tool_name), *args], capture_output=True, text=True, errors="replace",
                       input=stdin if stdin is not None else "", timeout=timeout)
    check(tool_name, p, args)
    return p


def path_values(f):
    return [f["dir"], f["missing"], "", "/dev/null", f["trunc"], f["garbage"], f["unwritable"], GARBAGE]


def ds4_cases(f):
    base = ["-m", f["tiny"], "-p", "hi", "--nothink", "-n", "2", "-c", "64"]
    cases = []
    for flag in ["-c", "-n", "--temp", "--top-p", "--min-p", "--top-k", "--seed", "-t", "--chunk",
                 "--logprobs-top-k"]:
        cases += [base + [flag, v] for v in NUMBERS]
    for v in path_values(f):
        cases += [["-m", v, "-p", "hi", "-n", "1"], ["-m", f["tiny"], "--prompt-file", v, "-n", "1", "-c", "64"],
                  base + ["--dump-logprobs", v]]
    cases += [
        ["--bogus"], ["-Z"], ["---"], ["-"], ["--=x"], [GARBAGE], ["--" + "a" * 10000],
        ["-m", f["tiny"], "-m", f["tiny"], "-p", "hi"], ["-p", "a", "-p", "b", "-m", f["tiny"]],
        ["-m", f["tiny"], "-p", LONG, "-c", "64"], base + ["--system", LONG],
        ["-m", f["tiny"], "--dump-tokens"], ["-m", f["tiny"], "--dump-logprobs", f["out"]],
        base + ["--backend", GARBAGE], base + ["--backend", ""], base + ["--backend", LONG], base + ["--cuda"],
        base + ["--backend", "cuda"], base + ["--cpu", "--cuda"], ["-m", f["trunc"], "--inspect", "--cuda"],
        ["-m", f["dir"], "--inspect"],
        ["-m", f["tiny"], "--dump-tokens", "-p", GARBAGE],
        ["-m", f["tiny"], "-p", "hi", "-n", "1", "-c", "2000000000"],
        ["-m", f["tiny"], "-p", "hi", "-n", "1", "-c", "4294967295"],
    ]
    return cases + ssd_cases(base, f)


# The SSD-streaming flags (tools/common/ssd_streaming_option.h), after a tool's valid base arguments; the
# popularity files go to a folder of the scratch directory.
SSD = ["--ssd-streaming", "--ssd-streaming-cache-dir", "ssd-cache"]
BUDGETS = NUMBERS + ["banana", "1GB", "0.5MB", "100%", "0%", "1e999%", "auto", "AUTO", GARBAGE, LONG]


def ssd_cases(base, f):
    cases = [base + SSD + ["--ssd-streaming-cache-experts", v] for v in BUDGETS]
    cases += [base + SSD + ["--ssd-streaming-preload-experts", v] for v in NUMBERS]
    cases += [base + SSD + ["--ssd-streaming-reader", v] for v in ["", "mmap", GARBAGE, "pool", "io_uring"]]
    cases += [base + SSD + ["--ssd-streaming-cache-dir", v] for v in path_values(f)]
    cases += [base + ["--ssd-streaming-cold"], base + ["--ssd-streaming-cache-experts", "4"],
              base + SSD + ["--cuda"], base + SSD + ["--ssd-streaming-buffered", "--ssd-streaming-cold"],
              base + SSD + ["--ssd-streaming-cold", "--ssd-streaming-preload-experts", "1"],
              base + SSD + ["--ssd-streaming-cache-experts"]]
    # The CUDA backend's host tier: refused without --cuda, parsed with it (no device here).
    cases += [base + SSD + ["--ssd-streaming-host-cache", v] for v in ["banana", "0", "8", LONG]]
    cases += [base + SSD + ["--cuda", "--ssd-streaming-host-cache", v] for v in ["banana", "0", "1e999%", "8"]]
    cases += [base + SSD + ["--cuda", "--ssd-streaming-cache-experts", v] for v in ["1", "0.5MB", "100%"]]
    cases += [base + ["--ssd-streaming-host-cache", "8"], base + SSD + ["--ssd-streaming-host-cache"]]
    return cases


def bench_cases(f):
    base = ["-m", f["tiny"], "--prompt-file", f["text"], "--ctx-start", "16", "--ctx-max", "16", "-n", "2"]
    cases = []
    for flag in ["--ctx-start", "--ctx-max", "--ctx-alloc", "--step-incr", "--step-mul", "-n", "--chunk",
                 "--runs", "-t", "--max-regress"]:
        cases += [base + [flag, v] for v in NUMBERS]
    for v in path_values(f):
        cases += [["-m", v, "--prompt-file", f["text"]], ["-m", f["tiny"], "--prompt-file", v],
                  ["-m", f["tiny"], "--chat-prompt-file", v], base + ["--csv", v], base + ["--baseline", v]]
    cases += [["--bogus"], [GARBAGE], base + ["--backend", GARBAGE], base + ["--backend", LONG], base + ["--cuda"],
              base + ["--backend", "cuda", "--cpu"], base + ["--metal"], base + ["--ctx-max", "4000000000"],
              ["-m", f["tiny"], "--prompt-file", f["text"], "--ctx-start", "1", "--ctx-max", "4000000000",
               "--step-incr", "1"], base + ["--system", LONG], base + ["--ctx-alloc", "4294967295"]]
    cases += [base + SSD + ["--ssd-streaming-cache-experts", v] for v in ["banana", "1", "0.5MB", "50%", LONG]]
    cases += [base + SSD + ["--warm-weights"], base + SSD + ["--cuda"], base + ["--ssd-streaming-cold"]]
    return cases


def other_tool_cases(f):
    quant = [[f["tiny"], f["out"], "--quant", v] for v in ["", "q3", GARBAGE]]
    quant += [[v, f["out"], "--quant", "q8_0"] for v in path_values(f)]
    quant += [[f["tiny"], v, "--quant", "q8_0"] for v in [f["dir"], "", f["unwritable"], f["tiny"]]]
    quant += [[f["tiny"], f["out"], "--quant", "q8_0", "-t", v] for v in NUMBERS]
    quant += [["--bogus"], [], [f["tiny"]], [GARBAGE, GARBAGE, "--quant", GARBAGE]]
    dump = [[v] for v in path_values(f)] + [[], ["--bogus"], [f["tiny"], f["tiny"]], ["--json", f["trunc"]]]
    mk = [["--out", v] for v in [f["dir"], "", f["unwritable"], GARBAGE + "/x"]]
    mk += [["--out", f["out"], "--shape", v] for v in path_values(f) + ["huge", LONG]]
    mk += [["--out", f["out"], "--quant", v] for v in ["", "q3", GARBAGE]]
    mk += [["--out", f["out"], "--vocab", v] for v in path_values(f)]
    mk += [["--out", f["out"], "--seed", v] for v in NUMBERS]
    mk += [["--bogus"], []]
    test = [["--bogus"], [GARBAGE], ["-t", "-1"], ["-t", "abc"], ["--case"], ["--list", "--list"],
            ["--logprob-vectors", "--vocab", f["dir"]], ["--logprob-vectors", "--vocab", f["missing"]],
            ["--logprob-vectors", "--vocab", "/dev/null"], ["--logprob-vectors", "--vector-file", f["dir"]],
            ["--kv-roundtrip", "--consistency-model", f["trunc"]],
            ["--kv-roundtrip", "--consistency-model", f["dir"]],
            ["--backend", GARBAGE], ["--backend", LONG], ["--cuda", "--kv-roundtrip"], ["--cpu", "--cuda"],
            ["--backend-parity"], ["--backend-parity", "--consistency-model", f["trunc"]],
            ["--backend-parity", "-m", f["garbage"]], ["--backend-parity", "-p", GARBAGE, "-p", "b"],
            ["--ssd-streaming-cache-pressure", "--cuda"], ["--ssd-streaming", "--cuda", "--kv-roundtrip"],
            ["--ssd-streaming-cold", "--kv-roundtrip"], ["--ssd-streaming-cache-pressure", "--vocab", f["dir"]]]
    test += [["--kv-roundtrip", *SSD, "--ssd-streaming-cache-experts", v] for v in ["banana", "1", "2", "auto"]]
    test += [["--backend-parity", "--parity-bound", v] for v in NUMBERS]
    test += [["--backend-parity", "-n", v] for v in NUMBERS]
    test += [["--backend-parity", "--prompt-file", v] for v in path_values(f)]
    return {"ds4-quantize": quant, "ds4-gguf-dump": dump, "ds4-mkmodel": mk, "ds4-test": test}


def test_ds4(tool, files):
    for args in ds4_cases(files):
        run(tool, "ds4", args)


def test_ds4_bench(tool, files):
    for args in bench_cases(files):
        run(tool, "ds4-bench", args)


def server_cases(f):
    # An address no machine has: where every value is accepted the server loads the model, sizes
    # its session, and then fails to bind (exit 1) instead of serving forever.
    base = ["-m", f["tiny"], "--host", "256.0.0.1", "-c", "64"]
    cases = []
    for flag in ["--port", "-c", "-n", "-t", "--parallel", "--queue", "--keepalive", "--read-timeout",
                 "--write-timeout", "--idle-timeout", "--responses-store"]:
        cases += [base + [flag, v] for v in NUMBERS]
    cases += [base + ["--host", v] for v in ["", GARBAGE, LONG]]
    cases += [base + ["--api-key", v] for v in ["", GARBAGE, LONG]]
    cases += [base + ["--backend", v] for v in ["", "tpu", GARBAGE]]
    cases += [["-m", v, "--host", "256.0.0.1"] for v in path_values(f)]
    cases += [base + SSD + ["--ssd-streaming-cache-experts", v] for v in ["banana", "1", "0.5MB", "50%", LONG]]
    cases += [base + SSD + ["--cuda"], base + ["--ssd-streaming-cold"]]
    # The disk KV cache: its directory (a file, missing parents, unwritable, garbage) and its
    # numbers, with and without the directory they need.
    kv = base + ["--kv-disk-dir", os.path.join(f["dir"], "kv")]
    cases += [base + ["--kv-disk-dir", v] for v in path_values(f) + [LONG]]
    for flag in ["--kv-disk-space-mb", "--kv-cache-min-tokens", "--kv-cache-cold-max-tokens",
                 "--kv-cache-continued-interval-tokens", "--kv-cache-boundary-align-tokens",
                 "--kv-cache-boundary-trim-tokens"]:
        cases += [kv + [flag, v] for v in NUMBERS] + [base + [flag, "1"]]
    cases += [kv + ["--cuda"]]
    return cases + [base + ["--bogus"], base + ["--port"]]


def test_ds4_server(tool, files):
    for args in server_cases(files):
        run(tool, "ds4-server", args, timeout=60)


@pytest.mark.parametrize("tool_name", ["ds4-quantize", "ds4-gguf-dump", "ds4-mkmodel", "ds4-test"])
def test_other_tools(tool, files, tool_name):
    for args in other_tool_cases(files)[tool_name]:
        run(tool, tool_name, args)


@pytest.mark.parametrize("env", [{"DS4_THREADS": v} for v in ["-1", "abc", "99999999999", "1.5", GARBAGE]]
                         + [{"DS4_SIMD": v} for v in ["avx9", "AVX2 ", GARBAGE]])
def test_bad_environment(tool, files, env):
    for tool_name, args in [("ds4", ["-m", files["tiny"], "-p", "hi", "-n", "1"]),
                            ("ds4-bench", ["-m", files["tiny"], "--prompt-file", files["text"]]),
                            ("ds4-quantize", [files["tiny"], files["out"], "--quant", "q8_0"]),
                            ("ds4-test", ["--prefill-decode"])]:
        p = subprocess.run([tool(tool_name), *args], capture_output=True, text=True, errors="replace",
                           env={**os.environ, **env}, timeout=120)
        check(tool_name, p, args)
        assert p.returncode == 2 and list(env)[0] in p.stderr, (tool_name, env, p.stderr)


def test_hostile_chat_commands_leave_the_chat_working(tool, files):
    script = "\n".join([
        f"/read {files['dir']}", f"/read {files['missing']}", "/read", "/ctx 99999999999999999999", "/ctx -5",
        "/ctx abc", "/ctx", "/ctx 1.5", "/ctx 2000000000", f"/{GARBAGE}", "/clear", "/" + "x" * 10000,
        "hello", "/quit"]) + "\n"
    p = run(tool, "ds4", ["-m", files["tiny"], "-n", "3", "--temp", "0", "--nothink", "-c", "256"], stdin=script)
    assert p.returncode == 0, p.stderr
    assert f"/read {files['dir']} is a directory" in p.stderr
    assert p.stderr.count("/ctx needs a positive number") == 5, p.stderr
    assert "/ctx 2000000000 is above the model's context length; using 4096" in p.stderr
    assert "conversation cleared" in p.stderr
    assert p.stderr.count("ds4: prefill:") == 1, p.stderr  # the turn after them all is answered
