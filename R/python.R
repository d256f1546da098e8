# The bridge to the Python core: which interpreter, the lazily imported module, and Python errors as
# R conditions.

core <- NULL

#' The Python interpreter tfbarrier uses
#'
#' In order: the `TFBARRIER_PYTHON` environment variable, the `tfbarrier.python` option, then the
#' virtualenv made by [install_tfbarrier()] (`r-tfbarrier`). It must be chosen before Python starts
#' in the session: reticulate 1.28 binds one interpreter per R session.
#'
#' @return The path of the interpreter, or `""` when none is configured.
#' @export
tfbarrier_python <- function() {
  python <- Sys.getenv("TFBARRIER_PYTHON", unset = getOption("tfbarrier.python", ""))
  if (!nzchar(python) && reticulate::virtualenv_exists(default_envname)) {
    python <- reticulate::virtualenv_python(default_envname)
  }
  python
}

.onLoad <- function(libname, pkgname) {
  python <- tfbarrier_python()
  if (nzchar(python) && file.exists(python) && !reticulate::py_available()) {
    # Not use_python(): reticulate 1.28 looks for a Poetry project first, and warns about any
    # pyproject.toml with a [tool] table in the working directory (this repository's, for one).
    if (!nzchar(Sys.getenv("RETICULATE_PYTHON"))) Sys.setenv(RETICULATE_PYTHON = python)
    reticulate::use_python(python, required = FALSE)
  }
  # Delay loading: library(tfbarrier) does not start Python.
  core <<- reticulate::import("tfbarrier", delay_load = TRUE, convert = TRUE)
  reg.finalizer(parent.env(environment()), close_python_sessions, onexit = TRUE)
}

# At R's exit: what the core's Python would do at its own (predict's session server closed, its files removed),
# since R's embedded Python runs no atexit handler. Only when this session imported that module.
close_python_sessions <- function(namespace) {
  if (!reticulate::py_available(initialize = FALSE)) return(invisible())
  try(reticulate::py_run_string(paste(
    "import sys",
    "_transfer = sys.modules.get('tfbarrier.spark.transfer')",
    "if _transfer is not None: _transfer.close_sessions()", sep = "\n")), silent = TRUE)
  invisible()
}

# A Python module that imports TensorFlow, imported after tfbarrier: that keeps TensorFlow's start-up
# banners off R's console (tf_banners.py).
import_after_tfbarrier <- function(module) {
  core$tf_banners$install()
  reticulate::import(module)
}

# Python bytes (a binary column's value, e.g. an encoded image) as an R raw vector: reticulate converts
# a bytearray to one, not bytes.
raw_bytes <- function(value) reticulate::import_builtins()$bytearray(value)

#' Is the Python side of tfbarrier available?
#'
#' @return `TRUE` when the Python interpreter imports `tfbarrier` and `pyspark`, and Java is on the
#'   `PATH` (Spark needs it).
#' @export
tf_available <- function() {
  nzchar(Sys.which("java")) &&
    reticulate::py_module_available("tfbarrier") &&
    reticulate::py_module_available("pyspark")
}

# Evaluate a call into Python; a tfbarrier error comes back as an R condition whose class vector holds
# the Python class names (most specific first, e.g. "ColumnError", "TfBarrierError"), then
# "tfbarrier_error", "error", "condition".
tf_call <- function(expr, call = sys.call(-1)) {
  tryCatch(expr, error = function(e) {
    last <- reticulate::py_last_error()
    exception <- if (!is.null(last)) attr(last, "exception")
    classes <- if (!is.null(exception)) core$errors$class_names(exception) else character()
    if (length(classes) == 0 || !grepl(last$type, conditionMessage(e), fixed = TRUE)) {
      stop(e)
    }
    tf_abort(last$value, classes, call = call, python = exception)
  })
}

# An R condition of tfbarrier's classes (`classes`, most specific first), always ending in "TfBarrierError",
# "tfbarrier_error" (as ?spark_tf_fit's Errors section promises), "error", "condition".
tf_abort <- function(message, classes, call = NULL, ...) {
  condition <- structure(
    class = c(unique(c(classes, "TfBarrierError")), "tfbarrier_error", "error", "condition"),
    list(message = message, call = call, ...)
  )
  stop(condition)
}

default_envname <- "r-tfbarrier"

# Put `python`'s own library directory first in LD_LIBRARY_PATH, for the processes R starts from now
# on (pip, Spark's JVM and through it every Python worker): R's LD_LIBRARY_PATH lists the system's
# library directory, whose libpython shadows the interpreter's own and breaks `import ssl`.
prefer_python_libdir <- function(python) {
  code <- "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"
  libdir <- system2(python, c("-c", shQuote(code)), stdout = TRUE)
  old <- Sys.getenv("LD_LIBRARY_PATH")
  if (length(libdir) == 1 && nzchar(libdir)) {
    Sys.setenv(LD_LIBRARY_PATH = paste(c(libdir, old[nzchar(old)]), collapse = ":"))
  }
  invisible(old)
}
