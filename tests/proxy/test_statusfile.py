"""Whether a gateway is alive, read from its status file, and the owner named in its nft table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sandgate.proxy.net.host_table import owner_comment

NFT_COMMENT_MAX = 128


def test_a_gateway_run_by_another_user_is_alive() -> None:
    # A reader without the right to signal the gateway (EPERM) must still see it running:
    # otherwise a second gateway would take over the live one's nftables table. The reader
    # drops to `nobody` after its imports (the interpreter lives where `nobody` cannot read).
    folder = Path(tempfile.mkdtemp(prefix="sandgate-status-"))
    try:
        folder.chmod(0o755)
        status = folder / "gateway.json"
        status.write_text(json.dumps({"pid": os.getpid(), "policy_version": "v"}))
        status.chmod(0o644)
        code = (
            "import os, sys; from pathlib import Path; from sandgate.proxy.state.statusfile import read_status\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "sys.exit(0 if read_status(Path(sys.argv[1])) is not None else 3)"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, str(status)], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
    finally:
        shutil.rmtree(folder)


def test_a_gone_gateway_is_not_alive(tmp_path: Path) -> None:
    from sandgate.proxy.state.statusfile import read_status

    p = subprocess.Popen(["true"])
    p.wait()
    status = tmp_path / "gateway.json"
    status.write_text(json.dumps({"pid": p.pid}))
    assert read_status(status) is None


def test_the_owner_comment_always_fits_nft(tmp_path: Path) -> None:
    for length in (10, 100, 109, 110, 200, 300):
        state = Path("/" + "s" * (length - 1))
        comment = owner_comment(state)
        assert len(comment.encode()) <= NFT_COMMENT_MAX, (length, comment)
    assert owner_comment(Path("/var/lib/sandgate")) == "sandgate state_dir=/var/lib/sandgate"
