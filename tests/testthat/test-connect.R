test_that("spark_tf_fit trains through a reticulate Spark Connect session", {
  skip_if_no_tfbarrier()
  skip_if_not(reticulate::py_module_available("grpc_status"), "pyspark[connect] extras are not installed")
  # Its own R process: a Connect session cannot start next to the classic session of the other tests.
  script <- tempfile(fileext = ".R")
  writeLines(c(
    "library(tfbarrier)",
    "spark <- tf_spark_connect(remote = 'local[2]')",
    "sdf <- tf_spark_dataframe(spark, digits[1:600, ])",
    "fit <- spark_tf_fit(sdf, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = 'pixels',",
    "                    label = 'digit', epochs = 2, batch_size = 64, num_workers = 2, verbose = 0)",
    "cat('RESULT', class(spark)[1], nrow(fit$history), length(unique(fit$workers$checksum)), sum(fit$workers$rows), '\\n')",
    "spark$stop()"
  ), script)
  # Bounded: a Connect server that never answers fails this test (status 124) instead of hanging CI.
  out <- suppressWarnings(system2(file.path(R.home("bin"), "Rscript"), script, stdout = TRUE, stderr = TRUE,
                                  env = paste0("R_LIBS=", paste(.libPaths(), collapse = ":")), timeout = 600))
  line <- regmatches(out, regexpr("RESULT .*", out))  # Spark's console progress may share the line
  if (length(line) != 1) {
    status <- attr(out, "status")
    fail(paste0("no RESULT line (exit status ", if (is.null(status)) 0 else status, "); the output ends:\n",
                paste(utils::tail(out, 30), collapse = "\n")))
    return()
  }
  fields <- strsplit(trimws(line), " ")[[1]]
  expect_match(fields[2], "pyspark.sql.connect")
  expect_equal(fields[3:5], c("2", "1", "600"))
})
