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
