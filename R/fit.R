#' Train a Keras model on a Spark DataFrame with Spark barrier tasks
#'
#' Runs one Spark barrier stage of `num_workers` tasks; each trains on its own partition of the data
#' in a TensorFlow process (gradients averaged every step over tfbarrier's authenticated ring, or under
#' `MultiWorkerMirroredStrategy` with `exchange = "strategy"` or several GPUs per worker). The
#' work is done by the Python core, `tfbarrier.fit()`.
#'
#' @param sdf The training data: a sparklyr `tbl_spark` (trained in its own connection's application, see
#'   [tf_spark_session()]), a `pyspark` DataFrame, an R data.frame (converted with
#'   [tf_spark_dataframe()] in the session of [tf_spark_connect()]), or a Parquet path.
#' @param model A compiled Keras model built through reticulate or `keras3` (Keras 3 or tf_keras),
#'   e.g. [tf_keras_cnn_example()]. A Keras 3 model with layers of your own (a Python module loaded with
#'   `reticulate::import_from_path()`), KerasHub's layers or a subclassed model trains natively in Keras 3
#'   (the guide "Keras 3 and tf_keras", docs/guides/keras.md).
#' @param features One array column (e.g. a flat image, reshaped to the model's input shape),
#'   several numeric columns, one Spark ML vector column (dense or sparse, e.g. `ft_vector_assembler()`'s),
#'   or one binary column of encoded images (the `content` of
#'   `tf_spark_dataframe(spark, dir, format = "binaryFile")`), decoded in the training processes and
#'   resized to the model's `(height, width, channels)` input as values in 0-255. For a Keras 3 model of
#'   several inputs, one column per input, named by the input's name:
#'   `c(token_ids = "ids", padding_mask = "mask")`; integer columns reach the model as integers. Or one
#'   character column, for a Keras 3 model that carries its own preprocessor (a KerasHub task such as
#'   `BertTextClassifier`), which the training processes run on the text.
#' @param label A numeric column, or an array column of numbers (a sequence label, a value per position:
#'   a causal LM's next tokens, weighed per position by a `sample_weight` array column); for a
#'   Keras 3 model of several outputs, one per output, named by the output's name:
#'   `c(cls = "kind", reg = "target")`. `NULL` only for a character column whose model's preprocessor makes
#'   the labels (a causal LM's).
#' @param epochs,batch_size As in Keras; `batch_size` is the global batch, split across workers.
#' @param num_workers Number of Spark tasks (TensorFlow workers); the cluster needs as many free slots.
#' @param validation_data Rows to evaluate the model on after each epoch (`val_loss`, `val_accuracy`...
#'   in the history), with the same feature and label columns: converted like `sdf`. Each validation
#'   evaluates every row exactly once across the workers.
#' @param validation_split Instead of `validation_data`: the fraction of each worker's rows held out for
#'   validation, drawn with `seed` (the same rows at every epoch and retry).
#' @param validation_freq Validate after every this many epochs (`val_*` is `NA` in the history for the others).
#' @param sample_weight A numeric column: each row's weight in the loss, as Keras's `sample_weight` (an array
#'   column weighs each position of a sequence label).
#' @param class_weight A named list of class ids to weights, e.g. `list("3" = 5)`; classes not listed weigh 1.
#' @param callbacks A Python function of no arguments returning a list of `tf.keras` callbacks, called in every
#'   training process (`reticulate::py_func()`, or a function of a module of yours).
#' @param seed Seeds the weights' initialisation in the workers and the shuffling of each shard.
#' @param shuffle Shuffle each shard every pass; `FALSE` keeps the partitions' order, for reproducible runs.
#' @param steps_per_epoch Steps each worker runs an epoch; by default one pass over the rows.
#' @param checkpoint_dir A directory every worker reaches: the training state is saved there at each epoch's
#'   end (and every `checkpoint_every` steps, or so long: `"10min"`, passed in `...`), and a fit retried after a
#'   failure, or run again with the same directory, resumes at the step after the last save.
#' @param save_to A directory: the chief saves the model there after every epoch as a `.keras` archive,
#'   `epoch-001.keras`..., listed in the result's `saved`.
#' @param save_best With `save_to`, a metric such as `"val_loss"`: only its best epoch, as `best.keras`
#'   (`save_mode`, in `...`, says whether lower or higher is better; by default from the metric's name).
#' @param exchange How the gradients travel: `"tfbarrier"`, tfbarrier's own ring, which admits only the job's
#'   processes and is TLS where the cluster encrypts; `"strategy"`, `MultiWorkerMirroredStrategy` through
#'   TensorFlow's gRPC server, which accepts any client: a trusted network only; `"auto"` (default): the ring,
#'   or the strategy for workers of several GPUs each. Its options go in `communication` (in `...`): a named
#'   list of `bytes_per_pack`, `timeout_seconds`, `compression = "fp16"` (the gradients summed in float16),
#'   the ring's `shard = "optimizer"` (each worker holds the optimizer's state of its own share of the
#'   weights: about 1/N of the slots) and the strategy's `implementation`, `"ring"` or `"nccl"`.
#' @param mlflow Log the fit to MLflow from the driver (the `mlflow` extra of the Python package): `TRUE` for
#'   the active run or a new run in the current experiment, an experiment's name, or a run id to continue; the
#'   tracking URI is MLflow's own (e.g. `MLFLOW_TRACKING_URI` in Python's environment).
#' @param verbose 0 silent; 1 a progress bar and a line per epoch; 2 also every worker's events and output.
#' @param ... Further arguments of `tfbarrier.fit()`, converted as the ones above: `shuffle_buffer`,
#'   `checkpoint_every`, `save_mode`, `max_retries`, `timeout`, `stall_timeout`, `tf_threads`,
#'   `allow_unencrypted`, `use_gpu`, `tensorboard_dir`, `env` (a [tf_env()]), `steps_per_execution`
#'   (training steps per call into TensorFlow: `"auto"` by default, which times the first calls and then runs
#'   about half a second of steps per call; a number fixes it; `NULL` keeps the model's own) and
#'   `communication` (see `exchange`).
#' @param spark The `SparkSession` to convert an R data.frame or a path in; by default the one of
#'   [tf_spark_connect()].
#' @return A `tfbarrier_fit`: `model` (the trained Keras model), `history` (a data.frame, one row per
#'   epoch), `timings` (seconds per phase), `workers` (a data.frame, one row per worker, with its
#'   training process's resident memory in MB once set up and at its peak: `baseline_mb`, `peak_mb`, and
#'   the `steps_per_execution`, `exchange` (`"tfbarrier"` or `"strategy"`) and gradient `compression` it
#'   trained with, and how the model's files reached
#'   it: `files_via`, `"driver link"` (outside Spark) or `"spark"`, and `files_mb`) and
#'   `attempts`, and `stopped_epoch` (the last epoch run, from 0, when a callback such as early stopping
#'   ended the fit; `NULL` otherwise), and `saved` (with `save_to`: a data.frame of the saved models'
#'   `epoch` and `path`), and `mlflow_run_id` (with `mlflow`, the MLflow run's id; `NULL` otherwise). It has
#'   `print()`, `summary()`, `plot()`, `predict()` and `as.data.frame()` (the history) methods.
#' @section Errors: Bad arguments and data are refused before any Spark job with an R error whose
#'   class vector names the kind (`"ColumnError"`, `"InvalidArgumentError"`, `"ModelError"`,
#'   `"ClusterError"`, `"WorkerError"`...) followed by `"TfBarrierError"` and `"tfbarrier_error"`.
#' @export
spark_tf_fit <- function(sdf, model, features, label = NULL, epochs = 1L, batch_size = 32L, num_workers = 2L,
                         validation_data = NULL, validation_split = NULL, validation_freq = 1L, sample_weight = NULL,
                         class_weight = NULL, callbacks = NULL, seed = NULL, shuffle = TRUE, steps_per_epoch = NULL,
                         checkpoint_dir = NULL, save_to = NULL, save_best = NULL, exchange = "auto", mlflow = NULL,
                         verbose = 1L, ..., spark = NULL) {
  check_given(c("sdf", "model", "features"))
  sdf <- as_spark_dataframe(sdf, spark)
  if (!is.null(validation_data)) validation_data <- as_spark_dataframe(validation_data, spark)
  arguments <- list(
    features = features, label = label, epochs = epochs, batch_size = batch_size, num_workers = num_workers,
    validation_data = validation_data, validation_split = validation_split, validation_freq = validation_freq,
    sample_weight = sample_weight, class_weight = class_weight, callbacks = callbacks, seed = seed, shuffle = shuffle,
    steps_per_epoch = steps_per_epoch, checkpoint_dir = checkpoint_dir, save_to = save_to, save_best = save_best,
    exchange = exchange, mlflow = mlflow, verbose = verbose
  )
  result <- tf_call(do.call(core$fit, c(list(sdf, model), as_core_arguments(c(arguments, list(...))))))
  new_fit(result, features)
}

#' Score a Spark DataFrame with a trained model, on the executors
#'
#' @param sdf A `pyspark` DataFrame, a sparklyr `tbl_spark`, or an R data.frame / Parquet path
#'   (converted as in [spark_tf_fit()]).
#' @param fit A `tfbarrier_fit` or a Keras model.
#' @param features As in [spark_tf_fit()]; by default the features of `fit`.
#' @param output_col Name of the prediction column. For a Keras 3 model of several outputs, a column
#'   `<output_col>_<output name>` each, or a named vector of the outputs to score: `c(cls = "kind_hat")`.
#' @param output `"class"` (class id), `"probabilities"`, `"raw"` model outputs, `"features"`: the
#'   output of `layer`, flattened (the model as a feature extractor, for transfer learning), or `"text"`:
#'   for a KerasHub causal LM with its preprocessor, the text it generates from the prompt column
#'   `features` names (a character column).
#' @param layer With `output = "features"`: a layer's name, or its position in the model's layers
#'   (1-based, as keras3's `get_layer(index =)`); by default the layer before the last.
#' @param batch_size Rows per forward pass (prompts per `generate()` call with `output = "text"`).
#' @param spark As in [spark_tf_fit()].
#' @param max_length,sampler,strip_prompt With `output = "text"`: tokens a row at most, prompt included (by
#'   default the preprocessor's `sequence_length`); a KerasHub sampler or its name (`"greedy"`, the default;
#'   a seeded sampling one repeats, e.g. `keras_hub$samplers$TopKSampler(k = 5L, seed = 1L)`); `TRUE` for the
#'   continuation alone, without the prompt.
#' @return Every column of `sdf` plus `output_col` (a number, an array column for
#'   `"probabilities"`, `"raw"` and `"features"`, a character column for `"text"`): a `pyspark` DataFrame computed lazily; for a `tbl_spark`, a
#'   `tbl_spark` in the same sparklyr connection, computed lazily there (a temporary view of its own
#'   application; see [tf_spark_session()]). [tf_collect()] or `dplyr::collect()` brings either into R.
#' @export
spark_tf_predict <- function(sdf, fit, features = NULL, output_col = "prediction", output = "class",
                             batch_size = 1024L, spark = NULL, layer = NULL, max_length = NULL,
                             sampler = "greedy", strip_prompt = FALSE) {
  check_given(c("sdf", "fit"))
  model <- if (inherits(fit, "tfbarrier_fit")) fit$model else fit
  if (is.null(features)) {
    if (!inherits(fit, "tfbarrier_fit")) {
      tf_abort("features must name the feature column(s) when fit is a Keras model, not a tfbarrier_fit",
               "InvalidArgumentError")
    }
    features <- fit$features
  }
  if (is.null(layer)) {
    layer <- -2L
  } else if (is.numeric(layer)) {
    if (length(layer) != 1 || is.na(layer) || layer < 1) {
      tf_abort("layer must be a layer's name or its 1-based position", "InvalidArgumentError")
    }
    layer <- as_int(layer) - 1L
  }
  tbl <- sdf
  sdf <- as_spark_dataframe(sdf, spark)
  scored <- tf_call(core$predict(sdf, model, features = as_column_names(features),
                                 output_col = as_column_names(output_col),
                                 output = output, batch_size = as_int(batch_size), layer = layer,
                                 max_length = if (!is.null(max_length)) as_int(max_length), sampler = sampler,
                                 strip_prompt = isTRUE(strip_prompt)))
  if (inherits(tbl, "tbl_spark")) scored <- back_to_sparklyr(scored, tbl)
  scored
}

#' A KerasHub preset for spark_tf_fit(), loaded by the training processes, never by R
#'
#' The driver ships the preset's path, not its weights: each training process loads the task saved there
#' (`task$save_to_preset(path)`, or a downloaded preset's directory), enables LoRA adapters of `lora_rank` on its
#' backbone, and trains; only the adapters train, cross the ring and come back. A string column trains a preset
#' saved with its preprocessor (`features = "text"`; a causal LM needs no label).
#'
#' @param path A KerasHub preset directory every executor can read (a path on each host, or a file system
#'   TensorFlow reads: HDFS, S3), or a handle each training process downloads into its host's cache
#'   (`"hf://org/model"`, `"kaggle://org/model/keras/variant/1"`, a built-in name). A preset no executor can
#'   read, or download, is refused with the path and the host.
#' @param lora_rank The LoRA adapters' rank, or `NULL` for none (the whole model trains and comes back).
#' @param prepare `NULL`, or a Python function of the loaded model (through reticulate) called in each training
#'   process before training, e.g. to compile it with your optimizer; without it the task keeps KerasHub's compile.
#' @param quantize `NULL` (the weights as saved), `"int8"` or `"int4"`: each training process quantizes the
#'   backbone's weights (Keras's `quantize()`) before it enables the adapters, which train over them (QLoRA's
#'   idea); needs `lora_rank`. A preset saved already quantized loads as it is, never holding its float weights.
#' @return A preset for `spark_tf_fit(model = )`. With `lora_rank`, the fit's `model` is the trained adapters:
#'   `fit$model$save(path)` writes them (a `.lora.h5` file for `load_lora_weights()`), `fit$model$load()` returns
#'   the preset's task with them. `save_to` in `spark_tf_fit()` saves preset directories (`epoch-001/`...,
#'   the adapters merged into the weights) that KerasHub's `from_preset()` loads.
#' @export
tf_preset <- function(path, lora_rank = NULL, prepare = NULL, quantize = NULL) {
  check_given("path")
  tf_call(core$preset(path.expand(path), lora_rank = if (!is.null(lora_rank)) as_int(lora_rank), prepare = prepare,
                      quantize = quantize))
}
