"""Reading: random access to a sealed cache, sharding, shuffle orders and resume state.

Pure computation over local files: no network I/O, no framework.
"""

# The shuffle-mode registry first: it imports the modes defined in their own modules
# (``parts_shuffle``), which subclass its base class.
from yogacache.read import shuffle as _shuffle  # noqa: F401,E402
