"""Every command in README.md runs: its shell blocks, in order, as a new user would type them.

How blocks are chosen and marked is written once, in tests/support/readme_blocks.py: every
`sh`/`console` block runs unless the line before its fence is `<!-- illustration: WHY -->`;
`<!-- background: waits for HOST:PORT -->` runs a server block in the background. A new
unmarked block is run like the others, so a command the runner cannot run fails this test.

Where they run: a fresh copy of the repository (its tracked and untracked files, the shared
`.venv` linked in), a temporary HOME, one bash session inside a network namespace this test
creates ("the machine"), as root. The machine's only route leads to a second namespace ("the
internet") whose one address serves HTTP and HTTPS for the public names the README uses: the
machine's /etc/hosts (`ip netns exec` bind-mounts /etc/netns/<ns>/hosts) maps them there, its
resolver answers nothing else, and its system trust store (/etc/ssl, bind-mounted the same
way) holds that server's test CA besides the usual ones, as a corporate CA would be
installed. Nothing leaves the namespaces; example.com is mapped nowhere (it is denied before
any lookup).

The session is PID 1 of its own PID namespace with private /run/netns and /etc/netns: at its
end everything a block started gets SIGTERM (then dies with it), and namespaces a block
creates never appear on the host, even when a block fails half-way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from support import RecordingUpstream, TestPKI
from support.leftovers import MARKER
from support.netns import in_namespace, ip
from support.opa_server import FakeOpaServer
from support.readme_blocks import Block, ConsoleStep, console_steps, missing_output, read_blocks

pytestmark = [pytest.mark.root, pytest.mark.slow]

README = REPO / "README.md"
# A public address, so the gateway's address guard treats it as the internet; it exists only
# inside this test's namespaces (the machine is .1, the internet's server .2 of a /30).
MACHINE_ADDR, SERVER_ADDR = "44.44.44.1", "44.44.44.2"
# The public names README blocks use, served by the test's upstream; example.com is absent.
PUBLIC_NAMES = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "registry.yarnpkg.com")
RUN_TIMEOUT = 240.0


@dataclass
class Internet:
    """The namespaces, the upstreams and the paths of one walkthrough."""

    machine: str
    world: str
    clone: Path
    home: Path
    run_dir: Path
    https: RecordingUpstream
    http: RecordingUpstream
    opa: FakeOpaServer


def _copy_repository(dest: Path) -> None:
    """A fresh clone's files (tracked and untracked, not ignored), mtimes kept, `.venv` linked."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if not src.is_file():
            continue  # deleted in the work tree
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)
    # The installed virtualenv stands in for `deploy/install.sh`'s (the install is idempotent and
    # finds it complete); the copy's pyproject keeps its mtime, so nothing is reinstalled.
    (dest / ".venv").symlink_to(REPO / ".venv")


def _trust_store(etc: Path, ca_file: Path) -> None:
    """/etc/ssl as the host has it, plus the test CA in the bundle clients and the gateway read."""
    shutil.copytree("/etc/ssl", etc / "ssl", symlinks=True)
    bundle = etc / "ssl" / "certs" / "ca-certificates.crt"
    bundle.write_text(bundle.read_text() + "\n" + ca_file.read_text())


@pytest.fixture
def internet(tmp_path: Path) -> Iterator[Internet]:
    tag = secrets.token_hex(2)
    machine, world = f"sgd-m-{tag}", f"sgd-w-{tag}"
    m_if, w_if = f"sgdm-{tag}", f"sgdw-{tag}"
    etc = Path("/etc/netns") / machine
    upstreams: list[RecordingUpstream] = []
    stack = contextlib.ExitStack()
    try:
        ip("netns", "add", machine)
        ip("netns", "add", world)
        ip("-n", machine, "link", "add", m_if, "type", "veth", "peer", "name", w_if, "netns", world)
        ip("-n", machine, "addr", "add", f"{MACHINE_ADDR}/30", "dev", m_if)
        ip("-n", world, "addr", "add", f"{SERVER_ADDR}/30", "dev", w_if)
        for ns, link in ((machine, m_if), (world, w_if)):
            ip("-n", ns, "link", "set", link, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", machine, "route", "add", "default", "via", SERVER_ADDR)

        (tmp_path / "pki").mkdir()
        pki = TestPKI([*PUBLIC_NAMES, "example.com"], directory=tmp_path / "pki")
        https = RecordingUpstream(SERVER_ADDR, 443, tls=pki, name="internet-https", body=b"ok\n")
        http = RecordingUpstream(SERVER_ADDR, 80, name="internet-http", body=b"ok\n")
        for up in (https, http):
            in_namespace(world, up.start)
            upstreams.append(up)
        # `policy push --url http://opa:8181`: an OPA-compatible server on the internet's address.
        opa = in_namespace(world, lambda: FakeOpaServer(SERVER_ADDR, 8181))
        stack.enter_context(opa)

        etc.mkdir(parents=True)
        names = " ".join(PUBLIC_NAMES)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{SERVER_ADDR} {names} opa\n")
        # Nothing answers DNS on the machine: a name not in its hosts file fails at once.
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        _trust_store(etc, pki.ca_file)

        clone, home, run_dir = tmp_path / "sandgate", tmp_path / "home", tmp_path / "run"
        for d in (clone, home, run_dir):
            d.mkdir()
        _copy_repository(clone)
        yield Internet(machine, world, clone, home, run_dir, https, http, opa)
    finally:
        stack.close()
        _kill_namespace(machine)
        for up in upstreams:
            up.stop()
        for ns in (machine, world):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(etc, ignore_errors=True)


def _kill_namespace(name: str) -> None:
    """Stop what the walkthrough left running in the machine: SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        pids = _namespace_pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = _namespace_pids(name)
        if not pids:
            return


def _namespace_pids(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
    return [int(p) for p in out.stdout.split()]


# --- the script ----------------------------------------------------------------------------

PRELUDE = r"""set -eE -o pipefail
__sg_fail() {  # a failure of the session itself; background jobs (killed at the end) are not blocks failing
    [[ $BASHPID == "$$" ]] || return 0
    printf '%s\n%s\n%s\n' "$__sg_block" "$1" "$2" > "$__sg_run/failed"
}
trap '__sg_fail $? "$BASH_COMMAND"' ERR
__sg_stop_all() {  # this script is PID 1 of its own PID namespace: SIGTERM the rest, wait 20 s
    local i left
    [[ $$ == 1 ]] || return 0  # anywhere else, -1 would be every process of the machine
    kill -TERM -1 2>/dev/null || true
    for i in $(seq 200); do
        left=(/proc/[0-9]*); (( ${#left[@]} <= 1 )) && return 0; sleep 0.1
    done
}
trap __sg_stop_all EXIT
__sg_wait_for() {  # HOST PORT PID: until HOST:PORT accepts, while PID lives (at most 180 s)
    local i
    for i in $(seq 1800); do
        if (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then return 0; fi
        kill -0 "$3" 2>/dev/null || { echo "the background block exited" >&2; return 1; }
        sleep 0.1
    done
    echo "nothing accepted on $1:$2 in 180 s" >&2; return 1
}
"""


def walkthrough_script(blocks: list[Block], run_dir: Path, clone: Path) -> str:
    """One bash script running every runnable block in README order, each logged on its own."""
    parts = [f"__sg_run={run_dir}\n__sg_block=0\n", PRELUDE, f"cd {clone}\n"]
    for b in blocks:
        if not b.runnable:
            continue
        log = run_dir / f"block-{b.line}.log"
        parts.append(f"__sg_block={b.line}\necho {b.line} > {run_dir}/current\n")
        if b.marker == "background":
            host, port = b.waits_for
            parts.append(f"( trap - ERR\n{b.text}) > {log} 2>&1 &\n__sg_wait_for {host} {port} $!\n")
        elif b.language == "console":
            for n, step in enumerate(console_steps(b)):
                out = run_dir / f"console-{b.line}-{n}.out"
                parts.append(f"{{ {step.command}\n}} > {out} 2>&1 || true\n")
        else:
            parts.append(f"{{\n{b.text}}} > {log} 2>&1\n")
    parts.append(f"echo done > {run_dir}/finished\n")
    return "".join(parts)


def console_mismatches(block: Block, run_dir: Path, where: str | None = None) -> list[str]:
    """What each command of a console block should have printed and did not; `where` names
    the block in the messages (default: its README line)."""
    where = where or f"README.md:{block.line}"
    problems = []
    for n, step in enumerate(console_steps(block)):
        out = run_dir / f"console-{block.line}-{n}.out"
        printed = out.read_text() if out.exists() else ""
        missing = missing_output(step, printed)
        if missing is not None:
            problems.append(
                f"{where}: `{step.command}` did not print {missing!r} (in order); "
                f"it printed:\n{printed or '(nothing)'}"
            )
    return problems


def run_walkthrough(world: Internet, blocks: list[Block]) -> subprocess.CompletedProcess[str]:
    script = world.run_dir / "walkthrough.sh"
    script.write_text(walkthrough_script(blocks, world.run_dir, world.clone))
    env = {
        "HOME": str(world.home),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/bash",
    }
    # The run's marker, so that the session's leftover check would find anything that escaped.
    if MARKER in os.environ:
        env[MARKER] = os.environ[MARKER]
    # Its own PID namespace, so that everything a block starts (in any network namespace) ends
    # with it, and private /run/netns and /etc/netns, so that namespaces blocks create never
    # show on the host (once the machine's hosts, resolv.conf and ssl are bound in).
    isolated = f"mount -t tmpfs tmpfs /run/netns && mount -t tmpfs tmpfs /etc/netns && exec bash --noprofile --norc {script}"
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            world.machine,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--mount-proc",
            "bash",
            "-c",
            isolated,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=world.clone,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        current = (world.run_dir / "current").read_text().strip()
        raise AssertionError(
            f"README.md:{current}: the walkthrough did not finish in {RUN_TIMEOUT:.0f} s; "
            + _block_log(world.run_dir, current)
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def _block_log(run_dir: Path, line: str) -> str:
    logs = [run_dir / f"block-{line}.log", *sorted(run_dir.glob(f"console-{line}-*.out"))]
    logs = [p for p in logs if p.exists()]
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs) or "(no output)"


def test_a_failing_block_stops_the_walkthrough_and_is_named(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "<!-- background: waits for 127.0.0.1:18931 -->\n```sh\npython3 -m http.server -b 127.0.0.1 18931\n```\n"
        "```sh\nexport GREETING=hello\n```\n"
        '```sh\necho "$GREETING"\nfalse\necho never\n```\n'
        "```sh\ntouch not-run\n```\n"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = run_dir / "walkthrough.sh"
    script.write_text(walkthrough_script(read_blocks(readme), run_dir, tmp_path))
    # A PID namespace of its own (as the walkthrough has), so the server ends with the script.
    subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--net",
            "bash",
            "-c",
            f"ip link set lo up && exec bash {script}",
        ],
        capture_output=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
    )
    assert (run_dir / "failed").read_text().splitlines() == ["8", "1", "false"]
    assert (run_dir / "block-8.log").read_text() == "hello\n"
    assert not (tmp_path / "not-run").exists()
    assert not (run_dir / "finished").exists()


def test_every_readme_block_runs_in_order_on_a_fresh_machine(internet: Internet) -> None:
    blocks = read_blocks(README)
    result = run_walkthrough(internet, blocks)
    failed = internet.run_dir / "failed"
    if failed.exists() or not (internet.run_dir / "finished").exists():
        line, status, command = (
            ([*failed.read_text().splitlines(), "", "", ""])[:3] if failed.exists() else ("?", "?", "?")
        )
        background = "\n".join(
            _block_log(internet.run_dir, str(b.line)) for b in blocks if b.marker == "background"
        )
        pytest.fail(
            f"README.md:{line}: `{command}` exited {status}\n{_block_log(internet.run_dir, line)}\n"
            f"walkthrough output:\n{result.stdout}\nbackground blocks:\n{background}"
        )
    problems = [
        p
        for b in blocks
        if b.runnable and b.language == "console"
        for p in console_mismatches(b, internet.run_dir)
    ]
    assert not problems, "\n".join(problems)
    assert_quick_start_milestones(internet, blocks)
    assert_banner_as_shown(internet, blocks)


def assert_quick_start_milestones(world: Internet, blocks: list[Block]) -> None:
    """The Quick start reached, in order: an allowed request, a denied one with its reason, and
    a jailed command whose placeholder the gateway replaced with the stored credential."""
    audit = world.home / ".sandgate" / "audit" / "audit.jsonl"
    decisions = [r for r in map(json.loads, audit.read_text().splitlines()) if r.get("event") == "decision"]

    def first(what: str, match: Callable[[dict[str, Any]], bool]) -> int:
        found = next((i for i, r in enumerate(decisions) if match(r)), None)
        assert found is not None, f"no {what} in the audit trail:\n" + "\n".join(map(str, decisions))
        return found

    allowed = first(
        "allowed request to pypi.org by demo-1",
        lambda r: r["decision"] == "allow" and r["dest"]["host"] == "pypi.org" and r["sandbox"] == "demo-1",
    )
    denied = first(
        "denial of example.com", lambda r: r["decision"] == "deny" and r["dest"]["host"] == "example.com"
    )
    assert decisions[denied]["reason"] == "host_not_allowed"
    injected = first("request with the npm-token credential", lambda r: r["credentials"] == ["npm-token"])
    assert allowed < denied < injected
    jailed = decisions[injected]
    assert jailed["tenant"] == "demo" and jailed["sandbox"].startswith("jail-"), jailed
    assert (jailed["decision"], jailed["dest"]["host"], jailed["status"]) == (
        "allow",
        "registry.npmjs.org",
        200,
    )
    # The "internet" saw the real value; the jail only ever held a placeholder.
    secret = re.search(r"printf %s '([^']+)' \| sandgate credentials set", _text(blocks))
    assert secret is not None, "the Quick start no longer stores a credential value"
    (request,) = [r for r in world.https.requests if r.target == "/-/whoami"]
    assert request.header("authorization") == f"Bearer {secret[1]}"
    assert any(c.sni == "pypi.org" and c.handshake_ok for c in world.https.connections)
    jail_output = "".join(
        p.read_text() for p in world.run_dir.glob("block-*.log") if "the jail holds" in p.read_text()
    )
    assert re.search(r"the jail holds sgph_[a-z2-7]+", jail_output), jail_output
    assert secret[1] not in jail_output


def _text(blocks: list[Block]) -> str:
    return "".join(b.text for b in blocks if b.runnable)


def assert_banner_as_shown(world: Internet, blocks: list[Block]) -> None:
    """The start-up banner the Quick start shows (the text block after the background one) is
    what the gateway printed, but for its pid, policy version and home directory."""
    background = next(i for i, b in enumerate(blocks) if b.marker == "background")
    shown = blocks[background + 1]
    assert shown.language == "text", f"README.md:{shown.line}: expected the banner after the quick start"
    lines = [
        re.sub(r" \(pid \d+, policy version [0-9a-f+]+\)", "", x).replace("/root/", f"{world.home}/")
        for x in shown.text.splitlines()
    ]
    printed = (world.run_dir / f"block-{blocks[background].line}.log").read_text()
    missing = missing_output(ConsoleStep("deploy/quickstart.sh", tuple(lines)), printed)
    assert missing is None, f"README.md:{shown.line}: the gateway did not print {missing!r}:\n{printed}"
