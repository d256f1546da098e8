# The guides' R blocks, for test-docs.R (their calls checked) and test-docs-examples.R (those marked with spark run).
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
# above the fence is the cluster-only marker, and the scene a `<!-- with spark: SCENE -->` marker names ("" for
# `<!-- with spark -->`; NULL: no such marker).
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
        spark <- regmatches(trimws(previous), regexec("^<!-- with spark(: ([[:alnum:]_-]+))? -->$", trimws(previous)))[[1]]
        open <- list(indent = nchar(m[[2]]), fence = m[[3]], line = i, body = character(),
                     language = tolower(sub(" .*", "", info)), marked = identical(trimws(previous), "<!-- cluster-only -->"),
                     scene = if (length(spark)) spark[[3]] else NULL)
      } else if (nzchar(trimws(line))) {
        previous <- line
      }
      next
    }
    closes <- length(m) && substr(m[[3]], 1, 1) == substr(open$fence, 1, 1) && nchar(m[[3]]) >= nchar(open$fence) &&
      !nzchar(trimws(m[[4]]))
    if (closes) {
      blocks[[length(blocks) + 1]] <- list(page = page, line = open$line, language = open$language,
                                           code = paste(open$body, collapse = "\n"), marked = open$marked,
                                           scene = open$scene)
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
