"""The bottom layer: helpers every other package may import, hardware/ and state/ included.

It imports nothing of the driver above it (the `layers` contract in pyproject.toml): the retry
schedule, the grammar of quantities, the strict decoding kit, and reading an operator's YAML file.
"""
