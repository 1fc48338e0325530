"""Every page is a test: each shell block of README.md and of every page under docs/ is run by a
test, exactly as a reader pastes it, or says on the page, where the reader sees it, why it is
not run here (``tests/support/doc_blocks.py`` reads the pages).

The blocks marked ``<!-- k3a:page -->`` run here, read from the page at test time: a page's
blocks in order, one command at a time, in one bash process (variables and background jobs
carry over, as in a reader's terminal), from the root of a fresh clone of this checkout whose
``.venv`` is this test environment, with a home of their own and that venv first on ``PATH``, as
the README's path leaves a reader's shell (``source .venv/bin/activate``). The stand-ins a
page uses (the demo's local hub, moto, the OpenAI-compatible test server) are the ones it starts
itself; nothing is set up for it. Each command must exit 0, and the page leaves the clone as it
found it. Blocks other tests run keep their own marker (``RUNNERS``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.doc_blocks import SHELL, Shell, blocks_of, fresh_clone, git_status

#: Marker -> the test that runs the blocks carrying it.
RUNNERS = {
    "page": "tests/test_docs_pages.py",
    "readme": "tests/test_readme_path.py",
    "no-network-path": "tests/test_readme_path.py",
    "walk-accounts": "tests/test_demo_to_production.py",
    "walk-venv": "tests/test_demo_to_production.py",
    "walk": "tests/test_demo_to_production.py",
    "prefect-loopback": "tests/flows/test_prefect_guide.py",
    "automation": "tests/test_notifications.py",
}
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
#: A shell without this machine's own PATH: the reader's venv comes first.
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
#: What a page's walk must have printed: the outcome its prose promises, not only exit 0.
SAYS = {
    "docs/guides/signing.md": ["refused, exit 9: the store's policy trusts no key yet",
                               "in force: policy version 2", "signature: ok, signed by release"],
    "docs/guides/warm-start.md": ["warm start miss", "has no release signature",
                                  "--signing-key", "kernel.cubin"],
    "docs/guides/s3-and-fsx.md": ["s3://k3a-demo/k3a/models/demo/Kimi-K3-synthetic/",
                                  "verify:          ok"],
    "docs/guides/staging.md": ["file(s) put back", "download:       0 file(s)"],
    "docs/guides/serving-and-node-cache.md": ["--build-arg K3A_TUPLE_ID=k3t-",
                                              "passed for resource daemonset/"],
    "docs/guides/releases-and-promotion.md": ["(rollback #3", "pass rate: 100.0%",
                                              "production's gates: exit 5"],
    "docs/guides/rollout.md": ["passed for resource ingress/", "kind Rollout"],
    "docs/policy-and-identity.md": ["Your identity key has been saved in", "threshold: 1 of 1",
                                    "in force: policy version 2", "v2 "],
}
#: What a page's walk runs besides the Python packages of the test extras (which it names on the
#: page): where one is missing the page is skipped, and fails where `CI` is set.
NEEDS = {
    "docs/guides/signing.md": ["openssl"],
    "docs/guides/warm-start.md": ["openssl"],
    "docs/guides/s3-and-fsx.md": ["curl"],
    "docs/guides/releases-and-promotion.md": ["curl", "bwrap"],
}
#: Pages whose walk takes more than ~20 s here.
SLOW = {"docs/guides/signing.md", "docs/guides/warm-start.md",
        "docs/guides/releases-and-promotion.md"}


def name(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def run_here(page: Path) -> bool:
    return any(b.marker == "page" for b in blocks_of(page))


def test_every_shell_block_is_run_or_says_why():
    unaccounted = []
    for page in PAGES:
        for block in blocks_of(page):
            where = f"{name(page)}:{block.line}"
            if not block.lang:
                unaccounted.append(f"{where}: a fence with no language (```bash, ```text...)")
            elif block.marker is not None:
                runner = RUNNERS.get(block.marker)
                if runner is None:
                    unaccounted.append(f"{where}: marker k3a:{block.marker} is run by no test")
                else:
                    assert f"k3a:{block.marker}" in (REPO_ROOT / runner).read_text(), runner
            elif block.lang in SHELL and not block.not_run:
                unaccounted.append(f"{where}: neither run (<!-- k3a:page -->) nor marked "
                                   "*Not run here: WHY.* on the paragraph above it")
    assert not unaccounted, "\n".join(unaccounted)


def test_a_block_with_no_marker_and_no_note_is_caught(tmp_path):
    page = tmp_path / "new.md"
    page.write_text("Intro.\n\n```bash\nk3a demo\n```\n\n*Not run here: a cluster.*\n"
                    "```bash\nkubectl apply -f x\n```\n\n<!-- k3a:page -->\n```bash\nk3a x\n```\n")
    found = [(b.marker, b.not_run) for b in blocks_of(page)]
    assert found == [(None, None), (None, "a cluster."), ("page", None)]


def reader_env(home: Path, clone: Path, tmp: Path) -> dict[str, str]:
    """A reader's environment: their own home (no XDG or k3a settings), the clone's code, its
    venv on PATH, nothing pointing at AWS."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("K3A_", "XDG_", "AWS_", "PYTHON", "HF_", "PREFECT_"))}
    env.update(HOME=str(home), USER="reader", PATH=f"{clone / '.venv' / 'bin'}:{CLEAN_PATH}",
               PYTHONPATH=str(clone), TMPDIR=str(tmp), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    return env


@pytest.mark.parametrize("page", [
    pytest.param(p, id=name(p), marks=[pytest.mark.slow] if name(p) in SLOW else [])
    for p in PAGES if run_here(p)])
def test_the_page_runs_as_written(page, tmp_path):
    missing = [tool for tool in NEEDS.get(name(page), []) if shutil.which(tool) is None]
    if missing:
        message = f"{name(page)} runs {', '.join(missing)}, not installed here"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must install it", pytrace=False)
        pytest.skip(message)
    clone = fresh_clone(REPO_ROOT, tmp_path / "k3artifacts")
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    shell = Shell(clone, reader_env(home, clone, scratch))
    said = []
    try:
        for block in blocks_of(clone / name(page)):
            if block.marker == "page":
                for command in block.commands:
                    said.append(shell.run(command))
    finally:
        shell.close()
    transcript = "".join(said)
    assert SAYS.get(name(page)), f"name in SAYS what {name(page)}'s walk must print"
    for expected in SAYS[name(page)]:
        assert expected in transcript, f"{name(page)} never printed {expected!r}:\n{transcript}"
    assert git_status(clone) == "", "the page left files in the checkout"
    shutil.rmtree(tmp_path / "k3artifacts", ignore_errors=True)
