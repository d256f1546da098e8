"""tfbarrier's ring all-reduce (exchange/ring.py) at 2 to 16 ranks on loopback, against a latency-bandwidth model
of it fitted on 2 ranks.

The ring sums in 2(n-1) steps (a reduce-scatter, then an all-gather), each rank sending and receiving a chunk of
B/n bytes a step and adding the n-1 chunks it receives in the first half, after copying its B bytes once:

    t(n, B) = s(n) x [2(n-1) alpha + 2(n-1)/n B beta + B gamma]

- alpha: a step's fixed cost (a hop's latency, Python's and the kernel's per-message work);
- beta: a byte's cost in a step (sent, received into place, summed in half the steps);
- gamma: a byte's cost once (the copy the sum is made in);
- s(n) = max(1, n / cores): here all n ranks share this machine's cores, and each step waits for every rank's
  part of it, so with more ranks than cores a step takes n / cores as long. On a cluster (a rank per machine)
  s = 1 and beta takes the link's time per byte too.

alpha, beta and gamma are fitted (least squares on relative error) to the 2-rank times alone; the 4-, 8- and
16-rank times test the model.

    .venv/bin/python bench/ring_model_bench.py [--ranks 2 4 8 16] [--kb 0.004 64 1024 16384] [--rounds 3]
"""

import argparse
import os
import statistics
import sys

import numpy as np

import exchange_bench
import harness


def model(n, size_bytes, alpha, beta, gamma, cores):
    """The model's seconds for an all-reduce of ``size_bytes`` over ``n`` ranks sharing ``cores`` cores."""
    return max(1.0, n / cores) * (2 * (n - 1) * alpha + 2 * (n - 1) / n * size_bytes * beta + size_bytes * gamma)


def fit(points, cores):
    """(alpha, beta, gamma) minimising the relative error of the model over ``points`` [(n, bytes, seconds)]."""
    rows = [[max(1.0, n / cores) * c for c in (2 * (n - 1), 2 * (n - 1) / n * b, b)] for n, b, _ in points]
    weights = np.array([1 / t for _, _, t in points])
    a = np.array(rows) * weights[:, None]
    solution, *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
    return tuple(float(max(v, 0.0)) for v in solution)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--kb", type=float, nargs="+", default=[0.004, 64, 1024, 16384])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    sizes = [max(1, int(kb * 1024 / 4)) for kb in args.kb]  # float32 values
    cores = len(os.sched_getaffinity(0))
    contenders = {n: (lambda n=n: exchange_bench.launch("ring-reduce", sizes, args.reps, ranks=n)) for n in args.ranks}
    results = harness.rounds_of(contenders, args.rounds, log=print)
    measured = {(n, 4 * size): statistics.median(r[str(size)] for r in results[n]) for n in args.ranks for size in sizes}
    alpha, beta, gamma = fit([(n, b, t) for (n, b), t in measured.items() if n == min(args.ranks)], cores)
    lines = [f"Fitted on {min(args.ranks)} ranks: alpha {alpha * 1e6:,.0f} us a step, beta {beta * 1e9:.2f} ns a byte "
             f"a step ({1 / beta / 2**20 if beta else float('inf'):,.0f} MB/s), gamma {gamma * 1e9:.2f} ns a byte; "
             f"{cores} cores.", "",
             "| ranks | bytes a rank | measured ms | model ms | measured / model |", "|---|---|---|---|---|"]
    for (n, size_bytes), seconds in sorted(measured.items()):
        predicted = model(n, size_bytes, alpha, beta, gamma, cores)
        lines.append(f"| {n} | {size_bytes:,} | {seconds * 1000:,.2f} | {predicted * 1000:,.2f} | "
                     f"{seconds / predicted:.2f} |")
    body = ("## The ring at 2 to 16 ranks against its model\n\n"
            f"`{' '.join(['.venv/bin/python bench/ring_model_bench.py', *sys.argv[1:]])}`: n processes on loopback "
            f"joined in tfbarrier's ring, {args.reps} all-reduces per size after a warm-up, {args.rounds} rounds "
            "interleaved; the slowest rank's time, median of the rounds. The model (the script's docstring): "
            "t(n, B) = s(n) x [2(n-1) alpha + 2(n-1)/n B beta + B gamma], s(n) = max(1, n / cores).\n\n"
            + "\n".join(lines))
    print(body)
    harness.write_section("ring-model", body)


if __name__ == "__main__":
    main()
