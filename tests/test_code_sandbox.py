"""A model's code runs in a bubblewrap sandbox, and nothing of this process's secrets reaches a
report: `k3a eval run` against a local endpoint answering every request with hostile code
(reads the parent's environment and the AWS credentials file and prints them, writes files,
connects to a loopback listener, double-forks a process meant to outlive the run, overwrites
the old harness's globals), with fake secrets in k3a's environment; an answer cannot forge
its own verdict; the sandbox works for a real login with supplementary groups (made with
useradd, run under runuser) and its groups open nothing inside; and where no sandbox can be
had, the code cases are not run, said so with the next step, and the evaluation fails closed
unless the policy says otherwise."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from k3artifacts.readiness import code_run
from k3artifacts.readiness.code_run import NoSandbox, run_cases, sandbox
from k3artifacts.readiness.record import evaluate
from k3artifacts.serving.render.common import served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import check_gates, use_policy
from tests.fixtures.people import person
from tests.support.cli import invoke
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
    with pytest.raises(NoSandbox, match=r"bubblewrap \(bwrap\) is not installed"):
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
    assert all("bwrap) is not installed" in why for why in skipped.values()), skipped
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



REVERSE = [(["a b c"], "c b a"), (["one"], "one")]


@needs_bwrap
def test_an_answer_cannot_forge_its_own_result_and_an_honest_one_passes():
    """The old harness printed `K3A-CODE-RESULT <values>` from the answer's own process: an
    answer printed that line itself and exited. Now the values come back over a file of their
    own, with a nonce the answer's source never held, and k3a compares them."""
    box = sandbox()
    forged_line = ("import os\nprint('K3A-CODE-RESULT ' + '[\"c b a\", \"one\"]', flush=True)\n"
                   "os._exit(0)\n")
    every_fd = ("import os, json\n"
                "for forged in (json.dumps({'values': ['c b a', 'one']}), '[\"c b a\", \"one\"]',"
                " 'K3A-CODE-RESULT [\"c b a\", \"one\"]'):\n"
                "    for fd in range(64):\n"
                "        try:\n"
                "            os.write(fd, (forged + '\\n').encode())\n"
                "        except OSError:\n"
                "            pass\n"
                "os._exit(0)\n"
                "def reverse_words(s):\n    return 'never called'\n")
    exit_early = ("import sys\nprint('[\"c b a\", \"one\"]')\n"
                  "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\nsys.exit(0)\n")
    for what, answer in (("forged line", forged_line), ("every descriptor", every_fd),
                         ("exit before the call", exit_early)):
        ok, detail = run_cases(box, answer, "reverse_words", REVERSE, 10)
        assert not ok and "never called to the end" in detail, (what, detail)
    ok, detail = run_cases(box, 'def reverse_words(s): return " ".join(reversed(s.split()))',
                           "reverse_words", REVERSE, 10)
    assert ok and detail == "reverse_words right on 2 input(s)", detail


@needs_bwrap
def test_the_expected_values_never_enter_the_sandbox():
    expected = "expected-" + uuid.uuid4().hex
    spy = ("import sys, gc\n"
           "def f(x):\n"
           "    seen, frame = [sys.stdin.read()], sys._getframe()\n"
           "    while frame:\n"
           "        seen, frame = [*seen, repr(frame.f_locals)], frame.f_back\n"
           "    seen += [repr(o) for o in gc.get_objects() if isinstance(o, (str, dict))]\n"
           "    return str(sum(1 for s in seen if '" + expected[:9] + "' + '"
           + expected[9:] + "' in s))\n")
    ok, detail = run_cases(sandbox(), spy, "f", [([1], expected)], 10)
    assert not ok and detail.startswith("f(1) = '0', expected"), detail


def _copy_of_code_run(where: Path) -> Path:
    """code_run.py where any account may read it: it needs only the standard library, so the
    system Python of any account runs it."""
    os.chmod(where, 0o755)
    shutil.copy(code_run.__file__, where / "code_run.py")
    return where


_AS_ACCOUNT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import code_run as c
try:
    box = c.sandbox()
except c.NoSandbox as exc:
    print(json.dumps({"refused": str(exc), "next": exc.next_step}))
    raise SystemExit(0)
code = "import os\ndef f(path):\n    try:\n        read = open(path).read()\n    except OSError as e:\n        read = type(e).__name__\n    return [os.getuid(), sorted(set(os.getgroups())), read]"
print(json.dumps({"sandbox": box.description,
                  "run": c.run_cases(box, code, "f", [([sys.argv[2]], json.loads(sys.argv[3]))], 10)}))
"""


def _as_account(user: str, where: Path, secret: Path, expect: object,
                wrap: list[str] = ()) -> dict:
    """code_run as ``user``, logged in as runuser makes it (its groups, as a login has them)."""
    done = subprocess.run(["runuser", "-u", user, "--", *wrap, "env", "-i", "PATH=/usr/bin:/bin",
                           "/usr/bin/python3", "-c", _AS_ACCOUNT, str(where), str(secret),
                           json.dumps(expect)],
                          cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@contextmanager
def _account_in_a_group() -> Iterator[tuple[str, str]]:
    """A real account (useradd) with a supplementary group (groupadd): removed after."""
    tag = uuid.uuid4().hex[:8]
    user, group = f"k3a-sbx-{tag}", f"k3a-sbx-team-{tag}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--groups", group, user], check=True, capture_output=True)
        try:
            yield user, group
        finally:
            subprocess.run(["userdel", user], check=True, capture_output=True)
    finally:
        subprocess.run(["groupdel", group], check=True, capture_output=True)


needs_accounts = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").is_file() or shutil.which("runuser") is None
    or shutil.which("useradd") is None,
    reason="makes a real account with useradd and runs as it with runuser: needs root, "
           "util-linux and /usr/bin/python3")


@needs_bwrap
@needs_accounts
def test_a_login_with_a_supplementary_group_runs_code_its_group_cannot_help():
    """A login keeps its supplementary groups (no --clear-groups: no login, runuser, ssh
    session or pod gives one): inside they show as the overflow gid and still open nothing of
    the group's; a group-only file the sandbox would show refuses the sandbox, by name."""
    with _account_in_a_group() as (user, group), \
            tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        where = _copy_of_code_run(Path(scratch))
        secret = where / "team-only.txt"
        secret.write_text("the team's\n")
        shutil.chown(secret, group=group)
        secret.chmod(0o640)
        # The account itself, outside the sandbox, reads it through its group.
        outside = subprocess.run(["runuser", "-u", user, "--", "cat", str(secret)],
                                 capture_output=True, text=True, timeout=30)
        assert outside.returncode == 0 and outside.stdout == "the team's\n", outside.stderr
        ran = _as_account(user, where, secret, [65534, [65534], "FileNotFoundError"])
        assert "(user namespace): uid 65534" in ran["sandbox"], ran
        assert ran["run"] == [True, "f right on 1 input(s)"], ran

        # The same kind of file where the sandbox shows the host (/usr).
        shown = Path("/usr/local/share") / f"k3a-sandbox-test-{uuid.uuid4().hex}"
        shown.mkdir(parents=True)
        try:
            visible = shown / "team-only.txt"
            visible.write_text("the team's\n")
            shutil.chown(visible, group=group)
            visible.chmod(0o640)
            refused = _as_account(user, where, visible, "unused")
        finally:
            shutil.rmtree(shown)
        assert "open to it and not to everyone" in refused["refused"], refused
        assert str(visible) in refused["refused"] and "-rw-r-----" in refused["refused"]
        assert "neither owns them nor is in their groups" in refused["next"], refused


@needs_bwrap
@needs_accounts
def test_where_user_namespaces_are_refused_the_reason_names_what_to_allow():
    """A pod or machine that refuses unprivileged user namespaces (here: the account inside a
    bubblewrap whose user namespace allows no other, as a locked-down pod's seccomp does)."""
    with _account_in_a_group() as (user, _group), \
            tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        where = _copy_of_code_run(Path(scratch))
        pod = ["bwrap", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
               "--tmpfs", "/tmp", "--ro-bind", str(where), str(where), "--proc", "/proc",
               "--dev", "/dev", "--"]
        refused = _as_account(user, where, where / "none", "unused", wrap=pod)
    assert "refused the namespaces it needs here (unprivileged user namespaces)" in \
        refused["refused"], refused
    for what in ("user.max_user_namespaces", "seccompProfile", "AppArmor"):
        assert what in refused["next"], refused


def test_eval_run_without_bubblewrap_lists_the_code_cases_as_not_run_and_says_how_to_install(
        tmp_path, policies, k3a_env, no_bwrap):
    store = FileStore(tmp_path / "store")
    release = Releases(store, tmp_path / "scratch").release()
    use_policy(store, policies)
    env = dict(k3a_env, K3A_STORE=store.url, PATH=os.environ["PATH"])
    server = start(served_names(release), tmp_path / "openai.log")
    try:
        text = invoke("eval", "run", server.url, "--tuple", release.id, env=env, expect=5)
        data = invoke("eval", "run", server.url, "--tuple", release.id, "--json", env=env,
                      expect=5)
    finally:
        server.stop()
    assert "pass rate: 100.0% (9/9 that ran; 2 not run; suite threshold 95.0%)" in text.stdout
    assert ("NOT RUN (skipped, no sandbox): code-reverse-words, code-is-prime: bubblewrap "
            "(bwrap) is not installed") in text.stdout
    assert "NOT RUN code-is-prime: bubblewrap (bwrap) is not installed" in text.stderr
    for name in ("code-reverse-words", "code-is-prime"):
        assert f"FAIL {name}" not in text.stderr and f"pass {name}" not in text.stderr
    assert (f"error: evaluation failed for {release.id}: 2 code case(s) not run (bubblewrap "
            "(bwrap) is not installed)") in text.stderr, text.stderr
    assert "next: install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap" \
        in text.stderr and "fix the endpoint" not in text.stderr, text.stderr
    out = data.json
    assert out["not_run"] == ["code-reverse-words", "code-is-prime"], out["not_run"]
    assert out["pass_rate"] == {"rate": 1.0, "passed": 9, "ran": 9}
    assert "apt-get install bubblewrap" in out["next"] and out["exit_code"] == 5, out
    cases = {c["name"]: c for c in out["report"]["cases"]}
    assert "bwrap) is not installed" in cases["code-is-prime"]["skipped"]


@needs_bwrap
@needs_accounts
def test_root_without_capabilities_is_told_to_run_as_another_account(tmp_path):
    """A container's root: uid 0 with no capability, which bubblewrap cannot make
    namespaces with (and, as root, it takes no user namespace)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        where = _copy_of_code_run(Path(scratch))
        done = subprocess.run(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--", "env", "-i",
             "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", _AS_ACCOUNT, str(where),
             str(tmp_path), "null"], cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    refused = json.loads(done.stdout)
    assert "root without CAP_SYS_ADMIN, as in a container" in refused["refused"], refused
    assert "runAsNonRoot" in refused["next"] and "seccompProfile" in refused["next"], refused
