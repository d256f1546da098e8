# What R/sparklyr.R does once it has a sparklyr connection's driver JVM, run against a driver JVM that R
# starts itself (jvm-owner.R: Spark's shell, standing in for sparklyr's, which this project cannot
# install): attaching by port and secret, a view in, predictions out as a view, the refusal of a cluster that
# does not say which Python its executors run, and attaching to a new JVM once the first is gone (and training
# there), as after sparklyr's spark_disconnect() and spark_connect().
# In an R process of its own: this one has a Spark session of its own for the other tests.

test_that("the core's calls stay calls once its modules are imported (attach after attached_session)", {
  skip_if_no_tfbarrier()
  expect_null(tfbarrier:::core$attached_session())  # imports the module that attach() comes from
  expect_true(inherits(tfbarrier:::core$attach, "python.builtin.function"))
})

test_that("tf_spark_config adds the executors' Python and YARN's flag, keeping what the config sets", {
  config <- tf_spark_config(list("spark.pyspark.python" = "/opt/mine/python", "spark.executor.cores" = "2"),
                            python = "/opt/tfbarrier/bin/python")
  expect_equal(config[["spark.pyspark.python"]], "/opt/mine/python")
  expect_equal(config[["spark.pyspark.driver.python"]], "/opt/tfbarrier/bin/python")
  expect_equal(config[["spark.yarn.isPython"]], "true")
  expect_equal(config[["spark.executor.cores"]], "2")
  expect_equal(tf_spark_config()[["spark.pyspark.python"]], tfbarrier_python())
  expect_error(tf_spark_config(python = ""), class = "InvalidArgumentError")
  expect_error(tf_spark_config(python = c("a", "b")), "path of the executors' Python")
})

test_that("an attached R session trains on a view of the JVM's application and scores into a view it reads", {
  skip_if_no_tfbarrier()
  script <- tempfile(fileext = ".R")
  writeLines(c(
    "library(tfbarrier)",
    sprintf("source('%s')", normalizePath(test_path("jvm-owner.R"))),
    "result <- function(...) cat('RESULT', paste0(names(list(...)), '=', vapply(list(...), as.character, '')), '\\n')",
    "jobs <- 'sc.statusTracker.getJobIdsForGroup(null).length'",
    "owner <- jvm_owner('local[2]', conf = tf_spark_config(), digits = digits)",
    "spark <- tfbarrier:::attach_driver(owner$server, owner$app)",
    "same_app <- spark$sparkContext$applicationId == owner$app",
    "assembled <- tfbarrier:::view_frame(spark, 'digits')",
    "fit <- spark_tf_fit(assembled, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = 'features',",
    "                    label = 'digit', epochs = 3, batch_size = 64, num_workers = 2, verbose = 0)",
    "view <- tfbarrier:::frame_view(spark_tf_predict(assembled, fit))",
    "scored <- strsplit(owner$ask(sprintf(",
    "  '{val t = spark.table(\"%s\"); t.count() + \" \" + t.filter(\"digit = prediction\").count()}', view)), ' ')[[1]]",
    "again <- tfbarrier:::attached_session(owner$app)",
    "owner$quit()  # as spark_disconnect(sc) would",
    "cluster <- jvm_owner('local-cluster[1,1,1024]')",
    "refused <- tryCatch(tfbarrier:::attach_driver(cluster$server, cluster$app), error = identity)",
    "new_app_unattached <- is.null(tfbarrier:::attached_session(cluster$app))",
    "detached <- is.null(tfbarrier:::core$attached_session())",
    "cluster_jobs <- cluster$ask(jobs)",
    "cluster$quit()",
    "# a new JVM (sparklyr's after spark_disconnect() and spark_connect()): attached, and it trains there",
    "renewed <- jvm_owner('local[2]', conf = tf_spark_config(), digits = digits)",
    "spark2 <- tfbarrier:::attach_driver(renewed$server, renewed$app)",
    "refit <- spark_tf_fit(tfbarrier:::view_frame(spark2, 'digits'), tf_keras_cnn_example(c(8, 8, 1)),",
    "                      features = 'features', label = 'digit', epochs = 1, batch_size = 64, num_workers = 2,",
    "                      verbose = 0)",
    "reattached <- spark2$sparkContext$applicationId == renewed$app &&",
    "  identical(tfbarrier:::attached_session(renewed$app)$sparkContext$applicationId, renewed$app)",
    "renewed$quit()",
    "result(same_app = same_app, rows = sum(fit$workers$rows),",
    "       scored = scored[1], accuracy = round(as.numeric(scored[2]) / as.numeric(scored[1]), 3),",
    "       again = !is.null(again), new_app_unattached = new_app_unattached,",
    "       refused = inherits(refused, 'ClusterError') && inherits(refused, 'TfBarrierError'),",
    "       names_setting = grepl('spark.pyspark.python', conditionMessage(refused), fixed = TRUE),",
    "       names_helper = grepl('tf_spark_config', conditionMessage(refused), fixed = TRUE),",
    "       detached = detached, cluster_jobs = cluster_jobs,",
    "       reattached = reattached, refit_rows = sum(refit$workers$rows))"
  ), script)
  # PYSPARK_PYTHON empty: this session's (tf_spark_connect() sets it) would name the executors' Python for
  # the cluster that must be refused for not saying it
  out <- suppressWarnings(system2(file.path(R.home("bin"), "Rscript"), script, stdout = TRUE, stderr = TRUE,
                                  env = c(paste0("R_LIBS=", paste(.libPaths(), collapse = ":")), "PYSPARK_PYTHON="),
                                  timeout = 900))
  line <- regmatches(out, regexpr("RESULT .*", out))
  if (length(line) != 1) {
    fail(paste0("no RESULT line; the output ends:\n", paste(utils::tail(out, 40), collapse = "\n")))
    return()
  }
  fields <- strsplit(strsplit(trimws(sub("^RESULT ", "", line)), " ")[[1]], "=")
  seen <- stats::setNames(lapply(fields, `[`, 2), vapply(fields, `[`, "", 1))
  expect_equal(seen$same_app, "TRUE")
  expect_equal(seen$rows, as.character(nrow(digits$pixels)))
  expect_equal(seen$scored, as.character(nrow(digits$pixels)))  # the owner reads every prediction
  expect_gt(as.numeric(seen$accuracy), 0.9)
  expect_equal(seen$again, "TRUE")
  expect_equal(seen$new_app_unattached, "TRUE")
  expect_equal(unlist(seen[c("refused", "names_setting", "names_helper", "detached")]),
               c(refused = "TRUE", names_setting = "TRUE", names_helper = "TRUE", detached = "TRUE"))
  expect_equal(seen$cluster_jobs, "0")  # refused before any Spark job
  expect_equal(seen$reattached, "TRUE")  # the first JVM gone, a new one is attached, and trained on
  expect_equal(seen$refit_rows, as.character(nrow(digits$pixels)))
})
