"""UDF resources: declared, overridden, pickled, turned into Ray options; infeasible requests."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.backfill.udfs import Splitter, n_words, ran_on_b
from tokenloom.backfill import load_udf, udf
from tokenloom.backfill.resources import Resources, infeasible
from tokenloom.errors import TokenloomError


def test_declared_resources_become_ray_options():
    assert n_words.resources.ray_options() == {"num_cpus": 1}  # one CPU by default
    assert ran_on_b.resources.ray_options() == {
        "num_cpus": 1,
        "resources": {"tokenloom_test_b": 1},
    }

    @udf(
        inputs=["text"],
        output=pa.field("e", pa.int8()),
        version="1",
        num_cpus=2,
        num_gpus=0.5,
        memory=1 << 30,
        resources={"a100": 1},
    )
    def heavy(batch):
        return pa.nulls(batch.num_rows, pa.int8())

    assert heavy.resources.ray_options() == {
        "num_cpus": 2,
        "num_gpus": 0.5,
        "memory": 1 << 30,
        "resources": {"a100": 1},
    }
    assert heavy.resources.demand() == {"CPU": 2, "GPU": 0.5, "memory": 2**30, "a100": 1}


def test_resources_are_not_identity_and_survive_copies_and_pickling():
    gpu = Splitter.with_resources(num_gpus=1, resources={"a100": 1})
    assert gpu.fingerprint() == Splitter.fingerprint()  # results are reused across resources
    bound = gpu.bind(lower=True).with_output(gpu.output)
    assert bound.resources == Resources(num_gpus=1, custom={"a100": 1})
    clone = pickle.loads(pickle.dumps(bound))  # by reference, resources carried along
    assert clone.resources == bound.resources and clone.kwargs == {"lower": True}
    assert pickle.loads(pickle.dumps(Splitter)).resources == Resources()
    # None keeps the declared value; resources= replaces the custom ones
    assert ran_on_b.with_resources(num_cpus=2).resources.custom == {"tokenloom_test_b": 1}
    assert ran_on_b.with_resources(resources={}).resources.custom == {}
    assert load_udf("tests.backfill.udfs:ran_on_b").resources == ran_on_b.resources


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_cpus": -1}, "num_cpus=-1 must be a finite number >= 0"),
        ({"num_gpus": float("nan")}, "num_gpus=nan"),
        ({"memory": 1.5}, "memory=1.5 must be whole bytes"),
        ({"custom": {"a100": "one"}}, "a100='one' must be a finite number"),
        ({"custom": {"GPU": 1}}, "'GPU' is built in; pass num_gpus= instead"),
        ({"custom": ["a100"]}, "must map names to amounts"),
    ],
)
def test_bad_requests_are_refused_with_the_value(kwargs, match):
    with pytest.raises(TokenloomError, match=match):
        Resources(**kwargs)


def test_infeasible_when_no_single_node_has_it_all():
    nodes = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 1.0, "a100": 2.0}]
    assert not infeasible({"CPU": 1.0}, nodes)
    assert not infeasible({"CPU": 1.0, "a100": 2.0}, nodes)
    assert infeasible({"CPU": 2.0, "a100": 1.0}, nodes)  # each half exists, on other nodes
    assert infeasible({"GPU": 2.0}, nodes)
    assert infeasible({"CPU": 1.0}, [])


def test_cli_resources_must_be_a_json_object(tmp_path):
    from tokenloom.cli.main import cli

    args = ["backfill", "run", "--table", str(tmp_path / "t.lance"), "--udf", "x:y"]
    out = CliRunner().invoke(cli, [*args, "--resources", "a100=1"])
    assert out.exit_code == 2 and "expected a JSON object" in out.output
