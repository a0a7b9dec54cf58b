"""Opt-in decoders of sample fields; none of them ever unpickles.

Values stay raw bytes unless a build asks for decoding (``decode=True`` for every field this
module knows, or a mapping of field to decoder name). Fields whose format is a pickle
(``.pyd``, ``.pkl``, ``.pickle``, ``.pth``) are refused when decoding is asked, where
``webdataset.autodecode`` would unpickle them: decoding an untrusted source must not run code.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Mapping, Optional, Union

from yogacache.sources.errors import SourceError

PICKLE_FIELDS = frozenset({"pyd", "pkl", "pickle", "pth"})
IMAGE_FIELDS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "webp", "bmp", "tif", "tiff"})


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _integer(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _image(data: bytes) -> Any:
    try:
        import numpy as np
        from PIL import Image
    except ImportError:
        raise ImportError("decoding images needs Pillow: pip install pillow (or keep them as bytes)") from None
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def _json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))


DECODERS: dict[str, Callable[[bytes], Any]] = {"text": _text, "int": _integer, "npy": _npy, "image": _image,
                                               "json": _json, "bytes": bytes}
DEFAULT_FOR_FIELD: dict[str, str] = {
    **{field: "text" for field in ("txt", "text", "transcript")},
    **{field: "int" for field in ("cls", "cls2", "class", "count", "index", "inx", "id")},
    "npy": "npy",
    "json": "json",
    **{field: "image" for field in IMAGE_FIELDS},
}

Decode = Union[None, bool, Mapping[str, str]]


def decoder_table(decode: Decode) -> Optional[Callable[[str], Optional[Callable[[bytes], Any]]]]:
    """A function from field name to its decoder (None: keep bytes); None when nothing is decoded."""
    if not decode:
        return None
    chosen = dict(DEFAULT_FOR_FIELD) if decode is True else dict(decode)  # type: ignore[arg-type]
    for field, name in chosen.items():
        if name not in DECODERS:
            raise ValueError(f"unknown decoder {name!r} for field {field!r}: use one of {sorted(DECODERS)}")
        if field.rsplit(".", 1)[-1] in PICKLE_FIELDS:
            raise SourceError(f"field {field!r} is a pickle: yogacache never unpickles; keep it as bytes")

    def lookup(field: str) -> Optional[Callable[[bytes], Any]]:
        if field.rsplit(".", 1)[-1] in PICKLE_FIELDS:
            raise SourceError(
                f"field {field!r} is a pickle (.pyd/.pkl): yogacache never unpickles, since that can run "
                "code from the source; build without decode= for this field (it stays bytes)"
            )
        name = chosen.get(field) or chosen.get(field.rsplit(".", 1)[-1])
        return DECODERS[name] if name else None

    return lookup


def decode_sample(sample: dict[str, Any], lookup: Callable[[str], Optional[Callable[[bytes], Any]]],
                  where: str) -> dict[str, Any]:
    """``sample`` with every field that has a decoder decoded; a field that fails names itself."""
    decoded: dict[str, Any] = {}
    for field, value in sample.items():
        decoder = lookup(field) if field != "__key__" and isinstance(value, bytes) else None
        if decoder is None:
            decoded[field] = value
            continue
        try:
            decoded[field] = decoder(value)
        except (ValueError, OSError, UnicodeDecodeError) as error:
            raise SourceError(f"{where}: sample {sample.get('__key__')!r} field {field!r} does not decode: "
                              f"{str(error)[:200]}") from None
    return decoded
