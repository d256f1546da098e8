"""Environment bootstrap on one host: a cold build vs a cache hit of the same PythonEnv, through
tfbarrier.spark.environment.ensure() (what every barrier task runs before starting its training process).
The environment is the tests' kind: system_site_packages plus one small local wheel, so the numbers
are tfbarrier's own cost (venv + lock + marker + one offline pip install), not download time.

    .venv/bin/python bench/env_bench.py [--rounds 5]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import harness  # noqa: E402
from test_environments import write_wheel  # noqa: E402

from tfbarrier.spark.environment import PythonEnv, ensure  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    wheelhouse = tempfile.mkdtemp(prefix="tfbarrier-bench-wheels-")
    write_wheel(wheelhouse)
    cold, hit = [], []
    for _ in range(args.rounds):
        home = tempfile.mkdtemp(prefix="tfbarrier-bench-envs-")
        env = PythonEnv(["tfbarrier-probe==1.0"], workon_home=home, find_links=[wheelhouse], no_index=True,
                        system_site_packages=True)
        for series, expect_built in ((cold, True), (hit, False)):
            started = time.perf_counter()
            _, info = ensure(env)
            series.append(time.perf_counter() - started)
            assert info["built"] is expect_built
        shutil.rmtree(home)
    rows = ["| case | min ms | median ms | max ms |", "|---|---|---|---|"]
    for name, values in (("cold build", cold), ("cache hit", hit)):
        low, mid, high = (1000 * v for v in harness.stats(values))
        rows.append(f"| {name} | {low:,.1f} | {mid:,.1f} | {high:,.1f} |")
    verdict = "under" if statistics.median(hit) < 1.0 else "over"
    body = (f"## Environment bootstrap\n\n`.venv/bin/python bench/env_bench.py --rounds {args.rounds}`: "
            "`environment.ensure()` for a `PythonEnv` with `system_site_packages=True` and one small local wheel "
            "(`--no-index --find-links`), in a fresh `workon_home` each round: the cold build, then the cache hit "
            "that every later fit on that host pays.\n\n" + "\n".join(rows) +
            f"\n\nA cache hit adds {statistics.median(hit) * 1000:.2f} ms (median) to a fit, {verdict} the 1 s target. "
            "A cold build with real requirements adds pip's download and install time on top (for tensorflow-cpu "
            "and tf-keras, minutes on a first build), once per host.")
    harness.write_section("environment", body)
    print(body)


if __name__ == "__main__":
    main()
