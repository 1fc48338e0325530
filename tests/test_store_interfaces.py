"""Code typed against one side of the store uses only that side.

``policy/``, ``releases/`` and the record gates take a ``RecordStore`` where they only need
records, ``staging/`` a ``RevisionStore``; nothing checks annotations at run time, so this test
reads the library's source: every attribute used on a parameter annotated with one of the two
interfaces (or on the ``self.<name>`` an ``__init__`` keeps it as) must be a member of that
interface. Passing such a store on to a function that needs the other side is not caught here:
the callee's own annotation says what it needs.
"""

from __future__ import annotations

import ast

import pytest

from k3artifacts.stores.base import Store
from k3artifacts.stores.records import RecordStore
from k3artifacts.stores.revisions import RevisionStore
from tests.conftest import REPO_ROOT

INTERFACES = {"RecordStore": RecordStore, "RevisionStore": RevisionStore}
LIBRARY = REPO_ROOT / "k3artifacts"


def members(interface: type) -> set[str]:
    """Public methods and attributes, those only annotated (``url``) included."""
    annotated = {name for cls in interface.__mro__ for name in vars(cls).get("__annotations__", {})}
    return {name for name in set(dir(interface)) | annotated if not name.startswith("_")}


def misuses(source: str, where: str) -> list[str]:
    """``where:line: name.attr`` for every attribute an interface-typed name does not have."""
    found = []

    def check(scope: ast.AST, typed: dict[str, str], self_typed: dict[str, str]) -> None:
        for node in ast.walk(scope):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id in typed:
                interface = typed[value.id]
            elif (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                  and value.value.id == "self" and value.attr in self_typed):
                interface = self_typed[value.attr]
            else:
                continue
            if node.attr not in members(INTERFACES[interface]):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} is not "
                             f"{interface}.{node.attr}")

    def typed_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
        args = func.args.posonlyargs + func.args.args + func.args.kwonlyargs
        return {a.arg: ast.unparse(a.annotation) for a in args
                if a.annotation is not None and ast.unparse(a.annotation) in INTERFACES}

    tree = ast.parse(source)
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                     and f.name == "__init__"), None)
        if init is None:
            continue
        params = typed_params(init)
        kept = {t.attr: params[n.value.id] for n in ast.walk(init) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Name) and n.value.id in params
                for t in n.targets if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name) and t.value.id == "self"}
        if kept:
            check(cls, {}, kept)
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            params = typed_params(func)
            if params:
                check(func, params, {})
    return found


def test_the_interfaces_split_the_store() -> None:
    record, revision = members(RecordStore), members(RevisionStore)
    assert {"create", "replace", "read", "list_keys"} <= record
    assert {"begin_revision", "open_ranges", "materialize", "placement_at"} <= revision
    assert not (record & revision) - {"url"}
    assert members(Store) >= record | revision


def test_interface_typed_code_uses_only_its_interface() -> None:
    problems = []
    for path in sorted(LIBRARY.rglob("*.py")):
        problems += misuses(path.read_text(), path.relative_to(REPO_ROOT).as_posix())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source", [
    "def f(store: RecordStore):\n    return store.begin_revision('a', 'b')\n",
    "class T:\n    def __init__(self, store: RecordStore):\n        self.store = store\n"
    "    def get(self):\n        return self.store.open_ranges('a', 'b', 4)\n",
    "def f(store: RevisionStore):\n    store.replace('k', b'', None)\n",
])
def test_a_call_across_the_split_is_found(source: str) -> None:
    assert misuses(source, "example.py")


def test_record_only_code_is_typed_so() -> None:
    """The policy package never needs a revision: it imports the record store alone."""
    for path in sorted((LIBRARY / "policy").glob("*.py")):
        text = path.read_text()
        assert "stores.base" not in text and "stores.revisions" not in text, path
