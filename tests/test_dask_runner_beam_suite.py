"""Beam's own tests of its Dask runner, run unchanged against this project's Dask runner.

The test cases are the classes of ``apache_beam/runners/dask/dask_runner_test.py`` as installed
with Beam, imported, not copied, and subclassed here: each subclass's ``setUp`` runs Beam's
(which builds ``TestPipeline(runner=DaskRunner())`` with Beam's runner) and then puts in its
place the same pipeline with ``beam_pipelines.engines.dask_runner.DaskRunner``, sent to the
session's Dask cluster (``--dask_client_address``) instead of a new local cluster per test.
Every test body is Beam's, run as it is.

Why this way. Loading the file's source and substituting its import line would make a module
the Dask workers cannot import, so the functions and DoFns its pipelines define would travel
by value instead of by reference as an installed pipeline's do, and would depend on the text of
Beam's import lines. Replacing the module's global ``DaskRunner`` would patch a Beam module,
which this project counts as a private use of Beam (``tests/test_beam_internals.py``). What
this depends on instead is that Beam's ``setUp`` leaves the test's pipeline in
``self.pipeline`` with its runner; a check below fails naming that if it stops being so.

What the project's runner does not do is marked ``xfail(strict=True)`` below with its reason,
and listed in docs/pipeline.md (Runners: Beam's tests of the Dask runner). Strict: a test that
starts passing fails here, so the list cannot go stale.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask import dask_runner_test as beam_suite
from apache_beam.testing import test_pipeline

from beam_pipelines.engines.dask_runner import DaskRunner

# Beam's test name -> why this project's Dask runner fails it (and, with it, what it raises).
EXPECTED_FAILURES: dict[str, tuple[str, type[BaseException]]] = {
    "test_groupby_with_fixed_windows": (
        "the runner supports only the global window and refuses WindowInto(FixedWindows), "
        "naming the step (Beam's own Dask runner ignores windowing and passes)",
        NotImplementedError,
    ),
}
# Tests Beam marks @unittest.expectedFailure itself, and why this runner fails them too;
# unittest's own mark is already strict under pytest (an unexpected success fails the run).
BEAM_EXPECTED_FAILURES = {
    "test_pardo_windowed_side_inputs": "windowed side inputs (FixedWindows): global window only",
}


@pytest.fixture(autouse=True)
def _cluster_address(request: pytest.FixtureRequest) -> None:
    """The session's Dask cluster, for the runner's tests (not needed by the options' tests)."""
    if isinstance(request.instance, TestBeamDaskRunnerPipelines):
        request.instance.dask_address = request.getfixturevalue("dask_cluster").address


def _expected_to_fail(base: type, name: str) -> Callable[..., Any]:
    """Beam's test ``name`` of ``base`` marked xfail (strict), without marking Beam's function
    (a mark set on it would follow it to every class that uses it)."""
    test = getattr(base, name, None)
    if test is None:
        raise LookupError(
            f"{base.__module__}.{base.__qualname__} has no test {name!r} any more: "
            "remove it from EXPECTED_FAILURES in tests/test_dask_runner_beam_suite.py "
            "and docs/pipeline.md"
        )
    reason, raises = EXPECTED_FAILURES[name]

    @functools.wraps(test)
    def expected_failure(self: Any) -> None:
        test(self)

    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)(expected_failure)


class TestBeamDaskOptions(beam_suite.DaskOptionsTest):
    """Beam's tests of ``DaskOptions``, the option surface the project's runner keeps."""


class TestBeamDaskRunnerPipelines(beam_suite.DaskRunnerRunPipelineTest):
    """Beam's pipelines, run by the project's runner on the session's Dask cluster."""

    pytestmark = [pytest.mark.slow]
    dask_address = ""  # set by _cluster_address before setUp

    def setUp(self) -> None:
        super().setUp()
        beams = getattr(self, "pipeline", None)
        if not isinstance(getattr(beams, "runner", None), beam_suite.DaskRunner):
            raise AssertionError(
                f"{beam_suite.__name__}: setUp no longer leaves a TestPipeline with Beam's "
                f"DaskRunner in self.pipeline (found {beams!r}); update how "
                "tests/test_dask_runner_beam_suite.py swaps in the project's runner"
            )
        self.pipeline = test_pipeline.TestPipeline(
            runner=DaskRunner(),
            options=PipelineOptions([f"--dask_client_address={self.dask_address}"]),
        )

    def test_the_pipelines_run_on_the_projects_runner(self) -> None:
        # What every test of this class runs on: not Beam's runner, nor a local cluster.
        assert type(self.pipeline.runner) is DaskRunner
        assert self.pipeline.options.view_as(beam_suite.DaskOptions).address == self.dask_address
        assert self.dask_address.startswith("tcp://")


for _name in EXPECTED_FAILURES:
    setattr(
        TestBeamDaskRunnerPipelines,
        _name,
        _expected_to_fail(beam_suite.DaskRunnerRunPipelineTest, _name),
    )
for _name in BEAM_EXPECTED_FAILURES:
    _test = getattr(beam_suite.DaskRunnerRunPipelineTest, _name, None)
    if not getattr(_test, "__unittest_expecting_failure__", False):
        raise LookupError(
            f"Beam's {_name} is no longer marked expectedFailure: remove it from "
            "BEAM_EXPECTED_FAILURES in tests/test_dask_runner_beam_suite.py and docs/pipeline.md"
        )
