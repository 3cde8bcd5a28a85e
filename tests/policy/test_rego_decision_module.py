"""A Rego tenant without the decision module is a load error, not a silent deny-everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.loader import load_policy_dir


def test_a_missing_decision_module_is_reported_at_the_tenants_rego_key(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants"
    tenants.mkdir()
    (tenants / "t.yaml").write_text("tenant: t\nallow:\n  - hosts: [api.example.com]\nrego: [t.rego]\n")
    (tenants / "t.rego").write_text(
        'package sandgate.tenants.t\n\nimport rego.v1\n\ndeny contains "x" if false\n'
    )
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(tmp_path)
    (error,) = info.value.errors
    assert (Path(error.location.file).name, error.location.line, error.field) == ("t.yaml", 4, "rego")
    assert "the decision module" in error.problem and "is missing" in error.problem
