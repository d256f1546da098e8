# One Spark session for the whole test run (started on first use), and the digits split.

skip_if_no_tfbarrier <- function() {
  if (!tf_available()) skip("the Python side of tfbarrier (and Java) is not available")
}

test_spark <- local({
  session <- NULL
  function() {
    if (is.null(session)) session <<- tf_spark_connect("local[2]", config = list("spark.sql.shuffle.partitions" = "2"))
    session
  }
})

spark_job_count <- function(spark) {
  length(spark$sparkContext$statusTracker()$getJobIdsForGroup(NULL))
}

digits_split <- function() {
  set.seed(0)
  order <- sample(nrow(digits))
  list(train = digits[order[-(1:300)], ], held_out = digits[order[1:300], ])
}

# What `expr` drew, read back from its recorded display list: one element per panel (named by its title),
# each a list of the series drawn there as points or lines (a legend's symbols left out), each a
# data.frame of x and y.
drawn_series <- function(expr) {
  grDevices::pdf(NULL)
  on.exit(grDevices::dev.off())
  grDevices::dev.control("enable")
  force(expr)
  panels <- list()
  for (op in grDevices::recordPlot()[[1]]) {
    args <- op[[2]]
    name <- args[[1]]$name
    if (identical(name, "C_plot_new")) panels[[length(panels) + 1]] <- list()
    if (identical(name, "C_title") && is.character(args[[2]])) names(panels)[length(panels)] <- args[[2]]
    if (identical(name, "C_plotXY") && !identical(args[[3]], "p")) {
      last <- length(panels)
      panels[[last]][[length(panels[[last]]) + 1]] <- data.frame(x = args[[2]]$x, y = args[[2]]$y)
    }
  }
  panels
}
