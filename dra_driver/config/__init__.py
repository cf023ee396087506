"""The option layer: the option table behind flags and environment variables, their parsing
into settings, node config files and their validation. It sits above plugin/ (it names the
sockets) and below agent/; the decoding kit it uses is in base/."""
