"""Backends: bytes and keys in an object store (a directory, S3, GCS), behind one small contract.

``base`` holds the contract and the retry policy and imports no cloud library; ``registry``
maps URL schemes to backend classes, imported on use.
"""
