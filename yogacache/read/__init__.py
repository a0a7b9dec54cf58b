"""Reading: random access to a sealed cache, sharding, shuffle orders and resume state.

Pure computation over local files: no network I/O, no framework.
"""

# Shuffle modes defined outside ``shuffle`` register themselves there when imported: importing
# any module of this package registers them all.
from yogacache.read import parts_shuffle as _parts_shuffle  # noqa: F401,E402
