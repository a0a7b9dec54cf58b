"""Reading: random access to a sealed cache, sharding, shuffle orders and resume state.

Pure computation over local files: no network I/O, no framework.
"""
