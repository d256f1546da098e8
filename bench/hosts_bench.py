"""Links that cost (issue 32): 2-worker (and 3-worker) data-parallel training across hosts whose links
are shaped, side by side with the peers, interleaved round by round.

The hosts are network namespaces on a bridge of their own with a Spark standalone worker each, one slot
per host (tests/python/support/hosts.py, HostsCluster); the driver, this process, binds the bridge's
address. Every host's link is shaped with ``tc tbf`` to each rate in turn ("unshaped": no qdisc). What
tbf delivers is measured first with a plain TCP stream from host 0 to host 1 (hosts.transfer_rate).
The contenders are bench/fit_bench.py's, on the same workload (bench/workloads.py: model, random
28x28 images, per-worker batch 64, steps, epochs):

  tfbarrier.fit (default)        from a cached Spark DataFrame of N partitions
  ..., fp16 gradients            communication={"compression": "fp16"}
  ..., packs of PACK             communication={"bytes_per_pack": PACK}: the gradients in several
                                 all-reduces, last layers first, so the first can travel while the
                                 backward pass goes on
  spark-tensorflow-distributor   MirroredStrategyRunner(num_slots=N, use_gpu=False), its defaults
  barrier job by hand            TF_CONFIG from the task addresses and fixed ports, its defaults
  one process on one host        the limit: one TensorFlow process at the global batch, no network,
                                 on host 0 (a namespace shares the machine's 2 cores: it has both)
  (only when named by --contenders: what the protection of issue 44 costs)
  tfbarrier.fit over TLS         "tls": the default over TLS 1.3 (spark.tfbarrier.encrypt=always: what an
                                 encrypting cluster gets)
  tfbarrier.fit, the strategy    "strategy": exchange="strategy" (its RING collective), under
                                 MultiWorkerMirroredStrategy with its open gRPC servers (the default
                                 before tfbarrier's authenticated ring)
  Keras 3 native[, over TLS]     "native", "native-tls": the model trained natively, plain or over TLS
  ..., first layers first        "first-layers-first": packs of 1 MB in the order before issue 59
                                 (bench/pack_order.py), beside "packs": what sending the last layers'
                                 first gains, their packs crossing while the backward pass goes on

Throughput is worker 0's samples/s over epochs 2.. (the first epoch's start-up left out). With 3
hosts only tfbarrier's contenders run unless --peers-on-three (time). Each round runs every model,
link and contender once; min / median / max over the rounds. Writes the sections "hosts-links" and
"hosts-<model>" of bench/README.md, and every measurement to --out (bench/scaling_model.py reads it).

    PYTHONPATH=build/bench-site .venv/bin/python bench/hosts_bench.py [--models cnn large]
        [--rates unshaped 10gbit 1gbit 100mbit] [--hosts 2 3] [--rounds 3] [--pack 1048576]
        [--contenders default tls strategy --section=-encryption]
"""

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))  # support.hosts: the fixture

import fit_bench  # (sets PYTHONPATH for Spark's workers: bench/ first)
import harness
import pack_order
import workloads
from support import hosts

# The executors run in their own work directories: every path they import from must be absolute.
os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)

UNSHAPED = "unshaped"
RATES = (UNSHAPED, "10gbit", "1gbit", "100mbit")
STEPS = {"cnn": 40, "large": 12, "mlp": 6}
DEFAULT, FP16, DISTRIBUTOR, BY_HAND = ("tfbarrier.fit (default)", "tfbarrier.fit, fp16 gradients",
                                       "spark-tensorflow-distributor", "barrier job by hand")
PEERS = (DISTRIBUTOR, BY_HAND)
LIMIT = "one process on one host (limit)"
CONTENDERS = ("default", "fp16", "packs", "distributor", "by-hand", "limit")  # --contenders
PACK = 1 << 20
# --contenders key: (name, fit's exchange arguments, session conf for the run)
CONFIGURED = {"tls": ("tfbarrier.fit over TLS", {}, {"spark.tfbarrier.encrypt": "always"}),
              "strategy": ("tfbarrier.fit, the strategy", {"exchange": "strategy",
                                                           "communication": {"implementation": "ring"}}, {}),
              "native": ("tfbarrier.fit, Keras 3 native", {}, {"spark.tfbarrier.keras3Training": "native"}),
              "native-tls": ("tfbarrier.fit, Keras 3 native over TLS", {},
                             {"spark.tfbarrier.keras3Training": "native", "spark.tfbarrier.encrypt": "always"}),
              "first-layers-first": (f"tfbarrier.fit, packs of {PACK / 2**20:g} MB, first layers first",
                                     {"exchange": pack_order.NAME, "communication": {"bytes_per_pack": PACK}}, {})}
ON_THREE = ("default", "fp16", "packs")
# tbf's bucket: 64 KB, one TCP segmentation-offload packet, as a NIC serializes onto its link. tbf's
# customary 10 ms at the rate (the fixture's default) passes a step's gradients of up to 1.25 MB at
# memory speed on a "1 Gbit/s" link when the link idled during the compute.
BURST = 64 * 1024
NO_LINK = "no link"  # where the limit's runs are kept: it uses none
OUT = os.path.join(ROOT, "build", "hosts-bench.json")


def packs_name(pack):
    return f"tfbarrier.fit, packs of {pack / 2**20:g} MB"


def shape(cluster, rate, burst):
    """Every host's link at ``rate``, a token bucket of ``burst`` bytes (0: the fixture's, 10 ms at the rate)."""
    for i in range(cluster.hosts):
        cluster.shape(i, None if rate == UNSHAPED else rate, burst=burst or None)


def delivered(cluster, rates, burst, repeats=3):
    """What each setting delivers to one TCP stream from host 0 to host 1: rate -> bits/s, ``repeats``
    times, about a second each (at most 1 GB: the unshaped link is as fast as a core copies)."""
    measured = {}
    for rate in rates:
        shape(cluster, rate, burst)
        bits = 8e9 if rate == UNSHAPED else hosts._bits_per_second(rate)
        nbytes = min(max(int(bits / 8), 16 << 20), 1 << 30)
        measured[rate] = [hosts.transfer_rate(cluster, 0, 1, nbytes) for _ in range(repeats)]
    shape(cluster, UNSHAPED, burst)
    return measured


def contenders(spark, df, job, keys, packs):
    """Name -> run(clock): fit_bench's contenders named by ``keys`` (of CONTENDERS; "packs": one per size
    in ``packs``) for ``job`` (``job.workers`` workers), tfbarrier's on ``df``."""
    runs = {}
    for key in keys:
        if key == "default":
            runs[DEFAULT] = fit_bench.tfbarrier_fit(df, job)
        elif key == "fp16":
            runs[FP16] = fit_bench.tfbarrier_fit(df, job, communication={"compression": "fp16"})
        elif key == "packs":
            runs.update({packs_name(pack): fit_bench.tfbarrier_fit(df, job, communication={"bytes_per_pack": pack})
                         for pack in packs})
        elif key == "distributor":
            runs[DISTRIBUTOR] = fit_bench.distributor(job)
        elif key == "by-hand":
            runs[BY_HAND] = fit_bench.barrier_by_hand(spark, job)
        elif key in CONFIGURED:
            name, exchange, conf = CONFIGURED[key]
            runs[name] = with_conf(spark, fit_bench.tfbarrier_fit(df, job, **exchange), conf)
    return runs


def with_conf(spark, run, conf):
    """``run`` with the session's ``conf`` set for its duration."""
    def configured(clock):
        for key, value in conf.items():
            spark.conf.set(key, value)
        try:
            return run(clock)
        finally:
            for key in conf:
                spark.conf.unset(key)
    return configured


def measured_or_error(job, name, run, log):
    try:
        return job.measure(run)
    except Exception as exc:  # noqa: BLE001 - one failed run is reported, the benchmark goes on
        log(f"{name} failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}


def run_all(args, cluster, log):
    """Every measurement: {"links": rate -> [bits/s], "runs": workers -> model -> link -> contender ->
    [{"throughput", "first_step", "total"} or {"error"}]}."""
    os.environ["SPARK_LOCAL_IP"] = cluster.driver_address  # the driver's JVM binds the bridge's address
    links = delivered(cluster, args.rates, args.burst)
    log("tbf delivers (Mbit/s): " + ", ".join(f"{r} {statistics.median(v) / 1e6:,.0f}" for r, v in links.items()))
    spark = fit_bench.spark_session(cluster.url)
    data = tempfile.mkdtemp(prefix="tfbarrier-hosts-bench-")  # every host sees it: one filesystem
    jobs = {}
    try:
        for workers in args.hosts:
            for model in args.models:
                settings = types.SimpleNamespace(model=model, steps=args.steps or STEPS[model], epochs=args.epochs,
                                                 batch=args.batch)
                directory = os.path.join(data, f"{model}-{workers}")
                os.makedirs(directory)
                job = fit_bench.Job(settings, directory, workers)
                x, y = workloads.make_data(directory, job.steps * job.global_batch)
                df = fit_bench.dataframe(spark, x, y, workers)
                keys = args.contenders if workers == 2 else args.contenders_on_three
                limit = fit_bench.single_process(job, functools.partial(cluster.popen, 0)) if "limit" in keys else None
                jobs[workers, model] = job, contenders(spark, df, job, keys, args.packs), limit
        for (workers, model), (job, runs, _) in list(jobs.items())[:1]:  # warm-up: imports, page cache, spares
            for name, run in runs.items():
                log(f"warm-up {workers} x {model} {name}: {measured_or_error(job, name, run, log)}")
        results = {}
        for number in range(args.rounds):
            for (workers, model), (job, runs, limit) in jobs.items():
                mine = results.setdefault(str(workers), {}).setdefault(model, {})
                if limit:
                    mine.setdefault(NO_LINK, {}).setdefault(LIMIT, []).append(measured_or_error(job, LIMIT, limit, log))
                for rate in args.rates:
                    shape(cluster, rate, args.burst)
                    for name, run in runs.items():
                        outcome = measured_or_error(job, name, run, log)
                        mine.setdefault(rate, {}).setdefault(name, []).append(outcome)
                        log(f"round {number + 1}/{args.rounds} {workers} x {model} {rate} {name}: {outcome}")
                shape(cluster, UNSHAPED, args.burst)
    finally:
        spark.stop()
        shutil.rmtree(data, ignore_errors=True)
    return {"links": links, "runs": results}


def throughputs(runs):
    return [r["throughput"] for r in runs if "throughput" in r]


def median_throughput(runs):
    values = throughputs(runs)
    return statistics.median(values) if values else None


def ratio(value, base):
    return f"{value / base:.2f}" if value and base else "-"


def links_table(links):
    lines = ["| link (tc tbf rate) | min Mbit/s | median Mbit/s | max Mbit/s | median / set rate |",
             "|---|---|---|---|---|"]
    for rate, values in links.items():
        low, mid, high = harness.stats(values)
        nominal = "-" if rate == UNSHAPED else f"{mid / hosts._bits_per_second(rate):.2f}"
        lines.append(f"| {rate} | {low / 1e6:,.0f} | {mid / 1e6:,.0f} | {high / 1e6:,.0f} | {nominal} |")
    return "\n".join(lines)


def model_table(by_link, links):
    """Rows per link and contender: samples/s, / the same contender unshaped, / the best peer there."""
    lines = [("| link (delivered) | contender | min samples/s | median samples/s | max samples/s | "
              "/ same contender, unshaped | / best peer, same link |"), "|---|---|---|---|---|---|---|"]
    for rate, runs in by_link.items():
        if rate == NO_LINK:
            continue
        peers = [median_throughput(runs[p]) for p in PEERS if p in runs]
        best = max((p for p in peers if p), default=None)
        where = f"{rate} ({statistics.median(links[rate]) / 1e6:,.0f} Mbit/s)"
        for name, outcomes in runs.items():
            values = throughputs(outcomes)
            if not values:
                lines.append(f"| {where} | {name} | failed: {outcomes[-1].get('error', '?')} ||||")
                continue
            low, mid, high = harness.stats(values)
            unshaped = median_throughput(by_link.get(UNSHAPED, {}).get(name, []))
            lines.append(f"| {where} | {name} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | {ratio(mid, unshaped)} | "
                         f"{ratio(mid, best)} |")
    if throughputs(by_link.get(NO_LINK, {}).get(LIMIT, [])):
        low, mid, high = harness.stats(throughputs(by_link[NO_LINK][LIMIT]))
        lines.append(f"| none | {LIMIT} | {low:,.0f} | {mid:,.0f} | {high:,.0f} | - | - |")
    return "\n".join(lines)


def write(args, measured):
    links, runs = measured["links"], measured["runs"]
    command = (f"`PYTHONPATH=build/bench-site .venv/bin/python bench/hosts_bench.py --models {' '.join(args.models)} "
               f"--rates {' '.join(args.rates)} --hosts {' '.join(map(str, args.hosts))} --rounds {args.rounds}"
               + (f" --contenders {' '.join(args.contenders)}" if args.contenders != list(CONTENDERS) else "")
               + (f" --contenders-on-three {' '.join(args.contenders_on_three)}"
                  if args.contenders_on_three != list(ON_THREE) else "")
               + (f" --packs {' '.join(map(str, args.packs))}" if args.packs != [PACK] else "")
               + (f" --section={args.section}" if args.section else "") + "`")
    title = f" ({args.section.strip('-')})" if args.section else ""
    body = (f"## Shaped links: what tc tbf delivers{title}\n\n"
            f"{command}: one TCP stream of about a second from host 0 to host 1 (two network namespaces on a "
            "bridge, `hosts.transfer_rate`), each host's link shaped with `tc tbf` in both directions, 3 times "
            "per setting.\n\n" + links_table(links))
    harness.write_section("hosts-links" + args.section, body)
    print(body)
    for model in args.models:
        intro = (f"## Shaped links, {model} model: samples/s across hosts{title}\n\n"
                 f"{command}: a Spark standalone worker of one slot per host (network namespaces on a bridge, "
                 "tests/python/support/hosts.py), the driver on the bridge; per-worker batch "
                 f"{args.batch}, {args.steps or STEPS[model]} steps x {args.epochs} epochs of random 28x28 "
                 "images; steady throughput (samples/s over epochs 2..), min / median / max over the rounds; "
                 "every host's link shaped to the rate (what it delivered to one TCP stream in brackets). The "
                 "hosts share this machine's 2 cores: with 2 hosts each worker has about a core, with 3 "
                 "fewer; one process on one host has both. The best peer is the better median of "
                 "spark-tensorflow-distributor and the barrier job by hand on the same link.")
        parts = [intro]
        for workers, by_model in runs.items():
            if model in by_model:
                parts.append(f"{workers} hosts, one worker each:\n\n" + model_table(by_model[model], links))
        body = "\n\n".join(parts)
        harness.write_section(f"hosts-{model}{args.section}", body)
        print(body)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", choices=workloads.MODELS, default=list(workloads.MODELS))
    parser.add_argument("--rates", nargs="+", default=list(RATES), help="tc tbf rates; 'unshaped': no limit")
    parser.add_argument("--hosts", nargs="+", type=int, choices=(2, 3), default=[2, 3])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch")
    parser.add_argument("--steps", type=int, default=None, help="steps per epoch (default: cnn 40, large 12)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--packs", type=int, nargs="+", default=[PACK], help="bytes_per_pack of the packs contenders")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS + tuple(CONFIGURED), default=list(CONTENDERS),
                        help="on 2 hosts")
    parser.add_argument("--contenders-on-three", nargs="+", choices=CONTENDERS, default=list(ON_THREE),
                        help="on 3 hosts (default: tfbarrier's, for time)")
    parser.add_argument("--burst", type=int, default=BURST, help="tbf's bucket in bytes (0: 10 ms at the rate)")
    parser.add_argument("--links-only", action="store_true", help="only measure what tbf delivers (no Spark)")
    parser.add_argument("--out", default=OUT, help="where every measurement goes (JSON)")
    parser.add_argument("--section", default="", help="a suffix of the bench/README.md sections written")
    args = parser.parse_args()
    pack_order.register()
    available, why_not = hosts.available()
    if not available:
        raise SystemExit(f"hosts_bench needs network namespaces: {why_not}")
    log = lambda line: print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
    started = time.monotonic()
    if args.links_only:
        with hosts.HostsCluster(hosts=2, spark=False) as cluster:
            return print(links_table(delivered(cluster, args.rates, args.burst)))
    with hosts.HostsCluster(hosts=max(args.hosts), memory="2g") as cluster:
        measured = run_all(args, cluster, log)
    measured.update(command=sys.argv[1:], revision=harness.revision(), seconds=time.monotonic() - started,
                    batch=args.batch, epochs=args.epochs,
                    steps={model: args.steps or STEPS[model] for model in args.models}, packs=args.packs)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(measured, f, indent=1)
    write(args, measured)
    log(f"done in {measured['seconds'] / 60:.1f} min; measurements in {args.out}")


if __name__ == "__main__":
    main()
