"""What `k3a stage` (and `k3a demo`, which prints the same summary) says once it published, read
as a person reads it: a small incremental stage's rate in a unit that shows it (it said
`(0 MB/s)` for 1 KB in 0.1 s), and remote-code files already reviewed (by sha256, in an earlier
commit) not called files that "need review"."""

from __future__ import annotations

import re

from tests.support.cli import invoke

IMAGE = "registry.example.com/vllm@sha256:" + "0" * 64
VERIFIER = "registry.example.com/k3a-worker@sha256:" + "1" * 64


def _line(out: str, start: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(start))


def test_an_incremental_stage_says_its_rate_and_which_code_is_already_reviewed(tmp_path):
    env = {"K3A_STORE": f"file://{tmp_path / 'store'}", "HOME": str(tmp_path / "home")}
    first = invoke("demo", "--size", "2MiB", "--shards", "1", env=env).stdout
    published = _line(first, "published ")
    assert re.search(r"\(\d[\d.]* (B|KiB|MiB|GiB)/s averaged over the run\)$", published), first
    assert _line(first, "remote code:") == (
        "remote code:     2 file(s) need review before promotion: configuration_kimi_k3.py, "
        "modeling_kimi_k3.py")

    commit = invoke("demo", "--size", "2MiB", "--shards", "1", "--json", env=env).json["commit"]
    tuple_id = invoke("tuple", "create", f"demo/Kimi-K3-synthetic@{commit}", "--offline",
                      "--profile", "p6-b300-tp8", "--image", IMAGE, "--verifier-image", VERIFIER,
                      env=env).stdout.split()[0]
    invoke("review", "code", tuple_id, env=env)

    # A new upstream commit changing one small file: bytes, not megabytes, and the code files
    # it shares with the reviewed commit are reviewed already.
    second = invoke("demo", "--size", "2MiB", "--shards", "1", "--next-revision", "--change",
                    "config.json", env=env).stdout
    published = _line(second, "published ")
    assert "0 MB/s" not in published and " 0 B/s" not in published, published
    downloaded = int(re.search(r"\(([\d,]+) downloaded", published).group(1).replace(",", ""))
    assert 0 < downloaded < 4096, published
    assert re.search(r"\(\d[\d.]* (B|KiB)/s averaged over the run\)$", published), published
    assert _line(second, "remote code:") == (
        "remote code:     2 file(s) already reviewed (same sha256): configuration_kimi_k3.py, "
        "modeling_kimi_k3.py")
    assert "need review" not in second
