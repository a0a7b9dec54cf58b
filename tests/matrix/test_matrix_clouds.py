"""The composition matrix's cells on S3 and Azure (``test_matrix.CLOUD_HALF``); the other stores'
cells, the coverage checks and the module's description are in ``test_matrix.py``. A module of
their own: pytest-xdist's ``--dist loadfile`` runs the two halves on two workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.matrix.cells import Cell
from tests.matrix.conftest import World
from tests.matrix.test_matrix import cell_params, run_cell


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cell", cell_params(clouds=True))
def test_cell(cell: Cell, world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    run_cell(cell, world, request, tmp_path)
