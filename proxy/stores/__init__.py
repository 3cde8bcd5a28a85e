"""Stores written at run time: sealed stored credentials (file or redis), the sandbox
registry (file or redis), the keys they are sealed with, and watching them change.
"""
