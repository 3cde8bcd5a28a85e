"""Secret sources behind one protocol, chosen by a reference's scheme: `env:`, `file:`,
`cmd:` and `stored:`.
"""
