"""The release number of this yogacache (also written into every manifest it seals)."""

__version__ = "0.2.0"
