# A stand-in for sparklyr's driver JVM, for the tests of what tfbarrier does once it has one: Spark's own
# shell, started by R as sparklyr starts its JVM (so that it inherits R's environment, R's
# LD_LIBRARY_PATH included, as sparklyr's does), with Spark's Py4JServer started in it through Java
# reflection (sparklyr's invoke_new()). The test asks it Scala expressions on its standard input.

pyspark_home <- function() {
  code <- "import os, pyspark; print(os.path.dirname(pyspark.__file__))"
  system2(tfbarrier_python(), c("-c", shQuote(code)), stdout = TRUE)
}

# Starts the shell on `master` with the Spark settings `conf` (a named list); with `digits`, the data set
# as the temporary view "digits" (its 64 pixel columns assembled into the vector column "features", as
# sparklyr's ft_vector_assembler() does). Returns the owner: its application id, its Py4JServer
# (py4j_server()), `ask(expression)` (the expression's value as a string) and `quit()`.
jvm_owner <- function(master, conf = list(), digits = NULL) {
  scala <- tempfile(fileext = ".scala")
  out <- tempfile(fileext = ".log")
  view <- NULL
  if (!is.null(digits)) {
    csv <- tempfile(fileext = ".csv")
    flat <- as.data.frame(digits$pixels)
    names(flat) <- paste0("p", 1:64)
    utils::write.csv(cbind(flat, digit = digits$digit), csv, row.names = FALSE)
    view <- c(
      "import org.apache.spark.ml.feature.VectorAssembler",
      sprintf('val csv = spark.read.option("header", "true").option("inferSchema", "true").csv("%s")', csv),
      'new VectorAssembler().setInputCols((1 to 64).map(i => s"p$i").toArray).setOutputCol("features").transform(csv).createOrReplaceTempView("digits")'
    )
  }
  writeLines(c(
    view,
    'val serverClass = Class.forName("org.apache.spark.api.python.Py4JServer")',
    "val server = serverClass.getConstructor(classOf[org.apache.spark.SparkConf]).newInstance(sc.getConf).asInstanceOf[Object]",
    "def serverCall(name: String): Object = serverClass.getMethod(name).invoke(server)",
    'serverCall("start")',
    # Split so that the shell's echo of this line is never taken for the line it prints.
    'println("REA" + "DY " + serverCall("getListeningPort") + " " + serverCall("secret") + " " + sc.applicationId + " " + serverCall("server").getClass.getName)'
  ), scala)
  settings <- c("spark.ui.enabled" = "false", unlist(conf))
  command <- paste(
    shQuote(file.path(pyspark_home(), "bin", "spark-shell")), "--master", shQuote(master),
    paste("--conf", shQuote(paste0(names(settings), "=", settings)), collapse = " "),
    "-I", shQuote(scala), ">", shQuote(out), "2>&1")
  input <- pipe(command, open = "w")
  ready <- strsplit(owner_line(out, "READY "), " ")[[1]]
  answers <- 0
  ask <- function(expression) {
    writeLines(sprintf('println("ANS" + "WER " + (%s))', expression), input)
    flush(input)
    answers <<- answers + 1
    owner_line(out, "ANSWER ", answers)
  }
  list(
    app = ready[3], ask = ask,
    server = tfbarrier:::py4j_server(ready[1], ready[2], ready[4], shutdown = function() ask('serverCall("shutdown")')),
    quit = function() {
      writeLines("sys.exit(0)", input)
      close(input)  # waits for the shell to exit
    }
  )
}

# The text after `prefix` on its `n`-th line of the shell's output `out` (the shell's prompt may share
# the line), waiting for it up to `seconds`.
owner_line <- function(out, prefix, n = 1, seconds = 240) {
  deadline <- Sys.time() + seconds
  while (Sys.time() < deadline) {
    lines <- if (file.exists(out)) readLines(out, warn = FALSE) else character()
    found <- regmatches(lines, regexpr(paste0(prefix, ".*$"), lines))
    if (length(found) >= n) return(sub(prefix, "", found[n], fixed = TRUE))
    Sys.sleep(0.5)
  }
  stop(sprintf("Spark's shell printed no %s line within %d s; its output ends:\n%s", trimws(prefix), seconds,
               paste(utils::tail(lines, 30), collapse = "\n")))
}
