"""fit's arguments are said in two places (issue 73): api.fit's signature and documentation, and, for one that
becomes a FitJob field, that field with its check and whether MLflow records it (fitting/job.argument). The rest
follows from them: front.face binds a call to the signature, front.prepare checks each field's argument as the
field says, tracking records the fields marked so. These tests hold the two places, and what reads them, together;
R's faces are held to the signature by tests/testthat/test-arguments.R."""

import ast
import dataclasses
import inspect
import re

import tfbarrier
from tfbarrier.fitting import front
from tfbarrier.fitting.job import FitJob
from tfbarrier.tracking import fit as tracking_fit

PARAMETERS = {name: p for name, p in inspect.signature(tfbarrier.fit).parameters.items() if name != "unknown"}
ARGUMENTS = [field for field in dataclasses.fields(FitJob) if "check" in field.metadata]  # made with argument()


def _documented(function):
    """The names the Parameters section of ``function``'s docstring documents ("epochs, batch_size : int")."""
    section = function.__doc__.split("Parameters\n    ----------\n")[1].split("\n    Returns\n")[0]
    return {name.strip() for line in re.findall(r"^    (\w[\w, ]*) :", section, re.M) for name in line.split(",")}


def _read_by_name(function):
    """The argument names ``function`` reads from its ``arguments`` dict (``a["name"]``, ``arguments.pop("name")``)."""
    tree = ast.parse(inspect.getsource(function))
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("a", "arguments")
                and isinstance(node.slice, ast.Constant)):
            names.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pop"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "arguments" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def test_every_argument_of_fit_is_documented_and_no_other():
    assert sorted(set(PARAMETERS) ^ _documented(tfbarrier.fit)) == [], \
        "api.fit's parameters and its docstring's Parameters differ: document each, and only those"


def test_every_field_said_to_be_an_argument_is_one_with_the_same_default():
    for field in ARGUMENTS:
        assert field.name in PARAMETERS, f"FitJob.{field.name} is made with argument(), but fit takes no {field.name}"
        check = field.metadata["check"]
        if check is not None:  # what fit's default becomes is the field's default: a FitJob made without it agrees
            assert check(field.name, PARAMETERS[field.name].default) == field.default, field.name


def test_every_argument_reaches_the_driver_by_name_and_nothing_else_is_read():
    read = _read_by_name(front.call) | _read_by_name(front.prepare)
    checked = {field.name for field in ARGUMENTS if field.metadata["check"] is not None}
    assert sorted(set(PARAMETERS) - read - checked) == [], "fit arguments that front.call and prepare never read"
    assert sorted(read - set(PARAMETERS) - {"unknown"}) == [], "names read that are no argument of fit"


def test_mlflow_records_the_fields_marked_tracked_from_the_job_itself():
    source = inspect.getsource(tracking_fit.fit_params)
    assert 'field.metadata.get("tracked")' in source
    tracked = {field.name for field in dataclasses.fields(FitJob) if field.metadata.get("tracked")}
    assert {"epochs", "batch_size", "seed", "data_seed", "communication", "save_best"} <= tracked
    assert not tracked & {"save_to", "tensorboard_dir", "stall_timeout"}  # where, and how long, not what trained
