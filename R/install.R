#' Install the Python side of tfbarrier
#'
#' Creates (or updates) a Python virtualenv with `pyspark`, `tensorflow-cpu` (or `tensorflow` when
#' `gpu = TRUE`), `tf_keras` and the `tfbarrier` Python package that this R package carries, like
#' `tensorflow::install_tensorflow()` does. Run it once; restart R afterwards so that tfbarrier binds
#' the new interpreter. `numpy<2` is kept: reticulate 1.28 cannot use NumPy 2.
#'
#' @param envname Name (or path) of the virtualenv.
#' @param python The Python (>= 3.9) to create it with; by default `python3` on the `PATH`.
#' @param gpu Install the full `tensorflow` build (GPU-capable) instead of `tensorflow-cpu`.
#' @param extra_packages More pip requirements for the same environment (e.g. `"rpy2==3.6.6"` for
#'   [spark_tf_apply()]).
#' @param spark_version The Spark release of the cluster you connect to (`"3.5"`, `"4.0"`, `"4.1"`...):
#'   its `pyspark` is installed, since tfbarrier's Python attaches to a sparklyr connection's driver only
#'   with a `pyspark` of the same release (see [tf_spark_session()]). `NULL`: the newest `pyspark`.
#' @return The path of the environment's Python, invisibly.
#' @section Errors: What cannot be installed is an R error of class `"InstallError"` (a bad
#'   `spark_version`: `"InvalidArgumentError"`), followed by `"TfBarrierError"` and `"tfbarrier_error"`.
#' @export
install_tfbarrier <- function(envname = default_envname, python = NULL, gpu = FALSE, extra_packages = NULL,
                              spark_version = NULL) {
  pyspark <- pyspark_requirement(spark_version)
  sources <- system.file("python", package = "tfbarrier")
  if (!file.exists(file.path(sources, "pyproject.toml"))) {
    tf_abort(paste0("this installation of tfbarrier carries no Python sources (inst/python); ",
                    "install the tfbarrier Python package into your environment with pip instead"), "InstallError")
  }
  constraints <- c("numpy<2", "pandas<3", "pyarrow<26")
  if (is.null(python)) python <- unname(Sys.which("python3"))
  if (!is_string(python)) {
    tf_abort("no python3 on the PATH: pass python = the path of a Python (>= 3.9)", "InstallError")
  }
  old <- prefer_python_libdir(python)  # pip, run from R, must load this Python's libraries
  on.exit(Sys.setenv(LD_LIBRARY_PATH = old), add = TRUE)
  if (!reticulate::virtualenv_exists(envname)) {
    reticulate::virtualenv_create(envname, python = python, packages = constraints[1])
  }
  tensorflow <- if (gpu) "tensorflow==2.21.*" else "tensorflow-cpu==2.21.*"
  reticulate::virtualenv_install(envname, c(constraints, pyspark, tensorflow, sources, extra_packages),
                                 ignore_installed = FALSE)
  # tf-keras requires the full `tensorflow` wheel by name: next to tensorflow-cpu it goes in alone.
  reticulate::virtualenv_install(envname, "tf-keras==2.21.*", pip_options = "--no-deps")
  python <- reticulate::virtualenv_python(envname)
  message("tfbarrier's Python is ready: ", python, "\nRestart R to use it.")
  invisible(python)
}

# "pyspark==3.5.*" for spark_version "3.5" (NULL: none, the newest that tfbarrier allows); refuses what
# tfbarrier does not support.
pyspark_requirement <- function(spark_version) {
  if (is.null(spark_version)) return(NULL)
  parts <- suppressWarnings(as.integer(strsplit(as.character(spark_version), ".", fixed = TRUE)[[1]]))
  if (length(parts) < 2 || anyNA(parts) || parts[1] < 3 || (parts[1] == 3 && parts[2] < 5) || parts[1] > 4) {
    tf_abort(paste0("spark_version must be a Spark release tfbarrier supports, 3.5 to 4.x, such as \"3.5\" or ",
                    "\"4.0\"; got ", deparse(spark_version)), "InvalidArgumentError")
  }
  sprintf("pyspark==%d.%d.*", parts[1], parts[2])
}
