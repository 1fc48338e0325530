"""Nothing outside ``k3artifacts/stores/`` checks a store's URL scheme or its class.

What a scheme decides (which class opens a URL, how ``k3a bootstrap`` sets a store up, where a
tuple's weights are mounted from) is answered in ``stores/``: by the registry or by the store
class (``placement_at``, ``regional``, ``identity_source``, ``local_root``, ...). A check of
``urlparse(url).scheme == "s3"``, ``url.startswith("s3://")`` or ``isinstance(store, S3Store)``
anywhere else is a second copy of that answer, which a new store would silently miss. This
test reads the library's and the flows' source for those forms; a finding that must stay goes
in ``ALLOWED`` with the reason, and an entry that no longer matches fails too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil

import k3artifacts.stores
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import SCHEMES
from tests.conftest import REPO_ROOT

#: ``path: source of the flagged expression`` -> why it may stay. Keep it empty.
ALLOWED: dict[str, str] = {}

STRING_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "partition",
                  "split", "find", "index", "count"}
REGEX_CALLS = {"match", "fullmatch", "search", "compile"}


def store_schemes() -> set[str]:
    return {scheme for scheme in SCHEMES if scheme}


def store_class_names() -> set[str]:
    """Every concrete store class and the classes they are built from, by name."""
    for module in pkgutil.walk_packages(k3artifacts.stores.__path__, "k3artifacts.stores."):
        importlib.import_module(module.name)
    found, todo = set(), list(Store.__subclasses__())
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo += cls.__subclasses__()
    return found | {target.rpartition(":")[2] for target in SCHEMES.values()}


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def _reads_scheme(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "scheme" for n in ast.walk(node))


def findings(source: str, where: str, schemes: set[str], classes: set[str]) -> list[str]:
    """``where: expression`` for every scheme or store-class check in ``source``."""
    prefixes = tuple(f"{scheme}:" for scheme in schemes)
    found = []

    def flag(node: ast.AST) -> None:
        found.append(f"{where}: {ast.unparse(node)}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            texts = [s for side in sides for s in _strings(side)]
            if (any(t.startswith(prefixes) for t in texts)
                    or any(_reads_scheme(side) for side in sides) and set(texts) & schemes
                    or set(texts) & classes):
                flag(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            texts = [s for arg in node.args for s in _strings(arg)]
            if node.func.attr in STRING_METHODS and any(t.startswith(prefixes) for t in texts):
                flag(node)
            elif node.func.attr in REGEX_CALLS and any(p in t for t in texts for p in prefixes):
                flag(node)
        elif isinstance(node, ast.Name) and node.id in classes | {"SCHEMES", "SETUPS"}:
            flag(node)
        elif isinstance(node, ast.Attribute) and node.attr in classes | {"SCHEMES", "SETUPS"}:
            flag(node)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in classes | {"SCHEMES", "SETUPS"}:
                    found.append(f"{where}: from {node.module} import {alias.name}")
    return found


def library_findings() -> list[str]:
    schemes, classes = store_schemes(), store_class_names()
    stores = REPO_ROOT / "k3artifacts" / "stores"
    found = []
    for root in (REPO_ROOT / "k3artifacts", REPO_ROOT / "flows"):
        for path in sorted(root.rglob("*.py")):
            if stores in path.parents:
                continue
            where = str(path.relative_to(REPO_ROOT))
            found += findings(path.read_text(), where, schemes, classes)
    return found


def test_nothing_outside_stores_checks_a_scheme_or_a_store_class():
    found = library_findings()
    unexplained = [f for f in found if f not in ALLOWED]
    assert not unexplained, (
        "ask the store (stores/registry.py, or an attribute or method of the store class) "
        "instead of testing its kind:\n" + "\n".join(unexplained))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries that match nothing any more: {stale}"


def test_the_check_sees_each_form_of_a_kind_test():
    schemes, classes = store_schemes(), store_class_names()
    assert {"file", "s3"} <= schemes and {"FileStore", "S3Store"} <= classes
    caught = [
        'if urlparse(where).scheme == "s3": pass',
        'ok = loc.scheme in ("file", "")',
        'if any(arg.startswith("s3://") for arg in args): pass',
        'if url.startswith(("file://", "/")): pass',
        'if re.match(r"^s3://([^/]+)", url): pass',
        'if url[:5] == "s3://": pass',
        'if isinstance(store, S3Store): pass',
        'if type(store).__name__ == "FileStore": pass',
        'from k3artifacts.stores.s3 import S3Store',
        'from k3artifacts.stores.registry import SCHEMES',
    ]
    for line in caught:
        assert findings(line, "x.py", schemes, classes), line
    passed = [
        'if urlsplit(target).scheme.lower() not in ("http", "https"): pass',
        'if kind == "file": pass',
        'help = "Release store: file:///path or s3://bucket/prefix."',
        'url = f"file://{root}"',
        'if placement.bucket is None: pass',
        'must_allow.append(("s3:GetObject", own))',
    ]
    for line in passed:
        assert not findings(line, "x.py", schemes, classes), line
