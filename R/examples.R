# Models for examples and tests, built through reticulate.

#' The slides' CNN, compiled, as a Keras 3 model
#'
#' `Conv2D(32, 3) -> MaxPooling2D -> Flatten -> Dense(64) -> Dense(classes)` with Adam and sparse
#' categorical cross-entropy on logits, built through reticulate (no `keras3` R package needed).
#'
#' @param input_shape Shape of one example, e.g. `c(28, 28, 1)` for MNIST or `c(8, 8, 1)` for digits.
#' @param classes Number of classes.
#' @param learning_rate Adam's learning rate.
#' @return A compiled Keras model (a Python object).
#' @export
tf_keras_cnn_example <- function(input_shape = c(28L, 28L, 1L), classes = 10L, learning_rate = 0.001) {
  keras <- import_after_tfbarrier("keras")
  layers <- keras$layers
  model <- keras$Sequential(list(
    keras$Input(shape = reticulate::tuple(as.list(as.integer(input_shape)))),
    layers$Conv2D(32L, 3L, activation = "relu"),
    layers$MaxPooling2D(),
    layers$Flatten(),
    layers$Dense(64L, activation = "relu"),
    layers$Dense(as.integer(classes))
  ))
  model$compile(
    optimizer = keras$optimizers$Adam(learning_rate),
    loss = keras$losses$SparseCategoricalCrossentropy(from_logits = TRUE),
    metrics = list("accuracy")
  )
  model
}
