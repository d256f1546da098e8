#' Run an R function in every Spark barrier task
#'
#' The workflow of `spark_apply(barrier = TRUE)` without the plumbing: `f` runs once in each of
#' `num_workers` barrier tasks, in a process of its own where `TF_CONFIG` is already set for a
#' multi-worker TensorFlow cluster, with that task's partition of `sdf` as an R data.frame. The
#' closure travels with base `serialize()` and runs in an R embedded through rpy2 (the Python
#' environment needs `rpy2`; see [install_tfbarrier()]).
#'
#' @param sdf A `pyspark` DataFrame (or an R data.frame / Parquet path, converted as in [spark_tf_fit()]).
#' @param f `function(df, barrier)`: `df` is the task's partition; `barrier` is a list with `address`
#'   (this worker's `host:port` in `TF_CONFIG`), `partition`, `num_workers` and `tf_config` (the JSON
#'   string). It returns a data.frame.
#' @param num_workers Number of barrier tasks.
#' @param columns Named character vector of the result's column types (`"character"`, `"integer"`,
#'   `"double"`/`"numeric"`, `"logical"`); `NULL` keeps what `f` returns.
#' @param timeout Seconds before the job is cancelled (`NULL`: no limit).
#' @param env The training processes' Python environment, from [tf_env()] (`NULL`: the executors' own).
#' @param spark As in [spark_tf_fit()].
#' @param verbose `2` shows what `f` prints in every task on the R console as it comes, prefixed
#'   `[worker i]`; `0` and `1` do not.
#' @return A data.frame: the rows every task returned, in task order.
#' @export
spark_tf_apply <- function(sdf, f, num_workers = 2L, columns = NULL, timeout = NULL, env = NULL, spark = NULL,
                           verbose = 1L) {
  check_given(c("sdf", "f"))
  if (!is.function(f)) {
    tf_abort("f must be a function(df, barrier)", "InvalidArgumentError")
  }
  types <- NULL
  if (!is.null(columns)) {
    if (!is.character(columns) || is.null(names(columns)) || !all(nzchar(names(columns)))) {
      tf_abort("columns must be a named character vector of column types, e.g. c(rows = \"integer\")",
               "InvalidArgumentError")
    }
    arrow <- c(character = "string", integer = "int32", double = "float64", numeric = "float64", logical = "bool")
    unknown <- setdiff(columns, names(arrow))
    if (length(unknown)) {
      tf_abort(sprintf("unknown column type(s) %s: use %s", paste(unknown, collapse = ", "),
                       paste(names(arrow), collapse = ", ")), "InvalidArgumentError")
    }
    types <- as.list(stats::setNames(unname(arrow[columns]), names(columns)))
  }
  sdf <- as_spark_dataframe(sdf, spark)
  closure <- core$r_closure$RClosure(serialize(f, NULL))
  result <- tf_call(core$apply(sdf, closure, num_workers = as_int(num_workers), columns = types, timeout = timeout,
                               env = env, verbose = as_int(verbose)))
  as.data.frame(result, stringsAsFactors = FALSE)
}
