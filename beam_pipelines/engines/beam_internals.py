"""The one module where the project uses Apache Beam's private names.

Everything else in the project calls Beam's public API. Where no public way exists, the private
use lives here behind an accessor, with a line saying why there is no public way, and
``tests/test_beam_internals.py`` holds a contract test for each that fails naming the Beam
change (a renamed class, a changed signature) when a Beam release breaks it. A Beam upgrade
therefore starts with that test file: what it reports is everything here to revisit.

Sections are per user of the private names; each lists its accessors in ``__all__``.
"""

from __future__ import annotations

import contextlib
import subprocess
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "BeamInternalChanged",
    "beam_version",
    "changed",
    "filesystems_options",
    "new_output_handler",
    "runner_buffer_peaks",
    "side_input_view_options",
    "tfrecord_frame",
    "start_loopback_workers_in_own_process_group",
    "prepare_sdk_worker",
    "with_worker_preparation",
    "WORKER_CHANNEL_OPTIONS",
]


class BeamInternalChanged(RuntimeError):
    """A private Beam name this module relies on is gone or behaves differently."""


def beam_version() -> str:
    """The installed apache-beam's version, for messages."""
    import apache_beam

    return str(apache_beam.__version__)


def changed(beam_name: str, accessor: str, detail: str = "") -> BeamInternalChanged:
    """The error for ``beam_name`` (used by ``accessor`` of this module) having moved."""
    more = f" ({detail})" if detail else ""
    return BeamInternalChanged(
        f"{beam_name} is gone or changed signature in apache-beam {beam_version()}{more}: see "
        f"beam_internals.{accessor}"
    )


# -- beam_pipelines.engines.dask_runner: running a DoFn over a Dask partition ----------------


def new_output_handler(window_fn: Any, receivers: Mapping[str | None, Any]) -> Any:
    """An output handler for ``DoFnInvoker.create_invoker`` that sends a DoFn's outputs to
    ``receivers`` (``None``: the main output; a tag: that tagged output).

    Why private: ``DoFnInvoker.create_invoker`` (public) needs an ``OutputHandler``, and the
    only one Beam ships is ``apache_beam.runners.common._OutputHandler``; the public
    ``DoFnRunner`` that builds one itself also builds a ``DoFnSignature`` per bundle (about
    2 ms), which the Dask runner builds once per step and process instead.

    Raises:
      BeamInternalChanged: ``_OutputHandler`` is gone or takes other keywords.
    """
    name = "apache_beam.runners.common._OutputHandler"
    try:
        from apache_beam.runners.common import _OutputHandler

        return _OutputHandler(
            window_fn=window_fn,
            main_receivers=receivers[None],
            tagged_receivers=receivers,
            per_element_output_counter=None,
            output_batch_converter=None,
            process_yields_batches=False,
            process_batch_yields_elements=False,
        )
    except (ImportError, TypeError) as e:
        raise changed(name, "new_output_handler", str(e)) from e


def side_input_view_options(side: Any) -> dict[str, Any]:
    """The view options ``SideInputMap(type(side), options, values)`` needs to turn a side
    input's values into its view (a list, a dict, a singleton...).

    Why private: ``apache_beam.transforms.sideinputs.SideInputMap`` (what runners hand a
    DoFn) takes them, and the only way to get them is ``AsSideInput._view_options()``,
    documented as "intended for internal use by runner implementations".

    Raises:
      BeamInternalChanged: ``AsSideInput._view_options`` is gone.
    """
    try:
        options: dict[str, Any] = side._view_options()
    except AttributeError as e:
        raise changed("AsSideInput._view_options", "side_input_view_options", str(e)) from e
    return options


# -- beam_pipelines.engines.filesystems: the options Beam's FileSystems were configured with -----


def filesystems_options() -> Any | None:
    """The ``PipelineOptions`` Beam handed ``FileSystems.set_options`` in this process (on a
    worker: the pipeline's), or None when none were set.

    Why private: ``FileSystems.set_options`` (public) keeps them as
    ``FileSystems._pipeline_options`` and Beam has no getter; the pipeline's storage helpers
    (``objstore`` stores configured by ``filesystems.storage_settings``) need the same endpoint
    and credentials options as Beam's own filesystems in every process, launcher and workers.

    Raises:
      BeamInternalChanged: ``FileSystems`` no longer has the attribute.
    """
    from apache_beam.io.filesystems import FileSystems

    if not hasattr(FileSystems, "_pipeline_options"):
        raise changed(
            "apache_beam.io.filesystems.FileSystems._pipeline_options", "filesystems_options"
        )
    return FileSystems._pipeline_options


# -- beam_pipelines.engines.portable: LOOPBACK SDK worker processes: out of Ctrl-C's reach, their
# gRPC receive window and their output buffers

_WORKER_POOL_SUBPROCESS = "apache_beam.runners.worker.worker_pool_main.subprocess"
_DATA_OUTPUT_FINISH = "apache_beam.runners.worker.bundle_processor.DataOutputOperation.finish"


class _PopenInOwnProcessGroup:
    """``subprocess`` as ``worker_pool_main`` sees it: ``Popen`` starts a process group, and a
    Python SDK worker prepared by ``prepare_sdk_worker`` (``with_worker_preparation``)."""

    def __getattr__(self, name: str) -> object:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: Any, *rest: Any, **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("process_group", 0)
        return subprocess.Popen(with_worker_preparation(args), *rest, **kwargs)


# gRPC's HTTP/2 receive window in the SDK workers: fixed at 4 MB a stream instead of grown by
# gRPC's bandwidth-delay probe. With the probe (Beam's default) the window grows with the rate
# the runner sends at, and on Flink, whose batch runner sends a task's whole partition to one
# bundle, a worker's memory in use grew with the images: 491 -> 834 MB a worker from 1 M to 3 M
# simulated images on 6 slots. With a fixed 4 MB window: 518 -> 598 MB (1.15x) at the same CPU
# per image; with the probe off and gRPC's 64 KB window, 1.47x the CPU (docs/benchmarks.md).
WORKER_CHANNEL_OPTIONS = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4 << 20))
_LOOPBACK_WORKER_CODE = "from apache_beam.runners.worker.sdk_worker import SdkHarness"
_WORKER_PREAMBLE = (
    "from beam_pipelines.engines.beam_internals import prepare_sdk_worker as _prepare; _prepare(); "
)


def prepare_sdk_worker() -> None:
    """Readies this process to be a Python SDK worker, before its harness starts: every gRPC
    channel it opens gets ``WORKER_CHANNEL_OPTIONS``, and each data output of a bundle lets its
    buffer go when the bundle ends. Idempotent.

    Why private: the channel options are Beam's (``GRPCChannelFactory.DEFAULT_OPTIONS``, which
    every channel of the SDK harness gets), and no pipeline option reaches them. The buffers:
    a bundle's data output (``bundle_processor.DataOutputOperation``) encodes into one stream
    that grows to its largest flush (past Beam's 10 MB flush threshold: 16 or 32 MB), and after
    the bundle the closed stream stays on the operation while Beam caches the bundle processor
    for the stage's next bundle (up to two minutes idle); no option frees it. On Spark, at 1 M
    simulated images, such buffers were 344 of an SDK worker's 677 MB in use at its peak
    (memray; docs/benchmarks.md).

    Raises:
      BeamInternalChanged: the harness's channel options or data outputs moved.
    """
    from apache_beam.runners.worker import bundle_processor, channel_factory

    options = getattr(channel_factory.GRPCChannelFactory, "DEFAULT_OPTIONS", None)
    if not isinstance(options, list):
        raise changed(
            "apache_beam.runners.worker.channel_factory.GRPCChannelFactory.DEFAULT_OPTIONS",
            "prepare_sdk_worker",
        )
    options.extend(o for o in WORKER_CHANNEL_OPTIONS if o not in options)
    output = getattr(bundle_processor, "DataOutputOperation", None)
    finish = getattr(output, "finish", None)
    if finish is None or not hasattr(output, "set_output_stream"):
        raise changed(_DATA_OUTPUT_FINISH, "prepare_sdk_worker")
    if getattr(finish, "releases_output_stream", False):
        return

    def finish_and_release(self: Any) -> None:
        try:
            finish(self)
        finally:
            self.output_stream = None  # the next bundle sets its own (set_output_stream)

    finish_and_release.releases_output_stream = True  # type: ignore[attr-defined]
    output.finish = finish_and_release  # type: ignore[union-attr]


def with_worker_preparation(command: Any) -> Any:
    """Beam's command for a LOOPBACK SDK worker process (``python -c "from ...sdk_worker import
    SdkHarness; SdkHarness(...).run()"``) with a call of ``prepare_sdk_worker`` first; any
    other command as it is.

    Why private: the worker pool starts its processes with that ``-c`` command, and nothing of
    this project runs in them before the harness opens its channels.
    """
    if (
        isinstance(command, list)
        and len(command) == 3
        and command[1] == "-c"
        and str(command[2]).startswith(_LOOPBACK_WORKER_CODE)
    ):
        return [command[0], "-c", _WORKER_PREAMBLE + command[2]]
    return command


def start_loopback_workers_in_own_process_group() -> None:
    """Beam's LOOPBACK worker pool starts each SDK worker process in a process group of its
    own, so that a terminal's Ctrl-C reaches the launcher only, and prepared by
    ``prepare_sdk_worker`` (``with_worker_preparation``). Idempotent.

    Why private: with ``--experiments=use_loopback_process_worker`` the pool
    (``worker_pool_main.BeamFnExternalWorkerPoolServicer``, started inside
    ``PortableRunner.run_pipeline``) runs ``subprocess.Popen([python, -c, ...])`` and takes no
    option for the child's process group or signals; this replaces the ``subprocess`` name of
    ``worker_pool_main`` with one whose ``Popen`` adds ``process_group=0``. What would need none:
    an EXTERNAL worker pool that the launcher starts itself, in a group of its own
    (``python -m apache_beam.runners.worker.worker_pool_main --service_port N``); its workers
    would then be its children, not the launcher's, and ``portable.stop_sdk_workers`` would
    stop the pool instead.

    Raises:
      BeamInternalChanged: ``worker_pool_main`` no longer spawns through its ``subprocess``.
    """
    from apache_beam.runners.worker import worker_pool_main

    current = getattr(worker_pool_main, "subprocess", None)
    if isinstance(current, _PopenInOwnProcessGroup):
        return
    if current is not subprocess:
        raise changed(_WORKER_POOL_SUBPROCESS, "start_loopback_workers_in_own_process_group")
    worker_pool_main.subprocess = _PopenInOwnProcessGroup()  # type: ignore[assignment]  # same surface


# -- benchmarks.bench_scale, tests/test_memory_cap.py: what the in-process runner buffers ------


def _buffer_bytes(buffer) -> int:
    from apache_beam.runners.portability.fn_api_runner import execution

    if isinstance(buffer, execution.ListBuffer):
        return sum(len(chunk) for chunk in buffer._inputs)
    return getattr(buffer, "_bench_bytes", 0)  # a GroupingBuffer: what it was given


@contextlib.contextmanager
def runner_buffer_peaks() -> Iterator[dict[str, int]]:
    """Records what Beam's in-process runner (FnApiRunner) holds between stages.

    Yields a dict that fills in as pipelines run in this process: for every PCollection
    buffered between fused stages (its unique name), grouping buffer (``GBK <step>``) and
    ``<side inputs>`` (the state the runner keeps them in), the largest encoded size in bytes
    seen at the end of a bundle, and ``<total>``, the largest sum of all of them at once.
    Restores Beam's classes on exit. For the benchmarks (``benchmarks.bench_scale``) and the
    memory-cap tests.

    Why private: Beam reports no figure for what its runner buffers between stages; this wraps
    ``BundleContextManager.get_buffer``, ``GroupingBuffer.append`` and
    ``FnApiRunner._execute_bundle`` (the end of each bundle), and reads ``ListBuffer._inputs``
    and the state servicer's ``_state`` (where side inputs are kept).
    """
    from apache_beam.runners.portability.fn_api_runner import execution, fn_runner
    from apache_beam.runners.portability.fn_api_runner.translations import split_buffer_id

    peaks: dict[str, int] = {}
    live: weakref.WeakSet = weakref.WeakSet()
    get_buffer = execution.BundleContextManager.get_buffer
    group_append = execution.GroupingBuffer.append
    execute_bundle = fn_runner.FnApiRunner._execute_bundle

    def named_buffer(self, buffer_id, transform_id):
        buffer = get_buffer(self, buffer_id, transform_id)
        kind, name = split_buffer_id(buffer_id)
        components = self.execution_context.pipeline_components
        if kind == "group":
            buffer._bench_name = "GBK " + components.transforms[name].unique_name
        elif name in components.pcollections:
            buffer._bench_name = components.pcollections[name].unique_name
        else:
            buffer._bench_name = name
        live.add(buffer)
        return buffer

    def counted_append(self, data):
        self._bench_bytes = getattr(self, "_bench_bytes", 0) + len(data)
        return group_append(self, data)

    def measured_bundle(self, context, bundle_manager, bundle_input):
        result = execute_bundle(self, context, bundle_manager, bundle_input)
        total = 0
        for buffer in list(live):
            size = _buffer_bytes(buffer)
            total += size
            peaks[buffer._bench_name] = max(peaks.get(buffer._bench_name, 0), size)
        state = context.worker_handler_manager.state_servicer._state
        side_inputs = sum(len(chunk) for chunks in state.values() for chunk in chunks)
        peaks["<side inputs>"] = max(peaks.get("<side inputs>", 0), side_inputs)
        peaks["<total>"] = max(peaks.get("<total>", 0), total + side_inputs)
        return result

    wrapped = (
        (execution.BundleContextManager, "get_buffer", get_buffer, named_buffer),
        (execution.GroupingBuffer, "append", group_append, counted_append),
        (fn_runner.FnApiRunner, "_execute_bundle", execute_bundle, measured_bundle),
    )
    for owner, name, _, wrapper in wrapped:
        setattr(owner, name, wrapper)
    try:
        yield peaks
    finally:
        for owner, name, original, _ in wrapped:
            setattr(owner, name, original)


# -- tests/test_staging.py: Beam's own TFRecord framing, as a reference for the project's ------


def tfrecord_frame(payload: bytes) -> bytes:
    """``payload`` framed as Beam's ``WriteToTFRecord`` frames each record (length, masked
    CRC32C of the length, payload, masked CRC32C of the payload).

    Why private: the tests compare the project's own framing (``schemas.framing``) with Beam's
    byte for byte, and Beam frames records only inside its sink, in
    ``apache_beam.io.tfrecordio._TFRecordUtil.write_record``.
    """
    import io

    from apache_beam.io.tfrecordio import _TFRecordUtil

    out = io.BytesIO()
    _TFRecordUtil.write_record(out, payload)
    return out.getvalue()
