# A tenant module must be in its own package.
package sandgate

import rego.v1

deny contains "no" if input.request.method == "DELETE"
