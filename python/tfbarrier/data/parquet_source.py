"""A plain Parquet scan, read by the barrier tasks themselves.

When ``fit``'s DataFrame is nothing but columns of local Parquet files (``plain_scan``),
each task reads its rows with pyarrow. When the bare scan has ``num_workers`` partitions, a task reads
exactly the files Spark's partition would have read; otherwise, since they would have been reshuffled
into ``num_workers`` anyway (a repartition of the user's on top changes nothing then), each task reads
a contiguous, even share of the files' rows. That skips Spark's whole row path for the training
data: its Parquet reader, the repartition shuffle and the JVM's Arrow export (about 79 MB/s here,
against 340-850 MB/s for pyarrow). It also skips the driver's aggregate pass over the data: row
counts and nulls come from the files' footers, the array width from the first row (each task checks
the rest as it writes its shard). A scan whose ``num_workers`` partitions split a file (files larger
than ``spark.sql.files.maxPartitionBytes``) goes through Spark; so does a repartition or coalesce to
``num_workers`` partitions (its rows per partition cannot be known here), a file whose types differ
from Spark's schema or whose footer cannot vouch for the absence of nulls, and every DataFrame when
``spark.tfbarrier.directParquet`` is false.
"""

import dataclasses

from tfbarrier.data import shards
from tfbarrier.data.features import ArrayColumn
from tfbarrier.spark import cluster

TARGET_BATCH_BYTES = shards.RECORD_BATCH_BYTES  # rows per read batch: about this many bytes


@dataclasses.dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of one Parquet file."""

    path: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Source:
    """A data source the tasks read themselves (see DIRECT_SOURCES in api.py): what each worker reads
    (``slices[i]`` for worker i) and the profile ``profiles.check_profile`` takes, made from the footers."""

    slices: list
    profile: dict

    def batches(self, index, columns):
        """Worker ``index``'s record batches of ``columns``, in order (read in its task)."""
        return read(self.slices[index], columns)


def _footers_vouch_no_nulls(metadata, columns):
    """True when every column chunk of ``columns`` has a null count of zero in its statistics (a row
    group without rows holds no nulls, with or without statistics)."""
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        if row_group.num_rows == 0:
            continue
        for i in range(row_group.num_columns):
            chunk = row_group.column(i)
            if chunk.path_in_schema.split(".")[0] in columns:
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    return False
    return True


def _first_width(path, column):
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1, columns=[column]):
        if len(batch):
            return len(batch.column(0)[0])
    return None


def _split(files, rows, num_workers):
    """Each worker's contiguous share of the files' rows, as even as can be."""
    shares = [rows // num_workers + (i < rows % num_workers) for i in range(num_workers)]
    slices, worker, need = [[] for _ in range(num_workers)], 0, shares[0]
    for path, file_rows in files:
        start = 0
        while start < file_rows:
            while need == 0:
                worker += 1
                need = shares[worker]
            take = min(need, file_rows - start)
            slices[worker].append(Slice(path, start, start + take))
            start, need = start + take, need - take
    return slices


def _same_type(a, b):
    """Arrow types equal but for the name of a list's item field (Spark and Parquet writers differ)."""
    import pyarrow as pa

    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    return a == b


def _footer(path, spark_types):
    """The file's metadata when its columns have Spark's types, else None (also for a file that cannot
    be read: Spark has its own ways with those)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return None
    schema = metadata.schema.to_arrow_schema()
    for name, spark_type in spark_types.items():
        if name not in schema.names or not _same_type(schema.field(name).type, spark_type):
            return None  # a column Spark resolved another way: its case, a merged or given schema
    return metadata


def plan(frame, partitions, layout, num_workers):
    """The Source of ``frame`` (the training columns, in ``partitions`` Spark partitions) for
    ``num_workers`` tasks, or None when Spark must stream the partitions (see the module's docstring)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if not cluster.direct_parquet(frame.sparkSession) or layout.inputs is not None:  # a column per input: Spark's
        return None  # aggregate pass measures each array column's lengths
    scan = plain_scan(frame)
    if scan is None:
        return None
    paths, repartitioned = scan
    kept = partitions == num_workers
    if kept:  # Spark's partitions are the workers' shards: only a bare scan's can be known here
        spark_split = None if repartitioned else _whole_files_of_partitions(frame)
        if spark_split is None or len(spark_split) != num_workers:
            return None
    spark_types = {field.name: field.type for field in to_arrow_schema(frame.schema)}
    files, rows = [], 0
    for path in paths:
        metadata = _footer(path, spark_types)
        if metadata is None or not _footers_vouch_no_nulls(metadata, layout.columns):
            return None
        files.append((path, metadata.num_rows))
        rows += metadata.num_rows
    profile = {"rows": rows, **{f"nulls_{i}": 0 for i in range(len(layout.columns))}}
    if isinstance(layout, ArrayColumn):  # its profile measures the arrays' lengths
        width = next((w for w in (_first_width(p, layout.features[0]) for p, n in files if n) if w is not None), 0)
        profile.update(min_length=width, max_length=width, null_elements=0)
    file_rows = dict(files)
    if kept and all(sum(file_rows[path] for path in partition) for partition in spark_split):
        slices = [[Slice(path, 0, file_rows[path]) for path in partition] for partition in spark_split]
    else:  # a partition of Spark's without rows would leave its worker nothing: share the rows evenly
        slices = _split(files, rows, num_workers)
    if sum(part.stop - part.start for worker in slices for part in worker) != rows:
        return None  # Spark's split did not cover the files exactly once: let Spark stream them
    return Source(slices=slices, profile=profile)


def _whole_files_of_partitions(frame):
    """The files of each of Spark's partitions of ``frame``, when each partition reads whole files
    (Spark splits only files larger than spark.sql.files.maxPartitionBytes); else None."""
    import os

    partitions = file_partitions(frame)
    if partitions is None:
        return None
    if any(start != 0 or length != os.path.getsize(path) for files in partitions for path, start, length in files):
        return None
    return [[path for path, _, _ in files] for files in partitions]


def read(slices, columns):
    """The record batches of ``columns`` in ``slices``, in order, about TARGET_BATCH_BYTES each."""
    import pyarrow.parquet as pq

    for part in slices:
        parquet = pq.ParquetFile(part.path)
        first = 0  # the file's row where the row group starts
        for group in range(parquet.metadata.num_row_groups):
            row_group = parquet.metadata.row_group(group)
            start, stop = max(part.start, first), min(part.stop, first + row_group.num_rows)
            if start < stop:
                yield from _rows_of_group(parquet, group, row_group, columns, start - first, stop - first)
            first += row_group.num_rows


def _rows_of_group(parquet, group, row_group, columns, start, stop):
    """Rows ``[start, stop)`` of one row group (row numbers within the group)."""
    batch_rows = max(1, int(row_group.num_rows * TARGET_BATCH_BYTES / max(1, row_group.total_byte_size)))
    offset = 0
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns):
        low, high = max(start - offset, 0), min(stop - offset, len(batch))
        if low < high:
            yield batch.slice(low, high - low)
        offset += len(batch)
        if offset >= stop:
            return



# ---- what Spark's plan says (classic Spark only: Connect shows no plan) ----

def plain_scan(df):
    """(local files, repartitioned) when ``df``'s plan is nothing but columns of a Parquet scan,
    repartitioned at most (no filter, no computed column, no cache, no partition columns, only
    ``file:`` paths); ``repartitioned`` says whether a repartition or coalesce stands on top. Else
    None; always None under Connect, which shows no plan."""
    import urllib.parse

    from py4j.protocol import Py4JError

    if cluster.is_connect(df.sparkSession):
        return None
    repartitioned = False
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        while _simple_name(plan) in ("Project", "Repartition", "RepartitionByExpression"):
            if _simple_name(plan) == "Project" and not _is_plain_projection(plan):
                return None
            repartitioned = repartitioned or _simple_name(plan) != "Project"
            plan = plan.child()
        if _simple_name(plan) != "LogicalRelation":
            return None
        relation = plan.relation()
        if (_simple_name(relation) != "HadoopFsRelation" or _simple_name(relation.fileFormat()) != "ParquetFileFormat"
                or relation.partitionSchema().length() > 0):
            return None
    except Py4JError:
        return None
    files = df.inputFiles()
    if not files or any(urllib.parse.urlparse(uri).scheme not in ("", "file") for uri in files):
        return None
    return sorted(_local_path(uri) for uri in files), repartitioned


def file_partitions(df):
    """Spark's own split of a plain file scan (see ``plain_scan``) into its partitions: per
    partition, the (local path, first byte, bytes) ranges of files it reads, in order; None if the plan
    cannot tell."""
    from py4j.protocol import Py4JError

    try:
        leaves = df._jdf.queryExecution().executedPlan().collectLeaves()
        if leaves.size() != 1 or _simple_name(leaves.apply(0)) != "FileSourceScanExec":
            return None
        partitions = leaves.apply(0).inputRDD().filePartitions()
        return [[(_local_path(f.filePath().toString()), f.start(), f.length()) for f in partitions.apply(i).files()]
                for i in range(partitions.size())]
    except Py4JError:
        return None


def _simple_name(java_object):
    return java_object.getClass().getSimpleName()


def _is_plain_projection(node):
    columns = node.projectList()
    return all(_simple_name(columns.apply(i)) == "AttributeReference" for i in range(columns.size()))


def _local_path(uri):
    """The path of a ``file:`` URI (percent-escapes undone)."""
    import urllib.parse

    return urllib.parse.unquote(urllib.parse.urlparse(uri).path)
