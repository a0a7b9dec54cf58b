"""Benchmark worker: runs measurement tasks in a fresh interpreter and writes their results as JSON.

Run by ``bench_core.py`` as ``python _worker.py RESULT_JSON TASKS_JSON`` with the interpreter of
the library under test (the main venv for yogacache, tf.data and raw lmdb; the YogaDL venv for
YogaDL). ``TASKS_JSON`` is a list of ``{"task": name, "key": result-key, ...params}``; the
results file maps each key to ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}`` and is
rewritten after every task, so a crash or timeout keeps what finished.

Everything a task needs is imported before its clock starts (TensorFlow and the library are
imported by ``_prepare``), so the timings exclude imports but include all cold-start work.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

_ARRAYS: dict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = {}
_SOURCES: dict[tuple[int, tuple[int, ...], bool], Any] = {}


# ---------------------------------------------------------------------------------------------
# helpers


def _lib(name: str) -> tuple[Any, Any]:
    """``(storage module, tensorflow adapter module)`` of ``yogacache`` or ``yogadl``."""
    import importlib

    if name not in ("yogacache", "yogadl"):
        raise ValueError(f"unknown library {name!r}")
    return importlib.import_module(f"{name}.storage"), importlib.import_module(f"{name}.tensorflow")


def _lib_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - best effort
        module = sys.modules.get(name)
        return str(getattr(module, "__version__", "?"))


def _arrays(params: dict[str, Any]) -> tuple[Any, Any]:
    key = (int(params["records"]), tuple(params["shape"]))
    if key not in _ARRAYS:
        _ARRAYS[key] = _data.make_arrays(key[0], key[1])
    return _ARRAYS[key]


def _source(params: dict[str, Any]) -> Any:
    """The tf.data source: in-memory tensors, or (``"jpeg": True``) JPEGs decoded on the fly."""
    jpeg = bool(params.get("jpeg"))
    key = (int(params["records"]), tuple(params["shape"]), jpeg)
    if key not in _SOURCES:
        make = _data.make_jpeg_source if jpeg else _data.make_tf_source
        _SOURCES[key] = make(*_arrays(params))
    return _SOURCES[key]


def _du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _batch_len(batch: Any) -> int:
    import tensorflow as tf

    return int(tf.nest.flatten(batch)[0].shape[0])


def _consume(dataset: Any) -> int:
    """Iterates a batched dataset to the end; returns the number of records seen."""
    count = 0
    for batch in dataset:
        count += _batch_len(batch)
    return count


def _best(times: list[float], records: int) -> dict[str, Any]:
    """Best (shortest) of the repetitions, as the steady-state rate; all times are kept."""
    best = min(times)
    median = statistics.median(times)
    return {
        "records": records,
        "seconds": best,
        "rate": records / best,
        "median_rate": records / median,
        "all_seconds": times,
    }


def _reps(p: dict[str, Any]) -> int:
    return max(1, int(p.get("reps", 1)))


def _proc_status() -> dict[str, int]:
    """RssAnon / RssFile / VmRSS / VmHWM of this process in bytes (Linux)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem", "VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def _files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    out = []
    for root, _dirs, files in os.walk(path):
        out += [os.path.join(root, name) for name in sorted(files)]
    return out


def _drop_page_cache(path: str) -> int:
    """Evicts the files under ``path`` from the page cache (clean pages); returns their bytes."""
    total = 0
    for name in _files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def _prewarm(path: str) -> float:
    """Reads every file under ``path`` once so that it is in the page cache; returns seconds.

    Needed because the benchmark VMs page out memory that has been idle for a few seconds
    (including the page cache), so "the cache was just written" does not mean "it is cached".
    """
    t0 = time.perf_counter()
    buf = bytearray(8 << 20)
    for name in _files(path):
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0


def _wipe(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


# ---------------------------------------------------------------------------------------------
# tasks


def task_source_consume(p: dict[str, Any]) -> dict[str, Any]:
    """Rate of consuming the tf.data source alone: ``for b in ds.batch(256): pass``."""
    ds = _source(p)
    times = []
    for _ in range(_reps(p)):
        t0 = time.perf_counter()
        for _b in ds.batch(_data.BATCH):
            pass
        times.append(time.perf_counter() - t0)
    return _best(times, int(p["records"]))


def _build_reps(p: dict[str, Any], submit: Callable[[Any, str], None]) -> dict[str, Any]:
    """Times ``submit(storage, version)`` ``reps`` times; the last build is the one kept."""
    storage, _ = _lib(p["lib"])
    os.makedirs(p["dir"], exist_ok=True)
    st = storage.LFSStorage(storage.LFSConfigurations(storage_dir_path=p["dir"]))
    times = []
    reps = _reps(p)
    for rep in range(reps):
        version = _data.DATASET_VERSION if rep == reps - 1 else f"warmup{rep}"
        t0 = time.perf_counter()
        submit(st, version)
        times.append(time.perf_counter() - t0)
        if version != _data.DATASET_VERSION:
            _wipe(os.path.join(p["dir"], p["dataset_id"], version))
    out = _best(times, int(p["records"]))
    out["disk_bytes"] = _du(os.path.join(p["dir"], p["dataset_id"]))
    out["version"] = _lib_version(p["lib"])
    return out


def task_build_tf(p: dict[str, Any]) -> dict[str, Any]:
    """``storage.submit(tf.data source)`` for yogacache or YogaDL."""
    ds = _source(p)
    return _build_reps(p, lambda st, version: st.submit(ds, p["dataset_id"], version))


def task_build_mem(p: dict[str, Any]) -> dict[str, Any]:
    """yogacache ``submit`` of an in-memory list of ``(image, label)`` numpy tuples."""
    images, labels = _arrays(p)
    items = [(images[i], labels[i]) for i in range(int(p["records"]))]
    try:
        return _build_reps(p, lambda st, version: st.submit(items, p["dataset_id"], version))
    finally:
        if p.get("cleanup"):
            _wipe(p["dir"])


def task_lmdb_append(p: dict[str, Any]) -> dict[str, Any]:
    """Raw lmdb: pre-serialized values, 8-byte big-endian keys, one ``putmulti(append=True)``."""
    import lmdb

    images, labels = _arrays(p)
    n = int(p["records"])
    values = [images[i].tobytes() + labels[i].tobytes() for i in range(n)]
    keys = [struct.pack(">Q", i) for i in range(n)]
    path = p["path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    times = []
    added = disk = 0
    for _ in range(_reps(p)):
        _wipe(path)
        _wipe(path + "-lock")
        t0 = time.perf_counter()
        env = lmdb.open(path, subdir=False, map_size=1 << 40, meminit=False, readahead=False)
        with env.begin(write=True) as txn:
            with txn.cursor() as cursor:
                _consumed, added = cursor.putmulti(zip(keys, values, strict=True), append=True)
        env.sync(True)
        env.close()
        times.append(time.perf_counter() - t0)
        disk = _du(path)
        if added != n:
            raise RuntimeError(f"putmulti added {added} of {n} records")
    if p.get("cleanup"):
        _wipe(path)
        _wipe(path + "-lock")
    out = _best(times, n)
    out.update(disk_bytes=disk, lmdb=lmdb.__version__)
    return out


def _read_pipeline(ref: Any, adapter: Any, per_element: bool = False) -> tuple[Any, Any]:
    """The measured consumer: shard 0 of 2, shuffled, ``make_tf_dataset(...).batch(256).prefetch(2)``.

    ``per_element`` batches through ``tf.data.Dataset.batch`` itself (element by element, as
    when a ``map`` or ``shuffle`` sits before ``batch``) instead of the dataset's own ``batch``,
    which yogacache implements by rebatching whole reads.
    """
    import tensorflow as tf

    stream = ref.stream(
        shuffle=True,
        shuffle_seed=_data.SHUFFLE_SEED,
        shard_rank=_data.SHARD_RANK,
        num_shards=_data.NUM_SHARDS,
    )
    dataset = adapter.make_tf_dataset(stream)
    batched = tf.data.Dataset.batch(dataset, _data.BATCH) if per_element else dataset.batch(_data.BATCH)
    return stream, batched.prefetch(_data.PREFETCH)


def task_read(p: dict[str, Any]) -> dict[str, Any]:
    """Shuffled, sharded read: ``make_tf_dataset(stream).batch(256).prefetch(2)`` to the end.

    One cold pass (the cache's files evicted from the page cache first), then ``reps`` warm
    passes (files read into the page cache first, outside the clock); the best warm pass is the
    reported rate. As for tf.data's ``cache(filename)`` (``_two_pass``), the pipeline is built
    once and each pass is one iteration of it (the next epoch); the cold pass's clock covers
    ``stream()`` and ``make_tf_dataset`` too. ``fresh_rate``: the best of ``reps`` more warm
    passes that each build a new stream and pipeline inside the clock.
    """
    storage, adapter = _lib(p["lib"])
    cache_dir = os.path.join(p["dir"], p["dataset_id"])
    _drop_page_cache(cache_dir)
    st = storage.LFSStorage(storage.LFSConfigurations(storage_dir_path=p["dir"]))
    t0 = time.perf_counter()
    ref = st.fetch(p["dataset_id"], _data.DATASET_VERSION)
    t_fetch = time.perf_counter() - t0

    built: list[Any] = []

    def one_pass(fresh: bool) -> tuple[float, int]:
        t1 = time.perf_counter()
        if fresh or not built:
            built[:] = _read_pipeline(ref, adapter, bool(p.get("per_element")))
        stream, ds = built
        count = _consume(ds)
        dt = time.perf_counter() - t1
        if count != len(stream):
            raise RuntimeError(f"read {count} records, stream length is {len(stream)}")
        del ds, stream
        gc.collect()
        return dt, count

    cold, count = one_pass(fresh=False)
    times, fresh_times = [], []
    for _ in range(_reps(p)):
        _prewarm(cache_dir)
        times.append(one_pass(fresh=False)[0])
    for _ in range(_reps(p)):
        _prewarm(cache_dir)
        fresh_times.append(one_pass(fresh=True)[0])
    out = _best(times, count)
    out.update(
        fetch_seconds=t_fetch,
        cold_seconds=cold,
        cold_rate=count / cold,
        fresh_rate=count / min(fresh_times),
        all_fresh_seconds=fresh_times,
    )
    return out


def _two_pass(p: dict[str, Any], make: Callable[[Any], Any], settle: Callable[[], None]) -> dict[str, Any]:
    """One write pass, then ``reps`` read passes (best reported)."""
    src = _source(p)
    n = int(p["records"])
    ds = make(src)
    t0 = time.perf_counter()
    written = _consume(ds.batch(_data.BATCH))
    t_write = time.perf_counter() - t0
    settle()
    times = []
    for _ in range(_reps(p)):
        _prewarm(p["dir"])
        t0 = time.perf_counter()
        read = _consume(ds.batch(_data.BATCH).prefetch(_data.PREFETCH))
        times.append(time.perf_counter() - t0)
        if written != n or read != n:
            raise RuntimeError(f"expected {n} records, wrote {written}, read {read}")
    return {
        "records": n,
        "write_seconds": t_write,
        "write_rate": n / t_write,
        "read_seconds": min(times),
        "read_rate": n / min(times),
        "all_read_seconds": times,
        "disk_bytes": _du(p["dir"]),
    }


def _collect() -> None:
    gc.collect()


def task_tf_cache(p: dict[str, Any]) -> dict[str, Any]:
    """tf.data ``cache(filename)``: first pass writes the file cache, second pass reads it."""
    os.makedirs(p["dir"], exist_ok=True)
    filename = os.path.join(p["dir"], "cache")
    try:
        out = _two_pass(p, lambda src: src.cache(filename), _collect)
    finally:
        if p.get("cleanup"):
            _wipe(p["dir"])
    return out


def task_tf_snapshot(p: dict[str, Any]) -> dict[str, Any]:
    """tf.data ``snapshot(path)`` (default compression): first pass writes, second pass reads."""
    os.makedirs(p["dir"], exist_ok=True)
    path = os.path.join(p["dir"], "snapshot")

    def settle() -> None:
        # The writer finalizes when the first iterator is gone; let its threads finish.
        gc.collect()
        time.sleep(0.5)

    try:
        out = _two_pass(p, lambda src: src.snapshot(path), settle)
    finally:
        if p.get("cleanup"):
            _wipe(p["dir"])
    out["compression"] = "AUTO (default)"
    return out


def task_ttfe(p: dict[str, Any]) -> dict[str, Any]:
    """Cache-hit time to the first batch of ``...batch(256).prefetch(2)``, from a cold pipeline.

    The cache's files are read into the page cache just before the clock starts (``cold``:
    evicted instead), so that the comparison with in-memory data measures the library.
    """
    mode = p["mode"]
    if mode == "generator":
        import numpy as np
        import tensorflow as tf

        images, labels = _arrays(p)  # the in-memory data exists before the clock starts
        shape = tuple(p["shape"])
        t0 = time.perf_counter()
        order = _data.shard_order(int(p["records"]))

        def gen() -> Any:
            for i in order:
                yield images[i], labels[i]

        ds = tf.data.Dataset.from_generator(
            gen,
            output_signature=(
                tf.TensorSpec(shape, tf.uint8),
                tf.TensorSpec((), tf.int64),
            ),
        )
        first = next(iter(ds.batch(_data.BATCH).prefetch(_data.PREFETCH)))
        dt = time.perf_counter() - t0
        del np
    else:
        storage, adapter = _lib(mode)
        cache_dir = os.path.join(p["dir"], p["dataset_id"])
        if p.get("cold"):
            _drop_page_cache(cache_dir)
        else:
            _prewarm(cache_dir)
        t0 = time.perf_counter()
        st = storage.LFSStorage(storage.LFSConfigurations(storage_dir_path=p["dir"]))

        @st.cacheable(p["dataset_id"], _data.DATASET_VERSION)
        def make() -> Any:
            raise RuntimeError("cache miss: the cache should already exist")

        _, ds = _read_pipeline(make(), adapter)
        first = next(iter(ds))
        dt = time.perf_counter() - t0
    return {"seconds": dt, "ms": dt * 1000.0, "first_batch": _batch_len(first)}


def task_mem_build(p: dict[str, Any]) -> dict[str, Any]:
    """Builds the tiny-record cache (an int64 label per record) used by ``mem_read``."""
    import numpy as np

    n = int(p["records"])
    os.makedirs(p["dir"], exist_ok=True)
    labels = np.random.default_rng(_data.DATA_SEED).integers(0, _data.NUM_CLASSES, n, dtype=np.int64)
    t0 = time.perf_counter()
    if p["lib"] == "yogadl":
        # YogaDL only submits tf.data datasets, whose per-element numpy iteration would take
        # minutes at 1M records; write the identical LMDB layout with YogaDL's own serializer.
        import pathlib

        import tensorflow as tf
        import yogadl

        path = pathlib.Path(p["dir"]) / p["dataset_id"] / _data.DATASET_VERSION / "cache.mdb"
        path.parent.mkdir(parents=True, exist_ok=True)
        yogadl.serialize_generator_to_lmdb(
            dataset_generator=iter(labels),
            data_shapes=tf.TensorShape([]),
            data_types=tf.int64,
            lmdb_path=path,
        )
    else:
        storage, _ = _lib(p["lib"])
        st = storage.LFSStorage(storage.LFSConfigurations(storage_dir_path=p["dir"]))
        st.submit(iter(labels), p["dataset_id"], _data.DATASET_VERSION)
    dt = time.perf_counter() - t0
    return {"records": n, "seconds": dt, "rate": n / dt, "disk_bytes": _du(p["dir"])}


def task_mem_read(p: dict[str, Any]) -> dict[str, Any]:
    """Anonymous RSS growth from opening + iterating a full shuffled stream (TF already loaded)."""
    storage, _adapter = _lib(p["lib"])
    import tensorflow as tf  # noqa: F401 - part of the baseline

    gc.collect()
    before = _proc_status()
    peak = dict(before)

    def sample() -> None:
        for k, v in _proc_status().items():
            peak[k] = max(peak.get(k, 0), v)

    st = storage.LFSStorage(storage.LFSConfigurations(storage_dir_path=p["dir"]))
    ref = st.fetch(p["dataset_id"], _data.DATASET_VERSION)
    stream = ref.stream(shuffle=True, shuffle_seed=_data.SHUFFLE_SEED)
    sample()
    after_open = _proc_status()
    count = 0
    every = int(p.get("sample_every", 8192))
    for _element in stream:
        count += 1
        if count % every == 0:
            sample()
    sample()
    after = _proc_status()
    if count != int(p["records"]):
        raise RuntimeError(f"iterated {count} records, expected {p['records']}")
    mib = 1 << 20
    return {
        "records": count,
        "rss_anon_before_mib": before["RssAnon"] / mib,
        "rss_anon_open_delta_mib": (after_open["RssAnon"] - before["RssAnon"]) / mib,
        "rss_anon_end_delta_mib": (after["RssAnon"] - before["RssAnon"]) / mib,
        "rss_anon_peak_delta_mib": (peak["RssAnon"] - before["RssAnon"]) / mib,
        "rss_file_peak_delta_mib": (peak.get("RssFile", 0) - before.get("RssFile", 0)) / mib,
        "vm_rss_peak_delta_mib": (peak["VmRSS"] - before["VmRSS"]) / mib,
    }


TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    name[len("task_") :]: fn for name, fn in globals().items() if name.startswith("task_")
}


def _prepare(tasks: list[dict[str, Any]]) -> None:
    """Imports everything the tasks need up front, so no timed region pays for imports."""
    libs = {t["lib"] for t in tasks if t.get("lib")} | {
        t["mode"] for t in tasks if t.get("mode") in ("yogacache", "yogadl")
    }
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401

    for lib in sorted(libs):
        try:
            _lib(lib)
        except Exception:  # noqa: BLE001 - reported per task below
            pass
    if any(t["task"] == "lmdb_append" for t in tasks):
        import lmdb  # noqa: F401


def main(argv: list[str]) -> int:
    result_path, tasks_json = argv[1], argv[2]
    tasks: list[dict[str, Any]] = json.loads(tasks_json)
    results: dict[str, Any] = {}

    def flush() -> None:
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, result_path)

    _prepare(tasks)
    for spec in tasks:
        key = spec.get("key", spec["task"])
        print(f"[worker] {key} ...", file=sys.stderr, flush=True)
        try:
            out = TASKS[spec["task"]](spec)
            out["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
            traceback.print_exc()
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:500]}
        out["python"] = sys.executable
        results[key] = out
        flush()
        print(f"[worker] {key}: {json.dumps(out)}", file=sys.stderr, flush=True)
        gc.collect()
    flush()
    return 0


if __name__ == "__main__":
    rc = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Results are on disk; skip interpreter teardown, where destroying a tf.data iterator whose
    # from_generator prefetch thread is mid-call can hang forever (seen with YogaDL and yogacache).
    os._exit(rc)
