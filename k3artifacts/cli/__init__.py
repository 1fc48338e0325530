"""The ``k3a`` command: every flow of the pipeline, runnable without a Prefect server."""

from __future__ import annotations

import importlib

import click

from k3artifacts import __version__

#: Which module defines each command. A command's module is imported only when that command
#: runs (or for `k3a --help`), so `k3a verify` on a node does not pay for the Hub client,
#: boto3 or the renderers.
COMMAND_MODULES = {
    "stage": "stage",
    "verify": "verify",
    "sign": "sign",
    "revisions": "revisions",
    "demo": "demo",
    "promote": "channels",
    "rollback": "channels",
    "history": "channels",
    "channels": "channels",
    "gates": "channels",
    "review": "channels",
    "approve": "channels",
    "policy": "policy",
    "gc": "gc",
    "eval": "readiness",
    "smoke": "readiness",
    "tuple": "tuples",
    "tuples": "tuples",
    "render": "tuples",
    "bootstrap": "aws",
    "fsx": "aws",
    "docker": "docker",
    "pull": "pull",
    "cache": "pull",
    "traffic": "traffic",
    "preflight": "preflight",
    "scan": "scan",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMAND_MODULES:
            # Importing the module registers its commands on this group (@cli.command).
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[name]}")
        return super().get_command(ctx, name)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="k3a")
def cli() -> None:
    """Stage Kimi K3 (or any Hugging Face safetensors model) into a verified, pinned release.

    \b
    Typical path:
      k3a demo                                   # try it all locally, no network needed
      k3a stage moonshotai/Kimi-K3 --revision main --store s3://bucket/k3a
      k3a verify moonshotai/Kimi-K3@<commit>     # on a node, before serving
    Exit codes: 0 ok, 2 usage, 3 refused content, 4 verify mismatch, 5 gate failed,
    6 lost a race, 7 not found (also: no store there), 8 upstream/storage unavailable,
    9 bad configuration, 130 interrupted (re-run resumes).
    """


def main() -> None:
    cli()
