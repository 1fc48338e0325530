"""The architecture page's package map and layering, from the code: each package's docstring
(its first paragraph) and the modules on disk, in the order of the library's layers, and one line
per import-linter contract of ``pyproject.toml``. ``python -m k3artifacts.cli.manual
architecture`` writes them between the page's ``<!-- generated: NAME -->`` and
``<!-- end generated -->`` markers; ``tests/test_reference_docs.py`` fails when they differ.

Sources are read as files (``ast``, ``tomllib``), never imported: the map covers the flows, the
benchmarks and the test stand-ins without loading Prefect or a test server, and a package that
fails to import still gets its line.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

from k3artifacts.errors import ConfigError

#: The checkout this module was loaded from: the map describes this code, not another copy.
CHECKOUT = Path(__file__).resolve().parents[2]
LIBRARY = "k3artifacts"
#: Packages beside the library, shown after it, in this order.
BESIDE = ("flows", "bench", "tests/support")

_ROLE = re.compile(r":[a-z]+:`~?\.?([^`<]*?)(?:\s*<[^>]*>)?`")


def _markdown(text: str) -> str:
    """One docstring paragraph as one line of markdown: rST roles and literals as code."""

    def role(match: re.Match[str]) -> str:
        whole = match.group(0)
        name = match.group(1)
        return f"`{name.rsplit('.', 1)[-1] if ':`~' in whole else name}`"

    text = _ROLE.sub(role, text).replace("``", "`")
    return " ".join(text.split())


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, as markdown; a refusal when it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not doc:
        raise ConfigError(f"{path} has no docstring: the package map is made of them",
                          hint="write one short paragraph: the noun the package serves, what "
                          "it holds, what it must not do")
    return _markdown(doc.split("\n\n", 1)[0])


def _is_package(path: Path) -> bool:
    return path.is_dir() and (path / "__init__.py").is_file()


def modules(package: Path) -> list[str]:
    """A package's modules and subpackages (``name/``), as the file system has them."""
    names = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    return names + sorted(f"{p.name}/" for p in package.iterdir() if _is_package(p))


def _contracts(root: Path) -> list[dict[str, Any]]:
    path = root / "pyproject.toml"
    if not path.is_file():
        raise ConfigError(f"no {path}: the package map is generated from a checkout",
                          hint="run it from the repository, with the package installed editable")
    with path.open("rb") as fh:
        contracts: list[dict[str, Any]] = tomllib.load(fh)["tool"]["importlinter"]["contracts"]
    return contracts


def library_layers(root: Path) -> list[list[str]]:
    """The library's layers, top first, each a list of names (``readiness | preflight``)."""
    for contract in _contracts(root):
        if contract["type"] == "layers" and contract.get("containers") == [LIBRARY]:
            return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    raise ConfigError(f"pyproject.toml has no layers contract over {LIBRARY}",
                      hint="the map is ordered by that contract: put it back")


def _row(name: str, what: str, contents: list[str]) -> str:
    cells = [f"`{name}`", what.replace("|", "\\|"), _names(contents)]
    return "| " + " | ".join(cells) + " |"


def _package_rows(root: Path, package: Path) -> list[str]:
    rel = package.relative_to(root).as_posix()
    shown = rel.removeprefix(f"{LIBRARY}/") + "/"
    rows = [_row(shown, summary(package / "__init__.py"), modules(package))]
    for sub in sorted(p for p in package.iterdir() if _is_package(p)):
        rows += _package_rows(root, sub)
    return rows


def _library_units(root: Path) -> list[Path]:
    """The library's top-level modules and packages in the order of its layers; any the
    layers do not name come last, so a new package shows up before it is placed."""
    library = root / LIBRARY
    units = {p.stem: p for p in library.glob("*.py") if p.stem not in ("__init__", "__main__")}
    units |= {p.name: p for p in library.iterdir() if _is_package(p)}
    order = [name for layer in library_layers(root) for name in layer]
    rank = {name: i for i, name in enumerate(order)}
    return [units[name] for name in sorted(units, key=lambda n: (rank.get(n, len(rank)), n))]


def package_map(root: Path = CHECKOUT) -> str:
    lines = ["Generated from each package's docstring (its first paragraph) and the modules on "
             "disk, the library's packages in the order of its layers, top first (`python -m "
             "k3artifacts.cli.manual architecture`); do not edit by hand.", "",
             "| package | what it is | modules |", "| --- | --- | --- |"]
    for unit in _library_units(root):
        if unit.is_dir():
            lines += _package_rows(root, unit)
        else:
            lines.append(_row(unit.name, summary(unit), []))
    for beside in BESIDE:
        lines += _package_rows(root, root / beside)
    return "\n".join(lines) + "\n"


def _names(values: list[str]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _contract_line(contract: dict[str, Any]) -> str:
    kind, name = contract["type"], contract["name"]
    if kind == "layers":
        order = " > ".join(" | ".join(n.strip() for n in layer.split("|"))
                           for layer in contract["layers"])
        every = ", every module in a layer" if contract.get("exhaustive") else ""
        return f"- {name} (in {_names(contract['containers'])}{every}): `{order}`"
    if kind == "forbidden":
        ignored = len(contract.get("ignore_imports", []))
        direct = " directly" if contract.get("allow_indirect_imports") else ""
        listed = (f" ({ignored} exception{'s' * (ignored != 1)} listed there)" if ignored
                  else "")
        return (f"- {name}: {_names(contract['source_modules'])} never import{direct} "
                f"{_names(contract['forbidden_modules'])}{listed}")
    if kind == "acyclic_siblings":
        return f"- {name}: under {_names(contract['ancestors'])}"
    return f"- {name} ({kind})"


def layering(root: Path = CHECKOUT) -> str:
    lines = ["The layering is checked by import-linter (`[tool.importlinter]` in "
             "`pyproject.toml`, run by `tests/test_lint.py`): in a layers contract a package "
             "imports only packages in layers below its own, and packages sharing a layer "
             "(`a | b`) import neither way. The contracts, generated from that file:", ""]
    lines += [_contract_line(c) for c in _contracts(root)]
    return "\n".join(lines) + "\n"


SECTIONS = {"package-map": package_map, "layering": layering}
_SECTION = re.compile(r"(<!-- generated: ([a-z-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def regenerate(page: str, root: Path = CHECKOUT) -> str:
    """``page`` with every generated section written anew from the code at ``root``."""
    found: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in SECTIONS:
            raise ConfigError(f"unknown generated section {name!r}",
                              hint=f"the sections are {', '.join(SECTIONS)}")
        found.append(name)
        return match.group(1) + SECTIONS[name](root) + match.group(4)

    text = _SECTION.sub(fill, page)
    missing = [name for name in SECTIONS if name not in found]
    if missing:
        raise ConfigError(f"the page has no generated section {', '.join(missing)}",
                          hint="mark it with <!-- generated: NAME --> ... <!-- end generated -->")
    return text
