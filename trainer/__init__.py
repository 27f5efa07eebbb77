"""trainer: distributed training fed by ``tfrecord_io``, with exact resume and diagnosis.

Command lines: ``python -m trainer.train``, ``python -m trainer.diagnose MODEL_DIR``, and for
the trained model ``python -m trainer.export RUN_DIR OUT_DIR`` and ``python -m trainer.predict
MODEL_DIR IMAGE_OR_DIR...``. From Python, ``trainer.fit(model_fn, TrainConfig(...), loss=...,
metrics=...)`` runs the same loop with a model of your own.

The public names are loaded on first use, so that ``import trainer`` (and ``trainer.diagnose``)
does not pay for importing TensorFlow and Keras. The command modules (``trainer.train``,
``trainer.diagnose``, ``trainer.export``, ``trainer.predict``) are imported by nothing here,
so ``python -m`` runs them once.
Importing the package keeps TensorFlow's start-up lines quiet (``cliflags.quiet_tensorflow``)
unless ``TF_CPP_MIN_LOG_LEVEL`` is set.
"""

from __future__ import annotations

from cliflags import lazy_names, quiet_tensorflow

# TensorFlow's C++ start-up lines and info logs stay out of a user's output unless they set
# TF_CPP_MIN_LOG_LEVEL themselves (or imported TensorFlow first); trainer.train's --verbose
# undoes this before TensorFlow loads.
quiet_tensorflow()

__all__ = [
    # config
    "DataConfig",
    "OptimConfig",
    "RuntimeConfig",
    "TrainConfig",
    # strategy
    "Distribution",
    "create_distribution",
    "resolve_strategy_name",
    "configure_devices",
    "precision_policy",
    "slurm_cluster_resolver",
    "split_batch",
    # host
    "AllocatorSettings",
    "keep_freed_memory",
    # model, optimiser, data
    "build_model",
    "build_optimizer",
    "learning_rate_at",
    "Inputs",
    "ReaderInputs",
    # your own model
    "fit",
    "ExactEpochs",
    "Objective",
    "load_model_fn",
    "parse_model_args",
    # loop
    "Checkpointer",
    "KeyAudit",
    "ResumePlan",
    "plan_resume",
    "TrainResult",
    "plan_steps",
    "run_training",
    # using a trained model
    "RunRecord",
    "read_run_record",
    "ServingPreprocessing",
    "StoredImages",
    "ExportResult",
    "export_saved_model",
    "restore_model",
    "Prediction",
    "load_classifier",
    "predict_files",
    # observability
    "TAGS",
    "SummaryWriters",
    "Thresholds",
    "Verdict",
    "diagnose_run",
    "read_scalars",
]

_HOME = {
    "DataConfig": "trainer.config",
    "OptimConfig": "trainer.config",
    "RuntimeConfig": "trainer.config",
    "TrainConfig": "trainer.config",
    "Distribution": "trainer.strategy",
    "create_distribution": "trainer.strategy",
    "resolve_strategy_name": "trainer.strategy",
    "configure_devices": "trainer.strategy",
    "precision_policy": "trainer.strategy",
    "slurm_cluster_resolver": "trainer.strategy",
    "split_batch": "trainer.strategy",
    "AllocatorSettings": "trainer.host_memory",
    "keep_freed_memory": "trainer.host_memory",
    "build_model": "trainer.models",
    "build_optimizer": "trainer.optim",
    "learning_rate_at": "trainer.optim",
    "Inputs": "trainer.inputs",
    "ReaderInputs": "trainer.inputs",
    "fit": "trainer.api",
    "ExactEpochs": "trainer.keras_fit",
    "Objective": "trainer.user_model",
    "load_model_fn": "trainer.user_model",
    "parse_model_args": "trainer.user_model",
    "Checkpointer": "trainer.checkpoints",
    "KeyAudit": "trainer.audit",
    "ResumePlan": "trainer.resume",
    "plan_resume": "trainer.resume",
    "TrainResult": "trainer.loop",
    "plan_steps": "trainer.setup",
    "run_training": "trainer.loop",
    "RunRecord": "trainer.run_record",
    "read_run_record": "trainer.run_record",
    "ServingPreprocessing": "trainer.serving",
    "StoredImages": "trainer.serving",
    "ExportResult": "trainer.saved_model",
    "export_saved_model": "trainer.saved_model",
    "restore_model": "trainer.saved_model",
    "Prediction": "trainer.prediction",
    "load_classifier": "trainer.prediction",
    "predict_files": "trainer.prediction",
    "TAGS": "trainer.metrics",
    "SummaryWriters": "trainer.metrics",
    "Thresholds": "trainer.diagnosis",
    "Verdict": "trainer.diagnosis",
    "diagnose_run": "trainer.diagnosis",
    "read_scalars": "trainer.diagnosis",
}

__getattr__, __dir__ = lazy_names(__name__, globals(), _HOME)
