"""Build leases: a conditional object in the bucket says which node is building a cache.

A lease is created with a conditional write, so one node holds it; its holder renews it
before it expires; a lease past its expiry (its builder died) is taken over with a write
conditional on the stale version, so exactly one node takes it over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

from yogacache.backends.base import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseState:
    owner: str
    build_id: str
    expires_at: float
    token: str


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    """A held build lease; renewed in the background until released."""

    def __init__(self, objects: ObjectStore, key: str, build_id: str, duration: float) -> None:
        self.objects = objects
        self.key = key
        self.build_id = build_id
        self.duration = duration
        self.token: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost = False

    def _payload(self, released: bool = False) -> bytes:
        expires_at = 0.0 if released else time.time() + self.duration
        return json.dumps(
            {"owner": _owner(), "build_id": self.build_id, "expires_at": expires_at}
        ).encode()

    @staticmethod
    def read(objects: ObjectStore, key: str) -> Optional[LeaseState]:
        found = objects.read(key)
        if found is None:
            return None
        data, token = found
        try:
            raw = json.loads(data)
            return LeaseState(str(raw["owner"]), str(raw["build_id"]), float(raw["expires_at"]), token)
        except (ValueError, KeyError, TypeError):
            # An unreadable lease is treated as expired: it can only be taken over conditionally.
            return LeaseState("?", "?", 0.0, token)

    def try_acquire(self) -> tuple[bool, Optional[LeaseState]]:
        """(True, previous) when acquired (``previous`` is the stale lease taken over, if any);
        (False, current holder) otherwise."""
        token = self.objects.write(self.key, self._payload(), if_absent=True)
        if token is not None:
            self.token = token
            self._start_renewing()
            return True, None
        current = self.read(self.objects, self.key)
        if current is None:
            return False, None  # released meanwhile: the caller retries
        if current.expires_at > time.time():
            return False, current
        token = self.objects.write(self.key, self._payload(), if_token=current.token)
        if token is None:
            return False, None  # someone else took it over first
        log.warning("took over the stale build lease of %s (%s)", current.owner, self.objects.url(self.key))
        self.token = token
        self._start_renewing()
        return True, current

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew_loop, name="yogacache-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                token = self.objects.write(self.key, self._payload(), if_token=self.token)
            except Exception as error:  # keep trying until the lease would expire
                log.warning("renewing build lease %s failed: %s", self.objects.url(self.key), error)
                continue
            if token is None:
                log.error("lost build lease %s to another node", self.objects.url(self.key))
                self.lost = True
                return
            self.token = token

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.token is not None and not self.lost:
            # Released = expired, written conditionally on our own version: this needs no
            # conditional delete (which not every server enforces) and never clobbers a
            # lease someone else holds.
            try:
                self.objects.write(self.key, self._payload(released=True), if_token=self.token)
            except Exception as error:  # an unreleased lease simply expires
                log.warning("releasing build lease %s failed: %s", self.objects.url(self.key), error)
        self.token = None
