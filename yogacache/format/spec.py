"""Element specs: the framework-neutral structure, dtypes and shapes of a dataset's elements.

An element is a nested structure of dicts (string keys) and tuples whose leaves are numeric
arrays, numbers, strings or bytes. Its spec lives once in the manifest; records store only
the flat list of leaves, in ``tf.nest`` order (dict keys sorted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError

STRING = "string"
_NUMERIC_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)
SUPPORTED_DTYPES = _NUMERIC_DTYPES | {STRING}

Shape = Union[tuple[Union[int, None], ...], None]
# How deep dicts and tuples may nest in an element (far deeper than any real dataset, far
# below Python's recursion limit, which the recursive functions here would otherwise hit).
MAX_NESTING = 100


@dataclass(frozen=True)
class TensorSpec:
    """Dtype and shape of one leaf; ``None`` dimensions vary between records, a ``None``
    shape means the rank itself is unknown."""

    dtype: str
    shape: Shape

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedDatasetError(
                f"dtype {self.dtype!r} cannot be cached; supported: {sorted(SUPPORTED_DTYPES)}"
            )

    @property
    def is_fully_defined(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    def accepts(self, shape: tuple[int, ...]) -> bool:
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape)
        )


# A spec is a TensorSpec, a tuple of specs, or a dict of specs (keys are strings).
Spec = Union[TensorSpec, tuple["Spec", ...], dict[str, "Spec"]]

# Where a leaf or a container sits in an element: dict keys and tuple positions from the top.
KeyPath = tuple[Union[str, int], ...]
DTYPE = "dtype"
STRUCTURE = "element structure"


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for a spec dtype name (bfloat16 comes from ml_dtypes)."""
    if name == STRING:
        return np.dtype(object)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as error:  # pragma: no cover - ml_dtypes ships with TensorFlow
            raise UnsupportedDatasetError(
                "reading bfloat16 needs the ml_dtypes package: pip install ml_dtypes"
            ) from error
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def spec_leaves(spec: Spec) -> list[TensorSpec]:
    """The leaves of ``spec`` in flattening order (tuples in order, dict keys sorted)."""
    if isinstance(spec, TensorSpec):
        return [spec]
    if isinstance(spec, dict):
        return [leaf for key in sorted(spec) for leaf in spec_leaves(spec[key])]
    return [leaf for item in spec for leaf in spec_leaves(item)]


def flatten(element: Any, spec: Spec, path: KeyPath = ()) -> list[Any]:
    """The leaves of ``element``, which must have the structure of ``spec`` (else
    ElementChangedError naming the key ``path`` where it differs)."""
    if isinstance(spec, TensorSpec):
        return [element]
    if isinstance(spec, dict):
        if not isinstance(element, Mapping) or set(element) != set(spec):
            raise ElementChangedError(STRUCTURE, path, describe_value(element), describe_spec(spec))
        return [leaf for key in sorted(spec) for leaf in flatten(element[key], spec[key], (*path, key))]
    if not isinstance(element, (tuple, list)) or len(element) != len(spec):
        raise ElementChangedError(STRUCTURE, path, describe_value(element), describe_spec(spec))
    return [leaf for i, (item, sub) in enumerate(zip(element, spec)) for leaf in flatten(item, sub, (*path, i))]


def flattener(spec: Spec) -> Callable[[Any], Sequence[Any]]:
    """``flatten`` for one spec, with shortcuts for the common flat tuples and dicts of tensors."""
    if isinstance(spec, tuple) and all(isinstance(item, TensorSpec) for item in spec):
        size = len(spec)

        def flat_tuple(element: Any) -> Sequence[Any]:
            if isinstance(element, (tuple, list)) and len(element) == size:
                return element
            return flatten(element, spec)

        return flat_tuple
    if isinstance(spec, dict) and all(isinstance(item, TensorSpec) for item in spec.values()):
        keys = sorted(spec)
        key_set = set(keys)

        def flat_dict(element: Any) -> Sequence[Any]:
            if isinstance(element, dict) and element.keys() == key_set:
                return [element[key] for key in keys]
            return flatten(element, spec)

        return flat_dict
    return lambda element: flatten(element, spec)


def structure_builder(spec: Spec) -> Callable[[Sequence[Any]], Any]:
    """A function from a record's leaves to its nested structure: ``unflatten`` for one spec,
    without walking the spec for every record."""
    if isinstance(spec, TensorSpec):
        return lambda leaves: leaves[0]
    children = _children(spec)
    if all(isinstance(child, TensorSpec) for _, child in children):
        if isinstance(spec, dict):
            keys = [key for key, _ in children]
            return lambda leaves: dict(zip(keys, leaves))
        return tuple
    return lambda leaves: unflatten(leaves, spec)


def _children(spec: Spec) -> list[tuple[Any, Spec]]:
    if isinstance(spec, dict):
        return [(key, spec[key]) for key in sorted(spec)]
    if not isinstance(spec, tuple):
        raise TypeError(f"expected a dict or tuple element spec, got {type(spec).__name__}")
    return list(enumerate(spec))


def unflatten(leaves: Sequence[Any], spec: Spec) -> Any:
    """Rebuilds the nested structure of ``spec`` from its leaves."""
    iterator = iter(leaves)

    def build(node: Spec) -> Any:
        if isinstance(node, TensorSpec):
            return next(iterator)
        if isinstance(node, dict):
            return {key: build(node[key]) for key in sorted(node)}
        return tuple(build(item) for item in node)

    return build(spec)


def spec_to_json(spec: Spec) -> Any:
    if isinstance(spec, TensorSpec):
        shape = None if spec.shape is None else list(spec.shape)
        return {"tensor": {"dtype": spec.dtype, "shape": shape}}
    if isinstance(spec, dict):
        return {"dict": [[key, spec_to_json(spec[key])] for key in sorted(spec)]}
    return {"tuple": [spec_to_json(item) for item in spec]}


def spec_from_json(data: Any, depth: int = 0) -> Spec:
    try:
        if depth > MAX_NESTING:
            raise CorruptCacheError(f"element spec is nested more than {MAX_NESTING} levels deep")
        if "tensor" in data:
            shape = data["tensor"]["shape"]
            dims = None if shape is None else tuple(None if d is None else int(d) for d in shape)
            if dims is not None and any(d is not None and d < 0 for d in dims):
                raise CorruptCacheError(f"element spec has a negative dimension: {list(dims)}")
            return TensorSpec(dtype=str(data["tensor"]["dtype"]), shape=dims)
        if "dict" in data:
            spec: Spec = {str(key): spec_from_json(value, depth + 1) for key, value in data["dict"]}
        else:
            spec = tuple(spec_from_json(item, depth + 1) for item in data["tuple"])
    except (KeyError, TypeError, ValueError, UnsupportedDatasetError) as error:
        raise CorruptCacheError(f"element spec in manifest is malformed: {error}") from error
    if depth == 0 and not spec_leaves(spec):
        raise CorruptCacheError("element spec in manifest is malformed: it holds no tensor")
    return spec


def infer_spec(element: Any, _depth: int = 0) -> Spec:
    """The spec of a framework-neutral element (nested dicts/tuples of arrays, numbers, str, bytes).

    Raises UnsupportedDatasetError for an element nested more than ``MAX_NESTING`` levels deep.
    """
    if isinstance(element, (Mapping, tuple, list)) and _depth >= MAX_NESTING:
        raise UnsupportedDatasetError(
            f"the element nests dicts and tuples more than {MAX_NESTING} levels deep: "
            "flatten its structure (e.g. into a dict of tensors) to cache it"
        )
    if isinstance(element, Mapping):
        for key in element:
            if not isinstance(key, str):
                raise UnsupportedDatasetError(f"dict keys must be strings, got {key!r}")
        return {key: infer_spec(element[key], _depth + 1) for key in element}
    if isinstance(element, (tuple, list)):
        return tuple(infer_spec(item, _depth + 1) for item in element)
    array = as_leaf_array(element)
    dtype = STRING if array.dtype == object else array.dtype.name
    return TensorSpec(dtype=dtype, shape=tuple(array.shape))


def as_leaf_array(value: Any) -> np.ndarray[Any, Any]:
    """Converts one leaf to an ndarray; text and bytes become object arrays of bytes."""
    if isinstance(value, (bytes, str)):
        value = value.encode("utf-8") if isinstance(value, str) else value
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    array = np.asarray(value)
    if array.dtype.kind in "US":
        return np.vectorize(to_bytes, otypes=[object])(array)
    if array.dtype == object:
        return np.vectorize(to_bytes, otypes=[object])(array)
    return array


def to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_):
        return bytes(value)
    raise UnsupportedDatasetError(f"cannot cache a leaf of type {type(value).__name__}")


def generalize(spec: Spec, other: Spec, path: KeyPath = ()) -> Spec:
    """The most specific spec that both ``spec`` and ``other`` satisfy (dims that differ become None).

    Raises ElementChangedError, naming the key ``path`` where they differ, when ``other`` has
    another structure or dtype (``spec`` is what was expected, ``other`` what was found).
    """
    if isinstance(spec, TensorSpec) and isinstance(other, TensorSpec):
        if spec.dtype != other.dtype:
            raise ElementChangedError(DTYPE, path, other.dtype, spec.dtype)
        if spec.shape is None or other.shape is None or len(spec.shape) != len(other.shape):
            return TensorSpec(spec.dtype, None)
        return TensorSpec(
            spec.dtype, tuple(a if a == b else None for a, b in zip(spec.shape, other.shape))
        )
    if isinstance(spec, dict) and isinstance(other, dict) and set(spec) == set(other):
        return {key: generalize(spec[key], other[key], (*path, key)) for key in spec}
    if isinstance(spec, tuple) and isinstance(other, tuple) and len(spec) == len(other):
        return tuple(generalize(a, b, (*path, i)) for i, (a, b) in enumerate(zip(spec, other)))
    raise ElementChangedError(STRUCTURE, path, describe_spec(other), describe_spec(spec))


# -- naming where elements differ ------------------------------------------------------------------

def key_path(path: KeyPath) -> str:
    """``path`` as it would be indexed in Python: ``['image']['size'][0]``."""
    return "".join(f"[{key!r}]" for key in path)


def leaf_paths(spec: Spec, path: KeyPath = ()) -> list[KeyPath]:
    """The key path of each leaf of ``spec``, in flattening order (as ``spec_leaves``)."""
    if isinstance(spec, TensorSpec):
        return [path]
    if isinstance(spec, dict):
        return [leaf for key in sorted(spec) for leaf in leaf_paths(spec[key], (*path, key))]
    return [leaf for i, item in enumerate(spec) for leaf in leaf_paths(item, (*path, i))]


def describe_spec(spec: Spec) -> str:
    """What an element of ``spec`` is, in a few words (for messages)."""
    if isinstance(spec, TensorSpec):
        return f"a {spec.dtype} value"
    if isinstance(spec, dict):
        return f"a dict with keys {sorted(spec)}"
    return f"a {len(spec)}-tuple"


def describe_value(value: Any) -> str:
    """What ``value`` is, in the words of ``describe_spec``."""
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))}"
    if isinstance(value, (tuple, list)):
        return f"a {len(value)}-tuple" if isinstance(value, tuple) else f"a list of {len(value)}"
    return f"a {type(value).__name__}"


class ElementChangedError(UnsupportedDatasetError):
    """An element differs from the elements before it in structure or in a leaf's dtype (shapes
    may vary, these may not). The message names the element (once known), the key path, what
    was found and what was expected."""

    def __init__(
        self, change: str, path: KeyPath, found: str, expected: str, element: Optional[int] = None
    ) -> None:
        self.change, self.path, self.found, self.expected, self.element = change, path, found, expected, element
        if element is None:
            where = f"at {key_path(path)}" if path else "at the top level of an element"
            what = f"{where}: found {found}, expected {expected}"
        else:
            what = f"element {element}{key_path(path)} is {found}, expected {expected}"
            if element:
                what += f" (as in element{'s 0-' if element > 1 else ' '}{element - 1})"
        super().__init__(
            f"{change} changed between elements: {what}. Every element must have the same "
            "structure and dtypes (only shapes may vary)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as its fields (a worker process may raise it)
        return (ElementChangedError, (self.change, self.path, self.found, self.expected, self.element))

    def at_element(self, index: int) -> ElementChangedError:
        """This error, naming ``index`` as the element that changed."""
        return ElementChangedError(self.change, self.path, self.found, self.expected, index)
