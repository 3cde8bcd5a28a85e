package sandgate.tenants.t

import rego.v1

# A policy must not reach the network.
deny contains "blocked upstream" if {
	http.send({"method": "GET", "url": "http://169.254.169.254/"}).status_code != 200
}
