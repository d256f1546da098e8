"""bench/README.md's tables say how they were made, in a form a script reads: each section between
``<!-- name:begin -->`` and ``<!-- name:end -->`` ends with one ``<!-- run {json} -->`` line (the command,
revision, date, CPU and whether it has AVX-512), and `make bench-all` reruns that command (a target of the
Makefile runs it as written there)."""

import json
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIELDS = {"command", "revision", "date", "cpu", "avx512"}


def sections():
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        text = f.read()
    return re.findall(r"<!-- ([a-z0-9-]+):begin -->(.*?)<!-- \1:end -->", text, re.S)


def makefile_commands():
    """The commands of the Makefile's bench-* recipes, in the README's spelling of the interpreter."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read()
    recipes = re.findall(r"^bench-[a-z0-9-]+:.*\n((?:\t.*\n)+)", text, re.M)
    spelled = {"$(BENCH_PY)": "PYTHONPATH=build/bench-site .venv/bin/python", "$(PY)": ".venv/bin/python",
               "$(STREAMING_BASELINE)": re.search(r"^STREAMING_BASELINE := (\S+)", text, re.M).group(1)}
    commands = set()
    for recipe in recipes:
        for line in recipe.splitlines():
            for variable, value in spelled.items():
                line = line.replace(variable, value)
            commands.add(line.strip())  # an environment variable before the interpreter stays as written
    return commands


def test_every_section_ends_with_the_line_that_says_how_it_was_made():
    found = sections()
    assert len(found) >= 30
    for name, body in found:
        lines = re.findall(r"^<!-- run (.*) -->$", body, re.M)
        assert len(lines) == 1, f"section {name}: {len(lines)} run lines"
        run = json.loads(lines[0])
        assert set(run) == FIELDS, (name, run)
        assert re.search(r"bench/[a-z_0-9]+\.py", run["command"]), (name, run["command"])
        script = re.search(r"bench/[a-z_0-9]+\.py", run["command"]).group(0)
        assert os.path.exists(os.path.join(ROOT, script)), (name, script)


@pytest.mark.parametrize("name", [name for name, _ in sections()])
def test_make_bench_all_reruns_every_sections_command(name):
    body = dict(sections())[name]
    command = json.loads(re.search(r"^<!-- run (.*) -->$", body, re.M).group(1))["command"]
    command = re.sub(r"^python ", ".venv/bin/python ", command)
    assert command in makefile_commands(), f"no bench target runs section {name}'s command: {command}"
