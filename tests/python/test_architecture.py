"""ARCHITECTURE.md stays true: its modules table lists every module of python/tfbarrier/, and nothing
else."""

import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_the_modules_table_lists_every_module_and_no_other():
    with open(os.path.join(ROOT, "ARCHITECTURE.md")) as f:
        text = f.read()
    table = text[text.index("## Modules"):text.index("## Where a new thing goes")]
    listed = set(re.findall(r"`(\w+)\.py`", table))
    modules = {name[:-3] for name in os.listdir(os.path.join(ROOT, "python", "tfbarrier"))
               if name.endswith(".py") and name != "__init__.py"}
    assert sorted(modules - listed) == [], "modules missing from ARCHITECTURE.md"
    assert sorted(listed - modules) == [], "ARCHITECTURE.md lists modules that do not exist"


MAX_FUNCTION_LINES, MAX_MODULE_LINES = 50, 400
SOURCES = [os.path.join(ROOT, folder, name) for folder in ("python/tfbarrier", "bench")
           for name in sorted(os.listdir(os.path.join(ROOT, folder))) if name.endswith(".py")]


def _code_lines(lines, node, docstrings):
    """Lines of ``node`` that hold code: not blank, not a comment, not a docstring."""
    return sum(1 for number in range(node.lineno, node.end_lineno + 1)
               if number not in docstrings and lines[number - 1].strip()
               and not lines[number - 1].strip().startswith("#"))


def test_no_function_is_over_50_code_lines_and_no_module_over_400_lines():
    import ast

    long_functions, long_modules = [], []
    for path in SOURCES:
        with open(path) as f:
            source = f.read()
        lines, tree = source.splitlines(), ast.parse(source)
        if len(lines) > MAX_MODULE_LINES:
            long_modules.append((os.path.relpath(path, ROOT), len(lines)))
        docstrings = {number for node in ast.walk(tree)
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(getattr(node.body[0], "value", None), ast.Constant)
                      and isinstance(node.body[0].value.value, str)
                      for number in range(node.body[0].lineno, node.body[0].end_lineno + 1)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = _code_lines(lines, node, docstrings)
                if count > MAX_FUNCTION_LINES:
                    long_functions.append((f"{os.path.relpath(path, ROOT)}:{node.name}", count))
    assert long_functions == [], "functions over 50 code lines: split them"
    assert long_modules == [], "modules over 400 lines: split them by concern"
