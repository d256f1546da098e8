# The guides' R blocks (docs/**/*.md, README.md, pkgdown/index.md): each is marked cluster-only (it needs a cluster,
# or sparklyr) or `<!-- with spark: SCENE -->` (test-docs-examples.R runs it on the tests' local Spark), and every
# call it makes to one of tfbarrier's exported functions is matched to that function's formals here, as
# test-vignette.R does the vignette's sparklyr chunks. What a call
# passes through `...` to the Python core (spark_tf_fit()'s to fit(), spark_tf_tune()'s to tune() and fit()) must
# be an argument the core takes. So a renamed argument breaks the build, not the reader. tests/python/test_docs.py
# checks the Python blocks.

# What a call hands the core through `...`: the names match.call() put there.
through_dots <- function(fun, matched) {
  named <- setdiff(names(as.list(matched))[-1], "")
  setdiff(named, setdiff(names(formals(fun)), "..."))
}

# The core's parameters, read once through reticulate (no Spark starts: importing tfbarrier is light).
core_names <- local({
  known <- list()
  function(name) {
    if (is.null(known[[name]])) {
      parameters <- reticulate::py_eval("lambda f: list(__import__('inspect').signature(f).parameters)")
      known[[name]] <<- setdiff(unlist(parameters(tfbarrier:::core[[name]])), c("unknown", "fit_kwargs"))
    }
    known[[name]]
  }
})

# The core's signatures need tfbarrier's Python (importing it starts no Spark and no TensorFlow); Java is not needed.
skip_if_no_core <- function() {
  if (!reticulate::py_module_available("tfbarrier")) skip("the Python side of tfbarrier is not available")
}

# Where each face's `...` goes in the core.
DOTS_GO_TO <- list(spark_tf_fit = "fit", spark_tf_tune = c("tune", "fit"))

# What is wrong with a block's calls (a character vector, empty when nothing is), and how many calls it makes.
block_problems <- function(block) {
  where <- sprintf("%s:%d", block$page, block$line)
  code <- tryCatch(parse(text = block$code), error = function(e) e)
  if (inherits(code, "error")) return(list(problems = sprintf("%s: not R: %s", where, conditionMessage(code)), calls = 0L))
  problems <- character()
  calls <- tfbarrier_calls(code)
  for (call in calls) {
    name <- as.character(call[[1]])
    fun <- getExportedValue("tfbarrier", name)
    shown <- paste(deparse(call), collapse = " ")
    matched <- tryCatch(match.call(fun, call), error = function(e) conditionMessage(e))
    given <- setdiff(names(as.list(call))[-1], "")
    partial <- if (is.call(matched)) setdiff(given, names(as.list(matched))) else character()
    if (!is.call(matched)) {
      problems <- c(problems, sprintf("%s: %s: %s", where, shown, matched))
    } else if (length(partial)) {  # R would take `epoch =` for `epochs =`: a reader's copy should not rely on it
      problems <- c(problems, sprintf("%s: %s: %s only partially match %s()'s arguments", where, shown,
                                      paste(partial, collapse = ", "), name))
    } else if (name %in% names(DOTS_GO_TO)) {
      passed <- through_dots(fun, matched)
      extra <- setdiff(passed, unlist(lapply(DOTS_GO_TO[[name]], core_names)))
      if (length(extra)) {
        problems <- c(problems, sprintf("%s: %s: %s() hands the core %s through ..., which it does not take", where,
                                        shown, name, paste(extra, collapse = ", ")))
      }
    }
  }
  list(problems = problems, calls = length(calls))
}

test_that("every R block of the guides is marked, parses, and calls tfbarrier with arguments it takes", {
  skip_if_no_core()  # the core's parameters, for what passes through `...`
  blocks <- r_blocks()
  expect_gt(length(blocks), 15)
  unmarked <- Filter(function(block) !block$marked && is.null(block$scene), blocks)
  expect_equal(vapply(unmarked, function(b) sprintf("%s:%d", b$page, b$line), ""), character(0),
               label = "R blocks with neither <!-- cluster-only --> nor <!-- with spark: SCENE -->")
  checked <- lapply(blocks, block_problems)
  expect_equal(unlist(lapply(checked, `[[`, "problems")), character(0))
  counted <- vapply(checked, function(result) result$calls, integer(1))
  called <- unique(unlist(lapply(blocks, function(block) {
    code <- tryCatch(parse(text = block$code), error = function(e) NULL)
    vapply(tfbarrier_calls(code), function(call) as.character(call[[1]]), "")
  })))
  expect_true(all(c("spark_tf_fit", "spark_tf_predict", "spark_tf_tune", "spark_tf_apply", "tf_preset", "tf_env",
                    "tf_spark_config", "tf_spark_connect", "install_tfbarrier") %in% called))
  cat(sprintf("\ndocs examples: %d R blocks checked (%d calls matched to tfbarrier's formals)\n",
              length(blocks), sum(counted)))
})

test_that("the check catches a misspelt argument, and one the core does not take through ...", {
  skip_if_no_core()
  planted <- function(code) block_problems(list(page = "planted.md", line = 1L, code = code))$problems
  expect_match(planted("x %>% spark_tf_predict(fit, epochs = 3)"), "unused argument")
  expect_match(planted("spark_tf_fit(sdf, model, features = 'x', epoch = 3)"), "only partially match")
  expect_match(planted("spark_tf_fit(sdf, model, features = 'x', batchsize = 64)"), "hands the core batchsize")
  expect_match(planted("spark_tf_tune(sdf, build, params, 'x', 'y', worker = 2)"), "hands the core worker")
  expect_length(planted("spark_tf_fit(sdf, model, features = 'x', checkpoint_every = '30min', max_retries = 2)"), 0)
  expect_length(planted("spark_tf_tune(sdf, build, params, 'x', 'y', validation_split = 0.2, seed = 1)"), 0)
})
