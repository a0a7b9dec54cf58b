"""The format layer imports no framework: framework sources come from a registry of import strings."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yogacache.format import sources
from yogacache.format.sources import SOURCES, SourceEntry, source_for

REPO = Path(__file__).resolve().parent.parent
FORMAT = REPO / "yogacache" / "format"
FORBIDDEN = ("yogacache.tensorflow", "yogacache.torch", "tensorflow", "torch", "boto3", "google")


def imported_modules(path: Path) -> list[str]:
    """Every module an import statement of ``path`` names, at any depth (lazy imports included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(FORMAT.glob("*.py")), ids=lambda p: p.name)
def test_format_modules_import_no_framework(path: Path) -> None:
    bad = [
        name
        for name in imported_modules(path)
        if any(name == forbidden or name.startswith(forbidden + ".") for forbidden in FORBIDDEN)
    ]
    assert bad == [], f"{path.name} imports {bad}"


def test_the_checker_sees_a_lazy_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from yogacache.tensorflow import TFDatasetSource\n    import torch.utils\n")
    assert "yogacache.tensorflow" in imported_modules(sample) and "torch.utils" in imported_modules(sample)


def test_building_from_python_data_imports_no_framework() -> None:
    script = (
        "import sys\n"
        "from yogacache.format.sources import source_for\n"
        "source_for([{'a': 1}, {'a': 2}])\n"
        "source_for(range(3))\n"
        "bad = [m for m in ('tensorflow', 'torch', 'yogacache.tensorflow', 'yogacache.torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(REPO), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_tensorflow_entry_points_at_the_adapter() -> None:
    (entry,) = [e for e in SOURCES if e.target == "yogacache.tensorflow:TFDatasetSource"]
    assert "pip install" in entry.install_hint
    assert not entry.detect([1, 2, 3]) and not entry.detect(np.zeros(3))


def test_source_for_still_builds_from_a_tf_data_dataset(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    from yogacache.tensorflow import TFDatasetSource

    dataset = tf.data.Dataset.from_tensor_slices({"x": np.arange(6, dtype=np.int64)})
    source = source_for(dataset)
    assert isinstance(source, TFDatasetSource)
    assert source.cardinality == 6
    assert sum(len(batch) for batch in source.encoded_batches()) == 6


def test_a_missing_adapter_raises_import_error_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = SourceEntry(lambda data: data == "frame", "yogacache_no_such_module:Source", "pip install 'yogacache[x]'")
    monkeypatch.setattr(sources, "SOURCES", (entry, *SOURCES))
    with pytest.raises(ImportError, match=r"pip install 'yogacache\[x\]'"):
        source_for("frame")
    assert type(source_for([1, 2])).__name__ == "PythonSource"  # undetected data never imports it
