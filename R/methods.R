# The R face of a FitResult: plain R data (data.frames, named vectors) with print, plot and predict.

new_fit <- function(result, features) {
  history <- as.data.frame(lapply(result$history, unlist))
  history <- cbind(epoch = seq_len(nrow(history)), history)
  fields <- c("index", "host", "port", "rows", "steps", "steps_per_epoch", "checksum")
  workers <- do.call(rbind, lapply(result$workers, function(w) {
    row <- as.data.frame(w[fields], stringsAsFactors = FALSE)
    row$baseline_mb <- w$memory$baseline_mb  # the training process's resident memory once set up...
    row$peak_mb <- w$memory$peak_mb  # ...and at its peak
    row
  }))
  structure(
    list(
      model = result$model,
      history = history,
      timings = unlist(result$timings),
      workers = workers,
      attempts = result$attempts,
      features = features,
      python = result
    ),
    class = "tfbarrier_fit"
  )
}

#' @export
print.tfbarrier_fit <- function(x, ...) {
  last <- x$history[nrow(x$history), setdiff(names(x$history), "epoch"), drop = FALSE]
  cat(sprintf("<tfbarrier fit: %d workers, %d epochs>\n", nrow(x$workers), nrow(x$history)))
  cat("final:  ", paste(sprintf("%s %.4g", names(last), unlist(last)), collapse = ", "), "\n", sep = "")
  cat(sprintf("worker %d on %s: %d rows, %d steps\n", x$workers$index, x$workers$host, x$workers$rows,
              x$workers$steps), sep = "")
  shown <- intersect(c("worker_start", "rendezvous", "first_step", "training", "total"), names(x$timings))
  cat("seconds:", paste(sprintf("%s %.1f", shown, x$timings[shown]), collapse = ", "), "\n")
  invisible(x)
}

#' Training curves of a fit
#'
#' One panel per metric (loss, accuracy...), epochs on the x axis.
#'
#' @param x A `tfbarrier_fit`.
#' @param ... Passed to [graphics::plot()].
#' @return `x`, invisibly.
#' @export
plot.tfbarrier_fit <- function(x, ...) {
  metrics <- setdiff(names(x$history), "epoch")
  old <- graphics::par(mfrow = c(1, length(metrics)))
  on.exit(graphics::par(old))
  for (metric in metrics) {
    graphics::plot(x$history$epoch, x$history[[metric]], type = "b", pch = 19, xlab = "epoch",
                   ylab = metric, main = metric, ...)
  }
  invisible(x)
}

#' Predictions of a fitted model, on the driver
#'
#' @param object A `tfbarrier_fit`.
#' @param newdata A numeric matrix (one row per example, flat features) or a data.frame holding the
#'   fit's feature columns (a matrix or list column for array features).
#' @param type `"class"` (integer class ids, as in the label), `"probabilities"` or `"raw"` (matrices).
#' @param batch_size Rows per forward pass.
#' @param ... Unused.
#' @return An integer vector (`"class"`) or a numeric matrix, one row per row of `newdata`.
#' @export
predict.tfbarrier_fit <- function(object, newdata, type = c("class", "probabilities", "raw"),
                                  batch_size = 1024L, ...) {
  type <- match.arg(type)
  x <- feature_matrix(newdata, object$features)
  out <- tf_call(core$inference$predict_local(object$model, reticulate::np_array(x, dtype = "float32"),
                                              output = type, batch_size = as.integer(batch_size)))
  if (type == "class") as.integer(out) else as.matrix(out)
}

feature_matrix <- function(newdata, features) {
  if (is.matrix(newdata)) return(newdata)
  if (!is.data.frame(newdata)) {
    tf_abort("newdata must be a matrix or a data.frame", "InvalidArgumentError")
  }
  missing <- setdiff(features, names(newdata))
  if (length(missing)) {
    tf_abort(sprintf("newdata has no column(s) %s", paste(missing, collapse = ", ")), "ColumnError")
  }
  if (length(features) == 1) {
    values <- newdata[[features]]
    return(if (is.list(values)) do.call(rbind, values) else as.matrix(values))
  }
  as.matrix(newdata[features])
}
