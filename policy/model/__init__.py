"""What policy files say: the tenant and credential schema, YAML with positions, loading a
rules directory into an immutable `PolicySet`, sandbox tokens and source addresses.

Re-exported here: the schema, the policy set and the helpers around them. `load_policy_dir`
stays in `loader`: it compiles Rego (regopy), which the schema alone must not load.
"""

from sandgate.policy.model.credentials import (
    AwsSigV4Inject,
    AwsSigV4Spec,
    BasicInject,
    BasicSpec,
    BodyInject,
    Credential,
    GitHubAppInject,
    GitHubAppSpec,
    HeaderInject,
    Inject,
    InjectKind,
    OAuth2Inject,
    OAuth2Spec,
    QueryInject,
    check_credential_host,
)
from sandgate.policy.model.policyset import LoadNotice, PolicySet, SandboxRecord, TenantPolicy, TenantProblem
from sandgate.policy.model.sandbox_tokens import (
    digest_token,
    new_token,
    resolve_token_reference,
    tokens_equal,
)
from sandgate.policy.model.secret_refs import SecretRef, check_ref, parse_ref
from sandgate.policy.model.source_addresses import MAX_SOURCE_ADDRESSES, source_address, source_addresses
from sandgate.policy.model.tenant import (
    IFNAME_PATTERN,
    NAME_PATTERN,
    BaseFile,
    Limits,
    PresetFile,
    Rule,
    SandboxEntry,
    TenantFile,
    check_path_glob,
    tenant_schema,
)
from sandgate.policy.model.yamlsource import YamlDocument, load_yaml, parse_yaml, validate

__all__ = [
    "IFNAME_PATTERN",
    "MAX_SOURCE_ADDRESSES",
    "NAME_PATTERN",
    "AwsSigV4Inject",
    "AwsSigV4Spec",
    "BaseFile",
    "BasicInject",
    "BasicSpec",
    "BodyInject",
    "Credential",
    "GitHubAppInject",
    "GitHubAppSpec",
    "HeaderInject",
    "Inject",
    "InjectKind",
    "Limits",
    "LoadNotice",
    "OAuth2Inject",
    "OAuth2Spec",
    "PolicySet",
    "PresetFile",
    "QueryInject",
    "Rule",
    "SandboxEntry",
    "SandboxRecord",
    "SecretRef",
    "TenantFile",
    "TenantPolicy",
    "TenantProblem",
    "YamlDocument",
    "check_credential_host",
    "check_path_glob",
    "check_ref",
    "digest_token",
    "load_yaml",
    "new_token",
    "parse_ref",
    "parse_yaml",
    "resolve_token_reference",
    "source_address",
    "source_addresses",
    "tenant_schema",
    "tokens_equal",
    "validate",
]
