"""Shipping the pipeline to remote workers: Beam's staging of ``--setup_file`` and
``--requirements_file``, the built package running from a clean environment, and the Dataflow
job graph built and serialised offline (no cloud is reachable from the tests).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.dataflow.internal import apiclient
from apache_beam.runners.portability.stager import Stager
from apache_beam.transforms import environments

from beam_pipelines import ImagesToShards, StageResults, config_from_options
from beam_pipelines.command_line import beam_option_parser
from beam_pipelines.engines.dask_runner import DaskRunner  # noqa: F401  (registers --dask_* options)
from beam_pipelines.engines.runners import resolve_runner_aliases
from tests.fixtures.images import make_image_tree
from tfrecord_io.source import load_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
_PROJECT_FILES = ("setup.py", "pyproject.toml", "README.md", "requirements.txt")
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def _packages() -> list[str]:
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    return [name.rstrip("*") for name in find["find"]["include"]]


def _dependencies() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory) -> Path:
    """The packaging inputs copied out of the checkout, so builds never write into it."""
    root = tmp_path_factory.mktemp("project") / "src"
    root.mkdir()
    for name in _PROJECT_FILES:
        shutil.copy2(REPO / name, root / name)
    for package in _packages():
        shutil.copytree(REPO / package, root / package, ignore=_IGNORED)
    return root


@pytest.fixture(scope="module")
def staged(project_copy, tmp_path_factory) -> dict[str, Path]:
    """Runs Beam's stager as a Dataflow or Flink submission does; returns name -> staged file."""
    stage_dir = tmp_path_factory.mktemp("stage")
    options = PipelineOptions(
        [
            "--setup_file",
            str(project_copy / "setup.py"),
            "--requirements_file",
            str(project_copy / "requirements.txt"),
            # Populating the cache would download every requirement; the workers install them.
            "--requirements_cache",
            "skip",
        ]
    )
    resources = Stager.create_job_resources(options, str(stage_dir))
    staged: dict[str, Path] = {}
    for artifact in resources:
        assert artifact.role_urn == common_urns.artifact_roles.STAGING_TO.urn
        name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
            artifact.role_payload
        ).staged_name
        path = beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path
        staged[name] = Path(path)
    return staged


def test_stager_ships_every_module_and_the_pinned_dependencies(staged, project_copy):
    assert {"workflow.tar.gz", "requirements.txt"} <= set(staged)
    assert staged["requirements.txt"].read_text() == (REPO / "requirements.txt").read_text()
    with tarfile.open(staged["workflow.tar.gz"]) as sdist:
        names = sdist.getnames()
        root = names[0].split("/")[0]
        shipped = {n.split("/", 1)[1] for n in names if "/" in n}
        requires = sdist.extractfile(f"{root}/tfrecord_service.egg-info/requires.txt").read()
    modules = {
        str(p.relative_to(project_copy))
        for package in _packages()
        for p in (project_copy / package).rglob("*.py")
    }
    assert "beam_pipelines/images_to_tfrecord.py" in modules
    assert modules <= shipped, sorted(modules - shipped)
    # requires.txt lists the install requirements first, then one [extra] section per extra.
    required, _, extras = requires.decode().partition("\n[")
    assert not [line for line in required.split() if line.startswith("tensorflow")], required
    assert "tensorflow]\ntensorflow-cpu==2.21.0" in extras, extras
    requires_lines = required.split()
    for pin in _dependencies():
        name = pin.split("[")[0].split("==")[0]
        assert any(
            line.startswith(name) and line.endswith(pin.split("==")[1]) for line in requires_lines
        ), (pin, requires_lines)


@pytest.fixture(scope="module")
def clean_python(staged, tmp_path_factory) -> Path:
    """A fresh venv holding only the package built from the staged sdist.

    Third-party packages come from this environment through a path entry (reinstalling
    TensorFlow would take minutes); the project's own modules exist only in the built package.
    """
    work = tmp_path_factory.mktemp("clean")
    wheels = work / "wheels"
    # Remote workers build the same sdist when they pip-install workflow.tar.gz.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(wheels), str(staged["workflow.tar.gz"])],
        check=True,
        cwd=work,
    )
    (wheel,) = wheels.glob("*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A bare path line: the shared directory's own .pth files (the project's editable install
    # among them) are not processed, so the project cannot leak in from the checkout.
    (Path(purelib) / "shared_third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)],
        check=True,
    )
    return python


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def test_built_package_imports_and_runs_the_pipeline_from_a_clean_venv(clean_python, tmp_path):
    venv = clean_python.parent.parent
    probe = subprocess.run(
        [
            str(clean_python),
            "-c",
            "import beam_pipelines.graph.transforms as t, schemas.manifest as m;"
            "print(t.__file__); print(m.__file__); print(t.ImagesToShards.__name__)",
        ],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    transforms_file, manifest_file, name = probe.stdout.split()
    assert name == "ImagesToShards"
    for module_file in (transforms_file, manifest_file):
        assert Path(module_file).is_relative_to(venv), module_file
        assert not Path(module_file).is_relative_to(REPO), module_file

    images = tmp_path / "images"
    make_image_tree(images, {"a": 3, "b": 3})
    output = tmp_path / "dataset"
    done = subprocess.run(
        [str(clean_python), "-m", "beam_pipelines.images_to_tfrecord"]
        + ["--input", str(images), "--output", str(output), "--num_shards", "2"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = load_manifest(output)
    assert manifest.counts.written == 6
    assert manifest.label_names == ("a", "b")


def test_built_package_installs_every_console_script(clean_python, tmp_path):
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    bin_dir = clean_python.parent
    for name in scripts:
        assert (bin_dir / name).is_file(), name
    # The TensorFlow-free commands start from the clean venv.
    for name in ("tfrecord-pipeline", "tfrecord-samples", "tfrecord-diagnose"):
        done = subprocess.run(
            [str(bin_dir / name), "--help"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0 and "usage:" in done.stdout, (name, done.stderr[-2000:])


# ---------------------------------------------------------------------------------------------
# Dataflow, offline


DEPLOY_DOC = REPO / "docs" / "deploy.md"


def _documented_commands() -> dict[str, list[str]]:
    """Runner name -> the pipeline arguments of each command documented in docs/deploy.md."""
    commands: dict[str, list[str]] = {}
    for block in re.findall(r"```bash\n(.*?)```", DEPLOY_DOC.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if "beam_pipelines.images_to_tfrecord" not in line:
                continue
            argv = shlex.split(line, comments=True)
            argv = argv[argv.index("beam_pipelines.images_to_tfrecord") + 1 :]
            commands[argv[argv.index("--runner") + 1]] = argv
    return commands


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_documented_commands_use_only_options_beam_or_the_pipeline_know():
    commands = _documented_commands()
    assert set(commands) == {"DataflowRunner", "FlinkRunner", "SparkRunner", "DaskRunner"}
    # The parser Beam itself builds from every options class (PipelineOptions.get_all_options).
    parser = beam_option_parser()
    for runner, argv in commands.items():
        _, unknown = parser.parse_known_args(resolve_runner_aliases(argv))
        assert unknown == [], (runner, unknown)


def _dataflow_argv(project_copy: Path, *replace: tuple[str, str]) -> list[str]:
    """The documented Dataflow command, with its setup file pointed at the copied project."""
    argv = _documented_commands()["DataflowRunner"]
    argv[argv.index("--setup_file") + 1] = str(project_copy / "setup.py")
    for flag, value in replace:
        i = argv.index(flag)
        argv[i : i + 2] = [flag, value] if value else []
    return resolve_runner_aliases(
        [
            *argv,
            "--requirements_cache",
            "skip",
            # Only so that building the Pipeline skips Beam's bucket soft-delete check, which
            # calls GCS; the pipeline is never run.
            "--dry_run",
            "true",
        ]
    )


def _dataflow_graph(argv: list[str]):
    """Builds the pipeline as DataflowRunner.run_pipeline does, up to the job request."""
    options = PipelineOptions(argv)
    config = config_from_options(options)
    pipeline = beam.Pipeline(options=options)
    results = pipeline | "ImagesToShards" >> ImagesToShards(config)
    _ = results | "StageResults" >> StageResults(config.output, "offline")
    environment = environments.DockerEnvironment.from_container_image(
        apiclient.get_container_image_from_options(options),
        artifacts=environments.python_sdk_dependencies(options),
    )
    proto = pipeline.to_runner_api(default_environment=environment)
    return options, pipeline, proto


def _producer_of(proto, pcollection_id: str) -> str:
    for transform in proto.components.transforms.values():
        if not transform.subtransforms and pcollection_id in transform.outputs.values():
            return transform.unique_name
    raise AssertionError(pcollection_id)


def _leaf_inputs(proto, prefix: str) -> list[str]:
    return [
        _producer_of(proto, pcoll)
        for t in proto.components.transforms.values()
        if t.unique_name.startswith(prefix) and not t.subtransforms
        for pcoll in t.inputs.values()
    ]


def test_dataflow_graph_serialises_with_its_steps_options_and_package(project_copy):
    argv = _dataflow_argv(project_copy)
    options, pipeline, proto = _dataflow_graph(argv)

    names = {t.unique_name for t in proto.components.transforms.values()}
    for step in (
        "ImagesToShards/ListSources/MatchFiles",
        "ImagesToShards/ListSources/Reshuffle",
        "ImagesToShards/LabelNames",
        "ImagesToShards/PrepareImages/Prepare",
        "ImagesToShards/AssignSplit",
        "ImagesToShards/WriteShards/GroupByShard",
        "ImagesToShards/WriteShards/WriteShard",
        "StageResults/WriteReports",
    ):
        assert step in names, step
    # Listing happens in the pipeline (MatchAll on a worker, not the launcher), and a Reshuffle
    # separates it from decoding so decoding fans out over every worker.
    assert any(
        n.startswith("ImagesToShards/ListSources/MatchFiles/")
        for n in _leaf_inputs(proto, "ImagesToShards/ListSources/ClassFromPath")
    )
    assert all(
        n.startswith("ImagesToShards/ListSources/Reshuffle/")
        for n in _leaf_inputs(proto, "ImagesToShards/PrepareImages/Prepare")
        if not n.startswith("ImagesToShards/LabelNames/")
    )

    (environment,) = proto.components.environments.values()
    assert environment.urn == common_urns.environments.DOCKER.urn
    image = beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image
    assert image.endswith(f"beam_python3.11_sdk:{beam.version.__version__}")
    staged_names = {
        beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(d.role_payload).staged_name
        for d in environment.dependencies
    }
    assert "workflow.tar.gz" in staged_names

    # The job request Dataflow would receive: worker pool and locations from the options.
    job = apiclient.Job(options, proto)
    request = apiclient.Environment([], options, "8", "gs://my-bucket/pipeline.pb", proto)
    (pool,) = request.proto.worker_pools
    assert pool.machine_type == _flag(argv, "--machine_type")
    assert pool.num_workers == int(_flag(argv, "--num_workers"))
    assert pool.autoscaling_settings.max_num_workers == int(_flag(argv, "--max_num_workers"))
    # THROUGHPUT_BASED is called BASIC in the Dataflow API.
    assert pool.autoscaling_settings.algorithm.name == "AUTOSCALING_ALGORITHM_BASIC"
    assert pool.disk_size_gb == int(_flag(argv, "--disk_size_gb"))
    temp = _flag(argv, "--temp_location").replace("gs://", "storage.googleapis.com/")
    assert request.proto.temp_storage_prefix.startswith(temp)
    assert job.google_cloud_options.region == _flag(argv, "--region")

    # Every DoFn and combiner pickles and unpickles: rebuild the pipeline from the proto.
    rebuilt = beam.Pipeline.from_runner_api(proto, pipeline.runner, options)
    assert (
        rebuilt.to_runner_api().components.transforms.keys() == proto.components.transforms.keys()
    )


def test_dataflow_graph_with_a_custom_container_image_stages_no_package(project_copy):
    image = "europe-docker.pkg.dev/my-project/images/tfrecord-service:0.1.0"
    argv = _dataflow_argv(project_copy, ("--setup_file", ""))
    argv += ["--sdk_container_image", image]
    _, _, proto = _dataflow_graph(argv)
    (environment,) = proto.components.environments.values()
    assert (
        beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image == image
    )
    staged_names = {
        beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(d.role_payload).staged_name
        for d in environment.dependencies
    }
    assert "workflow.tar.gz" not in staged_names


def test_setup_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "setup.py"
    options = PipelineOptions(["--setup_file", str(missing)])
    with pytest.raises(RuntimeError, match=str(missing)):
        Stager.create_job_resources(options, str(tmp_path))


def test_reader_without_tensorflow_says_which_extra_to_install():
    # A pipeline-only install has no TensorFlow; None in sys.modules makes its import fail.
    # What needs no TensorFlow imports (the source and the cache, which the tools use); the
    # reader's names say which extra to install.
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "import tfrecord_io, tfrecord_io.source, tfrecord_io.cache\n"
        "print('imported')\n"
        "from tfrecord_io import make_dataset\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "imported", done.stderr[-2000:]
    assert done.returncode == 1
    assert "tfrecord_io.make_dataset needs TensorFlow" in done.stderr, done.stderr[-2000:]
    assert "pip install 'tfrecord-service[tensorflow]'" in done.stderr, done.stderr[-2000:]
