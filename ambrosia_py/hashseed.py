"""One string hash seed per instance, so that every incarnation iterates sets as the first.

Python salts the hash of ``str`` and ``bytes`` with a seed chosen at each start
(``PYTHONHASHSEED``), and a ``set``'s iteration order follows those hashes. A handler that
iterates a set of strings (or pops from one) therefore did one thing in the run that
logged its input and may do another in the process that replays it after a crash: the
replay diverges from what was acknowledged, silently. ``replay --verify`` cannot see it
either, since both of its replays run in one process, under one seed.

So the seed is part of an instance's history. At its first start ``run`` draws one at
random (a different one per instance: hash flooding by chosen keys stays as hard as
Python makes it) and keeps it in ``<data dir>/<instance>.hash-seed`` (mode 0600). Every
command that runs the instance's handlers (``run``, ``replay``, ``debug``) runs them
under it: if the process was started with another seed it executes itself again with
the instance's, before anything ran. An instance whose data dir has no seed file (made
before this existed) runs under whatever seed its process has.

Only the real program executes itself again: called in-process (click's test runner,
the pytest plugin's runner), the command runs under the caller's seed, the same for the
run and its replays.

The program does it as early as it can (:func:`switch_early`, from ``cli/``): when its
command line names the instance and data dir, before it imports the commands or loads
the service file, which would otherwise be done twice (about 0.4 s of every restart).
The command still checks afterwards, the one that decides: the early step only saves
time. This module therefore imports nothing but the standard library's smallest modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR",
    "HASH_SEED_ENV",
    "SEED_SUFFIX",
    "as_program",
    "executed_again",
    "instance_seed",
    "run_under_seed",
    "switch_early",
]

HASH_SEED_ENV = "PYTHONHASHSEED"
# Set for the process run_under_seed starts, read (and cleared) by executed_again.
_AGAIN_ENV = "AMBROSIA_PY_UNDER_INSTANCE_SEED"
SEED_SUFFIX = ".hash-seed"
# ``--data-dir``'s variable and default, here because this module imports nothing
# (``cli/options.py`` and ``coordinator/storage/data_dir.py`` take them from here).
DATA_DIR_ENV = "AMBROSIA_DATA_DIR"
DEFAULT_DATA_DIR = Path("ambrosia-data")
# The commands that run an instance's handlers, under its hash seed.
_SEEDED = frozenset({"run", "replay", "debug"})
_MAX_SEED = 4_294_967_295  # PYTHONHASHSEED's largest; 0 would turn salting off
_program = [False]


def as_program() -> None:
    """Called by the ``ambrosia-py`` program's entry point: it may execute itself again."""
    _program[0] = True


def executed_again() -> bool:
    """Whether :func:`run_under_seed` started this process: its seed is the one that the
    command line asked for, and the early step (``cli/``) must not second-guess it (were
    the two to disagree, they would execute the program again in turn, for ever). The
    mark is removed from the environment, so that the processes this one starts do not
    inherit it."""
    return os.environ.pop(_AGAIN_ENV, None) is not None


def instance_seed(data_dir: Path, instance: str, *, create: bool) -> int | None:
    """The instance's seed; with ``create``, drawn and kept at its first start. None: no
    seed file and not to create one. A file that is not a seed is a ValueError naming it."""
    path = Path(data_dir) / f"{instance}{SEED_SUFFIX}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        if not create:
            return None
        import secrets  # here: a restart, which reads the seed, does without its imports

        seed = 1 + secrets.randbelow(_MAX_SEED)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another start made it meanwhile: take that one
            return instance_seed(data_dir, instance, create=False)
        with os.fdopen(fd, "w") as f:
            f.write(f"{seed}\n")
            f.flush()
            os.fsync(f.fileno())
        return seed
    value = text.strip()
    if not value.isdigit() or not 1 <= int(value) <= _MAX_SEED:
        raise ValueError(
            f"{path} holds {value[:40]!r}, not a hash seed (1 to {_MAX_SEED}); it is part of "
            f"instance {instance!r}'s history: restore it rather than delete it"
        )
    return int(value)


def run_under_seed(seed: int | None) -> None:
    """Execute this program again under ``seed`` unless it runs under it already (or is
    not the program, or has no seed to keep). Returns only if nothing needs to change."""
    if seed is None or not _program[0] or os.environ.get(HASH_SEED_ENV) == str(seed):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [sys.executable, "-m", "ambrosia_py.cli", *sys.argv[1:]]
    os.execve(sys.executable, argv, {**os.environ, HASH_SEED_ENV: str(seed), _AGAIN_ENV: "1"})


def _seeded_instance(args: list[str]) -> tuple[Path, str] | None:
    """The data dir and instance of a ``run``, ``replay`` or ``debug`` command line that
    names its instance (``run`` without ``--instance`` takes its class's name: only the
    command knows it). None when unsure: the command decides anyway."""
    if not args or args[0] not in _SEEDED:
        return None
    found: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            break
        if arg in ("-h", "--help"):
            return None
        option, equals, value = arg.partition("=")
        if option not in ("--instance", "--data-dir"):
            continue
        if not equals:
            following = next(rest, None)
            if following is None:
                return None
            value = following
        found[option] = value  # the last one counts, as for click
    instance = found.get("--instance")
    data_dir = found.get("--data-dir") or os.environ.get(DATA_DIR_ENV) or str(DEFAULT_DATA_DIR)
    if not instance or ("--data-dir" in found and not found["--data-dir"]):
        return None
    return Path(data_dir), instance


def switch_early(args: list[str]) -> None:
    """Execute the program again under the instance's hash seed now, with little imported
    and no service file loaded yet, if its command line names the instance and a seed
    file is there. Never makes the seed file (``run`` checks its command line first), and
    leaves a seed file it cannot read to the command, which says what is wrong."""
    if executed_again():
        return
    where = _seeded_instance(args)
    if where is None:
        return
    try:
        seed = instance_seed(*where, create=False)
    except (OSError, ValueError):
        return
    run_under_seed(seed)
