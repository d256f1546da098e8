"""Rows/s of distributed scoring: tfbarrier.predict on local[2] vs model.predict in one process vs
pyspark's predict_batch_udf, same model (the slides' CNN on 28x28) and batch size, interleaved.

    .venv/bin/python bench/predict_bench.py [--rows 50000] [--rounds 3]
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import harness  # noqa: E402
import tfbarrier  # noqa: E402
from mnist_demo import slides_cnn  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()

    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import SparkSession
    from pyspark.sql.types import ArrayType, FloatType

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x = np.random.default_rng(0).random((args.rows, 784), dtype=np.float32)
    df = spark.createDataFrame(pd.DataFrame({"pixels": list(x)})).repartition(2).cache()
    df.count()
    model = slides_cnn()
    path = os.path.join(tempfile.mkdtemp(prefix="tfbarrier-bench-"), "model.keras")
    model.save(path)

    def make_predict_fn():
        import keras

        loaded = keras.models.load_model(path)
        return lambda batch: loaded.predict_on_batch(batch.reshape(-1, 28, 28, 1))

    peer = predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=args.batch_size,
                             input_tensor_shapes=[[784]])

    def run_tfbarrier():
        tfbarrier.predict(df, model, features="pixels", output="raw", batch_size=args.batch_size) \
            .write.format("noop").mode("overwrite").save()
        return args.rows

    def run_peer():
        df.withColumn("prediction", peer("pixels")).write.format("noop").mode("overwrite").save()
        return args.rows

    def run_local():
        model.predict(x.reshape(-1, 28, 28, 1), batch_size=args.batch_size, verbose=0)
        return args.rows

    for run in (run_tfbarrier, run_peer, run_local):  # warm-up: Python workers, model caches, graphs
        run()
    rates = harness.interleaved({"tfbarrier.predict (local[2])": run_tfbarrier,
                                 "predict_batch_udf (local[2])": run_peer,
                                 "model.predict (1 process)": run_local}, args.rounds)
    body = (f"## Distributed inference\n\n`.venv/bin/python bench/predict_bench.py --rows {args.rows} "
            f"--rounds {args.rounds}`: rows/s scoring {args.rows:,} rows x 784 floats with the slides' CNN "
            f"(28x28x1), batch {args.batch_size}, after one warm-up run of each; Spark output to the `noop` sink.\n\n"
            + harness.table(rates, "rows/s", "model.predict (1 process)"))
    harness.write_section("predict", body)
    print(body)
    spark.stop()


if __name__ == "__main__":
    main()
