#' Train many models at once and rank them
#'
#' One [spark_tf_fit()] per set of parameters (a trial), several at once: as many as the cluster has
#' task slots for (`workers_per_trial` each; `max_concurrent` caps it). A trial that fails is
#' recorded with its error and the others go on. The work is done by the Python core,
#' `tfbarrier.tune()`.
#'
#' @param sdf The training data, as in [spark_tf_fit()] (every trial reads it: cache it if it is costly).
#' @param build_model An R function of one list of parameters returning a compiled Keras model built
#'   through reticulate (e.g. `function(p) tf_keras_cnn_example(c(8, 8, 1), learning_rate = p$learning_rate)`),
#'   or a Python function. It runs on the driver, in this R session, once per trial, one trial at a time.
#' @param params The trials: a data.frame (one row per trial, a column per parameter) or a list of
#'   named lists. Whole numbers reach `build_model` as integers.
#' @param features,label,epochs,batch_size,validation_data As in [spark_tf_fit()], the same for every trial.
#' @param metric The metric trials are ranked by (its final value); `"val_loss"` needs a validation
#'   (`validation_data`, or `validation_split` through `...`).
#' @param mode `"min"`, `"max"` or `"auto"` (max for accuracy, AUC, precision, recall).
#' @param workers_per_trial,max_concurrent Workers of each trial's fit; trials at once (by default as
#'   many as the task slots allow).
#' @param ... Further arguments of `tfbarrier.tune()` and `tfbarrier.fit()`: `validation_split`,
#'   `timeout` (per trial), `seed` (the same for every trial), `verbose` (2: a line per trial), `mlflow`
#'   (as in [spark_tf_fit()]: a parent MLflow run for the search, a nested run per trial), ...
#' @param spark As in [spark_tf_fit()].
#' @return A `tfbarrier_tune`: `trials` (a data.frame: `trial`, the parameters, each metric's final
#'   value, `status`, `error`, `seconds`, `started_at`, `finished_at`, `training_started_at`,
#'   `training_finished_at`), `best_params`, `best` (the best
#'   trial's `tfbarrier_fit`), `best_model`, `metric`, `mlflow_run_id` (with `mlflow`, the search's run).
#'   It has `print()`, `plot()` (the metric per trial) and `as.data.frame()` (the trials) methods.
#' @export
spark_tf_tune <- function(sdf, build_model, params, features, label, epochs = 1L, batch_size = 32L, ...,
                          validation_data = NULL, metric = "val_loss", mode = "auto", workers_per_trial = 1L,
                          max_concurrent = NULL, spark = NULL) {
  check_given(c("sdf", "build_model", "params", "features", "label"))
  if (!is.list(params)) {
    tf_abort(paste0("params must be a data.frame or a list of named lists (one per trial), not ", class(params)[1]),
             "InvalidArgumentError")
  }
  sdf <- as_spark_dataframe(sdf, spark)
  if (!is.null(validation_data)) validation_data <- as_spark_dataframe(validation_data, spark)
  if (is.data.frame(params)) params <- lapply(seq_len(nrow(params)), function(i) as.list(params[i, , drop = FALSE]))
  params <- lapply(params, function(p) lapply(p, as_int))
  arguments <- list(features = features, label = label, epochs = epochs, batch_size = batch_size,
                    validation_data = validation_data, metric = metric, mode = mode,
                    workers_per_trial = workers_per_trial, max_concurrent = max_concurrent)
  result <- tf_call(do.call(core$tune, c(list(sdf, build_model, params), as_core_arguments(c(arguments, list(...))))))
  best <- new_fit(result$best, features)
  structure(
    list(trials = trials_frame(reticulate::py_get_attr(result, "trials")), best_params = result$best_params, best = best,
         best_model = best$model, metric = metric, mlflow_run_id = result$mlflow_run_id,
         python = result),
    class = "tfbarrier_tune"
  )
}

# The trials table (a pandas DataFrame, unconverted) as an R data.frame: missing values (None, NaN) as NA,
# pandas Timestamps (local times) as POSIXct.
trials_frame <- function(trials) {
  columns <- reticulate::py_to_r(reticulate::py_call(reticulate::py_get_attr(trials, "to_dict"), orient = "list"))
  as.data.frame(lapply(columns, function(values) {
    if (any(vapply(values, inherits, logical(1), "pandas._libs.tslibs.timestamps.Timestamp"))) {
      return(as.POSIXct(vapply(values, function(v) v$timestamp(), numeric(1)), origin = "1970-01-01"))
    }
    unlist(lapply(values, function(v) if (is.null(v) || (is.numeric(v) && is.nan(v))) NA else v))
  }), stringsAsFactors = FALSE, check.names = FALSE)
}

#' @export
print.tfbarrier_tune <- function(x, ...) {
  ok <- sum(x$trials$status == "ok")
  best <- x$trials[[x$metric]][x$trials$trial == x$python$best_trial]
  params <- paste(sprintf("%s = %s", names(x$best_params), unlist(x$best_params)), collapse = ", ")
  cat(sprintf("<tfbarrier tune: %d of %d trials ok; best %s %.4g with %s>\n", ok, nrow(x$trials), x$metric,
              best, params))
  times <- c("started_at", "finished_at", "training_started_at", "training_finished_at")
  print(x$trials[setdiff(names(x$trials), times)], row.names = FALSE)
  invisible(x)
}

#' The trials of a search as a data.frame
#'
#' @param x A `tfbarrier_tune`.
#' @param row.names,optional,... Unused; for the generic.
#' @return One row per trial: `trial`, the parameters, each metric's final value, `status`, `error`,
#'   `seconds`, `started_at`, `finished_at` (when the driver started and ended the trial's fit),
#'   `training_started_at`, `training_finished_at` (when its chief took its first step and ended).
#' @export
as.data.frame.tfbarrier_tune <- function(x, row.names = NULL, optional = FALSE, ...) {
  x$trials
}

#' Plot a search: the metric of each trial, the best one highlighted
#'
#' @param x A `tfbarrier_tune`.
#' @param ... Passed to [graphics::barplot()].
#' @return The metric's values, invisibly.
#' @export
plot.tfbarrier_tune <- function(x, ...) {
  values <- stats::setNames(x$trials[[x$metric]], x$trials$trial)
  colours <- ifelse(x$trials$trial == x$python$best_trial, "darkorange", "grey60")
  graphics::barplot(values, col = colours, xlab = "trial", ylab = x$metric, main = x$metric, ...)
  invisible(values)
}
