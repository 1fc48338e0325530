"""The case table in README.md and the suite stay in step: every test of this directory is in
the table, and every test the table names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_readme_table_lists_every_fault_test_and_only_real_ones():
    table = [line for line in (HERE / "README.md").read_text().splitlines()
             if line.startswith("| ") and not line.startswith("| ---")][1:]
    named = [ref for line in table for ref in re.findall(r"`([\w/.:]*test_\w+)`", line.split(" | ")[-1])]
    suite = {name: path.name for path in HERE.glob("test_*.py") for name in defined_tests(path)}

    local = {ref.split("::")[-1] for ref in named if "/" not in ref}
    missing = sorted(set(suite) - local - {"test_readme_table_lists_every_fault_test_and_only_real_ones"})
    assert not missing, f"tests/faults tests missing from README.md: {missing}"
    for ref in named:
        if "/" in ref:
            file, _, name = ref.partition("::")
            assert name in defined_tests(ROOT / file), f"README.md names {ref}, which does not exist"
        else:
            name = ref.split("::")[-1]
            assert name in suite, f"README.md names {ref}, which is not in tests/faults"
