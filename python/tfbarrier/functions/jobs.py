"""The job kinds of ``run`` and ``apply``: the user's function called in every training process (the chief's value
comes back), or on each task's partition (its frame comes back)."""

import dataclasses
import json
import os
import sys
import time

import cloudpickle

from tfbarrier.data import shards
from tfbarrier.errors import ColumnError
from tfbarrier.faults import port_clash_is_retryable
from tfbarrier.results import ProcessReport
from tfbarrier.spark.job import Job


def _report(started, **fields):
    return ProcessReport(timings={"training": time.time() - started}, python_prefix=sys.prefix,
                         finished_at=time.time(), **fields)


def load_payload(payload, workdir):
    """The cloudpickled value of ``payload`` (a transfer.Payload in ``workdir``)."""
    with open(payload.path(workdir), "rb") as f:
        return cloudpickle.load(f)


VALUE_FILE = "value.pkl"  # run: the chief's return value, cloudpickled
TABLE_FILE = "table.arrow"  # apply: the frame a worker returned, as an Arrow IPC stream


@dataclasses.dataclass
class RunJob(Job):
    """``run``: call the user's function in every training process; the chief's value comes back."""

    needs_tensorflow = False
    function: object = None  # transfer.Payload: cloudpickled (fn, args, kwargs)

    def execute(self, tf, config, channel):
        fn, args, kwargs = load_payload(self.function, config["workdir"])
        started = time.time()
        with port_clash_is_retryable():  # the user's function builds the strategy
            value = fn(*args, **kwargs)
        if config["tf_config"]["task"]["index"] != 0:
            return _report(started)
        with open(os.path.join(config["workdir"], VALUE_FILE), "wb") as f:
            cloudpickle.dump(value, f)
        return _report(started, files={"value": VALUE_FILE})

    def decode(self, results, files):
        """The chief's return value."""
        with open(files.received(results[0].files["value"]), "rb") as f:
            return cloudpickle.load(f)


@dataclasses.dataclass
class ApplyJob(Job):
    """``apply``: call the user's function on each task's partition; its frame comes back as an Arrow
    IPC stream, cast to ``output_schema`` when given."""

    needs_tensorflow = False
    function: object = None  # transfer.Payload: cloudpickled fn(partition, barrier)
    input_schema: object = None  # pyarrow schema of the partitions
    output_schema: object = None  # pyarrow schema the function's frames are cast to (None: as they come)

    def write_input(self, batches, path, index):
        return {"rows": shards.write_partition(batches, path), "checksum": None}

    def execute(self, tf, config, channel):
        import pyarrow as pa

        fn = load_payload(self.function, config["workdir"])
        tf_config = config["tf_config"]
        index = tf_config["task"]["index"]
        barrier = {"address": tf_config["cluster"]["worker"][index], "partition": index,
                   "num_workers": len(tf_config["cluster"]["worker"]), "tf_config": json.dumps(tf_config)}
        started = time.time()
        frame = fn(shards.read_partition(config["shard"], self.input_schema), barrier)
        table = self._cast(pa.Table.from_pandas(frame, preserve_index=False))
        with pa.ipc.new_stream(os.path.join(config["workdir"], TABLE_FILE), table.schema) as writer:
            writer.write_table(table)
        return _report(started, files={"table": TABLE_FILE})

    def decode(self, results, files):
        """The workers' frames, concatenated in worker order (a pandas DataFrame)."""
        import pyarrow as pa

        tables = [pa.ipc.open_stream(files.received(r.files["table"])).read_all() for r in results]
        return pa.concat_tables(tables, promote_options="default").to_pandas()

    def _cast(self, table):
        if self.output_schema is None:
            return table
        missing = [name for name in self.output_schema.names if name not in table.column_names]
        if missing:
            raise ColumnError(f"the function's result has no column(s) {missing}; it has {table.column_names}")
        return table.select(self.output_schema.names).cast(self.output_schema)
