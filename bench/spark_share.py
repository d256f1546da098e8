"""What Spark itself takes of a cold fit (issue 43): in a fresh SparkSession on local[2] with the data of
large_model_bench.py cached and no model, the seconds of the data check's aggregate job (data/profiles.profile,
what fit runs first), then of a barrier job of 2 Arrow tasks that import tfbarrier's task module and
return (Spark starts its Python workers for it, as for a fit's stage). A cold fit's floor is one plain
process's time to first step plus these: tfbarrier's own share is what a cold fit takes beyond that.

    .venv/bin/python bench/spark_share.py --out O.json
"""

import argparse
import json
import time

import large_model_bench


def measure():
    """{"profile": s, "python_tasks": s} in a fresh SparkSession."""
    from tfbarrier.data import profiles
    from tfbarrier.spark import protocol
    from tfbarrier.data.layouts import layout

    spark, df = large_model_bench.driver_session()
    started = time.time()
    profiles.profile(df, layout(df.schema, "x", "y"))
    profiled = time.time()
    spark.range(0, 2, numPartitions=2).mapInArrow(_task_imports, protocol.RESULT_SCHEMA, barrier=True).collect()
    seconds = {"profile": profiled - started, "python_tasks": time.time() - profiled}
    spark.stop()
    return seconds


def _task_imports(batches):
    import tfbarrier.spark.task  # noqa: F401 - what unpickling a fit's task function imports

    for _ in batches:
        pass
    yield from ()


if __name__ == "__main__":  # large_model_bench's import has set harness.local_spark_env()
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    with open(parser.parse_args().out, "w") as f:
        json.dump(measure(), f)
