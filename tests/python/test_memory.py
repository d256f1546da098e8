"""A training process streams its shard: a 640 MB shard, more than the allowance, does not push it
past its memory after setting up TensorFlow and the model plus 512 MB (a reader that held the shard
once would). bench/memory_bench.py measures 0.3, 1 and 3 GB."""

import dataclasses
import os
import re
import threading
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import training_processes

import tfbarrier

WIDTH = 784
ROWS_PER_SHARD = 640 * 2**20 // (WIDTH * 4)


def write_parquet(path, rows, seed):
    rng = np.random.default_rng(seed)
    with pq.ParquetWriter(path, pa.schema([("pixels", pa.list_(pa.float32())), ("label", pa.int64())])) as writer:
        for start in range(0, rows, 20_000):
            n = min(20_000, rows - start)
            offsets = pa.array(np.arange(0, (n + 1) * WIDTH, WIDTH, dtype=np.int32))
            pixels = pa.ListArray.from_arrays(offsets, pa.array(rng.random(n * WIDTH, dtype=np.float32)))
            writer.write_table(pa.table({"pixels": pixels, "label": rng.integers(0, 10, n)}))


def test_a_640_mb_shard_stays_within_baseline_plus_512_mb(spark, tmp_path):
    import keras

    for worker in range(2):
        write_parquet(os.path.join(tmp_path, f"part-{worker}.parquet"), ROWS_PER_SHARD, seed=worker)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(2**30))  # one file, one partition, one shard
    try:
        df = spark.read.parquet(str(tmp_path))
        assert df.rdd.getNumPartitions() == 2
        model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(10)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        result = tfbarrier.fit(df, model, features="pixels", label="label", batch_size=1024, num_workers=2,
                               verbose=0)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    for worker in result.workers:
        assert worker["rows"] == ROWS_PER_SHARD
        memory = worker["memory"]
        assert 0 < memory["baseline_mb"] <= memory["peak_mb"] <= memory["baseline_mb"] + 512, memory


def test_a_model_the_executors_cannot_hold_is_refused_before_the_stage_with_the_numbers():
    from conftest import run_driver

    outcome = run_driver("small_memory_driver.py", "executor")
    assert outcome["error"] == "ModelError"
    message = outcome["message"]
    assert "each training process needs about" in message and "spark.executor.pyspark.memory is 700m" in message
    # 80 MB of weights (MB of 2**20 bytes), the largest matrix 64 MB: in a step over the ring the weights and their
    # gradients, 1.4 copies of the largest (memory.py), Adam's 2 slots
    assert "weights, gradients and their exchange 250 MB, Adam's slots (2 per weight) 160 MB" \
        in message, message
    assert "raise spark.executor.pyspark.memory" in message and "spark.tfbarrier.memoryCheck=false" in message


def test_a_driver_jvm_that_cannot_hold_the_model_fails_in_words_and_the_session_lives_on():
    """With no driver link the model goes through Spark; 84 MB do not fit a 512 MB driver. The earlier
    code raised Py4JJavaError with Spark's stack ("TaskResultLost (result lost from block manager)")."""
    from conftest import run_driver

    outcome = run_driver("small_memory_driver.py", "driver")
    assert outcome["error"] == "ClusterError", outcome
    assert "Spark's driver could not hold what the job sent through it" in outcome["message"]
    assert "spark.driver.memory" in outcome["message"]
    assert outcome["then"] == {"epochs": 1}


def last_job_id(spark):
    """The id of a job run now, in a job group of its own: Spark numbers a context's jobs 0, 1, 2..., so
    two of these one apart mean that Spark ran no job between them (whatever its group)."""
    context, ids = spark.sparkContext, []

    def probe():
        group = f"tfbarrier-test-probe-{uuid.uuid4().hex}"
        context.setJobGroup(group, "counting jobs")
        context.parallelize([0], 1).count()
        ids.extend(context.statusTracker().getJobIdsForGroup(group))

    thread = threading.Thread(target=probe)  # the group stays on that thread
    thread.start()
    thread.join()
    (job,) = ids
    return job


class NewProcesses(threading.Thread):
    """While it runs, every training process (spares included) and spare keeper of this test session that
    was not there when it started, looked for every 0.1 s."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before, self.seen, self.done = self.now(), set(), threading.Event()
        self.start()

    @staticmethod
    def now():
        return set(training_processes(spares=True)) | set(training_processes(kind="keeper"))

    def run(self):
        while not self.done.wait(0.1):
            self.seen |= self.now() - self.before

    def stop(self):
        self.done.set()
        self.join()
        return self.seen | (self.now() - self.before)


def test_on_a_local_master_a_fit_over_its_share_of_the_machine_is_refused_before_any_job_or_process(spark, digits_df):
    """The default branch: no spark.executor.pyspark.memory, a local master, whose workers share the
    machine's available memory. What each of 2 workers needs is over it: its batch of 64 float32 features
    alone is more than this machine's whole memory (a batch is estimated, never allocated; weights doing
    it alone would take about a gigabyte). The refusal comes before the stage: Spark runs no job and no
    training process starts."""
    import keras
    import psutil

    from tfbarrier.errors import ModelError

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch_size = 2 * (psutil.virtual_memory().total // (64 * 4) + 1)  # rows per worker x 64 x 4 bytes > total
    before = last_job_id(spark)
    watch = NewProcesses()
    with pytest.raises(ModelError) as refused:
        tfbarrier.fit(digits_df, model, features="pixels", label="digit", batch_size=batch_size, num_workers=2,
                      verbose=0)
    started = watch.stop()
    assert last_job_id(spark) == before + 1, "Spark ran a job before the refusal"
    assert started == set(), f"training processes started before the refusal: {started}"
    message = str(refused.value)
    assert re.search(r"each training process needs about [\d.]+ GB \(TensorFlow 650 MB, weights, gradients and their "
                     r"exchange [\d.]+ KB, .*"
                     r"a batch [\d.]+ GB\), but can have about [\d.]+ GB: this machine has [\d.]+ GB available for "
                     r"2 workers \(a tenth of its memory kept for the code that runs and the kernel\)\. To fit: use fewer "
                     r"workers \(num_workers\)", message), message
    assert "spark.tfbarrier.memoryCheck=false" in message


def test_what_a_worker_needs_is_checked_against_its_share_of_the_host():
    import pytest

    from tfbarrier.errors import ModelError
    from tfbarrier.models import memory
    from tfbarrier.spark.worker_memory import usable_bytes

    usable = usable_bytes()
    huge = memory.ModelSize(weights=usable, trainable=usable, slots=2, optimizer="Adam")
    with pytest.raises(ModelError, match=r"this host has .* available for the 2 worker\(s\) on it"):
        memory.check_on_host(huge, rows=0, workers_on_host=2, already_held=0)
    small = memory.ModelSize(weights=2**20, trainable=2**20, slots=2, optimizer="Adam")
    memory.check_on_host(small, rows=32, workers_on_host=2, already_held=2**20)  # no error


def test_a_plain_sgd_step_counts_as_much_as_one_with_momentum_where_tensorflow_pools_without_onednn():
    """Without oneDNN, training processes use TensorFlow's BFC pool, which held a plain SGD step of MLPs of 61 to
    300 M parameters as high as a step with momentum's slot: the estimate was 0.72-0.83 of their peaks
    (bench/memory_estimate_bench.py on a CPU without AVX-512), where a check below the peak lets the OOM killer
    end a fit it passed. With oneDNN's pool it did not, and SGD counts no slot."""
    import dataclasses

    from tfbarrier.models import memory

    pooled = memory.ModelSize(weights=2**30, trainable=2**30, slots=0, optimizer="SGD", pooled=True)
    momentum = dataclasses.replace(pooled, slots=1)
    assert pooled.worker_bytes(32) >= 0.95 * momentum.worker_bytes(32)
    assert dataclasses.replace(pooled, pooled=False).worker_bytes(32) <= momentum.worker_bytes(32) - 0.9 * 2**30
    assert dataclasses.replace(momentum, pooled=False).worker_bytes(32) == momentum.worker_bytes(32)


def test_a_step_counts_the_weights_their_gradients_and_copies_of_the_largest_variable_not_copies_of_every_one():
    """The ring's step was counted at 4 copies of the trainable weights, fitted on MLPs mostly one matrix: a model of
    16 layers of 16 MB (65 M parameters, Adam) peaked at 1,653 MB where the check counted 2,147 (1.30x:
    bench/README.md). The step holds the weights and their gradients, and copies of the
    largest variable's gradient as the exchange sums it and the optimizer updates with it."""
    from tfbarrier.exchange.base import PACKS_AHEAD
    from tfbarrier.models import memory

    def step(size):
        return size.parts(rows=0)["weights, gradients and their exchange"]

    layers = tuple(((4096, 4096), 4) for _ in range(16))  # 16 matrices of 64 MiB
    many = memory.ModelSize(weights=2**30, trainable=2**30, slots=0, optimizer="SGD", shapes=layers)
    one = memory.ModelSize(weights=2**30, trainable=2**30, slots=0, optimizer="SGD", shapes=(((16384, 16384), 4),))
    assert step(one) == int(3.4 * 2**30)  # one matrix: the weights, their gradient and 1.4 copies of it
    assert 2 * 2**30 < step(many) < 2.5 * 2**30
    # shapes unknown: counted as one matrix (the larger count)
    assert step(memory.ModelSize(weights=2**30, trainable=2**30, slots=0, optimizer="SGD")) == step(one)
    # sharded over 4 workers, the gradients held back: the packs in flight (of one 64 MiB matrix each) and the summed
    # shares of the pack being applied; one matrix is cut into blocks, and its gradient is one pack of all of it
    assert step(many) - step(many.sharded(4)) == 2**30 - (1 + PACKS_AHEAD) * 64 * 2**20
    assert step(one.sharded(4)) == step(one)
    # applied once after every pack (global norm clipping, EMA): a worker holds its whole share, a quarter
    once = dataclasses.replace(many, applied_once=True)
    assert step(once) - step(once.sharded(4)) == 0.75 * 2**30 - PACKS_AHEAD * 64 * 2**20


def test_an_optimizer_a_sharded_step_applies_once_is_counted_with_its_whole_share_on_the_driver_and_in_the_worker():
    """Clipping by the global norm, or an EMA, makes a sharded step apply the optimizer once, after every pack: a
    worker then holds its whole share of the summed gradients. The training process's check counts it after the
    step took the clipnorm off the optimizer (sharded_update._take_global_clipnorm), as the driver's did before."""
    import keras

    from tfbarrier.exchange import sharded_update
    from tfbarrier.models import memory

    def sized(optimizer):
        model = keras.Sequential([keras.Input((64,)), *[keras.layers.Dense(64) for _ in range(4)]])
        model.compile(optimizer=optimizer, loss="mse")
        return model, memory.ModelSize.of(model).sharded(2)

    for optimizer, once in ((keras.optimizers.Adam(), False), (keras.optimizers.Adam(global_clipnorm=1.0), True),
                            (keras.optimizers.SGD(use_ema=True), True)):
        model, on_driver = sized(optimizer)
        assert on_driver.applied_once is once, optimizer.get_config()
        sharded_update._take_global_clipnorm(model.optimizer)
        assert model.optimizer.global_clipnorm is None
        assert memory.ModelSize.of(model).sharded(2) == on_driver  # what a worker holds: the step-count test's


def test_workers_that_share_the_optimizers_slots_each_count_their_share_and_their_blocks_copies():
    from tfbarrier.exchange.base import PACKS_AHEAD
    from tfbarrier.models import memory

    layers = tuple(((4096, 4096), 4) for _ in range(16))  # 16 equal matrices of 64 MiB: none cut, 1/N each
    adam = memory.ModelSize(weights=2**30, trainable=2**30, slots=2, optimizer="Adam", shapes=layers)
    for workers in (2, 4):  # each worker holds its 1/N of Adam's two copies of the weights, and of the gradients
        # the packs the backward pass makes ahead of the ring (the rest are held back) and a pack's summed shares
        held = (1 + PACKS_AHEAD) * 64 * 2**20
        assert adam.worker_bytes(32) - adam.sharded(workers).worker_bytes(32) == 2 * 2**30 * (1 - 1 / workers) + (
            2**30 - held)
    assert "25% of them on this worker" in adam.sharded(4).describe(32)
    # one matrix of half the weights: cut into 4 blocks of rows, one a worker, each updated in a copy of its own
    one_table = memory.ModelSize(weights=2**30, trainable=2**30, slots=2, optimizer="Adam",
                                 shapes=(((8192, 16384), 4),) + layers[:8])
    assert one_table.sharded(4).slot_share == 0.25 and one_table.sharded(4).blocks == 2**29 // 4


def test_a_large_variable_is_cut_into_a_block_of_rows_per_worker_and_the_rest_go_whole_to_the_lightest():
    from tfbarrier.exchange.placement import held, pieces

    # an embedding of 87% of the weights (as bench/README.md's 61 M MLP's first matrix), then small ones
    shapes, itemsizes = [(1000, 64), (64,), (64, 10), (10,)], [4, 4, 4, 4]
    placed = pieces(shapes, itemsizes, 2)
    assert placed[0] == [(0, 0, 500), (1, 500, 1000)]
    assert all(len(p) == 1 and p[0][1:] == (0, shape[0]) for p, shape in zip(placed[1:], shapes[1:]))
    most, blocks = held(shapes, itemsizes, 2)
    assert most <= 0.51 * sum(4 * np.prod(s) for s in shapes) and blocks == 500 * 64 * 4
    # fewer rows than workers, or a scalar: whole
    assert pieces([(3, 1000), ()], [4, 4], 4) == [[(0, 0, 3)], [(1, 0, None)]]
    assert pieces([(10,)], [4], 1) == [[(0, 0, 10)]]


def test_the_driver_knows_what_a_local_worker_can_have(spark):
    from tfbarrier.spark import worker_memory

    can_have, why, fix = worker_memory.executor_budget(spark, num_workers=2)
    assert 0 < can_have <= worker_memory.usable_bytes() // 2 * 1.1 and "available for 2 workers" in why
    assert "num_workers" in fix


def test_on_a_local_master_workers_that_would_take_all_the_available_memory_are_refused(spark):
    """MemAvailable counts the page cache that running TensorFlow and the JVM read their code from, and
    the estimate can be 5% under a peak: two workers of a 400 M-parameter MLP (SGD), each estimated at
    93% of half of it, were ended by the OOM killer on this 24 GiB machine (bench/README.md, "Large
    models"). A model whose workers need more than the available memory less a tenth of the machine is
    refused, however much of the available memory is left."""
    import psutil

    from tfbarrier.errors import ModelError
    from tfbarrier.models import memory
    from tfbarrier.spark.worker_memory import HEADROOM

    machine = psutil.virtual_memory()
    share = (machine.available - HEADROOM * machine.total / 2) / 2  # between the two: half the headroom
    a_mib = memory.ModelSize(weights=2**20, trainable=2**20, slots=0, optimizer="SGD")  # over the ring
    per_byte = (a_mib.worker_bytes(rows=0) - memory.TENSORFLOW_BYTES) / 2**20
    trainable = int((share - memory.TENSORFLOW_BYTES) / per_byte)
    size = memory.ModelSize(weights=trainable, trainable=trainable, slots=0, optimizer="SGD")
    assert machine.available / 2 > size.worker_bytes(rows=0) > (machine.available - HEADROOM * machine.total) / 2
    with pytest.raises(ModelError, match=r"a tenth of its memory kept"):
        memory.check_on_driver(spark, size, rows=0, num_workers=2)


def test_a_model_functions_archive_holds_no_optimizer_state_and_the_estimate_counts_its_chiefs_archive(spark):
    """A model function's chief writes the trained model as a .keras archive, which Keras builds in memory: with
    Adam's slots in it, the chief of a 135 M model of 8 layers peaked at 4,052 MB where the check counted 2,668 (and
    every worker wrote one). The archive now holds the optimizer's config, not its state (the driver's model starts
    a fresh optimizer, as a model object's does), only the chief writes it over the ring, and the estimate counts
    what writing it holds past the step."""
    import tf_keras

    def build():
        model = tf_keras.Sequential([tf_keras.Input((1024,))] + [tf_keras.layers.Dense(2048, activation="relu")
                                                                 for _ in range(8)] + [tf_keras.layers.Dense(10)])
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-4),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    df = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(
        rng.random((128, 1024), dtype=np.float32), rng.integers(0, 10, 128))], "x array<float>, y long")
    result = tfbarrier.fit(df.repartition(2), build, features="x", label="y", batch_size=64, epochs=1,
                           num_workers=2, verbose=0)
    assert int(result.model.optimizer.iterations.numpy()) == 0 and len(result.history["loss"]) == 1
    chief = result.workers[0]["memory"]
    assert chief["estimate_mb"] >= 0.85 * chief["peak_mb"], chief


def test_the_estimate_covers_the_peak_of_a_fit_whose_layer_outputs_outweigh_its_weights(spark):
    """A CNN of 64x64 images: 0.3 M parameters, but 24 MB of layer outputs a sample. A training
    process's peak (``ru_maxrss``, TensorFlow included) is what memory.py must not underestimate: a
    check below it lets the kernel's OOM killer end a fit it passed. The old estimate, which counted no
    layer outputs, was 0.67x this peak. The bound is looser than bench/memory_estimate_bench.py's
    (0.97-1.01x for this model on a quiet machine): beside another test's fit on the same 2 cores,
    more of a step's tensors are alive at once, and the peak was 1.16x the quiet one."""
    import keras

    from tfbarrier.models import memory

    layers = keras.layers
    model = keras.Sequential([keras.Input((64, 64, 3))]
                             + [layers.Conv2D(f, 3, padding="same", activation="relu") for f in (64, 64, 128, 128)]
                             + [layers.GlobalAveragePooling2D(), layers.Dense(10)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    df = spark.createDataFrame(
        [(row.tolist(), int(label)) for row, label in zip(rng.random((128, 64 * 64 * 3), dtype=np.float32),
                                                          rng.integers(0, 10, 128))], "x array<float>, y long")
    result = tfbarrier.fit(df.repartition(2), model, features="x", label="y", batch_size=64, epochs=1,
                           steps_per_epoch=2, num_workers=2, verbose=0)
    worker = max(result.workers, key=lambda w: w["memory"]["peak_mb"])
    peak_mb, tensorflow_mb = worker["memory"]["peak_mb"], worker["memory"]["tensorflow_mb"]
    estimate_mb = memory.ModelSize.of(model).worker_bytes(32) / 2**20
    assert 0.8 * peak_mb <= estimate_mb, (estimate_mb, peak_mb)
    # above TensorFlow (as the process measured it before the model: 650 MB imported cold, about 250 in a process
    # forked from a warm one, which faults its code in as it runs: once, 640 MB in all at the peak)
    growth_mb, estimated_growth_mb = peak_mb - tensorflow_mb, estimate_mb - memory.TENSORFLOW_BYTES / 2**20
    assert estimated_growth_mb <= 1.5 * growth_mb, (estimated_growth_mb, growth_mb)


def test_the_estimate_covers_the_peak_of_a_sequence_model_whose_steps_outweigh_its_weights(spark):
    """A model of token sequences, whose inputs' length only the data tells (``keras.Input((None,))``):
    its layers' outputs show no size, so the layers' rule counted nothing of a step's tensors, and the
    estimate was 0.37x a LoRA fit's peak (bench/README.md, memory-estimate-lora, at 3a4e826). Traced once the
    profile knows the length, what the step keeps is counted: here most of the peak, for 21 MB of weights."""
    import keras

    from tfbarrier.models import memory

    length, width, rows = 256, 1024, 64
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = keras.layers.Embedding(1000, width)(tokens)
    for _ in range(3):
        hidden = keras.layers.Dense(width, activation="gelu")(hidden)
    model = keras.Model(tokens, keras.layers.Dense(16)(hidden))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    df = spark.createDataFrame([(ids.tolist(), labels.tolist()) for ids, labels in
                                zip(rng.integers(0, 1000, (rows, length)), rng.integers(0, 16, (rows, length)))],
                               "ids array<int>, labels array<long>")
    result = tfbarrier.fit(df.repartition(2), model, features={"tokens": "ids"}, label="labels", batch_size=rows,
                           epochs=1, steps_per_epoch=1, num_workers=2, verbose=0)
    peak_mb = max(w["memory"]["peak_mb"] for w in result.workers)
    size = memory.ModelSize.of(model, native=True)
    sized = size.with_widths(model, memory.input_shapes(model, {"tokens": length}))
    kept_mb = (sized.kept[0] * rows // 2 + sized.kept[1]) / 2**20
    estimate_mb = sized.worker_bytes(rows // 2) / 2**20
    assert kept_mb > 0.25 * peak_mb, (kept_mb, peak_mb)  # the step's tensors are what the estimate is about
    assert 0.8 * peak_mb <= estimate_mb <= 1.5 * peak_mb, (estimate_mb, peak_mb, sized.describe(rows // 2))


def test_a_traced_step_counts_its_graph_by_its_operations_and_an_untraced_one_nothing():
    """What running a transformer's step holds outside TensorFlow's allocator grows with its graph (a 120 M
    Llama with LoRA: 0.43 GB in float32, 0.5 GB in int8, whose layers compute in float one at a time), which the
    layers' rule, fitted on models of a few layers, did not count: the estimate was 0.90x and 0.79x their fits'
    peaks (bench/README.md, quantized-lora-120m, at b7938d8)."""
    import keras

    from tfbarrier.models import memory

    def sequence_model(blocks):
        tokens = keras.Input((None,), dtype="int32", name="tokens")
        hidden = keras.layers.Embedding(100, 32)(tokens)
        for _ in range(blocks):
            hidden = keras.layers.LayerNormalization()(keras.layers.Dense(32, activation="gelu")(hidden) + hidden)
        model = keras.Model(tokens, keras.layers.Dense(4)(hidden))
        model.compile(optimizer="adam", loss="mse")
        return model

    sizes = {}
    for blocks in (2, 8):
        model = sequence_model(blocks)
        size = memory.ModelSize.of(model, native=True)
        sizes[blocks] = size.with_widths(model, memory.input_shapes(model, {"tokens": 16}))
        assert size.graph == 0  # nothing traced yet
    small, large = sizes[2].graph, sizes[8].graph
    assert small > 0 and small % memory.GRAPH_BYTES_PER_OP == 0
    assert 2.5 < large / small < 4.5, (small, large)  # 8 blocks against 2, and what every step has besides
    assert "the traced step's graph" in sizes[8].describe(8)
    mlp = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    assert memory.ModelSize.of(mlp).with_widths(mlp, {"input": (8,)}).graph == 0  # its layers tell their sizes
