"""What policy files say: the tenant and credential schema, YAML with positions, loading a
rules directory into an immutable `PolicySet`, sandbox tokens and source addresses.
"""
