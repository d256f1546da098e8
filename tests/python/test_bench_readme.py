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
UNRECORDED = "not recorded"
# Run before run lines recorded the CPU and the revision (issue 76): each says it is historical. The list only
# shrinks: a section rerun records them, and any other section must.
HISTORICAL = {"fit-cnn", "fit-large", "gap", "scaling", "feed", "environment", "memory", "first-step", "anatomy",
              "anatomy-large", "large-models-checkpoint", "sparklyr", "vector-columns", "tracking", "hosts-links",
              "hosts-cnn", "hosts-large", "allocator"}


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


def test_a_section_records_its_cpu_and_revision_unless_it_says_it_is_historical():
    for name, body in sections():
        run = json.loads(re.search(r"^<!-- run (.*) -->$", body, re.M).group(1))
        unrecorded = sorted(field for field in ("cpu", "revision", "avx512") if run[field] == UNRECORDED)
        if name in HISTORICAL:
            assert unrecorded, f"section {name} records its run now: take it off HISTORICAL"
            assert "_Historical: run before run lines recorded" in body, f"section {name} does not say it is historical"
        else:
            assert not unrecorded, f"section {name}: its run line records no {unrecorded}: rerun it"
            assert re.fullmatch(r"[0-9a-f]{7,40}( \+ changes)?", run["revision"]), (name, run["revision"])
            assert isinstance(run["avx512"], bool) and run["cpu"], (name, run)
