# tfbarrier from R: the slides' workflow. The slides' CNN (Conv2D(32, 3) -> MaxPool -> Flatten ->
# Dense(64) -> Dense(10)) trained on the package's 8x8 digits by 2 Spark barrier tasks, then scored
# on the executors and brought back into R.
#
# `make demo` runs it after the Python demo. In R:
#   source(system.file("examples", "digits_cnn.R", package = "tfbarrier"))
# tfbarrier's Python is TFBARRIER_PYTHON (make demo's .venv/bin/python), or install_tfbarrier()'s.

library(tfbarrier)
if (!tf_available()) {
  stop("tfbarrier's Python is not set up: set TFBARRIER_PYTHON to a Python with tfbarrier ",
       "(e.g. the .venv/bin/python of `make demo`) before library(tfbarrier), or run install_tfbarrier() once")
}

set.seed(42)
held_out <- sample(nrow(digits), 300)
spark <- tf_spark_connect("local[2]")

cat("Training the slides' CNN on", nrow(digits) - length(held_out), "8x8 digits with 2 Spark barrier tasks ...\n")
fit <- spark_tf_fit(digits[-held_out, ], tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01),
                    features = "pixels", label = "digit", epochs = 4, batch_size = 64, num_workers = 2,
                    seed = 1, spark = spark)
print(fit)  # per worker: host, rows, steps, weights checksum; per epoch: loss and accuracy

# Scoring on the executors (a Spark DataFrame in, a Spark DataFrame out), collected into R.
scored <- tf_collect(spark_tf_predict(digits[held_out, ], fit, spark = spark))
accuracy <- mean(scored$prediction == scored$digit)
cat(sprintf("held-out accuracy on %d digits, scored on the executors: %.4f\n", nrow(scored), accuracy))
invisible(spark$stop())
if (accuracy < 0.90) stop(sprintf("held-out accuracy %.4f is below 0.90", accuracy))
