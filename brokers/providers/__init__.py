"""Credentials that are made, not stored: OAuth2 and GitHub App tokens (cached until shortly
before expiry) and AWS SigV4 signing.
"""
