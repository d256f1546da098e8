"""What the tests use that is not a test: driver programs that need a Python (and a Spark) of their own,
run with ``conftest.run_driver`` (``*_fit.py``, ``*_driver.py``, ``concurrent_fits.py``), fault injection
(``faults``), a standalone cluster (``standalone``), several hosts on one machine in network namespaces
(``hosts``: tests/python/test_hosts.py, and bench/ with tests/python on its path) and Spark's fake GPU
discovery script (``fake_gpus.sh``)."""
