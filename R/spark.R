#' Start (or get) a Spark session for tfbarrier
#'
#' A `pyspark` `SparkSession` through reticulate, set up so that the Python processes Spark starts
#' (executors' Python workers, training processes) run tfbarrier's interpreter with its own
#' libpython. Pass your own session to the other functions instead if you have one.
#'
#' @param master Spark master URL, e.g. `"local[2]"` or `"spark://host:7077"`.
#' @param config Named list of further Spark settings.
#' @param app_name Application name.
#' @param remote A Spark Connect URL (`"sc://host:15002"`), or `"local[N]"` for a local Connect server
#'   started by pyspark; `master` is then ignored. A Connect session cannot share an R session with a
#'   classic one.
#' @return A `pyspark.sql.SparkSession` (a Python object).
#' @export
tf_spark_connect <- function(master = "local[2]", config = list(), app_name = "tfbarrier", remote = NULL) {
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
#'   Databricks) is a pyspark DataFrame underneath and is used as it is. Any other `tbl_spark` lives in
#'   sparklyr's own JVM, not in the one tfbarrier's pyspark drives. It crosses over through Parquet: sparklyr writes it to `getOption("tfbarrier.exchange_dir")`
#'   (default: a new directory under [tempdir()]), which both sides must see (any local path in local
#'   mode; a shared file system such as HDFS or S3 on a cluster), and pyspark reads it from there.
#' @return A `pyspark.sql.DataFrame`.
#' @export
tf_spark_dataframe <- function(spark, data, format = "parquet", options = list()) {
  if (inherits(data, "python.builtin.object")) {
    return(data)
  }
  if (is.character(data) && length(data) == 1) {
    if (identical(format, "binaryFile") && is.null(options$recursiveFileLookup)) options$recursiveFileLookup <- "true"
    reader <- spark$read$format(format)
    for (name in names(options)) reader <- reader$option(name, options[[name]])
    return(tf_call(reader$load(data)))
  }
  if (inherits(data, "tbl_pyspark")) {
    # A Python-backed sparklyr connection (pysparklyr) holds a pyspark DataFrame already.
    return(sparklyr::spark_dataframe(data))
  }
  if (inherits(data, "tbl_spark")) {
    return(tbl_spark_dataframe(spark, data))
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

tbl_spark_dataframe <- function(spark, tbl) {
  if (!requireNamespace("sparklyr", quietly = TRUE)) {
    tf_abort("a tbl_spark needs the sparklyr package", "InvalidArgumentError")
  }
  exchange <- getOption("tfbarrier.exchange_dir", tempfile("tfbarrier-exchange-"))
  path <- file.path(exchange, basename(tempfile("tbl-")))
  sparklyr::spark_write_parquet(tbl, path, mode = "overwrite")
  tf_call(spark$read$parquet(path))
}
