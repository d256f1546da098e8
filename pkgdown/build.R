# The R package's pkgdown site, built offline by `make docs` (into docs/r/, which mkdocs serves as site/r/).
#
# - No network: pkgdown does not look the package up on CRAN (pkgdown.internet), and downlit, which links
#   the code's package names (`library(sparklyr)`), reads the few packages the docs name from the table below
#   instead of downloading CRAN's package database.
# - No Spark, no TensorFlow: the reference's examples are not run, and the vignette's code is shown without
#   being run (TFBARRIER_VIGNETTE_EVAL=false; `make test-r` runs it when R CMD build knits the vignette).
# - Warnings fail the build.
options(pkgdown.internet = FALSE, warn = 2)
Sys.setenv(TFBARRIER_VIGNETTE_EVAL = "false")
linked <- data.frame(
  Package = c("sparklyr", "dplyr", "keras3", "reticulate", "testthat", "knitr"),
  URL = c("https://spark.posit.co/", "https://dplyr.tidyverse.org", "https://keras3.posit.co/",
          "https://rstudio.github.io/reticulate/", "https://testthat.r-lib.org", "https://yihui.org/knitr/"),
  stringsAsFactors = FALSE
)
utils::assignInNamespace("CRAN_urls", function() linked, "downlit")
pkgdown::build_site(".", examples = FALSE, devel = TRUE, new_process = FALSE, preview = FALSE)
