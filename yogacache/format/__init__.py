"""The cache format: element specs, the record codec, manifests, the writer and sealing.

Knows LMDB and bytes on disk; imports no store, no cloud library and no framework.
"""
