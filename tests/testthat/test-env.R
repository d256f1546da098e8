test_that("tf_env builds the Python core's PythonEnv, content-hashed by its requirements", {
  skip_if_no_tfbarrier()
  env <- tf_env(c("tensorflow-cpu==2.21.*", "tf-keras==2.21.*"), workon_home = tempdir(), no_index = TRUE,
                find_links = "/wheels", system_site_packages = TRUE)
  expect_s3_class(env, "tfbarrier.spark.environment.PythonEnv")
  expect_equal(unlist(env$requirements), c("tensorflow-cpu==2.21.*", "tf-keras==2.21.*"))
  expect_true(env$no_index)
  expect_equal(env$key(), tf_env(rev(c("tensorflow-cpu==2.21.*", "tf-keras==2.21.*")), workon_home = tempdir(),
                                 no_index = TRUE, find_links = "/wheels", system_site_packages = TRUE)$key())
  expect_error(tf_env(archive = "/no/such/env.tar.gz"), "no environment archive", class = "InvalidArgumentError")
})
