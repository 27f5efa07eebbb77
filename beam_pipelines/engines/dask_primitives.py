"""The primitive steps the Dask runner translates, and the overrides that put them in a pipeline.

Beam's Python SDK expands ``Create``, ``Reshuffle``, ``io.Read``, ``GroupByKey`` and ``Flatten``
into steps meant for its portable runners (an ``Impulse`` and splittable DoFns, window
reification, runner-side grouping). A runner that executes a pipeline itself replaces each with
a step that says only what it does; the Dask runner (``dask_runner``) then translates each of
these into ``dask.bag`` operations. They are placeholders: their ``expand`` makes the output
PCollection and nothing runs them but a runner.

Beam's own Dask runner has the same placeholders in ``apache_beam.runners.dask.overrides``, as
private classes (``_Create``, ``_GroupByKeyOnly``, ...) whose ``GroupByKey`` also goes through
the DirectRunner's private ``_GroupAlsoByWindowDoFn``; these are built on Beam's public
``PTransform`` and ``PTransformOverride`` alone. ``GroupByKey`` here is one step in the global
window (the only window the Dask runner supports), without Beam's per-element window
reification.
"""

from __future__ import annotations

import typing as t
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam import typehints
from apache_beam.pipeline import AppliedPTransform, PTransformOverride
from apache_beam.transforms.window import GlobalWindows

__all__ = [
    "CreateValues",
    "FlattenInputs",
    "GroupByKeyGlobally",
    "ReadSource",
    "ReshuffleElements",
    "primitive_overrides",
]

# Beam's own type variables: the replacements keep the element types of what they replace.
K = typehints.TypeVariable("K")
V = typehints.TypeVariable("V")


class CreateValues(beam.PTransform):
    """``beam.Create(values)``: the values, as the runner partitions them."""

    def __init__(self, values: Sequence[Any]):
        super().__init__()
        self.values = tuple(values)

    def expand(self, input_or_inputs: Any) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(input_or_inputs)

    def get_windowing(self, inputs: Any) -> beam.Windowing:
        return beam.Windowing(GlobalWindows())


@typehints.with_input_types(K)
@typehints.with_output_types(K)
class ReshuffleElements(beam.PTransform):
    """``beam.Reshuffle()``: the same elements, spread over new partitions."""

    def expand(self, input_or_inputs: Any) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(input_or_inputs)


class ReadSource(beam.PTransform):
    """``beam.io.Read(source)``: every element of a bounded source."""

    def __init__(self, source: Any):
        super().__init__()
        self.source = source

    def expand(self, input_or_inputs: Any) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(input_or_inputs)


@typehints.with_input_types(typehints.KV[K, V])
@typehints.with_output_types(typehints.KV[K, typehints.Iterable[V]])
class GroupByKeyGlobally(beam.PTransform):
    """``beam.GroupByKey()`` in the global window: ``(key, [value, ...])`` per key."""

    def expand(self, input_or_inputs: Any) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(input_or_inputs)

    def infer_output_type(self, input_type: Any) -> Any:
        key_type, value_type = typehints.trivial_inference.key_value_types(input_type)
        return typehints.KV[key_type, typehints.Iterable[value_type]]


class FlattenInputs(beam.PTransform):
    """``beam.Flatten()``: the elements of every input PCollection."""

    def expand(self, input_or_inputs: Any) -> beam.PCollection:
        if isinstance(input_or_inputs, beam.PCollection):  # (pcoll,) | Flatten() gives one
            is_bounded = input_or_inputs.is_bounded
        else:
            is_bounded = all(pcoll.is_bounded for pcoll in input_or_inputs)
        pipeline: Any = self.pipeline  # set by Pipeline.apply before expand runs
        return beam.pvalue.PCollection(pipeline, is_bounded=is_bounded)


class _Replace(PTransformOverride):
    """Replaces every step of exactly ``kind`` (not a subclass) by ``make(step)``."""

    def __init__(self, kind: type, make: t.Callable[[Any], beam.PTransform]):
        self._kind = kind
        self._make = make

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        return type(applied_ptransform.transform) is self._kind

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> beam.PTransform:
        return self._make(applied_ptransform.transform)


def primitive_overrides() -> list[PTransformOverride]:
    """The overrides that replace Beam's composites by this module's primitives, for
    ``Pipeline.replace_all``."""
    return [
        _Replace(beam.Create, lambda create: CreateValues(create.values)),
        _Replace(beam.Reshuffle, lambda _: ReshuffleElements()),
        _Replace(beam.io.Read, lambda read: ReadSource(read.source)),
        _Replace(beam.GroupByKey, lambda _: GroupByKeyGlobally()),
        _Replace(beam.Flatten, lambda _: FlattenInputs()),
    ]
