"""``tf.train.Example`` messages built with protobuf alone, without importing TensorFlow.

Pipeline workers serialise every example but never run a TensorFlow op; importing TensorFlow
costs each worker process seconds of CPU and hundreds of MB. This module declares the same
messages as TensorFlow's ``feature.proto`` and ``example.proto`` (same names, field numbers and
types) in a private descriptor pool, so the bytes are exactly those of
``tf.train.Example.SerializeToString(deterministic=True)`` and TensorFlow, tfds or any other
reader parses them unchanged. ``tests/test_schemas.py`` checks that equality byte for byte.

The private pool keeps these declarations apart from TensorFlow's own, so both can live in one
process.
"""

from __future__ import annotations

from typing import TypeAlias

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Example", "Feature", "Features", "BytesList", "Int64List", "FloatList"]

_PACKAGE = "tensorflow"
_Field: TypeAlias = descriptor_pb2.FieldDescriptorProto


def _message(name: str, *fields: _Field) -> descriptor_pb2.DescriptorProto:
    return descriptor_pb2.DescriptorProto(name=name, field=list(fields))


def _scalar_list(name: str, kind: int) -> descriptor_pb2.DescriptorProto:
    # proto3 packs repeated numeric fields; TensorFlow's declaration says so explicitly.
    field = _Field(name="value", number=1, label=_Field.LABEL_REPEATED, type=kind)
    if kind != _Field.TYPE_BYTES:
        field.options.packed = True
    return _message(name, field)


def _field(
    name: str, number: int, type_name: str, *, label: int = _Field.LABEL_OPTIONAL, **extra
) -> _Field:
    return _Field(
        name=name,
        number=number,
        label=label,
        type=_Field.TYPE_MESSAGE,
        type_name=f".{_PACKAGE}.{type_name}",
        **extra,
    )


def _feature_file() -> descriptor_pb2.FileDescriptorProto:
    feature = _message(
        "Feature",
        _field("bytes_list", 1, "BytesList", oneof_index=0),
        _field("float_list", 2, "FloatList", oneof_index=0),
        _field("int64_list", 3, "Int64List", oneof_index=0),
    )
    feature.oneof_decl.add(name="kind")
    entry = _message(
        "FeatureEntry",
        _Field(name="key", number=1, label=_Field.LABEL_OPTIONAL, type=_Field.TYPE_STRING),
        _field("value", 2, "Feature"),
    )
    entry.options.map_entry = True
    features = _message(
        "Features", _field("feature", 1, "Features.FeatureEntry", label=_Field.LABEL_REPEATED)
    )
    features.nested_type.append(entry)
    example = _message("Example", _field("features", 1, "Features"))
    return descriptor_pb2.FileDescriptorProto(
        name="tfrecord_service/tensorflow_example.proto",
        package=_PACKAGE,
        syntax="proto3",
        message_type=[
            _scalar_list("BytesList", _Field.TYPE_BYTES),
            _scalar_list("FloatList", _Field.TYPE_FLOAT),
            _scalar_list("Int64List", _Field.TYPE_INT64),
            feature,
            features,
            example,
        ],
    )


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_feature_file())


def _class(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


BytesList = _class("BytesList")
FloatList = _class("FloatList")
Int64List = _class("Int64List")
Feature = _class("Feature")
Features = _class("Features")
Example = _class("Example")
