# R's faces name the arguments people use: each is the core's, with the core's default (issue 73).

# The core function's parameters: for each, list(name, whether it has a default, the default).
core_parameters <- function(fn) {
  listed <- reticulate::py_eval(paste0(
    "lambda f: [(n, p.default is not p.empty, None if p.default is p.empty else p.default) ",
    "for n, p in __import__('inspect').signature(f).parameters.items()]"))
  listed(fn)
}

expect_faces_agree <- function(r_function, core_function, own) {
  formals <- formals(r_function)
  named <- setdiff(names(formals), c(own, "..."))
  core <- core_parameters(core_function)
  core_names <- vapply(core, function(p) p[[1]], character(1))
  expect_setequal(setdiff(named, core_names), character(0))  # every name R hands on is the core's
  for (p in core[core_names %in% named]) {
    name <- p[[1]]
    if (!p[[2]] || identical(formals[[name]], quote(expr = ))) next  # required on either side: no default to agree
    r_default <- eval(formals[[name]])
    expect_true(isTRUE(all.equal(r_default, p[[3]])),
                info = sprintf("%s: R's default %s, the core's %s", name, deparse(formals[[name]]), deparse(p[[3]])))
  }
}

test_that("spark_tf_fit()'s and spark_tf_tune()'s own arguments are the core's, with the core's defaults", {
  skip_if_no_tfbarrier()
  expect_faces_agree(spark_tf_fit, tfbarrier:::core$fit, c("sdf", "model", "spark"))
  expect_faces_agree(spark_tf_tune, tfbarrier:::core$tune, c("sdf", "build_model", "params", "spark"))
})

test_that("arguments are converted by one table: whole numbers as integers, column names as a string or a list", {
  converted <- tfbarrier:::as_core_arguments(list(epochs = 2, seed = NULL, features = c(a = "x", b = "y"),
                                                 label = "y", checkpoint_every = "10min", shuffle = TRUE))
  expect_identical(converted, list(epochs = 2L, seed = NULL, features = list(a = "x", b = "y"), label = "y",
                                   checkpoint_every = "10min", shuffle = TRUE))
})
