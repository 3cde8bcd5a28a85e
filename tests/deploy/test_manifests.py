"""The compose file, the Kubernetes manifests and the Dockerfile stay in step with the code.

None of them can run here (no container engine, no cluster), so each is read the way its
runtime would read it, and whatever it hands sandgate (config, rules, command line, secret
names) goes through sandgate's own loaders and CLI parser.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import REPO
from support.deployfiles import (
    DEPLOY,
    dockerfile_instructions,
    env_refs,
    file_refs,
    parse_cli,
    read_dotenv,
    secret_refs,
    under,
    yaml_docs,
)

from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.config import GatewayConfig, load_config
from sandgate.proxy.stores.placeholder_key import load_placeholder_key
from sandgate.proxy.stores.sealing_keys import StoreKeys

COMPOSE = DEPLOY / "compose"
K8S = DEPLOY / "k8s"
CONTAINER = DEPLOY / "container"

ALL_YAML = sorted(p for p in DEPLOY.rglob("*.yaml"))


@pytest.mark.parametrize("path", ALL_YAML, ids=[str(p.relative_to(REPO)) for p in ALL_YAML])
def test_every_deployment_yaml_file_parses(path: Path) -> None:
    assert yaml_docs(path), f"{path} holds no document"


# --- compose -------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml_docs(COMPOSE / "compose.yaml")[0]


def service(name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"][name]
    return found


def compose_mounts(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, container path, read-only) of a service's short-syntax volumes."""
    out = []
    for spec in svc.get("volumes", []):
        parts = spec.split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def host_path(svc: dict[str, Any], container_path: str) -> Path:
    """The host path a bind mount of the service puts at `container_path`."""
    best: tuple[str, str] | None = None
    for source, target, _ in compose_mounts(svc):
        if under(PurePosixPath(container_path), target) and (best is None or len(target) > len(best[1])):
            best = (source, target)
    assert best is not None, f"nothing is mounted at {container_path}"
    source, target = best
    assert source.startswith("."), f"{container_path} comes from the named volume {source}, not a file"
    rest = PurePosixPath(container_path).relative_to(target)
    return (COMPOSE / source / rest).resolve()


def compose_config() -> GatewayConfig:
    """The gateway config the sandgate service runs, through the gateway's own loader."""
    sandgate = service("sandgate")
    return load_config(host_path(sandgate, "/etc/sandgate/gateway.yaml"))


def test_compose_runs_sandgate_redis_and_opa_with_healthchecks() -> None:
    services = compose()["services"]
    assert {"sandgate", "redis", "opa", "policy-push"} <= set(services)
    assert services["redis"]["image"] == "redis:7"
    assert services["opa"]["image"].startswith("openpolicyagent/opa:")
    for name in ("sandgate", "redis", "opa"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
        assert services[name]["restart"] == "unless-stopped"
    opa_cmd = services["opa"]["command"]
    assert opa_cmd[:2] == ["run", "--server"]
    assert opa_cmd[opa_cmd.index("--addr") + 1] == ":8181"
    build = services["sandgate"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == CONTAINER / "Dockerfile"


def test_compose_volumes_exist_and_named_ones_are_declared() -> None:
    declared = set(compose()["volumes"])
    for name, svc in compose()["services"].items():
        for source, target, _ in compose_mounts(svc):
            assert target.startswith("/"), (name, target)
            if source.startswith("."):
                assert (COMPOSE / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_the_compose_gateway_config_and_rules_load_with_the_gateways_own_loaders() -> None:
    sandgate = service("sandgate")
    config = compose_config()
    assert config.redis is not None
    assert config.rego.engine == "opa"
    assert config.admin.enabled and config.admin.listen and config.admin.token
    # The rules folder is the repository's, read-only, and loads as the gateway loads it.
    assert host_path(sandgate, str(config.rules_path)) == (REPO / "rules").resolve()
    assert ("../../rules", str(config.rules_path), True) in compose_mounts(sandgate)
    policy = load_policy_dir(host_path(sandgate, str(config.rules_path)))
    assert "demo" in policy.tenants
    # Everything the gateway writes lands on the writable state volume.
    (state_source, state_target, ro) = next(
        m for m in compose_mounts(sandgate) if m[1] == "/var/lib/sandgate"
    )
    assert not ro and not state_source.startswith(".")
    for written in (config.state_path, config.audit_path, config.admin_socket_path, config.ca_dir):
        assert under(written, state_target), written
    assert sandgate["read_only"] is True


def test_every_secret_the_compose_config_references_is_in_the_service_environment() -> None:
    sandgate = service("sandgate")
    text = host_path(sandgate, "/etc/sandgate/gateway.yaml").read_text()
    assert file_refs(text) == set(), "compose hands secrets over as environment variables only"
    refs = env_refs(text)
    assert refs == {
        "SANDGATE_PLACEHOLDER_KEY",
        "SANDGATE_REDIS_PASSWORD",
        "SANDGATE_ADMIN_TOKEN",
        "SANDGATE_STORE_KEYS",
    }
    assert compose_config().store_keys_ref == "env:SANDGATE_STORE_KEYS"
    for var in refs:
        # ${VAR:?message}: compose refuses to start without it rather than pass an empty value.
        assert re.fullmatch(r"\$\{" + var + r":\?[^}]+\}", sandgate["environment"][var]), var


def test_compose_secrets_script_writes_every_variable_once_with_mode_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(COMPOSE / "create-env.sh", tmp_path / "create-env.sh")
    run = subprocess.run(
        ["bash", str(tmp_path / "create-env.sh")], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    env_file = tmp_path / ".env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    values = read_dotenv(env_file)
    wanted = set(re.findall(r"\$\{(\w+):\?", (COMPOSE / "compose.yaml").read_text()))
    assert set(values) == wanted
    store_keys = values.pop("SANDGATE_STORE_KEYS")
    assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in values.values())
    assert len(set(values.values())) == len(values)
    # The keyring loads through the gateway's own loader, from the variable the config names.
    ref = compose_config().store_keys_ref
    monkeypatch.setenv(ref.removeprefix("env:"), store_keys)
    assert StoreKeys(ref, create=False).keyring().ids == ("k1",)
    # The rotation docs/operations/deployment.md describes: a new line appended inside the quotes is the newest key.
    new_line = "k2:" + base64.b64encode(os.urandom(32)).decode()
    text = env_file.read_text()
    quoted = f'SANDGATE_STORE_KEYS="{store_keys}"'
    assert quoted in text
    env_file.write_text(text.replace(quoted, quoted[:-1] + "\\n" + new_line + '"'))
    monkeypatch.setenv(ref.removeprefix("env:"), read_dotenv(env_file)["SANDGATE_STORE_KEYS"])
    assert StoreKeys(ref, create=False).keyring().ids == ("k1", "k2")
    again = subprocess.run(
        ["bash", str(tmp_path / "create-env.sh")], capture_output=True, text=True, timeout=30
    )
    assert again.returncode == 1 and "not replacing" in again.stderr
    assert (COMPOSE / ".gitignore").read_text().split() == [".env"]


def test_compose_wires_the_gateway_to_redis_opa_and_its_healthcheck() -> None:
    config = compose_config()
    sandgate = service("sandgate")
    assert sandgate["network_mode"] == "host"
    assert sandgate["cap_drop"] == ["ALL"] and sandgate["cap_add"] == ["NET_ADMIN"]
    assert "privileged" not in sandgate, "host sysctls (deploy/sysctl/) replace a privileged container"
    assert config.redis is not None
    redis_url = urlsplit(config.redis.url)
    assert (redis_url.hostname, f"{redis_url.port}") == ("127.0.0.1", "6379")
    assert f"127.0.0.1:{redis_url.port}:6379" in service("redis")["ports"]
    opa_url = urlsplit(config.rego.opa.url)
    assert f"127.0.0.1:{opa_url.port}:8181" in service("opa")["ports"]
    # The healthcheck is `sandgate status` on the config the service mounts (its admin socket).
    check = parse_cli(sandgate["healthcheck"]["test"][1:])
    assert check.command == "status"
    assert load_config(host_path(sandgate, str(check.config))) == config
    assert config.admin.enabled
    # The push job uploads the same rules to the same OPA, with a real CLI command line.
    push = service("policy-push")
    args = parse_cli([*push["entrypoint"], *push["command"]])
    assert (args.command, args.policy_command) == ("policy", "push")
    assert args.url == config.rego.opa.url
    assert str(args.rules_dir) == str(config.rules_path)
    assert ("../../rules", str(args.rules_dir), True) in compose_mounts(push)
    assert sandgate["depends_on"]["policy-push"]["condition"] == "service_completed_successfully"


# --- Kubernetes ----------------------------------------------------------------------------


def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for d in yaml_docs(p)]


def k8s(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} documents"
    return found[0]


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def configmap_data() -> dict[str, str]:
    data: dict[str, str] = k8s("ConfigMap", "sandgate-config")["data"]
    return data


def materialise(volume: dict[str, Any], root: Path) -> Path:
    """Write a ConfigMap volume's items where the kubelet would put them."""
    data = configmap_data()
    for item in volume["configMap"]["items"]:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
    return root


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def mount_of(ctr: dict[str, Any], path: str) -> dict[str, Any]:
    found = [m for m in ctr["volumeMounts"] if under(PurePosixPath(path), m["mountPath"])]
    assert found, f"nothing is mounted at {path}"
    return max(found, key=lambda m: len(m["mountPath"]))


def daemonset_config(tmp_path: Path) -> tuple[GatewayConfig, Path]:
    """The DaemonSet's gateway config (loaded as the gateway would) and its rules folder."""
    ds = k8s("DaemonSet", "sandgate")
    ctr = container(ds, "sandgate")
    args = parse_cli(ctr["command"])
    assert args.command == "run"
    config_mount = mount_of(ctr, str(args.config))
    config_dir = materialise(volume(ds, config_mount["name"]), tmp_path / "config")
    config_file = config_dir / PurePosixPath(str(args.config)).relative_to(config_mount["mountPath"])
    config = load_config(config_file)
    rules_mount = mount_of(ctr, config.rules_dir)
    assert rules_mount["mountPath"] == config.rules_dir and rules_mount["readOnly"] is True
    rules = materialise(volume(ds, rules_mount["name"]), tmp_path / "rules")
    return config, rules


def test_every_manifest_names_its_api_kind_and_namespace() -> None:
    docs = k8s_docs()
    assert docs
    for d in docs:
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], d
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "sandgate", d["metadata"]["name"]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Namespace", "sandgate"),
        ("ConfigMap", "sandgate-config"),
        ("DaemonSet", "sandgate"),
        ("PodDisruptionBudget", "sandgate"),
        ("StatefulSet", "sandgate-redis"),
        ("Service", "sandgate-redis"),
        ("Deployment", "sandgate-opa"),
        ("Service", "sandgate-opa"),
    } <= kinds
    assert not any(d["kind"] == "Secret" for d in docs), "secrets are made by create-secret.sh, never shipped"


def test_the_kustomization_lists_exactly_the_manifests_present() -> None:
    kustomization = yaml_docs(K8S / "kustomization.yaml")[0]
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(present)
    assert len(kustomization["resources"]) == len(set(kustomization["resources"]))
    assert kustomization["namespace"] == "sandgate"


def test_the_daemonset_runs_on_the_host_network_with_net_admin_only() -> None:
    ds = k8s("DaemonSet", "sandgate")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    sc = container(ds, "sandgate")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert "privileged" not in sc
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pdb = k8s("PodDisruptionBudget", "sandgate")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    resources = container(ds, "sandgate")["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]


def test_the_daemonset_probes_ask_the_admin_listener_its_config_opens(tmp_path: Path) -> None:
    config, _ = daemonset_config(tmp_path)
    assert config.admin.enabled and config.admin.listen
    host, _, port = config.admin.listen.rpartition(":")
    ctr = container(k8s("DaemonSet", "sandgate"), "sandgate")
    paths = {}
    for probe in ("livenessProbe", "readinessProbe"):
        get = ctr[probe]["httpGet"]
        assert (get["host"], str(get["port"])) == (host, port), probe
        paths[probe] = get["path"]
    assert paths == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    # The startup probe asks `sandgate status` with the config the gateway runs.
    startup = parse_cli(ctr["startupProbe"]["exec"]["command"])
    assert startup.command == "status"
    assert startup.config == parse_cli(ctr["command"]).config


def test_the_configmap_gateway_config_and_rules_load_with_the_gateways_own_loaders(tmp_path: Path) -> None:
    config, rules = daemonset_config(tmp_path)
    assert config.redis is not None and config.rego.engine == "opa"
    policy = load_policy_dir(rules)
    assert "example" in policy.tenants
    # State, audit and the admin socket are on the hostPath volume.
    ds = k8s("DaemonSet", "sandgate")
    ctr = container(ds, "sandgate")
    state = mount_of(ctr, str(config.state_path))
    assert volume(ds, state["name"])["hostPath"]["path"] == "/var/lib/sandgate" == state["mountPath"]
    for written in (config.audit_path, config.admin_socket_path, config.ca_dir):
        assert mount_of(ctr, str(written)) == state


def test_configmap_copies_of_the_shipped_rules_match_the_repository() -> None:
    data = configmap_data()
    ds_items = volume(k8s("DaemonSet", "sandgate"), "rules")["configMap"]["items"]
    for item in ds_items:
        shipped = REPO / "rules" / item["path"]
        if not item["path"].startswith("tenants/"):
            assert data[item["key"]] == shipped.read_text(), (
                f"{item['key']} differs from rules/{item['path']}"
            )
    used = {i["key"] for i in ds_items} | {"gateway.yaml"}
    assert set(data) == used, "every ConfigMap key is mounted, and only those"
    # The OPA pod's pusher sees the same rules folder as the gateways.
    assert volume(k8s("Deployment", "sandgate-opa"), "rules")["configMap"]["items"] == ds_items


def printed_secret() -> dict[str, Any]:
    """The Secret create-secret.sh makes (its --print output)."""
    printed = subprocess.run(
        ["bash", str(K8S / "create-secret.sh"), "--print"], capture_output=True, text=True, timeout=30
    )
    assert printed.returncode == 0, printed.stderr
    secret: dict[str, Any] = yaml.safe_load(printed.stdout)
    assert (secret["kind"], secret["metadata"]["namespace"]) == ("Secret", "sandgate")
    return secret


def materialise_secret(vol: dict[str, Any], secret: dict[str, Any], root: Path) -> Path:
    """Write a Secret volume's items, with their modes, where the kubelet would put them."""
    for item in vol["secret"]["items"]:
        target = root / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(secret["data"][item["key"]]))
        target.chmod(item.get("mode", vol["secret"].get("defaultMode", 0o644)))
    return root


def test_every_secret_the_manifests_read_is_made_by_the_secret_script(tmp_path: Path) -> None:
    ctr = container(k8s("DaemonSet", "sandgate"), "sandgate")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in ctr["env"]}
    assert env_refs(configmap_data()["gateway.yaml"]) <= set(env)
    secret = printed_secret()
    refs = list(env.values())
    redis = container(k8s("StatefulSet", "sandgate-redis"), "redis")
    refs += [e["valueFrom"]["secretKeyRef"] for e in redis["env"]]
    for ref in refs:
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["data"], ref
    values = [base64.b64decode(v).decode() for k, v in secret["data"].items() if k != "store-keys"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in values)
    assert len(set(values)) == len(values)
    # The placeholder key satisfies the gateway's own check (32+ bytes).
    os.environ["SANDGATE_TEST_PLACEHOLDER_KEY"] = values[0]
    try:
        load_placeholder_key("env:SANDGATE_TEST_PLACEHOLDER_KEY")
    finally:
        del os.environ["SANDGATE_TEST_PLACEHOLDER_KEY"]


def test_every_file_the_configmap_config_references_is_a_mounted_secret_the_gateway_accepts(
    tmp_path: Path,
) -> None:
    """file: references (the store keys) come from a Secret volume, and what create-secret.sh
    puts there loads with the gateway's own loaders, mode check included."""
    config, _ = daemonset_config(tmp_path)
    ds = k8s("DaemonSet", "sandgate")
    ctr = container(ds, "sandgate")
    secret = printed_secret()
    refs = file_refs(configmap_data()["gateway.yaml"])
    assert config.store_keys_ref.removeprefix("file:") in refs
    for ref in refs:
        mount = mount_of(ctr, ref)
        vol = volume(ds, mount["name"])
        assert mount["readOnly"] is True and vol["secret"]["secretName"] == secret["metadata"]["name"]
        root = materialise_secret(vol, secret, tmp_path / mount["name"])
        local = root / PurePosixPath(ref).relative_to(mount["mountPath"])
        assert local.is_file(), f"{ref}: no item of volume {mount['name']} puts a file there"
    # The keyring: one AES-256 key, in a file only its owner reads (group bits are refused,
    # so the pod sets no fsGroup, which would add them).
    keys_mount = mount_of(ctr, config.store_keys_ref.removeprefix("file:"))
    root = tmp_path / keys_mount["name"]
    local = root / PurePosixPath(config.store_keys_ref.removeprefix("file:")).relative_to(
        keys_mount["mountPath"]
    )
    assert local.stat().st_mode & 0o777 == 0o400
    assert StoreKeys(f"file:{local}", create=False).keyring().ids == ("k1",)
    assert "fsGroup" not in ds["spec"]["template"]["spec"].get("securityContext", {})
    # Every reference in the config is provided: env by the container, file by a mount.
    assert {scheme for scheme, _ in secret_refs(configmap_data()["gateway.yaml"])} == {"env", "file"}


def test_each_fleet_gateway_names_itself_by_its_host(tmp_path: Path) -> None:
    """A fixed gateway_id or gateway_name in a config every node shares would make the whole
    fleet one gateway in `policy status` and the audit stream: both stay at their per-host
    defaults (host network: the node's or host's name)."""
    k8s_config, _ = daemonset_config(tmp_path)
    for config in (k8s_config, compose_config()):
        assert config.redis is not None
        assert config.redis.gateway_id is None and config.audit.gateway_name is None
    assert k8s("DaemonSet", "sandgate")["spec"]["template"]["spec"]["hostNetwork"] is True
    assert service("sandgate")["network_mode"] == "host"


def test_the_gateway_reaches_redis_and_opa_through_their_services(tmp_path: Path) -> None:
    config, _ = daemonset_config(tmp_path)
    assert config.redis is not None
    for url, svc_name in ((config.redis.url, "sandgate-redis"), (config.rego.opa.url, "sandgate-opa")):
        parts = urlsplit(url)
        assert parts.hostname == f"{svc_name}.sandgate.svc.cluster.local", url
        svc = k8s("Service", svc_name)
        assert parts.port in [p["port"] for p in svc["spec"]["ports"]], url
    opa = k8s("Deployment", "sandgate-opa")
    args = container(opa, "opa")["args"]
    assert args[:2] == ["run", "--server"] and args[args.index("--addr") + 1] == ":8181"
    for ctr_name, probe in (("opa", "readinessProbe"), ("opa", "livenessProbe")):
        assert container(opa, ctr_name)[probe]["httpGet"]["path"] == "/health"
    # The pusher's loop runs a real CLI command line against the pod-local OPA.
    script = container(opa, "policy-push")["command"][-1]
    line = next(ln.strip() for ln in script.splitlines() if "sandgate policy push" in ln)
    push = parse_cli(line.split("||")[0].split())
    assert push.url == "http://127.0.0.1:8181" and str(push.rules_dir) == config.rules_dir


# --- container image -----------------------------------------------------------------------


def test_the_dockerfile_copies_files_that_exist_and_runs_a_real_command() -> None:
    steps = dockerfile_instructions(CONTAINER / "Dockerfile")
    assert steps[0] == ("FROM", "python:3.13-slim-bookworm")
    run_text = " ".join(arg for op, arg in steps if op == "RUN")
    assert "nftables" in run_text and "iproute2" in run_text
    lines = (CONTAINER / "Dockerfile.dockerignore").read_text().splitlines()
    ignore = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    assert ignore[0] == "*", "the build context starts empty (no .venv, no .env with keys)"
    for op, arg in steps:
        if op == "COPY":
            *sources, _dest = arg.split()
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: no such file in the repository"
                assert f"!{src}" in ignore, f"COPY {src} is excluded by Dockerfile.dockerignore"
    entrypoint = json.loads(next(arg for op, arg in steps if op == "ENTRYPOINT"))
    args = parse_cli(entrypoint)
    assert args.command == "run" and str(args.config) == "/etc/sandgate/gateway.yaml"
    user = next(arg for op, arg in steps if op == "USER")
    assert user.split(":")[0] not in ("0", "root")
    # The compose file and the DaemonSet point the entrypoint's config path at a mount.
    assert "/etc/sandgate/gateway.yaml" in [m[1] for m in compose_mounts(service("sandgate"))]


def test_the_package_files_the_image_installs_are_the_ones_pyproject_names() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dirs = set(project["tool"]["setuptools"]["package-dir"].values())
    steps = dockerfile_instructions(CONTAINER / "Dockerfile")
    copied = {src.rstrip("/") for op, arg in steps if op == "COPY" for src in arg.split()[:-1]}
    assert package_dirs <= copied
    assert project["project"]["readme"] in copied
