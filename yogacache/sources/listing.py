"""What an object source is built from: its URLs, brace-expanded, listed once (LIST pages of
prefixes, one HEAD for a single object), and checked against the pins asked for (``etag=``,
``version_id=``, ``generation=``) before anything is read."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

from yogacache.sources.errors import SourceChangedError, SourceError
from yogacache.sources.objects import Accessors, ObjectRef
from yogacache.sources.urls import Location, expand_braces, parse_location


@dataclass(frozen=True)
class Listing:
    """The source objects, in order, and the prefixes listed to find them (what is under those is
    the source: a freshness check lists them again, and an object added there is a change)."""

    objects: list[ObjectRef]
    prefixes: list[str]


def list_sources(
    urls: list[str],
    access: Accessors,
    *,
    etag: Union[None, str, Mapping[str, str]] = None,
    version_id: Optional[str] = None,
    generation: Optional[int] = None,
) -> Listing:
    """The objects ``urls`` name: a prefix (a trailing ``/``, or a local directory) is every object
    under it; other names are objects, or the "directory" of that name where no object has it.
    SourceError when there are none, or a named one does not exist (in the version asked for);
    SourceChangedError when one has not the ETag ``etag`` asks for."""
    lister = _Lister(urls, access, etag, version_id, generation)
    return Listing(lister.resolve(), lister.prefixes)


class _Lister:
    def __init__(self, urls: list[str], access: Accessors, etag: Union[None, str, Mapping[str, str]],
                 version_id: Optional[str], generation: Optional[int]) -> None:
        self.urls = urls
        self._access = access
        self.etag = etag
        self.version_id = version_id
        self.generation = generation
        self.prefixes: list[str] = []

    def resolve(self) -> list[ObjectRef]:
        named: list[Location] = []
        found: list[ObjectRef] = []
        for url in self.urls:
            for expanded in expand_braces(url):
                location = parse_location(expanded)
                if self._is_prefix(location):
                    found.extend(self._list_prefix(location))
                else:
                    named.append(location)
        if (self.version_id or self.generation is not None) and (len(named) != 1 or found):
            raise ValueError("version_id= / generation= pin one object: pass exactly one object URL")
        found.extend(self._find_named(named))
        if not found:
            raise SourceError(f"no source objects at {', '.join(self.urls)}")
        self._check_etags(found)
        return found

    def _is_prefix(self, location: Location) -> bool:
        if location.scheme == "file":
            return Path(location.key).is_dir()
        return location.key == "" or location.key.endswith("/")

    def _list_prefix(self, location: Location) -> list[ObjectRef]:
        refs = [ref for ref in self._access(location).list(location) if not ref.name.endswith("/")]
        self.prefixes.append(location.url)
        return refs

    def _find_named(self, named: list[Location]) -> list[ObjectRef]:
        """Named objects: one HEAD for a single object, else LIST pages of their common prefix.
        A single S3/GCS name that is no object but a "directory" (``s3://b/images``) is that prefix."""
        groups: dict[tuple[str, str], list[Location]] = {}
        for location in named:
            groups.setdefault((location.scheme, location.bucket), []).append(location)
        listed: dict[str, list[ObjectRef]] = {}
        for (scheme, bucket), locations in groups.items():
            access = self._access(locations[0])
            if len(locations) > 1 and scheme != "file":
                prefix = posixpath.commonprefix([location.key for location in locations])
                for ref in access.list(Location(scheme, bucket, prefix)):
                    listed[ref.url] = [ref]
                continue
            for location in locations:
                head = access.head(location, self.version_id, self.generation)
                if head is not None:
                    if self.version_id:
                        head = ObjectRef(head.location, head.size, head.etag, self.version_id)
                    listed[location.url] = [head]
                elif scheme != "file" and not (self.version_id or self.generation is not None):
                    children = self._list_prefix(location.child(location.key + "/"))
                    if children:
                        listed[location.url] = children
                    else:
                        self.prefixes.pop()
        refs: list[ObjectRef] = []
        for location in named:
            if location.url not in listed:
                what = " (that version)" if self.version_id or self.generation is not None else ""
                raise SourceError(f"source object {location.url}{what} does not exist; nothing was cached")
            refs.extend(listed[location.url])
        return refs

    def _check_etags(self, refs: list[ObjectRef]) -> None:
        if self.etag is None:
            return
        if isinstance(self.etag, str):
            if len(refs) != 1:
                raise ValueError("etag= as a string pins one object: pass a mapping of URL to ETag for several")
            wanted = {refs[0].url: self.etag}
        else:
            wanted = dict(self.etag)
        by_url = {ref.url: ref for ref in refs}
        for url, etag in wanted.items():
            ref = by_url.get(url)
            if ref is None:
                raise SourceError(f"etag= names {url}, which is not one of the source objects")
            if ref.etag != etag.strip('"'):
                raise SourceChangedError(
                    f"source object {url} has ETag {ref.etag}, not the {etag.strip(chr(34))} asked for (etag=): "
                    "it changed since that ETag was taken; nothing was cached. Pass its current ETag, or "
                    "version_id= for the old version in a versioned bucket"
                )
