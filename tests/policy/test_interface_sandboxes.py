"""Tenant-file sandboxes on host interfaces: what `policy check` (the loader) accepts and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.loader import load_policy_dir


def rules(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / "tenants").mkdir(parents=True, exist_ok=True)
        (root / "tenants" / name).write_text(text)
    return root


def tenant(name: str, sandboxes: str) -> str:
    return f"tenant: {name}\nsandboxes:\n{sandboxes}allow: []\n"


def test_an_interface_sandbox_loads_with_its_interface_and_addresses(tmp_path: Path) -> None:
    entry = "  - {id: vm1, interface: tap0, addresses: [10.213.0.2, 'fd00:213::2']}\n"
    policy = load_policy_dir(rules(tmp_path, {"a.yaml": tenant("a", entry)}))
    record = policy.sandboxes["vm1"]
    assert (record.interface, record.addresses, record.tenant) == ("tap0", ("10.213.0.2", "fd00:213::2"), "a")
    assert policy.tenants["a"].sandboxes == (record,)


@pytest.mark.parametrize(
    ("entry", "line", "problem"),
    [
        ("{id: vm1, interface: tap0}", 3, "a sandbox on an interface needs its addresses"),
        ("{id: vm1, interface: tap0, addresses: [127.0.0.1]}", 3, "a sandbox needs a unicast address"),
        ("{id: vm1, interface: tap0, addresses: [10.213.0.2, 10.213.0.2]}", 3, "10.213.0.2"),
        ("{id: vm1, interface: 'two words', addresses: [10.213.0.2]}", 3, "String should match pattern"),
        ("{id: vm1, interface: a-name-longer-than-15, addresses: [10.213.0.2]}", 3, "String should match"),
    ],
    ids=[
        "an interface without addresses is refused",
        "a loopback source address on an interface is refused",
        "an address given twice on an interface is refused",
        "an interface name with a space is refused",
        "an interface name longer than the kernel's limit is refused",
    ],
)
def test_a_bad_interface_sandbox_is_a_file_line_error(
    tmp_path: Path, entry: str, line: int, problem: str
) -> None:
    root = rules(tmp_path, {"a.yaml": tenant("a", f"  - {entry}\n")})
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(root)
    [error] = info.value.errors
    assert (Path(error.location.file).name, error.location.line) == ("a.yaml", line)
    assert problem in str(error)


def test_two_files_cannot_put_sandboxes_on_one_interface(tmp_path: Path) -> None:
    root = rules(
        tmp_path,
        {
            "a.yaml": tenant("a", "  - {id: vm1, interface: tap0, addresses: [10.213.0.2]}\n"),
            "b.yaml": tenant("b", "  - {id: vm2, interface: tap0, addresses: [10.213.0.6]}\n"),
        },
    )
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(root)
    [error] = info.value.errors
    assert Path(error.location.file).name == "b.yaml" and error.field == "sandboxes.0.interface"
    assert "interface tap0 already carries sandbox 'vm1' of tenant 'a'" in str(error)
