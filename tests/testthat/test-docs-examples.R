# The guides' R blocks marked `<!-- with spark: SCENE -->`, run on the tests' local Spark, as a reader runs them:
# page by page, each page's marked blocks in order in one environment, in a temporary working directory. The scene
# gives what a block takes as already in the reader's hands, tiny:
#   "digits": `sdf`, 256 of the digits as a Spark DataFrame (`pixels`, an array of 64, and `digit`), and `model`,
#             tf_keras_cnn_example()'s CNN for them;
#   "":       nothing (the page's blocks make what they use).
# MLflow tracks into a SQLite store in that directory. tests/python/test_docs_examples.py runs the Python blocks.

doc_scene <- function(scene) {
  switch(scene,
    digits = list(sdf = tf_spark_dataframe(test_spark(), digits_split()$train[1:256, ]),
                  model = tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01)),
    list()
  )
}

test_that("the guides' R blocks marked with spark run on local Spark", {
  skip_if_no_tfbarrier()
  blocks <- Filter(function(block) !is.null(block$scene), r_blocks())
  expect_gte(length(blocks), 5)
  directory <- tempfile("docs-")
  dir.create(directory)
  old_wd <- setwd(directory)
  on.exit(setwd(old_wd), add = TRUE)
  environ <- reticulate::import("os")$environ  # Python's own: Sys.setenv() does not reach a running Python
  environ$update(list(MLFLOW_TRACKING_URI = paste0("sqlite:///", file.path(directory, "mlflow.db"))))
  on.exit(environ$pop("MLFLOW_TRACKING_URI"), add = TRUE)
  test_spark()  # the tests' session: a block's tf_spark_connect("local[2]") gets it
  ran <- 0L
  for (page in unique(vapply(blocks, `[[`, "", "page"))) {
    reader <- new.env(parent = environment())
    for (block in Filter(function(block) identical(block$page, page), blocks)) {
      list2env(doc_scene(block$scene), envir = reader)
      outcome <- tryCatch({
        utils::capture.output(eval(parse(text = block$code), envir = reader))
        NULL
      }, error = function(e) conditionMessage(e))
      expect_null(outcome, label = sprintf("%s:%d: the block failed", block$page, block$line))
      ran <- ran + is.null(outcome)
    }
  }
  cat(sprintf("\ndocs examples: %d of %d R blocks marked with spark ran on local Spark\n", ran, length(blocks)))
})
