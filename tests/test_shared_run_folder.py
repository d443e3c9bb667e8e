"""A launch's run folder (ranks.claim_folder, shared_folder) with two ranks simulated as two threads of this process:
ranks.gather and ranks.barrier exchange through a threading.Barrier, so both ranks run the real code on real
folders. The main process alone claims the folder; every rank that sees it passes and no mark is left behind; a rank
that does not see the main process's files, or whose own files the main process does not see, is refused on every
rank alike, naming it. (The same across two nodes with torchrun: tests/test_harvest_parallel.py, multiproc.)"""

from __future__ import annotations

import threading
from pathlib import Path

from spectool import ranks
from spectool.errors import SpectoolError


class TwoRanks:
    """ranks' collectives for two threads: gather puts each rank's object in its slot and every rank reads all."""

    def __init__(self, monkeypatch, world: int = 2):
        self.world, self.local, self.slots = world, threading.local(), [None] * world
        self.meet = threading.Barrier(world, timeout=30)
        monkeypatch.setattr(ranks, "world", lambda: world)
        monkeypatch.setattr(ranks, "rank", lambda: self.local.rank)
        monkeypatch.setattr(ranks, "gather", self.gather)
        monkeypatch.setattr(ranks, "barrier", self.meet.wait)
        monkeypatch.setattr(ranks, "SEE_WAIT_S", 0.3)  # a network filesystem's grace, short here

    def gather(self, obj):
        self.slots[self.local.rank] = obj
        self.meet.wait()
        out = list(self.slots)
        self.meet.wait()  # every rank has read before the next collective writes
        return out

    def run(self, fn) -> list:
        """fn(rank) on every rank at once: each rank's result, or the exception it raised."""
        results: list = [None] * self.world

        def one(r: int) -> None:
            self.local.rank = r
            try:
                results[r] = fn(r)
            except Exception as e:  # noqa: BLE001 - handed back to the test
                results[r] = e

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return results


def _claim(folder: Path, claimed: list):
    def claim():
        claimed.append(ranks.rank())
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        return "claimed"

    return claim


def test_the_main_process_claims_and_every_rank_that_sees_the_folder_passes_leaving_no_marks(tmp_path, monkeypatch):
    group, claimed, folder = TwoRanks(monkeypatch), [], tmp_path / "run"
    got = group.run(lambda r: ranks.claim_folder(folder, _claim(folder, claimed)))
    assert got == ["claimed", None] and claimed == [0]  # one claim, on the main process
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]  # the ranks' marks are gone


def test_a_rank_that_sees_another_folder_is_refused_on_every_rank(tmp_path, monkeypatch):
    """Rank 1's --out is another folder (another node's disk at the same path): neither sees the other's mark."""
    group, claimed = TwoRanks(monkeypatch), []
    folders = [tmp_path / "node0" / "run", tmp_path / "node1" / "run"]
    folders[1].mkdir(parents=True)
    got = group.run(lambda r: ranks.claim_folder(folders[r], _claim(folders[r], claimed)))
    for error in got:
        assert isinstance(error, SpectoolError), error
        assert "is not one folder for every process" in str(error) and "rank 1 (" in str(error)
    assert claimed == [0] and [p.name for p in folders[1].iterdir()] == []


def test_a_rank_whose_files_the_main_process_does_not_see_is_refused(tmp_path, monkeypatch):
    """Rank 1 reads the folder (it sees the main process's mark) but its own mark never reaches it (a read-only or
    stale view of the folder): the main process cannot see what rank 1 writes, so the launch is refused."""
    group, claimed, folder = TwoRanks(monkeypatch), [], tmp_path / "run"
    mark = ranks._mark
    monkeypatch.setattr(ranks, "_mark", lambda path: ranks.rank() == 0 and mark(path))
    got = group.run(lambda r: ranks.claim_folder(folder, _claim(folder, claimed), flag="--output-dir"))
    for error in got:
        assert isinstance(error, SpectoolError), error
        assert "--output-dir" in str(error) and "rank 1 (" in str(error) and "rank 0 (" in str(error)

