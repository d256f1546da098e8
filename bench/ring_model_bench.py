"""tfbarrier's ring all-reduce (exchange/ring.py) at 2 to 16 ranks on loopback, against a latency-bandwidth model
of it fitted on 2 ranks.

The ring sums in 2(n-1) steps (a reduce-scatter, then an all-gather), each rank sending and receiving a chunk of
B/n bytes a step and adding the n-1 chunks it receives in the first half:

    t(n, B) = s(n) x [2(n-1) alpha + 2(n-1)/n B beta]

- alpha: a step's fixed cost (a hop's latency, Python's and the kernel's per-message work);
- beta: a byte's cost in a step (sent, received into place, summed in half the steps; the one copy of the B
  bytes the sum is made in is folded in: on 2 ranks, where the fit is made, 2(n-1)/n B = B and the two cannot
  be told apart);
- s(n) = max(1, n / cores): here all n ranks share this machine's cores, and each step waits for every rank's
  part of it, so with more ranks than cores a step takes n / cores as long. On a cluster (a rank per machine)
  s = 1 and beta takes the link's time per byte too.

alpha and beta are fitted (non-negative least squares on relative error) to the 2-rank times alone; the 4-, 8- and
16-rank times test the model. Then the model projects the all-reduce on a cluster, one rank per machine (s = 1),
each step's bytes also crossing a link of the given rate: for gradient payloads of the slides' CNN (1.39 MB), the
61 M-parameter MLP (244 MB in float32) and the adapters of a 1.1 B-parameter LoRA fine-tune (24.8 MB,
bench/preset_bench.py --size 1b), at 8, 64 and 512 ranks; the part of it that is the steps' fixed cost (alpha)
says where a flat ring stops scaling.

    .venv/bin/python bench/ring_model_bench.py [--ranks 2 4 8 16] [--kb 0.004 64 1024 16384] [--rounds 3]
"""

import argparse
import os
import statistics
import sys

import numpy as np

import exchange_bench
import harness


def model(n, size_bytes, alpha, beta, cores):
    """The model's seconds for an all-reduce of ``size_bytes`` over ``n`` ranks sharing ``cores`` cores."""
    return max(1.0, n / cores) * (2 * (n - 1) * alpha + 2 * (n - 1) / n * size_bytes * beta)


def fit(points, cores):
    """(alpha, beta), non-negative, minimising the relative error of the model over ``points`` [(n, bytes, seconds)]."""
    from scipy.optimize import nnls

    rows = [[max(1.0, n / cores) * c for c in (2 * (n - 1), 2 * (n - 1) / n * b)] for n, b, _ in points]
    weights = np.array([1 / t for _, _, t in points])
    solution, _ = nnls(np.array(rows) * weights[:, None], np.ones(len(points)))
    return tuple(float(v) for v in solution)


PAYLOADS = {"slides' CNN": 1.39e6, "61 M MLP": 244e6, "1.1 B LoRA adapters": 24.8e6}  # bytes an all-reduce
LINKS_GBIT = (1, 10, 100)
CLUSTER_RANKS = (8, 64, 512)


def projection(alpha, beta):
    """Lines of a table: the model's all-reduce on a cluster (a rank per machine), ms and alpha's share, per
    payload, link and number of ranks."""
    lines = ["| payload | ranks | " + " | ".join(f"{g} Gbit/s: ms (alpha's share)" for g in LINKS_GBIT) + " |",
             "|---|---|" + "---|" * len(LINKS_GBIT)]
    for name, size in PAYLOADS.items():
        for n in CLUSTER_RANKS:
            cells = []
            for gbit in LINKS_GBIT:
                total = model(n, size, alpha, beta + 8 / (gbit * 1e9), cores=n)
                cells.append(f"{total * 1000:,.1f} ({2 * (n - 1) * alpha / total:.0%})")
            lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    return lines


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
    alpha, beta = fit([(n, b, t) for (n, b), t in measured.items() if n == min(args.ranks)], cores)
    lines = [f"Fitted on {min(args.ranks)} ranks: alpha {alpha * 1e6:,.0f} us a step, beta {beta * 1e9:.2f} ns a byte "
             f"a step ({1 / beta / 2**20 if beta else float('inf'):,.0f} MB/s); {cores} cores.", "",
             "| ranks | bytes a rank | measured ms | model ms | measured / model |", "|---|---|---|---|---|"]
    for (n, size_bytes), seconds in sorted(measured.items()):
        predicted = model(n, size_bytes, alpha, beta, cores)
        lines.append(f"| {n} | {size_bytes:,} | {seconds * 1000:,.2f} | {predicted * 1000:,.2f} | "
                     f"{seconds / predicted:.2f} |")
    lines += ["", "Projected, one rank per machine (s = 1), each step's bytes also crossing the link (8 / rate a byte):",
              "", *projection(alpha, beta)]
    body = ("## The ring at 2 to 16 ranks against its model\n\n"
            f"`{' '.join(['.venv/bin/python bench/ring_model_bench.py', *sys.argv[1:]])}`: n processes on loopback "
            f"joined in tfbarrier's ring, {args.reps} all-reduces per size after a warm-up, {args.rounds} rounds "
            "interleaved; the slowest rank's time, median of the rounds. The model (the script's docstring): "
            "t(n, B) = s(n) x [2(n-1) alpha + 2(n-1)/n B beta], s(n) = max(1, n / cores).\n\n"
            + "\n".join(lines))
    print(body)
    harness.write_section("ring-model", body)


if __name__ == "__main__":
    main()
