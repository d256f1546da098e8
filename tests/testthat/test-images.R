# Encoded images from R: a directory of PNG files read with format = "binaryFile", the label from the
# path, decoded in the training processes (fit) and on the executors (predict).

write_digit_pngs <- function(dir, data) {
  for (i in seq_len(nrow(data))) {
    class_dir <- file.path(dir, data$digit[i])
    dir.create(class_dir, showWarnings = FALSE, recursive = TRUE)
    grDevices::png(file.path(class_dir, sprintf("img_%d.png", i)), width = 8, height = 8)
    graphics::par(mar = c(0, 0, 0, 0))
    graphics::plot.new()
    pixels <- matrix(data$pixels[i, ], 8, 8, byrow = TRUE)
    graphics::rasterImage(grDevices::as.raster(pixels), 0, 0, 1, 1, interpolate = FALSE)
    grDevices::dev.off()
  }
}

test_that("spark_tf_fit and spark_tf_predict take a binaryFile directory of PNG files", {
  skip_if_no_tfbarrier()
  data <- digits_split()$train[1:200, ]
  dir <- tempfile("digits-png-")
  write_digit_pngs(dir, data)
  spark <- test_spark()
  F <- reticulate::import("pyspark.sql.functions")
  sdf <- tf_spark_dataframe(spark, dir, format = "binaryFile")
  expect_equal(reticulate::py_to_r(sdf$count()), 200)
  sdf <- sdf$withColumn("digit", F$regexp_extract("path", "/(\\d+)/[^/]+$", 1L)$cast("int"))

  keras <- reticulate::import("keras")
  model <- keras$Sequential(list(keras$Input(shape = c(8L, 8L, 1L)), keras$layers$Rescaling(1 / 255),
                                 keras$layers$Flatten(), keras$layers$Dense(10L)))
  model$compile(optimizer = "adam", loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  fit <- spark_tf_fit(sdf, model, features = "content", label = "digit", epochs = 1, batch_size = 32,
                      num_workers = 2, verbose = 0, steps_per_execution = 2,
                      communication = list(compression = "fp16", shard = "optimizer"), spark = spark)
  expect_equal(sum(fit$workers$rows), 200)
  expect_equal(fit$workers$steps_per_execution, c(2, 2))
  expect_equal(fit$workers$compression, c("fp16", "fp16"))
  # each worker held Adam's state of its share of the weights: together, every weight once
  expect_equal(sum(fit$workers$state_of_weights), model$count_params())
  expect_true(all(fit$workers$state_of_weights > 0))

  scored <- spark_tf_predict(sdf, fit, spark = spark)$select("prediction")$toPandas()
  expect_equal(nrow(scored), 200)
  expect_true(all(scored$prediction %in% 0:9))

  # on the driver: the collected content (raw vectors), or the files read into R, decoded by the core
  collected <- tf_collect(spark_tf_predict(sdf$select("path", "content")$limit(20L), fit, spark = spark))
  files <- sub("^file:", "", collected$path)
  expect_equal(collected$content, lapply(files, function(f) readBin(f, "raw", file.size(f))))
  expect_equal(predict(fit, collected), collected$prediction)
  read <- data.frame(file = files)
  read$content <- lapply(files, function(f) readBin(f, "raw", file.size(f)))
  expect_equal(predict(fit, read, type = "raw"), predict(fit, collected, type = "raw"))
})

test_that("an image that does not decode is a ColumnError in R, raised in a training process", {
  skip_if_no_tfbarrier()
  dir <- tempfile("digits-broken-")
  write_digit_pngs(dir, digits_split()$train[1:40, ])
  writeBin(as.raw(1:30), file.path(dir, "3", "img_broken.png"))
  F <- reticulate::import("pyspark.sql.functions")
  sdf <- tf_spark_dataframe(test_spark(), dir, format = "binaryFile")$
    withColumn("digit", F$regexp_extract("path", "/(\\d+)/[^/]+$", 1L)$cast("int"))
  keras <- reticulate::import("keras")
  model <- keras$Sequential(list(keras$Input(shape = c(8L, 8L, 1L)), keras$layers$Flatten(), keras$layers$Dense(10L)))
  model$compile(optimizer = "adam", loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  err <- expect_error(
    spark_tf_fit(sdf, model, features = "content", label = "digit", batch_size = 8, num_workers = 2, verbose = 0,
                 spark = test_spark()),
    "does not decode as an image", class = "ColumnError"
  )
  expect_s3_class(err, "TfBarrierError")
})
