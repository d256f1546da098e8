"""A scaling model of tfbarrier's data-parallel step (issue 32), its inputs measured, validated against
the shaped-link runs of bench/hosts_bench.py, and extrapolated to N = 2..512 workers.

One step of N workers, each on a batch of B rows:

    t(N) = compute(N) + fixed + ring(N)        throughput = N x B / t(N)
    ring(N) = 2(N-1)/N x bytes x 8 x (1 / link + 1 / transport) + 2(N-1) x latency   (0 for N = 1)

- compute(N): a worker's forward, backward and update at B rows while N workers compute at once
  (bench/step_anatomy_bench.py's "compute" part, N processes on loopback, no collective). On this
  machine's 2 cores, N workers slow each other down: the 2- and 3-host runs are predicted with the
  compute measured with 2 and 3 processes at once; the extrapolation (one worker per machine) uses one
  process alone.
- bytes: the gradients, 4 per parameter (2 with fp16 compression).
- link: what tc tbf delivered to one TCP stream (hosts_bench's measurement).
- transport: what tfbarrier's ring itself (exchange/ring.py, the default exchange) moves per second when
  the link costs nothing: the gradients' all-reduce on loopback between N processes
  (bench/exchange_bench.py's "ring-reduce"), less its latency (the copies and sums of its chunks, which a
  faster link does not shorten): what ring_model_bench calls 1 / beta, measured here for N processes.
- latency: per hop of the ring, a one-float all-reduce's time over its 2(N-1) hops: ring_model_bench's alpha.
- fixed: everything else in a step (Keras's and tfbarrier's per-step work, the input pipeline, Spark's
  and the other processes' share of the cores): the contender's unshaped run less the rest of the
  formula, per contender and number of hosts. The unshaped runs calibrate it; the shaped runs test
  the model.

The all-reduce is assumed not to overlap the backward pass (the default packs of 16 MB hold all of these
models' gradients in one); a contender with smaller packs that measures faster than predicted shows
what overlap there is.

    .venv/bin/python bench/scaling_model.py [--hosts-results build/hosts-bench.json] [--rounds 3]
"""

import argparse
import json
import math
import statistics

import exchange_bench
import harness
import hosts_bench
import step_anatomy_bench
import workloads

COMPUTE, LATENCY, ALL_REDUCE = 0, 1, 2  # a step's compute (step_anatomy_bench.PARTS[0]); the ring's all-reduces
RING_REPS = 10  # all-reduces a measurement, after a warm-up
ANATOMY_STEPS = {"cnn": 200, "large": 40}  # the models step_anatomy_bench times (others are left out)
WORKERS = (2, 8, 64, 512)
LINKS = (10e9, 25e9, 100e9)  # bits/s
# A ResNet-50-sized model as the issue gives it: 25.6 M parameters (102 MB of float32 gradients) and
# about 4 G forward multiply-adds per 224x224 image (the figure quoted as "4 GFLOP": He et al. count a
# multiply-add as one operation, as model_size does here).
RESNET50 = {"parameters": 25.6e6, "forward_macs": 4.0e9}
# large_model_bench's 61 M MLP (input 1024, two hidden layers of 7,310, 10 classes): as many multiply-adds
# forward as parameters
MLP61 = {"parameters": 61.0e6, "forward_macs": 61.0e6}
# The 1.1 B LoRA fine-tune (bench/README, "A LoRA fine-tune of a preset...", make bench-preset-1b): the plain
# process took 0.185 samples/s at 4 rows of 64 tokens a step on this machine's 2 cores; 24.8 MB of adapters cross
LORA_1B = {"parameters": 24.8e6 / 4, "seconds_per_sample": 1 / 0.185, "batch": 4}
# Horovod's published point (docs/benchmarks of github.com/horovod/horovod): 128 servers of 4 Pascal
# GPUs on a RoCE-capable 25 Gbit/s network, tensor fusion, 90% scaling efficiency for ResNet-101 (and
# Inception V3). ResNet-101: 44.5 M parameters. Its step on one GPU is taken from the same page's
# example run, 1,656.82 images/s on 16 GPUs at 64 images per GPU; a GPU transport's (NCCL over RDMA)
# cost per hop of a ring is assumed.
RESNET101_PARAMETERS = 44.5e6
HOROVOD_EFFICIENCY = 0.90
GPU_STEP = 64 / (1656.82 / 16)
GPU_HOP_LATENCY = 20e-6
GPUS_PER_SERVER = 4
BACKWARD_SHARE = 2 / 3  # of a step's compute: what an all-reduce during the backward pass can hide


def ring_seconds(workers, nbytes, link, latency, transport=math.inf):
    """A ring all-reduce of ``nbytes`` over ``workers``: 2(N-1)/N of the bytes through each worker's
    link (bits/s) and its transport, and 2(N-1) hops of ``latency``."""
    if workers == 1:
        return 0.0
    bits = 2 * (workers - 1) / workers * nbytes * 8
    return bits / link + bits / transport + 2 * (workers - 1) * latency


def model_size(kind):
    """The workload's parameters and forward multiply-adds per sample (Conv2D and Dense layers)."""
    import tf_keras

    model = workloads.build_model(tf_keras, kind)
    macs = 0
    for layer in model.layers:
        if isinstance(layer, tf_keras.layers.Conv2D):
            kh, kw, channels, filters = layer.kernel.shape
            _, height, width, _ = layer.output.shape
            macs += height * width * filters * kh * kw * channels
        elif isinstance(layer, tf_keras.layers.Dense):
            macs += int(layer.kernel.shape[0]) * int(layer.kernel.shape[1])
    return {"parameters": model.count_params(), "forward_macs": macs}


def anatomy(models, counts, rounds, log, sizes):
    """Milliseconds (medians) of a step's compute with N processes at once (step_anatomy_bench) and of one
    process alone, and of tfbarrier's ring's all-reduce of one float and of the gradients between N
    processes (exchange_bench): (model, N) -> part -> ms."""
    measured = {}
    for model in models:
        harness.settle()
        alone = step_anatomy_bench.run_processes("alone", model, 1, ANATOMY_STEPS[model], rounds)
        measured[model, 1] = {COMPUTE: statistics.median(next(iter(alone.values())))}
        values = [1, sizes[model]["parameters"]]  # float32 values an all-reduce
        for count in counts:
            harness.settle()
            times = step_anatomy_bench.run_processes("worker", model, count, ANATOMY_STEPS[model], rounds,
                                                     parts=(COMPUTE,))
            ring = [exchange_bench.launch("ring-reduce", values, RING_REPS, ranks=count) for _ in range(rounds)]
            measured[model, count] = {COMPUTE: statistics.median(times[step_anatomy_bench.PARTS[COMPUTE]]),
                                      **{part: 1000 * statistics.median(r[str(value)] for r in ring)
                                         for part, value in zip((LATENCY, ALL_REDUCE), values)}}
        for (kind, count), parts in measured.items():
            if kind == model:
                log(f"{model}, {count} process(es): {parts}")
    return measured


class Model:
    """The model's inputs, measured: anatomy (ms), sizes, hosts_bench's results."""

    def __init__(self, measured, sizes, results):
        self.measured, self.sizes, self.results = measured, sizes, results
        self.batch = results["batch"]
        self.links = {rate: statistics.median(values) for rate, values in results["links"].items()}
        self.latency = {key: parts[LATENCY] / 1000 / (2 * (key[1] - 1))
                        for key, parts in measured.items() if key[1] > 1}
        self.transport = {}
        for (kind, count), parts in measured.items():
            if count > 1:
                seconds = parts[ALL_REDUCE] / 1000 - 2 * (count - 1) * self.latency[kind, count]
                self.transport[kind, count] = 2 * (count - 1) / count * self.gradient_bytes(kind) * 8 / seconds

    def gradient_bytes(self, kind, contender=""):
        return self.sizes[kind]["parameters"] * (2 if "fp16" in contender else 4)

    def ring(self, kind, workers, rate, contender):
        return ring_seconds(workers, self.gradient_bytes(kind, contender), self.links[rate],
                            self.latency[kind, workers], self.transport[kind, workers])

    def fixed(self, kind, workers, contender):
        """The contender's per-step time that is neither compute nor all-reduce, from its unshaped run."""
        runs = self.results["runs"][str(workers)][kind][hosts_bench.UNSHAPED][contender]
        measured = hosts_bench.median_throughput(runs)
        if measured is None:
            return None
        return (workers * self.batch / measured - self.measured[kind, workers][COMPUTE] / 1000
                - self.ring(kind, workers, hosts_bench.UNSHAPED, contender))

    def predict(self, kind, workers, rate, contender):
        fixed = self.fixed(kind, workers, contender)
        if fixed is None:
            return None
        step = self.measured[kind, workers][COMPUTE] / 1000 + fixed + self.ring(kind, workers, rate, contender)
        return workers * self.batch / step


def validation(model):
    """Rows (hosts, model, link, contender, measured, predicted, error) for every shaped run."""
    rows = []
    for workers, by_model in model.results["runs"].items():
        for kind, by_link in by_model.items():
            for rate, runs in by_link.items():
                if rate in (hosts_bench.UNSHAPED, hosts_bench.NO_LINK):
                    continue
                for contender, outcomes in runs.items():
                    measured = hosts_bench.median_throughput(outcomes)
                    predicted = model.predict(kind, int(workers), rate, contender)
                    if measured and predicted:
                        rows.append((int(workers), kind, rate, contender, measured, predicted,
                                     predicted / measured - 1))
    return rows


def validation_table(rows, links):
    lines = ["| hosts | model | link (delivered) | contender | measured samples/s | predicted | error |",
             "|---|---|---|---|---|---|---|"]
    for workers, kind, rate, contender, measured, predicted, error in rows:
        lines.append(f"| {workers} | {kind} | {rate} ({links[rate] / 1e6:,.0f} Mbit/s) | {contender} | "
                     f"{measured:,.0f} | {predicted:,.0f} | {error:+.0%} |")
    return "\n".join(lines)


def inputs_table(model, kinds, counts):
    lines = [("| model | processes at once | compute ms / step | one-float all-reduce ms | gradients' all-reduce "
              "ms (loopback) | latency per hop ms | transport Gbit/s | gradients MB | fixed ms (tfbarrier's "
              "default, from its unshaped run) |"), "|---|---|---|---|---|---|---|---|---|"]
    for kind in kinds:
        lines.append(f"| {kind} | 1 (alone) | {model.measured[kind, 1][COMPUTE]:.1f} | - | - | - | - | "
                     f"{model.gradient_bytes(kind) / 1e6:.2f} | - |")
        for count in counts:
            parts = model.measured[kind, count]
            fixed = model.fixed(kind, count, hosts_bench.DEFAULT) if str(count) in model.results["runs"] else None
            lines.append(f"| {kind} | {count} | {parts[COMPUTE]:.1f} | {parts[LATENCY]:.2f} | {parts[ALL_REDUCE]:.1f} | "
                         f"{model.latency[kind, count] * 1000:.2f} | {model.transport[kind, count] / 1e9:.1f} | "
                         f"{model.gradient_bytes(kind) / 1e6:.2f} | "
                         + ("-" if fixed is None else f"{fixed * 1000:.1f}") + " |")
    return "\n".join(lines)


def extrapolation(model, kind, per_sample, batch=None):
    """Rows (name, N, [(samples/s, efficiency) per link]) for a worker per machine at the measured
    latency and transport (2 processes), one-process compute and tfbarrier's default's fixed time;
    ``batch`` rows a worker (hosts_bench's by default)."""
    latency, transport = model.latency["large", 2], model.transport["large", 2]
    fixed = model.fixed("large", 2, hosts_bench.DEFAULT)
    nbytes, batch = 4 * kind["parameters"], batch or model.batch
    compute = per_sample * batch
    rows = []
    for workers in WORKERS:
        cells = []
        for link in LINKS:
            step = compute + fixed + ring_seconds(workers, nbytes, link, latency, transport)
            cells.append((workers * batch / step, (compute + fixed) / step))
        rows.append((workers, cells))
    return rows


def extrapolation_table(named_rows):
    header = " | ".join(f"{link / 1e9:g} Gbit/s: samples/s | efficiency" for link in LINKS)
    lines = [f"| model | workers | {header} |", "|---|---|" + "---|---|" * len(LINKS)]
    for name, rows in named_rows:
        for workers, cells in rows:
            lines.append(f"| {name} | {workers} | " + " | ".join(f"{rate:,.{0 if rate >= 100 else 2}f} | {eff:.0%}"
                                                                for rate, eff in cells)
                         + " |")
    return "\n".join(lines)


def horovod_rows(model):
    """ResNet-101 at 512 workers on 25 Gbit/s, a GPU-class step: what each addition to tfbarrier's ring
    does to the scaling efficiency."""
    nbytes, link, workers = 4 * RESNET101_PARAMETERS, 25e9, 512
    latency, transport = model.latency["large", 2], model.transport["large", 2]
    window = BACKWARD_SHARE * GPU_STEP

    def efficiency(ring, overlap=False):
        exposed = max(0.0, ring - window) if overlap else ring
        return GPU_STEP / (GPU_STEP + exposed)

    servers = workers // GPUS_PER_SERVER
    steps = [
        (("tfbarrier today: its ring over all 512 workers (measured latency and transport), float32, no overlap "
          "counted"), ring_seconds(workers, nbytes, link, latency, transport), False),
        ("... with a GPU transport instead (NCCL over RDMA: link-bound, 20 us per hop)",
         ring_seconds(workers, nbytes, link, GPU_HOP_LATENCY), False),
        ("... and the all-reduce overlapping the backward pass (packs, last layers first)",
         ring_seconds(workers, nbytes, link, GPU_HOP_LATENCY), True),
        ("... and float16 gradients", ring_seconds(workers, nbytes / 2, link, GPU_HOP_LATENCY), True),
        ((f"... and hierarchical: reduce within each server of {GPUS_PER_SERVER} first, the ring over "
         f"{servers} servers"), ring_seconds(servers, nbytes / 2, link, GPU_HOP_LATENCY), True),
        ("tfbarrier today, hierarchical alone (its ring over 128 servers, float32, no overlap)",
         ring_seconds(servers, nbytes, link, latency, transport), False),
    ]
    return [(name, ring, efficiency(ring, overlap)) for name, ring, overlap in steps]


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts-results", default=hosts_bench.OUT, help="bench/hosts_bench.py's measurements")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def main():
    args = parse_args()
    harness.local_spark_env()  # TensorFlow's banners quiet
    with open(args.hosts_results) as f:
        results = json.load(f)
    kinds = sorted({kind for by_model in results["runs"].values() for kind in by_model if kind in ANATOMY_STEPS},
                   key=workloads.MODELS.index)
    counts = sorted({int(workers) for workers in results["runs"]} | {2})
    log = lambda line: print(line, flush=True)
    sizes = {kind: model_size(kind) for kind in {*kinds, "large"}}
    measured = anatomy(sorted({*kinds, "large"}, key=workloads.MODELS.index), counts, args.rounds, log, sizes)
    model = Model(measured, sizes, results)
    body = ("## Beyond one machine\n\n" + model_text(model, args.rounds, kinds, counts)
            + predictions_text(model) + horovod_text(model))
    harness.write_section("scaling-model", body)
    print(body)


def model_text(model, rounds, kinds, counts):
    """The model, its measured inputs, and its validation against hosts_bench's shaped runs."""
    results = model.results
    rows = validation(model)
    worst = max(rows, key=lambda row: abs(row[-1])) if rows else None
    command = (f"`.venv/bin/python bench/scaling_model.py --rounds {rounds}` after hosts_bench "
               f"(`{' '.join(['bench/hosts_bench.py', *results['command']])}` at {results['revision']})")
    return (
        f"{command}. The model: a step of N workers takes compute(N) + fixed + ring(N), with ring(N) = "
        "2(N-1)/N x gradient bytes x 8 x (1/link + 1/transport) + 2(N-1) x latency; throughput = N x batch / "
        f"step (batch {model.batch} per worker). Its inputs, measured (step_anatomy_bench's processes on "
        "loopback, N at once; the all-reduces tfbarrier's ring's, exchange_bench's processes on loopback; the "
        "fixed time is each contender's unshaped run less the rest, so the unshaped "
        "runs calibrate and the shaped runs test):\n\n"
        + inputs_table(model, kinds, counts)
        + "\n\nValidation: every shaped run of hosts_bench, predicted against measured (median samples/s); "
        "error = predicted / measured - 1."
        + (f" Largest error: {worst[-1]:+.0%} ({worst[0]} hosts, {worst[1]}, {worst[2]}, {worst[3]}); "
           f"{sum(abs(r[-1]) <= 0.25 for r in rows)} of {len(rows)} runs within 25%." if worst else "")
        + "\n\n" + validation_table(rows, model.links))


def predictions_text(model):
    """The extrapolation to a worker per machine: the slides' CNN, the large model, a ResNet-50-sized one, the
    61 M MLP and the 1.1 B LoRA fine-tune."""
    measured, sizes = model.measured, model.sizes
    per_sample = {kind: measured[kind, 1][COMPUTE] / 1000 / step_anatomy_bench.BATCH
                  for kind in ("cnn", "large") if (kind, 1) in measured}
    scaled = {name: per_sample["large"] * kind["forward_macs"] / sizes["large"]["forward_macs"]
              for name, kind in (("resnet", RESNET50), ("mlp", MLP61))}
    predictions = [*([("slides' CNN, one core per worker", extrapolation(model, sizes["cnn"], per_sample["cnn"]))]
                     if "cnn" in per_sample else []),
                   ("large, one core per worker", extrapolation(model, sizes["large"], per_sample["large"])),
                   ("ResNet-50-sized, one core per worker", extrapolation(model, RESNET50, scaled["resnet"])),
                   ("61 M MLP, one core per worker", extrapolation(model, MLP61, scaled["mlp"])),
                   ("1.1 B LoRA fine-tune, 2 cores per worker",
                    extrapolation(model, LORA_1B, LORA_1B["seconds_per_sample"], LORA_1B["batch"]))]
    return (
        "\n\nPredictions, one worker per machine (compute of one process alone: large "
        f"{measured['large', 1][COMPUTE]:.1f} ms per step of {model.batch}; ResNet-50-sized "
        f"{scaled['resnet'] * model.batch:.2f} s and the 61 M MLP {scaled['mlp'] * model.batch:.2f} s, the large "
        f"model's time scaled by forward multiply-adds ({RESNET50['forward_macs'] / 1e9:.1f} G and "
        f"{MLP61['forward_macs'] / 1e6:.0f} M against {sizes['large']['forward_macs'] / 1e6:.1f} M), "
        f"{RESNET50['parameters'] / 1e6:.1f} M and {MLP61['parameters'] / 1e6:.0f} M parameters; the 1.1 B LoRA "
        f"fine-tune {LORA_1B['seconds_per_sample'] * LORA_1B['batch']:.1f} s per step of {LORA_1B['batch']} rows "
        "of 64 tokens, the plain process's of bench-preset-1b, 24.8 MB of adapters' gradients), the fixed time "
        "of tfbarrier's default on 2 hosts, "
        "tfbarrier's ring with the latency and transport measured for 2 processes; efficiency = "
        "t(1) / t(N):\n\n"
        + extrapolation_table(predictions))


def horovod_text(model):
    """tfbarrier's ring, with each addition in turn, beside Horovod's published scaling efficiency."""
    return (
        "\n\nBeside Horovod's published 90% (ResNet-101, 512 Pascal GPUs on 128 servers, 25 Gbit/s, tensor "
        f"fusion): the same formula for a ResNet-101-sized model ({RESNET101_PARAMETERS / 1e6:.1f} M parameters) "
        f"and a GPU step of {GPU_STEP:.2f} s at 64 images (Horovod's example run, 16 GPUs), one addition at a "
        f"time (overlap hides up to {BACKWARD_SHARE:.0%} of the compute, the backward pass):\n\n"
        "| ring | all-reduce s / step | scaling efficiency |\n|---|---|---|\n"
        + "\n".join(f"| {name} | {ring:.3f} | {eff:.0%} |" for name, ring, eff in horovod_rows(model))
        + f"\n| Horovod, published | - | {HOROVOD_EFFICIENCY:.0%} |")


if __name__ == "__main__":
    main()
