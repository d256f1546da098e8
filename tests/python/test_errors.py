"""A task's error reaches the driver as the same class with the same fields."""

from tfbarrier import errors


def test_worker_error_survives_the_trip_through_spark_failure_text():
    sent = errors.WorkerError("worker 1 on host-a failed: ValueError: boom", worker=1, host="host-a",
                              exc_type="ValueError", log="line 1\nline 2")
    spark_text = f"org.apache.spark.SparkException: Job aborted.\nRuntimeError: {errors.encode(sent)}\n\tat ..."
    received = errors.decode(spark_text)
    assert type(received) is errors.WorkerError
    assert (received.worker, received.host, received.exc_type, received.log) == (1, "host-a", "ValueError", "line 1\nline 2")
    assert "worker 1 on host-a failed: ValueError: boom" in str(received)
    assert "line 2" in str(received)


def test_validation_error_class_is_kept():
    received = errors.decode("... " + errors.encode(errors.ColumnError("label column 'y' has null values")))
    assert type(received) is errors.ColumnError and str(received) == "label column 'y' has null values"


def test_text_without_a_tfbarrier_error_decodes_to_none():
    assert errors.decode("java.lang.OutOfMemoryError") is None


def test_a_timeout_keeps_answering_to_its_former_name_in_python_and_r():
    error = errors.JobTimeoutError("ran past its timeout")
    assert isinstance(error, errors.FitTimeoutError)
    assert errors.class_names(error) == ["JobTimeoutError", "FitTimeoutError", "TfBarrierError"]


def test_a_lost_worker_travels_as_a_retryable_worker_error_naming_its_host_with_the_abort_as_context():
    seen = errors.WorkerError("worker 0 on host-a failed: UnavailableError: Collective ops is aborted by: ...",
                              worker=0, host="host-a", exc_type="UnavailableError")
    sent = errors.WorkerLostError.of(1, "host-b", "its host stopped answering during the job", consequence=seen)
    received = errors.decode("RuntimeError: " + errors.encode(sent))
    assert type(received) is errors.WorkerLostError and isinstance(received, errors.WorkerError)
    assert (received.worker, received.host, received.retryable) == (1, "host-b", True)
    cause, context = str(received).split("\n--- what the workers that remained saw, as a consequence ---\n")
    assert cause.startswith("worker 1 on host-b was lost: its host stopped answering")
    assert context == str(seen)
    assert errors.class_names(received)[:2] == ["WorkerLostError", "WorkerError"]
