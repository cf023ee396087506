"""One module per `dra-driver` subcommand: its parser (`add_parser`) and its handler (`run`).

Handlers import what they drive inside the function, so that `dra-driver --help` and the parser
that every call builds load none of the agent, gRPC or NVML code.
"""
