"""A run killed while torch inductor compiled left a zero-byte `.main.so`, and every later engine start failed
loading it ("InductorError: ImportError: ... main.so: file too short"). Now such a kernel is removed before an
engine starts, and a cut-short one met at the start is named with the command that mends it (engine/kernel_cache.py).
No engine starts here: the caches are folders of this test's own (TORCHINDUCTOR_CACHE_DIR, VLLM_CACHE_ROOT)."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    return tmp_path / "inductor", tmp_path / "vllm" / "torch_compile_cache"


def _kernel(path, data: bytes = b"", age_s: float = 3600):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_a_killed_compiles_zero_byte_kernel_is_removed_before_an_engine_starts(caches, caplog):
    from spectool.engine.kernel_cache import cache_dirs, remove_truncated_kernels

    inductor, vllm = caches
    assert cache_dirs() == [inductor.resolve(), vllm.resolve()]
    dead = [_kernel(inductor / "ai" / "cai7u2.main.so"), _kernel(vllm / "0c1d" / "inductor_cache" / "zz" / "czz.main.so")]
    kept = [_kernel(inductor / "vn" / "cvnux6.main.so", b"\x7fELF compiled"),  # a real kernel
            _kernel(inductor / "ev" / "cev3zc.main.so", age_s=1)]  # zero bytes, but a compile may be writing it now
    with caplog.at_level("WARNING"):
        assert sorted(remove_truncated_kernels()) == sorted(dead)
    assert not any(p.exists() for p in dead) and all(p.exists() for p in kept)
    assert "removed 2 zero-byte compiled kernel(s)" in caplog.text and str(dead[0]) in caplog.text
    assert remove_truncated_kernels() == []


def test_an_engine_start_that_loads_a_cut_short_kernel_names_the_folder_to_delete(caches):
    from spectool.engine.engine import EngineConfig, _start_error_advice

    inductor, vllm = caches
    cut = _kernel(inductor / "ai" / "cai7u2.main.so", b"\x7fEL", age_s=0)  # cut short, not empty: still there
    error = RuntimeError(f"InductorError: ImportError: {cut}: file too short")
    advice = _start_error_advice(error, EngineConfig(model_path="m"), cpu=True)
    assert advice.startswith("vLLM could not start: a compiled kernel in torch inductor's cache is cut short")
    assert f"({cut.resolve()}: file too short)" in advice and advice.endswith(f"rm -rf {inductor.resolve()}")
    # a GPU engine core's error reaches the engine log, not the exception
    logged = f"ERROR ... ImportError: {vllm}/0c1d/inductor_cache/zz/czz.main.so: file too short\n"
    advice = _start_error_advice(RuntimeError("Engine core initialization failed. See root cause above."),
                                 EngineConfig(model_path="m"), cpu=False, log=logged)
    assert advice.endswith(f"rm -rf {vllm.resolve()}"), advice
    other = RuntimeError("ImportError: /usr/lib/libfoo.so: file too short")  # not a compile cache's: not ours to delete
    assert "rm -rf" not in _start_error_advice(other, EngineConfig(model_path="m"), cpu=True)


def test_the_advice_reads_only_what_this_start_wrote_to_the_engine_log(tmp_path, monkeypatch):
    """The engine log is appended to by every run: an earlier start's cut-short kernel is not this one's."""
    from spectool.engine import logs

    log = tmp_path / "engine.log"
    log.write_text("ImportError: /tmp/x/c.main.so: file too short\n")
    monkeypatch.setenv(logs.ENV, str(log))
    monkeypatch.delenv("SPECTOOL_VERBOSE", raising=False)
    start = logs.log_size()
    with open(log, "a") as f:
        f.write("this start's own line\n")
    assert logs.written_since(start) == "this start's own line\n"


def test_a_configured_compile_cache_is_scanned_and_the_roots_logged(caches, tmp_path, caplog):
    """vLLM compiles into a user's compilation_config.cache_dir verbatim (review 4, N14): that folder is swept too,
    given as a dict or as a CompilationConfig-like object, and the roots scanned are logged."""
    from types import SimpleNamespace

    from spectool.engine.kernel_cache import cache_dirs, remove_truncated_kernels

    mine = tmp_path / "my-compile-cache"
    dead = _kernel(mine / "rank_0_0" / "backbone" / "inductor_cache" / "ab" / "cab.main.so")
    assert mine.resolve() in cache_dirs({"compilation_config": SimpleNamespace(cache_dir=str(mine))})
    assert cache_dirs({"compilation_config": 3}) == cache_dirs()  # a bare level names no folder
    with caplog.at_level("INFO", logger="spectool.engine.kernel_cache"):
        assert remove_truncated_kernels({"compilation_config": {"cache_dir": str(mine)}}) == [dead]
    assert f"compile caches scanned for cut-short kernels: {mine.resolve()}" in caplog.text


def test_age_is_judged_by_the_caches_own_clock_not_this_hosts(caches, monkeypatch):
    """On a cache shared over NFS the mtimes are the server's: a host clock an hour ahead took a kernel another node
    linked a minute ago for a stale one and deleted it. Judged by a file touched in the cache now, it is kept; where
    nothing can be touched there, this host's clock with a 10-minute floor."""
    from spectool.engine import kernel_cache

    inductor, _ = caches
    linking = _kernel(inductor / "ai" / "clinking.main.so", age_s=60)  # a minute old by the file system's clock
    dead = _kernel(inductor / "ev" / "cdead.main.so", age_s=3600)
    real_time = time.time
    monkeypatch.setattr(kernel_cache.time, "time", lambda: real_time() + 3600)  # this host's clock, an hour ahead
    assert kernel_cache.remove_truncated_kernels() == [dead.resolve()] and linking.exists()

    def read_only(*_a, **_k):
        raise PermissionError("read-only cache")

    monkeypatch.setattr(kernel_cache.tempfile, "NamedTemporaryFile", read_only)
    monkeypatch.setattr(kernel_cache.time, "time", real_time)
    five_minutes = _kernel(inductor / "ai" / "cfive.main.so", age_s=300)
    assert kernel_cache.remove_truncated_kernels() == [] and five_minutes.exists()  # under the 10-minute floor
