"""Typed pyinfra facts for what the stages read from a host."""
