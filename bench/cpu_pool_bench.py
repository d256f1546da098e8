"""Speed without oneDNN: the slides' CNN, one plain TensorFlow process against a 2-worker tfbarrier.fit on
``local[2]``, every contender with TF_ENABLE_ONEDNN_OPTS=0 (what TensorFlow does on a CPU without AVX-512's
neural-network extensions; where the CPU has them, this is the nearest stand-in). The fit runs as tfbarrier
runs it (its training processes keep freed tensors in TensorFlow's pool, TF_CPU_ALLOCATOR_USE_BFC), and with
TF_CPU_ALLOCATOR_USE_BFC=false: TensorFlow's plain allocator, what tfbarrier ran before. The one process runs
with either allocator too. Each fit is driven from a process with a Spark of its own (its environment is
its training processes'), so only throughput (epochs 2..) compares; contenders alternate round by round.

``--onednn`` runs the same comparison as TensorFlow runs on this CPU by default (oneDNN on where the CPU
has AVX-512's neural-network extensions): one process against the default fit, a section of its own.

    .venv/bin/python bench/cpu_pool_bench.py [--rounds 3] [--onednn]
"""

import argparse
import os
import subprocess
import sys

ONEDNN = "--onednn" in sys.argv
if ONEDNN:
    sys.argv.remove("--onednn")
else:
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # before fit_bench: every process this run starts inherits it

import fit_bench  # noqa: E402 - sets the environment Spark's workers inherit
import harness  # noqa: E402
import workloads  # noqa: E402

POOL, PLAIN = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}, {"TF_CPU_ALLOCATOR_USE_BFC": "false"}


def single_process(job, extra_env):
    return fit_bench.single_process(job, lambda args: subprocess.Popen(args, env=dict(os.environ, **extra_env)))


def main():
    args = fit_bench.rounds_steps_epochs()
    data = harness.scratch_dir(prefix="tfbarrier-bench-data-")
    job = fit_bench.Job(argparse.Namespace(model="cnn", batch=64, steps=args.steps, epochs=args.epochs), data)
    workloads.make_data(data, args.steps * job.global_batch)
    if ONEDNN:
        return with_onednn(args, job)
    baseline = "one process, batch 128, TensorFlow's plain allocator"
    contenders = {
        baseline: single_process(job, PLAIN),
        "one process, batch 128, TensorFlow's pool": single_process(job, POOL),
        "tfbarrier.fit, 2 x 64 (default: the pool)": fit_bench.tfbarrier_fit_in_own_process(job),
        "tfbarrier.fit, 2 x 64, TF_CPU_ALLOCATOR_USE_BFC=false (as before)":
            fit_bench.tfbarrier_fit_in_own_process(job, extra_env=PLAIN),
    }
    results = measure(contenders, job, args.rounds)
    body = ("## Speed without oneDNN\n\n"
            f"`.venv/bin/python bench/cpu_pool_bench.py --rounds {args.rounds}`: steady samples/s (epochs 2..) of "
            f"the slides' CNN, {args.steps} steps x {args.epochs} epochs, every process with "
            "TF_ENABLE_ONEDNN_OPTS=0; each fit from a driver and a Spark `local[2]` of its own; one warm-up run "
            "of each first.\n\n"
            + harness.metric_table(results, "throughput", "samples/s", baseline, digits=0))
    harness.write_section("cpu-pool", body)
    print(body)


def measure(contenders, job, rounds):
    """One warm-up run of each contender, then ``rounds`` rounds of them all, alternated."""
    log = lambda line: print(line, flush=True)  # noqa: E731
    for name, run in contenders.items():
        log(f"warm-up {name}: {job.measure(run)}")
    return harness.rounds_of({name: (lambda run=run: job.measure(run)) for name, run in contenders.items()}, rounds, log)


def with_onednn(args, job):
    baseline = "one process, batch 128"
    results = measure({baseline: single_process(job, {}),
                       "tfbarrier.fit, 2 x 64 (default)": fit_bench.tfbarrier_fit_in_own_process(job)}, job, args.rounds)
    body = ("## Speed with oneDNN (this CPU's default)\n\n"
            f"`.venv/bin/python bench/cpu_pool_bench.py --onednn --rounds {args.rounds}`: steady samples/s (epochs "
            f"2..) of the slides' CNN, {args.steps} steps x {args.epochs} epochs, as TensorFlow runs on this CPU; "
            "each fit from a driver and a Spark `local[2]` of its own; one warm-up run of each first.\n\n"
            + harness.metric_table(results, "throughput", "samples/s", baseline, digits=0))
    harness.write_section("speed-onednn", body)
    print(body)


if __name__ == "__main__":
    main()
