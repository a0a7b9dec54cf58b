"""The composition matrix: generated cells where store, build, delivery, order, consumer, start and
size meet, each checked against an oracle computed from the source (issue 22)."""
