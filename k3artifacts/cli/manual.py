"""The generated reference pages: ``docs/reference/cli.md`` from the click commands themselves
(every listed command of :data:`k3artifacts.cli.app.COMMANDS` and each subcommand, with its
``--help`` as ``k3a`` prints it), ``docs/reference/policy-schema.md`` from the policy's
pydantic model, and the generated sections of ``docs/architecture.md`` (the package map and
the layering, :mod:`.package_map`), rewritten in place since the rest of that page is written
by hand. ``tests/test_reference_docs.py`` fails when a page differs from what this module
writes, so the pages cannot drift from the code.

    python -m k3artifacts.cli.manual cli > docs/reference/cli.md
    python -m k3artifacts.cli.manual policy > docs/reference/policy-schema.md
    python -m k3artifacts.cli.manual architecture
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

#: Wide enough for every option line, fixed so the page does not depend on the terminal.
WIDTH = 100
REGENERATE = "python -m k3artifacts.cli.manual {page} > docs/reference/{file}"


def _walk(command: click.Command, path: list[str],
          parent: click.Context | None) -> Iterator[tuple[list[str], str]]:
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=WIDTH,
                        max_content_width=WIDTH)
    yield path, command.get_help(ctx)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, [*path, name], ctx)


#: The page's hand-written part: what every command shares and no --help says.
CONVENIENCES = [
    "## Shell completion", "",
    "Commands, subcommands and options complete in bash, zsh and fish, and so do the store's "
    "tuple ids, channels and repos: from the store named by `--store` on the line, else "
    "`K3A_STORE` or the context's. A store that cannot be read completes nothing (never an "
    "error in the prompt). Put the line of your shell in its start-up file:", "",
    "```bash",
    'eval "$(_K3A_COMPLETE=bash_source k3a)"    # bash: ~/.bashrc',
    '# zsh (~/.zshrc):                 eval "$(_K3A_COMPLETE=zsh_source k3a)"',
    "# fish (~/.config/fish/completions/k3a.fish):   _K3A_COMPLETE=fish_source k3a | source",
    "```", "",
    "## Contexts", "",
    "A context names a store, the identity key records are signed with and a default channel "
    "(`--channel` of `verify --signature` and `eval run`), kept in "
    "`$XDG_CONFIG_HOME/k3a/config.yaml`, as kubectl keeps its contexts and AWS its profiles. "
    "`k3a --context NAME COMMAND ...` chooses one for a command, `K3A_CONTEXT` for a shell, "
    "`k3a config use NAME` from now on. A flag wins over its variable, a variable over the "
    "context, the context over the default; `k3a config show` says which gave each value. The "
    "file is refused (exit 9) when anyone but its owner may write it. Variables: "
    "[environment.md](environment.md).", "",
    "```bash",
    'k3a config set-context demo --store "file://${XDG_DATA_HOME:-$HOME/.local/share}/'
    'k3artifacts/store" --channel staging',
    "k3a config use demo",
    "k3a config list",
    "k3a config show",
    "```", "",
    "## Dry runs", "",
    "`--dry-run` on `stage` (also `--plan`), `promote`, `rollback` and `revision gc` prints the "
    "plan of the move (what would be downloaded or reused; the gates and the pointer it would "
    "swap; the revisions gc would retire) and writes nothing: no record, no pin, no key. With "
    "`--json` the plan is one document. `k3a gates TUPLE CHANNEL` shows the gates alone.", "",
]


def cli_markdown() -> str:
    from k3artifacts.cli.app import COMMANDS, cli

    # The group's own settings (`-h`): click caches a command's help option the first time a
    # context asks, so a bare context here would print `--help` alone.
    root = click.Context(cli, info_name="k3a",
                         **{**cli.context_settings, "terminal_width": WIDTH,
                            "max_content_width": WIDTH})
    lines = ["# CLI reference", "",
             "Generated from the commands' own `--help` (`"
             + REGENERATE.format(page="cli", file="cli.md")
             + "`); do not edit by hand. Old spellings (`k3a tuples`, `k3a channels`, "
             "`k3a history`, `k3a revisions`, `k3a gc`, `k3a cache ls`) still run and are not "
             "listed.", "", *CONVENIENCES, "## k3a", "", "```text", cli.get_help(root), "```", ""]
    for name, entry in COMMANDS.items():
        if entry.section is None:
            continue
        for path, text in _walk(entry.load(), ["k3a", name], root):
            lines += [f"{'#' * min(len(path), 4)} {' '.join(path)}", "", "```text", text, "```", ""]
    return "\n".join(lines)


def _type(spec: dict) -> str:
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in spec:
        return " or ".join(_type(s) for s in spec["anyOf"])
    if "enum" in spec:
        return " / ".join(f"`{v}`" for v in spec["enum"])
    if "const" in spec:
        return f"`{spec['const']}`"
    kind = spec.get("type", "any")
    if kind == "array":
        return f"list of {_type(spec.get('items', {}))}"
    if kind == "object" and "additionalProperties" in spec:
        return f"map of name to {_type(spec['additionalProperties'])}"
    return kind


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<",
           "minLength": "length >=", "minItems": "at least", "pattern": "matches"}


def _bounds(spec: dict) -> str:
    parts = [f"{word} `{spec[key]}`" for key, word in _BOUNDS.items() if key in spec]
    for alt in spec.get("anyOf", []):
        parts += [f"{word} `{alt[key]}`" for key, word in _BOUNDS.items() if key in alt]
    return ", ".join(parts)


def policy_markdown() -> str:
    import json

    from k3artifacts.policy.model import GATES_FILE, GatePolicy

    schema = GatePolicy.model_json_schema()
    models = {"GatePolicy": schema, **schema.get("$defs", {})}
    lines = ["# Policy schema", "",
             f"The fields of `{GATES_FILE}` (the packaged default is "
             "`policies/promotion-gates.yaml`, whose comments say what each gate checks; the "
             "copy that judges is the store's: [policy and identity](../policy-and-identity.md))."
             " Generated from `k3artifacts/policy/model.py` (`"
             + REGENERATE.format(page="policy", file="policy-schema.md")
             + "`); do not edit by hand. Unknown keys are refused.", ""]
    for name, model in models.items():
        lines += [f"## {name}", ""]
        if model.get("description"):
            lines += [" ".join(model["description"].split()), ""]
        required = set(model.get("required", []))
        lines += ["| field | type | default | constraint |", "| --- | --- | --- | --- |"]
        for field, spec in model.get("properties", {}).items():
            default = ("required" if field in required
                       else f"`{json.dumps(spec.get('default'))}`" if "default" in spec else "")
            lines.append(f"| `{field}` | {_type(spec)} | {default} | {_bounds(spec)} |")
        lines.append("")
    return "\n".join(lines)


PAGES = {"cli": cli_markdown, "policy": policy_markdown}
#: Pages partly written by hand: their generated sections are rewritten in place, in the
#: checkout the package was loaded from.
IN_PLACE = {"architecture": "docs/architecture.md"}
REWRITE = "python -m k3artifacts.cli.manual {page}"


def rewrite(page: str) -> None:
    from k3artifacts.cli.package_map import CHECKOUT, regenerate

    path = CHECKOUT / IN_PLACE[page]
    text = path.read_text()
    fresh = regenerate(text)
    if fresh != text:
        path.write_text(fresh)


def main(argv: list[str]) -> int:
    names = [*PAGES, *IN_PLACE]
    if len(argv) != 1 or argv[0] not in names:
        print(f"usage: python -m k3artifacts.cli.manual {{{'|'.join(names)}}}", file=sys.stderr)
        return 2
    if argv[0] in IN_PLACE:
        from k3artifacts.errors import K3AError

        try:
            rewrite(argv[0])
        except K3AError as exc:
            print(f"error: {exc}" + (f"\nnext: {exc.hint}" if exc.hint else ""), file=sys.stderr)
            return exc.exit_code
    else:
        sys.stdout.write(PAGES[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
