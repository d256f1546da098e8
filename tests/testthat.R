library(testthat)
library(tfbarrier)

test_check("tfbarrier")
