"""CPU pinning (cpus.py): the tasks of a job on one host split the CPUs they share, and every thread of
each training process (TensorFlow's pools included) runs on its part."""

import json
import os

import pytest
from conftest import digits_cnn

import tfbarrier
from tfbarrier import cpus


def peer(host, cpus):
    return {"host": host, "port": 1, "cpus": cpus}


def test_tasks_that_share_a_hosts_cpus_split_them_in_task_order():
    four = [0, 1, 2, 3]
    assert [cpus.share([peer("a", four)] * 2, i) for i in (0, 1)] == [[0, 1], [2, 3]]
    assert [cpus.share([peer("a", four)] * 3, i) for i in (0, 1, 2)] == [[0, 1], [2], [3]]
    mixed = [peer("a", four), peer("b", four), peer("a", four)]  # worker 1 is alone on its host
    assert [cpus.share(mixed, i) for i in (0, 1, 2)] == [[0, 1], None, [2, 3]]


def test_tasks_alone_on_their_cpus_are_not_pinned():
    assert cpus.share([peer("a", [0, 1])], 0) is None
    assert cpus.share([peer("a", [0, 1]), peer("a", [2, 3])], 0) is None  # two containers' cpusets
    assert cpus.share([peer("a", [0])] * 2, 1) is None  # fewer CPUs than tasks
    assert cpus.share([peer("a", None)] * 2, 0) is None  # an OS that cannot tell


def record_affinity(directory):
    """A callbacks factory (it runs in each training process once TensorFlow has started its thread
    pools): notes the CPUs of every thread of the process."""

    def factory():
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        threads = {sorted_cpus for sorted_cpus in (
            tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task"))}
        with open(os.path.join(directory, f"worker-{index}.json"), "w") as f:
            json.dump(sorted(threads), f)
        return []

    return factory


@pytest.mark.parametrize("pin", [True, False])
def test_each_training_process_runs_on_its_part_of_the_cpus(spark, digits_df, tmp_path, pin):
    if not pin:
        spark.conf.set("spark.tfbarrier.pinCpus", "false")
    try:
        result = tfbarrier.fit(digits_df.limit(256), digits_cnn(), features="pixels", label="digit", epochs=1,
                               batch_size=64, num_workers=2, callbacks=record_affinity(str(tmp_path)), verbose=0)
    finally:
        spark.conf.unset("spark.tfbarrier.pinCpus")
    seen = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in (0, 1)]
    mine = sorted(os.sched_getaffinity(0))  # local mode: the tasks have the driver's CPUs
    if len(mine) < 2:
        pytest.skip("one CPU: nothing to split")
    if not pin:
        assert [w["cpus"] for w in result.workers] == [None, None]
        assert seen == [[mine], [mine]]
        return
    parts = [[int(c) for c in w["cpus"].split(",")] for w in result.workers]
    assert parts == [cpus.share([peer("h", mine)] * 2, i) for i in (0, 1)]
    assert seen == [[parts[0]], [parts[1]]]  # every thread of each process, on its part only
