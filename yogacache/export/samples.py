"""From records to WebDataset samples: a key and one ``<key>.<suffix>`` member per leaf.

The suffix of each leaf is decided once, from the element spec, before anything is written (the
rules are in docs/export.md): a leaf's own name that holds a dot (``seg.png``) or is a known
extension that fits its value (``jpg``, ``cls``, ``txt``) is the suffix as it is; otherwise a
suffix for the value's kind is appended (integer scalars ``.cls``, strings and bytes ``.txt``,
other numbers and arrays ``.npy``). Names of nested dicts and tuples are joined with dots.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from yogacache.errors import ConfigError, UnsupportedDatasetError
from yogacache.export.errors import ExportError
from yogacache.export.tar import MAX_MEMBER_BYTES, NAME_LIMIT
from yogacache.format.spec import STRING, Spec, TensorSpec

KEY_DIGITS = 9
# Suffixes webdataset and common loaders recognise: a field so named is written under its name.
_TEXT_LIKE = frozenset("cls cls2 class count index inx id txt text transcript".split())
_INTEGER_TEXT = frozenset("cls cls2 class count index inx id".split())
_KNOWN = _TEXT_LIKE | frozenset(
    (
        "npy npz json jsn jpg jpeg png ppm pgm pbm pnm gif bmp tif tiff webp img image "
        "flac mp3 wav ogg opus m4a mp4 avi webm mkv html htm xml csv bin ten tb mp msg msgpack cbor"
    ).split()
)
_UNPICKLED = frozenset("pyd pkl pickle pth".split())  # webdataset's decoders unpickle these


@dataclass(frozen=True)
class SampleField:
    """One leaf of the element as one tar member: ``<key>.<suffix>`` holds ``encoding`` of it.

    ``encoding``: ``npy`` (``np.save`` format), ``decimal`` (an integer as ASCII digits),
    ``bytes`` (the leaf's bytes unchanged) or ``utf8`` (unchanged, checked to be UTF-8 text).
    """

    leaf: int
    path: str
    suffix: str
    encoding: str


def _leaf_paths(spec: Spec, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], TensorSpec]]:
    """Every leaf with its path, in the flattening order of ``format.spec``."""
    if isinstance(spec, TensorSpec):
        yield prefix, spec
    elif isinstance(spec, dict):
        for key in sorted(spec):
            yield from _leaf_paths(spec[key], (*prefix, key))
    else:
        for index, item in enumerate(spec):
            yield from _leaf_paths(item, (*prefix, str(index)))


def _default_extension(leaf: TensorSpec) -> str:
    if leaf.dtype == STRING:
        return "txt"
    if leaf.shape == () and (leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")):
        return "cls"
    return "npy"


def _encoding(path: str, suffix: str, leaf: TensorSpec, defaulted: bool) -> str:
    extension = suffix.rsplit(".", 1)[-1].lower()
    kind = f"{leaf.dtype}{list(leaf.shape) if leaf.shape is not None else '[any shape]'}"
    if extension in _UNPICKLED:
        raise UnsupportedDatasetError(
            f"field {path!r} would be written as .{extension}, which webdataset's decoders unpickle: "
            "yogacache never writes such a member; rename the field"
        )
    if leaf.dtype == STRING:
        if leaf.shape != ():
            raise UnsupportedDatasetError(
                f"field {path!r} is an array of strings ({kind}); WebDataset has no standard member "
                "for it: only single strings or bytes can be exported"
            )
        if extension == "npy":
            raise UnsupportedDatasetError(f"field {path!r} holds bytes or text and cannot be written as .npy")
        return "utf8" if defaulted else "bytes"
    if extension == "npy":
        if leaf.dtype == "bfloat16":
            raise UnsupportedDatasetError(
                f"field {path!r} is bfloat16, which the .npy format cannot name (numpy would read it back "
                "as raw void bytes)"
            )
        return "npy"
    integer = leaf.dtype == "bool" or leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")
    if extension in _TEXT_LIKE and integer and leaf.shape == ():
        return "decimal"
    raise UnsupportedDatasetError(
        f"field {path!r} holds {kind}, which cannot be written as .{extension}: numbers and arrays go "
        f"to .npy (name the field without an extension, or {path.rsplit('.', 1)[0]}.npy), single integers "
        f"also to .{'/.'.join(sorted(_INTEGER_TEXT))}/.txt; .{extension} holds bytes or text"
    )


def _fits(suffix: str, leaf: TensorSpec) -> bool:
    """Whether a leaf can be written under ``suffix`` as it is (an array fits .npy, not .image)."""
    try:
        _encoding(suffix, suffix, leaf, False)
    except UnsupportedDatasetError:
        return False
    return True


def _check_component(name: str, path: str) -> None:
    if not name or any(not part for part in name.split(".")):
        raise UnsupportedDatasetError(
            f"field {path!r} cannot name a tar member: names must be non-empty, with no empty part between dots"
        )
    if "/" in name or any(ord(char) < 32 for char in name):
        raise UnsupportedDatasetError(f"field {path!r} cannot name a tar member: it holds '/' or a control character")
    if name.startswith("__") and name.endswith("__"):
        raise UnsupportedDatasetError(
            f"field {path!r} is reserved: webdataset keeps __name__ fields for its own metadata "
            "(only __key__ is used, as the sample key)"
        )


def sample_fields(
    spec: Spec, extensions: Optional[Mapping[str, str]] = None
) -> tuple[Optional[int], list[SampleField]]:
    """The sample key's leaf (None: keys are record indices) and one ``SampleField`` per other leaf.

    ``extensions`` maps a field's path (``"image"``, ``"pair.0"``) to the suffix to append to it
    instead of the default one (e.g. ``{"raw": "bin"}``). Raises UnsupportedDatasetError, before
    anything is written, for an element that cannot be exported.
    """
    extensions = dict(extensions or {})
    key_leaf: Optional[int] = None
    fields: list[SampleField] = []
    seen: dict[str, str] = {}
    for index, (parts, leaf) in enumerate(_leaf_paths(spec)):
        path = ".".join(parts)
        if parts == ("__key__",) and isinstance(spec, dict):
            integer = leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")
            if leaf.shape != () or not (leaf.dtype == STRING or integer):
                raise UnsupportedDatasetError(
                    f"field '__key__' is the sample key and must be a single string or integer, not {leaf.dtype}"
                )
            key_leaf = index
            continue
        for part in parts:
            _check_component(part, path)
        own = parts[-1] if parts else ""
        override = extensions.pop(path, None)
        if override is not None:
            _check_component(override, path)
            suffix, defaulted = (f"{path}.{override}" if path else override), False
        elif own and "." in own:
            suffix, defaulted = path, False
        elif own.lower() in _KNOWN and _fits(path, leaf):
            suffix, defaulted = path, False  # "jpg", "cls", "txt": webdataset's own names
        else:
            extension = _default_extension(leaf)
            suffix, defaulted = (f"{path}.{extension}" if path else extension), True
        encoding = _encoding(path or "(element)", suffix, leaf, defaulted)
        folded = suffix.lower()  # webdataset lower-cases suffixes when it groups a sample
        if folded in seen:
            raise UnsupportedDatasetError(
                f"fields {seen[folded]!r} and {path!r} would both be written as .{suffix} "
                "(webdataset compares suffixes in lower case): rename one"
            )
        seen[folded] = path
        fields.append(SampleField(index, path or "(element)", suffix, encoding))
    if extensions:
        raise ConfigError(f"extensions name fields the element does not have: {sorted(extensions)}")
    if not fields:
        raise UnsupportedDatasetError("the element holds only a __key__: a sample needs at least one other field")
    return key_leaf, fields


@functools.lru_cache(maxsize=256)
def _npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The ``np.save`` header of a C-ordered array (the bytes ``np.save`` writes before the data)."""
    buffer = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _npy(value: Any) -> bytes:
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise UnsupportedDatasetError("an object array cannot be written as .npy (it would need pickle)")
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would make a scalar 1-d)
    return _npy_header(array.dtype, array.shape) + array.tobytes()


class SampleEncoder:
    """Turns decoded records (flat leaf lists) into ``(key, [(suffix, bytes), ...])`` samples."""

    def __init__(self, spec: Spec, num_records: int, extensions: Optional[Mapping[str, str]] = None) -> None:
        self.key_leaf, self.fields = sample_fields(spec, extensions)
        self.digits = max(KEY_DIGITS, len(str(max(num_records - 1, 0))))
        self._previous_key: Optional[str] = None
        longest = max(len(f.suffix.encode("utf-8")) for f in self.fields)
        if self.key_leaf is None and self.digits + 1 + longest > NAME_LIMIT:
            raise UnsupportedDatasetError(
                f"a member name would be longer than the {NAME_LIMIT} bytes a tar header holds: shorten the field names"
            )

    def key(self, index: int, leaves: Sequence[Any]) -> str:
        if self.key_leaf is None:
            return f"{index:0{self.digits}d}"
        value = leaves[self.key_leaf]
        if isinstance(value, bytes):
            try:
                key = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ExportError(f"record {index}: its __key__ is not UTF-8 text") from None
        else:
            key = str(int(value))
        if not key or "." in key or "/" in key or any(ord(char) < 32 for char in key):
            raise ExportError(
                f"record {index}: its __key__ {key!r} cannot be a WebDataset key (it must be non-empty, "
                "with no '.', '/' or control character: readers split member names at the first dot)"
            )
        if key == self._previous_key:
            raise ExportError(
                f"record {index}: its __key__ {key!r} is the previous record's too; readers would merge "
                "the two samples into one"
            )
        self._previous_key = key
        return key

    def encode(self, index: int, leaves: Sequence[Any]) -> tuple[str, list[tuple[str, bytes]]]:
        key = self.key(index, leaves)
        members = []
        for item in self.fields:
            value = leaves[item.leaf]
            if item.encoding == "npy":
                data = _npy(value)
            elif item.encoding == "decimal":
                data = str(int(value)).encode("ascii")
            else:
                data = bytes(value)
                if item.encoding == "utf8":
                    try:
                        data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise ExportError(
                            f"record {index}: field {item.path!r} holds bytes that are not UTF-8 text, so they "
                            f"cannot go to .{item.suffix}: give the field its own extension, e.g. "
                            f"extensions={{{item.path!r}: 'bin'}} (CLI: --ext {item.path}=bin)"
                        ) from None
            name = f"{key}.{item.suffix}"
            if len(name.encode("utf-8")) > NAME_LIMIT:
                raise ExportError(
                    f"record {index}: member name {name!r} is longer than the {NAME_LIMIT} bytes a tar header holds"
                )
            if len(data) > MAX_MEMBER_BYTES:
                raise ExportError(f"record {index}: field {item.path!r} is larger than a tar member can be (8 GiB)")
            members.append((name, data))
        return key, members
