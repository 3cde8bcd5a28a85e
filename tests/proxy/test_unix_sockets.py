"""Where a gateway's internal unix sockets live, and who may own that folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandgate.proxy.errors import ConfigError
from sandgate.proxy.state.unix_sockets import MAX_SOCKET_PATH, ensure_private_folder, internal_socket_folder


def test_a_short_state_dir_keeps_its_sockets_beside_it() -> None:
    assert internal_socket_folder(Path("/srv/sg")) == Path("/srv/sg/workers")


def test_a_deep_state_dir_gets_a_private_folder_under_tmp_that_every_process_finds() -> None:
    deep = Path("/srv") / ("d" * 90) / "state"
    folder = internal_socket_folder(deep)
    assert folder.parent == Path("/tmp") and folder.name.startswith("sandgate-")
    assert folder == internal_socket_folder(Path(str(deep)))  # derived from the path alone
    assert folder != internal_socket_folder(deep / "other")
    assert len(os.fsencode(folder / "limits.sock")) <= MAX_SOCKET_PATH


def test_the_longest_name_that_still_fits_stays_beside_the_state_dir() -> None:
    # "<state>/workers/limits.sock" (and w<i>.sock up to 4 digits) must fit in 107 bytes.
    for length in range(60, 110):
        state = Path("/" + "s" * (length - 1))
        folder = internal_socket_folder(state)
        for name in ("limits.sock", "audit.sock", "w9999.sock"):
            assert len(os.fsencode(folder / name)) <= MAX_SOCKET_PATH, (length, name)


def test_a_folder_it_makes_is_private(tmp_path: Path) -> None:
    folder = ensure_private_folder(tmp_path / "a" / "sockets")
    assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    "mode", [0o755, 0o770, 0o1777], ids=["listable by others", "group-writable", "like /tmp"]
)
def test_a_folder_others_can_reach_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(
        ConfigError, match="sockets: the gateway's internal sockets need a folder of this user's alone"
    ):
        ensure_private_folder(folder)


def test_a_folder_another_user_made_first_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)  # nobody: it could swap the sockets for its own
    with pytest.raises(ConfigError, match="owner uid 65534"):
        ensure_private_folder(folder)


def test_a_link_to_a_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ConfigError, match="not a link"):
        ensure_private_folder(tmp_path / "link")
