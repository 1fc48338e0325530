"""Running `k3a` from tests, one way: :func:`invoke` in-process (click's runner: fast, the
default) or :func:`run_process` as a separate process (for what needs a real one: signals, the
process environment, another interpreter or an installed wheel). Both answer a :class:`Ran`
and, unless ``expect=None``, assert its exit code, printing the command's stdout and stderr
when it differs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: argv prefix of `k3a` in a subprocess: this interpreter, the package as a module (works
#: from a checkout on PYTHONPATH as well as installed).
K3A = (sys.executable, "-m", "k3artifacts")


@dataclass(frozen=True)
class Ran:
    """One `k3a` run: its arguments, exit code and what it wrote."""

    args: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def returncode(self) -> int:  # the subprocess spelling, for callers that think in it
        return self.exit_code

    @property
    def json(self) -> Any:
        """stdout parsed (for `--json` runs), failing with the output when it is not JSON."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"`k3a {' '.join(self.args)}` did not print JSON ({exc}):\n"
                                 f"{self.report()}") from None

    def report(self) -> str:
        return (f"k3a {' '.join(self.args)}: exit {self.exit_code}\n"
                f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}")

    def expect(self, code: int | None) -> Ran:
        """Assert the exit code (``None``: any); return self."""
        assert code is None or self.exit_code == code, \
            f"expected exit {code}, got {self.exit_code}\n{self.report()}"
        return self


def invoke(*args: str, env: Mapping[str, str] | None = None, expect: int | None = 0,
           input: str | None = None) -> Ran:
    """`k3a ARGS` in this process. An exception k3a does not turn into an exit code is raised
    here, traceback and all: no test expects one."""
    from click.testing import CliRunner

    from k3artifacts.cli import cli

    result = CliRunner().invoke(cli, list(args), env=dict(env) if env is not None else None,
                                input=input, catch_exceptions=False)
    return Ran(tuple(args), result.exit_code, result.stdout, result.stderr).expect(expect)


def run_process(*args: str, env: Mapping[str, str], expect: int | None = 0,
        cmd: Sequence[str] = K3A, timeout: float = 120, input: str | None = None) -> Ran:
    """`k3a ARGS` as a separate process with exactly ``env`` (the ``k3a_env`` fixture makes
    one); ``cmd`` is the argv prefix (the ``k3a_cmd`` fixture, or an installed wheel's)."""
    proc = subprocess.run([*cmd, *args], env=dict(env), input=input, capture_output=True,
                          text=True, timeout=timeout, check=False,
                          stdin=None if input is not None else subprocess.DEVNULL)
    return Ran(tuple(args), proc.returncode, proc.stdout, proc.stderr).expect(expect)
