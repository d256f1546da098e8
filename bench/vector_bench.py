"""The cost of a Spark ML vector column against the same values in an array column: tfbarrier.fit
with 2 workers on local[2], from one cached DataFrame that holds the rows three ways, interleaved
round by round:

  array column     array<double>, the layout tfbarrier took before vectors
  dense vectors    VectorUDT, dense (what VectorAssembler makes of dense columns)
  sparse vectors   VectorUDT, sparse (the same values; most are zero, as after OneHotEncoder)

Time to first step is from the fit() call to worker 0's first finished step (it includes the
driver's profile of the data and the task's streaming of its partition to the shard, where Spark
turns vectors into arrays); throughput counts the samples of epochs 2.. over their time.

    PYTHONPATH=bench .venv/bin/python bench/vector_bench.py [--rows 20000] [--width 512] [--rounds 3]
"""

import argparse
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH, os.environ.get("PYTHONPATH")) if p)

import harness  # noqa: E402

COLUMNS = {"array column": "pixels", "dense vectors": "dense", "sparse vectors": "sparse"}
ZEROS = 0.9  # the share of zero values in every row


def frame(spark, rows, width):
    """The rows as an array column, a dense and a sparse vector column of equal values, and a label."""
    import numpy as np
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

    rng = np.random.default_rng(0)
    x = np.where(rng.random((rows, width)) < ZEROS, 0.0, rng.random((rows, width)))
    y = rng.integers(0, 10, rows)
    schema = StructType([StructField("pixels", ArrayType(DoubleType())), StructField("dense", VectorUDT()),
                         StructField("sparse", VectorUDT()), StructField("label", LongType())])

    def row(i):
        nonzero = np.flatnonzero(x[i])
        return (x[i].tolist(), Vectors.dense(x[i]), Vectors.sparse(width, nonzero, x[i][nonzero]), int(y[i]))

    df = spark.createDataFrame((row(i) for i in range(rows)), schema).repartition(2).cache()
    df.count()
    return df


def model(width):
    import keras

    mlp = keras.Sequential([keras.Input((width,)), keras.layers.Dense(256, activation="relu"),
                            keras.layers.Dense(10)])
    mlp.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return mlp


def fit_on(df, column, args):
    import tfbarrier

    def fit(callbacks):
        return tfbarrier.fit(df, model(args.width), features=column, label="label", epochs=args.epochs,
                             batch_size=args.batch, num_workers=2, verbose=0, callbacks=callbacks)

    return lambda: harness.clocked_fit(fit, args.rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harness.local_spark_env()
    spark = harness.local_spark(**{"spark.driver.memory": "4g"})
    df = frame(spark, args.rows, args.width)
    contenders = {name: fit_on(df, column, args) for name, column in COLUMNS.items()}
    for run in contenders.values():
        run()  # warm: spares, TensorFlow's caches, the JVM's code
    results = harness.rounds_of(contenders, args.rounds, log=lambda line: print(line, file=sys.stderr))
    body = (f"## Spark ML vector columns against an array column\n\n"
            f"`PYTHONPATH=bench .venv/bin/python bench/vector_bench.py --rows {args.rows} --width {args.width} "
            f"--rounds {args.rounds}`: tfbarrier.fit, 2 workers, local[2], an MLP {args.width}-256-10 (Adam), "
            f"{args.rows:,} rows of {args.width} values ({ZEROS:.0%} zeros), global batch {args.batch}, "
            f"{args.epochs} epochs, one warm-up fit each, then {args.rounds} rounds in turn.\n\n"
            "Time to first step (s, from the call; includes the driver's profile of the data and the shard):\n\n"
            + harness.metric_table(results, "first_step", "s", "array column")
            + "\n\nSteady throughput (samples/s over epochs 2..):\n\n"
            + harness.metric_table(results, "throughput", "samples/s", "array column", digits=0))
    harness.write_section("vector-columns", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
