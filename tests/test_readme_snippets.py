"""The README is a first page whose programs run as pasted (only their /tmp directories, the S3
endpoint and the bucket moved), printing what their ``# prints: ...`` comments say; and what a
newcomer reads first (there and on the pages it moved to) is true: the demo's epochs, where the
CLI is, the extras each snippet needs, every CLI command, the defaults, how tables were measured."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FRAGMENT = "<!-- fragment -->"


class Block(NamedTuple):
    heading: str  # the nearest heading above the block
    code: str
    fragment: bool  # marked as an excerpt: not run


def python_blocks(path: Path) -> list[Block]:
    """Every fenced Python block of a Markdown file, with the heading it is under."""
    text = path.read_text()
    blocks = []
    for match in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, re.S | re.M):
        before = text[: match.start()]
        headings = re.findall(r"^#{1,6} (.+)$", before, re.M)
        fragment = before.rstrip("\n").endswith(FRAGMENT)
        blocks.append(Block(headings[-1] if headings else "", match.group(1), fragment))
    return blocks


def readme() -> str:
    return (REPO / "README.md").read_text()


def section(title: str, text: str | None = None) -> str:
    """The text from the heading ``title`` to the next heading of any level."""
    text = readme() if text is None else text
    start = text.index(title)
    end = re.search(r"^#{1,6} ", text[start + len(title) :], re.M)
    return text[start : start + len(title) + end.start()] if end else text[start:]


def session(heading: str) -> str:
    """The README's Python blocks under ``heading``, one after the other, as one program."""
    blocks = [b for b in python_blocks(REPO / "README.md") if b.heading == heading and not b.fragment]
    assert blocks, f"no runnable block under {heading!r}"
    return "\n".join(b.code for b in blocks)


def promised(code: str) -> list[str]:
    return [line.strip() for line in re.findall(r"#\s*prints:\s*(.+)$", code, re.M)]


def run(code: str, tmp_path: Path, replace: dict[str, str] | None = None, timeout: int = 600) -> list[str]:
    """Runs ``code`` in a fresh interpreter, its /tmp/... directories moved under ``tmp_path``; checks
    that it exits 0 and prints, in order, each line its ``# prints:`` comments promise."""
    moved = re.sub(r"/tmp/([\w.-]+)", lambda m: str(tmp_path / "fresh" / m.group(1)), code)
    for old, new in (replace or {}).items():
        moved = moved.replace(old, new)
    script = tmp_path / f"snippet-{uuid.uuid4().hex[:6]}.py"  # a file: Grain and DataLoader workers import it
    script.write_text(moved)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line.strip() for line in result.stdout.splitlines()]
    expected = promised(code)
    found = iter(lines)
    missing = [line for line in expected if not any(line == out for out in found)]
    assert not missing, f"promised {missing}, printed {lines}"
    return lines


def cli_reference() -> str:
    """The generated CLI reference (docs/gen_cli.py, the site's hook)."""
    spec = importlib.util.spec_from_file_location("gen_cli", REPO / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return str(module.render())


# -- the README's programs, each run as pasted ------------------------------------------------------
RUN = {  # every heading with a runnable block, and the test that runs its blocks
    "Quickstart": "test_the_quickstart_runs_twice_building_once",
    "PyTorch": "test_the_pytorch_program_runs",
    "Determined": "test_the_determined_program_runs",
    "S3, GCS and Azure": "test_the_s3_and_streaming_programs_run",
    "Streaming under a budget": "test_the_s3_and_streaming_programs_run",
    "Mixtures, JAX (Grain) and Ray": "test_the_mixture_grain_and_ray_programs_run",
}


def test_every_readme_block_runs_in_a_test_or_is_a_fragment() -> None:
    blocks = python_blocks(REPO / "README.md")
    runnable = {b.heading for b in blocks if not b.fragment}
    assert runnable == set(RUN), runnable ^ set(RUN)
    assert set(RUN.values()) <= set(globals()), set(RUN.values()) - set(globals())
    assert all(promised(session(heading)) for heading in RUN), "each program promises what it prints"


def test_the_readme_is_a_first_page() -> None:
    text = readme()
    assert len(text.splitlines()) <= 250
    headings = re.findall(r"^##+ (.+)$", text, re.M)
    assert headings[:3] == ["Two commands", "Quickstart", "Where to go next"], headings
    for path in ("PyTorch", "Determined", "S3, GCS and Azure", "Streaming under a budget",
                 "Mixtures, JAX (Grain) and Ray"):
        assert re.search(r"\]\(docs/[\w-]+\.md", section(f"### {path}")), f"{path}: no link to its docs page"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).is_file(), link
    assert "](docs/benchmarks.md)" in section("## Benchmarks")
    assert len(section("## Benchmarks").strip().splitlines()) <= 14


def test_the_quickstart_runs_twice_building_once(tmp_path: Path) -> None:
    code = session("Quickstart")
    assert "/tmp/yogacache-quickstart" in code and "placeholder" not in code
    first = run(code, tmp_path)
    assert "building the cache" in first
    assert (tmp_path / "fresh" / "yogacache-quickstart" / "squares" / "v1_train" / "manifest.json").is_file()
    again = run(code, tmp_path)  # the cache hit: the function is not called
    assert "building the cache" not in again
    epochs = [line for line in again if line.startswith("epoch ")]
    assert epochs == ["epoch 0: 500 records", "epoch 1: 500 records"], again


def test_the_pytorch_program_runs(tmp_path: Path) -> None:
    run(session("PyTorch"), tmp_path)


def test_the_determined_program_runs(tmp_path: Path) -> None:
    run(session("Determined"), tmp_path)
    assert (tmp_path / "fresh" / "yogacache-det" / "mnist" / "v1_train" / "manifest.json").is_file()


def test_the_s3_and_streaming_programs_run(s3_server: Any, tmp_path: Path) -> None:
    recipe = section("### S3, GCS and Azure")
    assert "'moto[server,s3crc32c]'" in recipe  # without s3crc32c, moto's CRC32C is wrong and copies fail
    assert "moto_server" in recipe and (Path(sys.executable).parent / "moto_server").exists()
    assert "AWS_ACCESS_KEY_ID=" in recipe
    bucket = f"readme-{uuid.uuid4().hex[:10]}"
    moved = {"http://127.0.0.1:5000": s3_server.endpoint_url, "test-bucket": bucket}
    run(session("S3, GCS and Azure"), tmp_path, moved, timeout=300)
    listed = subprocess.run(
        [sys.executable, "-m", "yogacache", "ls", "--json", "--storage", f"s3://{bucket}/caches",
         "--endpoint-url", s3_server.endpoint_url],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert listed.returncode == 0, listed.stderr
    assert [(row["dataset_id"], row["records"]) for row in json.loads(listed.stdout)] == [("squares", 1000)]
    # the streaming program reads the bucket the S3 program made, from another node's directory
    run(session("Streaming under a budget"), tmp_path, moved, timeout=300)
    parts = list((tmp_path / "fresh" / "yogacache-node").rglob("*part-*.mdb"))
    assert parts and sum(p.stat().st_size for p in parts) <= 10 * 2**20


def test_the_mixture_grain_and_ray_programs_run(tmp_path: Path) -> None:
    code = session("Mixtures, JAX (Grain) and Ray")
    run(code.replace("ray.init(num_cpus=2)", "ray.init(num_cpus=2, include_dashboard=False)"), tmp_path)
    for link in ("docs/mixtures.md", "docs/grain.md", "docs/ray.md"):
        assert link in section("### Mixtures, JAX (Grain) and Ray")


def test_the_yogadl_program_runs(tmp_path: Path) -> None:
    (block,) = [b for b in python_blocks(REPO / "docs" / "yogadl.md") if "was: import yogadl" in b.code]
    assert "/tmp/yogadl_cache" in block.code
    lines = run(block.code + "\nprint([int(x) for x in records])\n", tmp_path)
    expected = [int(i) for i in np.random.RandomState(777).permutation(10)][5:]
    assert lines[-1] == str(expected)


# -- what the first page and the pages it links to say ----------------------------------------------
def test_the_two_commands_say_what_the_demo_does_and_where_the_cli_is() -> None:
    demo = (REPO / "examples" / "quickstart.py").read_text()
    epochs = int(re.search(r"^\s*epochs = (\d+)$", demo, re.M).group(1))  # type: ignore[union-attr]
    words = {3: "three", 5: "five", 10: "ten"}
    commands = section("## Two commands")
    assert f"for {words[epochs]} epochs" in commands
    assert ".venv/bin/yogacache" in commands  # `make demo` puts no yogacache on PATH
    makefile = (REPO / "Makefile").read_text()
    for target in re.findall(r"^make ([\w-]+)", commands, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_the_programs_do_not_share_a_cache() -> None:
    directories = re.findall(r'"host_storage_path": "([^"]+)"', readme())
    assert len(directories) == len(set(directories)), directories


def test_the_snippets_name_what_they_need() -> None:
    import yogacache.parallel

    extras = (REPO / "setup.cfg").read_text()
    for extra in ("torch", "determined", "s3", "grain", "ray", "sources", "docs"):
        assert re.search(rf"^{extra} =$", extras, re.M), extra
    assert "pip install 'yogacache[torch]'" in section("### PyTorch")
    assert "pip install 'yogacache[determined]'" in section("### Determined")
    assert "pip install 'yogacache[sources]'" in (REPO / "docs" / "sources.md").read_text()
    assert "pip install webdataset" in section("## Export to WebDataset", (REPO / "docs" / "cli.md").read_text())
    parallel = [b.code for b in python_blocks(REPO / "docs" / "tensorflow.md") if b.heading == "Parallel builds"][0]
    imported = {name.strip() for line in re.findall(r"^from \S+ import (.+?)(?:\s+#.*)?$", parallel, re.M)
                for name in line.split(",")}
    used = set(re.findall(r"\b([a-z_]+)\(", parallel)) & set(dir(yogacache.parallel))
    assert used <= imported, used - imported
    assert "plan_index_shards" in used


def test_the_cli_section_lists_every_command() -> None:
    from yogacache.cli import build_parser

    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    listed = set(re.findall(r"^yogacache (\w+)", section("## The command line"), re.M))
    assert commands == listed, commands ^ listed
    assert len(re.findall(r"^yogacache ", section("## The command line"), re.M)) <= 13


def test_the_part_size_defaults_are_the_codes() -> None:
    from yogacache.format.writer import DEFAULT_PART_SIZE
    from yogacache.sizes import format_size
    from yogacache.store.remote import REMOTE_PART_SIZE

    remote, local = format_size(REMOTE_PART_SIZE), format_size(DEFAULT_PART_SIZE)
    assert (remote, local) == ("64.0 MiB", "1.0 GiB")  # the words below say them this way
    storage = (REPO / "docs" / "storage.md").read_text()
    assert "Default: 64 MiB on `s3`, `gcs`, `azure`" in storage and "1 GiB on `shared_fs`" in storage
    reference = cli_reference()
    assert "1Gi on a directory and 64Mi on S3, GCS, Azure" in reference
    stale = re.search(r"default[^\n]{0,40}256 ?Mi|256 ?Mi\w* on S3", readme() + storage + reference)
    assert not stale, stale


def test_the_streaming_table_says_how_it_was_measured_and_what_missed() -> None:
    streaming = section("## Streaming", (REPO / "docs" / "benchmarks.md").read_text())
    assert "DataLoader(num_workers=2, batch_size=256)" in streaming and "dataset order" in streaming
    assert "`.venv/bin/python benchmarks/bench_stream.py`" in streaming
    # A figure over its target is never said to be within it: epoch 2 of the "parts" rows
    # against dataset - budget + one part, and the first batch against one part's fetch + 0.5 s.
    rows = re.findall(r"^\| yogacache parts +\| ([\d.]+) +\|.*\| ([\d.]+) +\|$", streaming, re.MULTILINE)
    assert len(rows) == 2, rows
    if any(float(epoch2) > 0.56 for _, epoch2 in rows):
        assert "**Epoch 2 within dataset - budget + one part: missed**" in streaming
    first_50, first_200 = (float(first) for first, _ in rows)
    if first_50 > 1.86 or first_200 > 0.84:
        assert "**First batch within one part's fetch + 0.5 s: missed**" in streaming


def test_the_mixture_benchmark_section_names_its_command_and_targets() -> None:
    block = section("## Mixtures", (REPO / "docs" / "benchmarks.md").read_text())
    assert "`.venv/bin/python benchmarks/bench_mix.py`" in block
    assert "DataLoader" in block and "shuffled" in block and "half the bytes as budget" in block
    assert "MosaicML" in block and "LitData" in block and "Targets, all met" in block


def test_every_benchmark_section_names_its_command() -> None:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(sections) >= 13
    for body in sections:
        assert re.search(r"benchmarks/bench_\w+\.py|make bench", body), body.splitlines()[0]


def test_the_azurite_recipe_runs(azure_server: Any, tmp_path: Path) -> None:
    """docs/storage.md's "Trying Azure on this machine": the shell steps name what `make test`
    installs, and the program runs as pasted against an Azurite server (its port and container
    moved; the connection string from the environment, as the recipe exports it)."""
    storage = (REPO / "docs" / "storage.md").read_text()
    recipe = section("## Trying Azure on this machine", storage)
    azurite = REPO / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    assert ".venv/azurite/node_modules/.bin/azurite-blob" in recipe and azurite.exists()
    assert "make .venv/azurite/.installed" in recipe
    exported = re.search(r'export AZURE_STORAGE_CONNECTION_STRING="([^"]+)"', recipe)
    assert exported is not None and "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1" in exported.group(1)
    (program,) = [block.code for block in python_blocks(REPO / "docs" / "storage.md")
                  if block.heading == "Trying Azure on this machine"]
    container = f"recipe-{uuid.uuid4().hex[:10]}"
    lines = run(program, tmp_path, {"test-container": container}, timeout=300)
    assert lines[-1] == "1000 records", lines
    listed = subprocess.run(
        [sys.executable, "-m", "yogacache", "ls", "--json", "--storage", f"az://{container}/caches"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert listed.returncode == 0, listed.stderr
    assert [(row["dataset_id"], row["records"]) for row in json.loads(listed.stdout)] == [("squares", 1000)]
