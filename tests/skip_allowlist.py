"""Skips are failures unless tests/skip_allowlist.txt allows their reason.

As a pytest plugin (tests/conftest.py loads it): every skipped test or module is checked against the
allowlist; the terminal summary lists the skips, allowed or not, and a run with a skip that no rule
allows exits 1 even when every test passed. DS4_ALLOW_ANY_SKIP=1 reports such skips without failing
(for a local run on a machine without the oracles; scripts/test.sh never sets it).

As a script, for CTest (GoogleTest's GTEST_SKIP):

    python3 tests/skip_allowlist.py ctest JUNIT.xml    # the file of `ctest --output-junit JUNIT.xml`

prints every skipped CTest test with its reason and exits 1 when one is not allowed (or when the
file has no test at all).

    python3 tests/skip_allowlist.py check NAME REASON  # exit 0 when a rule allows it
"""
from __future__ import annotations

import fnmatch
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# DS4_SKIP_ALLOWLIST names another list (tests/test_skip_allowlist.py checks the mechanism on
# rules of its own); scripts/test.sh never sets it.
ALLOWLIST = Path(os.environ.get("DS4_SKIP_ALLOWLIST") or Path(__file__).resolve().parent / "skip_allowlist.txt")
REPO = Path(__file__).resolve().parents[1]


def load_rules(path: Path = ALLOWLIST) -> list[tuple[str, re.Pattern]]:
    rules = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) != 2:
            raise ValueError(f"{path.name}:{n}: want 'TEST-GLOB  REASON-REGEX', got {line!r}")
        rules.append((parts[0], re.compile(parts[1])))
    if not rules:
        raise ValueError(f"{path} has no rule")
    return rules


def allowed(rules, name: str, reason: str) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) and rx.search(reason) for glob, rx in rules)


# --------------------------------------------------------------------------------------------
# pytest plugin
# --------------------------------------------------------------------------------------------

def _skip_reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        reason = str(lr[2])
    else:
        reason = str(lr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


class SkipAllowlist:
    def __init__(self, config):
        self.config = config
        self.rules = load_rules()
        self.skips: list[tuple[str, str, bool]] = []  # (node id, reason, allowed)

    def _record(self, report):
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        name = self._repo_relative(report.nodeid)
        reason = _skip_reason(report)
        self.skips.append((name, reason, allowed(self.rules, name, reason)))

    def _repo_relative(self, nodeid: str) -> str:
        """Node ids are relative to pytest's rootdir, which depends on the arguments: make them
        relative to the repository (tests/dir/file.py::test)."""
        path, sep, rest = nodeid.partition("::")
        try:
            path = (Path(self.config.rootpath) / path).resolve().relative_to(REPO).as_posix()
        except ValueError:
            pass
        return path + sep + rest

    def pytest_runtest_logreport(self, report):
        self._record(report)

    def pytest_collectreport(self, report):
        self._record(report)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.skips:
            return
        tr = terminalreporter
        tr.section("skips checked against tests/skip_allowlist.txt")
        for name, reason, ok in self.skips:
            tr.write_line(f"{'allowed' if ok else 'NOT ALLOWED'}: {name}: {reason}")
        bad = sum(not ok for _, _, ok in self.skips)
        if bad:
            tail = " (DS4_ALLOW_ANY_SKIP=1: not failing)" if os.environ.get("DS4_ALLOW_ANY_SKIP") == "1" else ""
            tr.write_line(f"{bad} skip(s) with a reason that tests/skip_allowlist.txt does not allow{tail}", red=True)

    def pytest_sessionfinish(self, session, exitstatus):
        if os.environ.get("DS4_ALLOW_ANY_SKIP") == "1":
            return
        # 0: every test passed; 5: nothing ran (every module skipped)
        if any(not ok for _, _, ok in self.skips) and session.exitstatus in (0, 5):
            session.exitstatus = 1


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("ds4-skip-allowlist"):
        config.pluginmanager.register(SkipAllowlist(config), "ds4-skip-allowlist")


# --------------------------------------------------------------------------------------------
# CTest
# --------------------------------------------------------------------------------------------

def gtest_skip_reason(output: str) -> str:
    """The message of GTEST_SKIP() in a GoogleTest binary's output: the lines after
    'FILE:LINE: Skipped', up to the '[  SKIPPED ]' line."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if re.search(r":\d+: Skipped$", line.rstrip()) or line.rstrip() == "Skipped":
            msg = []
            for nxt in lines[i + 1:]:
                if nxt.startswith("[  SKIPPED ]") or nxt.startswith("[       OK ]"):
                    break
                msg.append(nxt)
            return "\n".join(msg).strip()
    return ""


def check_ctest_junit(path: Path, rules) -> int:
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    if not cases:
        print(f"{path}: no test case: ctest ran nothing")
        return 1
    bad = n_skipped = 0
    for tc in cases:
        status = tc.get("status", "")
        if status not in ("notrun", "skipped") and tc.find("skipped") is None:
            continue
        n_skipped += 1
        name = tc.get("name", "")
        out = tc.findtext("system-out") or ""
        reason = gtest_skip_reason(out) or (tc.find("skipped").get("message", "") if tc.find("skipped") is not None
                                            else "")
        ok = bool(reason) and allowed(rules, name, reason)
        bad += not ok
        print(f"{'allowed' if ok else 'NOT ALLOWED'}: {name}: {reason or '(no reason printed)'}")
    print(f"ctest: {len(cases)} tests, {n_skipped} skipped, {bad} not allowed by tests/skip_allowlist.txt")
    return 1 if bad else 0


def main(argv) -> int:
    if len(argv) == 2 and argv[0] == "ctest":
        return check_ctest_junit(Path(argv[1]), load_rules())
    if len(argv) == 3 and argv[0] == "check":
        return 0 if allowed(load_rules(), argv[1], argv[2]) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
