"""Beam's private names: used in one module only, and each use still works with this Beam.

Two kinds of test:

- the count: outside ``beam_pipelines/engines/beam_internals.py`` (and this file, whose contract
  tests touch what the module fences), the project's source uses no private Beam name
  (``tests/beam_private_uses.py`` finds them with ``ast``; it is tested here on snippets);
- a contract per accessor of ``beam_internals``: it runs the accessor against the installed Beam
  and fails naming the Beam change and the accessor to revisit. A Beam upgrade starts here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import apache_beam
import pytest

from beam_pipelines.engines import beam_internals
from beam_pipelines.engines.beam_internals import BeamInternalChanged, changed
from tests.beam_private_uses import beam_private_names, private_uses, project_private_names

REPO = Path(__file__).resolve().parent.parent
FENCE = "beam_pipelines/engines/beam_internals.py"
# The fence itself, this file (its contract tests patch and call what the fence uses) and the
# finder (which names what it looks for).
NOT_COUNTED = {FENCE, "tests/test_beam_internals.py", "tests/beam_private_uses.py"}
# Accessors and helpers of the fence that are not themselves a private use.
HELPERS = {"BeamInternalChanged", "beam_version", "changed", "WORKER_CHANNEL_OPTIONS"}


def _project_sources() -> dict[str, str]:
    """Every Python file of the checkout (its venvs and build output left out)."""
    sources = {}
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if any(p.startswith((".", "build", "dist")) or p == "__pycache__" for p in parts[:-1]):
            continue
        sources["/".join(parts)] = path.read_text(encoding="utf-8")
    return sources


# -- the finder, on snippets ------------------------------------------------------------------

_BEAM_ONLY = {"_job_id", "_cleanup_callbacks"}


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ("from apache_beam.runners.common import _OutputHandler\n", "import of _OutputHandler"),
        (
            "from apache_beam.runners.dask import overrides as o\nx = o._Create\n",
            "o._Create (an attribute of a Beam import)",
        ),
        (
            "import apache_beam.options.pipeline_options as po\npo._BeamArgumentParser()\n",
            "po._BeamArgumentParser",
        ),
        (
            "from apache_beam.runners.portability.fn_api_runner import worker_handlers\n"
            "worker_handlers.SUBPROCESS_LOCK = object()\n",
            "assignment to worker_handlers.SUBPROCESS_LOCK",
        ),
        (
            "from apache_beam.runners.worker import worker_pool_main as a\n"
            "import apache_beam.utils.subprocess_server as b\n"
            "for m in (a, b):\n    m.subprocess = None\n",
            "assignment to m.subprocess",
        ),
        (
            "from apache_beam.io.filesystems import FileSystems\n"
            "o = getattr(FileSystems, '_pipeline_options', None)\n",
            "getattr(FileSystems, '_pipeline_options')",
        ),
        (
            "import apache_beam as beam\ndef f(result):\n    return result._job_id\n",
            "result._job_id (a private attribute Beam defines)",
        ),
        (
            "import apache_beam as beam\ndef f(result):\n    return getattr(result, '_job_id')\n",
            "getattr(result, '_job_id')",
        ),
        (
            "from apache_beam.runners.worker import worker_pool_main\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(worker_pool_main, 'x', 1)\n",
            "monkeypatch.setattr(worker_pool_main, 'x')",
        ),
    ],
    ids=[
        "import",
        "module-attribute",
        "import-as",
        "module-assignment",
        "loop-over-modules",
        "getattr-private",
        "beam-attribute-on-any-object",
        "getattr-beam-attribute",
        "monkeypatch-setattr",
    ],
)
def test_the_finder_finds_each_kind_of_private_use(snippet, expected):
    found = [str(use) for use in private_uses(snippet, "snippet.py", _BEAM_ONLY)]
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "snippet",
    [
        "import apache_beam as beam\nbeam.Create([1])\n",  # public names
        "import os\nos._exit\n",  # not Beam's
        "import apache_beam\nclass A:\n    def f(self):\n        return self._job_id\n",  # own
        "def f(result):\n    return result._job_id\n",  # a module without Beam
        "from apache_beam.io.filesystems import FileSystems\nFileSystems.__name__\n",  # dunder
    ],
    ids=["public", "not-beam", "own-attribute", "no-beam-import", "dunder"],
)
def test_the_finder_leaves_public_and_foreign_names_alone(snippet):
    assert private_uses(snippet, "snippet.py", _BEAM_ONLY) == []


def test_no_private_beam_name_is_used_outside_the_fence():
    sources = _project_sources()
    assert FENCE in sources and "beam_pipelines/engines/dask_runner.py" in sources
    beam_only = beam_private_names(Path(apache_beam.__file__).parent) - project_private_names(
        sources.values()
    )
    uses = [
        str(use)
        for path, text in sorted(sources.items())
        if path not in NOT_COUNTED
        for use in private_uses(text, path, beam_only)
    ]
    assert uses == [], (
        f"{len(uses)} uses of Beam's private names outside {FENCE}; move each behind an "
        "accessor there (with why no public way exists and a contract test here), or use "
        "Beam's public API:\n" + "\n".join(uses)
    )


# -- one contract per accessor ----------------------------------------------------------------


def _new_output_handler() -> None:
    from apache_beam.runners.common import Receiver

    class Collect(Receiver):
        def receive(self, windowed_value):
            pass

    handler = beam_internals.new_output_handler(None, {None: Collect(), "tag": Collect()})
    if not callable(getattr(handler, "handle_process_outputs", None)):
        raise AttributeError("no handle_process_outputs")


def _side_input_view_options() -> None:
    from apache_beam.transforms.sideinputs import SideInputMap
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue

    pipeline = apache_beam.Pipeline()
    side = apache_beam.pvalue.AsList(pipeline | apache_beam.Create([1, 2]))
    options = beam_internals.side_input_view_options(side)
    values = [WindowedValue(v, 0, [GlobalWindow()]) for v in (1, 2)]
    view = SideInputMap(type(side), options, values)[GlobalWindow()]
    if list(view) != [1, 2]:
        raise ValueError(f"the list view holds {view!r}")


def _filesystems_options() -> None:
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    previous = beam_internals.filesystems_options()
    options = PipelineOptions(["--s3_endpoint_url", "http://127.0.0.1:1"])
    FileSystems.set_options(options)
    try:
        if beam_internals.filesystems_options() is not options:
            raise ValueError("not the options given to FileSystems.set_options")
    finally:
        FileSystems.set_options(previous)


def _start_loopback_workers_in_own_process_group(tmp_path: Path) -> None:
    from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2
    from apache_beam.runners.worker import worker_pool_main

    beam_internals.start_loopback_workers_in_own_process_group()
    out = tmp_path / "worker"
    # A stand-in SDK worker that writes its pid and process group (/proc/PID/stat's 5th field).
    script = tmp_path / "worker.sh"
    script.write_text(f"#!/bin/sh\necho $$ $(cut -d' ' -f5 /proc/$$/stat) > {out}\n")
    script.chmod(0o755)
    pool = worker_pool_main.BeamFnExternalWorkerPoolServicer(
        use_process=True, container_executable=str(script)
    )
    endpoint = endpoints_pb2.ApiServiceDescriptor(url="localhost:1")
    request = beam_fn_api_pb2.StartWorkerRequest(worker_id="contract", control_endpoint=endpoint)
    response = pool.StartWorker(request, None)
    if response.error:
        raise RuntimeError(response.error)
    deadline = time.monotonic() + 10
    while not (out.exists() and out.read_text().count(" ") == 1):
        if time.monotonic() > deadline:
            raise TimeoutError("the worker pool started no worker")
        time.sleep(0.05)
    pid, group = out.read_text().split()
    if pid != group:
        raise ValueError(f"the worker {pid} ran in process group {group}, not its own")


# Run in a fresh process after the code under test: a gRPC channel's options as the SDK
# harness opens one, and a bundle's data output after the bundle.
_WORKER_PROBE = """
import grpc
seen = []
grpc.insecure_channel = lambda target, options=None: seen.append(options)
from apache_beam.runners.worker.channel_factory import GRPCChannelFactory
GRPCChannelFactory.insecure_channel("localhost:1")
print("channel", repr(seen[0]))

from apache_beam.coders import coders
from apache_beam.runners.common import NameContext
from apache_beam.runners.worker import bundle_processor, data_plane, statesampler
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.counters import CounterFactory
from apache_beam.utils.windowed_value import WindowedValue

counters = CounterFactory()
output = bundle_processor.DataOutputOperation(
    NameContext("out"), None, {}, counters, statesampler.StateSampler("probe", counters),
    coders.WindowedValueCoder(coders.BytesCoder()), "out", None,
)
sent = []
output.set_output_stream(data_plane.ClosableOutputStream.create(sent.append, sent.append, 0))
output.start()
output.process(WindowedValue(b"x" * 100_000, 0, [GlobalWindow()]))
output.finish()
print("sent", sum(map(len, sent)), "kept", type(output.output_stream).__name__)
"""


def _probe_worker(tmp_path: Path, preparation: str) -> str:
    """``_WORKER_PROBE``'s output after ``preparation`` (Python code), in a fresh process."""
    probe = tmp_path / "probe.py"
    probe.write_text(preparation + "\n" + _WORKER_PROBE)
    run = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(run.stderr[-2000:])
    return run.stdout


def _check_prepared(out: str) -> None:
    for option in beam_internals.WORKER_CHANNEL_OPTIONS:
        if repr(option) not in out:
            raise ValueError(f"{option} is not among a worker channel's options: {out}")
    # 100,000 bytes, their length and the window: all sent, and no stream (its buffer) kept.
    if "sent 100017 kept NoneType" not in out:
        raise ValueError(f"a finished bundle's data output kept its stream: {out}")


def _prepare_sdk_worker(tmp_path: Path) -> None:
    prepare = "from beam_pipelines.engines.beam_internals import prepare_sdk_worker\n"
    _check_prepared(_probe_worker(tmp_path, prepare + "prepare_sdk_worker()\nprepare_sdk_worker()"))


def _with_worker_preparation(tmp_path: Path) -> None:
    from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2
    from apache_beam.runners.worker import worker_pool_main

    # The command Beam's pool starts a LOOPBACK SDK worker with, as this module rewrites it.
    started: list = []
    pool = worker_pool_main.BeamFnExternalWorkerPoolServicer(use_process=True)
    popen = subprocess.Popen
    subprocess.Popen = lambda command, *a, **k: started.append(command)  # type: ignore[assignment,misc]
    try:
        beam_internals.start_loopback_workers_in_own_process_group()
        endpoint = endpoints_pb2.ApiServiceDescriptor(url="localhost:1")
        request = beam_fn_api_pb2.StartWorkerRequest(worker_id="w", control_endpoint=endpoint)
        pool.StartWorker(request, None)
    finally:
        subprocess.Popen = popen  # type: ignore[misc]
    command = started[0] if started else []
    if len(command) != 3 or "prepare_sdk_worker" not in str(command[2]):
        raise ValueError(f"the worker's command was not rewritten: {command}")
    # The code before Beam's own readies the process as prepare_sdk_worker does.
    _check_prepared(
        _probe_worker(tmp_path, str(command[2]).split("from apache_beam.runners.worker")[0])
    )


@pytest.mark.parametrize(
    "preparation, failure",
    [
        ("", "is not among a worker channel's options"),
        (  # the channel options alone: Beam's data outputs keep their streams
            "from apache_beam.runners.worker import channel_factory\n"
            "from beam_pipelines.engines.beam_internals import WORKER_CHANNEL_OPTIONS\n"
            "channel_factory.GRPCChannelFactory.DEFAULT_OPTIONS.extend(WORKER_CHANNEL_OPTIONS)",
            "a finished bundle's data output kept its stream",
        ),
    ],
)
def test_a_worker_short_of_the_preparation_fails_its_check(tmp_path, preparation, failure):
    with pytest.raises(ValueError, match=failure):
        _check_prepared(_probe_worker(tmp_path, preparation))


def _runner_buffer_peaks() -> None:
    from beam_pipelines.engines.runners import InProcessRunner

    with beam_internals.runner_buffer_peaks() as peaks:
        with apache_beam.Pipeline(runner=InProcessRunner()) as pipeline:
            _ = (
                pipeline
                | apache_beam.Create([(i % 3, i) for i in range(30)])
                | apache_beam.GroupByKey()
            )
    if not peaks.get("<total>") or not any(name.startswith("GBK ") for name in peaks):
        raise ValueError(f"nothing measured: {peaks}")


def _tfrecord_frame() -> None:
    import io

    from schemas.framing import write_frame

    ours = io.BytesIO()
    write_frame(ours, b"payload")
    if beam_internals.tfrecord_frame(b"payload") != ours.getvalue():
        raise ValueError("Beam frames records differently from schemas.framing")


# accessor -> (the private Beam name it uses, its contract; those taking a path get tmp_path)
CONTRACTS: dict[str, tuple[str, Callable[..., None]]] = {
    "new_output_handler": ("apache_beam.runners.common._OutputHandler", _new_output_handler),
    "side_input_view_options": (
        "apache_beam.pvalue.AsSideInput._view_options",
        _side_input_view_options,
    ),
    "filesystems_options": (
        "apache_beam.io.filesystems.FileSystems._pipeline_options",
        _filesystems_options,
    ),
    "start_loopback_workers_in_own_process_group": (
        "apache_beam.runners.worker.worker_pool_main.subprocess",
        _start_loopback_workers_in_own_process_group,
    ),
    "prepare_sdk_worker": (
        "apache_beam.runners.worker.channel_factory.GRPCChannelFactory.DEFAULT_OPTIONS, "
        "apache_beam.runners.worker.bundle_processor.DataOutputOperation.finish",
        _prepare_sdk_worker,
    ),
    "with_worker_preparation": (
        "worker_pool_main's LOOPBACK worker command",
        _with_worker_preparation,
    ),
    "runner_buffer_peaks": (
        "apache_beam.runners.portability.fn_api_runner (FnApiRunner._execute_bundle, "
        "BundleContextManager.get_buffer, GroupingBuffer.append, ListBuffer._inputs)",
        _runner_buffer_peaks,
    ),
    "tfrecord_frame": ("apache_beam.io.tfrecordio._TFRecordUtil", _tfrecord_frame),
}


def test_every_accessor_of_the_fence_has_a_contract():
    accessors = set(beam_internals.__all__) - HELPERS
    assert accessors == set(CONTRACTS), (
        f"accessors without a contract test here: {sorted(accessors - set(CONTRACTS))}; "
        f"contracts of accessors that are gone: {sorted(set(CONTRACTS) - accessors)}"
    )


@pytest.mark.parametrize("accessor", sorted(CONTRACTS))
def test_beam_still_has_what_the_accessor_uses(accessor, tmp_path, monkeypatch):
    from apache_beam.runners.worker import worker_pool_main

    # The accessor that replaces worker_pool_main's subprocess: restored after the test.
    monkeypatch.setattr(worker_pool_main, "subprocess", subprocess)
    beam_name, contract = CONTRACTS[accessor]
    takes_path = contract.__code__.co_argcount == 1
    try:
        contract(tmp_path) if takes_path else contract()
    except BeamInternalChanged as e:  # the accessor's own message
        raise AssertionError(str(e)) from e
    except Exception as e:
        raise AssertionError(str(changed(beam_name, accessor, f"{type(e).__name__}: {e}"))) from e


def test_a_broken_contract_names_the_beam_change_and_the_accessor(monkeypatch):
    from apache_beam.io.filesystems import FileSystems

    monkeypatch.delattr(FileSystems, "_pipeline_options")
    with pytest.raises(BeamInternalChanged) as raised:
        beam_internals.filesystems_options()
    message = str(raised.value)
    assert "apache_beam.io.filesystems.FileSystems._pipeline_options is gone or changed" in message
    assert f"apache-beam {apache_beam.__version__}" in message
    assert message.endswith("see beam_internals.filesystems_options")


@pytest.mark.skipif(os.name != "posix", reason="process groups and /bin/sh")
def test_multi_processing_workers_start_with_ctrl_c_ignored(tmp_path):
    """The in-process runner's ``multi_processing`` workers ignore SIGINT (no private name)."""
    from beam_pipelines.engines.runners import SHIELDED_SDK_WORKER

    command = SHIELDED_SDK_WORKER.replace("-m apache_beam.runners.worker.sdk_worker_main", "-c")
    probe = command + " 'import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)'"
    out = subprocess.run(probe, shell=True, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True", out
    assert sys.executable in SHIELDED_SDK_WORKER
