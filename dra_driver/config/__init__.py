"""Options and operator files: the option table behind flags and environment variables, their
parsing into settings, strict decoding of YAML, and node config files with their validation."""
