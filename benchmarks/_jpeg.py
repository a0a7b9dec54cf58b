"""The CPU-bound build source of ``bench_build.py``: the large records JPEG-encoded once, decoded per record.

Imports only the standard library, numpy and Pillow, so the yogacache processes and the peers'
virtualenv (MosaicML, LitData) decode the same bytes with the same decoder. Every process
learns where the JPEGs are from a path and maps them itself (``np.load(mmap_mode="r")`` of plain
``.npy`` files: no copy, no checksum pass, the page cache shared): workers never receive the data,
and a worker's start costs it no load of the whole file, as reading image files would not.
"""

from __future__ import annotations

import io
import os
from typing import Any, Optional

import numpy as np

_LOADED: dict[str, tuple[Any, Any, Any]] = {}


def write_jpegs(path: str, images: Any, labels: Any, quality: int = 90) -> None:
    """Encodes every image once (outside any clock) into the directory ``path`` (``data.npy``:
    the JPEGs' bytes, ``offsets.npy``, ``labels.npy``)."""
    from PIL import Image

    blobs = []
    for image in images:
        out = io.BytesIO()
        Image.fromarray(image).save(out, format="JPEG", quality=quality)
        blobs.append(out.getvalue())
    offsets = np.cumsum([0, *map(len, blobs)]).astype(np.int64)
    os.makedirs(path, exist_ok=True)
    np.save(os.path.join(path, "data.npy"), np.frombuffer(b"".join(blobs), dtype=np.uint8))
    np.save(os.path.join(path, "offsets.npy"), offsets)
    np.save(os.path.join(path, "labels.npy"), np.asarray(labels))


def _load(path: str) -> tuple[Any, Any, Any]:
    if path not in _LOADED:
        _LOADED[path] = tuple(  # type: ignore[assignment]
            np.load(os.path.join(path, f"{name}.npy"), mmap_mode="r") for name in ("data", "offsets", "labels")
        )
    return _LOADED[path]


def decode(path: str, index: int) -> tuple[Any, Any]:
    """Record ``index``: (image uint8[184, 184, 3] decoded from its JPEG, label int64)."""
    from PIL import Image

    data, offsets, labels = _load(path)
    blob = data[offsets[index] : offsets[index + 1]].tobytes()
    image = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
    return image, np.int64(labels[index])


def decode_range(path: str, start: int, stop: int) -> int:
    """Decodes records ``start`` to ``stop`` and keeps nothing: the decode alone, for the benchmark's
    ceiling rows. Returns the decoded bytes."""
    return sum(decode(path, index)[0].nbytes for index in range(start, stop))


class JpegRecords:
    """A map-style dataset over the JPEG file: pickles as its path alone."""

    def __init__(self, path: str, records: Optional[int] = None) -> None:
        self.path = os.path.abspath(path)
        self.records = records if records is not None else len(_load(self.path)[2])

    def __len__(self) -> int:
        return self.records

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.records:
            raise IndexError(index)
        return decode(self.path, index)
