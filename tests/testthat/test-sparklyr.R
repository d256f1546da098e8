# sparklyr's own connections: tfbarrier's Python attaches to sparklyr's driver JVM. Each scenario runs in
# an R process of its own (this one has a Spark session of its own for the other tests, and one Python
# process holds one SparkContext). sparklyr cannot be installed on this project's machines (CRAN only):
# these tests skip there and run where it is installed.

# Runs `lines` (after a sparklyr connection `sc` to `master` with tfbarrier's settings) in a new R
# process and returns its `RESULT name=value ...` line as a named list.
run_with_sparklyr <- function(lines, master = "local[2]", config = "tf_spark_config()") {
  home <- system2(tfbarrier_python(), c("-c", shQuote("import os, pyspark; print(os.path.dirname(pyspark.__file__))")),
                  stdout = TRUE)
  jar <- "/usr/share/java/protobuf.jar"  # sparklyr's R workers on Spark 4 (Debian's libprotobuf-java)
  script <- tempfile(fileext = ".R")
  writeLines(c(
    "suppressPackageStartupMessages({library(tfbarrier); library(sparklyr); library(dplyr)})",
    "options(tfbarrier.exchange_dir = file.path(tempdir(), 'exchange'))",
    "result <- function(...) cat('RESULT', paste0(names(list(...)), '=', vapply(list(...), as.character, '')), '\\n')",
    "pyspark_jvms <- function() {  # JVMs pyspark launched itself (its launch_gateway's pyspark-shell)",
    "  args <- system('ps -eo args=', intern = TRUE)",
    "  sum(grepl('org.apache.spark.deploy.SparkSubmit', args) & grepl('pyspark-shell', args))",
    "}",
    sprintf("config <- %s", config),
    if (file.exists(jar)) sprintf("config[['sparklyr.shell.driver-class-path']] <- '%s'", jar),
    sprintf("spark_home <- '%s'", home),
    "pyspark_jvms_before <- pyspark_jvms()",
    sprintf("sc <- spark_connect(master = '%s', spark_home = spark_home, config = config)", master),
    "pixels <- as.data.frame(digits$pixels); names(pixels) <- paste0('p', 1:64)",
    "flat <- cbind(pixels, digit = digits$digit)",
    lines
  ), script)
  out <- suppressWarnings(system2(file.path(R.home("bin"), "Rscript"), script, stdout = TRUE, stderr = TRUE,
                                  env = paste0("R_LIBS=", paste(.libPaths(), collapse = ":")), timeout = 900))
  line <- regmatches(out, regexpr("RESULT .*", out))
  if (length(line) != 1) {
    fail(paste0("no RESULT line; the output ends:\n", paste(utils::tail(out, 40), collapse = "\n")))
    return(NULL)
  }
  fields <- strsplit(strsplit(trimws(sub("^RESULT ", "", line)), " ")[[1]], "=")
  stats::setNames(lapply(fields, `[`, 2), vapply(fields, `[`, "", 1))
}

test_that("the slides' workflow trains and predicts in sparklyr's own application, with no files", {
  skip_if_no_tfbarrier()
  skip_if_not_installed("sparklyr")
  seen <- run_with_sparklyr(c(
    "assembled <- copy_to(sc, flat, 'digits') %>% ft_vector_assembler(paste0('p', 1:64), 'features')",
    "fit <- spark_tf_fit(assembled, tf_keras_cnn_example(c(8, 8, 1), learning_rate = 0.01),",
    "                    features = 'features', label = 'digit', epochs = 3, batch_size = 64, verbose = 0)",
    "scored <- spark_tf_predict(assembled, fit)",
    "counts <- scored %>% count(correct = digit == prediction) %>% collect()",
    "new_jvms <- pyspark_jvms() - pyspark_jvms_before",
    "app <- invoke(spark_context(sc), 'applicationId')",
    "first <- tf_spark_session(sc)$sparkContext$applicationId",
    "spark_disconnect(sc)",
    "sc <- spark_connect(master = 'local[2]', spark_home = spark_home, config = config)",
    "again <- spark_tf_fit(copy_to(sc, flat[1:400, ]) %>% ft_vector_assembler(paste0('p', 1:64), 'features'),",
    "                      tf_keras_cnn_example(c(8, 8, 1)), features = 'features', label = 'digit', verbose = 0)",
    "result(same_app = first == app, scored_class = class(scored)[1],",
    "       accuracy = round(counts$n[counts$correct] / sum(counts$n), 3), rows = sum(fit$workers$rows),",
    "       new_jvms = new_jvms, exchange_files = length(list.files(getOption('tfbarrier.exchange_dir'), recursive = TRUE)),",
    "       reattached = tf_spark_session(sc)$sparkContext$applicationId == invoke(spark_context(sc), 'applicationId'),",
    "       again_rows = sum(again$workers$rows))"
  ))
  if (is.null(seen)) return()
  expect_equal(seen$same_app, "TRUE")
  expect_equal(seen$scored_class, "tbl_spark")
  expect_gt(as.numeric(seen$accuracy), 0.9)
  expect_equal(seen$rows, as.character(nrow(digits)))
  expect_equal(seen$new_jvms, "0")  # sparklyr's driver only: pyspark started no JVM of its own
  expect_equal(seen$exchange_files, "0")
  expect_equal(seen$reattached, "TRUE")
  expect_equal(seen$again_rows, "400")
})

test_that("with another application's session, a vector column crosses through the exchange directory and back", {
  skip_if_no_tfbarrier()
  skip_if_not_installed("sparklyr")
  seen <- run_with_sparklyr(c(
    "spark <- tf_spark_connect('local[2]')",
    "assembled <- copy_to(sc, flat[1:600, ]) %>% ft_vector_assembler(paste0('p', 1:64), 'features')",
    "fit <- spark_tf_fit(assembled, tf_keras_cnn_example(c(8, 8, 1)), features = 'features', label = 'digit',",
    "                    verbose = 0, spark = spark)",
    "scored <- spark_tf_predict(assembled, fit, spark = spark)",
    "counts <- scored %>% count(prediction) %>% collect()",
    "result(rows = sum(counts$n), scored_class = class(scored)[1], features_type = sdf_schema(scored)$features$type,",
    "       exchange_files = length(list.files(getOption('tfbarrier.exchange_dir'), recursive = TRUE)) > 0)"
  ))
  if (is.null(seen)) return()
  expect_equal(seen$rows, "600")
  expect_equal(seen$scored_class, "tbl_spark")
  expect_equal(seen$features_type, "ArrayType(DoubleType,true)")  # a vector comes back as an array
  expect_equal(seen$exchange_files, "TRUE")
})

test_that("a cluster connection that does not say which Python its executors run is refused before any job", {
  skip_if_no_tfbarrier()
  skip_if_not_installed("sparklyr")
  seen <- run_with_sparklyr(c(
    "tbl <- copy_to(sc, flat[1:100, ])",
    "jobs <- function() length(invoke(invoke(spark_context(sc), 'statusTracker'), 'getJobIdsForGroup', NULL))",
    "before <- jobs()",
    "err <- tryCatch(spark_tf_fit(tbl, tf_keras_cnn_example(c(8, 8, 1)), features = paste0('p', 1:64),",
    "                             label = 'digit', verbose = 0), error = identity)",
    "result(class = inherits(err, 'ClusterError') && inherits(err, 'TfBarrierError'),",
    "       names_setting = grepl('spark.pyspark.python', conditionMessage(err), fixed = TRUE),",
    "       names_helper = grepl('tf_spark_config', conditionMessage(err), fixed = TRUE), new_jobs = jobs() - before)"
  ), master = "local-cluster[2,1,1024]", config = "list()")
  if (is.null(seen)) return()
  expect_equal(unlist(seen), c(class = "TRUE", names_setting = "TRUE", names_helper = "TRUE", new_jobs = "0"))
})
