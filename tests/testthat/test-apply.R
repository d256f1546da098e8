test_that("spark_tf_apply runs an R closure in both barrier tasks with TF_CONFIG set", {
  skip_if_no_tfbarrier()
  skip_if_not(reticulate::py_module_available("rpy2"), "rpy2 is not installed in tfbarrier's Python")
  df <- data.frame(x = as.numeric(1:10))
  out <- spark_tf_apply(df, function(df, barrier) {
    config <- jsonlite::fromJSON(Sys.getenv("TF_CONFIG"))
    data.frame(
      address = barrier$address,
      partition = barrier$partition,
      rows = nrow(df),
      index = config$task$index,
      workers = paste(config$cluster$worker, collapse = ","),
      same_config = identical(barrier$tf_config, Sys.getenv("TF_CONFIG"))
    )
  }, num_workers = 2, columns = c(address = "character", partition = "integer", rows = "integer",
                                  index = "integer", workers = "character", same_config = "logical"),
  spark = test_spark())
  expect_equal(out$partition, c(0L, 1L))
  expect_equal(out$index, c(0L, 1L))
  expect_equal(sum(out$rows), 10L)
  expect_length(unique(out$address), 2)
  expect_true(all(out$same_config))
  for (workers in out$workers) expect_setequal(strsplit(workers, ",")[[1]], out$address)
})
