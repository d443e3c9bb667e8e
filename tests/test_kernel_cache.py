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
