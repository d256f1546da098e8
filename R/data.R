#' Handwritten digits, 8x8
#'
#' The 1,797 8x8 images of handwritten digits that scikit-learn ships (the UCI "optdigits" test set),
#' for examples and tests that must run offline.
#'
#' @format A data.frame with 1,797 rows:
#' \describe{
#'   \item{digit}{the digit shown, an integer 0-9}
#'   \item{pixels}{a 1797 x 64 matrix column: each row one image, row by row, scaled to 0-1}
#' }
#' @source scikit-learn's `load_digits()`; E. Alpaydin and C. Kaynak, UCI Machine Learning Repository.
"digits"
