"""Data dirs, secrets and keys another user owns are refused (``coordinator/storage/ownership.py``).

The attack: as ``nobody``, make ``ambrosia-data`` in a world-writable sticky directory
(as /tmp) with a ``link-secret`` of one's choosing; root then runs a service from there,
and whoever chose the secret can send it pickles. Here ``nobody``'s files are made by a
real child process dropped to that user, and root's side runs the real ``ambrosia-py``
commands: each refuses promptly in one line naming the path, its owner and the fix, and
changes neither mode nor owner of what it refused.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client
from ambrosia_py.client.calls import client_secret
from ambrosia_py.coordinator.links.config import (
    LinkSettings,
    LinkSetupError,
    load_secret,
    tls_contexts,
)
from ambrosia_py.coordinator.registry.files import RegistryRefusal, prepare_start
from ambrosia_py.coordinator.storage.data_dir import DataDirError, writable_data_dir
from ambrosia_py.coordinator.storage.modes import tighten
from ambrosia_py.ingress.errors import IngressError

from .certs import mutual_tls, needs_openssl
from .ingress_process import DEADLINE, RunProcess, free_port

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or NOBODY is None or NOBODY.pw_uid == 0,
    reason="files of another user are made by root dropping to the user nobody",
)
NOBODY_UID = NOBODY.pw_uid if NOBODY is not None else -1
OWNER = f"nobody (uid {NOBODY_UID})"
ROOT = "root (uid 0)"


def as_nobody(script: str, cwd: Path) -> None:
    """Run ``sh -c script`` in ``cwd`` as nobody: a forked child that drops its groups,
    gid and uid before it execs, with a private umask."""
    assert NOBODY is not None
    done = subprocess.run(
        ["sh", "-c", script],
        cwd=cwd,
        user=NOBODY.pw_uid,
        group=NOBODY.pw_gid,
        extra_groups=[],
        umask=0o077,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr


def plant(directory: Path) -> Path:
    """As nobody: ``directory/ambrosia-data`` with a 0600 ``link-secret`` in it."""
    as_nobody(
        "mkdir -m 700 ambrosia-data && head -c 32 /dev/urandom > ambrosia-data/link-secret "
        "&& chmod 600 ambrosia-data/link-secret",
        directory,
    )
    return directory / "ambrosia-data"


def give_to_nobody(path: Path) -> Path:
    assert NOBODY is not None
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    return path


def attributes(*paths: Path) -> list[tuple[int, int, int]]:
    """Owner, group and mode of each path (not following links)."""
    return [(s.st_uid, s.st_gid, s.st_mode) for s in (os.lstat(p) for p in paths)]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the AMBROSIA_ settings a developer's shell may hold."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBROSIA_")}
    return env | extra


def ambrosia(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``ambrosia-py ARGS`` as a real process, its status and output. A command that
    does not end within the deadline is killed with all it started, and fails the test:
    a refusal is prompt."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ambrosia_py.cli", *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"ambrosia-py {' '.join(args)} did not refuse; it ran:\n{out[-4000:]}")
    return proc.returncode, out


def refusal(out: str) -> str:
    """The one line that says why (the rest of the output is log lines)."""
    lines = [line for line in out.splitlines() if "owned by" in line or "can write" in line]
    assert len(lines) == 1, out
    assert "Traceback" not in out, out
    return lines[0]


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory like /tmp, under the system's temporary
    directory (tmp_path is root's alone: nobody could not reach it)."""
    path = Path(tempfile.mkdtemp(prefix="ambrosia-shared-"))
    try:
        path.chmod(0o1777)
        yield path
    finally:
        shutil.rmtree(path)


# --- the attack, as it runs -----------------------------------------------------------------


def test_run_refuses_a_data_dir_another_user_made_in_a_sticky_directory(shared: Path) -> None:
    data_dir = plant(shared)
    secret = data_dir / "link-secret"
    before = attributes(data_dir, secret)
    code, out = ambrosia("run", EXAMPLE, "--ingress", "0", cwd=shared)
    assert code == 1, out
    line = refusal(out)
    assert line.startswith("Error: the data dir ambrosia-data is owned by " + OWNER), line
    assert f"not by {ROOT}, who runs this" in line
    assert "run as nobody, or use a data dir of your own (--data-dir or $AMBROSIA_DATA_DIR)" in line
    assert "nothing was changed" in line
    assert attributes(data_dir, secret) == before  # not tightened, not adopted
    assert before[0][0] == NOBODY_UID and stat.S_IMODE(before[0][2]) == 0o700
    assert sorted(os.listdir(data_dir)) == ["link-secret"]  # nothing written in it


def test_the_coordinator_refuses_it_before_tightening_anything(shared: Path) -> None:
    data_dir = plant(shared)
    as_nobody("chmod 755 ambrosia-data && chmod 644 ambrosia-data/link-secret", shared)
    before = attributes(data_dir, data_dir / "link-secret")
    code, out = ambrosia(
        "coordinator", "--instance", "counter", "--data-dir", str(data_dir), cwd=shared
    )
    assert code == 2, out
    line = refusal(out)
    assert line.startswith(f"ambrosia-py: the data dir {data_dir} is owned by {OWNER}"), line
    assert "took group and other permissions off" not in out
    assert attributes(data_dir, data_dir / "link-secret") == before  # still 0755 and 0644
    assert sorted(os.listdir(data_dir)) == ["link-secret"]


@pytest.mark.parametrize(
    "command",
    [
        ["instances"],
        ["registry", "rebuild"],
        ["replay", EXAMPLE, "--instance", "counter"],
        ["debug", EXAMPLE, "--instance", "counter", "--checkpoint", "1"],
        ["register", "counter"],
        ["log", "prune", "--instance", "counter", "--keep", "1"],
    ],
    ids=["instances", "rebuild", "replay", "debug", "register", "prune"],
)
def test_commands_that_read_a_data_dir_refuse_another_users(
    shared: Path, command: list[str]
) -> None:
    """A planted registry and checkpoint (pickled state) are never read, nor rebuilt."""
    data_dir = plant(shared)
    as_nobody(": > ambrosia-data/registry.sqlite3 && mkdir ambrosia-data/counter_0", shared)
    as_nobody(": > ambrosia-data/counter_0/serverchkpt1", shared)
    files = [data_dir, data_dir / "registry.sqlite3", data_dir / "counter_0" / "serverchkpt1"]
    before = attributes(*files)
    code, out = ambrosia(*command, "--data-dir", "ambrosia-data", cwd=shared)
    assert code != 0, out
    assert f"the data dir ambrosia-data is owned by {OWNER}, not by {ROOT}" in refusal(out)
    assert attributes(*files) == before
    assert sorted(os.listdir(data_dir)) == ["counter_0", "link-secret", "registry.sqlite3"]


def test_a_data_dir_is_not_made_under_another_users_directory(shared: Path) -> None:
    """A missing data dir is made only where nobody else can move it: nothing is left
    behind under nobody's directory."""
    as_nobody("mkdir -m 755 theirs", shared)
    code, out = ambrosia("run", EXAMPLE, "--data-dir", "theirs/data", cwd=shared)
    assert code == 1, out
    assert f"is under {shared / 'theirs'}, owned by {OWNER}, who could replace it" in out, out
    assert os.listdir(shared / "theirs") == []


def test_the_client_refuses_a_planted_secret(shared: Path) -> None:
    data_dir = plant(shared)
    before = attributes(data_dir / "link-secret")
    with pytest.raises(IngressError) as refused:
        Client("127.0.0.1:1", data_dir=data_dir)
    # The directory comes first: it is what nobody controls, the secret only with it.
    assert str(refused.value) == (
        f"the link secret {data_dir / 'link-secret'} is under {data_dir}, owned by {OWNER}, "
        "who could replace it; use a path whose directories are yours or root's"
    )
    with pytest.raises(IngressError, match=re.escape(f"is under {data_dir}, owned by {OWNER}")):
        client_secret(data_dir / "link-secret", None)
    assert attributes(data_dir / "link-secret") == before


def test_a_link_another_user_planted_on_the_way_is_named_not_followed(
    shared: Path, tmp_path: Path
) -> None:
    """Ours at the end of the path, but through nobody's link in the sticky directory:
    its owner can point it anywhere at any time."""
    ours = tmp_path / "data"
    ours.mkdir(mode=0o700)
    as_nobody(f"ln -s {ours} data", shared)
    with pytest.raises(DataDirError) as refused:
        writable_data_dir(shared / "data")
    assert str(refused.value) == (
        f"the data dir {shared / 'data'} goes through the symbolic link {shared / 'data'}, "
        f"owned by {OWNER}, who can point it elsewhere; use a path whose links are yours "
        "or root's"
    )
    assert os.listdir(ours) == []


# --- secrets and keys -----------------------------------------------------------------------


@pytest.mark.parametrize("given", ["--secret-file", "AMBROSIA_SECRET_FILE"])
def test_a_secret_file_another_user_owns_is_refused(tmp_path: Path, given: str) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    give_to_nobody(secret)
    before = attributes(secret)
    args = ["run", EXAMPLE, "--data-dir", str(tmp_path / "data"), "--ingress", "0"]
    if given == "--secret-file":
        code, out = ambrosia(*args, "--secret-file", str(secret), cwd=tmp_path)
    else:
        env = clean_env(AMBROSIA_SECRET_FILE=str(secret))
        code, out = ambrosia(*args, cwd=tmp_path, env=env)
    assert code == 1, out
    line = refusal(out)
    assert line.startswith(f"Error: the link secret {secret} is owned by {OWNER}, not by {ROOT}")
    assert line.endswith("run as nobody, or use a secret file of your own (mode 0600)")
    assert attributes(secret) == before


def test_a_secret_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    """Root's own secret, but in a directory without the sticky bit that anyone can
    write: anyone could have put it there, or could swap it."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    secret = open_dir / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    code, out = ambrosia(
        *("run", EXAMPLE, "--data-dir", str(tmp_path / "data"), "--ingress", "0"),
        *("--secret-file", str(secret)),
        cwd=tmp_path,
    )
    assert code == 1, out
    assert refusal(out) == (
        f"Error: the link secret {secret} is under {open_dir}, which its group and others "
        f"can write (mode 0777, no sticky bit), so they could replace it; chmod go-w "
        f"{open_dir}, or use another path"
    )
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o777


@pytest.mark.parametrize(("mode", "writers"), [(0o770, "its group"), (0o757, "others")])
def test_a_directory_its_group_or_others_can_write_is_named(
    tmp_path: Path, mode: int, writers: str
) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(mode)
    secret = loose / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    with pytest.raises(LinkSetupError) as refused:
        load_secret(LinkSettings(secret_file=secret), tmp_path / "data")
    assert f"which {writers} can write (mode {mode:04o}, no sticky bit)" in str(refused.value)


def test_a_directory_of_another_user_on_the_way_is_named(shared: Path) -> None:
    """nobody's directory, holding a secret root made: nobody can rename it away and
    put another in its place."""
    as_nobody("mkdir -m 755 theirs", shared)
    secret = shared / "theirs" / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    with pytest.raises(LinkSetupError) as refused:
        load_secret(LinkSettings(secret_file=secret), shared / "data")
    assert str(refused.value) == (
        f"the link secret {secret} is under {shared / 'theirs'}, owned by {OWNER}, who "
        "could replace it; use a path whose directories are yours or root's"
    )


@needs_openssl
def test_a_tls_key_another_user_owns_is_refused(tmp_path: Path) -> None:
    options = mutual_tls(tmp_path, ("svc",))["svc"]
    key = give_to_nobody(tmp_path / "svc.key")
    before = attributes(key)
    code, out = ambrosia(
        *("run", EXAMPLE, "--data-dir", str(tmp_path / "data"), "--ingress", "0", *options),
        cwd=tmp_path,
    )
    assert code == 1, out
    line = refusal(out)
    assert line.startswith(f"Error: the TLS key {key} is owned by {OWNER}, not by {ROOT}"), line
    assert line.endswith("run as nobody, or use a key file of your own")
    assert attributes(key) == before


@needs_openssl
def test_a_certificate_file_holding_the_key_is_checked_as_the_key(tmp_path: Path) -> None:
    mutual_tls(tmp_path, ("svc",))
    both = tmp_path / "svc-with-key.pem"
    both.write_bytes((tmp_path / "svc.pem").read_bytes() + (tmp_path / "svc.key").read_bytes())
    assert tls_contexts(LinkSettings(tls_cert=both)) is not None  # root's own: used
    give_to_nobody(both)
    with pytest.raises(LinkSetupError, match=r"^the TLS key .* is owned by nobody"):
        tls_contexts(LinkSettings(tls_cert=both))


# --- files inside a data dir of ours --------------------------------------------------------


def test_a_file_another_user_owns_in_our_data_dir_is_refused_and_left_alone(
    tmp_path: Path,
) -> None:
    """A data dir once loose enough for others to write in: what they left there is
    refused before any mode is changed, and tighten never changes what is not ours."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    data_dir.chmod(0o755)
    registry = data_dir / "registry.sqlite3"
    registry.write_bytes(b"")
    registry.chmod(0o644)
    give_to_nobody(registry)
    before = attributes(data_dir, registry)
    with pytest.raises(RegistryRefusal) as refused:
        prepare_start(data_dir, "counter")
    assert str(refused.value).startswith(f"the file {registry} is owned by {OWNER}")
    assert attributes(data_dir, registry) == before  # refused first: nothing tightened
    changed, failed = tighten([registry, data_dir])
    assert changed == [(data_dir, 0o755)]
    assert failed == [f"{registry}: owned by {OWNER}, left as it is"]
    assert attributes(registry) == before[1:]


# --- honest cases ---------------------------------------------------------------------------


def test_our_own_files_under_a_sticky_directory_are_used(shared: Path) -> None:
    """What the refusals must not catch: root's data dir and secret inside a 1777 dir."""
    mine = shared / "mine"
    writable_data_dir(mine)  # made fresh, ours
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and mine.stat().st_uid == 0
    made = load_secret(LinkSettings(), mine)
    assert load_secret(LinkSettings(secret_file=mine / "link-secret"), shared) == made
    (shared / "secret").write_bytes(made)  # directly in the sticky directory: root's
    (shared / "secret").chmod(0o600)
    assert client_secret(shared / "secret", None) == (made, shared / "secret")


def test_a_service_runs_from_a_sticky_directory_with_a_fresh_data_dir(shared: Path) -> None:
    counter: Any = load_service(EXAMPLE)
    port = free_port()
    svc = RunProcess(Path(EXAMPLE), shared / "ambrosia-data", port)
    try:
        with Client(f"127.0.0.1:{port}", data_dir=shared / "ambrosia-data") as client:
            assert client.call(counter.add, 5) == 5
    finally:
        svc.stop()
    assert "owned by" not in svc.output()
