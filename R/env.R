# The Python environment of the training processes on the executors (env = of fit and apply).

#' The Python environment of the training processes on the executors
#'
#' For `env =` of [spark_tf_fit()] and [spark_tf_apply()]: each executor makes sure a virtualenv with
#' exactly these requirements exists on its host (built once, cached under `workon_home`, locked so
#' that tasks on one host never build it twice) and starts the training process with its Python. The
#' training process needs `tensorflow`, `tf-keras`, `pyarrow`, `numpy` and `cloudpickle` there, or
#' `system_site_packages = TRUE`.
#'
#' @param requirements Character vector of pip requirements.
#' @param workon_home Where environments live; default `$WORKON_HOME`, else `tfbarrier-envs-<uid>` in the
#'   system's temporary directory (made 0700). It must be the executor's user's alone (owned by it, written by
#'   no other user): a directory or environment another user made or may write is refused with an error
#'   naming its owner, never run.
#' @param find_links,index_url,no_index Passed to pip: a wheelhouse (directory or URL), a private
#'   index, no index at all (offline).
#' @param system_site_packages Also see the executor Python's packages.
#' @param archive Instead of all the above: the path of an environment packed on the driver
#'   (`venv-pack` / `conda-pack` style, `bin/python` at its top), shipped with Spark's archives.
#' @return A `tfbarrier.PythonEnv` (a Python object).
#' @export
tf_env <- function(requirements = character(), workon_home = NULL, find_links = character(), index_url = NULL,
                   no_index = FALSE, system_site_packages = FALSE, archive = NULL) {
  if (!is.null(archive)) {
    archive <- as_path(archive)
    return(tf_call(core$PythonEnv$from_archive(archive)))
  }
  tf_call(core$PythonEnv(
    requirements = as.list(requirements), workon_home = workon_home, find_links = as.list(find_links),
    index_url = index_url, no_index = no_index, system_site_packages = system_site_packages
  ))
}
