# The decision the gateway evaluates, for every request of a tenant that has Rego.
#
# Every tenant with `rego:` modules (or `data:`) in its YAML file gets this module and the
# other *.rego files in this folder (not its subfolders, not *_test.rego). The gateway asks
# for data.sandgate.decision only after the tenant's allowlist has allowed the request:
# both must allow.
#
# A tenant's own modules live in package sandgate.tenants.<tenant> (or
# sandgate.tenants["name-with-dashes"]) and deny by adding to a `deny` set: a string (the
# reason is then policy_denied) or an object {"reason": <reason code>, "message": <text>}.
# The operator can add deny rules for every Rego tenant to `deny` in this package.
package sandgate

import rego.v1

# The tenant's `data:` object from its YAML file (data.tenants.<tenant>).
params := object.get(data.tenants, input.tenant, {})

# Deny by default: only "no denial at all" allows.
default decision := {"allow": false, "reason": "policy_denied", "message": "the policy made no decision"}

# One deterministic answer when several rules deny: the smallest reason code, then the
# smallest message with that reason.
decision := {"allow": true, "reason": "allowed"} if {
	count(denials) == 0
} else := {"allow": false, "reason": reason, "message": message} if {
	reason := min({d.reason | some d in denials})
	message := min({d.message | some d in denials; d.reason == reason})
}

# Every denial, the operator's and the tenant's, as {"reason", "message"}.
denials contains _denial(x) if some x in deny

denials contains _denial(x) if some x in object.get(data.sandgate.tenants, input.tenant, {}).deny

_denial(x) := {"reason": "policy_denied", "message": x} if {
	is_string(x)
} else := {"reason": object.get(x, "reason", "policy_denied"), "message": object.get(x, "message", "")} if {
	is_object(x)
} else := {"reason": "policy_denied", "message": "a deny rule produced neither a string nor an object"}

# The input documents this module understands (see `sandgate policy schema --input`): version
# 2 adds the phase "message" and its fields to version 1, so both are read alike (an OPA server
# a fleet shares may be asked by gateways of either version while they are upgraded).
deny contains "unsupported input version" if not input.version in {1, 2}
