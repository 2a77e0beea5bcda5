"""The batch's one home, checked on the source: only batches/transitions.py writes a batch's status,
and batches/ builds no object key itself (storage/keys.py does)."""

from __future__ import annotations

import ast
import re

from tests.test_layout import PACKAGES, ROOT, modules, status_assigned


def _batch_status_writes(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if status_assigned(node, lambda name: "batch" in name):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and "update(Batch)" in ast.unparse(node) and any(
                k.arg == "status" for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_only_the_batch_package_transitions_write_a_batchs_status():
    writers = {}
    for package in (*PACKAGES, "batches"):
        for path, tree in modules(package):
            if _batch_status_writes(tree):
                writers[str(path.relative_to(ROOT))] = _batch_status_writes(tree)
    assert set(writers) == {"batches/transitions.py"}, writers


def test_batches_build_no_object_key():
    layout = re.compile(r"""f["'](files|runs|tokenized|merges|batches)/""")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "batches").rglob("*.py") if layout.search(p.read_text())]
    assert found == []
