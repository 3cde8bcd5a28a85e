# acme's own rules: the examples it uses, and one of its own.
package sandgate.tenants.acme

import rego.v1

import data.sandgate.examples.body_size
import data.sandgate.examples.methods

deny contains d if some d in methods.deny

deny contains d if some d in body_size.deny

# No writes to GitHub outside acme's repositories (acme's own rule, with its data).
deny contains {"reason": "policy_denied", "message": "acme writes only to its own repositories"} if {
	input.phase == "request"
	input.dest.host == "api.github.com"
	not input.request.method in {"GET", "HEAD"}
	not startswith(input.request.path, concat("", ["/repos/", data.sandgate.params.github_orgs[0], "/"]))
}

# A debugging header must never leave the sandbox.
deny contains "the x-debug-token header is not allowed" if {
	input.request.headers["x-debug-token"]
}
