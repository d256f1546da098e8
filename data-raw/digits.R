# Makes data/digits.rda from scikit-learn's bundled 8x8 digits (run from the repository root with the
# project's Python: TFBARRIER_PYTHON=.venv/bin/python Rscript data-raw/digits.R).
reticulate::use_python(Sys.getenv("TFBARRIER_PYTHON", ".venv/bin/python"), required = TRUE)
bunch <- reticulate::import("sklearn.datasets")$load_digits()
digits <- data.frame(digit = as.integer(bunch$target))
digits$pixels <- unname(bunch$data / 16)  # a matrix column: one flat 8x8 image per row, in [0, 1]
save(digits, file = "data/digits.rda", compress = "xz")
