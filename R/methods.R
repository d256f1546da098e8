# The R face of a FitResult: plain R data (data.frames, named vectors) with print, plot and predict.

new_fit <- function(result, features) {
  # val_* is None between validations (validation_freq): NA here.
  values <- lapply(result$history, function(v) vapply(v, function(x) if (is.null(x)) NA_real_ else x, numeric(1)))
  history <- cbind(epoch = seq_along(values[[1]]), as.data.frame(values))
  fields <- c("index", "host", "port", "rows", "steps", "steps_per_epoch", "checksum")
  workers <- do.call(rbind, lapply(result$workers, function(w) {
    row <- as.data.frame(w[fields], stringsAsFactors = FALSE)
    row$baseline_mb <- w$memory$baseline_mb  # the training process's resident memory once set up...
    row$peak_mb <- w$memory$peak_mb  # ...and at its peak
    row$steps_per_execution <- w$steps_per_execution  # the steps per call it ended with
    row$exchange <- w$communication$exchange  # how its gradients travelled: "tfbarrier" (the ring) or "strategy"
    row$compression <- if (is.null(w$communication$compression)) "none" else w$communication$compression
    # the weights whose optimizer state it held: all of them, unless communication's shard split them
    row$state_of_weights <- if (is.null(w$communication$state_of_weights)) NA_real_ else w$communication$state_of_weights
    row$files_via <- w$transfer$via  # how the model's files reached it: "driver link" (outside Spark) or "spark"
    row$files_mb <- w$transfer$fetched_bytes / 2^20
    row
  }))
  structure(
    list(
      model = result$model,
      history = history,
      timings = unlist(result$timings),
      workers = workers,
      attempts = result$attempts,
      stopped_epoch = result$stopped_epoch,
      saved = saved_models(result$saved),
      mlflow_run_id = result$mlflow_run_id,
      features = features,
      python = result
    ),
    class = "tfbarrier_fit"
  )
}

# fit(save_to =)'s saved models as a data.frame (epoch, path), or NULL without save_to.
saved_models <- function(saved) {
  if (!length(saved)) return(NULL)
  data.frame(epoch = vapply(saved, function(s) as.integer(s$epoch), integer(1)),
             path = vapply(saved, function(s) s$path, character(1)), stringsAsFactors = FALSE)
}

#' @export
print.tfbarrier_fit <- function(x, ...) {
  last <- x$history[nrow(x$history), setdiff(names(x$history), "epoch"), drop = FALSE]
  cat(sprintf("<tfbarrier fit: %d workers, %d epochs, exchange %s>\n", nrow(x$workers), nrow(x$history),
              x$workers$exchange[1]))
  cat("final:  ", paste(sprintf("%s %.4g", names(last), unlist(last)), collapse = ", "), "\n", sep = "")
  cat(sprintf("worker %d on %s: %d rows, %d steps\n", x$workers$index, x$workers$host, x$workers$rows,
              x$workers$steps), sep = "")
  shown <- intersect(c("worker_start", "rendezvous", "first_step", "training", "total"), names(x$timings))
  cat("seconds:", paste(sprintf("%s %.1f", shown, x$timings[shown]), collapse = ", "), "\n")
  invisible(x)
}

#' Training curves of a fit
#'
#' One panel per metric (loss, accuracy...), epochs on the x axis, with its validation twin
#' (`val_loss`...) in the same panel, dashed.
#'
#' @param x A `tfbarrier_fit`.
#' @param ... Passed to [graphics::plot()].
#' @return The metrics drawn, one per panel, each named by itself and valued by the validation twin
#'   drawn with it (`NA` for none), invisibly: `c(loss = "val_loss", accuracy = "val_accuracy")`.
#' @export
plot.tfbarrier_fit <- function(x, ...) {
  metrics <- setdiff(names(x$history), c("epoch", grep("^val_", names(x$history), value = TRUE)))
  old <- graphics::par(mfrow = c(1, length(metrics)))
  on.exit(graphics::par(old))
  drawn <- stats::setNames(rep(NA_character_, length(metrics)), metrics)
  for (metric in metrics) {
    twin <- x$history[[paste0("val_", metric)]]
    range <- range(c(x$history[[metric]], twin), na.rm = TRUE)
    graphics::plot(x$history$epoch, x$history[[metric]], type = "b", pch = 19, xlab = "epoch",
                   ylab = metric, main = metric, ylim = range, ...)
    if (!is.null(twin)) {
      keep <- !is.na(twin)
      graphics::lines(x$history$epoch[keep], twin[keep], type = "b", pch = 1, lty = 2)
      drawn[[metric]] <- paste0("val_", metric)
      graphics::legend("topright", legend = c(metric, paste0("val_", metric)), pch = c(19, 1), lty = 1:2, bty = "n")
    }
  }
  invisible(drawn)
}

#' The history of a fit as a data.frame
#'
#' @param x A `tfbarrier_fit`.
#' @param row.names,optional,... Unused; for the generic.
#' @return One row per epoch: `epoch`, then each metric (`loss`, `accuracy`, `val_loss`...; `NA` for
#'   `val_` columns between validations).
#' @export
as.data.frame.tfbarrier_fit <- function(x, row.names = NULL, optional = FALSE, ...) {
  x$history
}

#' Summary of a fit
#'
#' @param object A `tfbarrier_fit`.
#' @param ... Unused.
#' @return A `summary.tfbarrier_fit`: `final` (the last epoch's metrics), `best_epoch` (lowest
#'   `val_loss`, else lowest `loss`), `stopped_epoch`, `timings` and `workers`; it prints.
#' @export
summary.tfbarrier_fit <- function(object, ...) {
  history <- object$history
  monitor <- if ("val_loss" %in% names(history)) "val_loss" else "loss"
  structure(list(
    final = unlist(history[nrow(history), setdiff(names(history), "epoch")]),
    best_epoch = history$epoch[which.min(history[[monitor]])], monitor = monitor,
    epochs = nrow(history), stopped_epoch = object$stopped_epoch,
    timings = object$timings, workers = object$workers
  ), class = "summary.tfbarrier_fit")
}

#' @export
print.summary.tfbarrier_fit <- function(x, ...) {
  cat(sprintf("tfbarrier fit: %d workers, %d epochs%s\n", nrow(x$workers), x$epochs,
              if (is.null(x$stopped_epoch)) "" else sprintf(" (stopped by a callback after epoch %d)",
                                                             x$stopped_epoch + 1L)))
  cat("final metrics: ", paste(sprintf("%s %.4g", names(x$final), x$final), collapse = ", "), "\n", sep = "")
  cat(sprintf("best epoch by %s: %d\n", x$monitor, x$best_epoch))
  cat("seconds: ", paste(sprintf("%s %.1f", names(x$timings), x$timings), collapse = ", "), "\n", sep = "")
  print(x$workers[, c("index", "host", "rows", "steps", "exchange", "peak_mb")], row.names = FALSE)
  invisible(x)
}

#' Predictions of a fitted model, on the driver
#'
#' Scores `newdata` in this R session's Python with the core's `tfbarrier.predict_local()`, which reads
#' feature columns with the same layouts, and scores them the same way, as the tasks of
#' [spark_tf_predict()]: the two predict the same for the same rows.
#'
#' @param object A `tfbarrier_fit`.
#' @param newdata A numeric matrix (one row per example, flat features) or array (one example per
#'   index of its first dimension, e.g. `n x 8 x 8 x 1`), or a data.frame holding the fit's feature
#'   columns as [spark_tf_fit()] takes them: numeric columns; one array column (a matrix column, or a list
#'   column of equal-length numeric vectors, such as a Spark ML vector column collected into R); or one
#'   column of encoded images (PNG, JPEG, GIF, BMP), a list of raw vectors (e.g. `readBin()` of the files)
#'   or the `content` of a `binaryFile` DataFrame collected with [tf_collect()].
#' @param type `"class"` (integer class ids, as in the label), `"probabilities"` or `"raw"` (matrices).
#' @param batch_size Rows per forward pass.
#' @param ... Unused.
#' @return An integer vector (`"class"`) or a numeric matrix, one row per row of `newdata`; for a Keras 3
#'   model of several outputs, a list of these named by the outputs.
#' @section Errors: As in [spark_tf_fit()]: a missing feature column is a `"ColumnError"`, rows that do
#'   not fill the model's input a `"ModelError"`, a bad argument an `"InvalidArgumentError"`, each followed
#'   by `"TfBarrierError"` and `"tfbarrier_error"`.
#' @export
predict.tfbarrier_fit <- function(object, newdata, type = c("class", "probabilities", "raw"),
                                  batch_size = 1024L, ...) {
  if (missing(newdata)) {
    tf_abort("predict() on a fit needs newdata: a matrix, or a data.frame of the fit's feature columns",
             "InvalidArgumentError")
  }
  type <- choose_arg(type, c("class", "probabilities", "raw"))
  out <- tf_call(core$predict_local(object$model, local_data(newdata, object$features),
                                    features = as_column_names(object$features), output = type,
                                    batch_size = as_int(batch_size)))
  shaped <- function(scores) if (type == "class") as.integer(scores) else as.matrix(scores)
  if (is.list(out)) lapply(out, shaped) else shaped(out)  # a model of several outputs: a list, one each
}

# newdata as the core's predict_local() takes it: a matrix or array as float32; a data.frame's feature
# columns as {name: array}, as tf_spark_dataframe() hands R columns over (column_array()), a column of
# encoded images as a list of bytes. The core's feature layouts read them.
local_data <- function(newdata, features) {
  if (is.array(newdata)) {
    if (!is.numeric(newdata) && !is.logical(newdata)) {
      tf_abort(paste0("newdata as a matrix must hold numbers, not ", typeof(newdata)), "InvalidArgumentError")
    }
    return(reticulate::np_array(newdata, dtype = "float32"))
  }
  if (!is.data.frame(newdata)) {
    tf_abort(paste0("newdata must be a matrix or a data.frame, not ", class(newdata)[1]), "InvalidArgumentError")
  }
  missing <- setdiff(features, names(newdata))
  if (length(missing)) {
    tf_abort(sprintf("newdata has no column(s) %s; its columns are %s", paste(missing, collapse = ", "),
                     paste(names(newdata), collapse = ", ")), "ColumnError")
  }
  columns <- lapply(features, function(name) {
    values <- newdata[[name]]
    if (is_encoded_images(values)) unclass(values) else column_array(name, values)
  })
  stats::setNames(columns, features)
}

# A list column of encoded image files: raw vectors (NULL for a missing one, which the core refuses).
is_encoded_images <- function(values) {
  is.list(values) && any(vapply(values, is.raw, logical(1))) &&
    all(vapply(values, function(v) is.raw(v) || is.null(v), logical(1)))
}
