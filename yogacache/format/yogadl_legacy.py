"""YogaDL 0.1.4 caches (``<id>/<version>/cache.mdb``), read without executing their pickles.

YogaDL wrote one LMDB file, ``subdir=False``: records under the keys ``b"00000000"``,
``b"00000001"``, ... (``"{:08}".format(i)``), each ``pickle.dumps(element, protocol=-1)`` of
what ``tf.data``'s numpy iterator yields (numpy arrays and scalars, ``bytes``, in dicts and
tuples), plus ``__keys__`` (the pickled list of record keys, in order), ``__shapes__`` (a
structure of ``tf.TensorShape``) and ``__types__`` (a structure of ``tf.DType``). See
``yogadl/_lmdb_handler.py:serialize_generator_to_lmdb``.

A pickle is a program. ``YogaDLUnpickler`` admits only the constructors those pickles name
(numpy's array and scalar reconstruction, ``numpy.dtype``, and TensorFlow's ``TensorShape``,
``Dimension`` and ``as_dtype``, which are replaced by inert stand-ins, so TensorFlow is never
imported) and refuses any other global with ``RefusedPickleError`` naming it: decoding a
hostile cache.mdb cannot run code. ``YogaDLSource`` turns such a cache into a record source
for ``CacheWriter``; the conversion leaves cache.mdb as it was.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import lmdb
import numpy as np

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.spec import STRING, Spec, TensorSpec, flatten

__all__ = [
    "LEGACY_CACHE_NAME",
    "LEGACY_EXTRA_KEY",
    "LegacyFileState",
    "RefusedPickleError",
    "YogaDLCache",
    "YogaDLSource",
    "YogaDLUnpickler",
    "restricted_loads",
]

LEGACY_CACHE_NAME = "cache.mdb"
# The manifest ``extra`` entry of a cache converted from a YogaDL cache: which file it came
# from (``LegacyFileState.to_json``), so that a vanished or rewritten cache.mdb is noticed.
LEGACY_EXTRA_KEY = "yogadl_source"
_META_KEYS = (b"__keys__", b"__shapes__", b"__types__")
_BATCH = 1024


class RefusedPickleError(CorruptCacheError):
    """A YogaDL cache holds a pickle that names something other than what YogaDL writes."""


@dataclass(frozen=True)
class LegacyDType:
    """Stand-in for a pickled ``tf.DType`` (YogaDL's ``__types__``): just its name."""

    name: str


@dataclass(frozen=True)
class LegacyDimension:
    """Stand-in for a pickled ``tf.compat.v1.Dimension``."""

    value: Optional[int]


@dataclass(frozen=True)
class LegacyShape:
    """Stand-in for a pickled ``tf.TensorShape``; ``dims`` is None when the rank is unknown."""

    dims: Optional[tuple[Optional[int], ...]]


def _as_dtype(name: Any) -> LegacyDType:
    if not isinstance(name, str):
        raise RefusedPickleError(f"a pickled tf.DType names {type(name).__name__!r}, not a dtype name")
    return LegacyDType(name)


def _dimension(value: Any = None) -> LegacyDimension:
    if isinstance(value, LegacyDimension):
        return value
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise RefusedPickleError(f"a pickled tf.Dimension holds {type(value).__name__!r}, not an int")
    return LegacyDimension(value)


def _tensor_shape(dims: Any = None) -> LegacyShape:
    if dims is None:
        return LegacyShape(None)
    if not isinstance(dims, (list, tuple)):
        raise RefusedPickleError(f"a pickled tf.TensorShape holds {type(dims).__name__!r}")
    return LegacyShape(tuple(_dimension(d).value for d in dims))


def _numpy_dtype(*args: Any) -> np.dtype[Any]:
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise RefusedPickleError("a pickled numpy dtype holds Python objects; YogaDL never wrote one")
    return dtype


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """numpy's reconstruction helpers, under the module paths numpy 1.x and 2.x pickle them as."""
    core = "numpy._core" if importlib.util.find_spec("numpy._core") is not None else "numpy.core"
    multiarray = importlib.import_module(f"{core}.multiarray")
    numeric = importlib.import_module(f"{core}.numeric")
    found: dict[tuple[str, str], Any] = {}
    for module in ("numpy.core", "numpy._core"):
        found[(f"{module}.multiarray", "_reconstruct")] = multiarray._reconstruct
        found[(f"{module}.multiarray", "scalar")] = multiarray.scalar
        if hasattr(numeric, "_frombuffer"):
            found[(f"{module}.numeric", "_frombuffer")] = numeric._frombuffer
    found[("numpy", "ndarray")] = np.ndarray
    found[("numpy", "dtype")] = _numpy_dtype
    return found


_ADMITTED: dict[tuple[str, str], Any] = {
    ("tensorflow.python.framework.dtypes", "as_dtype"): _as_dtype,
    ("tensorflow.python.framework.tensor_shape", "TensorShape"): _tensor_shape,
    ("tensorflow.python.framework.tensor_shape", "Dimension"): _dimension,
}


def _admitted() -> dict[tuple[str, str], Any]:
    if ("numpy", "dtype") not in _ADMITTED:
        _ADMITTED.update(_numpy_globals())
    return _ADMITTED


class YogaDLUnpickler(pickle.Unpickler):
    """Unpickles only what YogaDL 0.1.4 wrote; any other global is refused, never imported."""

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        found = _admitted().get((module, name))
        if found is None:
            raise RefusedPickleError(
                f"{self.where} holds a pickle that calls {module}.{name}, which YogaDL never wrote: "
                "refused without running it (the cache may have been tampered with)"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickleError(f"{self.where} holds a pickle with a persistent id; refused")


def restricted_loads(data: bytes, where: str) -> Any:
    """``pickle.loads`` limited to what YogaDL wrote (see ``YogaDLUnpickler``)."""
    try:
        return YogaDLUnpickler(bytes(data), where).load()
    except RefusedPickleError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise CorruptCacheError(f"{where} holds a pickle that cannot be read: {error}") from error


@dataclass(frozen=True)
class LegacyFileState:
    """What identifies one version of a cache.mdb (a local file or an object): its size and
    its modification time (or the object's ETag / generation)."""

    size: int
    version: str

    @classmethod
    def of_file(cls, path: Path) -> Optional[LegacyFileState]:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return cls(size=stat.st_size, version=f"mtime_ns:{stat.st_mtime_ns}")

    def to_json(self) -> dict[str, Any]:
        return {"name": LEGACY_CACHE_NAME, "size": self.size, "version": self.version}

    @classmethod
    def from_json(cls, data: Any) -> Optional[LegacyFileState]:
        if not isinstance(data, dict):
            return None
        try:
            return cls(size=int(data["size"]), version=str(data["version"]))
        except (KeyError, TypeError, ValueError):
            return None


def _spec_of(types: Any, shapes: Any, where: str) -> Spec:
    """The yogacache spec of YogaDL's ``__types__``/``__shapes__`` structures."""
    if isinstance(types, LegacyDType):
        if not isinstance(shapes, LegacyShape):
            raise CorruptCacheError(f"{where}: __shapes__ does not match __types__")
        dtype = STRING if types.name == "string" else types.name
        try:
            return TensorSpec(dtype, shapes.dims)
        except UnsupportedDatasetError as error:
            raise UnsupportedDatasetError(f"{where}: {error}") from None
    if isinstance(types, dict):
        if not isinstance(shapes, dict) or set(shapes) != set(types):
            raise CorruptCacheError(f"{where}: __shapes__ does not match __types__")
        for key in types:
            if not isinstance(key, str):
                raise UnsupportedDatasetError(f"{where}: a dict key {key!r} is not a string")
        return {key: _spec_of(types[key], shapes[key], where) for key in types}
    if isinstance(types, (tuple, list)):
        if not isinstance(shapes, (tuple, list)) or len(shapes) != len(types):
            raise CorruptCacheError(f"{where}: __shapes__ does not match __types__")
        return tuple(_spec_of(t, s, where) for t, s in zip(types, shapes))
    raise CorruptCacheError(f"{where}: __types__ holds a {type(types).__name__}, not dtypes")


class YogaDLCache:
    """A YogaDL 0.1.4 cache.mdb, opened read-only; its records decoded by ``YogaDLUnpickler``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._env = lmdb.open(
                str(self.path), subdir=False, readonly=True, lock=False, readahead=False, max_dbs=0
            )
        except lmdb.Error as error:
            raise CorruptCacheError(f"{self.path} is not a readable YogaDL cache: {error}") from error
        try:
            with self._env.begin() as txn:
                stored = {key: txn.get(key) for key in _META_KEYS}
            found = {key: value for key, value in stored.items() if value is not None}
            missing = [key.decode() for key in _META_KEYS if key not in found]
            if missing:
                raise CorruptCacheError(f"{self.path} is not a YogaDL cache: it has no {', '.join(missing)}")
            where = str(self.path)
            keys = restricted_loads(found[b"__keys__"], f"{where} (__keys__)")
            if not isinstance(keys, list) or not all(isinstance(k, bytes) for k in keys):
                raise CorruptCacheError(f"{where}: __keys__ is not a list of record keys")
            self.keys: list[bytes] = keys
            types = restricted_loads(found[b"__types__"], f"{where} (__types__)")
            shapes = restricted_loads(found[b"__shapes__"], f"{where} (__shapes__)")
            self.spec: Spec = _spec_of(types, shapes, where)
        except BaseException:
            self._env.close()
            raise

    def __len__(self) -> int:
        return len(self.keys)

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> YogaDLCache:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def elements(self) -> Iterator[Any]:
        """Every record, in YogaDL's order (that of ``__keys__``)."""
        with self._env.begin(buffers=False) as txn:
            for key in self.keys:
                value = txn.get(key)
                if value is None:
                    raise CorruptCacheError(f"{self.path} lists record {key!r} but does not hold it")
                yield restricted_loads(value, f"{self.path} (record {key.decode(errors='replace')})")


class YogaDLSource:
    """A YogaDL cache.mdb as a record source for ``CacheWriter`` (spec from its ``__types__``
    and ``__shapes__``, records in its order)."""

    kind = "yogadl"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        state = LegacyFileState.of_file(self.path)
        if state is None:
            raise FileNotFoundError(f"no YogaDL cache at {self.path}")
        self.state = state
        with YogaDLCache(self.path) as cache:
            self._spec = cache.spec
            self.cardinality: Optional[int] = len(cache)

    def spec(self) -> Spec:
        return self._spec

    def encoded_batches(self) -> Iterator[list[bytes]]:
        codec = RecordCodec(self._spec)
        pending: list[bytes] = []
        with YogaDLCache(self.path) as cache:
            for index, element in enumerate(cache.elements()):
                try:
                    pending.append(codec.encode(flatten(element, self._spec)))
                except UnsupportedDatasetError as error:
                    raise CorruptCacheError(
                        f"{self.path}: record {index} does not match the cache's own types and shapes: {error}"
                    ) from error
                if len(pending) >= _BATCH:
                    yield pending
                    pending = []
        if pending:
            yield pending

    def unchanged(self) -> bool:
        """True when the file is still the version this source was made from."""
        return LegacyFileState.of_file(self.path) == self.state


def legacy_state_of(extra: Any) -> Optional[LegacyFileState]:
    """The cache.mdb version a converted cache's manifest ``extra`` records, else None."""
    if not isinstance(extra, dict):
        return None
    return LegacyFileState.from_json(extra.get(LEGACY_EXTRA_KEY))


def carry_over(path: Path, directory: Path) -> None:
    """Puts ``path`` (a cache.mdb beside which a converted cache is sealed) into ``directory``
    (the new build, before it replaces the old one), as a hard link where possible."""
    target = directory / path.name
    try:
        os.link(path, target)
    except OSError:
        import shutil

        shutil.copy2(path, target)
