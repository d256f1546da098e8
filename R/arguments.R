# R arguments as the Python core takes them, and the checks R makes before calling it.

# Whole numbers go to Python as integers (3 -> 3L); anything else goes as it is, for the core to refuse
# with its own message.
as_int <- function(x) {
  if (is.numeric(x) && length(x) == 1 && !is.na(x) && x == round(x)) as.integer(x) else x
}

as_column_names <- function(names) {
  if (!is.null(names(names))) return(as.list(names))  # c(input = "column"): a dict, one column per model input
  if (length(names) == 1) names else as.list(names)
}

# The core's fit() and tune() arguments that R must convert, each by its one conversion; the others go as they
# are (NULL as None), for the core to check in its own words.
CORE_CONVERSIONS <- c(
  list(features = as_column_names, label = as_column_names),
  sapply(c("epochs", "batch_size", "num_workers", "validation_freq", "steps_per_epoch", "seed", "shuffle_buffer",
           "tf_threads", "max_retries", "verbose", "checkpoint_every", "steps_per_execution", "workers_per_trial",
           "max_concurrent"), function(name) as_int, simplify = FALSE)
)

# A named list of the core's arguments, each converted as CORE_CONVERSIONS says.
as_core_arguments <- function(arguments) {
  for (name in intersect(names(arguments), names(CORE_CONVERSIONS))) {
    if (!is.null(arguments[[name]])) arguments[name] <- list(CORE_CONVERSIONS[[name]](arguments[[name]]))
  }
  arguments
}

# A tbl_spark of a classic sparklyr connection is read in that connection's own application (sparklyr.R);
# other R data goes into `spark`, by default the session of tf_spark_connect().
as_spark_dataframe <- function(sdf, spark) {
  if (inherits(sdf, "python.builtin.object")) return(sdf)
  if (inherits(sdf, "tbl_spark") && !inherits(sdf, "tbl_pyspark")) return(tbl_spark_dataframe(spark, sdf))
  tf_spark_dataframe(if (is.null(spark)) tf_spark_connect() else spark, sdf)
}

# match.arg() whose error carries tfbarrier's classes: `arg` (partially) matches one of `choices`; left at
# its default (all the choices), the first.
choose_arg <- function(arg, choices, name = deparse(substitute(arg))) {
  if (identical(arg, choices)) return(choices[1])
  chosen <- if (is.character(arg) && length(arg) == 1 && !is.na(arg)) pmatch(arg, choices) else NA
  if (is.na(chosen)) {
    tf_abort(sprintf("%s must be one of %s, got %s", name, paste0("\"", choices, "\"", collapse = ", "),
                     paste(deparse(arg), collapse = " ")), "InvalidArgumentError")
  }
  choices[chosen]
}

# One non-empty string.
is_string <- function(x) is.character(x) && length(x) == 1 && !is.na(x) && nzchar(x)

# A path argument, expanded (~), or an InvalidArgumentError naming the argument.
as_path <- function(path, name = deparse(substitute(path))) {
  if (!is_string(path)) {
    tf_abort(sprintf("%s must be a path (one string), got %s", name, paste(deparse(path), collapse = " ")),
             "InvalidArgumentError")
  }
  path.expand(path)
}

# Refuse a call that leaves out any of `names`, arguments the calling function needs: R's own error
# ("argument is missing, with no default") would carry none of tfbarrier's classes.
check_given <- function(names, env = parent.frame()) {
  absent <- names[vapply(names, function(name) eval(call("missing", as.name(name)), env), logical(1))]
  if (length(absent)) {
    tf_abort(sprintf("%s() needs %s", deparse(sys.call(-1)[[1]]), paste(absent, collapse = ", ")),
             "InvalidArgumentError")
  }
}

# Refuse anything but a fit (tf_save(), tf_export()).
check_fit <- function(fit) {
  if (!inherits(fit, "tfbarrier_fit")) {
    tf_abort(paste0("fit must be a tfbarrier_fit (what spark_tf_fit() returns), not ", class(fit)[1]),
             "InvalidArgumentError")
  }
}
