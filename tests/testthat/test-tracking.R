test_that("spark_tf_fit(mlflow = TRUE) logs one MLflow run that MlflowClient reads back", {
  skip_if_no_tfbarrier()
  if (!reticulate::py_module_available("mlflow")) skip("MLflow is not installed in tfbarrier's Python")
  # A SQLite store of its own, in a working directory of its own (where it keeps its artifacts, ./mlruns),
  # named in Python's own environment: Sys.setenv() does not reach a Python that is already running.
  directory <- tempfile("mlflow-")
  dir.create(directory)
  old_wd <- setwd(directory)
  on.exit(setwd(old_wd), add = TRUE)
  store <- paste0("sqlite:///", file.path(directory, "mlflow.db"))
  environ <- reticulate::import("os")$environ
  environ$update(list(MLFLOW_TRACKING_URI = store))
  on.exit(environ$pop("MLFLOW_TRACKING_URI"), add = TRUE)

  data <- digits_split()
  fit <- spark_tf_fit(data$train, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01), features = "pixels",
                      label = "digit", epochs = 2, batch_size = 64, num_workers = 2, verbose = 0, mlflow = TRUE,
                      spark = test_spark())
  mlflow <- reticulate::import("mlflow")
  client <- mlflow$MlflowClient(store)
  as_list <- reticulate::import_builtins()$list  # MLflow's paged lists, as R lists
  runs <- as_list(client$search_runs(list("0")))  # a new run in the current experiment: the store's default
  expect_length(runs, 1)
  run <- runs[[1]]
  expect_equal(run$info$run_id, fit$mlflow_run_id)
  expect_equal(run$info$status, "FINISHED")
  expect_equal(run$data$params$epochs, "2")
  expect_equal(run$data$params$num_workers, "2")
  for (metric in c("loss", "accuracy")) {
    points <- as_list(client$get_metric_history(fit$mlflow_run_id, metric))
    expect_equal(vapply(points, function(p) as.numeric(p$step), numeric(1)), c(1, 2))
    expect_equal(vapply(points, function(p) p$value, numeric(1)), fit$history[[metric]], tolerance = 1e-6)
  }
  # The model loads from the store that MLFLOW_TRACKING_URI names, and predicts as the fit's model.
  loaded <- mlflow$keras$load_model(paste0("runs:/", fit$mlflow_run_id, "/model"))
  pixels <- reticulate::np_array(data$held_out$pixels[1:5, ], dtype = "float32")$reshape(c(5L, 8L, 8L, 1L))
  expect_equal(loaded$predict(pixels, verbose = 0L), predict(fit, data$held_out[1:5, ], type = "raw"),
               tolerance = 1e-5)
})
