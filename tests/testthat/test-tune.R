test_that("spark_tf_tune runs a 2-point grid of an R build_model and returns its trials", {
  skip_if_no_tfbarrier()
  data <- digits_split()
  built <- list()
  search <- spark_tf_tune(data$train, function(p) {
    built[[length(built) + 1]] <<- p
    tf_keras_cnn_example(c(8, 8, 1), learning_rate = p$learning_rate)
  }, params = data.frame(learning_rate = c(0.01, 0.0001)), features = "pixels", label = "digit", epochs = 2,
  batch_size = 64, validation_split = 0.2, metric = "val_accuracy", verbose = 0, spark = test_spark())
  expect_s3_class(search, "tfbarrier_tune")
  trials <- as.data.frame(search)
  expect_equal(nrow(trials), 2)
  expect_equal(trials$learning_rate, c(0.01, 0.0001))
  expect_equal(trials$status, c("ok", "ok"))
  expect_true(all(is.na(trials$error)))
  expect_s3_class(trials$started_at, "POSIXct")
  expect_s3_class(trials$training_started_at, "POSIXct")
  expect_equal(search$best_params$learning_rate, trials$learning_rate[which.max(trials$val_accuracy)])
  expect_equal(length(built), 2)  # build_model ran here, in R, once per trial
  expect_s3_class(search$best, "tfbarrier_fit")
  expect_output(print(search), "<tfbarrier tune: 2 of 2 trials ok; best val_accuracy")
  png_file <- tempfile(fileext = ".png")
  grDevices::png(png_file)
  values <- plot(search)
  grDevices::dev.off()
  expect_equal(unname(values), trials$val_accuracy)
})
