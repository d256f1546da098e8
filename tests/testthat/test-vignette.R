# The vignette's sparklyr chunks are not run when it is built (sparklyr cannot be installed on this
# project's machines): every call they make to one of tfbarrier's functions is checked against it, so that
# the vignette cannot drift from the API. The other chunks run when the vignette is built.

# The calls of tfbarrier's exported functions in `code` (an expression), each as a call that match.call()
# takes; a call on the right of %>% gets the piped value as its first argument, as the pipe gives it.
tfbarrier_calls <- function(code, exports = getNamespaceExports("tfbarrier")) {
  found <- list()
  walk <- function(x, piped = FALSE) {
    if (!is.call(x)) return()
    name <- if (is.symbol(x[[1]])) as.character(x[[1]]) else ""
    if (name %in% exports) {
      found[[length(found) + 1]] <<- if (piped) as.call(c(x[[1]], quote(.piped), as.list(x)[-1])) else x
    }
    for (i in seq_along(x)[-1]) walk(x[[i]], piped = identical(name, "%>%") && i == 3)
  }
  for (expression in code) walk(expression)
  found
}

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
