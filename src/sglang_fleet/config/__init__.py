"""The serving profile: YAML to a validated profile, its launch for one SGLang release, and the
rules that release enforces at startup, checked before any host is touched."""
