"""Measurement logs kept in the repository, xz-compressed (tuning logs of long schedules
compress about 70x), so that what one session measured is there for the next.

A benchmark works on a plain log (appended to as it measures, so a run that dies loses
nothing) and restores it from the archive when it is missing; ``save`` writes the log
back into the archive when the run ends.
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path


def restore(archive: Path, log: Path) -> None:
    """Unpack ``archive`` into ``log`` unless ``log`` exists (it then holds at least as much)."""
    if log.exists() or not archive.exists():
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(archive, "rb") as source, open(log, "wb") as target:
        shutil.copyfileobj(source, target)


def save(log: Path, archive: Path) -> None:
    """Pack ``log`` into ``archive`` (replacing it)."""
    if not log.exists():
        return
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with open(log, "rb") as source, lzma.open(partial, "wb", preset=9) as target:
        shutil.copyfileobj(source, target)
    partial.replace(archive)


def merge(archive: Path, log: Path, target: str) -> int:
    """Append to ``log`` the records of ``archive`` measured on ``target`` that ``log``
    lacks, so a log kept by another benchmark for the same workloads (models.py's tuning
    of a model) joins one that began on other machines; returns how many were added."""
    if not archive.exists():
        return 0
    needle = f'"target":{json.dumps(target)},'
    present = set(log.read_text(encoding="utf-8").splitlines()) if log.exists() else set()
    with lzma.open(archive, "rt", encoding="utf-8") as source:
        added = [line for line in source.read().splitlines() if needle in line and line not in present]
    if added:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as target_log:
            target_log.write("".join(f"{line}\n" for line in added))
    return len(added)
