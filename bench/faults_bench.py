"""The faults of a network across hosts, timed: a 2-host Spark standalone cluster made of network
namespaces (tests/python/support/hosts.py), a driver on the bridge, and the driver program of
tests/python/test_host_faults.py (support/host_faults_driver.py) running each fault ``--rounds`` times:
worker 1's host's link cut mid-epoch, the chief's host's link cut, worker 1's host killed (its Spark
worker, executor and training processes) without retries and with ``max_retries=1`` and
``checkpoint_dir`` (a new worker starts there at once), the driver's link unreachable from the hosts,
and one host's link shaped to 2 Mbit/s.

For a fault that fails the fit: the seconds from the fault (the cluster's control ran) to the error
reaching the caller, the error's class, and the training processes of the job left on any host when
``fit`` raised and 30 s later. For the others: what the fit took. With ``--baseline-ref REV`` the cut
link and the lost host also run on git revision REV's tfbarrier (its sources first on every process's
path).

    PYTHONPATH=bench .venv/bin/python bench/faults_bench.py [--rounds 3] [--baseline-ref REV]
"""

import argparse
import collections
import json
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(BENCH), "tests", "python")
sys.path.insert(0, TESTS)

import harness  # noqa: E402
from support.hosts import HostsCluster, left_behind  # noqa: E402

FAILING = {"cut_link": "worker 1's host's link cut mid-epoch",
           "cut_chief_link": "the chief's host's link cut mid-epoch",
           "cut_link_retried": "worker 1's host's link cut and left cut, max_retries=1 (the wait for a replacement "
                               "executor shortened from 60 to 8 s)",
           "lost_host": "worker 1's host lost mid-epoch (its worker and executor killed), no retries"}
RESUMING = {"lost_host_resumes": "worker 1's host lost mid-epoch, max_retries=1 and checkpoint_dir, a new worker "
                                 "started there at once"}
BASELINE = ("cut_link", "lost_host")  # what --baseline-ref runs
COMPLETING = {"fit_after_restore": "none (the same fit on the unshaped, reachable links)",
              "unreachable_link": "the hosts cannot reach the driver's link",
              "slow_link": "one host's link shaped to 2 Mbit/s both ways (stall_timeout=5)"}


def drive(scenarios, python_path=None):
    """Run host_faults_driver.py's ``scenarios`` on a fresh 2-host cluster (with ``python_path`` first on
    every process's path: another revision's tfbarrier); their outcomes, and what the cluster left."""
    path = os.pathsep.join(p for p in (python_path, os.environ.get("PYTHONPATH")) if p)
    extra = {"PYTHONPATH": path} if python_path else {}
    with HostsCluster(hosts=2, env=lambda i: extra) as cluster:
        shared = os.path.join(cluster.dir, "shared")
        requests = os.path.join(shared, "requests")
        os.makedirs(shared)
        config = {"url": cluster.url, "driver": cluster.driver_address, "dir": shared, "requests": requests,
                  "hosts": [cluster.host_address(i) for i in range(2)],
                  "namespaces": [cluster.namespace(i) for i in range(2)], "scenarios": scenarios}
        env = dict(os.environ, SPARK_LOCAL_IP=cluster.driver_address,
                   PYTHONPATH=os.pathsep.join(p for p in (TESTS, path) if p))
        with cluster.serve(requests):
            out = subprocess.run([sys.executable, os.path.join(TESTS, "support", "host_faults_driver.py"),
                                  json.dumps(config)], capture_output=True, text=True, cwd=TESTS, env=env, timeout=3600)
        run_id = cluster.run_id
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the driver program failed:\n{out.stderr[-4000:]}")
    left = left_behind(run_id)
    assert not any(left.values()), left
    return json.loads(lines[0][7:])


def by_scenario(outcomes):
    found = collections.defaultdict(list)
    for outcome in outcomes:
        if "error" in outcome:
            raise RuntimeError(f"{outcome.get('scenario')}: {outcome['error']}\n{outcome.get('trace', '')}")
        found[outcome["scenario"]].append(outcome)
    return found


def seconds(values, digits=1):
    low, mid, high = harness.stats(values)
    return f"{low:.{digits}f} / {mid:.{digits}f} / {high:.{digits}f}"


def left_count(runs, key):
    if key == "at_once":
        return max(sum(len(p) for p in r["left"]["at_once"].values()) for r in runs)
    return max(sum(len(p) for p in r["left"]["after"].values()) for r in runs)


def describe(outcome):
    """'WorkerLostError (retryable, names the faulted host)', 'ClusterError from WorkerLostError (...)'."""
    def what(error):
        named = "names the faulted host" if error["host"] == outcome["faulted_host"] else f"host {error['host']}"
        retryable = "" if error.get("retryable") is None else "retryable, " if error["retryable"] else "not retryable, "
        return f"{error['class']} ({retryable}{named})"

    cause = f" from {what(outcome['cause'])}" if outcome.get("cause") else ""
    return (outcome["class"] if cause else what(outcome)) + cause


def failing_rows(found, names, where):
    rows = []
    for name in names:
        runs = found[name]
        classes = sorted({describe(r) for r in runs})
        rows.append(f"| {FAILING[name]}{where} | {len(runs)} | {seconds([r['seconds'] for r in runs])} | "
                    f"{'; '.join(classes)} | {left_count(runs, 'at_once')} / {left_count(runs, 'after')} |")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-ref", help="also run the failing faults on this git revision's tfbarrier")
    args = parser.parse_args()
    harness.local_spark_env()
    order = [*FAILING, *RESUMING, *COMPLETING]
    found = by_scenario(drive(order * args.rounds))
    baseline = None
    if args.baseline_ref:
        baseline = by_scenario(drive(list(BASELINE) * args.rounds, harness.worktree(args.baseline_ref)))

    lines = ["| fault | runs | time to the error, s (min / median / max) | error | job processes left on any "
             "host when fit raised / 30 s later |", "|---|---|---|---|---|"]
    lines += failing_rows(found, FAILING, "")
    if baseline:
        lines += failing_rows(baseline, BASELINE, f" (at {args.baseline_ref})")
    resumed = found["lost_host_resumes"]
    lines.append(f"| {RESUMING['lost_host_resumes']} | {len(resumed)} | none: the fit resumed and completed "
                 f"({', '.join(str(len(r['history']['loss'])) for r in resumed)} epochs in its history, of 2) | "
                 f"{'; '.join(sorted({r['attempts'][0]['error'].split(':')[0] for r in resumed}))} in attempt 1 | "
                 f"{left_count(resumed, 'at_once')} / {left_count(resumed, 'after')} |")

    completing = ["| link | runs | the fit (s, min / median / max) | s per step, chief's progress (min / median / max) "
                  "| longest silence between progress messages, s | how |", "|---|---|---|---|---|---|"]
    for name in COMPLETING:
        runs = found[name]
        how = ("files and results through Spark, tasks met through allGather, "
               + ", ".join(sorted({w.split(':')[0] for r in runs for w in r["warnings"]}))
               if name == "unreachable_link" else "through the driver link")
        per_step = [r["seconds_per_step"] for r in runs if r.get("seconds_per_step")]
        silence = [r["longest_silence"] for r in runs if r.get("longest_silence") is not None]
        completing.append(f"| {COMPLETING[name]} | {len(runs)} | {seconds([r['scenario_seconds'] for r in runs])} | "
                          f"{seconds(per_step, 3) if per_step else '-'} | {max(silence, default=0):.1f} | {how} |")

    command = "PYTHONPATH=bench .venv/bin/python bench/faults_bench.py --rounds {}{}".format(
        args.rounds, f" --baseline-ref {args.baseline_ref}" if args.baseline_ref else "")
    body = (f"## Faults across hosts\n\n`{command}`: a Spark standalone cluster of 2 hosts (network namespaces "
            "on a bridge, tests/python/support/hosts.py; one core each), the driver on the bridge's address, and "
            "the driver program of tests/python/test_host_faults.py: fit of the slides' CNN on the 8x8 digits, "
            "2 workers, batch 32, one step per call, each step slowed to at least 0.2 s. Worker 0 asks for the "
            "fault at epoch 0, step 3 (worker 1 for the chief's host), and the cluster's Operator runs it at once. "
            f"Each fault {args.rounds} times, on one cluster in turn. Time to the error: from the fault to `fit` "
            "raising; processes left: the job's training processes on any host.\n\n"
            + "\n".join(lines) + "\n\nFaults the fit outlives:\n\n" + "\n".join(completing))
    harness.write_section("faults", body)
    print(body)


if __name__ == "__main__":
    main()
