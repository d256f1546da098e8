# The calls of tfbarrier's exported functions in `code` (an expression), each as a call that match.call()
# takes; a call on the right of %>% gets the piped value as its first argument, as the pipe gives it.
# test-vignette.R checks the vignette's sparklyr chunks with it, test-docs.R the guides' R blocks.
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
