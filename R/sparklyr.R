# sparklyr connections: tfbarrier's Python attaches to the driver JVM of a classic sparklyr connection
# (Spark's own Py4JServer, started there through sparklyr's invoke()), so that a tbl_spark trains and
# is scored in that connection's own Spark application, crossing over as temporary views.

#' The pyspark session of a sparklyr connection
#'
#' Attaches tfbarrier's Python to the driver JVM of the sparklyr connection `sc` and returns a `pyspark`
#' `SparkSession` of `sc`'s own Spark application: its jobs run on `sc`'s executors, and `sc`'s
#' temporary views (a `tbl_spark` registered with `sparklyr::sdf_register()`) are its tables. This is
#' what [spark_tf_fit()], [spark_tf_predict()], [spark_tf_tune()] and [spark_tf_apply()] do with a
#' `tbl_spark`; call it yourself to use `sc` with the `pyspark` API. No second Spark application is
#' started, and tfbarrier never stops `sc`'s SparkContext: `spark_disconnect(sc)` does. After a new
#' `spark_connect()`, the next call attaches to the new connection.
#'
#' Attaching needs R on the driver's machine (sparklyr's `"shell"` connections: `local`, standalone,
#' YARN client mode, Kubernetes client mode) and a `pyspark` of the same Spark release as `sc` (e.g.
#' `install_tfbarrier(spark_version = "3.5")`): a mismatch is refused naming both versions. On a
#' cluster, `sc` must say which Python its executors run: connect with `config = tf_spark_config()`.
#' Where attaching cannot work (a Livy connection), a `tbl_spark` crosses through Parquet files in
#' `getOption("tfbarrier.exchange_dir")` instead (see [tf_spark_dataframe()]).
#'
#' @param sc A sparklyr connection (`sparklyr::spark_connect()`).
#' @return A `pyspark.sql.SparkSession` (a Python object) bound to `sc`.
#' @examples
#' \dontrun{
#' sc <- sparklyr::spark_connect(master = "local[2]", config = tf_spark_config())
#' spark <- tf_spark_session(sc)
#' spark$sparkContext$applicationId == sparklyr::invoke(sparklyr::spark_context(sc), "applicationId")
#' }
#' @export
tf_spark_session <- function(sc) {
  check_given("sc")
  if (!requireNamespace("sparklyr", quietly = TRUE)) {
    tf_abort("a sparklyr connection needs the sparklyr package", "InvalidArgumentError")
  }
  why_not <- unattachable(sc)
  if (!is.null(why_not)) tf_abort(why_not, "ClusterError")
  app <- sparklyr_application(sc)
  session <- attached_session(app)
  if (!is.null(session)) return(session)
  attach_driver(sparklyr_py4j_server(sc), app)
}

# The few lines that need sparklyr itself (ARCHITECTURE.md lists them): the application's id, Spark's
# Py4JServer started in the connection's driver JVM, a tbl_spark registered as a view and a view read
# back as a tbl_spark. Everything else here runs in CI against a driver JVM that a test starts itself.
sparklyr_application <- function(sc) sparklyr::invoke(sparklyr::spark_context(sc), "applicationId")

sparklyr_py4j_server <- function(sc) {
  server <- sparklyr::invoke_new(sc, "org.apache.spark.api.python.Py4JServer",
                                 sparklyr::invoke(sparklyr::spark_context(sc), "getConf"))
  sparklyr::invoke(server, "start")
  kind <- sparklyr::invoke(sparklyr::invoke(sparklyr::invoke(server, "server"), "getClass"), "getName")
  py4j_server(sparklyr::invoke(server, "getListeningPort"), sparklyr::invoke(server, "secret"), kind,
              shutdown = function() sparklyr::invoke(server, "shutdown"))
}

# A Py4JServer running in a driver JVM: its port and secret, whether it pins threads (a ClientServer,
# Spark's default), and how to shut it down.
py4j_server <- function(port, secret, kind, shutdown) {
  list(port = as.integer(port), secret = secret, pin_thread = grepl("ClientServer", kind, fixed = TRUE),
       shutdown = shutdown)
}

# The session tfbarrier's Python is attached with to application `app`, or NULL (attached elsewhere, to
# a JVM that is gone, or not at all).
attached_session <- function(app) {
  session <- tf_call(core$attached_session())
  if (!is.null(session) && identical(attached$app, app)) session
}

# Attach tfbarrier's Python to the driver JVM of application `app` through its Py4JServer `server`
# (py4j_server()): a pyspark session of that application. An attachment to another one is dropped
# first; on failure the server is shut down.
attach_driver <- function(server, app) {
  session <- tryCatch(
    tf_call(core$attach(server$port, server$secret, pin_thread = server$pin_thread, embedded = TRUE)),
    error = function(e) {
      server$shutdown()
      stop(e)
    })
  attached$app <- app
  session
}

attached <- new.env(parent = emptyenv())  # the application tfbarrier's Python is attached to

# Why tfbarrier's Python cannot attach to `sc`'s driver JVM (NULL when it can): it must be a JVM on this
# machine, reached through sparklyr's own backend.
unattachable <- function(sc) {
  if (inherits(sc, "livy_connection")) {
    return(paste("a Livy connection's Spark driver runs on the Livy server's cluster, not on this machine,",
                 "so tfbarrier's Python cannot attach to it: a tbl_spark crosses through Parquet files in",
                 "options(tfbarrier.exchange_dir = <a path both sides reach>) instead"))
  }
  if (!inherits(sc, "spark_shell_connection")) {
    return(paste0("tfbarrier attaches to sparklyr's classic connections (spark_connect(method = \"shell\")), ",
                  "not to a ", class(sc)[1]))
  }
  NULL
}

#' Spark settings a sparklyr connection needs for tfbarrier
#'
#' Adds to a sparklyr `spark_config()` what a connection needs for tfbarrier's barrier tasks: the
#' Python the executors run (`spark.pyspark.python`, which must have tfbarrier, pyspark of the
#' cluster's Spark release, TensorFlow and tf_keras on every executor host: [install_tfbarrier()]
#' there, or a shared path), the same Python on the driver (`spark.pyspark.driver.python`), and on YARN
#' `spark.yarn.isPython` (YARN ships pyspark's own files to the executors). A connection without
#' them is refused naming the setting before any Spark job. The training processes' own environment
#' can still be built per executor by `env = tf_env(...)` in each call.
#'
#' @param config A `sparklyr::spark_config()` (or a named list) to add to.
#' @param python The interpreter Spark's executors run, by its path on the executor hosts. Default:
#'   tfbarrier's own ([tfbarrier_python()]), right for local mode and for clusters whose hosts have it
#'   at the same path.
#' @return `config` with the settings added (those already set are kept).
#' @examples
#' \dontrun{
#' sc <- sparklyr::spark_connect(master = "yarn", config = tf_spark_config(python = "/opt/tfbarrier/bin/python"))
#' }
#' @export
tf_spark_config <- function(config = list(), python = tfbarrier_python()) {
  if (!is.character(python) || length(python) != 1 || !nzchar(python)) {
    tf_abort("python must be the path of the executors' Python interpreter (see install_tfbarrier())",
             "InvalidArgumentError")
  }
  wanted <- list("spark.pyspark.python" = python, "spark.pyspark.driver.python" = python,
                 "spark.yarn.isPython" = "true")
  for (key in names(wanted)) if (is.null(config[[key]])) config[[key]] <- wanted[[key]]
  config
}

# A tbl_spark as a pyspark DataFrame: a temporary view in its own connection, read by tfbarrier's
# Python attached to it (no files). Only when `spark` is another application's session, or attaching
# cannot work and `spark` says where to go instead, through Parquet in the exchange directory, its
# vector columns as arrays (Spark 4.3 fails an Arrow UDF over a vector column that its vectorized
# Parquet reader read: UNSUPPORTED_DATATYPE UDT).
tbl_spark_dataframe <- function(spark, tbl) {
  if (!requireNamespace("sparklyr", quietly = TRUE)) {
    tf_abort("a tbl_spark needs the sparklyr package", "InvalidArgumentError")
  }
  sc <- sparklyr::spark_connection(tbl)
  if (is.null(spark)) {
    why_not <- unattachable(sc)
    if (!is.null(why_not)) {
      tf_abort(paste0(why_not, ", and pass spark = tf_spark_connect(master = ...) to say where to train"),
               "ClusterError")
    }
    spark <- tf_spark_session(sc)
  }
  if (in_application(spark, sc)) {
    name <- basename(tempfile("tfbarrier_in_"))
    sparklyr::sdf_register(tbl, name)
    return(view_frame(spark, name))
  }
  path <- file.path(exchange_dir(), basename(tempfile("tbl-")))
  sparklyr::spark_write_parquet(tbl, path, mode = "overwrite")
  tf_call(core$frames$vectors_as_arrays(spark$read$parquet(path)))
}

# Whether the pyspark `spark` is a session of sparklyr connection `sc`'s own application.
in_application <- function(spark, sc) {
  is.null(unattachable(sc)) && identical(spark$sparkContext$applicationId, sparklyr_application(sc))
}

# A temporary view of the attached application as a pyspark DataFrame, and a pyspark DataFrame as a new
# temporary view there (its name): how tables cross between sparklyr and tfbarrier in one application.
view_frame <- function(spark, name) tf_call(spark$table(name))

frame_view <- function(sdf) {
  name <- basename(tempfile("tfbarrier_out_"))
  tf_call(sdf$createOrReplaceTempView(name))
  name
}

# The way back: a pyspark DataFrame into the sparklyr connection of `tbl`. A Python-backed connection
# (pysparklyr) or an attached one shares the session, through a temporary view; any other reads it from
# Parquet in the exchange directory, its vector columns as arrays (as on the way in).
back_to_sparklyr <- function(sdf, tbl) {
  sc <- sparklyr::spark_connection(tbl)
  if (inherits(tbl, "tbl_pyspark") || in_application(sdf$sparkSession, sc)) {
    return(dplyr::tbl(sc, frame_view(sdf)))
  }
  name <- basename(tempfile("tfbarrier_out_"))
  path <- file.path(exchange_dir(), name)
  tf_call(core$frames$vectors_as_arrays(sdf)$write$mode("overwrite")$parquet(path))
  sparklyr::spark_read_parquet(sc, name = name, path = path, memory = FALSE)
}

exchange_dir <- function() getOption("tfbarrier.exchange_dir", tempfile("tfbarrier-exchange-"))
