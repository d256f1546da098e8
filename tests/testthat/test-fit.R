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
  # a list column of vectors and an array of images: the core's own layouts, as on the executors
  listed <- data$held_out[1:20, "digit", drop = FALSE]
  listed$pixels <- lapply(1:20, function(i) data$held_out$pixels[i, ])
  raw <- predict(fit, data$held_out$pixels[1:20, ], type = "raw")
  expect_equal(predict(fit, listed, type = "raw"), raw)
  images <- aperm(array(data$held_out$pixels[1:20, ], c(20, 8, 8, 1)), c(1, 3, 2, 4))  # rows of 8 pixels
  expect_equal(predict(fit, images, type = "raw"), raw)
  expect_equal(predict(fit, listed, type = "prob"), predict(fit, listed, type = "probabilities"))

  archive <- save_model(fit, tempfile(fileext = ".keras"))
  reloaded <- tfbarrier:::import_after_tfbarrier("keras")$saving$load_model(archive)
  pixels <- reticulate::np_array(data$held_out$pixels[1:5, ], dtype = "float32")$reshape(c(5L, 8L, 8L, 1L))
  expect_equal(reloaded$predict(pixels, verbose = 0L), predict(fit, data$held_out[1:5, ], type = "raw"),
               tolerance = 1e-5)
  expect_error(tf_save(fit, tempfile(fileext = ".h5")), "must end in .keras", class = "InvalidArgumentError")
  served <- reticulate::import("tensorflow")$saved_model$load(tf_export(fit, tempfile("savedmodel-")))
  expect_equal(served$serve(pixels)$numpy(), predict(fit, data$held_out[1:5, ], type = "raw"), tolerance = 1e-5)

  png_file <- tempfile(fileext = ".png")
  grDevices::png(png_file)
  panels <- plot(fit)
  grDevices::dev.off()
  expect_gt(file.size(png_file), 1000)
  expect_equal(panels, c(loss = NA_character_, accuracy = NA_character_))  # no validation: no twins
  drawn <- drawn_series(plot(fit))  # one series per panel: the metric's value at each epoch
  expect_equal(drawn, list(loss = list(data.frame(x = 1:4, y = fit$history$loss)),
                           accuracy = list(data.frame(x = 1:4, y = fit$history$accuracy))))
  expect_output(print(fit), "<tfbarrier fit: 2 workers, 4 epochs, exchange tfbarrier>")
  expect_equal(fit$workers$exchange, c("tfbarrier", "tfbarrier"))
  expect_output(print(fit), "worker 1 on .*: \\d+ rows")

  scored <- tf_collect(spark_tf_predict(data$held_out[1:20, ], fit, spark = test_spark()))  # runs the UDF
  expect_setequal(names(scored), c("pixels", "digit", "prediction"))
  expect_equal(scored$prediction, predict(fit, data$held_out[1:20, ]))
  expect_equal(scored$pixels, unname(data$held_out$pixels[1:20, ]))  # the array column as a matrix column

  probabilities <- spark_tf_predict(data$held_out[1:5, ], fit, output = "probabilities", spark = test_spark())
  expect_equal(as.data.frame(probabilities)$prediction, predict(fit, data$held_out[1:5, ], type = "probabilities"),
               tolerance = 1e-5)
  expect_equal(tf_collect(probabilities, arrays = "list")$prediction[[2]], predict(fit, data$held_out[1:5, ], type = "probabilities")[2, ],
               tolerance = 1e-5)

  # featurization: the 4th layer (Dense(64)), as a local model truncated there computes it
  features <- tf_collect(spark_tf_predict(data$held_out[1:5, ], fit, output = "features", layer = 4,
                                          spark = test_spark()))$prediction
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  truncated <- keras$Model(fit$model$inputs[[1]], fit$model$layers[[4]]$output)
  expect_equal(dim(features), c(5, 64))
  expect_equal(features, truncated$predict(pixels, verbose = 0L), tolerance = 1e-5)
  expect_error(spark_tf_predict(data$held_out[1:5, ], fit, output = "features", layer = 0, spark = test_spark()),
               "1-based position", class = "InvalidArgumentError")
})

test_that("a sparklyr pipeline goes through spark_tf_fit and spark_tf_predict and stays in sparklyr", {
  skip_if_no_tfbarrier()
  skip_if_not_installed("sparklyr")
  sc <- sparklyr::spark_connect(master = "local[1]")
  on.exit(sparklyr::spark_disconnect(sc))
  data <- digits_split()
  flat <- function(d) data.frame(d$pixels, digit = d$digit)  # sparklyr has no array columns from R
  train <- sparklyr::copy_to(sc, flat(data$train), "tfbarrier_train", overwrite = TRUE)
  held_out <- sparklyr::copy_to(sc, flat(data$held_out[1:20, ]), "tfbarrier_held_out", overwrite = TRUE)
  pixels <- setdiff(colnames(train), "digit")
  fit <- spark_tf_fit(train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = pixels,
                      label = "digit", epochs = 2, batch_size = 64, num_workers = 2, seed = 1, spark = test_spark())
  scored <- spark_tf_predict(held_out, fit, spark = test_spark())
  expect_s3_class(scored, "tbl_spark")
  expect_identical(sparklyr::spark_connection(scored), sc)
  expect_equal(tf_collect(scored)$prediction, predict(fit, data$held_out[1:20, ]))
})

test_that("tf_collect brings strings, logicals, missing values and ragged arrays into R", {
  skip_if_no_tfbarrier()
  spark <- test_spark()
  sdf <- spark$sql(paste(
    "SELECT * FROM VALUES ('a', true, 1, array(1.0D, 2.0D)), (NULL, false, NULL, array(3.0D)),",
    "('c', NULL, 3, NULL) AS t(s, b, i, v)"
  ))
  collected <- tf_collect(sdf)
  expect_equal(collected$s, c("a", NA, "c"))
  expect_equal(collected$b, c(TRUE, FALSE, NA))
  expect_equal(collected$i, c(1L, NA, 3L))
  expect_equal(collected$v, list(c(1, 2), 3, NULL))
  expect_equal(nrow(tf_collect(sdf$limit(0L))), 0)
  expect_error(tf_collect(data.frame(x = 1)), "must be a pyspark DataFrame", class = "InvalidArgumentError")
})

test_that("validation_split, validation_data, class_weight, save_best; val_ columns, summary(), plot panels", {
  skip_if_no_tfbarrier()
  data <- digits_split()
  saved_in <- tempfile("saved-")
  fit <- spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = "pixels",
                      label = "digit", epochs = 2, batch_size = 64, num_workers = 2, seed = 1,
                      validation_split = 0.2, save_to = saved_in, save_best = "val_loss", verbose = 0,
                      spark = test_spark())
  history <- as.data.frame(fit)
  expect_named(history, c("epoch", "loss", "accuracy", "val_loss", "val_accuracy"))
  expect_equal(nrow(history), 2)
  expect_true(all(history$val_accuracy > 0 & history$val_accuracy <= 1))
  expect_null(fit$stopped_epoch)
  expect_output(print(summary(fit)), "best epoch by val_loss: [12]")
  expect_equal(fit$saved$epoch[nrow(fit$saved)], which.min(history$val_loss))
  expect_setequal(list.files(saved_in), c("best.keras", "saved.json"))
  best <- tfbarrier:::import_after_tfbarrier("keras")$saving$load_model(file.path(saved_in, "best.keras"))
  expect_equal(length(best$get_weights()), length(fit$model$get_weights()))

  png_file <- tempfile(fileext = ".png")
  grDevices::png(png_file)
  panels <- plot(fit)
  grDevices::dev.off()
  expect_equal(panels, c(loss = "val_loss", accuracy = "val_accuracy"))  # each with its val_ twin
  drawn <- drawn_series(plot(fit))
  for (metric in c("loss", "accuracy")) {
    expect_equal(drawn[[metric]], list(data.frame(x = 1:2, y = history[[metric]]),
                                       data.frame(x = 1:2, y = history[[paste0("val_", metric)]])))
  }

  held <- spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = "pixels",
                       label = "digit", epochs = 2, batch_size = 64, num_workers = 2, seed = 1, verbose = 0,
                       validation_data = data$held_out, validation_freq = 2, class_weight = list("3" = 0),
                       spark = test_spark())
  expect_equal(is.na(as.data.frame(held)$val_loss), c(TRUE, FALSE))
  probabilities <- predict(held, data$held_out, type = "probabilities")
  threes <- data$held_out$digit == 3
  expect_lt(mean(max.col(probabilities[threes, ]) - 1 == 3), 0.2)  # class_weight 0: the 3s are not learned
  expect_equal(as.data.frame(held)$val_accuracy[2], mean(max.col(probabilities) - 1 == data$held_out$digit),
               tolerance = 1e-6)
})

test_that("spark_tf_fit checkpoints every few steps and reports how the model reached the workers", {
  skip_if_no_tfbarrier()
  data <- digits_split()
  fit <- spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = "pixels",
                      label = "digit", epochs = 1, batch_size = 64, num_workers = 2, seed = 1, verbose = 0,
                      checkpoint_dir = tempfile("state-"), checkpoint_every = 5, spark = test_spark())
  steps <- fit$workers$steps_per_epoch[1]
  expect_equal(fit$workers$files_via, c("driver link", "driver link"))
  expect_true(all(fit$workers$files_mb > 0))
  # every 5 steps within the epoch, and at its end
  expect_equal(fit$python$workers[[1]]$checkpoint_saves, (steps - 1) %/% 5 + 1)
  expect_error(spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1)), features = "pixels", label = "digit",
                            checkpoint_dir = tempfile("state-"), checkpoint_every = "soon", spark = test_spark()),
               "a number of steps or a duration", class = "InvalidArgumentError")
})

test_that("a Spark ML vector column (VectorAssembler's: the JVM type ft_vector_assembler makes) trains and scores", {
  skip_if_no_tfbarrier()
  data <- digits_split()
  flat <- function(d) data.frame(d$pixels, digit = d$digit)  # columns X1 ... X64
  spark <- test_spark()  # Spark ML's Java-backed stages need the SparkContext
  assembler <- reticulate::import("pyspark.ml.feature")$VectorAssembler(inputCols = paste0("X", 1:64),
                                                                         outputCol = "features")
  train <- assembler$transform(tf_spark_dataframe(spark, flat(data$train)))
  held_out <- assembler$transform(tf_spark_dataframe(spark, flat(data$held_out[1:20, ])))
  fit <- spark_tf_fit(train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = "features",
                      label = "digit", epochs = 2, batch_size = 64, num_workers = 2, seed = 1, spark = test_spark())
  expect_equal(nrow(fit$history), 2)
  expect_lt(fit$history$loss[2], fit$history$loss[1])
  scored <- tf_collect(spark_tf_predict(held_out, fit, spark = test_spark())$select("prediction"))
  expect_equal(scored$prediction, predict(fit, data$held_out$pixels[1:20, ]))
  # on the driver, the vectors as sparklyr collects them (a list column), or as 64 numeric columns
  vectors <- data.frame(digit = data$held_out$digit[1:20])
  vectors$features <- lapply(1:20, function(i) data$held_out$pixels[i, ])
  expect_equal(predict(fit, vectors), scored$prediction)
  by_columns <- fit
  by_columns$features <- paste0("X", 1:64)
  expect_equal(predict(by_columns, flat(data$held_out[1:20, ])), scored$prediction)
  expect_error(spark_tf_fit(train, tf_keras_cnn_example(c(10, 10, 1)), features = "features", label = "digit",
                            num_workers = 2, spark = test_spark()),
               "vector column 'features' has vectors of size 64, but the model takes 100", class = "ColumnError")
})

test_that("plot() on a fit draws each metric per epoch, with its val_ twin where it was measured", {
  history <- data.frame(epoch = 1:3, loss = c(2.3, 1.1, 0.7), accuracy = c(0.2, 0.6, 0.8),
                        val_loss = c(NA, 1.3, 0.9), val_accuracy = c(NA, 0.5, 0.7))
  fit <- structure(list(history = history), class = "tfbarrier_fit")
  drawn <- drawn_series(panels <- plot(fit))
  expect_equal(panels, c(loss = "val_loss", accuracy = "val_accuracy"))
  expect_equal(drawn, list(
    loss = list(data.frame(x = 1:3, y = c(2.3, 1.1, 0.7)), data.frame(x = 2:3, y = c(1.3, 0.9))),
    accuracy = list(data.frame(x = 1:3, y = c(0.2, 0.6, 0.8)), data.frame(x = 2:3, y = c(0.5, 0.7)))
  ))
  fit$history <- history[c("epoch", "loss")]
  expect_equal(drawn_series(panels <- plot(fit)), list(loss = list(data.frame(x = 1:3, y = c(2.3, 1.1, 0.7)))))
  expect_equal(panels, c(loss = NA_character_))
})

test_that("spark_tf_fit trains a Keras 3 model with a custom layer from the user's own Python module", {
  skip_if_no_tfbarrier()
  dir <- tempfile("layers-")
  dir.create(dir)
  writeLines(c("import keras",
               "from keras import ops",
               "",
               "class Gate(keras.layers.Layer):",
               "    def build(self, input_shape):",
               "        self.scale = self.add_weight(shape=(input_shape[-1],), initializer='ones')",
               "",
               "    def call(self, x):",
               "        return x * ops.sigmoid(x * self.scale)"), file.path(dir, "my_layers.py"))
  layers <- reticulate::import_from_path("my_layers", dir)  # a module the executors cannot import
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  keras$utils$set_random_seed(1L)
  inputs <- keras$Input(shape = list(64L))
  hidden <- layers$Gate()(keras$layers$Dense(32L)(inputs))
  model <- keras$Model(inputs, keras$layers$Dense(10L)(hidden))
  model$compile(optimizer = keras$optimizers$Adam(0.01), metrics = list("accuracy"),
                loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  data <- digits_split()
  fit <- spark_tf_fit(data$train, model, features = "pixels", label = "digit", epochs = 3, batch_size = 64,
                      num_workers = 2, spark = test_spark())
  expect_equal(nrow(fit$history), 3)
  expect_length(unique(fit$workers$checksum), 1)
  expect_true(inherits(fit$model$layers[[3]], "my_layers.Gate"))  # the user's class, trained natively
  expect_gte(mean(predict(fit, data$held_out) == data$held_out$digit), 0.85)
})

test_that("spark_tf_fit trains a KerasHub text classifier on token ids, and it predicts", {
  skip_if_no_tfbarrier()
  keras_hub <- tfbarrier:::import_after_tfbarrier("keras_hub")  # tfbarrier[kerashub]
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  set.seed(1)
  ids <- matrix(sample.int(39L, 384 * 12, replace = TRUE), nrow = 384)
  data <- data.frame(label = as.integer(apply(ids == 7L, 1, any)))
  data$ids <- ids
  keras$utils$set_random_seed(2L)
  inputs <- keras$Input(shape = list(12L), dtype = "int32")
  embedded <- keras_hub$layers$TokenAndPositionEmbedding(40L, 12L, 16L)(inputs)
  encoded <- keras_hub$layers$TransformerEncoder(intermediate_dim = 32L, num_heads = 2L)(embedded)
  model <- keras$Model(inputs, keras$layers$Dense(2L)(keras$layers$GlobalAveragePooling1D()(encoded)))
  model$compile(optimizer = keras$optimizers$Adam(0.005), metrics = list("accuracy"),
                loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  fit <- spark_tf_fit(data, model, features = "ids", label = "label", epochs = 4, batch_size = 32,
                      num_workers = 2, spark = test_spark())
  expect_equal(nrow(fit$history), 4)
  expect_length(unique(fit$workers$checksum), 1)
  expect_lt(fit$history$loss[4], fit$history$loss[1])
  predicted <- predict(fit, data[1:50, ])
  expect_length(predicted, 50)
  expect_true(all(predicted %in% c(0L, 1L)))
})

test_that("spark_tf_fit trains a KerasHub text classifier from a character column, and it scores text", {
  skip_if_no_tfbarrier()
  keras_hub <- tfbarrier:::import_after_tfbarrier("keras_hub")  # tfbarrier[kerashub]
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  words <- c("good", "great", "fine", "bad", "awful", "poor", "the", "movie")
  set.seed(5)
  text <- vapply(1:64, function(i) paste(sample(words, sample(2:6, 1), replace = TRUE), collapse = " "), "")
  data <- data.frame(text = text, label = as.integer(grepl("good|great|fine", text)))
  keras$utils$set_random_seed(5L)
  tokenizer <- keras_hub$tokenizers$BertTokenizer(vocabulary = c("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", words))
  backbone <- keras_hub$models$BertBackbone(vocabulary_size = 13L, num_layers = 1L, num_heads = 2L, hidden_dim = 8L,
                                            intermediate_dim = 16L, max_sequence_length = 8L)
  model <- keras_hub$models$BertTextClassifier(
    backbone, num_classes = 2L,
    preprocessor = keras_hub$models$BertTextClassifierPreprocessor(tokenizer, sequence_length = 8L))
  model$compile(optimizer = keras$optimizers$Adam(0.01),
                loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  fit <- spark_tf_fit(data, model, features = "text", label = "label", epochs = 3, batch_size = 16,
                      num_workers = 2, spark = test_spark())
  expect_equal(nrow(fit$history), 3)
  expect_length(unique(fit$workers$checksum), 1)
  expect_lt(fit$history$loss[3], fit$history$loss[1])
  scored <- predict(fit, data[1:20, ], type = "raw")
  expect_equal(dim(scored), c(20L, 2L))
  local <- fit$model$predict(reticulate::np_array(data$text[1:20]), verbose = 0L)
  expect_equal(scored, local, tolerance = 1e-5, ignore_attr = TRUE)
})

test_that("a causal LM fits from a character column alone, then generates text on the executors", {
  skip_if_no_tfbarrier()
  keras_hub <- tfbarrier:::import_after_tfbarrier("keras_hub")
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  letters8 <- c("a", "b", "c", "d", "e", "f", "g", "h")
  vocabulary <- as.list(setNames(0:10, c("\u0120", letters8, "ab", "<|endoftext|>")))  # padding 0 is no end token
  keras$utils$set_random_seed(6L)
  tokenizer <- keras_hub$tokenizers$GPT2Tokenizer(vocabulary = reticulate::dict(vocabulary), merges = list("a b"))
  backbone <- keras_hub$models$GPT2Backbone(vocabulary_size = 11L, num_layers = 1L, num_heads = 2L, hidden_dim = 8L,
                                            intermediate_dim = 16L, max_sequence_length = 16L, dropout = 0)
  lm <- keras_hub$models$GPT2CausalLM(
    backbone, preprocessor = keras_hub$models$GPT2CausalLMPreprocessor(tokenizer, sequence_length = 12L))
  lm$compile(optimizer = keras$optimizers$SGD(0.5),
             loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE))
  data <- data.frame(text = rep(c("abcd", "cdef abc", "efgh", "bcd bcd"), 8))
  fit <- spark_tf_fit(data, lm, features = "text", label = NULL, epochs = 1, batch_size = 8, num_workers = 2,
                      spark = test_spark())
  expect_length(unique(fit$workers$checksum), 1)
  prompts <- data.frame(prompt = c("ab", "cd e", "h", "fgh"))
  generated <- tf_collect(spark_tf_predict(prompts, fit, features = "prompt", output = "text",
                                           output_col = "text", max_length = 10, spark = test_spark()))
  expect_type(generated$text, "character")
  fit$model$compile(sampler = "greedy")
  expected <- unlist(fit$model$generate(as.list(generated$prompt), max_length = 10L))
  expect_identical(generated$text, expected)
  expect_true(all(startsWith(generated$text, generated$prompt)))
  expect_true(any(nchar(generated$text) > nchar(generated$prompt)))  # a row may end at once with the end token
})

test_that("spark_tf_fit trains a Keras 3 model of two inputs and two outputs from named columns", {
  skip_if_no_tfbarrier()
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  set.seed(3)
  data <- data.frame(kind = rep(0:1, 32), scale = runif(64))
  data$ids <- matrix(sample.int(20L, 64 * 4, replace = TRUE) - 1L, nrow = 64)
  data$target <- data$scale * 2
  keras$utils$set_random_seed(4L)
  ids <- keras$Input(shape = list(4L), name = "ids", dtype = "int32")
  scale <- keras$Input(shape = list(1L), name = "scale")
  hidden <- keras$layers$Concatenate()(list(keras$layers$Flatten()(keras$layers$Embedding(20L, 3L)(ids)), scale))
  model <- keras$Model(list(ids, scale), list(keras$layers$Dense(2L, activation = "softmax", name = "cls")(hidden),
                                               keras$layers$Dense(1L, name = "reg")(hidden)))
  model$compile(optimizer = "adam", loss = list(cls = "sparse_categorical_crossentropy", reg = "mse"))
  fit <- spark_tf_fit(data, model, features = c(ids = "ids", scale = "scale"),
                      label = c(cls = "kind", reg = "target"), epochs = 2, batch_size = 16, num_workers = 2,
                      spark = test_spark())
  expect_equal(nrow(fit$history), 2)
  expect_true(all(c("cls_loss", "reg_loss") %in% names(fit$history)))
  expect_length(unique(fit$workers$checksum), 1)
  predicted <- predict(fit, data[1:10, ], type = "raw")
  expect_named(predicted, c("cls", "reg"))
  expect_equal(dim(predicted$cls), c(10L, 2L))
  expect_equal(dim(predicted$reg), c(10L, 1L))
})

test_that("spark_tf_fit fine-tunes a KerasHub preset's LoRA adapters, the preset loaded (in int8) by the workers", {
  skip_if_no_tfbarrier()
  keras_hub <- tfbarrier:::import_after_tfbarrier("keras_hub")
  keras <- tfbarrier:::import_after_tfbarrier("keras")
  keras$utils$set_random_seed(3L)
  backbone <- keras_hub$models$LlamaBackbone(vocabulary_size = 32L, num_layers = 1L, num_query_heads = 2L,
                                             num_key_value_heads = 1L, hidden_dim = 16L, intermediate_dim = 32L)
  path <- file.path(tempfile("preset"), "tiny_llama")
  keras_hub$models$LlamaCausalLM(backbone, preprocessor = NULL)$save_to_preset(path)
  set.seed(2)
  tokens <- (outer(sample.int(32L, 48L, replace = TRUE) - 1L, 0:8, `+`)) %% 32L
  data <- data.frame(row = 1:48)
  data$ids <- tokens[, 1:8]
  data$mask <- matrix(1L, nrow = 48, ncol = 8)
  data$labels <- tokens[, 2:9]
  expect_error(tf_preset(path, quantize = "int8"), "give lora_rank", class = "InvalidArgumentError")
  # the backbone held in int8 in each training process, the adapters training over it
  fit <- spark_tf_fit(data, tf_preset(path, lora_rank = 2, quantize = "int8"),
                      features = c(token_ids = "ids", padding_mask = "mask"), label = "labels", epochs = 2,
                      batch_size = 8, num_workers = 2, spark = test_spark())
  expect_equal(nrow(fit$history), 2)
  expect_length(unique(fit$workers$checksum), 1)
  expect_equal(fit$model$rank, 2L)
  expect_equal(fit$model$quantize, "int8")
  trained <- fit$model$load()
  kernels <- Filter(function(w) endsWith(w$path, "query/kernel"), trained$weights)
  expect_equal(vapply(kernels, function(w) w$dtype, ""), "int8")
  adapters <- Filter(function(w) grepl("lora", w$path), trained$weights)
  expect_equal(length(trained$trainable_weights), length(adapters))
  moved <- max(vapply(Filter(function(w) grepl("lora_kernel_b", w$path), adapters),
                      function(w) max(abs(w$numpy())), numeric(1)))
  expect_gt(moved, 0)  # lora_kernel_b starts at zeros
  saved <- fit$model$save(tempfile(fileext = ".lora.h5"))
  expect_lt(file.size(saved), 1e5)  # the adapters alone, not the backbone
  # Scored on the executors (each loads the preset, and the adapters on it) as predict() scores here
  rows <- data[1:4, ]
  scored <- tf_collect(spark_tf_predict(tf_spark_dataframe(test_spark(), rows), fit, output = "raw"))
  expect_equal(unname(scored$prediction), unname(predict(fit, rows, type = "raw")), tolerance = 1e-4)
})
