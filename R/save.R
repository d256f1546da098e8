# Saving a trained model: a .keras archive, or a SavedModel for serving.

#' Save a trained model
#'
#' `save_model()` writes a `.keras` archive (architecture, weights, compile settings) that the model's
#' own Keras loads (`keras3::load_model()`, or `keras$saving$load_model()` through reticulate);
#' `tf_export()` writes a TensorFlow SavedModel directory for serving, whose `serve` signature maps a
#' batch of inputs to the outputs. The model is also `fit$model`: `fit$model$save(path)` is the same.
#'
#' `save_model()` is a generic: on anything but a `tfbarrier_fit` it calls `keras3::save_model()` (or
#' the model's own `save()` without keras3), so it does not change what keras3's does. Attached after
#' tfbarrier, keras3's own `save_model()` masks it: then call `tfbarrier::save_model()` or `tf_save()`.
#' To save while training, pass `save_to` (and `save_best`) to [spark_tf_fit()].
#'
#' @param model,fit A `tfbarrier_fit` (for `save_model()`, also a Keras model).
#' @param filepath,path For `save_model()` and `tf_save()` a file ending in `.keras`; for `tf_export()`
#'   a directory.
#' @param ... Passed to `keras3::save_model()` for a Keras model.
#' @return The path, invisibly.
#' @export
save_model <- function(model, filepath, ...) {
  check_given(c("model", "filepath"))
  UseMethod("save_model")
}

#' @rdname save_model
#' @export
save_model.tfbarrier_fit <- function(model, filepath, ...) tf_save(model, filepath)

#' @rdname save_model
#' @export
save_model.default <- function(model, filepath, ...) {
  if (!inherits(model, "python.builtin.object")) {
    tf_abort(paste0("model must be a tfbarrier_fit or a Keras model, not ", class(model)[1]), "InvalidArgumentError")
  }
  if (requireNamespace("keras3", quietly = TRUE)) return(keras3::save_model(model, filepath, ...))
  expanded <- as_path(filepath)
  tf_call(model$save(expanded, ...))
  invisible(filepath)
}

#' @rdname save_model
#' @export
tf_save <- function(fit, path) {
  check_given(c("fit", "path"))
  write_fit(fit, path, "save")
}

#' @rdname save_model
#' @export
tf_export <- function(fit, path) {
  check_given(c("fit", "path"))
  write_fit(fit, path, "export")
}

# The FitResult's `method` ("save" or "export") writing the fit's model to `path`; `path`, invisibly.
write_fit <- function(fit, path, method) {
  check_fit(fit)
  expanded <- as_path(path)
  tf_call(fit$python[[method]](expanded))
  invisible(path)
}
