"""A model's code runs in a bubblewrap sandbox, and nothing of this process's secrets reaches a
report: `k3a eval run` against a local endpoint answering every request with hostile code
(reads the parent's environment and the AWS credentials file and prints them, writes files,
connects to a loopback listener, double-forks a process meant to outlive the run, overwrites
the old harness's globals), with fake secrets in k3a's environment; and where no sandbox can
be had, the code cases are not run and the evaluation fails closed unless the policy says
otherwise."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from k3artifacts.readiness.code_run import NoSandbox, run_cases, sandbox
from k3artifacts.readiness.record import evaluate
from k3artifacts.serving.render.common import served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import check_gates, use_policy
from tests.fixtures.people import person
from tests.support.openai_server import start
from tests.support.releases import Releases

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="needs Debian's bubblewrap (bwrap)")
SUITE = "eval-suites/k3-core.yaml"


def _hostile(marker: str, port: int, secret: str, home: Path, outside: Path) -> str:
    """Code for both code cases of the suite, short enough (in space-separated words) not to
    be cut at their max_tokens. ``secret``: values of k3a's secrets the answer carries itself
    (as a model that saw them would), to be cut out of everything k3a prints and records."""
    return "\n".join([
        "import os,socket,sys,builtins",
        "L=[]",
        f"for p in['/proc/%d/environ'%os.getppid(),'/proc/1/environ','{home}/.aws/credentials']:",
        "\ttry:L.append(open(p,'rb').read().decode('latin1'))",
        "\texcept Exception as e:L.append(repr(e))",
        f"print('LEAK',L,'{secret}');sys.stderr.write('LEAK%r{secret}'%L)",
        f"for p in['/tmp/k3a-hostile-{marker}','{outside}','/usr/k3a-hostile-{marker}']:",
        "\ttry:open(p,'w').write('x')",
        "\texcept Exception as e:L.append(repr(e))",
        f"try:socket.create_connection(('127.0.0.1',{port}),timeout=2)",
        "except Exception as e:L.append(repr(e))",
        "if os.fork()==0:",
        "\tos.setsid()",
        "\tif os.fork()==0:os.execv(sys.executable,[sys.executable,'-c','import time,socket;"
        f"time.sleep(5);socket.create_connection((\"127.0.0.1\",{port}))','{marker}'])",
        "\tos._exit(0)",
        # The old in-process harness was turned off by overwriting its names: nothing to turn
        # off now, and the sandbox holds whatever follows.
        "g=globals();g['REFUSED']=();g['len']=lambda x:0;builtins.len=lambda x:0",
        f"def reverse_words(s):return'{secret}'+repr(L)",
        f"def is_prime(n):return'{secret}'+repr(L)",
    ])


def _processes_with_arg(arg: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if arg.encode() in argv:
            found.append(int(entry.name))
    return found


@needs_bwrap
def test_hostile_code_is_contained_and_no_secret_reaches_the_record(tmp_path):
    store_root = tmp_path / "store"
    release = Releases(FileStore(store_root), tmp_path / "scratch").release()
    secrets = {"AWS_SECRET_ACCESS_KEY": "fake-aws-secret-" + uuid.uuid4().hex,
               "AWS_SESSION_TOKEN": "fake-session-token-" + uuid.uuid4().hex,
               "HF_TOKEN": "hf_fake" + uuid.uuid4().hex,
               "K3A_REGISTRY_PASSWORD": "fake-registry-" + uuid.uuid4().hex}
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    file_secret = "fake-credentials-file-" + uuid.uuid4().hex
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIAFAKEFAKEFAKE\naws_secret_access_key = {file_secret}\n")
    marker = "k3a-daemon-" + uuid.uuid4().hex
    outside = tmp_path / f"escaped-{marker}"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        code = _hostile(marker, port, secrets["AWS_SECRET_ACCESS_KEY"] + file_secret, home,
                        outside)
        server = start(served_names(release), tmp_path / "hostile.log", answer=code)
        env = {**{k: v for k, v in os.environ.items() if k not in secrets}, **secrets,
               "HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        env.pop("K3A_STORE", None)
        try:
            # From a directory holding no policies/: the suite is found by name in the policy.
            done = subprocess.run(
                [sys.executable, "-m", "k3artifacts", "eval", "run", server.url, "--tuple",
                 release.id, "--suite", "k3-core", "--store", f"file://{store_root}", "--json"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        finally:
            server.stop()
        assert _processes_with_arg(marker) == [], "a process the code forked outlived the run"
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    assert not outside.exists() and not Path(f"/tmp/k3a-hostile-{marker}").exists()
    assert not Path(f"/usr/k3a-hostile-{marker}").exists()
    assert done.returncode == 5, done.stderr
    out = json.loads(done.stdout)
    cases = {c["name"]: c for c in out["report"]["cases"]}
    for name in ("code-reverse-words", "code-is-prime"):
        assert not cases[name]["passed"] and cases[name]["skipped"] is None, cases[name]
        detail = cases[name]["detail"]
        # The secrets the answer carried (an environment value, a credentials file value).
        assert "[redacted][redacted]" in detail, detail
        # No credentials file inside, /usr read-only, the listener unreachable.
        for why in ("No such file or directory", "Read-only file system", "Connection refused"):
            assert why in detail, detail
    assert "uid 65534" in out["report"]["code_sandbox"]
    recorded = b"".join(p.read_bytes() for p in store_root.rglob("*") if p.is_file())
    for value in [*secrets.values(), file_secret]:
        assert value not in done.stdout and value not in done.stderr, value
        assert value.encode() not in recorded, value


@needs_bwrap
def test_the_sandbox_refuses_network_and_host_files_and_bounds_time_and_memory(tmp_path):
    box = sandbox()
    (tmp_path / "secret.txt").write_text("s3cr3t")
    cases = {
        "network": ("import socket\ndef f(x):\n    socket.create_connection(('1.1.1.1', 53), 2)",
                    "OSError: [Errno 101] Network is unreachable"),
        "host file": (f"def f(x):\n    return open('{tmp_path}/secret.txt').read()",
                      "No such file or directory"),
        "write /usr": ("def f(x):\n    open('/usr/x', 'w')", "Read-only file system"),
        "memory": ("def f(x):\n    return len(bytearray(1 << 30))", "MemoryError"),
        "fork bomb": ("import os\ndef f(x):\n    while True:\n        os.fork()",
                      "Resource temporarily unavailable"),
    }
    for what, (source, why) in cases.items():
        ok, detail = run_cases(box, source, "f", [([1], None)], timeout_s=10)
        assert not ok and why in detail, (what, detail)
    ok, detail = run_cases(box, "def f(x):\n    while True:\n        pass", "f", [([1], 1)], 2)
    assert not ok and "did not finish within 2 s" in detail
    ok, detail = run_cases(box, "def f(x):\n    return x[::-1]", "f", [(["ab"], "ab")], 10)
    assert not ok and "f('ab') = 'ba', expected 'ab'" in detail
    ok, detail = run_cases(box, "def f(x):\n    open('/tmp/t', 'w').write(x)\n    return x", "f",
                           [(["ab"], "ab")], 10)
    assert ok, detail  # a private /tmp to write in


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A machine without bubblewrap: nothing on PATH."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(NoSandbox, match="bwrap is not installed"):
        sandbox()


def _allowing(policies: Path) -> Path:
    gates = yaml.safe_load((policies / "promotion-gates.yaml").read_text())
    gates["channels"]["production"]["evaluation"]["allow_unsandboxed_code"] = True
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    return policies


def _evaluation_gate(store, release, policies):
    report = check_gates(store, release.id, "production", policies_dir=policies)
    return next(r for r in report.results if r.name == "evaluation")


def test_without_a_sandbox_code_cases_are_not_run_and_the_gate_fails_closed(
        tmp_path, policies, no_bwrap):
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log")
    try:
        use_policy(store, policies)
        report = evaluate(store, server.url, release.id, "k3-core", channel="production",
                          by=person("ci")).report
    finally:
        server.stop()
    skipped = {c.name: c.skipped for c in report.cases if c.skipped}
    assert set(skipped) == {"code-reverse-words", "code-is-prime"}
    assert all("bwrap is not installed" in why for why in skipped.values()), skipped
    assert report.pass_rate == 1.0 and not report.passed and report.code_sandbox is None
    assert any("2 code case(s) not run" in p and "allow_unsandboxed_code" in p
               for p in report.problems()), report.problems()
    gate = _evaluation_gate(store, release, policies)
    assert not gate.passed and "2 code case(s) not run" in gate.reason, gate.reason


def test_a_policy_that_allows_it_judges_the_cases_that_ran_until_it_no_longer_does(
        tmp_path, policies, no_bwrap):
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    server = start(served_names(release), tmp_path / "openai.log")
    try:
        use_policy(store, _allowing(policies))
        report = evaluate(store, server.url, release.id, None, channel="production",
                          by=person("ci")).report
    finally:
        server.stop()
    assert report.allow_unsandboxed_code and len(report.skipped) == 2
    assert report.passed, report.problems()
    gate = _evaluation_gate(store, release, policies)
    assert gate.passed, gate.reason
    # The policy tightened since the run: the gate judges by the policy in force.
    gates = yaml.safe_load((policies / "promotion-gates.yaml").read_text())
    gates["channels"]["production"]["evaluation"]["allow_unsandboxed_code"] = False
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    gate = _evaluation_gate(store, release, policies)
    assert not gate.passed and "2 code case(s) not run" in gate.reason, gate.reason


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").is_file(),
                    reason="runs the sandbox as another account: needs root and /usr/bin/python3")
def test_the_sandbox_works_for_an_account_that_is_not_root():
    """As any other account bwrap takes a user namespace instead of setpriv. code_run.py needs
    only the standard library, so the system Python of an unprivileged account runs it."""
    import tempfile

    from k3artifacts.readiness import code_run

    with tempfile.TemporaryDirectory(dir="/tmp") as where:
        os.chmod(where, 0o755)
        shutil.copy(code_run.__file__, Path(where) / "code_run.py")
        script = ("import sys; sys.path.insert(0, sys.argv[1]); import code_run as c; "
                  "box = c.sandbox(); print(box.description); "
                  "print(c.run_cases(box, 'import os\\ndef f(x):\\n    return os.getuid()', "
                  "'f', [([1], 65534)], 10))")
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i",
             "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", script, where],
            cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "(user namespace): uid 65534" in done.stdout
    assert "(True, 'f right on 1 input(s)')" in done.stdout
