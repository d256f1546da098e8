#' Start (or get) a Spark session for tfbarrier
#'
#' A `pyspark` `SparkSession` through reticulate, set up so that the Python processes Spark starts
#' (executors' Python workers, training processes) run tfbarrier's interpreter with its own
#' libpython. Pass your own session to the other functions instead if you have one.
#'
#' @param master Spark master URL, e.g. `"local[2]"` or `"spark://host:7077"`.
#' @param config Named list of further Spark settings.
#' @param app_name Application name.
#' @return A `pyspark.sql.SparkSession` (a Python object).
#' @export
tf_spark_connect <- function(master = "local[2]", config = list(), app_name = "tfbarrier") {
  python <- reticulate::py_config()$python
  Sys.setenv(PYSPARK_PYTHON = python, PYSPARK_DRIVER_PYTHON = python)
  if (startsWith(master, "local") && !nzchar(Sys.getenv("SPARK_LOCAL_IP"))) {
    Sys.setenv(SPARK_LOCAL_IP = "127.0.0.1")
  }
  prefer_python_libdir(python)
  pyspark <- reticulate::import("pyspark.sql", convert = FALSE)
  builder <- pyspark$SparkSession$builder$master(master)$appName(app_name)
  defaults <- list("spark.ui.showConsoleProgress" = "false")
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
#'   row), the path of a Parquet dataset, or a `pyspark` DataFrame (returned as is).
#' @return A `pyspark.sql.DataFrame`.
#' @export
tf_spark_dataframe <- function(spark, data) {
  if (inherits(data, "python.builtin.object")) {
    return(data)
  }
  if (is.character(data) && length(data) == 1) {
    return(tf_call(spark$read$parquet(data)))
  }
  if (inherits(data, "tbl_spark")) {
    tf_abort(paste0(
      "a sparklyr tbl_spark lives in sparklyr's own JVM: write it to Parquet where both sides can read it ",
      "(sparklyr::spark_write_parquet(tbl, path)) and pass the path instead"
    ), "InvalidArgumentError")
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
