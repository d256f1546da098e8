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
