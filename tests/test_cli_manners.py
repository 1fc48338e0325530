"""How ``k3a`` behaves as a program, run as a user runs it (``python -m k3artifacts``):
what it imports to start, Ctrl-C at any moment, a reader that closes the pipe, --json
failures, and the command names (old spellings kept as hidden aliases)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import click
import pytest

from k3artifacts.cli.app import COMMANDS, cli
from tests.staging_helpers import REPO, small_release
from tests.support.ports import free_ports

#: What `k3a --help` and any command's --help must not pay for: the Hub client, the AWS SDK,
#: the OpenAI client (2.3 s of imports alone on the 2-core machine), Prefect, and the
#: Kubernetes client (its config loaders: only `preflight` and `rollback --single-node` run).
HEAVY = ("openai", "boto3", "botocore", "huggingface_hub", "prefect", "kubernetes")


def run(cmd, env, *args, **kwargs):
    options = {"capture_output": True, "text": True, "timeout": 300, **kwargs}
    return subprocess.run([*cmd, *args], env=env, check=False, **options)


def imported(cmd, env, *args) -> set[str]:
    """Top-level package names a real ``k3a ARGS`` process imported (``-X importtime``)."""
    python, *rest = cmd
    proc = run([python, "-X", "importtime", *rest], env, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0]
            for line in proc.stderr.splitlines() if line.startswith("import time:")}


# ---- start: import only what the command runs ------------------------------------------------


def test_help_lists_every_command_and_imports_none_of_them(k3a_cmd, k3a_env):
    proc = run(k3a_cmd, k3a_env, "--help")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")
              and line.split()[0] in COMMANDS}
    assert listed == {name for name, entry in COMMANDS.items() if entry.section}
    assert "Usage: k3a " in proc.stdout

    modules = imported(k3a_cmd, k3a_env, "--help")
    assert "click" in modules and "k3artifacts" in modules
    assert not modules & {*HEAVY, "pydantic", "rich", "yaml"}


@pytest.mark.parametrize("name", [n for n, e in COMMANDS.items() if e.section])
def test_a_commands_help_imports_no_sdk(k3a_cmd, k3a_env, name):
    assert not imported(k3a_cmd, k3a_env, name, "--help") & set(HEAVY)


def test_an_s3_command_does_not_load_pyopenssl_for_botocore(k3a_cmd, k3a_env):
    """botocore imports urllib3.contrib.pyopenssl only for the SSLContext it falls back to;
    where pyOpenSSL is installed that import cost every S3 command 20-30 ms of start on 2 cores
    (OpenSSL and cryptography.x509). k3a takes the fallback, the same class."""
    pytest.importorskip("OpenSSL")
    env = {**k3a_env, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_MAX_ATTEMPTS": "1", "AWS_CONFIG_FILE": "/nonexistent",
           "K3A_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_ports(1)[0]}"}
    python, *rest = k3a_cmd
    proc = run([python, "-X", "importtime", *rest], env, "revision", "list", "org/name",
               "--store", "s3://k3a-bucket/p")
    assert proc.returncode == 8, proc.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:")}
    assert "botocore.httpsession" in modules
    assert "OpenSSL" not in modules


def test_a_finished_command_leaves_its_heap_to_the_exit(k3a_env):
    """The interpreter's final collections would walk every object the command built (an S3
    client, pydantic's schemas: 0.15-0.25 s of each command on 2 cores): k3a freezes the heap
    once the command is done, whether it succeeded or failed, and exits without them."""
    probe = ("import atexit, gc, sys; atexit.register(lambda: print('frozen', "
             "gc.get_freeze_count() > 0)); from k3artifacts.cli import main; "
             "sys.argv = ['k3a', *sys.argv[1:]]; main()")
    for args, code in ((["--help"], 0), (["no-such-command"], 2)):
        proc = run([sys.executable, "-c", probe], k3a_env, *args)
        assert proc.returncode == code, proc.stderr
        assert proc.stdout.splitlines()[-1] == "frozen True"


def test_every_entry_is_a_command_and_old_spellings_are_the_same_commands():
    loaded = {name: entry.load() for name, entry in COMMANDS.items()}
    assert all(isinstance(c, click.Command) for c in loaded.values())
    ctx = click.Context(cli, **cli.context_settings)
    assert loaded["tuples"] is loaded["tuple"]
    assert loaded["channels"] is loaded["channel"]
    assert loaded["history"] is loaded["channel"].get_command(ctx, "history")
    assert loaded["revisions"] is loaded["revision"].get_command(ctx, "list")
    assert loaded["gc"] is loaded["revision"].get_command(ctx, "gc")
    cache = loaded["cache"]
    assert cache.get_command(ctx, "ls") is cache.get_command(ctx, "list")
    assert "ls" not in cache.list_commands(ctx)


# ---- regular nouns, old spellings still working ------------------------------------------------


def test_old_spellings_answer_as_the_new_ones(k3a_cmd, k3a_env, tmp_path):
    (tmp_path / "store").mkdir()
    store = ("--store", f"file://{tmp_path / 'store'}")
    cache = ("--root", str(tmp_path / "cache"))
    pairs = [
        (("tuple", "list", *store), ("tuples", "list", *store)),
        (("channel", "list", *store), ("channels", "list", *store)),
        (("revision", "list", REPO, *store), ("revisions", REPO, *store)),
        (("cache", "list", *cache), ("cache", "ls", *cache)),
        (("revision", "gc", "--keep", "1", *store), ("gc", "--keep", "1", *store)),
    ]
    for new, old in pairs:
        a, b = run(k3a_cmd, k3a_env, *new, "--json"), run(k3a_cmd, k3a_env, *old, "--json")
        assert a.returncode == b.returncode == 0, (new, a.stderr, b.stderr)
        assert json.loads(a.stdout) == json.loads(b.stdout), (new, old)
    new = run(k3a_cmd, k3a_env, "channel", "history", "production", *store)
    old = run(k3a_cmd, k3a_env, "history", "production", *store)
    assert new.returncode == old.returncode == 7 and new.stderr == old.stderr


# ---- --json failures ---------------------------------------------------------------------------


def test_json_failure_is_one_document_on_stdout(k3a_cmd, k3a_env, tmp_path):
    missing = f"file://{tmp_path / 'nowhere'}"
    proc = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", missing, "--json")
    assert proc.returncode == 7
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 7 and "no store at" in doc["error"] and "K3A_STORE" in doc["next"]
    assert "error: no store at" in proc.stderr, "people still read stderr"

    plain = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", missing)
    assert plain.returncode == 7 and plain.stdout == ""

    usage = run(k3a_cmd, k3a_env, "verify", "--json", "--no-such-flag")
    assert usage.returncode == 2
    doc = json.loads(usage.stdout)
    assert doc["exit_code"] == 2 and "--no-such-flag" in doc["error"]
    assert "k3a verify --help" in doc["next"]


def test_json_failure_after_a_report_merges_into_it(k3a_cmd, k3a_env, local_hub, tmp_path):
    """verify --json that finds a bad file: its report, with the error's keys, one document."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = f"file://{tmp_path / 'store'}"
    staged = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                 "--store", store, "-q")
    assert staged.returncode == 0, staged.stderr
    (published,) = (tmp_path / "store").rglob("model-00001-of-00002.safetensors")
    published.chmod(0o644)
    with open(published, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 0xFF]))
    proc = run(k3a_cmd, k3a_env, "verify", f"{REPO}@{commit}", "--store", store, "--json", "-q")
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 4 and doc["error"] and "next" in doc
    assert set(doc) - {"error", "exit_code", "next"}, "the verify report is still there"


# ---- Ctrl-C ------------------------------------------------------------------------------------


def reached(line: str, marker: str) -> bool:
    """``marker`` is a module whose import just finished (an ``-X importtime`` line), or a
    line the process printed (a fault point it waits at)."""
    if line.startswith("import time:"):
        return line.rsplit("|", 1)[1].strip() == marker
    return line.startswith(marker)


def interrupt_when(cmd, env, args, marker: str) -> subprocess.CompletedProcess:
    """Start ``k3a ARGS`` with ``-X importtime``, send SIGINT at ``marker``, return the
    result (stderr: every line the process wrote)."""
    python, *rest = cmd
    proc = subprocess.Popen([python, "-X", "importtime", *rest, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if reached(line, marker):
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert any(reached(line, marker) for line in seen), "".join(seen)[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)


@pytest.mark.parametrize("marker", [
    "click",  # importing the command group
    "k3artifacts.cli.common",  # importing the command's module
    "k3artifacts.staging.engine",  # the command started: importing what it runs
    "k3a: paused at downloaded",  # at work: a file downloaded, before its checks
])
def test_ctrl_c_at_any_moment_exits_130_quietly(k3a_cmd, k3a_env, local_hub, tmp_path, marker):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    env = dict(k3a_env, K3A_FAULT_PAUSE="downloaded:60")
    args = ["stage", REPO, "--endpoint", local_hub.endpoint,
            "--store", f"file://{tmp_path / 'store'}", "-q"]
    proc = interrupt_when(k3a_cmd, env, args, marker)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "error: interrupted (Ctrl-C)" in proc.stderr
    assert "re-run the same command" in proc.stderr.split("error: interrupted")[1]
    assert "Traceback" not in proc.stderr and "Aborted" not in proc.stderr
    assert not list((tmp_path / "store").rglob("manifest.json")), "nothing was published"


def test_ctrl_c_right_after_start(k3a_cmd, k3a_env, tmp_path):
    """Before Python has installed any handler the signal ends the process (the shell shows
    130); from k3a's first statement on, k3a exits 130 itself. Never a traceback or 1."""
    proc = subprocess.Popen([*k3a_cmd, "revision", "list", REPO, "--store",
                             f"file://{tmp_path}"], env=k3a_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "Aborted" not in err


# ---- a reader that stops reading ---------------------------------------------------------------


def test_closed_stdout_ends_quietly_after_the_work(k3a_cmd, k3a_env, local_hub, tmp_path):
    """`k3a stage ... | head -0`: the reader is gone before the summary; the revision is still
    published and the exit is 0, with no traceback."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = f"file://{tmp_path / 'store'}"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                   "--store", store, "-q", stdout=write_end, capture_output=False,
                   stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr
    assert "Exception ignored" not in proc.stderr
    listed = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", store, "--json")
    assert [r["commit"] for r in json.loads(listed.stdout)] == [commit]


def test_closed_stdout_and_stderr_still_finish_the_work(k3a_cmd, k3a_env, local_hub, tmp_path):
    """`k3a stage ... 2>&1 | head -0`, progress lines included: the same exit, the same
    published revision."""
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    store = f"file://{tmp_path / 'store'}"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = run(k3a_cmd, k3a_env, "stage", REPO, "--endpoint", local_hub.endpoint,
                   "--store", store, "--log-format", "json", "--progress-interval", "0.05",
                   stdout=write_end, stderr=write_end, capture_output=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 0
    listed = run(k3a_cmd, k3a_env, "revision", "list", REPO, "--store", store, "--json")
    assert [r["commit"] for r in json.loads(listed.stdout)] == [commit]


# ---- a mistyped command ------------------------------------------------------------------------


@pytest.mark.parametrize("args,suggested", [
    (["stag"], "'stage'"),
    (["pro"], "'promote' or 'approve'"),
    (["channel", "lsit"], "'list'"),
    (["policy", "shwo"], "'show'"),
    (["cache", "lst"], "'list'"),
])
def test_a_mistyped_command_is_answered_with_the_closest_names(args, suggested):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert f"No such command {args[-1]!r}. Did you mean {suggested}?" in result.stderr


def test_a_mistyped_command_under_json_is_one_document():
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["stag", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"] == "No such command 'stag'. Did you mean 'stage'?"


# ---- on a terminal -------------------------------------------------------------------------------


def on_a_terminal(cmd, env, *args) -> tuple[int, str]:
    """Run ``k3a ARGS`` with stdout and stderr on a pseudo-terminal of 100 columns; its exit
    code and everything it wrote there, escape sequences included."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([*cmd, *args], env={**env, "TERM": "xterm"}, stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_a_verify_that_fails_before_its_first_byte_leaves_no_empty_bar(k3a_cmd, k3a_env,
                                                                       tmp_path):
    (tmp_path / "store").mkdir()
    code, screen = on_a_terminal(k3a_cmd, k3a_env, "verify", f"{REPO}@{'a' * 40}",
                                 "--store", f"file://{tmp_path / 'store'}")
    assert code == 7
    drawn = screen.rindex("verifying")
    # The bar was drawn, then its line erased (cursor up, erase line) before the error.
    erased = screen.find("\x1b[1A\x1b[2K", drawn)
    assert drawn < erased < screen.index("error: "), repr(screen)
    # On a terminal the error is red...
    assert "\x1b[31merror: " in screen


def test_no_color_leaves_every_line_plain(k3a_cmd, k3a_env, tmp_path):
    (tmp_path / "store").mkdir()
    code, screen = on_a_terminal(k3a_cmd, {**k3a_env, "NO_COLOR": "1"}, "verify",
                                 f"{REPO}@{'a' * 40}", "--store", f"file://{tmp_path / 'store'}")
    assert code == 7 and "error: " in screen
    colours = [m for m in re.findall(r"\x1b\[([0-9;]*)m", screen)
               if any(p.startswith(("3", "4", "9")) and p not in ("39", "49")
                      for p in m.split(";"))]
    assert colours == [], repr(screen)
    # ... and so is a failure met before any command runs (a malformed variable).
    code, screen = on_a_terminal(k3a_cmd, {**k3a_env, "NO_COLOR": "1",
                                           "K3A_S3_CONCURRENCY": "many"}, "revision", "list",
                                 REPO)
    assert code == 9 and "error: bad environment" in screen and "\x1b[31m" not in screen
