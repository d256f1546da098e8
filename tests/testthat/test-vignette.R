# The vignette's sparklyr chunks are not run when it is built (sparklyr cannot be installed on this
# project's machines): every call they make to one of tfbarrier's functions is checked against it, so that
# the vignette cannot drift from the API. The other chunks run when the vignette is built.

# tfbarrier_calls(): helper-calls.R.

vignette_chunks <- function(pattern) {
  rmd <- system.file("doc", "distributed-keras.Rmd", package = "tfbarrier")
  expect_true(nzchar(rmd), label = "the installed vignette's source")
  lines <- readLines(rmd)
  starts <- grep(paste0("^```\\{r ", pattern), lines)
  ends <- grep("^```$", lines)
  unlist(lapply(starts, function(start) lines[(start + 1):(min(ends[ends > start]) - 1)]))
}

test_that("the vignette's sparklyr chunks call tfbarrier's functions with arguments those take", {
  code <- vignette_chunks("sparklyr")
  calls <- tfbarrier_calls(parse(text = code))
  called <- vapply(calls, function(call) as.character(call[[1]]), "")
  expect_true(all(c("tf_spark_config", "spark_tf_fit", "spark_tf_predict") %in% called))
  for (call in calls) {
    fun <- getExportedValue("tfbarrier", as.character(call[[1]]))
    matched <- tryCatch(match.call(fun, call), error = function(e) conditionMessage(e))
    expect_true(is.call(matched), label = paste(deparse(call), collapse = " "))
  }
})

test_that("a call with an argument the function does not take is caught", {
  calls <- tfbarrier_calls(parse(text = "x %>% spark_tf_predict(fit, epochs = 3)"))
  expect_length(calls, 1)
  expect_error(match.call(spark_tf_predict, calls[[1]]), "unused argument")
})
