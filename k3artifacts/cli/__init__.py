"""The ``k3a`` command: every flow of the pipeline, runnable without a Prefect server."""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="k3a")
def cli() -> None:
    """Stage Kimi K3 (or any Hugging Face safetensors model) into a verified, pinned release.

    \b
    Typical path:
      k3a demo                                   # try it all locally, no network needed
      k3a stage moonshotai/Kimi-K3 --revision main --store s3://bucket/k3a
      k3a verify moonshotai/Kimi-K3@<commit>     # on a node, before serving
    Exit codes: 0 ok, 2 usage, 3 refused content, 4 verify mismatch, 5 gate failed,
    6 lost a race, 7 not found, 8 upstream/storage unavailable, 9 bad configuration.
    """


def main() -> None:
    cli()
from . import stage  # noqa: E402,F401
from . import demo  # noqa: E402,F401
from . import channels  # noqa: E402,F401
from . import tuples  # noqa: E402,F401
from . import aws  # noqa: E402,F401
