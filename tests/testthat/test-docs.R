# The guides' R blocks (docs/**/*.md, README.md, pkgdown/index.md) run nowhere in the tests (they need a cluster,
# or sparklyr): each is marked cluster-only, and every call it makes to one of tfbarrier's exported functions is
# matched to that function's formals here, as test-vignette.R does the vignette's sparklyr chunks. What a call
# passes through `...` to the Python core (spark_tf_fit()'s to fit(), spark_tf_tune()'s to tune() and fit()) must
# be an argument the core takes. So a renamed argument breaks the build, not the reader. tests/python/test_docs.py
# checks the Python blocks.
#
# The guides are not in the R package: the tests find the repository through TFBARRIER_SOURCE_DIR (the Makefile
# exports it, for `make test-docs` and R CMD check alike), or as the directory two above this file's.

source_dir <- function() {
  candidates <- c(Sys.getenv("TFBARRIER_SOURCE_DIR"), testthat::test_path("..", ".."))
  found <- Filter(function(dir) nzchar(dir) && file.exists(file.path(dir, "mkdocs.yml")), candidates)
  if (length(found) == 0) skip("the guides are not here: set TFBARRIER_SOURCE_DIR to the repository")
  normalizePath(found[[1]])
}

doc_pages <- function(root) {
  guides <- list.files(file.path(root, "docs"), pattern = "\\.md$", recursive = TRUE)
  guides <- guides[!startsWith(guides, "r/")]  # the pkgdown site built into docs/r
  c("README.md", "pkgdown/index.md", file.path("docs", guides))
}

# The fenced blocks of a Markdown file, CommonMark's way (a fence closes on the same character, at least as long,
# with no info string; a fence in a tab, indented four spaces, is dedented): language, line, code, whether the line
# above the fence is the cluster-only marker.
doc_blocks <- function(root, page) {
  lines <- readLines(file.path(root, page), warn = FALSE)
  fence <- "^( {0,4})(`{3,}|~{3,})\\s*([^`]*)$"
  blocks <- list()
  open <- NULL
  previous <- ""
  for (i in seq_along(lines)) {
    line <- lines[[i]]
    m <- regmatches(line, regexec(fence, line))[[1]]
    if (is.null(open)) {
      if (length(m)) {
        info <- trimws(m[[4]])
        open <- list(indent = nchar(m[[2]]), fence = m[[3]], line = i, body = character(),
                     language = tolower(sub(" .*", "", info)), marked = identical(trimws(previous), "<!-- cluster-only -->"))
      } else if (nzchar(trimws(line))) {
        previous <- line
      }
      next
    }
    closes <- length(m) && substr(m[[3]], 1, 1) == substr(open$fence, 1, 1) && nchar(m[[3]]) >= nchar(open$fence) &&
      !nzchar(trimws(m[[4]]))
    if (closes) {
      blocks[[length(blocks) + 1]] <- list(page = page, line = open$line, language = open$language,
                                           code = paste(open$body, collapse = "\n"), marked = open$marked)
      open <- NULL
      previous <- ""
    } else {
      body <- if (open$indent > 0 && !nzchar(trimws(substr(line, 1, open$indent)))) substring(line, open$indent + 1) else line
      open$body <- c(open$body, body)
    }
  }
  expect_null(open, label = sprintf("%s: a fence that never closes", page))
  blocks
}

r_blocks <- function() {
  root <- source_dir()
  blocks <- unlist(lapply(doc_pages(root), function(page) doc_blocks(root, page)), recursive = FALSE)
  Filter(function(block) identical(block$language, "r"), blocks)
}

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

test_that("every R block of the guides is marked cluster-only, parses, and calls tfbarrier with arguments it takes", {
  skip_if_no_core()  # the core's parameters, for what passes through `...`
  blocks <- r_blocks()
  expect_gt(length(blocks), 15)
  unmarked <- vapply(Filter(function(block) !block$marked, blocks), function(b) sprintf("%s:%d", b$page, b$line), "")
  expect_equal(unmarked, character(0), label = "R blocks without <!-- cluster-only -->")
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
