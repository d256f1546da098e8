test_that("a missing column is an R error of the tfbarrier class, raised before any Spark job", {
  skip_if_no_tfbarrier()
  spark <- test_spark()
  sdf <- tf_spark_dataframe(spark, digits[1:20, ])
  jobs <- spark_job_count(spark)
  err <- expect_error(
    spark_tf_fit(sdf, tf_keras_cnn_example(c(8, 8, 1)), features = "image", label = "digit"),
    class = "ColumnError"
  )
  expect_s3_class(err, "TfBarrierError")
  expect_s3_class(err, "tfbarrier_error")
  expect_match(conditionMessage(err), "column 'image' is not in the DataFrame")
  expect_equal(spark_job_count(spark), jobs)
})

test_that("num_workers = 0 is refused before any Spark job", {
  skip_if_no_tfbarrier()
  spark <- test_spark()
  sdf <- tf_spark_dataframe(spark, digits[1:20, ])
  jobs <- spark_job_count(spark)
  expect_error(
    spark_tf_fit(sdf, tf_keras_cnn_example(c(8, 8, 1)), features = "pixels", label = "digit", num_workers = 0),
    "num_workers must be a positive integer, got 0",
    class = "InvalidArgumentError"
  )
  expect_equal(spark_job_count(spark), jobs)
})

test_that("a ModelError raised in a training process arrives in R with its class and the worker's log", {
  skip_if_no_tfbarrier()
  sdf <- tf_spark_dataframe(test_spark(), digits[1:200, ])
  main <- reticulate::py_run_string(paste(
    "def refusing_model():",
    "    from tfbarrier.errors import ModelError",
    "    raise ModelError('this model function wants 3 channels')",
    sep = "\n"
  ), convert = FALSE)
  err <- expect_error(
    spark_tf_fit(sdf, main$refusing_model, features = "pixels", label = "digit", verbose = 0L),
    class = "ModelError"
  )
  expect_s3_class(err, "TfBarrierError")
  expect_false(inherits(err, "WorkerError"))
  expect_match(conditionMessage(err), "worker [01] on .*wants 3 channels")
  expect_match(conditionMessage(err), "last lines of worker [01]'s output")
})

test_that("missing values in R data are refused before reaching Python", {
  skip_if_no_tfbarrier()
  bad <- data.frame(x = c(1, NA, 3), y = 1:3)
  expect_error(tf_spark_dataframe(test_spark(), bad), "column 'x' has 1 missing value", class = "ColumnError")
})

test_that("a sparklyr tbl_spark crosses over through Parquet", {
  skip_if_no_tfbarrier()
  skip_if_not_installed("sparklyr")
  sc <- sparklyr::spark_connect(master = "local[1]")
  on.exit(sparklyr::spark_disconnect(sc))
  tbl <- sparklyr::copy_to(sc, data.frame(x = as.numeric(1:5), y = 5:1), "tfbarrier_tbl", overwrite = TRUE)
  sdf <- tf_spark_dataframe(test_spark(), tbl)
  expect_equal(sdf$count(), 5)
  expect_setequal(unlist(sdf$columns), c("x", "y"))
})

test_that("whole R numbers reach Python as integers", {
  expect_identical(tfbarrier:::as_int(3), 3L)
  expect_identical(tfbarrier:::as_int(2.5), 2.5)
  expect_identical(tfbarrier:::as_int("3"), "3")
})

test_that("install_tfbarrier's spark_version picks that release's pyspark and refuses what is unsupported", {
  expect_identical(tfbarrier:::pyspark_requirement("3.5"), "pyspark==3.5.*")
  expect_identical(tfbarrier:::pyspark_requirement("4.0.1"), "pyspark==4.0.*")
  expect_null(tfbarrier:::pyspark_requirement(NULL))
  expect_error(tfbarrier:::pyspark_requirement("3.4"), "3.5 to 4.x", class = "InvalidArgumentError")
  expect_error(tfbarrier:::pyspark_requirement("latest"), "3.5 to 4.x", class = "InvalidArgumentError")
})

test_that("errors R raises itself carry the documented classes", {
  expect_tf_error <- function(expr, message = NULL, class = "InvalidArgumentError") {
    err <- expect_error(expr, message, class = class)
    expect_s3_class(err, "TfBarrierError")
    expect_s3_class(err, "tfbarrier_error")
  }
  fit <- structure(list(model = NULL, features = "pixels", python = NULL), class = "tfbarrier_fit")
  expect_tf_error(tf_save(list(), "m.keras"), "must be a tfbarrier_fit")
  expect_tf_error(tf_save(fit, 3), "path must be a path")
  expect_tf_error(tf_export(fit), "tf_export\\(\\) needs path")
  expect_tf_error(save_model(list(), "m.keras"), "must be a tfbarrier_fit or a Keras model")
  expect_tf_error(spark_tf_apply(data.frame(x = 1), "not a function"), "f must be a function")
  expect_tf_error(spark_tf_apply(data.frame(x = 1), function(df, barrier) df, columns = "integer"),
                  "named character vector")
  expect_tf_error(spark_tf_apply(data.frame(x = 1), function(df, barrier) df, columns = c(x = "complex")),
                  "unknown column type")
  expect_tf_error(spark_tf_fit(data.frame(x = 1), NULL), "spark_tf_fit\\(\\) needs features")
  expect_tf_error(spark_tf_predict(data.frame(x = 1), list()), "features must name the feature column")
  expect_tf_error(spark_tf_predict(data.frame(x = 1), fit, layer = NA_real_), "1-based position")
  expect_tf_error(spark_tf_tune(data.frame(x = 1), function(p) NULL, "lr", features = "x", label = "y"),
                  "params must be a data.frame")
  expect_tf_error(predict(fit), "needs newdata")
  expect_tf_error(predict(fit, matrix(1), type = "classes"),
                  "type must be one of \"class\", \"probabilities\", \"raw\"")
  expect_tf_error(predict(fit, list(pixels = 1)), "newdata must be a matrix or a data.frame")
  expect_tf_error(predict(fit, matrix("a")), "must hold numbers")
  expect_tf_error(predict(fit, data.frame(image = 1)), "newdata has no column\\(s\\) pixels", class = "ColumnError")
  expect_tf_error(tf_collect(data.frame(x = 1), arrays = "vector"), "arrays must be one of")
  expect_tf_error(tf_collect(), "tf_collect\\(\\) needs sdf")
  expect_tf_error(tf_spark_connect(master = 2), "master must be a Spark master URL")
  expect_tf_error(tf_spark_connect(config = list("a")), "config must be a named list")
  expect_tf_error(tf_spark_dataframe(NULL, data.frame(x = 1)), "spark must be a SparkSession")
  expect_tf_error(tf_spark_session(), "tf_spark_session\\(\\) needs sc")
  expect_tf_error(tf_env(archive = c("a", "b")), "archive must be a path")
  expect_tf_error(install_tfbarrier(python = ""), class = "InstallError")
})
