test_that("spark_tf_fit trains on an R data.frame to 90% held-out accuracy; plot and predict work", {
  skip_if_no_tfbarrier()
  data <- digits_split()
  fit <- spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01),
                      features = "pixels", label = "digit", epochs = 4, batch_size = 64, num_workers = 2,
                      seed = 1, spark = test_spark())
  expect_s3_class(fit, "tfbarrier_fit")
  expect_equal(nrow(fit$history), 4)
  expect_equal(fit$workers$index, c(0, 1))
  expect_equal(sum(fit$workers$rows), nrow(data$train))
  expect_length(unique(fit$workers$checksum), 1)

  predicted <- predict(fit, data$held_out)
  expect_type(predicted, "integer")
  expect_length(predicted, nrow(data$held_out))
  expect_gte(mean(predicted == data$held_out$digit), 0.90)
  probabilities <- predict(fit, data$held_out$pixels[1:5, ], type = "probabilities")
  expect_equal(dim(probabilities), c(5, 10))
  expect_equal(rowSums(probabilities), rep(1, 5), tolerance = 1e-5)

  png_file <- tempfile(fileext = ".png")
  grDevices::png(png_file)
  plot(fit)
  grDevices::dev.off()
  expect_gt(file.size(png_file), 1000)
  expect_output(print(fit), "<tfbarrier fit: 2 workers, 4 epochs>")
  expect_output(print(fit), "worker 1 on .*: \\d+ rows")

  scored <- spark_tf_predict(data$held_out[1:20, ], fit, spark = test_spark())
  expect_true("prediction" %in% unlist(scored$columns))
  on_executors <- scored$select("prediction")$toPandas()$prediction  # runs the scoring UDF, in row order
  expect_equal(as.integer(on_executors), predict(fit, data$held_out[1:20, ]))
})
