#' Start (or get) a Spark session for tfbarrier
#'
#' A `pyspark` `SparkSession` through reticulate, set up so that the Python processes Spark starts
#' (executors' Python workers, training processes) run tfbarrier's interpreter with its own
#' libpython. Pass your own session to the other functions instead if you have one. sparklyr users
#' need none of this: a `tbl_spark` trains in its own connection's application (see [tf_spark_session()]).
#'
#' @param master Spark master URL, e.g. `"local[2]"` or `"spark://host:7077"`; or a sparklyr connection,
#'   whose own application's session is returned ([tf_spark_session()]): no second application.
#' @param config Named list of further Spark settings.
#' @param app_name Application name.
#' @param remote A Spark Connect URL (`"sc://host:15002"`), or `"local[N]"` for a local Connect server
#'   started by pyspark; `master` is then ignored. A Connect session cannot share an R session with a
#'   classic one.
#' @return A `pyspark.sql.SparkSession` (a Python object).
#' @export
tf_spark_connect <- function(master = "local[2]", config = list(), app_name = "tfbarrier", remote = NULL) {
  if (inherits(master, "spark_connection")) return(tf_spark_session(master))
  if (!is_string(master)) {
    tf_abort("master must be a Spark master URL such as \"local[2]\", or a sparklyr connection", "InvalidArgumentError")
  }
  if (!is.null(remote) && !is_string(remote)) {
    tf_abort("remote must be a Spark Connect URL such as \"sc://host:15002\", or \"local[N]\"", "InvalidArgumentError")
  }
  if (length(config) && (is.null(names(config)) || !all(nzchar(names(config))))) {
    tf_abort("config must be a named list of Spark settings", "InvalidArgumentError")
  }
  python <- reticulate::py_config()$python
  if (!is.null(remote)) master <- remote
  local <- master == "local" || startsWith(master, "local[")
  prefer_python_libdir(python)
  env <- list(PYSPARK_PYTHON = python, PYSPARK_DRIVER_PYTHON = python, LD_LIBRARY_PATH = Sys.getenv("LD_LIBRARY_PATH"))
  if (local && !nzchar(Sys.getenv("SPARK_LOCAL_IP"))) env$SPARK_LOCAL_IP <- "127.0.0.1"
  # Python copied the environment when it started; pyspark hands its own copy to the JVM it launches.
  do.call(Sys.setenv, env)
  environ <- reticulate::import("os", convert = FALSE)$environ
  for (key in names(env)) reticulate::py_set_item(environ, key, env[[key]])
  pyspark <- reticulate::import("pyspark.sql", convert = FALSE)
  if (!is.null(remote)) {
    # A Connect server fixes its settings itself; a local one inherits this Python's environment.
    builder <- pyspark$SparkSession$builder$remote(remote)
    for (key in names(config)) builder <- builder$config(key, as.character(config[[key]]))
    return(builder$getOrCreate())
  }
  builder <- pyspark$SparkSession$builder$master(master)$appName(app_name)
  defaults <- list("spark.ui.showConsoleProgress" = "false", "spark.pyspark.python" = python)
  if (local) defaults[["spark.driver.host"]] <- "127.0.0.1"  # a local job stays on the loopback
  for (key in union(names(defaults), names(config))) {
    value <- if (!is.null(config[[key]])) config[[key]] else defaults[[key]]
    builder <- builder$config(key, as.character(value))
  }
  session <- builder$getOrCreate()
  session$sparkContext$setLogLevel("ERROR")
  session
}

#' A Spark DataFrame for tfbarrier from R data
#'
#' @param spark A `SparkSession` from [tf_spark_connect()].
#' @param data An R data.frame (numeric, integer, logical or character columns; a matrix column, or a
#'   list column of equal-length numeric vectors, becomes an array column, e.g. a flat image per
#'   row), a path (read with the data source `format`), a `pyspark` DataFrame (returned as is), or a
#'   sparklyr `tbl_spark`.
#' @param format The Spark data source a path is read with: `"parquet"` (the default), or
#'   `"binaryFile"` for a directory of image files, read with its sub-folders (`recursiveFileLookup`).
#'   Its `content` column holds each encoded image (PNG, JPEG, GIF, BMP), which [spark_tf_fit()] and
#'   [spark_tf_predict()] take as the features (decoded in the training processes); its `path`
#'   column is where a label usually comes from, e.g.
#'   `sdf$withColumn("label", F$regexp_extract("path", "/(\\d+)/[^/]+$", 1L)$cast("int"))` with
#'   `F <- reticulate::import("pyspark.sql.functions")`.
#' @param options A named list of the data source's options for a path, e.g.
#'   `list(pathGlobFilter = "*.png")`.
#' @section sparklyr: A `tbl_spark` of a Python-backed connection (pysparklyr: Spark Connect,
#'   Databricks) is a pyspark DataFrame underneath and is used as it is. A `tbl_spark` of a classic
#'   connection is registered as a temporary view in its own connection and read there by
#'   tfbarrier's Python, attached to that connection's driver ([tf_spark_session()]): no files, no
#'   second application. Only where attaching cannot work (a Livy connection), or when `spark` is
#'   another application's session, does it cross over through Parquet: sparklyr writes it to
#'   `getOption("tfbarrier.exchange_dir")` (default: a new directory under [tempdir()]), which both
#'   sides must see (any local path in local mode; a shared file system such as HDFS or S3 on a
#'   cluster), and pyspark reads it from there; predictions come back the same way, their Spark ML
#'   vector columns as arrays.
#' @return A `pyspark.sql.DataFrame`.
#' @export
tf_spark_dataframe <- function(spark, data, format = "parquet", options = list()) {
  check_given(c("spark", "data"))
  if (inherits(data, "python.builtin.object")) {
    return(data)
  }
  if (inherits(data, "tbl_pyspark")) {
    # A Python-backed sparklyr connection (pysparklyr) holds a pyspark DataFrame already.
    return(sparklyr::spark_dataframe(data))
  }
  if (inherits(data, "tbl_spark")) {
    return(tbl_spark_dataframe(spark, data))
  }
  if (!inherits(spark, "python.builtin.object")) {
    tf_abort(paste0("spark must be a SparkSession (see tf_spark_connect()), not ", class(spark)[1]),
             "InvalidArgumentError")
  }
  if (is.character(data) && length(data) == 1) {
    if (!is_string(format)) tf_abort("format must be the name of a Spark data source", "InvalidArgumentError")
    if (identical(format, "binaryFile") && is.null(options$recursiveFileLookup)) options$recursiveFileLookup <- "true"
    reader <- spark$read$format(format)
    for (name in names(options)) reader <- reader$option(name, options[[name]])
    return(tf_call(reader$load(data)))
  }
  if (!is.data.frame(data)) {
    tf_abort(paste0("data must be a data.frame, a Parquet path or a pyspark DataFrame, not ",
                    class(data)[1]), "InvalidArgumentError")
  }
  columns <- lapply(names(data), function(name) column_array(name, data[[name]]))
  names(columns) <- names(data)
  tf_call(core$spark_frame(spark, columns))
}

column_array <- function(name, values) {
  if (is.list(values) && !is.data.frame(values)) {
    lengths <- unique(lengths(values))
    if (length(lengths) != 1) {
      tf_abort(sprintf("list column '%s' holds vectors of different lengths: give every row the same length",
                       name), "ColumnError")
    }
    values <- do.call(rbind, values)
  }
  if (is.factor(values)) values <- as.character(values)
  # reticulate turns NA into values that look valid (TRUE, -2147483648, "NA"): refuse them here.
  if (anyNA(values)) {
    tf_abort(sprintf("column '%s' has %d missing value(s): drop or impute them first", name, sum(is.na(values))),
             "ColumnError")
  }
  reticulate::np_array(values)
}

#' Bring a Spark DataFrame into R
#'
#' Collects a `pyspark` DataFrame (e.g. the predictions of [spark_tf_predict()]) to the driver through
#' Arrow, as an R data.frame: numbers, logicals and strings as vectors, array columns (a flat image,
#' class probabilities) as matrix columns, one row per example, binary columns (the `content` of encoded
#' images) as list columns of raw vectors. Arrays of different lengths, or with missing elements, come
#' as a list column. `as.data.frame()` on a pyspark DataFrame does the same. A
#' sparklyr `tbl_spark` is collected by sparklyr (`dplyr::collect()`).
#'
#' @param sdf A `pyspark` DataFrame (classic or Spark Connect), or a sparklyr `tbl_spark`.
#' @param arrays `"matrix"` (the default) or `"list"`: how array columns arrive.
#' @return A data.frame with every row of `sdf`: collect only what fits in the driver's memory.
#' @examples
#' \dontrun{
#' scored <- tf_collect(spark_tf_predict(sdf, fit, output = "probabilities"))
#' dim(scored$prediction)  # rows x classes
#' }
#' @export
tf_collect <- function(sdf, arrays = c("matrix", "list")) {
  check_given("sdf")
  arrays <- choose_arg(arrays, c("matrix", "list"))
  if (inherits(sdf, "tbl_spark")) {
    if (!requireNamespace("dplyr", quietly = TRUE)) tf_abort("a tbl_spark needs the dplyr package", "InvalidArgumentError")
    return(as.data.frame(dplyr::collect(sdf)))
  }
  if (!inherits(sdf, "python.builtin.object")) {
    tf_abort(paste0("sdf must be a pyspark DataFrame, not ", class(sdf)[1]), "InvalidArgumentError")
  }
  columns <- tf_call(core$frames$frame_columns(sdf))
  rows <- if (length(columns)) NROW(columns[[1]]) else 0L
  out <- structure(list(), class = "data.frame", row.names = .set_row_names(rows))
  for (name in names(columns)) out[[name]] <- r_column(columns[[name]], arrays)
  out
}

#' @rdname tf_collect
#' @param x A `pyspark` DataFrame.
#' @param row.names,optional,... Unused; for the `as.data.frame()` generic.
#' @export
as.data.frame.pyspark.sql.dataframe.DataFrame <- function(x, row.names = NULL, optional = FALSE, ...) {
  tf_collect(x)
}

#' @export
as.data.frame.pyspark.sql.connect.dataframe.DataFrame <- as.data.frame.pyspark.sql.dataframe.DataFrame

# One collected column: a matrix stays a matrix (or becomes a list of its rows); a list of strings or
# of scalars with NULLs becomes a vector with NAs; a list of arrays stays a list; binary values (encoded
# images) become raw vectors.
r_column <- function(values, arrays) {
  if (is.matrix(values)) {
    return(if (arrays == "list") lapply(seq_len(nrow(values)), function(i) values[i, ]) else values)
  }
  if (is.list(values)) {
    bytes <- vapply(values, inherits, logical(1), "python.builtin.bytes")
    if (any(bytes)) {
      values[bytes] <- lapply(values[bytes], raw_bytes)
      return(values)
    }
    scalar <- vapply(values, function(v) is.null(v) || (is.atomic(v) && length(v) == 1 && !is.array(v)), logical(1))
    if (all(scalar)) {
      values[vapply(values, is.null, logical(1))] <- list(NA)
      return(unlist(values))
    }
    return(lapply(values, function(v) if (is.null(v)) NULL else as.vector(v)))
  }
  as.vector(values)
}
