package sandgate.tenants["someone-else"]

import rego.v1

deny contains "no" if input.request.method == "DELETE"
