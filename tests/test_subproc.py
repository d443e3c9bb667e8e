"""spectool.subproc: a call runs its function in its own process, fresh or forked from a forkserver that imported
the `warm` modules once (sweep-k's arms and verify's kernel control on the CPU build); either way the child gets
the caller's environment and folder as they are at the call, its progress lines reach the caller, its error the
exception, and no two calls share a process."""

from __future__ import annotations

import os
import sys

import pytest

from spectool import subproc
from spectool.errors import SpectoolError

WARM = ("json", "colorsys")  # cheap stand-ins for vLLM, torch and transformers: the same path, in milliseconds


def where(name: str) -> dict:
    """The child's view: its process, the variable `name`, its folder, whether a warm module was already loaded."""
    subproc.report(f"child {os.getpid()} says hello")
    return {"pid": os.getpid(), "parent": os.getppid(), "value": os.environ.get(name), "cwd": os.getcwd(),
            "warm_loaded": "colorsys" in sys.modules}


def _importable(monkeypatch) -> None:
    """This module importable by name in the child: a fresh interpreter reads PYTHONPATH, a forked one has sys.path."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(here)


def fail() -> None:
    raise SpectoolError("the arm could not start: raise --max-model-len")


@pytest.mark.parametrize("warm", [(), WARM], ids=["fresh", "forked"])
def test_a_call_runs_in_its_own_process_with_the_callers_environment_and_folder(warm, tmp_path, monkeypatch):
    said = []
    # set after any forkserver started (an earlier call in this process): the call's environment is the caller's now
    monkeypatch.setenv("SPECTOOL_SUBPROC_PROBE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _importable(monkeypatch)
    a = subproc.call(__name__, "where", {"name": "SPECTOOL_SUBPROC_PROBE"}, env={"EXTRA": "1"}, progress=said.append,
                     warm=warm)
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")  # after the server started: the call's folder is the caller's now
    b = subproc.call(__name__, "where", {"name": "EXTRA"}, env={"EXTRA": "2"}, warm=warm)
    assert a["value"] == str(tmp_path) and b["value"] == "2"  # the caller's environment, then the call's `env`
    assert (a["cwd"], b["cwd"]) == (str(tmp_path), str(tmp_path / "b"))
    assert len({a["pid"], b["pid"], os.getpid()}) == 3  # each call its own process
    assert said == [f"child {a['pid']} says hello"]
    if warm:  # forked from the server that imported the warm modules: not a child of this process, and no import
        assert a["parent"] == b["parent"] != os.getpid() and a["warm_loaded"]
    else:
        assert a["parent"] == os.getpid() and not a["warm_loaded"]


@pytest.mark.parametrize("warm", [(), WARM], ids=["fresh", "forked"])
def test_a_childs_error_is_the_callers_exception_with_its_message(warm, monkeypatch):
    _importable(monkeypatch)
    with pytest.raises(SpectoolError, match=r"^the arm failed: the arm could not start: raise --max-model-len$"):
        subproc.call(__name__, "fail", {}, what="the arm", warm=warm)


if __name__ == "__main__":
    subproc.serve(globals())
