"""tfbarrier's own ring all-reduce (exchange/ring.py, authenticated), plain and over TLS 1.3 (tls.py: what a
cluster that encrypts gets), against TensorFlow's collective all-reduce (MultiWorkerMirroredStrategy, RING,
the translated path's), two processes on loopback, float32 buffers of gradient sizes: seconds per
all-reduce (the slower rank's), rounds interleaved. With ``--baseline-ref REV``, the ring of that revision
too (its sources checked out under build/), and each ring's all-gather of as many bytes a rank.

    python bench/exchange_bench.py [--mb 1 16 64] [--rounds 3] [--reps 10] [--baseline-ref REV]
"""

import argparse
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import time

import harness

HERE = os.path.abspath(__file__)
KINDS = ("ring", "ring-tls", "tf")
BEFORE = "ring-before"  # --baseline-ref's ring
TLS_FILE_ENV = "TFBARRIER_BENCH_TLS"  # the pickled tls.Credentials both ring-tls ranks use


def ring_worker(rank, ports, sizes, reps, tls=None, gather=True):
    import numpy as np

    from tfbarrier.exchange.ring import Ring

    listener = socket.socket()
    listener.bind(("127.0.0.1", ports[rank]))
    listener.listen(4)
    ring = Ring.join(rank, [f"127.0.0.1:{p}" for p in ports], b"bench secret", listener, tls=tls)
    assert (ring.encryption is not None) == (tls is not None), ring.encryption
    seconds = {}
    for size in sizes:
        buffer = np.ones(size, dtype=np.float32)
        for name, exchange in (("", ring.all_reduce_sum), ("gather ", ring.all_gather))[:2 if gather else 1]:
            exchange(buffer)  # warm-up
            started = time.perf_counter()
            for _ in range(reps):
                exchange(buffer)
            seconds[f"{name}{size}"] = (time.perf_counter() - started) / reps
    ring.close()
    return seconds


def tf_worker(rank, ports, sizes, reps):
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    seconds = {}
    for size in sizes:
        with strategy.scope():
            value = tf.Variable(tf.ones([size]))

        @tf.function
        def reduce():
            return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", value.read_value()))

        reduce()  # warm-up: the trace and the collective's set-up
        started = time.perf_counter()
        for _ in range(reps):
            reduce().numpy()
        seconds[size] = (time.perf_counter() - started) / reps
    return seconds


def launch(kind, sizes, reps, source=None, ranks=2):
    """``ranks`` processes of ``kind`` (with ``source``, an older revision's sources, first on their path);
    {size, or "gather SIZE": the slowest rank's seconds per all-reduce, or all-gather}. "ring-reduce": the
    ring's all-reduce alone."""
    ports = harness.free_ports(ranks)
    env = dict(harness.env_with_source(source), TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, HERE, "--worker", kind, str(rank), json.dumps(ports), json.dumps(sizes),
                               str(reps)], stdout=subprocess.PIPE, text=True, env=env) for rank in range(ranks)]
    outs = [json.loads(proc.communicate(timeout=600)[0].strip().splitlines()[-1]) for proc in procs]
    return {key: max(out[key] for out in outs) for key in outs[0]}


def baseline_table(results, mbs, sizes, ref):
    """The ring against ``ref``'s: all-reduce and all-gather, median ms and their ratio, a row per size."""
    lines = ["", f"The ring against {ref}'s (all-reduce, and all-gather of that many bytes a rank):", "",
             f"| MB a rank | all-reduce: ms | {ref}: ms | ratio | all-gather: ms | {ref}: ms | ratio |",
             "|---|---|---|---|---|---|---|"]
    for mb, size in zip(mbs, sizes):
        keys = (str(size), f"gather {size}")
        now, before = ([statistics.median(r[key] for r in results[kind]) * 1000 for key in keys]
                       for kind in ("ring", BEFORE))
        lines.append(f"| {mb:g} | {now[0]:,.1f} | {before[0]:,.1f} | {now[0] / before[0]:.2f} | {now[1]:,.1f} | "
                     f"{before[1]:,.1f} | {now[1] / before[1]:.2f} |")
    return lines


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--baseline-ref", help="also this revision's ring (and every ring's all-gather)")
    args = parser.parse_args()
    sizes = [int(mb * 2**20 / 4) for mb in args.mb]
    from tfbarrier.tls import Credentials

    with open(os.path.join(harness.scratch_dir(prefix="exchange-bench-"), "tls.pkl"), "wb") as f:
        pickle.dump(Credentials.new(), f)
    os.environ[TLS_FILE_ENV] = f.name
    contenders = {kind: (lambda kind=kind: launch(kind, sizes, args.reps)) for kind in KINDS}
    if args.baseline_ref:
        source = harness.worktree(args.baseline_ref)
        contenders[BEFORE] = lambda: launch("ring", sizes, args.reps, source)
    results = harness.rounds_of(contenders, args.rounds, log=print)
    lines = ["| MB of float32 | tfbarrier's ring: median ms | ring over TLS 1.3: median ms | TensorFlow RING: "
             "median ms | TLS / plain ring | plain ring / TensorFlow |", "|---|---|---|---|---|---|"]
    for mb, size in zip(args.mb, sizes):
        ring, tls, tf = (statistics.median(r[str(size)] for r in results[kind]) * 1000 for kind in KINDS)
        lines.append(f"| {mb:g} | {ring:,.1f} | {tls:,.1f} | {tf:,.1f} | {tls / ring:.2f} | {ring / tf:.2f} |")
    if args.baseline_ref:
        lines += baseline_table(results, args.mb, sizes, args.baseline_ref)
    body = ("## An all-reduce of our own against TensorFlow's\n\n"
            f"`{' '.join(['python bench/exchange_bench.py', *sys.argv[1:]])}`: two processes on loopback, "
            f"{args.reps} all-reduces per size after a warm-up, {args.rounds} rounds interleaved; the slower "
            "rank's time. All are called from Python, outside a training step (bench/encryption_bench.py measures "
            "TLS inside fits).\n\n" + "\n".join(lines))
    print(body)
    harness.write_section("exchange", body)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        kind, rank, reps = sys.argv[2], int(sys.argv[3]), int(sys.argv[6])
        ports, sizes = map(json.loads, sys.argv[4:6])
        if kind == "tf":
            seconds = tf_worker(rank, ports, sizes, reps)
        elif kind == "ring-tls":
            with open(os.environ[TLS_FILE_ENV], "rb") as f:
                seconds = ring_worker(rank, ports, sizes, reps, pickle.load(f))
        else:
            seconds = ring_worker(rank, ports, sizes, reps, gather=kind != "ring-reduce")
        print(json.dumps(seconds), flush=True)
    else:
        main()
