"""tests.support.own_usage: the peak memory the benchmarks and the memory tests report is the
child's own, whatever the size of the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.own_usage import launched, read_usage

MiB = 1 << 20


def _touched(size: int) -> bytearray:
    buf = bytearray(size)
    for i in range(0, size, 4096):
        buf[i] = 1
    return buf


def test_a_small_child_of_a_big_process_reports_its_own_peak(tmp_path):
    held = _touched(256 * MiB)  # this process's RSS now exceeds 256 MiB
    report = tmp_path / "usage.json"
    quiet = [sys.executable, "-S", "-c", "pass"]

    # Why the launcher exists: wait4 on a direct child reports this process's size.
    proc = subprocess.Popen(quiet)
    _, _, direct = os.wait4(proc.pid, 0)
    assert direct.ru_maxrss * 1024 >= 256 * MiB

    assert subprocess.run(launched(quiet, report)).returncode == 0
    assert read_usage(report).max_rss < 64 * MiB

    grows = [sys.executable, "-S", "-c",
             "b = bytearray(160 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"]
    assert subprocess.run(launched(grows, report)).returncode == 0
    usage = read_usage(report)
    assert 160 * MiB <= usage.max_rss < 256 * MiB
    assert usage.cpu_seconds > 0 and usage.seconds > 0
    del held


def test_the_launcher_passes_the_child_status_and_output_through(tmp_path):
    report = tmp_path / "usage.json"
    done = subprocess.run(launched(["sh", "-c", "echo out; echo err >&2; exit 3"], report),
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    killed = subprocess.run(launched(["sh", "-c", "kill -9 $$"], report))
    assert killed.returncode == 128 + 9
    missing = subprocess.run(launched([str(tmp_path / "nowhere")], report),
                             capture_output=True, text=True)
    assert missing.returncode == 127 and "nowhere" in missing.stderr
    assert read_usage(report).max_rss > 0


def _evicted(path) -> None:
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_the_launcher_counts_the_reads_of_every_process_the_child_waited_for(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(16 * MiB))
    report = tmp_path / "usage.json"
    # The reads are a grandchild's: the child waits for it, the launcher for the child.
    read = f"open({str(data)!r}, 'rb').read()"
    mapped = (f"import mmap; f = open({str(data)!r}, 'rb'); "
              "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); "
              "sum(m[i] for i in range(0, len(m), 4096))")

    def run(code: str) -> dict[str, int]:
        _evicted(data)
        nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"
        assert subprocess.run(launched([sys.executable, "-c", nested], report)).returncode == 0
        return read_usage(report).io

    by_read = run(read)
    assert by_read["rchar"] >= 16 * MiB
    by_map = run(mapped)
    assert by_map["rchar"] < 16 * MiB  # a mapping's pages pass through no read call
    if by_read["read_bytes"] == 0:
        pytest.skip(f"{tmp_path} is not on a block device (tmpfs?): nothing is read from disk")
    assert by_map["read_bytes"] >= 16 * MiB  # ...but come from the disk all the same
